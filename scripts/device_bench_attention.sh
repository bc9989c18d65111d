#!/usr/bin/env bash
# scripts/device_bench_attention.sh -- on a Hopper machine (the project's lent H200: `run`
# executes this in the repository root): smoke-test every variant of the sm_90a forward
# kernel, check it against float64 references, benchmark it against torch SDPA (cuDNN,
# flash), run the C attention suite (cuda cases), compute-sanitizer memcheck, optionally
# one ncu profile of the D128 S = 4k launch.
#
#   [BENCH_ARGS="--fwd-only ..."] [TOOLS="memcheck"] [CARRY=DIR] \
#     scripts/device_bench_attention.sh [COMMIT] [STEPS]
#       STEPS: comma list of smoke,check,tests,tsan,bench,ncu,sanitize,res (default
#       smoke,check,tests,bench,sanitize; tsan = compute-sanitizer racecheck and synccheck
#       on the C suite's "hopper-only" cases, Hopper forward and backward);
#       logs and results under $OUT.
#
# CARRY (default .devcarry-fwd90, git-ignored by .gitignore's /.devcarry*/; pass it in
# `run`'s carry) holds what was built on the build machine with the device's nvcc major
# version: libattention_shim.so (bench/attention_shim.c linked against an sm_90a
# libops_transformer.a, as the fallback below links it), test_ops.xz (tests/test_ops of
# that build, xz -6: the carry limit) and deps.tar.gz (libopenblas.so.0, libgfortran.so.5,
# libquadmath.so.0 from .carry/deps/lib). Without it (or when the shim does not load) the
# static library is built here (sm_90a only; NO_BUILD=1 stops instead) and the C suite is
# skipped.
#
# Variants (OT_ATTN_SM90_* switches) run first in one smoke process; one that hangs is
# named (HUNG KEY=VAL), left out of the later steps (OT_BENCH_BROKEN) and reported.
# Step time limits: SMOKE_TIMEOUT, CHECK_TIMEOUT, BENCH_TIMEOUT, TEST_TIMEOUT, SAN_TIMEOUT,
# NCU_TIMEOUT (seconds); TEST_MORE="VAR=VAL ...[;VAR=VAL ...]" runs the C suite once more
# per ';'-separated set with those variables. DEADLINE=s: no step runs past s seconds
# from the start (each step's limit is cut to what is left; a step with < 5 s left is
# skipped and named). CHECK_ENV="VAR=VAL ...": the check step runs with those set.
# Order: smoke, bench, tests, tsan, check, res, sanitize, ncu.
set -uo pipefail
COMMIT=${1:-unknown}
STEPS=${2:-smoke,check,tests,bench,sanitize}
OUT=${OUT:-/tmp/ot_device_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
# lim N: the step limit N cut to what DEADLINE leaves (0: skip the step)
lim() {
  local left
  [ -z "${DEADLINE:-}" ] && { echo "$1"; return; }
  left=$(( DEADLINE - ($(date +%s) - T0) ))
  if [ "$left" -lt 5 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
skipped() { echo "SKIPPED (deadline): $1"; }
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
CARRY=${CARRY:-.devcarry-fwd90}
D="$ROOT/.carry/deps"
export LD_LIBRARY_PATH="$D/lib:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
SHIM=${SHIM:-$CARRY/libattention_shim.so}
TEST_OPS=""
if [ -f "$CARRY/deps.tar.gz" ]; then
  mkdir -p /tmp/ot_deps && tar xzf "$CARRY/deps.tar.gz" -C /tmp/ot_deps &&
    export LD_LIBRARY_PATH="/tmp/ot_deps:$LD_LIBRARY_PATH"
fi
if [ -f "$CARRY/test_ops.xz" ]; then
  xz -dc "$CARRY/test_ops.xz" >/tmp/test_ops && chmod +x /tmp/test_ops && TEST_OPS=/tmp/test_ops
fi

if ! python3 -c "import ctypes,sys; ctypes.CDLL(sys.argv[1])" "$SHIM" 2>/tmp/ot_shim_load.log; then
  stamp "carried shim does not load ($(head -c 200 /tmp/ot_shim_load.log)); building"
  [ -n "${NO_BUILD:-}" ] && { echo "NO_BUILD set: stopping"; exit 1; }
  # shellcheck source=device_build.sh
  source scripts/device_build.sh   # carried dlpack / OpenBLAS where the machine lacks them
  ot_device_build build-dev ops_transformer_static || exit 1
  DLPACK_INC=$OT_DEVICE_DLPACK_INCLUDE
  SHIM=build-dev/libattention_shim.so
  cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I"$DLPACK_INC" -I"$CUDA_HOME/include" \
    build-dev/libops_transformer.a -L"$CUDA_HOME/lib64" -lcudart -lcublasLt -L"$D/lib" -lopenblas \
    -fopenmp -lm -lstdc++ -o "$SHIM" || exit 1
fi
stamp "shim $SHIM"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
B="python3 bench/bench_attention.py --shim $SHIM"

# The smoke step: the small checks under every variant in one process; a hang (a wrong
# barrier phase or TMA byte count) must not eat the device time.
export OT_BENCH_BROKEN=""
if has smoke; then
  for attempt in 1 2 3 4; do
    stamp "smoke (attempt $attempt, broken: ${OT_BENCH_BROKEN:-none})"
    t=$(lim ${SMOKE_TIMEOUT:-90}); [ "$t" = 0 ] && { skipped smoke; break; }
    timeout $t $B --smoke >"$OUT/smoke.log" 2>&1
    rc=$?
    grep -E '^smoke|^HUNG|^FAIL' "$OUT/smoke.log" | tail -12
    hung=$(grep -oE '^HUNG [A-Z0-9_]+=[a-z0-9]+' "$OUT/smoke.log" | head -1 | cut -d' ' -f2)
    if [ $rc -eq 3 ] && [ -n "$hung" ]; then
      OT_BENCH_BROKEN="$OT_BENCH_BROKEN,$hung"
      continue
    fi
    if [ $rc -eq 3 ] || [ $rc -eq 124 ]; then echo "DEFAULT KERNEL HANGS"; exit 2; fi
    break
  done
  echo "broken variants: ${OT_BENCH_BROKEN:-none}"
fi

if has bench && t=$(lim ${BENCH_TIMEOUT:-200}) && { [ "$t" != 0 ] || ! skipped bench; }; then
  stamp "bench"
  timeout $t $B --bench ${BENCH_ARGS:-} --json "$OUT/attention.json" --plot "$OUT/attention.png" --commit "$COMMIT" \
    --command "scripts/device_bench_attention.sh $COMMIT $STEPS" >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -E 'GEMM|attention_fwd|variant|failed|Error|not available' "$OUT/bench.log" | cut -c1-150
fi
# The C suite (float64 CPU oracle), after the benchmark (it would disturb the timings).
if has tests && [ -n "$TEST_OPS" ]; then
  stamp "C suite"
  IFS=';' read -r -a more <<<"${TEST_MORE:-}"
  for envs in "" "${more[@]}"; do
    t=$(lim ${TEST_TIMEOUT:-45}); [ "$t" = 0 ] && { skipped "tests [$envs]"; continue; }
    env $envs timeout "$t" "$TEST_OPS" --backend cuda --suite attention --filter cuda \
      >/tmp/ot_tests.log.tmp 2>&1
    echo "tests [$envs]: rc=$? $(tail -1 /tmp/ot_tests.log.tmp)" | tee -a "$OUT/tests.log"
    grep -A3 '^FAIL' /tmp/ot_tests.log.tmp | head -20 | tee -a "$OUT/tests.log"
  done
fi
if has tsan && [ -n "$TEST_OPS" ]; then
  for tool in racecheck synccheck; do
    t=$(lim ${SAN_TIMEOUT:-60}); [ "$t" = 0 ] && { skipped "tsan $tool"; continue; }
    stamp "compute-sanitizer $tool (C suite, hopper-only)"
    timeout "$t" compute-sanitizer --tool $tool --print-limit 10 "$TEST_OPS" --backend cuda \
      --suite attention --filter "hopper-only" >"$OUT/tsan_$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/tsan_$tool.log" | tail -1)" \
      "$(tail -1 "$OUT/tsan_$tool.log" | cut -c1-100)"
  done
fi
if has check && t=$(lim ${CHECK_TIMEOUT:-150}) && { [ "$t" != 0 ] || ! skipped check; }; then
  stamp "check"
  env ${CHECK_ENV:-} timeout $t $B --check >"$OUT/check.log" 2>&1
  echo "check rc=$?"; grep -E 'FAIL|check:|Error|error' "$OUT/check.log" | head -40
fi
if has res; then
  stamp "resource usage"
  cuobjdump -res-usage "$SHIM" 2>/dev/null | grep -A1 attn_fwd_sm90 | grep -E 'REG|STACK' | head -40 >"$OUT/res.txt"
  cat "$OUT/res.txt" | cut -c1-200
fi
if has sanitize; then
  for tool in ${TOOLS:-memcheck}; do
    stamp "compute-sanitizer $tool"
    timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool $tool --print-limit 10 $B --sanitize >"$OUT/$tool.log" 2>&1
    echo "$tool rc=$?"; grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard' "$OUT/$tool.log" | head -8
    grep -c 'sanitize run' "$OUT/$tool.log"
  done
fi
if has ncu; then
  stamp "ncu (D128 S4k, one launch)"
  timeout ${NCU_TIMEOUT:-60} ncu --clock-control none -k regex:attn_fwd_sm90 -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section MemoryWorkloadAnalysis $B --profile-one >"$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"
  grep -E "Duration|Throughput|Pipe|Stall|Issue|Warp Cycles|L2 Hit|Executed Ipc|Busy" "$OUT/ncu.log" | head -40
fi
stamp "end"
