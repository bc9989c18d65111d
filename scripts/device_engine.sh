#!/usr/bin/env bash
# scripts/device_engine.sh -- the engine (src/engine) on the lent GPU machine, in one call:
#   1. the library + libot_engine.so + ot-run for sm_90a: unpacked from a prebuilt
#      .devcarry-engine/engine.tar.gz when it is carried (see `pack` below), else built
#      there (Ninja; dlpack / OpenBLAS from .carry/deps through scripts/device_build.sh,
#      cJSON from .carry/cjson)
#   2. ot-run on the GPU (tiny config, batch 4): TTFT, tokens/s, CUDA graph, memory
#   3. bench/bench_engine.py --check: logits and greedy tokens vs HF transformers (bf16)
#   4. --bench (same process) -> $OUT/engine.json (+ engine_table.md), table last
#   5. weight streaming (--offload) of llama3-8b with a device budget of 2/3 of its weights
#      (the model is 1.5x the budget): TTFT, tokens/s, the measured H2D bandwidth, the copy
#      bound and the prefetch distance the rule asks for (ENGINE_OFFLOAD_BIG=0: skip); runs
#      before 3 + 4 (the benchmark may use up the time limit)
#   0. with a pack that has them: test_ops --suite linear on CUDA (the small-M kernel's
#      cases), compute-sanitizer memcheck over its bf16 cases, and
#      bench/engine_linear_bench.c (small-M kernel vs cuBLASLt at the engine's shapes)
#
#   device run:  bash scripts/device_engine.sh run COMMIT [bench args...]
#                (carry [".carry"], or [".devcarry-engine"] with a prebuilt pack)
#   here:        bash scripts/device_engine.sh pack BUILD_DIR
#                BUILD_DIR configured with -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a
#                -DOT_BUILD_TOOLS=ON (Release); builds ot-run + ot_engine_shared there and
#                packs them with their runtime libraries (OpenBLAS, cJSON) so the device's
#                time is not spent compiling (ENGINE_PACK_TESTS=0: without test_ops).
# ENGINE_LINEAR_TESTS=0: skip step 0's tests and memcheck (the pack's test_ops);
# ENGINE_MEMCHECK_DECODE=0: no compute-sanitizer memcheck of ot-run's batch-1 decode (the
# engine's fused kernels, default grid and 3 blocks, the staged o_proj with 12 CTAs, and
# the opt-in rowblock down_proj and rowblock qkv + gate_up, default grid and 3 CTAs, plus a
# racecheck of each with 3 CTAs, and the one-prompt prefill's fused final norm + lm_head
# (OTE_PREFILL_FUSED_HEAD=1); all at once in the background, beside step 2b's pytests, each
# cut at ENGINE_SAN_TIMEOUT s, default 150; ENGINE_SAN_FILTER: only the runs whose
# description matches that extended regex, e.g. 'prefill'); ENGINE_PYTESTS=0: no step 2b
# (ENGINE_PYTEST_FILTER, ENGINE_PYTEST_JOBS (6), ENGINE_PYTEST_TIMEOUT (180 s a process)). Environment: ENGINE_SHAPES (default llama3-8b,llama-13b), ENGINE_BENCH_ARGS (extra
# arguments of bench_engine.py --bench, e.g. --hf-compile), ENGINE_SKIP_CHECK=1,
# ENGINE_BENCH_FIRST=1 (steps 3 + 4 right after step 0, before ot-run's runs and the tests);
# ENGINE_SMI=0 (no nvidia-smi log of clocks / power during the benchmark, $OUT/smi.csv);
# step 5: ENGINE_OFFLOAD_BIG=0 (skip), ENGINE_OFFLOAD_BUDGET (default 0.6667x),
# ENGINE_OFFLOAD_RING (default 2); step 0: ENGINE_TEST_FILTER (default forward),
# ENGINE_MEMCHECK_FILTER (default "bf16 x[1": the bf16 cases whose x has 1.. rows),
# ENGINE_MEMCHECK=0 / ENGINE_LINEAR_BENCH=0 skip the memcheck / the small-M benchmark; time
# limits in seconds: ENGINE_TEST_TIMEOUT, ENGINE_MEMCHECK_TIMEOUT (60), ENGINE_BENCH_TIMEOUT (900).
# ENGINE_CODE_PROBE=1: bench/code_fetch_probe.cu (built here with nvcc) first -- a kernel's
# cold-code cost after an L2-flushing stream -> $OUT/code_fetch_probe.json.
# ENGINE_AO_TRACE=1 (a pack from a build with -DOT_ENGINE_AO_TRACE=ON): the attention +
# o_proj kernel's per-CTA phase stamps (step 1b), ENGINE_AO_TRACE_VARIANTS (e.g.
# default,OTE_ATTN_OPROJ_SPLITS=8).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODE=${1:-run}
shift || true

if [ "$MODE" = pack ]; then
  set -e
  BUILD=${1:?usage: device_engine.sh pack BUILD_DIR}
  CARRY=$ROOT/.devcarry-engine
  git check-ignore -q "$CARRY/" || { echo "$0: $CARRY is not git-ignored (.gitignore: /.devcarry*/): name the pack .devcarry-*" >&2; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" --target ot-run ot_engine_shared
  rm -rf "$CARRY/stage" && mkdir -p "$CARRY/stage/lib"
  cp "$BUILD/tools/ot-run" "$CARRY/stage/"
  # the linear tests and the small-M benchmark (optional: a build with tests)
  if [ "${ENGINE_PACK_TESTS:-1}" = 1 ] && cmake --build "$BUILD" -j "$(nproc)" --target test_ops; then
    cp "$BUILD/tests/test_ops" "$CARRY/stage/"
  fi
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  cc -O2 -std=c11 bench/engine_linear_bench.c -Iinclude -I"$CUDA_HOME/include" -L"$BUILD" \
    -lops_transformer -L"$CUDA_HOME/lib64" -lcudart -o "$CARRY/stage/engine_linear_bench"
  cp -a "$BUILD"/libops_transformer.so* "$BUILD/src/engine/libot_engine.so" "$CARRY/stage/lib/"
  # the attention + o_proj kernel's stamped engine (a build configured with
  # -DOT_ENGINE_AO_TRACE=ON): ENGINE_AO_TRACE=1 runs bench/engine_pa_trace.py on it
  if grep -q "OT_ENGINE_AO_TRACE:BOOL=ON" "$BUILD/CMakeCache.txt"; then
    cmake --build "$BUILD" -j "$(nproc)" --target ot_engine_ao_trace
    cp "$BUILD/src/engine/libot_engine_ao_trace.so" "$CARRY/stage/lib/"
  fi
  cp -a .carry/deps/lib/libopenblas.so.0 .carry/deps/lib/libgfortran.so.5 \
    .carry/deps/lib/libquadmath.so.0 .carry/cjson/lib/libcjson.so.1* "$CARRY/stage/lib/"
  tar czf "$CARRY/engine.tar.gz" -C "$CARRY/stage" .
  rm -rf "$CARRY/stage"
  git rev-parse HEAD >"$CARRY/commit.txt" 2>/dev/null || true
  ls -la "$CARRY"
  exit 0
fi

COMMIT=${1:-unknown}
shift || true
EXTRA=("$@") # (bench_engine.py arguments)
OUTD=${OUT:-$ROOT/out-engine}
mkdir -p "$OUTD"
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0))s] $*"; }
SUMMARY=()

# ---- 3 + 4. correctness vs HF, then the benchmark (one Python process: one torch start);
# at the end, or with ENGINE_BENCH_FIRST=1 right after step 0 (a call cut by its time limit
# then keeps the benchmark rather than the tests) --
bench_step() {
  CMD="bash scripts/device_engine.sh run $COMMIT ${EXTRA[*]}"
  CHECK=(--check)
  [ "${ENGINE_SKIP_CHECK:-0}" = 1 ] && CHECK=()
  export PYTHONUNBUFFERED=1
  # the GPU's clocks, power and throttle reasons every 50 ms while the benchmark runs (lined
  # up with bench_engine.py's marks: the TTFT diagnostics)
  SMI_PID=""
  if [ "${ENGINE_SMI:-1}" = 1 ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
      --format=csv,nounits -lms 50 >"$OUTD/smi.csv" 2>&1 &
    SMI_PID=$!
  fi
  # shellcheck disable=SC2086
  timeout "${ENGINE_BENCH_TIMEOUT:-900}" python3 bench/bench_engine.py "${CHECK[@]}" --bench --shapes "${ENGINE_SHAPES:-llama3-8b,llama-13b}" \
    --json "$OUTD/engine.json" --table "$OUTD/engine_table.md" --commit "$COMMIT" --command "$CMD" \
    ${ENGINE_BENCH_ARGS:-} "${EXTRA[@]}" 2>&1 | tee "$OUTD/bench.txt" |
    grep --line-buffered -vE "Warning|warn\(|forward_call|deprecated|it/s\]|^\|"
  rc=${PIPESTATUS[0]}
  if [ -n "$SMI_PID" ]; then
    kill "$SMI_PID" 2>/dev/null
    date +%s.%N >"$OUTD/smi_end_unix.txt"
  fi
  SUMMARY+=("check vs HF: $(grep -E '^check:' "$OUTD/bench.txt" || echo "none (rc $rc, see bench.txt)")")
  stamp "check + bench done (rc $rc)"
}

# ---- 1. binaries -----------------------------------------------------------------------
BIN=$ROOT/build-dev-engine
PREBUILT=0
if [ -f .devcarry-engine/engine.tar.gz ]; then
  stamp "unpacking the prebuilt engine ($(cat .devcarry-engine/commit.txt 2>/dev/null))"
  mkdir -p "$BIN/pack" && tar xzf .devcarry-engine/engine.tar.gz -C "$BIN/pack"
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  export LD_LIBRARY_PATH="$BIN/pack/lib:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
  OT_RUN=$BIN/pack/ot-run
  export OT_ENGINE_LIB=$BIN/pack/lib/libot_engine.so
  if "$OT_RUN" --help >/dev/null 2>"$OUTD/prebuilt.err"; then
    PREBUILT=1
  else
    stamp "the prebuilt ot-run does not start here ($(head -c 300 "$OUTD/prebuilt.err")): building"
  fi
fi
if [ "$PREBUILT" = 0 ]; then
  stamp "building (sm_90a) into build-dev-engine"
  # shellcheck source=device_build.sh
  source scripts/device_build.sh # ot_device_build: carried dlpack / OpenBLAS, LD paths
  CJ=()
  if [ ! -f /usr/include/cjson/cJSON.h ]; then
    CJ=(-DOT_CJSON_INCLUDE_DIR="$ROOT/.carry/cjson/include"
        -DOT_CJSON_LIBRARY="$ROOT/.carry/cjson/lib/libcjson.so")
    export LD_LIBRARY_PATH="$ROOT/.carry/cjson/lib:${LD_LIBRARY_PATH:-}"
  fi
  # (logs: $BIN/logs; the later -D arguments override ot_device_build's OT_BUILD_TOOLS=OFF)
  ot_device_build "$BIN" "ot-run ot_engine_shared" -DOT_BUILD_TOOLS=ON -DOT_BUILD_TESTS=OFF \
    "${CJ[@]}" || exit 1
  OT_RUN=$BIN/tools/ot-run
  export OT_ENGINE_LIB=$BIN/src/engine/libot_engine.so
fi
stamp "binaries ready"

# ---- 0. the small-M linear kernel: tests, memcheck, benchmark (prebuilt pack only) -------
if [ "$PREBUILT" = 1 ] && [ -x "$BIN/pack/test_ops" ] && [ "${ENGINE_LINEAR_TESTS:-1}" = 1 ]; then
  # line-buffered: a run cut by its time limit keeps the lines of the cases it ran (a cold
  # machine's first CUDA process can take many seconds before its first case)
  LB=()
  command -v stdbuf >/dev/null && LB=(stdbuf -oL)
  timeout "${ENGINE_TEST_TIMEOUT:-60}" "${LB[@]}" "$BIN/pack/test_ops" --backend cuda --suite linear \
    --filter "${ENGINE_TEST_FILTER:-forward}" >"$OUTD/test_linear.log" 2>&1
  trc=$?
  if [ "$trc" = 0 ]; then
    SUMMARY+=("test_ops linear (cuda): $(tail -1 "$OUTD/test_linear.log")")
  elif [ "$trc" = 124 ]; then
    SUMMARY+=("test_ops linear (cuda) NOT FINISHED: cut by ENGINE_TEST_TIMEOUT; last line: $(tail -1 "$OUTD/test_linear.log")")
  else
    SUMMARY+=("test_ops linear (cuda) FAILED (rc $trc): $(grep -m3 -i fail "$OUTD/test_linear.log" | tr '\n' ' ')")
  fi
  if [ "${ENGINE_MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    timeout "${ENGINE_MEMCHECK_TIMEOUT:-60}" compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/pack/test_ops" \
      --backend cuda --suite linear --filter "${ENGINE_MEMCHECK_FILTER:-bf16 x[1}" >"$OUTD/memcheck_linear.log" 2>&1
    SUMMARY+=("memcheck linear bf16 M=1.. (rc $?): $(grep -E 'ERROR SUMMARY' "$OUTD/memcheck_linear.log" | tail -1) $(tail -1 "$OUTD/memcheck_linear.log" | head -c 200)")
  fi
  stamp "linear tests done"
fi
if [ "$PREBUILT" = 1 ] && [ "${ENGINE_LINEAR_BENCH:-1}" = 1 ] && [ -x "$BIN/pack/engine_linear_bench" ]; then
  timeout 60 "$BIN/pack/engine_linear_bench" --json "$OUTD/linear_small_m.json" \
    >"$OUTD/linear_small_m.txt" 2>&1
  SUMMARY+=("small-M linear bench rc $?: $OUTD/linear_small_m.txt")
  cat "$OUTD/linear_small_m.txt"
  stamp "linear bench done"
fi

# ---- 0b. the cold-code probe (ENGINE_CODE_PROBE=1)
if [ "${ENGINE_CODE_PROBE:-0}" = 1 ]; then
  if nvcc -O3 -std=c++17 -arch=sm_90a bench/code_fetch_probe.cu -o "$BIN/code_fetch_probe" \
      >"$OUTD/code_fetch_probe_build.log" 2>&1 &&
      timeout 120 "$BIN/code_fetch_probe" --json "$OUTD/code_fetch_probe.json" --commit "$COMMIT" \
        --command "ENGINE_CODE_PROBE=1 bash scripts/device_engine.sh run $COMMIT" >"$OUTD/code_fetch_probe.txt" 2>&1; then
    SUMMARY+=("code fetch probe: $OUTD/code_fetch_probe.txt")
  else
    SUMMARY+=("code fetch probe FAILED: $(tail -2 "$OUTD/code_fetch_probe_build.log" "$OUTD/code_fetch_probe.txt" 2>/dev/null | tr '\n' ' ')")
  fi
  cat "$OUTD/code_fetch_probe.txt" 2>/dev/null
  stamp "code fetch probe done"
fi

[ "${ENGINE_BENCH_FIRST:-0}" = 1 ] && bench_step

# ---- 1b. the attention + o_proj kernel's phase stamps (ENGINE_AO_TRACE=1; a pack with
# libot_engine_ao_trace.so): bench/engine_pa_trace.py --kernel attn_oproj over
# ENGINE_AO_TRACE_VARIANTS (default "default") -> $OUTD/engine_ao_trace.json
if [ "${ENGINE_AO_TRACE:-0}" = 1 ]; then
  if [ -f "$BIN/pack/lib/libot_engine_ao_trace.so" ]; then
    OT_ENGINE_LIB=$BIN/pack/lib/libot_engine_ao_trace.so timeout 240 python3 bench/engine_pa_trace.py \
      --kernel attn_oproj --variants "${ENGINE_AO_TRACE_VARIANTS:-default}" --json "$OUTD/engine_ao_trace.json" \
      --commit "$COMMIT" --command "ENGINE_AO_TRACE=1 bash scripts/device_engine.sh run $COMMIT" \
      >"$OUTD/engine_ao_trace.txt" 2>&1
    SUMMARY+=("attn_oproj stamps (rc $?): $OUTD/engine_ao_trace.txt")
    cat "$OUTD/engine_ao_trace.txt" | grep -vE "Warning|warn\(" | tail -40
  else
    SUMMARY+=("attn_oproj stamps: the pack has no libot_engine_ao_trace.so")
  fi
  stamp "attn_oproj stamps done"
fi

# ---- 2. ot-run on the GPU ----------------------------------------------------------------
if "$OT_RUN" --config tiny --random-weights --device cuda --dtype bf16 --batch 4 \
    --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 64 --ignore-eos >"$OUTD/ot_run.txt" 2>&1; then
  SUMMARY+=("ot-run cuda: $(grep -E '^decode' "$OUTD/ot_run.txt")")
else
  SUMMARY+=("ot-run cuda FAILED: $(tail -2 "$OUTD/ot_run.txt")")
fi
tail -4 "$OUTD/ot_run.txt"
# weight streaming: the same tokens as with resident weights (same ops, same order)
if OTE_OFFLOAD_RING=2 "$OT_RUN" --config tiny --random-weights --device cuda --dtype bf16 --batch 4 \
    --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 64 --ignore-eos --offload \
    >"$OUTD/ot_run_offload.txt" 2>&1; then
  if diff <(grep '^seq' "$OUTD/ot_run.txt") <(grep '^seq' "$OUTD/ot_run_offload.txt") >/dev/null; then
    SUMMARY+=("offload (tiny, ring 2): tokens equal resident; $(grep -E '^offload' "$OUTD/ot_run_offload.txt")")
  else
    SUMMARY+=("offload (tiny): tokens DIFFER from resident weights")
  fi
else
  SUMMARY+=("offload FAILED: $(tail -2 "$OUTD/ot_run_offload.txt")")
fi
# batch 1: the fused one-row linears (src/engine/fused_kernels.cu) -- their tokens against
# the unfused ops' (informative: the fused norm skips one rounding, so a near-tie may part),
# and compute-sanitizer memcheck over a few steps (eager, capture, replays;
# ENGINE_MEMCHECK_DECODE=0: skip)
B1=(--config tiny --random-weights --device cuda --dtype bf16 --prompt-ids 1,2,3,4,5,6,7,8
    --max-new-tokens 64 --ignore-eos)
"$OT_RUN" "${B1[@]}" >"$OUTD/ot_run_b1.txt" 2>&1
rc1=$?
# (OTE_FUSED_NORM=0 turns the gate_up SwiGLU off too, engine.c fused_body)
OTE_FUSED_NORM=0 OTE_FUSED_SWIGLU=0 OTE_FUSED_ROPE=0 OTE_FUSED_OPROJ=0 "$OT_RUN" "${B1[@]}" >"$OUTD/ot_run_b1_unfused.txt" 2>&1
rc2=$?
if [ $rc1 != 0 ] || [ $rc2 != 0 ]; then  # (two failed runs would also diff equal)
  SUMMARY+=("ot-run batch 1 fused / unfused FAILED (rc $rc1 / $rc2): see ot_run_b1*.txt")
elif diff <(grep '^seq' "$OUTD/ot_run_b1.txt") <(grep '^seq' "$OUTD/ot_run_b1_unfused.txt") >/dev/null; then
  SUMMARY+=("ot-run batch 1 fused vs unfused: tokens equal; $(grep -E '^decode' "$OUTD/ot_run_b1.txt") / unfused $(grep -E '^decode' "$OUTD/ot_run_b1_unfused.txt")")
else
  SUMMARY+=("ot-run batch 1 fused vs unfused: tokens DIFFER (see ot_run_b1*.txt)")
fi
# the sanitizer runs below, all at once in the background (each a tiny ot-run; their lines
# join the summary after the pytests of 2b, which run meanwhile)
san() { # san LOG TOOL [VAR=VALUE ...] -- ot-run arguments: one sanitizer run -> LOG.line
  local log=$1 tool=$2 e=()
  shift 2
  while [ "$1" != -- ]; do e+=("$1"); shift; done
  shift
  env "${e[@]}" timeout "${ENGINE_SAN_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$OT_RUN" \
    --config tiny --random-weights --device cuda --dtype bf16 --prompt-ids 1,2,3,4,5 \
    --ignore-eos "$@" >"$OUTD/$log.log" 2>&1
  echo "rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTD/$log.log" | tail -1)" >"$OUTD/$log.line"
}
SAN_LOGS=()
SAN_WHAT=()
SAN_PIDS=()
san_bg() { # san_bg WHAT LOG TOOL ...: san in the background (WHAT matching ENGINE_SAN_FILTER)
  [ -n "${ENGINE_SAN_FILTER:-}" ] && ! grep -qE -- "$ENGINE_SAN_FILTER" <<<"$1" && return 0
  SAN_WHAT+=("$1")
  SAN_LOGS+=("$2")
  shift
  san "$@" &
  SAN_PIDS+=($!)
}
if [ "${ENGINE_MEMCHECK_DECODE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  san_bg "memcheck ot-run batch-1 decode (fused kernels)" memcheck_decode_b1 memcheck -- --max-new-tokens 5
  # 3 blocks (many tasks a warp)
  san_bg "memcheck ot-run batch-1 decode (fused kernels, 3 blocks)" memcheck_decode_b1_forms memcheck \
    OTE_FUSED_BLOCKS=3 -- --max-new-tokens 5
  # o_proj on the staged kernel (OTE_FUSED_OPROJ=2: it must run) with 12 CTAs: 22 rows a CTA
  # at the tiny config's 256, 14 of them in shared memory
  san_bg "memcheck ot-run batch-1 decode (staged o_proj, 12 CTAs)" memcheck_decode_b1_oproj \
    memcheck OTE_FUSED_OPROJ=2 OTE_FUSED_BLOCKS=12 -- --max-new-tokens 5
  # the staged kernel's L2 prefetch of gate_up and the next qkv, and the qkv kernel's of
  # o_proj (OTE_L2_PF_*), asked for more than the weights hold (clamped to them), evict-last,
  # with 12 CTAs
  san_bg "memcheck ot-run batch-1 decode (staged o_proj + L2 prefetch, 12 CTAs)" memcheck_decode_b1_l2pf \
    memcheck OTE_FUSED_OPROJ=2 OTE_FUSED_BLOCKS=12 OTE_L2_PF_GATEUP=4096 OTE_L2_PF_QKV=4096 \
    OTE_L2_PF_LAST=1 OTE_L2_PF_OPROJ=1 -- --max-new-tokens 5
  # down_proj on the rowblock kernel (OTE_FUSED_DOWN=2: it must run): its default grid (2
  # rows a CTA at the tiny config's 256) and 3 CTAs (85-86 rows: three passes); ffn 704: 88
  # vectors a row over 32 threads x 4, the last 40 masked
  for v in "OTE_FUSED_BLOCKS=0" "OTE_FUSED_BLOCKS=3"; do
    san_bg "memcheck ot-run batch-1 decode (rowblock down_proj, $v)" "memcheck_decode_b1_down_${v#*=}" \
      memcheck OTE_FUSED_DOWN=2 "$v" -- --max-new-tokens 5
  done
  # its shared-memory sums across passes (red[] reused after a barrier): racecheck, 3 CTAs
  san_bg "racecheck ot-run batch-1 decode (rowblock down_proj, 3 CTAs)" racecheck_decode_b1_down \
    racecheck OTE_FUSED_DOWN=2 OTE_FUSED_BLOCKS=3 -- --max-new-tokens 3
  # qkv and gate_up on the rowblock norm kernel (must run; opt-in), its default grid (2 / 6
  # pairs a CTA of the tiny config's 256 / 704: one pass of 16 pairs) and 3 CTAs (85-86 /
  # 234-235 pairs: 6 / 15 passes, red[] by pass parity); racecheck with 3 CTAs
  for v in "OTE_FUSED_BLOCKS=0" "OTE_FUSED_BLOCKS=3"; do
    san_bg "memcheck ot-run batch-1 decode (rowblock qkv + gate_up, $v)" "memcheck_decode_b1_rbnorm_${v#*=}" \
      memcheck OTE_FUSED_QKV=2 OTE_FUSED_GATEUP=2 "$v" -- --max-new-tokens 5
  done
  san_bg "racecheck ot-run batch-1 decode (rowblock qkv + gate_up, 3 CTAs)" racecheck_decode_b1_rbnorm \
    racecheck OTE_FUSED_QKV=2 OTE_FUSED_GATEUP=2 OTE_FUSED_BLOCKS=3 -- --max-new-tokens 3
  # the attention + o_proj kernel (OTE_FUSED_ATTN_OPROJ=2: it must run; the tiny config:
  # head_dim 32, 8 query heads on 4 kv heads): its default grid (33 16-key ranges a kv head,
  # most empty), and 128 CTAs with one range a kv head (the prompt's 5 + 5 keys) and 1 row of
  # W a CTA in shared memory, the other in registers; racecheck / synccheck of each
  san_bg "memcheck ot-run batch-1 decode (attention + o_proj)" memcheck_decode_b1_ao \
    memcheck OTE_FUSED_ATTN_OPROJ=2 -- --max-new-tokens 5
  san_bg "memcheck ot-run batch-1 decode (attention + o_proj, 1 range, rows in registers)" \
    memcheck_decode_b1_ao_regs memcheck OTE_FUSED_ATTN_OPROJ=2 OTE_ATTN_OPROJ_BLOCKS=128 \
    OTE_ATTN_OPROJ_SPLITS=1 OTE_ATTN_OPROJ_SMEM_ROWS=1 -- --max-new-tokens 5
  for t in racecheck synccheck; do
    san_bg "$t ot-run batch-1 decode (attention + o_proj)" "${t}_decode_b1_ao" \
      "$t" OTE_FUSED_ATTN_OPROJ=2 -- --max-new-tokens 3
  done
  # the one-prompt prefill's final norm + lm_head + argmax on the fused kernel (its input
  # rows: the prompt's last row of delta / x_res, not the copies), then 2 decode steps
  san_bg "memcheck ot-run prefill (fused final norm + lm_head)" memcheck_prefill_fused_head \
    memcheck OTE_PREFILL_FUSED_HEAD=1 -- --max-new-tokens 3
fi
stamp "ot-run done"

# ---- 2b. the engine's CUDA tests (tests/python/test_engine.py against this ot-run: the
# fused batch-1 decode's tests; ENGINE_PYTESTS=0: skip, ENGINE_PYTEST_FILTER: pytest -k,
# default cuda_fused; --noconftest: conftest.py imports the _C extension, not built here; in
# parallel with pytest-xdist when installed) -------------------------
if [ "${ENGINE_PYTESTS:-1}" = 1 ]; then
  # the selected tests split over ENGINE_PYTEST_JOBS (default 6) pytest processes at once
  # (tiny models: the GPU is shared; each ot-run is mostly process start-up)
  PT=(python3 -m pytest -q -p no:cacheprovider --noconftest)
  export OT_RUN
  "${PT[@]}" --co tests/python/test_engine.py -k "${ENGINE_PYTEST_FILTER:-cuda_fused}" \
    >"$OUTD/pytest_collect.log" 2>&1
  grep '::' "$OUTD/pytest_collect.log" >"$OUTD/pytest_ids.txt"
  J=${ENGINE_PYTEST_JOBS:-6}
  PIDS=()
  for j in $(seq 0 $((J - 1))); do
    mapfile -t IDS < <(awk -v j="$j" -v n="$J" '(NR - 1) % n == j' "$OUTD/pytest_ids.txt")
    [ ${#IDS[@]} = 0 ] && continue
    timeout "${ENGINE_PYTEST_TIMEOUT:-180}" "${PT[@]}" "${IDS[@]}" >"$OUTD/pytest_engine_$j.log" 2>&1 &
    PIDS+=($!)
  done
  prc=0
  [ -s "$OUTD/pytest_ids.txt" ] || prc=1 # none collected (e.g. an import error): not a pass
  for p in "${PIDS[@]}"; do wait "$p" || prc=1; done
  SUMMARY+=("pytest test_engine.py -k ${ENGINE_PYTEST_FILTER:-cuda_fused}: $(wc -l <"$OUTD/pytest_ids.txt") tests in ${#PIDS[@]} processes (rc $prc): $(for f in "$OUTD"/pytest_engine_*.log; do tail -1 "$f"; done | tr '\n' ';')")
  while IFS= read -r l; do SUMMARY+=("  $l"); done < <(grep -h -E "^(FAILED|ERROR)" "$OUTD"/pytest_engine_*.log | head -12)
  # one log (few files come back from the device)
  for f in "$OUTD/pytest_collect.log" "$OUTD"/pytest_engine_*.log; do
    [ -f "$f" ] && { echo "=== $f"; cat "$f"; }
  done >"$OUTD/pytest_engine.log"
  rm -f "$OUTD"/pytest_engine_*.log "$OUTD/pytest_ids.txt" "$OUTD/pytest_collect.log"
  stamp "engine pytests done"
fi

# the sanitizer runs of step 2 (started in the background there)
if [ ${#SAN_PIDS[@]} -gt 0 ]; then
  for p in "${SAN_PIDS[@]}"; do wait "$p"; done
  for i in "${!SAN_LOGS[@]}"; do
    SUMMARY+=("${SAN_WHAT[$i]} $(cat "$OUTD/${SAN_LOGS[$i]}.line" 2>/dev/null || echo 'no result')")
    rm -f "$OUTD/${SAN_LOGS[$i]}.line"
  done
  stamp "sanitizer runs done"
fi

# ---- 5. weight streaming at a real size: llama3-8b, device budget 2/3 of its weights -----
if [ "${ENGINE_OFFLOAD_BIG:-1}" = 1 ]; then
  P=$(seq -s, 1 64)
  OTE_OFFLOAD_RING=${ENGINE_OFFLOAD_RING:-2} timeout 90 "$OT_RUN" --config llama3-8b --random-weights \
    --device cuda --dtype bf16 --prompt-ids "$P" --max-new-tokens 6 --ignore-eos --offload \
    --offload-budget "${ENGINE_OFFLOAD_BUDGET:-0.6667x}" >"$OUTD/ot_run_offload_8b.txt" 2>&1
  SUMMARY+=("offload llama3-8b (rc $?): $(grep -E '^(time to first|decode|memory|offload)' "$OUTD/ot_run_offload_8b.txt" | tr '\n' ' ' || tail -1 "$OUTD/ot_run_offload_8b.txt")")
  stamp "offload 8b done"
fi

[ "${ENGINE_BENCH_FIRST:-0}" = 1 ] || bench_step

echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
echo "=== engine table (bench/results/engine.json: copy \$OUT/engine.json)"
cat "$OUTD/engine_table.md" 2>/dev/null || echo "(no table: see bench.txt)"
# few files come back from the device tool: the logs in one archive beside engine.json,
# bench.txt and the table
( cd "$OUTD" && L=$(ls | grep -v -E '^(engine\.json|engine_table\.md|bench\.txt|logs\.tgz)$') &&
  [ -n "$L" ] && tar czf logs.tgz $L && rm -f $L ) 2>/dev/null || true
