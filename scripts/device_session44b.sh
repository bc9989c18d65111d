#!/usr/bin/env bash
# scripts/device_session44b.sh COMMIT -- the second call of session 44 (carry [".devcarry-ks"],
# scripts/pack_ks.sh): the second paired A/B of kFlQpf at the D256 shapes (a default needs two
# calls' >= 1.02x), then the whole CUDA attention suite of test_ops on the current build
# (TEST_TIMEOUT, default 380 s; what ran is in $OUT/attn_suite.log if it is cut). ~8 min.
set -u
COMMIT=${1:-unknown}
cd "$(dirname "$0")/.."
mkdir -p /tmp/ks "$OUT" && tar xJf .devcarry-ks/ks.tar.xz -C /tmp/ks || exit 1
export LD_LIBRARY_PATH=/tmp/ks/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
A="--fwd-only --no-variants --clocks --rounds 2 --shapes 32:8:8:1024:256,8:8:8:4096:256,16:16:16:2048:256"
AB="qp=OT_ATTN_SM90_QPF:1,_full_only:1"
# shellcheck disable=SC2086
timeout 90 python3 bench/bench_attention.py --shim /tmp/ks/libattention_shim.so --bench $A \
  --ab "$AB" --json "$OUT/attention_qpf_ab2.json" --commit "$COMMIT" \
  --command "scripts/device_session44b.sh $COMMIT: bench_attention.py --bench $A --ab '$AB'" \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^attention_fwd|^  ab" "$OUT/bench.log" | cut -c1-150
timeout "${TEST_TIMEOUT:-380}" stdbuf -oL /tmp/ks/test_ops --backend cuda --suite attention \
  --filter cuda >"$OUT/attn_suite.log" 2>&1
echo "attention suite rc=$? $(tail -1 "$OUT/attn_suite.log")"; grep -E "^cuda" "$OUT/attn_suite.log" | tail -3
grep -A3 "^FAIL" "$OUT/attn_suite.log" | head -20
