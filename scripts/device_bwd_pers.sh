#!/usr/bin/env bash
# scripts/device_bwd_pers.sh [COMMIT] -- on the device (`run`, carry [".devcarry-verify",
# ".devcarry-shim"]): the Hopper backward's persistent walk (kXPers, OT_ATTN_BWD_SM90_PERS)
# where it is not the default -- head dims 128 and 256 -- checked and timed, with the SM
# clock and board power sampled per entry (bench_attention.py --clocks): docs/ATTENTION.md
# "A persistent grid" asks whether D 128's loss under the walk is the power limit.
#
# Here, before the call (no GPU):
#   cmake --build build-verify --target ops_transformer_static test_ops ops_transformer
#   bash scripts/device_verify.sh --pack build-verify          # .devcarry-verify/verify.tar.xz
#   cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I/usr/local/cuda/include \
#      build-verify/libops_transformer.a -L/usr/local/cuda/lib64 -L.carry/deps/lib -lcudart \
#      -lcublasLt -lopenblas -fopenmp -lm -lstdc++ -o .devcarry-shim/libattention_shim.so
# Steps (~4 min): a 30 s smoke of one walk case (a hang ends the call there); the "pers" test
# cases (D 64 / 128 / 256 under both walks, 3-CTA grids); compute-sanitizer memcheck /
# racecheck / synccheck on "pers3 bwd256 S129" and "pers3s bwd256 causal Sq>Sk"; then
# fwd+bwd at D 128 and 256, S 1k / 4k, the static and atomic walks against one CTA a unit,
# ROUNDS (6) balanced rounds. Environment: SHAPES, AB, ROUNDS, BENCH_LIMIT (s, 300).
# Logs and the JSON under $OUT.
set -uo pipefail
source "$(dirname "$0")/device_verify_env.sh"
ot_verify_env bwd_pers "${1:-}"
stamp smoke
timeout 30 $T --filter "pers3 bwd256 S129" -v >"$OUT/smoke.log" 2>&1
rc=$?; tail -2 "$OUT/smoke.log"
[ $rc -eq 0 ] || { echo "smoke rc $rc: stopping"; exit 1; }
stamp "tests: pers"
timeout 180 $T --filter pers -v >"$OUT/tests.log" 2>&1; echo "rc $?" >>"$OUT/tests.log"
grep -E "^FAIL|passed,|^rc" "$OUT/tests.log" | tail -4
stamp sanitizers
ot_sanitize 120 "pers3 bwd256 S129;pers3s bwd256 causal Sq>Sk"
stamp bench
timeout "${BENCH_LIMIT:-300}" python3 bench/bench_attention.py --shim "$SHIM" --bench --no-variants --clocks \
  --rounds "${ROUNDS:-6}" --shapes "${SHAPES:-32:16:16:1024:128,8:16:16:4096:128,32:8:8:1024:256,8:8:8:4096:256}" \
  --ab "${AB:-st=OT_ATTN_BWD_SM90_PERS:s,_fb:1;dyn=OT_ATTN_BWD_SM90_PERS:1,_fb:1}" \
  --commit "$C" --json "$OUT/bwd_pers.json" >"$OUT/bench.log" 2>&1
echo "bench rc $?"
grep -E "fwd_bwd|ab |clocks|rror" "$OUT/bench.log" | cut -c1-200
(cd "$OUT" && tar czf logs.tar.gz san_*.log && rm -f san_*.log)
stamp done
