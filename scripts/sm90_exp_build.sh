#!/usr/bin/env bash
# scripts/sm90_exp_build.sh -- sourced by scripts/prebuild_{fwd,bwd}_sm90_exp.sh: one Hopper
# attention file of an sm_90a build rebuilt with -DOT_ATTN_SM90_EXPERIMENTS into an
# experiment library and test_ops, leaving the build untouched.
#   sm90_exp_build B NAME EXP   B: the build directory (configured with -DOT_CUDA_ARCHS=90a,
#                               up to date); NAME: attention_fwd_sm90 or attention_bwd_sm90;
#                               EXP: the output directory (emptied)
# Writes EXP/NAME.cu.o, EXP/ptxas.log (-Xptxas -v), EXP/libops_transformer.a (B's archive
# with that member replaced: same member name) and EXP/tests/test_ops (B's link command
# against it); fails on a C75xx warning (wgmma serialized). sm90_exp_shim LIB OUT links
# bench/attention_shim.c against LIB (CUDA_HOME, DLPACK_INC: default from nvcc, /usr/include).
sm90_exp_build() {
  local B=$1 NAME=$2 EXP=$3 cmd link
  rm -rf "$EXP" && mkdir -p "$EXP/tests"
  # B's own nvcc command for the file, writing EXP's object (no depfile: B stays untouched)
  cmd=$(ninja -C "$B" -t commands ops_transformer_static |
        grep -E "nvcc .* -c [^ ]*src/cuda/sm90/$NAME\\.cu " | tail -1)
  [ -n "$cmd" ] || { echo "no nvcc command for $NAME.cu in $B" >&2; return 1; }
  cmd=$(sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ -o [^ ]+$//' <<<"$cmd")
  (cd "$B" && eval "$cmd -DOT_ATTN_SM90_EXPERIMENTS -Xptxas -v -o $EXP/$NAME.cu.o") \
    >"$EXP/ptxas.log" 2>&1 || { cat "$EXP/ptxas.log" >&2; return 1; }
  if grep -E "C75[0-9][0-9]" "$EXP/ptxas.log"; then echo "wgmma serialized (C75xx)" >&2; return 1; fi
  cp "$B/libops_transformer.a" "$EXP/libops_transformer.a"
  ar r "$EXP/libops_transformer.a" "$EXP/$NAME.cu.o"
  link=$(ninja -C "$B" -t commands test_ops | tail -1)
  link=${link//" libops_transformer.a"/" $EXP/libops_transformer.a"}
  link=${link//"-o tests/test_ops"/"-o $EXP/tests/test_ops"}
  grep -qF "$EXP/libops_transformer.a" <<<"$link" || { echo "link command not understood" >&2; return 1; }
  (cd "$B" && eval "$link")
}
sm90_exp_shim() {   # LIB OUT (from the repository root)
  local cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I"${DLPACK_INC:-/usr/include}" \
    -I"$cuda/include" "$1" -L"$cuda/lib64" -L.carry/deps/lib -lcudart -lcublasLt \
    -lopenblas -fopenmp -lm -lstdc++ -o "$2"
}
