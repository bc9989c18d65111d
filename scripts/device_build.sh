#!/usr/bin/env bash
# scripts/device_build.sh -- configure + build on the lent GPU machine, for the device
# scripts (source it, then call ot_device_build):
#
#   source scripts/device_build.sh
#   ot_device_build <build-dir> "<targets>" [extra cmake -D arguments...]
#
# CUDA on, sm_90a only (the H200), Release, Ninja when present, -j$(nproc). Machines
# without libdlpack-dev / OpenBLAS (the lent ones have no package registry) use the
# headers and libraries carried in .carry/deps (scripts/carry_deps.sh fills it here; pass
# carry [".carry"] to `run`); their
# lib folder is added to LD_LIBRARY_PATH / LIBRARY_PATH for the programs run afterwards.
# Logs: <build-dir>/logs/{cmake,build}.log (the error lines are printed on failure).
# Returns non-zero when configure or build fails.

OT_DEVICE_CMAKE_DEPS=()
ot_device_deps() {
  local root deps
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  OT_DEVICE_CMAKE_DEPS=()
  if [ ! -f /usr/include/dlpack/dlpack.h ] || ! ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so'; then
    deps="$root/.carry/deps"
    if [ ! -d "$deps" ]; then
      echo "device_build: no system dlpack/OpenBLAS and no $deps (run with carry [\".carry\"])" >&2
      return 1
    fi
    OT_DEVICE_CMAKE_DEPS=(-DOT_DLPACK_INCLUDE_DIR="$deps/include" -DOT_CBLAS_INCLUDE_DIR="$deps/include"
                          -DBLAS_openblas_LIBRARY="$deps/lib/libopenblas.so")
    export LD_LIBRARY_PATH="$deps/lib:${LD_LIBRARY_PATH:-}" LIBRARY_PATH="$deps/lib:${LIBRARY_PATH:-}"
    export OT_DEVICE_DLPACK_INCLUDE="$deps/include"
  else
    export OT_DEVICE_DLPACK_INCLUDE=/usr/include
  fi
}

ot_device_build() {
  local dir=$1 targets=$2
  shift 2
  local gen=() t
  command -v ninja >/dev/null && gen=(-G Ninja)
  ot_device_deps || return 1
  mkdir -p "$dir/logs"
  if ! cmake -S . -B "$dir" "${gen[@]}" -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release \
       -DOT_BUILD_TOOLS=OFF "${OT_DEVICE_CMAKE_DEPS[@]}" "$@" >"$dir/logs/cmake.log" 2>&1; then
    tail -40 "$dir/logs/cmake.log"
    return 1
  fi
  local tl=()
  for t in $targets; do tl+=(--target "$t"); done
  if ! cmake --build "$dir" -j "$(nproc)" "${tl[@]}" >"$dir/logs/build.log" 2>&1; then
    grep -E -B2 -A12 'error|Error' "$dir/logs/build.log" | head -80
    return 1
  fi
}
