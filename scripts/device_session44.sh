#!/usr/bin/env bash
# scripts/device_session44.sh COMMIT -- one device call (carry [".devcarry-ks",
# ".devcarry-engine"], made by scripts/pack_ks.sh and `ENGINE_PACK_TESTS=0 bash
# scripts/device_engine.sh pack build-s`), in parts, most important first (what is left under
# $OUT comes back if the call is cut):
#   append   the append's CUDA cases (its warp kernel forced and by default, k_out)
#   memwarp  memcheck of the warp kernel's cases
#   engine   the engine's one-prompt TTFT alternated with each of ENGINE_VARIANTS (default
#            rope_kv_split,rope_kv_fused_vec,fused_head) and the prefill timelines under each
#   memkout  memcheck of ot_rope_kv_append's k_out cases
#   qpf      kFlQpf's cases
#   bench    the Hopper forward's A/B (kFlKsplit off, kFlSplit, kFlQpf) with clocks
#   trace    the forward's per-tile trace
#   suite    (not by default) the whole CUDA attention suite of test_ops (TEST_TIMEOUT, 380 s)
# PARTS (default: all but suite, ~6 min): e.g. PARTS="append memwarp engine" for a short call;
# BENCH_SHAPES, BENCH_AB: the bench part's shapes and A/B variants (defaults below);
# ENGINE_DECODE_VARIANTS / ENGINE_TIMELINE_VARIANTS: bench_engine.py's decode variants (step
# times alternated with the default) and decode timelines under a variant (default none).
set -u
COMMIT=${1:-unknown}
PARTS=${PARTS:-append memwarp engine memkout qpf bench trace}
VARIANTS=${ENGINE_VARIANTS:-rope_kv_split,rope_kv_fused_vec,fused_head}
cd "$(dirname "$0")/.."
mkdir -p /tmp/ks "$OUT" && tar xJf .devcarry-ks/ks.tar.xz -C /tmp/ks || exit 1
export LD_LIBRARY_PATH=/tmp/ks/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
T=/tmp/ks/test_ops
on() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
if on append; then
  timeout 40 $T --backend cuda --suite memory --filter "kv append" >"$OUT/append.log" 2>&1
  echo "kv append rc=$? $(tail -1 "$OUT/append.log")"; grep -A3 "^FAIL" "$OUT/append.log" | head
  timeout 20 $T --backend cuda --suite memory --filter "bad arg" 2>&1 | tail -1
fi
if on memwarp; then
  timeout 40 compute-sanitizer --tool memcheck $T --backend cuda --suite memory \
    --filter "(warp kernel)" >"$OUT/mem_warp.log" 2>&1
  echo "memcheck warp rc=$? $(grep 'ERROR SUMMARY' "$OUT/mem_warp.log") $(tail -1 "$OUT/mem_warp.log")"
fi
if on engine; then
  ENGINE_BENCH_FIRST=1 ENGINE_SHAPES=llama3-8b ENGINE_OFFLOAD_BIG=0 ENGINE_LINEAR_TESTS=0 \
  ENGINE_LINEAR_BENCH=0 ENGINE_PYTESTS=0 ENGINE_MEMCHECK_DECODE=0 ENGINE_SMI=0 ENGINE_SKIP_CHECK=1 \
  ENGINE_BENCH_TIMEOUT=140 ENGINE_BENCH_ARGS="--batches 1 --no-ttft-diag \
--decode-variants=${ENGINE_DECODE_VARIANTS:-} --timeline-variants=${ENGINE_TIMELINE_VARIANTS:-} \
--prefill-variants $VARIANTS" timeout 160 bash scripts/device_engine.sh run "$COMMIT" \
    >"$OUT/engine_run.log" 2>&1
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
fi
if on memkout; then
  timeout 60 compute-sanitizer --tool memcheck $T --backend cuda --suite memory --filter "k_out" \
    >"$OUT/mem_kout.log" 2>&1
  echo "memcheck k_out rc=$? $(grep 'ERROR SUMMARY' "$OUT/mem_kout.log")"
fi
if on qpf; then
  timeout 40 stdbuf -oL $T --backend cuda --suite attention --filter "hopper-only qpf" \
    >"$OUT/cases_qpf.log" 2>&1
  echo "qpf cases rc=$? $(tail -1 "$OUT/cases_qpf.log")"
fi
if on bench; then
  A="--fwd-only --no-variants --clocks --rounds 2 --shapes ${BENCH_SHAPES:-32:32:32:1024:64,32:8:8:1024:256,32:16:16:1024:128,8:8:8:4096:256}"
  AB=${BENCH_AB:-"ks0=OT_ATTN_SM90_KSPLIT:0,_full_only:1;sp=OT_ATTN_SM90_SPLIT:1,_full_only:1;qp=OT_ATTN_SM90_QPF:1,_full_only:1"}
  # shellcheck disable=SC2086
  timeout 110 python3 bench/bench_attention.py --shim /tmp/ks/libattention_shim.so --bench $A \
    --ab "$AB" --json "$OUT/attention_qpf_ab.json" --commit "$COMMIT" \
    --command "scripts/device_session44.sh $COMMIT: bench_attention.py --bench $A --ab '$AB'" \
    >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -E "^attention_fwd|^  ab" "$OUT/bench.log" | cut -c1-150
fi
if on trace; then
  timeout 80 python3 bench/attn_fwd_trace.py --shim /tmp/ks/libattention_shim_trace.so \
    --shapes 32:8:8:1024:256,8:8:8:4096:256,32:16:16:1024:128 \
    --variants "qp=OT_ATTN_SM90_QPF:1" --json "$OUT/attn_fwd_trace.json" >"$OUT/trace.log" 2>&1
  echo "trace rc=$?"; cut -c1-220 "$OUT/trace.log" | tail -10
fi
if on suite; then
  timeout "${TEST_TIMEOUT:-380}" stdbuf -oL $T --backend cuda --suite attention --filter cuda \
    >"$OUT/attn_suite.log" 2>&1
  echo "attention suite rc=$? $(tail -1 "$OUT/attn_suite.log")"
  grep -A3 "^FAIL" "$OUT/attn_suite.log" | head -20
fi
