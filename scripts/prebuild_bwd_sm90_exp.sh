#!/usr/bin/env bash
# scripts/prebuild_bwd_sm90_exp.sh B [CARRY] -- on the build machine (no GPU): the carried
# binaries of the Hopper backward's experiment A/B, for scripts/device_attention_bwd_sm90.sh
# with PRE=CARRY (default .bwdxcarry; add it to .git/info/exclude):
#   CARRY/base.tar.xz  libattention_shim.so of B's library as built (the default kernels) and
#                      B's tests/test_ops (device_attention_bwd_sm90.sh SUITE_BUILD=base: the
#                      suite on the default build)
#   CARRY/bin.tar.xz   tests/test_ops + libattention_shim.so of the experiment build: B's
#                      library with src/cuda/sm90/attention_bwd_sm90.cu recompiled with
#                      -DOT_ATTN_SM90_EXPERIMENTS (the kernels of the experiment bits: since
#                      ff3dd11 the other dQ form per head dim, OT_ATTN_BWD_SM90_DQ=red at
#                      D 64, =stage at D 128) in place of its member
#   CARRY/deps.tar.xz  OpenBLAS + Fortran runtime (.carry/deps/lib)
# B: a build directory configured with -DOT_CUDA_ARCHS=90a and up to date
#   (cmake --build B --target ops_transformer_static test_ops); only read: the experiment
#   library, object and test_ops go to EXP (default /tmp/ot_bwdx_exp).
# Prints ptxas -v of the recompiled file's main kernels (registers, spills) and fails on a
# C75xx warning (wgmma serialized). DLPACK_INC: dlpack's include root (default /usr/include).
set -euo pipefail
B=$(cd "${1:?usage: $0 BUILD_DIR [CARRY]}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=$(mkdir -p "${2:-.bwdxcarry}" && cd "${2:-.bwdxcarry}" && pwd)
EXP=${EXP:-/tmp/ot_bwdx_exp}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
DLPACK_INC=${DLPACK_INC:-/usr/include}
rm -rf "$EXP" && mkdir -p "$EXP/tests"

# 1. B's own nvcc command for the file, writing EXP's object (no depfile: B stays untouched),
#    plus the experiments macro and the resource report
cmd=$(ninja -C "$B" -t commands ops_transformer_static |
      grep -E 'nvcc .* -c [^ ]*src/cuda/sm90/attention_bwd_sm90\.cu ' | tail -1)
[ -n "$cmd" ] || { echo "no nvcc command for attention_bwd_sm90.cu in $B" >&2; exit 1; }
cmd=$(sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ -o [^ ]+$//' <<<"$cmd")
(cd "$B" && eval "$cmd -DOT_ATTN_SM90_EXPERIMENTS -Xptxas -v -o $EXP/attention_bwd_sm90.cu.o") \
  >"$EXP/ptxas.log" 2>&1 || { cat "$EXP/ptxas.log" >&2; exit 1; }
grep -A3 "Compiling entry function '.*attn_bwd_sm90_kernel" "$EXP/ptxas.log" |
  grep -E "Compiling|spill|registers" | sed -E 's/.*(attn_bwd_sm90_kernelI[^E]*E[^E]*E[^E]*E).*/\1/'
if grep -E "C75[0-9][0-9]" "$EXP/ptxas.log"; then echo "wgmma serialized (C75xx)" >&2; exit 1; fi

# 2. the experiment library: B's archive with that member replaced (same member name)
cp "$B/libops_transformer.a" "$EXP/libops_transformer.a"
ar r "$EXP/libops_transformer.a" "$EXP/attention_bwd_sm90.cu.o"

# 3. test_ops relinked against it (B's link command, library and output redirected)
link=$(ninja -C "$B" -t commands test_ops | tail -1)
link=${link//" libops_transformer.a"/" $EXP/libops_transformer.a"}
link=${link//"-o tests/test_ops"/"-o $EXP/tests/test_ops"}
grep -qF "$EXP/libops_transformer.a" <<<"$link" || { echo "link command not understood" >&2; exit 1; }
(cd "$B" && eval "$link")

# 4. the shims (bench/attention_shim.c, as scripts/device_bench_attention.sh links them)
shim() {   # LIB OUT
  cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I"$DLPACK_INC" \
    -I"$CUDA_HOME/include" "$1" -L"$CUDA_HOME/lib64" -L.carry/deps/lib -lcudart -lcublasLt \
    -lopenblas -fopenmp -lm -lstdc++ -o "$2"
}
mkdir -p "$EXP/base"
shim "$EXP/libops_transformer.a" "$EXP/libattention_shim.so"
shim "$B/libops_transformer.a" "$EXP/base/libattention_shim.so"

# 5. the carry
tar cJf "$CARRY/bin.tar.xz" -C "$EXP" tests/test_ops libattention_shim.so
tar cJf "$CARRY/base.tar.xz" -C "$EXP/base" libattention_shim.so -C "$B" tests/test_ops
[ -f "$CARRY/deps.tar.xz" ] || tar cJf "$CARRY/deps.tar.xz" -C .carry/deps/lib .
ls -la "$CARRY"
du -sh "$CARRY"
