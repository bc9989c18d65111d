#!/usr/bin/env bash
# scripts/setup.sh -- install what building and testing ops-transformer needs.
#
# Idempotent and quick when everything is already there. Run it, or source it to also
# get PATH / OT_NVCC set in the calling shell (scripts/test.sh and scripts/run.sh do).
#
#   Debian packages (apt-get, only those missing): a C toolchain, CMake, pkg-config,
#   DLPack headers, OpenBLAS, OpenMP, python3-venv.
#   CUDA: nvcc from PATH, else /usr/local/cuda/bin, else $CUDA_HOME/bin, else (when
#   OT_SETUP_PIP_CUDA=1) from PyPI into a private venv. Exports OT_NVCC (empty when no
#   CUDA compiler was found) and, for the PyPI fallback, CUDAToolkit_ROOT.

ot_setup_main() {
  local pkgs=(build-essential cmake pkg-config libdlpack-dev libopenblas-dev libomp-dev
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
  if command -v nvcc >/dev/null 2>&1; then
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
  if [ -z "$OT_NVCC" ] && [ "${OT_SETUP_PIP_CUDA:-0}" = 1 ]; then
    ot_setup_pip_cuda || return 1
  fi
  export OT_NVCC
  if [ -n "$OT_NVCC" ]; then
    echo "setup: ok (nvcc: $OT_NVCC, $("$OT_NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
  else
    echo "setup: ok (no CUDA compiler found: the CUDA backend cannot be built;" \
         "install the CUDA toolkit, e.g. Debian's nvidia-cuda-toolkit or NVIDIA's" \
         "cuda-toolkit package, or re-run with OT_SETUP_PIP_CUDA=1 to get nvcc from PyPI)"
  fi
}

# nvcc, headers, cudart and cuBLASLt from PyPI (CUDA 12 wheels) into a venv outside
# the repository. The wheels lay the toolkit out in several folders; they are linked
# into one tree that looks like /usr/local/cuda so CMake's CUDA language and
# FindCUDAToolkit accept it.
ot_setup_pip_cuda() {
  local venv="${OT_CUDA_VENV:-$HOME/.cache/ops_transformer/cuda-venv}"
  local root="$venv/cuda"
  if [ ! -x "$root/bin/nvcc" ]; then
    echo "setup: installing the CUDA compiler from PyPI into $venv"
    python3 -m venv "$venv" || return 1
    "$venv/bin/pip" install -q nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12 \
      nvidia-cublas-cu12 nvidia-cuda-cccl-cu12 || return 1
    local nv
    nv=$("$venv/bin/python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0] + "/x"))') || return 1
    rm -rf "$root" && mkdir -p "$root/include" "$root/lib64"
    ln -s "$nv/cuda_nvcc/bin" "$root/bin"
    ln -s "$nv/cuda_nvcc/nvvm" "$root/nvvm"
    local sub f
    for sub in cuda_nvcc cuda_runtime cublas cuda_cccl; do
      for f in "$nv/$sub"/include/*; do [ -e "$f" ] && ln -sf "$f" "$root/include/"; done
      for f in "$nv/$sub"/lib/*; do [ -e "$f" ] && ln -sf "$f" "$root/lib64/"; done
    done
    # The wheels ship only versioned shared objects: add the link names.
    for f in "$root"/lib64/lib*.so.*; do
      local base="${f##*/}"; base="${base%%.so.*}.so"
      [ -e "$root/lib64/$base" ] || ln -s "$f" "$root/lib64/$base"
    done
    ln -s lib64 "$root/lib"
  fi
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
