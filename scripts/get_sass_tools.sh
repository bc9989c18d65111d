#!/usr/bin/env bash
# scripts/get_sass_tools.sh -- cuobjdump and nvdisasm on this machine (the CUDA toolkit here
# has nvcc and ptxas but not them), from PyPI's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
# wheels, unpacked into the git-ignored .carry/sass-tools/. Prints the bin folder; then e.g.
#   $(bash scripts/get_sass_tools.sh)/cuobjdump -sass -fun SYMBOL obj.o
# (an object compiled with the build's own command: `ninja -t commands TARGET.o` in the build
# folder, its -o pointed elsewhere). Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
D=.carry/sass-tools
if [ ! -x "$D/nvidia/cu13/bin/cuobjdump" ] || [ ! -x "$D/nvidia/cu13/bin/nvdisasm" ]; then
  mkdir -p "$D/whl"
  python3 -m pip download -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$D/whl" >&2
  for w in "$D"/whl/*.whl; do python3 -m zipfile -e "$w" "$D/"; done
  chmod +x "$D"/nvidia/cu*/bin/*
fi
echo "$PWD/$(dirname "$(ls "$D"/nvidia/cu*/bin/cuobjdump | head -1)")"
