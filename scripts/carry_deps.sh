#!/usr/bin/env bash
# scripts/carry_deps.sh -- fill the git-ignored .carry/ folder that the device scripts carry
# to the lent GPU machine (it reaches no package registry):
#   .carry/deps/include   dlpack/dlpack.h, cblas.h (+ the OpenBLAS headers it includes)
#   .carry/deps/lib       libopenblas.so(.0), libgfortran.so.5, libquadmath.so.0
#   .carry/cjson/{include,lib}   cJSON headers and libcjson.so.1*
# from the Debian packages scripts/setup.sh installs here (libdlpack-dev, libopenblas-dev,
# libcjson-dev). A new checkout has no .carry/: run this once before the first device call
# (scripts/device_build.sh and device_engine.sh's `pack` read it). Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=setup.sh
source scripts/setup.sh >/dev/null
D=.carry/deps
C=.carry/cjson
mkdir -p "$D/include/dlpack" "$D/lib" "$C/include/cjson" "$C/lib"
cp /usr/include/dlpack/dlpack.h "$D/include/dlpack/"
BLAS_SO=$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0)
BLAS_INC=$(dirname "$(find /usr/include -name cblas.h -path '*openblas*' | head -1)")
[ -n "$BLAS_INC" ] || { echo "carry_deps: no OpenBLAS cblas.h under /usr/include" >&2; exit 1; }
cp "$BLAS_INC"/*.h "$D/include/"
cp "$BLAS_SO" "$D/lib/libopenblas.so.0"
ln -sf libopenblas.so.0 "$D/lib/libopenblas.so"
for l in libgfortran.so.5 libquadmath.so.0; do
  cp "$(readlink -f "/lib/x86_64-linux-gnu/$l")" "$D/lib/$l"
done
cp /usr/include/cjson/*.h "$C/include/cjson/"
cp -a /usr/lib/x86_64-linux-gnu/libcjson.so* "$C/lib/"
du -sh "$D" "$C"
