#!/usr/bin/env bash
# scripts/test.sh -- everything CI checks (`bash .ci/run` calls this):
#   1. set-up (scripts/setup.sh)
#   2. the README's C example is examples/c/example.c, byte for byte; docs/ENVIRONMENT.md
#      names every OT_* environment variable (scripts/check_env_docs.sh)
#   3. build/ : the library, tests and tools with the CUDA backend (sm_80, sm_90a);
#      ctest
#   4. build-asan/ : CPU-only build under AddressSanitizer + UBSan; ctest
#   5. cmake --install build, then the C example built against the installed copy
#      with find_package(ops_transformer) and with pkg-config, and run
#   6. scripts/test_python.sh, when it exists
# Environment: OT_CUDA=OFF builds without CUDA (developer machines without a CUDA
# toolkit; not allowed when CI=true). OT_JOBS overrides the parallelism (nproc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
JOBS=${OT_JOBS:-$(nproc)}
T_ALL=$(date +%s)
TIMINGS=()
FAILED=()

stage_begin() { STAGE="$1"; T0=$(date +%s); echo; echo "=== $STAGE"; }
stage_end() {
  local dt=$(($(date +%s) - T0))
  TIMINGS+=("$(printf '%-46s %5ds' "$STAGE" "$dt")")
  echo "[time] $STAGE: ${dt}s"
}
trap 'rc=$?; if [ $rc -ne 0 ] && [ "${STAGE:-}" != end ]; then echo; echo "FAILED in stage: ${STAGE:-?} (exit $rc)"; fi' EXIT

stage_begin "setup"
# shellcheck source=setup.sh
source scripts/setup.sh
stage_end

stage_begin "README example matches examples/c"
awk '/^<!-- example.c -->/{f=1; next} f && /^```c$/{p=1; next} p && /^```$/{exit} p' \
  README.md >"${TMPDIR:-/tmp}/ot_readme_example.c"
if ! diff -u examples/c/example.c "${TMPDIR:-/tmp}/ot_readme_example.c"; then
  echo "README.md's example (the \`\`\`c block after <!-- example.c -->) differs from examples/c/example.c"
  exit 1
fi
stage_end

stage_begin "docs/ENVIRONMENT.md lists every OT_* variable"
bash scripts/check_env_docs.sh
stage_end

CUDA=${OT_CUDA:-ON}
if [ "$CUDA" = ON ] && [ -z "$OT_NVCC" ]; then
  echo "error: no CUDA compiler (nvcc) found, and the CUDA backend must be compiled." >&2
  echo "  Install the CUDA toolkit (/usr/local/cuda), or rerun with OT_SETUP_PIP_CUDA=1" >&2
  echo "  to fetch nvcc from PyPI, or with OT_CUDA=OFF to build the CPU backend only." >&2
  exit 1
fi
if [ "$CUDA" != ON ] && [ "${CI:-}" = true ]; then
  echo "error: CI must compile the CUDA backend (OT_CUDA=$CUDA)" >&2
  exit 1
fi

stage_begin "configure build (OT_CUDA=$CUDA)"
CUDA_ARGS=()
if [ "$CUDA" = ON ]; then
  CUDA_ARGS=(-DCMAKE_CUDA_COMPILER="$OT_NVCC"
             -DCMAKE_CUDA_COMPILER_LAUNCHER="$ROOT/scripts/time_compile.sh")
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DOT_CUDA="$CUDA" -DOT_BUILD_TESTS=ON \
  -DOT_BUILD_TOOLS=ON "${CUDA_ARGS[@]}" >"${TMPDIR:-/tmp}/ot_configure.log" 2>&1 \
  || { cat "${TMPDIR:-/tmp}/ot_configure.log"; exit 1; }
grep -E "^-- (The CUDA|Found CUDAToolkit|Found OpenMP_C|Found BLAS)" "${TMPDIR:-/tmp}/ot_configure.log" || true
stage_end

stage_begin "build (-j$JOBS)"
export OT_COMPILE_TIMES="$ROOT/build/cuda_compile_times.txt"
rm -f "$OT_COMPILE_TIMES"
cmake --build build -j"$JOBS"
if [ "$CUDA" = ON ]; then
  if [ -s "$OT_COMPILE_TIMES" ]; then
    sort -rn "$OT_COMPILE_TIMES" | sed 's|'"$ROOT"'/||' | head -20 | sed 's/^/  nvcc /'
    awk '{s+=$1; n++} END {printf "[time] CUDA compile (sm_80 + sm_90a): %d files, %.1fs of compiler time\n", n, s}' \
      "$OT_COMPILE_TIMES"
    NVCC_LINE="$(awk '{s+=$1; n++} END {printf "%-46s %5.0fs (%d .cu files, serial sum)", "  of which nvcc", s, n}' "$OT_COMPILE_TIMES")"
  else
    echo "[time] CUDA compile: nothing recompiled (build/ was up to date)"
  fi
fi
stage_end
[ -n "${NVCC_LINE:-}" ] && TIMINGS+=("$NVCC_LINE")

stage_begin "ctest build"
# A failing test does not stop the later stages; the script fails at the end.
(cd build && ctest --output-on-failure) || FAILED+=("ctest build")
stage_end

stage_begin "configure+build build-asan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOT_CUDA=OFF -DOT_SANITIZE=ON \
  -DOT_BUILD_TESTS=ON -DOT_BUILD_TOOLS=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
stage_end

stage_begin "ctest build-asan"
# Leak checking stays on; OpenMP's thread pool is not reported as a leak by ASan.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
   UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure) || FAILED+=("ctest build-asan")
stage_end

stage_begin "install + C example (find_package, pkg-config)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ot_install.XXXXXX")
cmake --install build --prefix "$WORK/prefix" >/dev/null
cmake -S examples/c -B "$WORK/ex-cmake" -DCMAKE_PREFIX_PATH="$WORK/prefix" >/dev/null
cmake --build "$WORK/ex-cmake" >/dev/null
echo "--- find_package build:"
"$WORK/ex-cmake/example"
mkdir -p "$WORK/ex-pc"
PCDIR=$(dirname "$(find "$WORK/prefix" -name ops_transformer.pc | head -1)")
PKG_CONFIG_PATH="$PCDIR" make -s -C "$WORK/ex-pc" -f "$ROOT/examples/c/Makefile"
echo "--- pkg-config build:"
"$WORK/ex-pc/example"
rm -rf "$WORK"
stage_end

if [ -f scripts/test_python.sh ]; then
  stage_begin "scripts/test_python.sh"
  bash scripts/test_python.sh || FAILED+=("scripts/test_python.sh")
  stage_end
fi

echo
echo "=== timings"
printf '%s\n' "${TIMINGS[@]}"
echo "total $(($(date +%s) - T_ALL))s"
STAGE="end"
if ((${#FAILED[@]})); then
  echo "FAILED: ${FAILED[*]}"
  exit 1
fi
echo "ALL STAGES PASSED"
