#!/usr/bin/env bash
# scripts/prebuild_norm_ab.sh BUILD_DIR CARRY_DIR [NAME=OBJ[,OBJ...] ...] -- pack for
# scripts/device_fused_round.sh (OT_PREBUILT=CARRY_DIR; prebuilt.tar.xz) the build's tests/test_ops and fused-ops
# shim ("ours") and, per NAME, a shim libfused_ops_shim_NAME.so linked from a copy of the build's
# archive whose members are replaced by the objects OBJ (each named as its member, e.g.
# /tmp/ln0/layernorm.cu.o; compile them with the build's command and e.g.
# a candidate's -D switch). An A/B of kernels without run-time switches in the library:
#   OT_AB="NAME=libfused_ops_shim_NAME.so ..." OT_PREBUILT=CARRY_DIR bash scripts/device_fused_round.sh
# BUILD_DIR: configured with -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a; ops_transformer_static and test_ops
# are built in it first (as scripts/device_prebuild.sh does).
set -euo pipefail
BUILD=${1:?usage: prebuild_norm_ab.sh BUILD_DIR CARRY_DIR [NAME=OBJ[,OBJ...] ...]}
CARRY=${2:?usage: prebuild_norm_ab.sh BUILD_DIR CARRY_DIR [NAME=OBJ[,OBJ...] ...]}
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
cmake --build "$BUILD" -j 2 --target ops_transformer_static test_ops
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
DLPACK_INC=/usr/include
[ -f /usr/include/dlpack/dlpack.h ] || DLPACK_INC=$ROOT/.carry/deps/include
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
shim() { # shim ARCHIVE OUT
  cc -O2 -shared -fPIC bench/fused_ops_shim.c -Iinclude -Isrc -I"$DLPACK_INC" -I"$CUDA_HOME/include" \
    "$1" -L"$CUDA_HOME/lib64" -lcudart -lcublasLt -lopenblas -fopenmp -lm -lstdc++ -o "$2"
}
mkdir -p "$STAGE/tests" "$CARRY"
git check-ignore -q "$CARRY/" || { echo "$0: $CARRY is not git-ignored (.gitignore: /.devcarry*/): name the pack .devcarry-*" >&2; exit 1; }
cp "$BUILD/tests/test_ops" "$STAGE/tests/test_ops"
shim "$BUILD/libops_transformer.a" "$STAGE/libfused_ops_shim.so"
FILES=(tests/test_ops libfused_ops_shim.so)
for spec in "$@"; do
  name=${spec%%=*}
  cp "$BUILD/libops_transformer.a" "$STAGE/lib_$name.a"
  IFS=, read -r -a objs <<<"${spec#*=}"
  for o in "${objs[@]}"; do
    # ar r appends a name the archive lacks: both definitions, the A/B silently of the wrong one
    ar t "$STAGE/lib_$name.a" | grep -xF "$(basename "$o")" >/dev/null ||
      { echo "prebuild_norm_ab.sh: $(basename "$o") is not a member of $BUILD/libops_transformer.a" >&2; exit 1; }
    ar r "$STAGE/lib_$name.a" "$o"
  done
  shim "$STAGE/lib_$name.a" "$STAGE/libfused_ops_shim_$name.so"
  rm "$STAGE/lib_$name.a"
  FILES+=("libfused_ops_shim_$name.so")
done
# one xz stream with a 64 MB dictionary: the shims differ by a few objects, so each after the
# first costs little (7 shims + test_ops: 19 MB, against 86 MB as gzip; carry's limit is 64 MiB)
rm -f "$CARRY/prebuilt.tar.gz" "$CARRY/prebuilt.tar.xz"
tar cf - -C "$STAGE" "${FILES[@]}" | xz -9 -T1 >"$CARRY/prebuilt.tar.xz"
tar czf "$CARRY/deps.tar.gz" -C "$ROOT/.carry/deps/lib" libopenblas.so.0 libopenblas.so \
  libgfortran.so.5 libquadmath.so.0
git -C "$ROOT" rev-parse HEAD >"$CARRY/commit.txt" 2>/dev/null || true
ls -la "$CARRY"
