#!/usr/bin/env bash
# scripts/pack_ks.sh -- make .devcarry-ks/ks.tar.xz (git-ignored), the pack that
# scripts/device_ksplit.sh and device_split_quick.sh carry to the GPU machine, here in one
# command (a new checkout has neither the pack nor its build; ~3-5 minutes on 2 cores):
#   test_ops               tests of an sm_90a Release build (build-s/, OT_BUILD_TOOLS=ON)
#   libattention_shim.so   bench/attention_shim.c linked against that build's static library
#   libattention_shim_trace.so   the same with the Hopper forward's object recompiled with
#                          -DOT_FWD_TRACE (per-tile %globaltimer stamps; read by
#                          bench/attn_fwd_trace.py --shim /tmp/ks/libattention_shim_trace.so)
#   lib/                   OpenBLAS and its runtime libraries (scripts/carry_deps.sh)
# TRACE=0 leaves the trace shim out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=setup.sh
source scripts/setup.sh >/dev/null
bash scripts/carry_deps.sh >/dev/null
B=build-s
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a \
  -DOT_BUILD_TOOLS=ON >/dev/null
cmake --build $B --target test_ops -j"$(nproc)" >/dev/null
P=$(mktemp -d)
mkdir -p "$P/lib" .devcarry-ks
link_shim() {   # link_shim LIBRARY.a OUT.so
  cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I/usr/include \
    -I/usr/local/cuda/include "$1" -L/usr/local/cuda/lib64 -lcudart -lcublasLt -lopenblas \
    -fopenmp -lm -lstdc++ -o "$2"
}
link_shim $B/libops_transformer.a "$P/libattention_shim.so"
files=(test_ops libattention_shim.so lib)
if [ "${TRACE:-1}" = 1 ]; then
  # the library's own compile line for the object, plus -DOT_FWD_TRACE; swapped into a copy
  # of the archive under the member name it has there
  F=$B/CMakeFiles/ot_objects.dir/flags.make
  defs=$(sed -n 's/^CUDA_DEFINES = //p' $F)
  flags=$(sed -n 's/^CUDA_FLAGS = //p' $F)
  mkdir -p "$P/tr"
  # shellcheck disable=SC2086
  (cd $B && nvcc $defs -DOT_FWD_TRACE --options-file CMakeFiles/ot_objects.dir/includes_CUDA.rsp \
    $flags -c ../src/cuda/sm90/attention_fwd_sm90.cu -o "$P/tr/attention_fwd_sm90.cu.o")
  cp $B/libops_transformer.a "$P/tr/libops_transformer.a"
  (cd "$P/tr" && ar r libops_transformer.a attention_fwd_sm90.cu.o)
  link_shim "$P/tr/libops_transformer.a" "$P/libattention_shim_trace.so"
  files+=(libattention_shim_trace.so)
fi
cp $B/tests/test_ops "$P/"
cp .carry/deps/lib/{libopenblas.so.0,libgfortran.so.5,libquadmath.so.0} "$P/lib/"
tar cJf .devcarry-ks/ks.tar.xz -C "$P" "${files[@]}"
rm -rf "$P"
echo ".devcarry-ks/ks.tar.xz: $(du -h .devcarry-ks/ks.tar.xz | cut -f1) ($(git rev-parse --short HEAD)$(git diff --quiet || echo ', uncommitted changes'))"
