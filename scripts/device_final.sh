#!/usr/bin/env bash
# scripts/device_final.sh [COMMIT] -- a session's closing device call, in one script: the
# benchmarks whose records must come from the final code, each with its peers in the same
# process and on a quiet GPU (the attention grid against torch SDPA cuDNN / flash, paged
# decode against SDPA on a contiguous cache and gather + SDPA), then the whole regression
# (scripts/device_verify.sh with its C suites and sanitizers beside the Python tests).
#
# Build here (no GPU), pack, run on the device with carry [".devcarry-verify"]:
#   cmake -S . -B build-verify -G Ninja -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-verify --target ops_transformer ops_transformer_static test_ops ot_engine_shared ot-run
#   bash scripts/device_verify.sh --pack build-verify
#   bash scripts/device_final.sh --pack build-verify     # the benchmark shims, same library
#   bash scripts/device_final.sh COMMIT                    # on the device; results under $OUT
# Environment: FINAL_STEPS (comma list of attn,decode,verify; default all three),
# ATTN_ARGS (bench_attention.py arguments; default the issue's grid: D 128/64/256,
# S 1k/4k/16k, no variants; 5 balanced rounds a case since 2026-12-01: ~130-150 s expected),
# ATTN_TIMEOUT (s, 300), DECODE_TIMEOUT (s, 120); the
# OT_VERIFY_* variables of device_verify.sh pass through (OT_VERIFY_PARALLEL defaults to 1;
# the Python tests beside the C suites and sanitizers take ~250 s: OT_VERIFY_PY_TIMEOUT=300).
# The verdicts are printed last; the verify logs come back as verify_logs.tar.gz.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=.devcarry-verify
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
if [ "${1:-}" = "--pack" ]; then
  set -e
  B=${2:?usage: device_final.sh --pack BUILD_DIR}
  INC=(-Iinclude -Isrc -I.carry/deps/include -I"$CUDA_HOME/include")
  LIBS=("$B/libops_transformer.a" -L"$CUDA_HOME/lib64" -L.carry/deps/lib -lcudart -lcublasLt
        -lopenblas -fopenmp -lm -lstdc++)
  S=$(mktemp -d)
  cc -O2 -shared -fPIC bench/attention_shim.c "${INC[@]}" "${LIBS[@]}" -o "$S/libattention_shim.so"
  cc -O2 -shared -fPIC bench/decode_shim.c "${INC[@]}" "${LIBS[@]}" -o "$S/libdecode_shim.so"
  cc -O2 bench/arena_bench.c "${INC[@]}" "${LIBS[@]}" -o "$S/arena_bench"
  git rev-parse HEAD >"$S/commit.txt"
  mkdir -p "$CARRY"
  tar czf "$CARRY/shims.tar.gz" -C "$S" .
  rm -rf "$S"
  ls -la "$CARRY"
  exit 0
fi
COMMIT=${1:-unknown}
STEPS=${FINAL_STEPS:-attn,decode,verify}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
OUT=${OUT:-/tmp/ot_final_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
SH=/tmp/ot_final_shims
M=/tmp/ot_final_lib
rm -rf "$SH" "$M" && mkdir -p "$SH" "$M"
VPACK=$(ls "$CARRY"/verify.tar.xz "$CARRY"/verify.tar.gz 2>/dev/null | head -1)
tar xzf "$CARRY/shims.tar.gz" -C "$SH" && [ -n "$VPACK" ] && tar xf "$VPACK" -C "$M" ||
  { echo "no $CARRY/shims.tar.gz or verify.tar.xz (see --pack)"; exit 1; }
export LD_LIBRARY_PATH="$M/lib:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
echo "shims built from $(cat "$SH/commit.txt"), library from $(cat "$M/commit.txt"); tree $COMMIT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
RUN="device tool, nvidia-h200, carry [\"$CARRY\"]"

if has attn; then
  stamp "attention grid (bench_attention.py --bench ${ATTN_ARGS:=--no-variants --dims 128,64,256 --seqs 1024,4096,16384})"
  # shellcheck disable=SC2086
  timeout "${ATTN_TIMEOUT:-300}" python3 bench/bench_attention.py --shim "$SH/libattention_shim.so" \
    --bench $ATTN_ARGS --json "$OUT/attention.json" --plot "$OUT/attention.png" --commit "$COMMIT" \
    --command "FINAL_STEPS=attn ATTN_ARGS='$ATTN_ARGS' bash scripts/device_final.sh $COMMIT ($RUN)" \
    >"$OUT/attention.log" 2>&1
  echo "attention rc=$?"
  grep -E 'GEMM|failed|Error|Traceback' "$OUT/attention.log" | cut -c1-160 | head -8
fi

if has decode; then
  stamp "decode (bench_decode.py --check)"
  timeout "${DECODE_TIMEOUT:-120}" python3 bench/bench_decode.py --shim "$SH/libdecode_shim.so" \
    --arena-bin "$SH/arena_bench" --check --json "$OUT/decode.json" --commit "$COMMIT" \
    --command "FINAL_STEPS=decode bash scripts/device_final.sh $COMMIT ($RUN)" >"$OUT/decode.log" 2>&1
  echo "decode rc=$?"
  python3 bench/plot_decode.py "$OUT/decode.json" "$OUT/decode.png" >>"$OUT/decode.log" 2>&1 ||
    echo "decode plot failed"
  grep -E 'FAIL|failed|Error|Traceback' "$OUT/decode.log" | cut -c1-160 | head -8
fi

if has verify; then
  stamp "regression (device_verify.sh)"
  OT_VERIFY_PARALLEL=${OT_VERIFY_PARALLEL:-1} OUT="$OUT/verify" bash scripts/device_verify.sh "$COMMIT"
fi

stamp "summary"
# what must not scroll away: the regression's verdicts (the device tool returns the last
# lines of the output and a few files only, so the logs go back as one archive too)
if [ -d "$OUT/verify" ]; then
  grep -hE "^test_ops:|^FAIL" "$OUT/verify/test_ops_cuda.log" 2>/dev/null | head -12
  grep -hE "SUMMARY" "$OUT/verify/sanitize.log" 2>/dev/null | sort | uniq -c
  grep -hE "^(FAILED|ERROR)" "$OUT/verify/pytest.log" 2>/dev/null | head -12
  echo "pytest: $(grep -hE "passed|failed|^rc " "$OUT/verify/pytest.log" 2>/dev/null | tail -2 | tr '\n' ' ')"
  [ -f "$OUT/verify/pytest_serial.log" ] && echo "pytest (alone): $(grep -hE "passed|failed|^rc " \
    "$OUT/verify/pytest_serial.log" | tail -2 | tr '\n' ' ')"
  tar czf "$OUT/verify_logs.tar.gz" -C "$OUT" verify && rm -rf "$OUT/verify"
fi
[ -f "$OUT/attention.json" ] && python3 - "$OUT/attention.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(f"{r['op']:18s} {r['case']:34s} {r['ours']:7.1f}  x{r['ratio_best_peer']}")
EOF
[ -f "$OUT/decode.json" ] && python3 bench/plot_decode.py "$OUT/decode.json" --markdown 2>/dev/null | head -30
stamp "done"
