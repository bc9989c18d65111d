#!/usr/bin/env bash
# scripts/device_attention.sh -- test and time the portable (sm_80+) CUDA flash attention
# on the lent GPU machine (`run` executes this in the repository root).
#
#   scripts/device_attention.sh [--prebuilt DIR] [--sweep] [COMMIT]
#
# Steps (logs under $OUT, default /tmp/ot_device_out; a summary is printed last):
#   1. build tests/test_ops and bench/attn_portable_timing.c for sm_90a through
#      scripts/device_build.sh (carried deps, build-dev/), or, with --prebuilt DIR, take
#      DIR/test_ops and DIR/attn_portable_timing built elsewhere with the same nvcc
#      (saves the build's minutes of device time);
#   2. OT_ATTN_IMPL=portable test_ops --backend cuda --suite attention (every case of the
#      suite, the CUDA grid included, against the float64 references);
#   3. compute-sanitizer memcheck, racecheck and synccheck on a few small cases;
#   4. timing: B=2 H=16 S=4096 D=128 bf16, forward and forward+backward, causal and not,
#      ours (portable) against torch SDPA (flash and cuDNN backends);
#   --sweep (binaries built with -DOT_ATTN_TUNING): time the other D = 128 tile shapes
#      (OT_ATTN_FWD_CFG / OT_ATTN_BWD_CFG = 1..5) and run the D128 test cases under each.
# OT_ATTN_IMPL=portable forces the portable kernels even where the Hopper forward exists.
set -uo pipefail
PREBUILT=""
if [ "${1:-}" = "--prebuilt" ]; then PREBUILT=$2; shift 2; fi
SWEEP=0
if [ "${1:-}" = "--sweep" ]; then SWEEP=1; shift; fi
COMMIT=${1:-unknown}
OUT=${OUT:-/tmp/ot_device_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/device_build.sh   # ot_device_deps / ot_device_build (shared with the other device scripts)
ot_device_deps || exit 1         # carried OpenBLAS on LD_LIBRARY_PATH when the machine lacks it
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
export LD_LIBRARY_PATH="$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
LOGS=build-dev/logs
mkdir -p "$LOGS"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OT_ATTN_IMPL=portable
stamp "commit $COMMIT"

if [ -n "$PREBUILT" ]; then
  # DIR/bin.tar.xz (xz shrinks the fatbins ~4x: the carry limit) or the binaries themselves
  if [ -f "$PREBUILT/bin.tar.xz" ]; then
    mkdir -p /tmp/ot_prebuilt && tar -xJf "$PREBUILT/bin.tar.xz" -C /tmp/ot_prebuilt && PREBUILT=/tmp/ot_prebuilt
  fi
  TEST=$PREBUILT/test_ops
  TIMING=$PREBUILT/attn_portable_timing
  chmod +x "$TEST" "$TIMING" 2>/dev/null
  if ldd "$TEST" "$TIMING" | grep -q 'not found'; then
    ldd "$TEST" | grep 'not found'
    echo "prebuilt binaries miss libraries here: building instead"
    PREBUILT=""
  fi
fi
if [ -z "$PREBUILT" ]; then
  stamp "build"
  ot_device_build build-dev "ops_transformer_static test_ops" || exit 1
  cc -O2 bench/attn_portable_timing.c -Iinclude -I"$OT_DEVICE_DLPACK_INCLUDE" -I"$CUDA_HOME/include" \
    build-dev/libops_transformer.a -L"$CUDA_HOME/lib64" -lcudart -lcublasLt -lopenblas -fopenmp \
    -lm -lstdc++ -o build-dev/attn_portable_timing >"$LOGS/timing_build.log" 2>&1 ||
    { cat "$LOGS/timing_build.log"; exit 1; }
  TEST=build-dev/tests/test_ops
  TIMING=build-dev/attn_portable_timing
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader

stamp "test_ops --backend cuda --suite attention"
timeout 240 "$TEST" -v --backend cuda --suite attention >"$OUT/attn_tests.log" 2>&1
echo "test_ops rc=$?"
grep -E -A3 '^FAIL' "$OUT/attn_tests.log" | head -60
tail -3 "$OUT/attn_tests.log"

SAN="$OUT/attn_sanitize.log"
: >"$SAN"
san() { # tool filter
  echo "== $1 / $2" >>"$SAN"
  timeout 120 compute-sanitizer --tool "$1" --print-limit 10 "${@:3}" \
    "$TEST" --backend cuda --suite attention --filter "$2" >>"$SAN" 2>&1
  echo "   $1 '$2' rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$SAN" | tail -1)"
}
stamp "compute-sanitizer"
san memcheck "cuda S17 D96"
san memcheck "cuda varlen causal D128"
san memcheck "decode Sq1 Sk4097"
san racecheck "cuda S17 D96" --racecheck-report all
san racecheck "varlen decode" --racecheck-report all
san synccheck "cuda S17 D96"
san synccheck "varlen D256"

stamp "timing (ours, portable)"
SETS=()
if [ "$SWEEP" = 1 ]; then
  SETS=(OT_ATTN_FWD_CFG=0)
  for k in 1 2 3 4 5; do SETS+=(OT_ATTN_FWD_CFG=$k); done
  SETS+=(OT_ATTN_FWD_CFG=0)
  for k in 1 2 3 4; do SETS+=(OT_ATTN_BWD_CFG=$k); done
  SETS+=(OT_ATTN_BWD_CFG=0)
fi
for c in 0 1; do timeout 90 "$TIMING" 2 16 4096 128 $c 20 "${SETS[@]}" 2>&1 | tee -a "$OUT/attn_timing.log"; done
if [ "$SWEEP" = 1 ]; then
  stamp "D128 cases under each tile shape"
  for k in 1 2 3 4 5; do
    OT_ATTN_FWD_CFG=$k OT_ATTN_BWD_CFG=$k timeout 60 "$TEST" --backend cuda --suite attention \
      --filter "D128 GQA" >"$OUT/attn_sweep_tests.log" 2>&1
    echo "cfg $k: rc=$? $(tail -1 "$OUT/attn_sweep_tests.log")" | tee -a "$OUT/attn_timing.log"
    grep -A3 '^FAIL' "$OUT/attn_sweep_tests.log" | head -8
  done
fi
stamp "timing (torch SDPA)"
timeout 90 python3 - <<'PY' 2>&1 | tee -a "$OUT/attn_timing.log"
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, S, D = 2, 16, 4096, 128
g = torch.Generator(device="cuda").manual_seed(0)
mk = lambda: (torch.rand(B, H, S, D, device="cuda", generator=g, dtype=torch.float32) * 2 - 1).to(torch.bfloat16).requires_grad_()
q, k, v = mk(), mk(), mk()
do = torch.rand_like(q)
def t(fn, it=20):
    for _ in range(3): fn()
    ts = []
    for _ in range(it):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]
for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
    for causal in (False, True):
        fl = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        try:
            with sdpa_kernel(be):
                f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                tf = t(lambda: f())
                tb = t(lambda: f().backward(do))
            print(f"torch-{name} B={B} H={H} S={S} D={D} causal={int(causal)}: fwd {tf:.3f} ms "
                  f"{fl / tf / 1e9:.1f} TFLOP/s, fwd+bwd {tb:.3f} ms {3.5 * fl / tb / 1e9:.1f} TFLOP/s")
        except Exception as e:
            print(f"torch-{name}: {type(e).__name__}: {e}")
PY

stamp "summary"
echo "tests: $(grep -c '^ok ' "$OUT/attn_tests.log") ok, $(grep -c '^FAIL' "$OUT/attn_tests.log") FAIL, $(grep -c '^skip' "$OUT/attn_tests.log") skipped"
grep -E '^== |ERROR SUMMARY|RACECHECK SUMMARY' "$SAN"
cat "$OUT/attn_timing.log"
stamp "end"
