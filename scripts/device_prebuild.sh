#!/usr/bin/env bash
# scripts/device_prebuild.sh BUILD_DIR [CARRY_DIR] -- build on this machine (no GPU)
# what scripts/device_test_cuda.sh runs on the lent GPU machine, and pack it for the
# device tool's `carry`, so that the device's time is not spent compiling.
#
#   BUILD_DIR  configured with -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a (Release); the targets
#              ops_transformer_static and test_ops are built in it here
#   CARRY_DIR  default .devcarry (git-ignored by .gitignore's /.devcarry*/: other names are
#              refused, so that a pack is never committed); gets
#              prebuilt.tar.gz (tests/test_ops, libfused_ops_shim.so) and deps.tar.gz
#              (the runtime libraries of .carry/deps/lib: OpenBLAS and its Fortran
#              runtime, 12 MB compressed against 39 MB as they are)
#
# Then: run `OT_PREBUILT=.devcarry bash scripts/device_test_cuda.sh ...` with
# carry [".devcarry"] (not .carry). The binaries need a glibc no newer than the
# device's and the same CUDA major version (13 here and there).
set -euo pipefail
BUILD=${1:?usage: device_prebuild.sh BUILD_DIR [CARRY_DIR]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=${2:-$ROOT/.devcarry}
cd "$ROOT"
git check-ignore -q "$CARRY/" || { echo "$0: $CARRY is not git-ignored (.gitignore: /.devcarry*/): name the pack .devcarry-*" >&2; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target ops_transformer_static test_ops
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
DLPACK_INC=/usr/include
[ -f /usr/include/dlpack/dlpack.h ] || DLPACK_INC=$ROOT/.carry/deps/include
mkdir -p "$CARRY/stage/tests"
cc -O2 -shared -fPIC bench/fused_ops_shim.c -Iinclude -Isrc -I"$DLPACK_INC" -I"$CUDA_HOME/include" \
  "$BUILD/libops_transformer.a" -L"$CUDA_HOME/lib64" -lcudart -lcublasLt -lopenblas -fopenmp -lm \
  -lstdc++ -o "$CARRY/stage/libfused_ops_shim.so"
cp "$BUILD/tests/test_ops" "$CARRY/stage/tests/test_ops"
tar czf "$CARRY/prebuilt.tar.gz" -C "$CARRY/stage" tests/test_ops libfused_ops_shim.so
tar czf "$CARRY/deps.tar.gz" -C "$ROOT/.carry/deps/lib" libopenblas.so.0 libopenblas.so \
  libgfortran.so.5 libquadmath.so.0
rm -rf "$CARRY/stage"
git -C "$ROOT" rev-parse HEAD >"$CARRY/commit.txt" 2>/dev/null || true
ls -la "$CARRY"
