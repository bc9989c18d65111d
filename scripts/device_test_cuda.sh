#!/usr/bin/env bash
# scripts/device_test_cuda.sh -- build and test the CUDA backend's fused ops on a GPU
# machine (the project's lent H200: `run` executes this in the repository root), then
# benchmark them.
#
#   scripts/device_test_cuda.sh [all|check|bench] [--no-compile]
#
# Steps (logs under $OUT, default /tmp/ot_device_out):
#   1. configure + build for sm_90a only (Release, ninja), the static library and
#      tests/test_ops; build bench/fused_ops_shim.c into build-dev/libfused_ops_shim.so;
#   2. tests/test_ops --backend cuda (every case of the cross-backend test on CUDA
#      against the float64 references);
#   3. bench/bench_fused_ops.py --check: our kernels against float64 torch references
#      (odd shapes, strided rows, all dtypes, in place);
#   4. bench/bench_fused_ops.py --bench -> $OUT/fused_ops.json (+ plot) and its table;
#   5. compute-sanitizer racecheck over our kernels alone, then memcheck over the norm
#      and cross-entropy checks on small shapes (--sanitize: every kernel variant, no
#      torch references) -- last, so that a time limit cuts them, not the benchmark.
# Machines without libdlpack-dev / OpenBLAS (the lent ones have no package registry)
# use the headers and libraries carried in .carry/deps (copied from a Debian machine:
# dlpack.h, cblas.h, libopenblas.so.0 and its libgfortran / libquadmath).
#
# Environment (all optional):
#   OT_PREBUILT=DIR   skip the build: DIR holds prebuilt.tar.gz and deps.tar.gz made by
#                     scripts/device_prebuild.sh on a machine without a GPU (carry DIR
#                     instead of .carry: no device time spent compiling)
#   OT_SUITES="norm rope"   test_ops suites to run (default: all)
#   OT_ONLY=norm,rope       families for the python check, memcheck and benchmark
#                           (default: norm,rope,glu,ce)
#                           ("normbwd" in the benchmark: the norm backward rows only;
#                           scripts/device_norm_bwd.sh is the short call around it)
#   OT_CHECK_ONLY           families for the python check (default: OT_ONLY)
#   OT_MEMCHECK_ONLY        families under compute-sanitizer memcheck (default norm,ce)
#   OT_SANITIZE_TIMEOUT     seconds per sanitizer run (default 200)
#   OT_TEST_TIMEOUT         seconds per test_ops suite and per python check (default 300)
#   OT_BENCH_TIMEOUT        seconds for the benchmark (default 420)
#   OT_COMMIT               the commit recorded in the JSON (the device copy has no .git)
#   OT_BENCH_FLAGS          extra flags for the benchmark (e.g. --no-compile)
#   OT_VARIANT_ENV          "VAR=value ..." of opt-in kernel selections (e.g. the
#                           ALT_KERNELS of bench_fused_ops.py): test_ops, the python
#                           check and memcheck run a second time under them
#   OT_VARIANT_STEPS        which of those run under OT_VARIANT_ENV (default "test check
#                           memcheck")
#   OT_NCU=1                after the benchmark: Nsight Compute over the norm and RoPE
#                           kernels and a copy-like torch kernel (bench_fused_ops.py --ncu:
#                           torch.neg, RMSNorm / LayerNorm forward and backward, RoPE q + k
#                           at 16k x 4096 bf16; sections SpeedOfLight, Occupancy,
#                           WarpStateStats, LaunchStats, clocks not locked) -> $OUT/ncu.log
#   OT_NCU_TIMEOUT          seconds for it (default 60)
#   OT_PLOT=0               no PNG (plot the JSON elsewhere: $OUT brings back 8 files)
#   OT_MEMCHECK_SANITIZE=1  memcheck over --sanitize (our kernels alone, no float64
#                           references: faster) instead of the --check --small pass
set -uo pipefail
MODE=${1:-all}
COMPILE_FLAG=${2:-}
OUT=${OUT:-/tmp/ot_device_out}
mkdir -p "$OUT"
LOGS=build-dev/logs   # build logs stay on the machine ($OUT brings back at most 8 files)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
variant_step() { case " ${OT_VARIANT_STEPS:-test check memcheck} " in *" $1 "*) return 0 ;; esac; return 1; }

if [ -n "${OT_PREBUILT:-}" ]; then
  stamp "prebuilt binaries from $OT_PREBUILT"
  mkdir -p build-dev/deps
  tar xzf "$OT_PREBUILT/prebuilt.tar.gz" -C build-dev || exit 1
  tar xzf "$OT_PREBUILT/deps.tar.gz" -C build-dev/deps || exit 1
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  export LD_LIBRARY_PATH="$ROOT/build-dev/deps:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
else
  # shellcheck source=device_build.sh
  source scripts/device_build.sh   # carried dlpack / OpenBLAS where the machine lacks them
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  stamp "configure + build"
  ot_device_build build-dev "ops_transformer_static test_ops" || exit 1
  DLPACK_INC=$OT_DEVICE_DLPACK_INCLUDE
  cc -O2 -shared -fPIC bench/fused_ops_shim.c -Iinclude -Isrc -I"$DLPACK_INC" -I"$CUDA_HOME/include" \
    build-dev/libops_transformer.a -L"$CUDA_HOME/lib64" -lcudart -lcublasLt -lopenblas -fopenmp -lm \
    -lstdc++ -o build-dev/libfused_ops_shim.so >"$LOGS/shim.log" 2>&1 || { cat "$LOGS/shim.log"; exit 1; }
fi
SHIM=build-dev/libfused_ops_shim.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$LOGS/gpu.txt"

# Order: tests and float64 checks, then the benchmark, then the sanitizers (the slowest
# step last, so that a time limit cuts it rather than the benchmark).
if [ "$MODE" = all ] || [ "$MODE" = check ]; then
  stamp "test_ops --backend cuda"
  if [ -n "${OT_SUITES:-}" ]; then
    : >"$OUT/test_ops.log"
    for s in $OT_SUITES; do
      timeout "${OT_TEST_TIMEOUT:-300}" build-dev/tests/test_ops --backend cuda --suite "$s" >>"$OUT/test_ops.log" 2>&1
      echo "test_ops --suite $s rc=$?"
    done
  else
    timeout "${OT_TEST_TIMEOUT:-300}" build-dev/tests/test_ops --backend cuda >"$OUT/test_ops.log" 2>&1
    echo "test_ops rc=$?"
  fi
  grep -E '^cuda ' "$OUT/test_ops.log" | head -20
  grep -E 'FAIL' "$OUT/test_ops.log" | head -20
  if [ -n "${OT_VARIANT_ENV:-}" ] && variant_step test; then
    for s in ${OT_SUITES:-norm rope}; do
      # shellcheck disable=SC2086
      env $OT_VARIANT_ENV timeout "${OT_TEST_TIMEOUT:-300}" build-dev/tests/test_ops --backend cuda --suite "$s" >>"$OUT/test_ops_variant.log" 2>&1
      echo "test_ops --suite $s ($OT_VARIANT_ENV) rc=$?"
    done
    grep -E '^cuda |FAIL' "$OUT/test_ops_variant.log" | head -20
  fi
  stamp "python check"
  timeout "${OT_TEST_TIMEOUT:-300}" python3 bench/bench_fused_ops.py --shim $SHIM --check --only "${OT_CHECK_ONLY:-${OT_ONLY:-norm,rope,glu,ce}}" >"$OUT/check.log" 2>&1
  echo "check rc=$?"; tail -25 "$OUT/check.log"
  if [ -n "${OT_VARIANT_ENV:-}" ] && variant_step check; then
    # shellcheck disable=SC2086
    env $OT_VARIANT_ENV timeout "${OT_TEST_TIMEOUT:-300}" python3 bench/bench_fused_ops.py --shim $SHIM --check --only "${OT_CHECK_ONLY:-${OT_ONLY:-norm,rope,glu,ce}}" >"$OUT/check_variant.log" 2>&1
    echo "check ($OT_VARIANT_ENV) rc=$?"; grep -E '^check:|FAIL' "$OUT/check_variant.log" | head -20
  fi
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  stamp "bench"
  COMMIT=${OT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
  timeout "${OT_BENCH_TIMEOUT:-420}" python3 bench/bench_fused_ops.py --shim $SHIM --bench $COMPILE_FLAG ${OT_BENCH_FLAGS:-} --only "${OT_ONLY:-norm,rope,glu,ce}" --json "$OUT/fused_ops.json" \
    --commit "$COMMIT" --command "scripts/device_test_cuda.sh $MODE $COMPILE_FLAG" >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  [ "${OT_PLOT:-1}" = 0 ] || python3 bench/plot_fused_ops.py "$OUT/fused_ops.json" "$OUT/fused_ops.png" >>"$OUT/bench.log" 2>&1 || true
  stamp "bench done"
  sed -n '/^op /,$p' "$OUT/bench.log"
  grep -E 'peer failed|Error|error' "$OUT/bench.log" | head -5
fi

if [ "${OT_NCU:-0}" = 1 ]; then
  stamp "ncu"
  timeout "${OT_NCU_TIMEOUT:-60}" ncu --clock-control none --kernel-name-base demangled \
    --kernel-name 'regex:ot::norm_|ot::rope_|neg_kernel' \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
    python3 bench/bench_fused_ops.py --shim $SHIM --ncu >"$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"
  grep -E '^  [a-z].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Block Limit Reg|dram__bytes' "$OUT/ncu.log" | cut -c1-150 | head -90
fi

if [ "$MODE" = all ] || [ "$MODE" = check ]; then
  stamp "compute-sanitizer racecheck"
  timeout "${OT_SANITIZE_TIMEOUT:-200}" compute-sanitizer --tool racecheck --racecheck-report all --print-limit 20 \
    python3 bench/bench_fused_ops.py --shim $SHIM --sanitize --only "${OT_ONLY:-norm,rope,glu,ce}" >"$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|sanitize|hazard' "$OUT/racecheck.log" | head -10
  stamp "compute-sanitizer memcheck"
  if [ "${OT_MEMCHECK_SANITIZE:-0}" = 1 ]; then MEMCHECK_ARGS="--sanitize"; else MEMCHECK_ARGS="--check --small"; fi
  timeout "${OT_SANITIZE_TIMEOUT:-200}" compute-sanitizer --tool memcheck --print-limit 20 \
    python3 bench/bench_fused_ops.py --shim $SHIM $MEMCHECK_ARGS --only "${OT_MEMCHECK_ONLY:-norm,ce}" >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E 'ERROR SUMMARY|check:|sanitize|Invalid|FAIL' "$OUT/memcheck.log" | head -10
  if [ -n "${OT_VARIANT_ENV:-}" ] && variant_step memcheck; then
    # shellcheck disable=SC2086
    env $OT_VARIANT_ENV timeout "${OT_SANITIZE_TIMEOUT:-200}" compute-sanitizer --tool memcheck --print-limit 20 \
      python3 bench/bench_fused_ops.py --shim $SHIM --check --small --only "${OT_MEMCHECK_ONLY:-norm,ce}" >"$OUT/memcheck_variant.log" 2>&1
    echo "memcheck ($OT_VARIANT_ENV) rc=$?"; grep -E 'ERROR SUMMARY|check:|Invalid|FAIL' "$OUT/memcheck_variant.log" | head -10
  fi
fi
stamp "end"
