#!/usr/bin/env bash
# scripts/device_lin.sh -- CUDA linear, softmax, AdamW and fused linear + cross-entropy on
# the lent GPU machine (`run` executes this in the repository root; carry [".carry"] for
# the dlpack / OpenBLAS deps, plus the prebuilt folder if any).
#
#   scripts/device_lin.sh [--prebuilt DIR] [COMMIT]
#
# Steps (logs under $OUT, default /tmp/ot_device_out; the summary table is printed last):
#   1. build libops_transformer.so + tests/test_ops for sm_90a (scripts/device_build.sh),
#      or, with --prebuilt DIR, take DIR/test_ops and
#      DIR/libops_transformer.so built elsewhere with the same nvcc, or DIR/prebuilt.tar.gz
#      holding them and the OpenBLAS runtime (libopenblas.so.0, libgfortran.so.5,
#      libquadmath.so.0): then carry only DIR (e.g. [".devcarry-lin"]);
#   2. test_ops --backend cuda --suite linear / softmax_ce / adamw / linear_ce (every case
#      against the float64 references);
#   3. bench/bench_linear_ce.py -> $OUT/linear_ce.json;
#   4. compute-sanitizer memcheck on small cases of each of these kernels (last: a time
#      limit cuts it rather than the benchmark);
#   5. summary: test and sanitizer lines, then the benchmark table.
# OT_LIN_SKIP_SAN=1 skips step 3, OT_LIN_ONLY=<families> limits the benchmark.
set -uo pipefail
PREBUILT=""
if [ "${1:-}" = "--prebuilt" ]; then PREBUILT=$2; shift 2; fi
COMMIT=${1:-unknown}
OUT=${OUT:-/tmp/ot_device_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1
stamp "commit $COMMIT"

# shellcheck source=device_build.sh
source scripts/device_build.sh   # ot_device_deps / ot_device_build: carried dlpack / OpenBLAS

if [ -n "$PREBUILT" ]; then
  if [ -f "$PREBUILT/prebuilt.tar.gz" ]; then # test_ops, the .so and the OpenBLAS runtime
    mkdir -p /tmp/ot_lin_prebuilt && tar xzf "$PREBUILT/prebuilt.tar.gz" -C /tmp/ot_lin_prebuilt
    PREBUILT=/tmp/ot_lin_prebuilt
    export LD_LIBRARY_PATH="$PREBUILT:${LD_LIBRARY_PATH:-}"
  else
    ot_device_deps || exit 1
  fi
  TEST=$PREBUILT/test_ops
  LIB=$PREBUILT/libops_transformer.so
  chmod +x "$TEST" 2>/dev/null
else
  stamp "build (sm_90a)"
  TARGETS="ops_transformer ops_transformer_static test_ops"
  ot_device_build build-dev "$TARGETS" || { echo "BUILD FAILED"; exit 1; }
  TEST=build-dev/tests/test_ops
  LIB=build-dev/libops_transformer.so
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader

stamp "test_ops --backend cuda"
TLOG="$OUT/lin_tests.log"
: >"$TLOG"
for s in linear softmax_ce adamw linear_ce; do
  timeout 180 "$TEST" --backend cuda --suite "$s" >>"$TLOG" 2>&1
  echo "test_ops --suite $s rc=$?" >>"$TLOG"
done

stamp "bench/bench_linear_ce.py"
python3 bench/bench_linear_ce.py --lib "$LIB" --only "${OT_LIN_ONLY:-linear_ce,adamw,linear,softmax}" \
  --json "$OUT/linear_ce.json" --commit "$COMMIT" \
  --command "bash scripts/device_lin.sh $COMMIT" >"$OUT/lin_bench.log" 2>&1
echo "bench rc=$?" >>"$OUT/lin_bench.log"

SLOG="$OUT/lin_sanitize.log"
: >"$SLOG"
if [ "${OT_LIN_SKIP_SAN:-0}" != 1 ]; then
  stamp "compute-sanitizer memcheck"
  san() { # suite filter
    echo "== memcheck $1 '$2'" >>"$SLOG"
    timeout ${OT_LIN_SAN_TIMEOUT:-60} compute-sanitizer --tool memcheck --print-limit 10 \
      "$TEST" --backend cuda --suite "$1" --filter "$2" >>"$SLOG" 2>&1
    echo "   memcheck $1 '$2' rc=$? $(grep -E 'ERROR SUMMARY' "$SLOG" | tail -1)" >>"$SLOG"
  }
  san linear "[17] K=64 N=33"
  san linear "[3] K=70 N=130"
  san softmax_ce "softmax fwd"
  san softmax_ce "softmax bwd"
  san adamw "many"
  san linear_ce "T=37 H=24"
  san linear_ce "T=7 H=16"
fi

stamp "summary"
echo "---- tests (CUDA)"
grep -E '^FAIL' "$TLOG" | head -20
grep -E '^cuda |rc=' "$TLOG"
echo "---- sanitizer"
grep -E '^   memcheck' "$SLOG"
echo "---- benchmark"
cat "$OUT/lin_bench.log"
