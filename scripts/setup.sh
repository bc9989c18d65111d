#!/usr/bin/env bash
# scripts/setup.sh -- install what building and testing ops-transformer needs.
#
# Idempotent and quick when everything is already there. Run it, or source it to also
# get PATH / OT_NVCC set in the calling shell (scripts/test.sh and scripts/run.sh do).
#
#   Debian packages (apt-get, only those missing): a C toolchain, CMake, pkg-config,
#   DLPack headers, OpenBLAS, OpenMP, python3-venv.
#   CUDA: nvcc from PATH, else /usr/local/cuda/bin, else $CUDA_HOME/bin, else (when
#   OT_SETUP_PIP_CUDA=1; =force skips the search) from PyPI into a private venv. Exports OT_NVCC (empty when no
#   CUDA compiler was found) and, for the PyPI fallback, CUDAToolkit_ROOT.

ot_setup_main() {
  local pkgs=(build-essential cmake pkg-config libdlpack-dev libopenblas-dev libopenblas-openmp-dev libomp-dev libcjson-dev
              python3-venv git)
  local missing=() p
  if command -v dpkg >/dev/null 2>&1; then
    for p in "${pkgs[@]}"; do
      dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
  fi
  if ((${#missing[@]})); then
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
      if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "setup: missing packages ${missing[*]} and not root (no sudo)" >&2
        return 1
      fi
    fi
    echo "setup: installing ${missing[*]}"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null || return 1
  fi

  # The CUDA compiler.
  OT_NVCC=""
  if [ "${OT_SETUP_PIP_CUDA:-0}" = force ]; then
    :  # skip the search: test the PyPI fallback
  elif command -v nvcc >/dev/null 2>&1; then
    OT_NVCC=$(command -v nvcc)
  else
    local d
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 \
             /usr/local/cuda-12; do
      if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then
        export PATH="$d/bin:$PATH"
        OT_NVCC="$d/bin/nvcc"
        break
      fi
    done
  fi
  if [ -z "$OT_NVCC" ] && [ "${OT_SETUP_PIP_CUDA:-0}" != 0 ]; then
    ot_setup_pip_cuda || return 1
  fi
  export OT_NVCC
  # OpenBLAS picks its kernels from the CPU model; under some hypervisors the model is
  # hidden and it falls back to generic SSE3 kernels ("Prescott"), 4-8x slower. Name the
  # kernel family from the CPU's flags unless the caller chose one.
  if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
  fi
  # A GPU to run on (the main job builds the CUDA backend only when one is visible).
  OT_GPU=""
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then OT_GPU=1; fi
  export OT_GPU
  if [ -n "$OT_NVCC" ]; then
    echo "setup: ok (nvcc: $OT_NVCC, $("$OT_NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
  else
    echo "setup: ok (no CUDA compiler found: the CUDA backend cannot be built;" \
         "install the CUDA toolkit, e.g. Debian's nvidia-cuda-toolkit or NVIDIA's" \
         "cuda-toolkit package, or re-run with OT_SETUP_PIP_CUDA=1 to get nvcc from PyPI)"
  fi
}

# nvcc, headers, cudart and cuBLASLt from PyPI (NVIDIA's CUDA 13 wheels, which all install
# into one toolkit-shaped tree, site-packages/nvidia/cu13/{bin,include,lib}) into a venv
# outside the repository. CMake's CUDA language and FindCUDAToolkit accept that tree once
# it has lib64 and the unversioned .so link names.
ot_setup_pip_cuda() {
  local venv="${OT_CUDA_VENV:-$HOME/.cache/ops_transformer/cuda-venv}"
  local root
  root=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -1)
  if [ -z "$root" ] || [ ! -x "$root/bin/nvcc" ]; then
    echo "setup: installing the CUDA compiler from PyPI into $venv"
    python3 -m venv "$venv" || return 1
    "$venv/bin/pip" install -q nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cublas \
      nvidia-cuda-cccl nvidia-nvvm || return 1
    root=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 | head -1)
    [ -x "$root/bin/nvcc" ] || { echo "setup: no nvcc in $root/bin" >&2; return 1; }
  fi
  [ -e "$root/lib64" ] || ln -s lib "$root/lib64"
  local f base
  for f in "$root"/lib/lib*.so.*; do
    [ -e "$f" ] || continue
    base="${f##*/}"; base="${base%%.so.*}.so"
    [ -e "$root/lib/$base" ] || ln -s "${f##*/}" "$root/lib/$base"
  done
  export PATH="$root/bin:$PATH" CUDAToolkit_ROOT="$root" CUDACXX="$root/bin/nvcc"
  OT_NVCC="$root/bin/nvcc"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  ot_setup_main
  exit $?
else
  ot_setup_main
fi
