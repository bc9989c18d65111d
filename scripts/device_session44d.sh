#!/usr/bin/env bash
# scripts/device_session44d.sh COMMIT -- the shortest form of device_session44.sh for a call of
# <= 220 s (carry [".devcarry-ks", ".devcarry-engine"]): the append's CUDA cases and a memcheck
# of its warp kernel, the engine's prefill A/B (ot_rope_kv_append, on its warp kernel) with
# timelines.
set -u
COMMIT=${1:-unknown}
cd "$(dirname "$0")/.."
mkdir -p /tmp/ks "$OUT" && tar xJf .devcarry-ks/ks.tar.xz -C /tmp/ks || exit 1
export LD_LIBRARY_PATH=/tmp/ks/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
T=/tmp/ks/test_ops
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 30 $T --backend cuda --suite memory --filter "kv append" >"$OUT/append.log" 2>&1
echo "kv append rc=$? $(tail -1 "$OUT/append.log")"; grep -A3 "^FAIL" "$OUT/append.log" | head
timeout 30 compute-sanitizer --tool memcheck $T --backend cuda --suite memory \
  --filter "(warp kernel)" >"$OUT/mem_warp.log" 2>&1
echo "memcheck warp rc=$? $(grep 'ERROR SUMMARY' "$OUT/mem_warp.log") $(tail -1 "$OUT/mem_warp.log")"
ENGINE_BENCH_FIRST=1 ENGINE_SHAPES=llama3-8b ENGINE_OFFLOAD_BIG=0 ENGINE_LINEAR_TESTS=0 \
ENGINE_LINEAR_BENCH=0 ENGINE_PYTESTS=0 ENGINE_MEMCHECK_DECODE=0 ENGINE_SMI=0 ENGINE_SKIP_CHECK=1 \
ENGINE_BENCH_TIMEOUT=135 ENGINE_BENCH_ARGS="--batches 1 --no-ttft-diag \
--decode-variants= --prefill-variants rope_kv_fused" timeout 150 \
  bash scripts/device_engine.sh run "$COMMIT" >"$OUT/engine_run.log" 2>&1
echo "engine rc=$?"; grep -iE "ttft|FAIL|tok/s" "$OUT/engine_run.log" | cut -c1-300 | tail -8
grep -E "^timeline prefill" "$OUT/engine_run.log" | python3 -c '
import sys, json
for line in sys.stdin:
    name, js = line.split(": ", 1)
    try: d = json.loads(js)
    except Exception: print(name, js[:200]); continue
    rows = [(r["kernel"][:40], r["us"]) for r in d.get("layer", [])
            if any(w in r["kernel"].lower() for w in ("rope", "append"))]
    print(name, "span_ms", d.get("span_ms"), "layer_us", d.get("layer_us"), rows)
'
