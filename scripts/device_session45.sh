#!/usr/bin/env bash
# scripts/device_session45.sh DECODE_COMMIT ATT_COMMIT -- one short device call, carry
# [".devcarry-paged", ".devcarry-att"] (51 MB with the tree; .devcarry-ks + .devcarry-paged
# do not fit the 64 MiB): .devcarry-paged from `PACK_NO_BUILD=1 bash scripts/device_decode.sh
# --pack build-verify`; .devcarry-att/att.tar.xz = libattention_shim.so alone, taken from
# scripts/pack_ks.sh's pack (the OpenBLAS it needs comes with .devcarry-paged's deps).
#   1. the 2-warp decode CTAs (OT_PAGED_WARPS=2): the memory suite's "w2 " block, memcheck
#      of its batch-5 decode cases;
#   2. its same-process A/B against the default and an A/A copy (bench_decode.py --ab);
#   3. kFlQpf's A/B (OT_ATTN_SM90_QPF=1) at the short-sequence forward shapes.
set -u
DC=${1:?decode commit}; AC=${2:?attention commit}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
DECODE_MODE=probe MEM=1 MEM_FILTER="w2 " MEM_TIMEOUT=90 SAN_FILTERS="w2 cuda decode B5" \
  NO_RACECHECK=1 bash scripts/device_decode.sh "$DC" 2>&1 | tail -6
ABX="default w2=default@OT_PAGED_KERNEL=split@OT_PAGED_WARPS=2 aa" \
  AB_SHAPES="${AB_SHAPES:-64x1024,32x2048,16x4096,64x2048}" AB_ROUNDS=${AB_ROUNDS:-6} \
  AB_ARGS="--order balanced --warm-ms 100" ABX_TIMEOUT=150 DECODE_MODE=probe \
  bash scripts/device_decode.sh "$DC" 2>&1 | grep -E "^ab B|rc=" | sed -E "s/ TB.s.*plans/ plans/" | cut -c1-400
mkdir -p /tmp/att && tar xJf .devcarry-att/att.tar.xz -C /tmp/att || exit 1
A="--fwd-only --no-variants --clocks --rounds 3 --shapes 32:8:8:1024:256,32:32:32:1024:64,8:8:8:4096:256"
AB="qp=OT_ATTN_SM90_QPF:1,_full_only:1"
# shellcheck disable=SC2086
LD_LIBRARY_PATH=$PWD/.carry/deps/lib:/usr/local/cuda/lib64 timeout 100 python3 bench/bench_attention.py \
  --shim /tmp/att/libattention_shim.so --bench $A --ab "$AB" --json "$OUT/attention_qpf_ab.json" \
  --commit "$AC" --command "scripts/device_session45.sh $DC $AC: bench_attention.py --bench $A --ab '$AB'" \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^attention_fwd|^  ab" "$OUT/bench.log" | cut -c1-160
