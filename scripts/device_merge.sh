#!/usr/bin/env bash
# scripts/device_merge.sh [COMMIT] -- the split merge's A/B and checks in one short device call
# (the one-round merge pa_merge1_kernel, OT_PAGED_MERGE=1, against pa_merge_kernel, =0):
#   1. bench_decode.py --ab in ONE process: the packed library with OT_PAGED_MERGE=0 / 1,
#      each also with paged_kv_ready (the engine's batch-1 early start), cuDNN / flash SDPA on
#      the same cache made contiguous, AB_ROUNDS rounds (default 6) -> $OUT/ab.json;
#   2. test_ops --backend cuda --suite memory --filter "${MEM_FILTER:-merge1}" (the merge1
#      blocks: against the float64 reference and both merges bit for bit) -> $OUT/test.log;
#   3. compute-sanitizer memcheck + racecheck on "${SAN_FILTER:-merge1 back to back}" (batch 1
#      at the engine's heads, 2049 keys, and a B5 case, two calls back to back) -> $OUT/san.log.
# Binaries come prebuilt: scripts/device_merge.sh --pack [BUILD_DIR] here (default
# build-merge, an sm_90a Release build: cmake -S . -B build-merge -G Ninja
# -DCMAKE_BUILD_TYPE=Release -DOT_CUDA_ARCHS=90a; its ops_transformer_static and test_ops
# are built unless PACK_NO_BUILD=1) links the decode shim and packs tests/test_ops, the shim,
# the carried deps and bench/bench_decode.py (BENCH_PY) into .devcarry-merge/; run with carry
# [".devcarry-merge"].
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=.devcarry-merge
if [ "${1:-}" = "--pack" ]; then
  set -e
  B=${2:-build-merge}
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  if [ "${PACK_NO_BUILD:-0}" != 1 ]; then
    [ -f "$B/build.ninja" ] || cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOT_CUDA_ARCHS=90a
    cmake --build "$B" -j2 --target ops_transformer_static test_ops
  fi
  cc -O2 -shared -fPIC bench/decode_shim.c -Iinclude -Isrc -I.carry/deps/include -I"$CUDA_HOME/include" \
    "$B/libops_transformer.a" -L"$CUDA_HOME/lib64" -L.carry/deps/lib -lcudart -lcublasLt -lopenblas \
    -fopenmp -lm -lstdc++ -o "$B/libdecode_shim.so"
  mkdir -p "$CARRY/stage"
  git check-ignore -q "$CARRY/" || { echo "$0: $CARRY is not git-ignored (.gitignore: /.devcarry*/): name the pack .devcarry-*" >&2; exit 1; }
  cp "$B/tests/test_ops" "$B/libdecode_shim.so" "$CARRY/stage/"
  tar czf "$CARRY/prebuilt.tar.gz" -C "$CARRY/stage" test_ops libdecode_shim.so
  rm -rf "$CARRY/stage"
  tar czf "$CARRY/deps.tar.gz" -C .carry/deps lib include
  cp "${BENCH_PY:-bench/bench_decode.py}" "$CARRY/bench_decode.py"
  git rev-parse HEAD >"$CARRY/commit.txt"
  ls -la "$CARRY"
  exit 0
fi
COMMIT=${1:-$(cat "$CARRY/commit.txt" 2>/dev/null || echo unknown)}
OUT=${OUT:-/tmp/ot_merge_out}
mkdir -p "$OUT" build-mg .carry/deps
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/bench"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
[ -d .carry/deps/lib ] || tar xzf "$CARRY/deps.tar.gz" -C .carry/deps
export LD_LIBRARY_PATH="$ROOT/.carry/deps/lib:${LD_LIBRARY_PATH:-}"
tar xzf "$CARRY/prebuilt.tar.gz" -C build-mg
SH=build-mg/libdecode_shim.so
stamp "ab"
timeout "${AB_TIMEOUT:-40}" python3 "$CARRY/bench_decode.py" --ab \
  "merge0=$SH@OT_PAGED_MERGE=0,merge1=$SH@OT_PAGED_MERGE=1,merge0_ready=$SH@OT_PAGED_MERGE=0@kv_ready=1,merge1_ready=$SH@OT_PAGED_MERGE=1@kv_ready=1" \
  --ab-shapes "${AB_SHAPES:-1x2048,1x512,1x8192,16x4096,64x1024}" --rounds "${AB_ROUNDS:-6}" \
  --json "$OUT/ab.json" --commit "$COMMIT" \
  --command "bash scripts/device_merge.sh $COMMIT (run tool, nvidia-h200, carry [\".devcarry-merge\"])" \
  >"$OUT/ab.log" 2>&1
echo "ab rc=$?"
stamp "memory suite [${MEM_FILTER:-merge1}]"
timeout "${MEM_TIMEOUT:-40}" build-mg/test_ops --backend cuda --suite memory --filter "${MEM_FILTER:-merge1}" \
  >"$OUT/test.log" 2>&1
echo "memory rc=$?"; grep -E '^cuda ' "$OUT/test.log"; grep -E 'FAIL' "$OUT/test.log" | head -10
F=${SAN_FILTER:-merge1 back to back}
stamp "memcheck [$F]"
timeout "${SAN_TIMEOUT:-25}" compute-sanitizer --tool memcheck --print-limit 10 build-mg/test_ops \
  --backend cuda --suite memory --filter "$F" >"$OUT/san.log" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/san.log") $(grep -E '^cuda ' "$OUT/san.log")"
stamp "racecheck [$F]"
echo "=== racecheck" >>"$OUT/san.log"
timeout "${SAN_TIMEOUT:-25}" compute-sanitizer --tool racecheck --racecheck-report all --print-limit 10 \
  build-mg/test_ops --backend cuda --suite memory --filter "$F" >>"$OUT/san.log" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/san.log" | tail -2 | tr '\n' ' ') $(grep -E '^cuda ' "$OUT/san.log" | tail -1)"
stamp "done"
grep '^ab' "$OUT/ab.log" || tail -5 "$OUT/ab.log"
