#!/usr/bin/env bash
# scripts/device_verify.sh -- the whole GPU regression in one device call: every suite of
# tests/test_ops on the CUDA backend (float64 oracles), then the Python tests (their CUDA
# cases run where a GPU is present) against the same library, and the engine's tests.
#
# Build here (no GPU), pack, then run on the device with carry [".devcarry-verify"]:
#   cmake -S . -B build-verify -G Ninja -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-verify --target ops_transformer test_ops ot_engine_shared ot-run
#   (ot-run: test_engine.py's module needs it, else it skips whole; expect ~1 min more pytest)
#   bash scripts/device_verify.sh --pack build-verify
#   bash scripts/device_verify.sh [COMMIT]          # on the device; logs under $OUT
# Environment: OT_VERIFY_SUITES (test_ops suites, space-separated; default: every suite),
# OT_VERIFY_PYTESTS (pytest arguments; default: all of tests/python), OT_VERIFY_C_TIMEOUT (s, 320: every suite took 277 s on 2026-12-01),
# OT_VERIFY_PY_TIMEOUT (s, 540: at 2b1a008 the GPU pytest outgrew 250 s at ~65% of it; on 2026-12-01 beside the C suites it outgrew 420 s at ~70%), OT_VERIFY_SAN: compute-sanitizer runs over test_ops filters,
# "tool|filter;tool|filter" (40 s each; default: none; with OT_VERIFY_PARALLEL=1 they run
# after the C suites, beside the Python tests; test_memory_workload.py then runs alone after
# them, unless OT_VERIFY_PYTESTS is set: its arguments all run beside the C job).
# OT_VERIFY_SHARDS=N (N > 1; implies OT_VERIFY_PARALLEL): every test_ops suite in a process of
# its own, all at once, and tests/python split by file into N pytest processes (greedy by
# the files' last durations in OT_VERIFY_DURATIONS -- a pytest.log of an earlier run, its
# "slowest durations" section summed per file -- else by size), each process with 2 OpenMP /
# OpenBLAS threads; logs per process (test_ops_cuda.SUITE.log, pytest.K.log), concatenated into
# test_ops_cuda.log / pytest.log and then packed into test_ops_parts.tar.gz / pytest_parts.tar.gz
# (a device call returns at most 8 files). Why: on 2026-12-02 (7def3aa) the two halves side by side hit
# 290 s / 430 s at ~92% / ~75% of their tests: the regression no longer fit one 600 s call.
# For a regression only, never for timings (the processes share the GPU).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=.devcarry-verify
if [ "${1:-}" = "--pack" ]; then
  set -e
  B=${2:?usage: device_verify.sh --pack BUILD_DIR}
  git check-ignore -q "$CARRY/" || { echo "$0: $CARRY is not git-ignored (.gitignore: /.devcarry*/): name the pack .devcarry-*" >&2; exit 1; }
  S=$(mktemp -d)
  mkdir -p "$S/lib" "$S/include" "$CARRY"
  cp -a "$B"/libops_transformer.so* "$S/lib/"
  cp "$B/tests/test_ops" "$S/"
  find "$B" -name 'libot_engine.so' -exec cp {} "$S/lib/" \; -quit
  # ot-run (a build with OT_BUILD_TOOLS=ON): without it tests/python/test_engine.py skips as a
  # whole module, its CUDA fused-decode tests included
  [ -x "$B/tools/ot-run" ] && cp "$B/tools/ot-run" "$S/"
  # ot-run and libot_engine.so need libcjson.so.1, which the device may lack (device_engine.sh
  # carries it too): the copy in .carry/cjson, else the system's
  CJ=$(ls .carry/cjson/lib/libcjson.so.1 2>/dev/null || ldconfig -p | awk '/libcjson\.so\.1 /{print $NF; exit}')
  if [ -n "$CJ" ]; then cp -L "$CJ" "$S/lib/libcjson.so.1"; else echo "warning: no libcjson.so.1 to pack"; fi
  DEPS=$ROOT/.carry/deps
  cp -a "$DEPS"/lib/libopenblas.so* "$DEPS"/lib/libgfortran.so.5 "$DEPS"/lib/libquadmath.so.0 "$S/lib/"
  if [ -f /usr/include/dlpack/dlpack.h ]; then cp -r /usr/include/dlpack "$S/include/"
  else cp -r "$DEPS/include/dlpack" "$S/include/"; fi
  # OT_PACK_COMMIT: the commit the build was made from, where that is not this tree's HEAD
  # (a build dir of another worktree)
  echo "${OT_PACK_COMMIT:-$(git rev-parse HEAD)}" >"$S/commit.txt"
  # xz, not gzip: 30 MB against 47.5 (2026-12-03; the kernels' fatbins, twice: in test_ops
  # and in the library), so that the pack and the 14 MB attention shim fit one call's 64 MiB
  # carry together; ~45 s here on 2 cores, a few seconds to unpack there
  rm -f "$CARRY/verify.tar.gz"
  tar cJf "$CARRY/verify.tar.xz" -C "$S" .
  rm -rf "$S"
  ls -la "$CARRY"
  exit 0
fi
OUT=${OUT:-/tmp/ot_verify_out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
M=/tmp/ot_verify
PACK=$(ls "$CARRY"/verify.tar.xz "$CARRY"/verify.tar.gz 2>/dev/null | head -1)
rm -rf "$M" && mkdir -p "$M" && [ -n "$PACK" ] && tar xf "$PACK" -C "$M" ||
  { echo "no $CARRY/verify.tar.xz (or .gz)"; exit 1; }
export LD_LIBRARY_PATH="$M/lib:${LD_LIBRARY_PATH:-}"
# test_engine.py looks for libot_engine.so at <ot-run>/../src/engine unless OT_ENGINE_LIB
# names it (the closing call of cebbfe1's first try skipped 13 engine tests for that)
[ -f "$M/lib/libot_engine.so" ] && export OT_ENGINE_LIB="${OT_ENGINE_LIB:-$M/lib/libot_engine.so}"
if [ -x "$M/ot-run" ]; then export OT_RUN="${OT_RUN:-$M/ot-run}"
else echo "no ot-run in the pack (a build without OT_BUILD_TOOLS?): test_engine.py will skip"; fi
echo "library built from $(cat "$M/commit.txt"); tree ${1:-?}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# OT_VERIFY_PARALLEL=1: the C suites run in the background beside the Python tests (the GPU
# is shared; for a regression, never for timings), their summary printed when both are done.
c_suites() {
if [ -z "${OT_VERIFY_SUITES:-}" ]; then
  stamp "test_ops --backend cuda (every suite)"
  timeout "${OT_VERIFY_C_TIMEOUT:-320}" "$M/test_ops" --backend cuda >"$OUT/test_ops_cuda.log" 2>&1
  echo "rc $?" >>"$OUT/test_ops_cuda.log"
else
  : >"$OUT/test_ops_cuda.log"
  for s in $OT_VERIFY_SUITES; do
    stamp "test_ops --backend cuda --suite $s"
    timeout "${OT_VERIFY_C_TIMEOUT:-200}" "$M/test_ops" --backend cuda --suite "$s" -v \
      >>"$OUT/test_ops_cuda.log" 2>&1
    echo "rc $? (suite $s)" >>"$OUT/test_ops_cuda.log"
  done
fi
}
# OT_VERIFY_SHARDS: each suite in a process of its own, all at once (see the header)
c_suites_sharded() {
  stamp "test_ops --backend cuda: every suite in a process of its own"
  local suites
  suites=$("$M/test_ops" --list 2>/dev/null) || suites=""
  if [ -z "$suites" ]; then stamp "test_ops --list failed: one process"; c_suites; return; fi
  rm -f "$OUT"/test_ops_cuda.*.log
  for s in $suites; do
    ( OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 timeout "${OT_VERIFY_C_TIMEOUT:-320}" \
        "$M/test_ops" --backend cuda --suite "$s" >"$OUT/test_ops_cuda.$s.log" 2>&1
      echo "rc $? (suite $s)" >>"$OUT/test_ops_cuda.$s.log"
      stamp "suite $s done" ) &
  done
  wait
  for s in $suites; do cat "$OUT/test_ops_cuda.$s.log"; done >"$OUT/test_ops_cuda.log"
  pack_parts test_ops_parts "$OUT"/test_ops_cuda.*.log
}
# At most 8 files come back from a device call (on 2026-12-02 the 11 suite logs crowded out
# test_ops_cuda.log): the per-process logs, once concatenated, go into one tar.gz
pack_parts() {
  local name=$1; shift
  [ $# -gt 0 ] && [ -e "$1" ] || return 0
  tar czf "$OUT/$name.tar.gz" -C "$OUT" "${@##*/}" && rm -f "$@"
}
c_summary() {
grep -E "^FAIL" "$OUT/test_ops_cuda.log" | head -20
grep -E "passed,|^rc " "$OUT/test_ops_cuda.log" | tail -n 60
awk '/^test_ops: /{p+=$2; f+=$4; s+=$6} END{if (NR) printf "test_ops total: %d passed, %d failed, %d skipped\n", p, f, s}' \
  "$OUT/test_ops_cuda.log"
}
san_runs() {
IFS=';' read -ra SANS <<<"${OT_VERIFY_SAN:-}"
for item in "${SANS[@]}"; do
  tool=${item%%|*} filter=${item#*|}
  stamp "compute-sanitizer $tool '$filter'"
  timeout 40 compute-sanitizer --tool "$tool" --print-limit 10 "$M/test_ops" --backend cuda \
    --filter "$filter" >>"$OUT/sanitize.log" 2>&1
  echo "   rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize.log" | tail -1)"
done
}
CPID=""
SHARDS=${OT_VERIFY_SHARDS:-1}
[ "$SHARDS" -gt 1 ] 2>/dev/null && OT_VERIFY_PARALLEL=1 || SHARDS=1
if [ "$SHARDS" -gt 1 ]; then
  { c_suites_sharded; san_runs; } >"$OUT/c_suites.stamps" 2>&1 &
  CPID=$!
elif [ -n "${OT_VERIFY_PARALLEL:-}" ]; then
  { c_suites; san_runs; } >"$OUT/c_suites.stamps" 2>&1 &
  CPID=$!
else
  c_suites
  c_summary
  san_runs
fi

stamp "_C against the carried library"
PY=$(command -v python3)
PKG=$M/pkg/ops_transformer
mkdir -p "$PKG"
cp python/ops_transformer/*.py "$PKG/"
[ -f "$M/lib/libot_engine.so" ] && cp "$M/lib/libot_engine.so" "$PKG/"
EXT=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
PYINC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if ! cc -O2 -shared -fPIC -Wall -Wno-unused-parameter python/ops_transformer/_C.c -Iinclude \
     -I"$M/include" -I"$PYINC" -L"$M/lib" -lops_transformer -Wl,-rpath,"$M/lib" \
     -o "$PKG/_C$EXT" >"$OUT/ext.log" 2>&1; then
  cat "$OUT/ext.log"; echo "extension build failed"
  # parallel mode: the C job's verdict still (not left running behind the exit)
  if [ -n "$CPID" ]; then wait "$CPID"; cat "$OUT/c_suites.stamps"; c_summary; fi
  exit 1
fi
# test_memory_workload.py's CUDA case compares cudaMemGetInfo's device-wide used bytes with
# what its window allocated, so another process on the GPU (the C suites and sanitizers of
# OT_VERIFY_PARALLEL) makes it fail: the closing run of cd51db0 saw -27.6 MiB 'unaccounted'
# while the sanitizers ran beside it. In parallel mode it runs alone, after the C job.
SERIAL_PY=tests/python/test_memory_workload.py
DESELECT=""
if [ -n "$CPID" ] && [ -z "${OT_VERIFY_PYTESTS:-}" ]; then DESELECT="--ignore=$SERIAL_PY"; fi
if [ "$SHARDS" -gt 1 ] && [ -z "${OT_VERIFY_PYTESTS:-}" ]; then
  # the files (the serial one aside) in SHARDS bins, greedy, longest first
  mapfile -t BINS < <("$PY" scripts/pytest_shards.py "$SHARDS" tests/python "$SERIAL_PY" \
                        "${OT_VERIFY_DURATIONS:-}")
  stamp "pytest in ${#BINS[@]} processes"
  PPIDS=()
  for k in "${!BINS[@]}"; do
    # shellcheck disable=SC2086
    ( PYTHONPATH="$M/pkg" OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \
        timeout "${OT_VERIFY_PY_TIMEOUT:-540}" "$PY" -m pytest -q -p no:cacheprovider -rs \
        --durations=0 --durations-min=1.0 ${BINS[$k]} >"$OUT/pytest.$k.log" 2>&1
      echo "rc $? (shard $k: ${BINS[$k]})" >>"$OUT/pytest.$k.log" ) &
    PPIDS+=($!)
  done
  wait "${PPIDS[@]}"
  for k in "${!BINS[@]}"; do cat "$OUT/pytest.$k.log"; done >"$OUT/pytest.log"
  for k in "${!BINS[@]}"; do tail -2 "$OUT/pytest.$k.log"; done
  pack_parts pytest_parts "$OUT"/pytest.[0-9]*.log
else
stamp "pytest ${OT_VERIFY_PYTESTS:-tests/python} $DESELECT"
# shellcheck disable=SC2086
PYTHONPATH="$M/pkg" timeout "${OT_VERIFY_PY_TIMEOUT:-540}" "$PY" -m pytest -q -p no:cacheprovider \
  -rs --durations=0 --durations-min=1.0 ${OT_VERIFY_PYTESTS:-tests/python} $DESELECT >"$OUT/pytest.log" 2>&1
echo "rc $?" >>"$OUT/pytest.log"
fi
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20
tail -3 "$OUT/pytest.log"
if [ -n "$CPID" ]; then
  wait "$CPID"
  cat "$OUT/c_suites.stamps"
  c_summary
fi
if [ -n "$DESELECT" ]; then
  stamp "pytest $SERIAL_PY (alone on the GPU)"
  PYTHONPATH="$M/pkg" timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rs "$SERIAL_PY" \
    >"$OUT/pytest_serial.log" 2>&1
  echo "rc $?" >>"$OUT/pytest_serial.log"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_serial.log" | head -20
  tail -2 "$OUT/pytest_serial.log"
fi
stamp "done"
