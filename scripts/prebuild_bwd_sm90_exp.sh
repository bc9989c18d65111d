#!/usr/bin/env bash
# scripts/prebuild_bwd_sm90_exp.sh B [CARRY] -- on the build machine (no GPU): the carried
# binaries of the Hopper backward's experiment A/B, for scripts/device_attention_bwd_sm90.sh
# with PRE=CARRY (default .bwdxcarry; git-ignored by .gitignore's /.bwdxcarry*/):
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
# shellcheck source=scripts/sm90_exp_build.sh
. scripts/sm90_exp_build.sh
sm90_exp_build "$B" attention_bwd_sm90 "$EXP"   # the object, the library, test_ops
grep -A3 "Compiling entry function '.*attn_bwd_sm90_kernel" "$EXP/ptxas.log" |
  grep -E "Compiling|spill|registers" | sed -E 's/.*(attn_bwd_sm90_kernelI[^E]*E[^E]*E[^E]*E).*/\1/'
shim() { sm90_exp_shim "$@"; }   # LIB OUT
mkdir -p "$EXP/base"
shim "$EXP/libops_transformer.a" "$EXP/libattention_shim.so"
shim "$B/libops_transformer.a" "$EXP/base/libattention_shim.so"

# the carry
tar cJf "$CARRY/bin.tar.xz" -C "$EXP" tests/test_ops libattention_shim.so
tar cJf "$CARRY/base.tar.xz" -C "$EXP/base" libattention_shim.so -C "$B" tests/test_ops
[ -f "$CARRY/deps.tar.xz" ] || tar cJf "$CARRY/deps.tar.xz" -C .carry/deps/lib .
ls -la "$CARRY"
du -sh "$CARRY"
