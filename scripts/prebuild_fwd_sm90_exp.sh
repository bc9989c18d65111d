#!/usr/bin/env bash
# scripts/prebuild_fwd_sm90_exp.sh B [CARRY] -- on the build machine (no GPU): the carried
# binaries of the Hopper forward's experiment A/B, for scripts/device_fwd_variants.sh (its
# CARRY, default .devcarry-fwd90; git-ignored by .gitignore's /.devcarry*/):
#   CARRY/libattention_shim.so  bench/attention_shim.c linked against B's library with
#                               src/cuda/sm90/attention_fwd_sm90.cu recompiled with
#                               -DOT_ATTN_SM90_EXPERIMENTS in place of its member
#   CARRY/test_ops.xz           B's tests/test_ops relinked against that library
#   CARRY/deps.tar.gz           OpenBLAS + Fortran runtime (.carry/deps/lib)
# B: a build directory configured with -DOT_CUDA_ARCHS=90a and up to date
#   (cmake --build B --target ops_transformer_static test_ops); only read: the experiment
#   library, object and test_ops go to EXP (default /tmp/ot_fwdx_exp).
# Prints ptxas -v of the recompiled file's kernels (registers, spills) and fails on a C75xx
# warning (wgmma serialized; scripts/sm90_exp_build.sh). DLPACK_INC: dlpack's include root
# (default /usr/include).
set -euo pipefail
B=$(cd "${1:?usage: $0 BUILD_DIR [CARRY]}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=$(mkdir -p "${2:-.devcarry-fwd90}" && cd "${2:-.devcarry-fwd90}" && pwd)
EXP=${EXP:-/tmp/ot_fwdx_exp}
# shellcheck source=scripts/sm90_exp_build.sh
. scripts/sm90_exp_build.sh
sm90_exp_build "$B" attention_fwd_sm90 "$EXP"
grep -A3 "Compiling entry function '.*attn_fwd_sm90_kernel" "$EXP/ptxas.log" |
  grep -E "spill|registers" | sort | uniq -c | sort -rn | head -8
sm90_exp_shim "$EXP/libops_transformer.a" "$CARRY/libattention_shim.so"
xz -6 -c "$EXP/tests/test_ops" >"$CARRY/test_ops.xz"
[ -f "$CARRY/deps.tar.gz" ] || tar czf "$CARRY/deps.tar.gz" -C .carry/deps/lib .
git rev-parse HEAD >"$CARRY/commit.txt" 2>/dev/null || true
ls -la "$CARRY"
du -sh "$CARRY"
