#!/usr/bin/env bash
# scripts/device_ncu_window.sh -- where the batch-1 decode's attention window spends its time,
# by ncu's warp-state samples per SASS instruction (SourceCounters, WarpStateStats), on the
# device machine with a prebuilt engine pack (.devcarry-engine/engine.tar.gz, from
# `ENGINE_PACK_TESTS=0 bash scripts/device_engine.sh pack BUILD_DIR`; carry
# [".devcarry-engine"]).
#
#   bash scripts/device_ncu_window.sh            (on the device; writes under $OUT)
#
# ot-run decodes llama3-8b (random bf16 weights) after a 2000-token prompt. ncu profiles, in
# the second decode step's second layer, the default window's kernels (the fused qkv GEMV,
# the paged attention's split kernel and merge, the staged o_proj) and, in a second run
# with OTE_FUSED_ATTN_OPROJ=1, the attention + o_proj kernel. ncu serialises the kernels and
# flushes the caches before each replay pass (its default --cache-control all), so each
# kernel starts with a cold L2 and cold instruction caches, as in the decode step, where the
# layer's 435 MB of weights pass through the 50 MB L2 between two visits of a kernel. Per
# kernel: the SASS with its samples ($OUT/src_<name>.csv), the samples summed by opcode and
# reason (bench/sass_stalls.py -> $OUT/stalls_<name>.txt), and the WarpStateStats section
# ($OUT/details_<name>.txt). ENGINE_NCU_TIMEOUT (s, default 240) limits each ncu run.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUTD=${OUT:-$ROOT/out-ncu}
mkdir -p "$OUTD"
P=/tmp/ncu-pack
mkdir -p "$P" && tar xzf .devcarry-engine/engine.tar.gz -C "$P" || exit 1
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
export LD_LIBRARY_PATH="$P/lib:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
PROMPT=$(seq -s, 1 2000)
RUN=("$P/ot-run" --config llama3-8b --random-weights --device cuda --dtype bf16
     --prompt-ids "$PROMPT" --max-new-tokens 4 --ignore-eos)
NCU=(ncu --clock-control none --section SourceCounters --section WarpStateStats
     --section SpeedOfLight --section LaunchStats --warp-sampling-interval 0 -f)
T=${ENGINE_NCU_TIMEOUT:-240}

# the default window: per layer fused_gemv (qkv), pa_mma, pa_merge1, staged_gemv (o_proj),
# fused_gemv (gate_up); a step has 32 of those and the lm_head's fused_gemv: 161 matches.
# Skip the first step (161) and the second step's first layer (5): the next 5 are layer 1's.
# (with OTE_FUSED_ATTN_OPROJ=1: fused_gemv, attn_oproj, fused_gemv a layer, 97 a step: skip 100)
rm -f /tmp/ncu_win.ncu-rep /tmp/ncu_ao.ncu-rep
timeout "$T" "${NCU[@]}" -k 'regex:fused_gemv|pa_mma|pa_merge1|staged_gemv' --launch-skip 166 \
  --launch-count 5 -o /tmp/ncu_win "${RUN[@]}" >"$OUTD/ncu_win.log" 2>&1
echo "ncu window rc=$?"
timeout "$T" env OTE_FUSED_ATTN_OPROJ=1 "${NCU[@]}" -k 'regex:fused_gemv|attn_oproj' \
  --launch-skip 100 --launch-count 3 -o /tmp/ncu_ao "${RUN[@]}" >"$OUTD/ncu_ao.log" 2>&1
echo "ncu attn_oproj rc=$?"

export_one() { # export_one REPORT NAME REGEX SKIP: one kernel's source page and details
  local rep=$1 name=$2 re=$3 skip=$4
  ncu --import "$rep" -k "regex:$re" --launch-skip "$skip" --launch-count 1 --page source --csv \
    --print-source sass >"$OUTD/src_$name.csv" 2>&1
  ncu --import "$rep" -k "regex:$re" --launch-skip "$skip" --launch-count 1 --page details \
    >"$OUTD/details_$name.txt" 2>&1
  python3 bench/sass_stalls.py "$OUTD/src_$name.csv" >"$OUTD/stalls_$name.txt" 2>&1
}
[ -f /tmp/ncu_win.ncu-rep ] && {
  export_one /tmp/ncu_win.ncu-rep qkv fused_gemv 0
  export_one /tmp/ncu_win.ncu-rep pa_mma pa_mma 0
  export_one /tmp/ncu_win.ncu-rep pa_merge1 pa_merge1 0
  export_one /tmp/ncu_win.ncu-rep staged_oproj staged_gemv 0
  export_one /tmp/ncu_win.ncu-rep gate_up fused_gemv 1
}
[ -f /tmp/ncu_ao.ncu-rep ] && export_one /tmp/ncu_ao.ncu-rep attn_oproj attn_oproj 0

echo "=== per kernel: duration and the warp-state summary"
for f in "$OUTD"/details_*.txt; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f" .txt)"
  grep -E "Duration|Elapsed Cycles|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Avg. Active Threads|Stall" "$f" | head -14
done
for f in "$OUTD"/stalls_*.txt; do
  [ -f "$f" ] || continue
  echo "--- $(basename "$f" .txt)"
  head -34 "$f"
done
# (few files come back from the device: the per-instruction CSVs and tables in one archive)
tar czf "$OUTD/ncu_src.tgz" -C "$OUTD" $(cd "$OUTD" && ls src_*.csv stalls_*.txt 2>/dev/null) &&
  rm -f "$OUTD"/src_*.csv "$OUTD"/stalls_*.txt
