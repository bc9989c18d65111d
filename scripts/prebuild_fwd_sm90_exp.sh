#!/usr/bin/env bash
# scripts/prebuild_fwd_sm90_exp.sh B [CARRY] -- on the build machine (no GPU): the carried
# binaries of the Hopper forward's experiment A/B, for scripts/device_fwd_variants.sh (its
# CARRY, default .devcarry-fwd90; git-ignored through .git/info/exclude's /.devcarry-*/):
#   CARRY/libattention_shim.so  bench/attention_shim.c linked against B's library with
#                               src/cuda/sm90/attention_fwd_sm90.cu recompiled with
#                               -DOT_ATTN_SM90_EXPERIMENTS in place of its member
#   CARRY/test_ops.xz           B's tests/test_ops relinked against that library
#   CARRY/deps.tar.gz           OpenBLAS + Fortran runtime (.carry/deps/lib)
# B: a build directory configured with -DOT_CUDA_ARCHS=90a and up to date
#   (cmake --build B --target ops_transformer_static test_ops); only read: the experiment
#   library, object and test_ops go to EXP (default /tmp/ot_fwdx_exp).
# Prints ptxas -v of the recompiled file's kernels (registers, spills) and fails on a C75xx
# warning (wgmma serialized). DLPACK_INC: dlpack's include root (default /usr/include).
set -euo pipefail
B=$(cd "${1:?usage: $0 BUILD_DIR [CARRY]}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=$(mkdir -p "${2:-.devcarry-fwd90}" && cd "${2:-.devcarry-fwd90}" && pwd)
EXP=${EXP:-/tmp/ot_fwdx_exp}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
DLPACK_INC=${DLPACK_INC:-/usr/include}
rm -rf "$EXP" && mkdir -p "$EXP/tests"

# 1. B's own nvcc command for the file (no depfile: B stays untouched) + the macro
cmd=$(ninja -C "$B" -t commands ops_transformer_static |
      grep -E 'nvcc .* -c [^ ]*src/cuda/sm90/attention_fwd_sm90\.cu ' | tail -1)
[ -n "$cmd" ] || { echo "no nvcc command for attention_fwd_sm90.cu in $B" >&2; exit 1; }
cmd=$(sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ -o [^ ]+$//' <<<"$cmd")
(cd "$B" && eval "$cmd -DOT_ATTN_SM90_EXPERIMENTS -Xptxas -v -o $EXP/attention_fwd_sm90.cu.o") \
  >"$EXP/ptxas.log" 2>&1 || { cat "$EXP/ptxas.log" >&2; exit 1; }
grep -A3 "Compiling entry function '.*attn_fwd_sm90_kernel" "$EXP/ptxas.log" |
  grep -E "spill|registers" | sort | uniq -c | sort -rn | head -8
if grep -E "C75[0-9][0-9]" "$EXP/ptxas.log"; then echo "wgmma serialized (C75xx)" >&2; exit 1; fi

# 2. the experiment library: B's archive with that member replaced (same member name)
cp "$B/libops_transformer.a" "$EXP/libops_transformer.a"
ar r "$EXP/libops_transformer.a" "$EXP/attention_fwd_sm90.cu.o"

# 3. test_ops relinked against it (B's link command, library and output redirected)
link=$(ninja -C "$B" -t commands test_ops | tail -1)
link=${link//" libops_transformer.a"/" $EXP/libops_transformer.a"}
link=${link//"-o tests/test_ops"/"-o $EXP/tests/test_ops"}
grep -qF "$EXP/libops_transformer.a" <<<"$link" || { echo "link command not understood" >&2; exit 1; }
(cd "$B" && eval "$link")

# 4. the shim and the carry
cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I"$DLPACK_INC" \
  -I"$CUDA_HOME/include" "$EXP/libops_transformer.a" -L"$CUDA_HOME/lib64" -L.carry/deps/lib \
  -lcudart -lcublasLt -lopenblas -fopenmp -lm -lstdc++ -o "$CARRY/libattention_shim.so"
xz -6 -c "$EXP/tests/test_ops" >"$CARRY/test_ops.xz"
[ -f "$CARRY/deps.tar.gz" ] || tar czf "$CARRY/deps.tar.gz" -C .carry/deps/lib .
git rev-parse HEAD >"$CARRY/commit.txt" 2>/dev/null || true
ls -la "$CARRY"
du -sh "$CARRY"
