#!/usr/bin/env bash
# scripts/device_ksplit.sh COMMIT -- one device call for the Hopper forward's kFlKsplit
# (carry [".devcarry-ks"], made by scripts/pack_ks.sh: ks.tar.xz = test_ops of an sm_90a Release build, the attention
# shim bench/attention_shim.c linked against its libops_transformer.a, OpenBLAS and its
# runtime libraries; made here:
#   cmake -S . -B build-s -DCMAKE_BUILD_TYPE=Release -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a
#   cmake --build build-s --target test_ops; cc ... bench/attention_shim.c (see
#   scripts/device_attn_engine.sh) -o libattention_shim.so; tar cJf .devcarry-ks/ks.tar.xz
#   test_ops libattention_shim.so lib/{libopenblas.so.0,libgfortran.so.5,libquadmath.so.0}):
#   1. the kFlKsplit C cases first (a hang shows here, cut at 90 s);
#   2. bench_attention.py --bench with ATTN_ARGS and the --ab variants ATTN_AB;
#   3. the C attention suite on CUDA (over 240 s on an H100 since the forty-second session:
#      TEST_TIMEOUT defaults to 400; stdbuf -oL so that a cut run still shows its FAILs), then
#      compute-sanitizer memcheck / racecheck / synccheck over SAN_FILTER (default ksplit: a
#      few cases; over all 84 split cases each sanitizer ran past 45 s).
set -uo pipefail
COMMIT=${1:-unknown}
OUT=${OUT:-/tmp/ot_ksplit_out}
mkdir -p "$OUT" /tmp/ks
cd "$(dirname "$0")/.."
tar xJf .devcarry-ks/ks.tar.xz -C /tmp/ks || exit 1
export LD_LIBRARY_PATH=/tmp/ks/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
T=/tmp/ks/test_ops
timeout 90 stdbuf -oL $T --backend cuda --suite attention --filter "${SAN_FILTER:-ksplit}" >"$OUT/ks_tests.log" 2>&1
echo "ksplit cases rc=$? $(tail -1 "$OUT/ks_tests.log")"
grep -A3 "^FAIL" "$OUT/ks_tests.log" | head -20
: "${ATTN_ARGS:=--fwd-only --no-variants --rounds 8 --shapes 32:32:32:1024:64,8:32:32:4096:64,2:32:32:16384:64}"
: "${ATTN_AB:=ksoff=OT_ATTN_SM90_KSPLIT:0,_full_only:1;aa=OT_ATTN_SM90_KSPLIT:1,_full_only:1}"
if [ "${BENCH:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout "${ATTN_TIMEOUT:-240}" python3 bench/bench_attention.py --shim /tmp/ks/libattention_shim.so \
    --bench $ATTN_ARGS --ab "$ATTN_AB" --json "$OUT/attention_ksplit.json" --commit "$COMMIT" \
    --command "scripts/device_ksplit.sh $COMMIT: bench_attention.py --bench $ATTN_ARGS --ab '$ATTN_AB'" \
    >"$OUT/bench_attn.log" 2>&1
  echo "bench rc=$?"
  grep -E "GEMM|^attention_fwd|^  ab" "$OUT/bench_attn.log" | cut -c1-150
fi
timeout "${TEST_TIMEOUT:-400}" stdbuf -oL $T --backend cuda --suite attention --filter cuda >"$OUT/tests.log" 2>&1
echo "tests rc=$? $(tail -1 "$OUT/tests.log")"
grep -A3 "^FAIL" "$OUT/tests.log" | head -20
for tool in memcheck racecheck synccheck; do
  timeout "${SAN_TIMEOUT:-60}" compute-sanitizer --tool $tool --print-limit 10 $T --backend cuda \
    --suite attention --filter "${SAN_FILTER:-ksplit}" >"$OUT/san_$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1) | $(tail -1 "$OUT/san_$tool.log")"
done
