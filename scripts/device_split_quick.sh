#!/usr/bin/env bash
# scripts/device_split_quick.sh COMMIT -- the shortest device call for kFlSplit / kFlKsplit /
# kFlQpf (carry [".devcarry-ks"], made by scripts/pack_ks.sh): their C cases, racecheck on a
# kFlKsplit case and memcheck on a kFlSplit one, a 2-round A/B at D64 / D256 / D128 S1k and
# D256 S4k full with cuDNN and flash in the same process and the clocks of each entry, and
# the per-tile trace (bench/attn_fwd_trace.py). For a device budget of ~4 minutes; the full
# call is scripts/device_ksplit.sh.
set -uo pipefail
COMMIT=${1:-unknown}
OUT=${OUT:-/tmp/ot_split_out}
mkdir -p "$OUT" /tmp/ks
cd "$(dirname "$0")/.."
tar xJf .devcarry-ks/ks.tar.xz -C /tmp/ks || exit 1
export LD_LIBRARY_PATH=/tmp/ks/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
T=/tmp/ks/test_ops
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for f in "hopper-only split" "hopper-only ksplit" "hopper-only qpf"; do
  timeout 60 stdbuf -oL $T --backend cuda --suite attention --filter "$f" >"$OUT/cases_${f##* }.log" 2>&1
  echo "$f rc=$? $(tail -1 "$OUT/cases_${f##* }.log")"
  grep -A3 "^FAIL" "$OUT/cases_${f##* }.log" | head -12
done
timeout 35 compute-sanitizer --tool racecheck --print-limit 5 $T --backend cuda --suite attention \
  --filter "hopper-only ksplit S1024 D64 B2 (6" >"$OUT/race_ksplit.log" 2>&1
echo "racecheck ksplit rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/race_ksplit.log" | tail -1)"
timeout 35 compute-sanitizer --tool memcheck --print-limit 5 $T --backend cuda --suite attention \
  --filter "hopper-only split GRID 10" >"$OUT/mem_split.log" 2>&1
echo "memcheck split rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/mem_split.log" | tail -1)"
# kFlKsplit is the D64 default since be07c2d (ks0: off); kFlSplit (sp) and kFlQpf (qp)
# opt-in. --clocks: the SM clock and board power of each entry (per-clock rates, as in
# docs/ATTENTION.md "What the same record says about D256 S 1k")
A="--fwd-only --no-variants --clocks --rounds ${ROUNDS:-2} --shapes 32:32:32:1024:64,32:8:8:1024:256,32:16:16:1024:128,8:8:8:4096:256"
AB="ks0=OT_ATTN_SM90_KSPLIT:0,_full_only:1;sp=OT_ATTN_SM90_SPLIT:1,_full_only:1;qp=OT_ATTN_SM90_QPF:1,_full_only:1"
# shellcheck disable=SC2086
timeout "${ATTN_TIMEOUT:-100}" python3 bench/bench_attention.py --shim /tmp/ks/libattention_shim.so \
  --bench $A --ab "$AB" --json "$OUT/attention_split_quick.json" --commit "$COMMIT" \
  --command "scripts/device_split_quick.sh $COMMIT: bench_attention.py --bench $A --ab '$AB'" \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -E "^attention_fwd|^  ab" "$OUT/bench.log" | cut -c1-150
# the Hopper forward's per-tile stamps (scripts/pack_ks.sh's trace shim): where a tile's time
# goes at D256 S1k against S4k (the same 2048 tiles), with the split beside the default
if [ "${TRACE:-1}" = 1 ] && [ -f /tmp/ks/libattention_shim_trace.so ]; then
  timeout "${TRACE_TIMEOUT:-90}" python3 bench/attn_fwd_trace.py \
    --shim /tmp/ks/libattention_shim_trace.so --shapes 32:8:8:1024:256,8:8:8:4096:256,32:16:16:1024:128 \
    --variants "sp=OT_ATTN_SM90_SPLIT:1;qp=OT_ATTN_SM90_QPF:1" --json "$OUT/attn_fwd_trace.json" >"$OUT/trace.log" 2>&1
  echo "trace rc=$?"
  cut -c1-220 "$OUT/trace.log" | tail -8
fi
