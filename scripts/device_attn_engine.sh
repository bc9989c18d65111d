#!/usr/bin/env bash
# scripts/device_attn_engine.sh COMMIT -- one device call (carry [".devcarry-dyn",
# ".devcarry-engine"]) for a change of the Hopper forward that the engine's prefill sees:
#   1. bench/bench_attention.py --bench with ATTN_ARGS (default: the engine's and the grid's
#      shapes, forward only, 10 rounds; ATTN_AB: its --ab variants) through the shim in
#      .devcarry-dyn (bench/attention_shim.c linked against an sm_90a libops_transformer.a);
#   2. the C attention suite on CUDA (the pack's test_ops), then compute-sanitizer memcheck,
#      racecheck and synccheck over SAN_FILTER (default "dyn");
#   3. the engine's TTFT and batch-1 decode (scripts/device_engine.sh run, Llama-3-8B shape,
#      HF beside it) with ENGINE_PREFILL_VARIANTS (default static_attn) alternated.
# Packs, made here: `bash scripts/device_engine.sh pack BUILD` (BUILD with -DOT_BUILD_TOOLS=ON,
# sm_90a, Release) and the shim: `cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc
# -I/usr/include -I$CUDA/include BUILD/libops_transformer.a -L$CUDA/lib64 -lcudart -lcublasLt
# -lopenblas -fopenmp -lm -lstdc++ -o .devcarry-dyn/libattention_shim.so`.
set -uo pipefail
COMMIT=${1:-unknown}
OUT=${OUT:-/tmp/ot_attn_engine_out}
mkdir -p "$OUT" /tmp/pk
cd "$(dirname "$0")/.."
tar xzf .devcarry-engine/engine.tar.gz -C /tmp/pk || exit 1
export LD_LIBRARY_PATH=/tmp/pk/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
: "${ATTN_ARGS:=--fwd-only --no-variants --rounds 10 --shapes 1:32:8:2048:128,1:40:40:2048:128,1:32:8:8192:128,4:32:8:2048:128,8:16:16:4096:128,32:32:32:1024:64,32:8:8:1024:256}"
: "${ATTN_AB:=old=OT_ATTN_SM90_DYN:0,OT_ATTN_SM90_SECT:mha,_causal_only:1;static=OT_ATTN_SM90_DYN:0,_causal_only:1}"
# shellcheck disable=SC2086
timeout "${ATTN_TIMEOUT:-220}" python3 bench/bench_attention.py --shim .devcarry-dyn/libattention_shim.so \
  --bench $ATTN_ARGS --ab "$ATTN_AB" --json "$OUT/attention_dyn.json" --commit "$COMMIT" \
  --command "scripts/device_attn_engine.sh $COMMIT: bench_attention.py --bench $ATTN_ARGS --ab '$ATTN_AB'" \
  >"$OUT/bench_attn.log" 2>&1
echo "bench rc=$?"
grep -E "GEMM|^attention_fwd|^  ab" "$OUT/bench_attn.log" | cut -c1-140
timeout "${TEST_TIMEOUT:-150}" /tmp/pk/test_ops --backend cuda --suite attention --filter cuda >"$OUT/tests.log" 2>&1
echo "tests rc=$? $(tail -1 "$OUT/tests.log")"
grep -A3 "^FAIL" "$OUT/tests.log" | head -20
for tool in memcheck racecheck synccheck; do
  timeout "${SAN_TIMEOUT:-60}" compute-sanitizer --tool $tool --print-limit 10 /tmp/pk/test_ops --backend cuda \
    --suite attention --filter "${SAN_FILTER:-dyn}" >"$OUT/san_$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1) | $(tail -1 "$OUT/san_$tool.log")"
done
[ "${ENGINE:-1}" = 1 ] || exit 0
ENGINE_BENCH_FIRST=1 ENGINE_SHAPES=${ENGINE_SHAPES:-llama3-8b} ENGINE_OFFLOAD_BIG=0 ENGINE_LINEAR_TESTS=0 \
  ENGINE_LINEAR_BENCH=0 ENGINE_SKIP_CHECK=1 ENGINE_PYTESTS=0 ENGINE_MEMCHECK_DECODE=0 \
  ENGINE_BENCH_TIMEOUT=${ENGINE_BENCH_TIMEOUT:-200} \
  ENGINE_BENCH_ARGS="--batches 1 --no-ttft-diag --no-timeline --decode-variants= --prefill-variants ${ENGINE_PREFILL_VARIANTS:-static_attn}" \
  timeout "${ENGINE_TIMEOUT:-280}" bash scripts/device_engine.sh run "$COMMIT" >"$OUT/engine_run.log" 2>&1
echo "engine rc=$?"
grep -iE "ttft|tok/s|roofline|static_attn" "$OUT/engine_run.log" | head -30
