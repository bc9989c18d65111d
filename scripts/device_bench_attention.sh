#!/usr/bin/env bash
# scripts/device_bench_attention.sh -- on a Hopper machine (the project's lent H200: `run`
# executes this in the repository root): build the attention shim, smoke-test the sm_90a
# forward kernel, check it against float64 references, benchmark it against torch SDPA
# (cuDNN, flash), run compute-sanitizer on small cases, report registers / spills.
#
#   [BENCH_ARGS=--no-variants] [TOOLS="memcheck"] scripts/device_bench_attention.sh [COMMIT] [STEPS]
#       STEPS: comma list of
#       check,bench,sanitize,res (default all); logs and results under $OUT.
#
# A shim built beforehand (build-fa90/libattention_shim.so, carried) is used when it
# loads; otherwise the static library is built here (sm_90a only) and the shim linked.
# Machines without OpenBLAS / dlpack use .carry/deps (see scripts/device_test_cuda.sh).
set -uo pipefail
COMMIT=${1:-unknown}
STEPS=${2:-check,bench,sanitize,res}
OUT=${OUT:-/tmp/ot_device_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
D="$ROOT/.carry/deps"
export LD_LIBRARY_PATH="$D/lib:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
SHIM=${SHIM:-build-fa90/libattention_shim.so}

if ! python3 -c "import ctypes,sys; ctypes.CDLL(sys.argv[1])" "$SHIM" 2>"$OUT/shim_load.log"; then
  stamp "carried shim does not load ($(head -c 200 "$OUT/shim_load.log")); building"
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

# A hang (a wrong barrier phase or TMA byte count) must not eat the device time.
stamp "smoke"
timeout 60 $B --check --small >"$OUT/smoke.log" 2>&1
rc=$?; tail -8 "$OUT/smoke.log"
if [ $rc -eq 124 ]; then echo "SMOKE TIMED OUT (hang)"; exit 2; fi

if has check; then
  stamp "check"
  timeout 100 $B --check >"$OUT/check.log" 2>&1
  echo "check rc=$?"; grep -E 'FAIL|check:|Error|error' "$OUT/check.log" | head -40
fi
if has bench; then
  stamp "bench"
  timeout 150 $B --bench ${BENCH_ARGS:-} --json "$OUT/attention.json" --plot "$OUT/attention.png" --commit "$COMMIT" \
    --command "scripts/device_bench_attention.sh $COMMIT $STEPS" >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -E 'GEMM|attention_fwd|variant|failed|Error|not available' "$OUT/bench.log" | cut -c1-150
fi
if has res; then
  stamp "resource usage"
  cuobjdump -res-usage "$SHIM" 2>/dev/null | grep -A1 attn_fwd_sm90 | grep -E 'REG|STACK' | head -12 >"$OUT/res.txt"
  cuobjdump -sass "$SHIM" 2>/dev/null | awk '/Function : .*attn_fwd_sm90/{f=$3} /HGMMA/{h[f]++} /LDL|STL/{l[f]++} END{for(k in h) print k, "HGMMA", h[k], "LDL/STL", l[k]+0}' >>"$OUT/res.txt"
  cat "$OUT/res.txt" | cut -c1-200
fi
if has sanitize; then
  for tool in ${TOOLS:-memcheck racecheck synccheck}; do
    stamp "compute-sanitizer $tool"
    timeout 40 compute-sanitizer --tool $tool --print-limit 10 $B --sanitize >"$OUT/$tool.log" 2>&1
    echo "$tool rc=$?"; grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize run|Invalid|hazard' "$OUT/$tool.log" | head -8
  done
fi
stamp "end"
