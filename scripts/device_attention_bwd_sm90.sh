#!/usr/bin/env bash
# scripts/device_attention_bwd_sm90.sh -- the Hopper (sm_90a) attention backward on the lent
# H200 (`run` executes this in the repository root): tests through the dispatcher, compute-
# sanitizer on small cases, and the attention benchmark (fwd and fwd+bwd vs torch SDPA).
#
#   [PRE=DIR] scripts/device_attention_bwd_sm90.sh [COMMIT] [STEPS]
#     STEPS: a comma list (default smoke,test,sanitize,bench,timing), run in this order:
#       smoke       one case (cuda S128 D128 GQA1), 30 s: a hang ends the call
#       test        the CUDA attention suite of test_ops (TEST_FILTER: only the cases whose
#                   name holds it, e.g. "dqred"); PAR=1: in the background beside the
#                   sanitizer, waited for before any timing
#       test_alt    the CUDA cases again under ALT_ENV (default OT_ATTN_SM90=0: the portable kernels)
#       sanitize    compute-sanitizer on small cases, SAN_LIMIT s each (60). SAN_MIN=1: only
#                   memcheck and racecheck of "hopper-only causal Sq<Sk 100x1000 D128" and
#                   racecheck of "hopper-only S129"; SAN_MIN=2: only the racecheck of the
#                   former; SAN_MIN=3: its racecheck and synccheck; SAN_MIN=4: its memcheck,
#                   racecheck and synccheck and memcheck + racecheck of "hopper-only S129"
#                   (split units), all five at once (SAN_LIMIT each); SAN_MIN=5: those five
#                   and memcheck, racecheck, synccheck of "hopper-only causal Sq>Sk 700x130
#                   D128" (whole query tiles no key block sees), eight at once; SAN_MIN=6: the
#                   five of SAN_MIN=4 and the same five on the "dqred" cases (under
#                   OT_ATTN_BWD_SM90_DQ=red, set by the test itself: kXDqRed at D128 in every
#                   build, since ff3dd11 the default there, at D64 only in an experiment
#                   build), ten at once; SAN_MIN=7: memcheck and racecheck
#                   of "hopper-only dqred causal Sq<Sk 100x1000 D128" alone, side by side;
#                   SAN_MIN=8: memcheck, racecheck and synccheck of "hopper-only causal
#                   Sq<Sk 100x1000 D128" (kXSt16, the default since 2026-12-01: its shuffles
#                   with keys past Sk in the last block) and memcheck of "hopper-only S129 D64"
#                   (split units), four at once
#       ab          bench/ab_attention_bwd.py in one process over the shims of $PRE/NAME.tar.xz
#                   for NAME in ALTS (default base) and this build ("new"), AB_ARGS (e.g.
#                   --cases D128S4096 --rounds 6), AB_LIMIT s (120). AB_VARIANTS: more entries of
#                   this build with switches, "NAME=VAR=VAL[,VAR=VAL] ..." (e.g.
#                   "red=OT_ATTN_BWD_SM90_DQ=red"); AB_CHECK=1: --check first (float64 checks of
#                   every entry, no timing on a failure) with AB_EXPECT ("red=1 new=0": the main
#                   kernel's experiment bits each entry must run; "new=128:1,64:0": per head
#                   dim). AB_EARLY=1: the A/B process starts first, in the background (torch
#                   import and --check beside the tests and the sanitizer), and waits
#                   (--wait-for) until those steps are done before it times anything (AB_LIMIT
#                   then counts from the start, the wait included; after a smoke hang the A/B
#                   process ends at AB_LIMIT)
#       sanitize_base, bench_base: racecheck and the benchmark (BASE_BENCH_ARGS) of each other
#                   build $PRE/NAME.tar.xz (test_ops + libattention_shim.so of a kernel to
#                   compare against), NAME in ALTS
#       bench       BENCH_PY (default bench/bench_attention.py) --bench BENCH_ARGS
#       profile     ncu of this build's and cuDNN's fwd+bwd in one process
#                   (bench/profile_attention_bwd.py) over PROFILE_CASES (default
#                   D128S4096c0,D128S4096c1), PROFILE_LIMIT s (120): $OUT/ncu.txt (the
#                   sections), ncu_durations.csv, ncu_src_ours.csv (per-SASS-instruction
#                   stall samples), ncu_raw.csv (every collected metric of every kernel) and
#                   ncu_summary.txt (the main kernels' shared-memory / LSU / tensor metrics side
#                   by side: profile_attention_bwd.py --summarize). PROFILE_VARIANTS: "NAME=VAR=VAL
#                   ..." profiles ours once per variant (default: once, no switch);
#                   MemoryWorkloadAnalysis_Tables / _Chart are added where this ncu lists them
#       timing      attn_portable_timing (when bin.tar.xz holds it) over TIMING_SHAPES
#                   "B,H,S,D ..." (default 8,16,4096,128), TIMING_SETS the VAR=VALUE settings
#                   timed in turn (default deterministic=0 deterministic=1)
#     SUITE_BUILD=NAME: smoke, test, test_alt and sanitize run $PRE/NAME.tar.xz's tests/test_ops
#       instead of bin.tar.xz's (e.g. base: the default build that prebuild_bwd_sm90_exp.sh
#       packs beside the experiment build, so that the suite runs on the default build and the
#       A/B on the experiment library, one call)
#     Logs under $OUT (more than 8 files: all but ab.json, ncu_summary.txt and tests.log
#     packed into logs.tar.gz at the end, since the device tool returns 8; PACK=0: not).
#     PRE (default .bwd90carry, carried): bin.tar.xz with test_ops and libattention_shim.so
#     built here for sm_90a (cmake -DOT_CUDA_ARCHS=90a; see the prebuild lines below) and
#     deps.tar.xz (OpenBLAS + Fortran runtime of .carry/deps/lib), so that the device's time
#     is not spent compiling. Without it: ot_device_build (needs carry [".carry"]).
#   Prebuild (here): cmake --build B --target ops_transformer_static test_ops; cc -shared
#     bench/attention_shim.c ... -o B/libattention_shim.so (as scripts/device_bench_attention.sh);
#     tar cJf .bwd90carry/bin.tar.xz -C B tests/test_ops libattention_shim.so.
#   Experiment builds (-DOT_ATTN_SM90_EXPERIMENTS for this file only: the backward's experiment
#     bits, e.g. kXDqRed): scripts/prebuild_bwd_sm90_exp.sh B CARRY makes bin.tar.xz (the
#     experiment build), base.tar.xz (B as built) and deps.tar.xz from an up-to-date B.
#   AB=st16: the A/B of kXSt16 (dK / dV stored 16 bytes a lane; the default since 2026-12-01,
#     OT_ATTN_BWD_SM90_ST16=0 the 4-byte stores) -- unless set otherwise: the suite's "bwdst"
#     cases (bwdst4: the 4-byte stores forced; bwdst16: its own cases) on this build's
#     test_ops (PAR=1, TEST_LIMIT 90), SAN_MIN=8 (SAN_LIMIT 60), then one process (AB_EARLY=1,
#     AB_LIMIT 200) timing new (the default, kXSt16) and st4 (the same library with the
#     switch at 0) with cuDNN and flash, 12 balanced rounds (6 entries: 2 Latin squares) of
#     D128 / D64 at S 1k and 4k, full and causal, after --check with X as expected (new: 3 at
#     D128, 2 at D64; st4: 1 / 0). ALTS=none: no other build. docs/ATTENTION.md "kXSt16".
set -uo pipefail
COMMIT=${1:-unknown}
STEPS=${2:-smoke,test,sanitize,bench,timing}
OUT=${OUT:-/tmp/ot_device_out}
PRE=${PRE:-.bwd90carry}
if [ "${AB:-}" = st16 ]; then   # the kXSt16 preset (header)
  : "${ALTS:=none}" "${PAR:=1}" "${TEST_FILTER:=bwdst}" "${TEST_LIMIT:=90}" "${SAN_MIN:=8}"
  : "${SAN_LIMIT:=60}" "${AB_EARLY:=1}" "${AB_LIMIT:=200}" "${AB_CHECK:=1}"
  : "${AB_VARIANTS:=st4=OT_ATTN_BWD_SM90_ST16=0}"
  : "${AB_EXPECT:=new=128:3,64:2 st4=128:1,64:0}"
  : "${AB_ARGS:=--cases D128S1024,D64S1024,D128S4096,D64S4096 --rounds 12}"
fi
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
# Emptied first: on a warm machine an earlier call's extraction (an ALTS build, attn_portable_timing)
# would otherwise be timed, sanitized or run again when this call's PRE lacks it. One call at a
# time on the device, so the fixed paths under /tmp are this call's own.
BIN=/tmp/ot_bwd90_bin
rm -rf "$BIN"
mkdir -p "$BIN/lib"
if [ -f "$PRE/bin.tar.xz" ]; then
  tar -xJf "$PRE/bin.tar.xz" -C "$BIN" && tar -xJf "$PRE/deps.tar.xz" -C "$BIN/lib"
  export LD_LIBRARY_PATH="$BIN/lib:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
  TEST=$BIN/tests/test_ops
  SHIM=$BIN/libattention_shim.so
  for alt in $(printf '%s\n' ${ALTS:-base} ${SUITE_BUILD:-} | sort -u); do
    [ -f "$PRE/$alt.tar.xz" ] && mkdir -p "$BIN/$alt" && tar -xJf "$PRE/$alt.tar.xz" -C "$BIN/$alt"
  done
  if [ -n "${SUITE_BUILD:-}" ]; then
    [ -x "$BIN/$SUITE_BUILD/tests/test_ops" ] || { echo "no tests/test_ops in $PRE/$SUITE_BUILD.tar.xz"; exit 1; }
    TEST=$BIN/$SUITE_BUILD/tests/test_ops
    echo "suite, sanitizer: $PRE/$SUITE_BUILD.tar.xz's test_ops"
  fi
else
  stamp "no prebuilt binaries: building"
  # shellcheck source=device_build.sh
  source scripts/device_build.sh
  ot_device_build build-dev "ops_transformer_static test_ops" || exit 1
  cc -O2 -shared -fPIC bench/attention_shim.c -Iinclude -Isrc -I"$OT_DEVICE_DLPACK_INCLUDE" \
    -I"$CUDA_HOME/include" build-dev/libops_transformer.a -L"$CUDA_HOME/lib64" -lcudart \
    -lcublasLt -lopenblas -fopenmp -lm -lstdc++ -o build-dev/libattention_shim.so || exit 1
  export LD_LIBRARY_PATH="$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
  TEST=build-dev/tests/test_ops
  SHIM=build-dev/libattention_shim.so
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
A="$TEST --backend cuda --suite attention"
ABPID= ABGO=/tmp/ot_bwd_ab_go
rm -f "$ABGO"
run_ab() {   # the builds of ALTS and this one, same process, balanced order; $1: extra args
  local shims=() ckargs=() alt v e
  for alt in ${ALTS:-base}; do
    [ -f "$BIN/$alt/libattention_shim.so" ] && shims+=(--shim "$alt=$BIN/$alt/libattention_shim.so")
  done
  stamp "A/B: ${ALTS:-base} new ${AB_VARIANTS:-}"
  # shellcheck disable=SC2086
  for v in ${AB_VARIANTS:-}; do   # NAME=VAR=VAL[,VAR=VAL]: this build again with switches
    shims+=(--shim "${v%%=*}=$SHIM@${v#*=}")
  done
  if [ "${AB_CHECK:-0}" = 1 ]; then
    ckargs=(--check)
    for e in ${AB_EXPECT:-}; do ckargs+=(--expect-x "$e"); done
  fi
  # shellcheck disable=SC2086
  timeout ${AB_LIMIT:-120} python3 bench/ab_attention_bwd.py "${shims[@]}" --shim "new=$SHIM" \
    "${ckargs[@]}" ${AB_ARGS:-} "$@" --json "$OUT/ab.json" --commit "$COMMIT" \
    --command "scripts/device_attention_bwd_sm90.sh $COMMIT $STEPS (ALTS='${ALTS:-base}' AB_VARIANTS='${AB_VARIANTS:-}' AB_ARGS='${AB_ARGS:-}')" \
    >"$OUT/ab.log" 2>&1
  echo "ab rc=$?" >"$OUT/ab.rc"
}
if has ab && [ "${AB_EARLY:-0}" = 1 ]; then   # import + checks now, timing after test / sanitize
  run_ab --wait-for "$ABGO" &
  ABPID=$!
fi

# A hang (a wrong barrier phase or byte count) must not eat the device time.
if has smoke; then
  stamp "smoke"
  timeout 30 $A --filter "cuda S128 D128 GQA1" >"$OUT/smoke.log" 2>&1
  rc=$?; tail -4 "$OUT/smoke.log"
  if [ $rc -eq 124 ]; then echo "SMOKE TIMED OUT (hang)"; exit 2; fi
fi
test_summary() {
  grep -E -A3 '^FAIL' "$OUT/tests.log" | head -40
  echo "tests: $(grep -c '^ok ' "$OUT/tests.log") ok, $(grep -c '^FAIL' "$OUT/tests.log") FAIL"
}
TPID=
if has test; then
  if [ "${PAR:-0}" = 1 ]; then   # beside the sanitizer (both mostly CPU); before any timing
    stamp "tests (Hopper backward through the dispatcher), in the background"
    ( timeout ${TEST_LIMIT:-200} $A -v ${TEST_FILTER:+--filter "$TEST_FILTER"} >"$OUT/tests.log" 2>&1
      echo "test_ops rc=$?" >"$OUT/tests.rc" ) &
    TPID=$!
  else
    stamp "tests (Hopper backward through the dispatcher)"
    timeout ${TEST_LIMIT:-200} $A -v ${TEST_FILTER:+--filter "$TEST_FILTER"} >"$OUT/tests.log" 2>&1
    echo "test_ops rc=$?"
    test_summary
  fi
fi
if has test_alt; then   # the CUDA cases again under ALT_ENV (default: the portable path)
  ALT_ENV=${ALT_ENV:-OT_ATTN_SM90=0}
  stamp "tests, $ALT_ENV"
  env "$ALT_ENV" timeout ${TEST_LIMIT:-200} $A -v --filter cuda >"$OUT/tests_alt.log" 2>&1
  echo "test_ops rc=$?"
  grep -E -A3 '^FAIL' "$OUT/tests_alt.log" | head -20
  echo "tests: $(grep -c '^ok ' "$OUT/tests_alt.log") ok, $(grep -c '^FAIL' "$OUT/tests_alt.log") FAIL"
fi
if has sanitize; then
  SAN="$OUT/sanitize.log"
  : >"$SAN"
  san() { # tool filter [args]; the summary is this run's (none printed: cut by the limit)
    local one="$OUT/sanitize_one.log" rc
    [ -n "${SAN_TAG:-}" ] && one="/tmp/ot_san_$SAN_TAG.log"   # side by side: appended later
    timeout ${SAN_LIMIT:-60} compute-sanitizer --tool "$1" --print-limit 10 "${@:3}" $A --filter "$2" >"$one" 2>&1
    rc=$?
    [ -n "${SAN_TAG:-}" ] && sed -i "1i == $1 / $2" "$one" || { echo "== $1 / $2"; cat "$one"; } >>"$SAN"
    echo "   $1 '$2' rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$one" | tail -1)"
  }
  stamp "compute-sanitizer"
  if [ "${SAN_MIN:-0}" = 8 ]; then   # kXSt16 (the default), four side by side
    C4="hopper-only causal Sq<Sk 100x1000 D128"
    rm -f /tmp/ot_san_2[0-3].sum /tmp/ot_san_2[0-3].log
    SAN_TAG=20 san memcheck "$C4" >/tmp/ot_san_20.sum & p1=$!
    SAN_TAG=21 san racecheck "$C4" --racecheck-report all >/tmp/ot_san_21.sum & p2=$!
    SAN_TAG=22 san synccheck "$C4" >/tmp/ot_san_22.sum & p3=$!
    SAN_TAG=23 san memcheck "hopper-only S129 D64" >/tmp/ot_san_23.sum & p4=$!
    wait $p1 $p2 $p3 $p4
    cat /tmp/ot_san_2[0-3].sum
    cat /tmp/ot_san_2[0-3].log >>"$SAN"
  elif [ "${SAN_MIN:-0}" = 7 ]; then   # kXDqRed's D128 refilled-stage case, two tools side by side
    C3="hopper-only dqred causal Sq<Sk 100x1000 D128"
    rm -f /tmp/ot_san_1[01].sum /tmp/ot_san_1[01].log
    SAN_TAG=10 san memcheck "$C3" >/tmp/ot_san_10.sum & p1=$!
    SAN_TAG=11 san racecheck "$C3" --racecheck-report all >/tmp/ot_san_11.sum & p2=$!
    wait $p1 $p2
    cat /tmp/ot_san_10.sum /tmp/ot_san_11.sum
    cat /tmp/ot_san_10.log /tmp/ot_san_11.log >>"$SAN"
  elif [ "${SAN_MIN:-0}" = 4 ] || [ "${SAN_MIN:-0}" = 5 ] || [ "${SAN_MIN:-0}" = 6 ]; then   # side by side (CPU-bound), then their logs in order
    C="hopper-only causal Sq<Sk 100x1000 D128"
    rm -f /tmp/ot_san_[1-9].sum /tmp/ot_san_[1-9].log /tmp/ot_san_1[0-4].sum /tmp/ot_san_1[0-4].log   # a warm machine's earlier run
    spids=()
    SAN_TAG=1 san memcheck "$C" >/tmp/ot_san_1.sum & spids+=($!)
    SAN_TAG=2 san racecheck "$C" --racecheck-report all >/tmp/ot_san_2.sum & spids+=($!)
    SAN_TAG=3 san synccheck "$C" >/tmp/ot_san_3.sum & spids+=($!)
    SAN_TAG=4 san memcheck "hopper-only S129" >/tmp/ot_san_4.sum & spids+=($!)
    SAN_TAG=5 san racecheck "hopper-only S129" --racecheck-report all >/tmp/ot_san_5.sum & spids+=($!)
    if [ "${SAN_MIN:-0}" = 5 ]; then   # + the keyless-tile case (dQ rows zeroed by prep)
      C2="hopper-only causal Sq>Sk 700x130 D128"
      SAN_TAG=6 san memcheck "$C2" >/tmp/ot_san_6.sum & spids+=($!)
      SAN_TAG=7 san racecheck "$C2" --racecheck-report all >/tmp/ot_san_7.sum & spids+=($!)
      SAN_TAG=8 san synccheck "$C2" >/tmp/ot_san_8.sum & spids+=($!)
    fi
    if [ "${SAN_MIN:-0}" = 6 ]; then   # the same five on the kXDqRed cases
      C3="hopper-only dqred causal Sq<Sk 100x1000 D128"
      SAN_TAG=10 san memcheck "$C3" >/tmp/ot_san_10.sum & spids+=($!)
      SAN_TAG=11 san racecheck "$C3" --racecheck-report all >/tmp/ot_san_11.sum & spids+=($!)
      SAN_TAG=12 san synccheck "$C3" >/tmp/ot_san_12.sum & spids+=($!)
      SAN_TAG=13 san memcheck "hopper-only dqred S129" >/tmp/ot_san_13.sum & spids+=($!)
      SAN_TAG=14 san racecheck "hopper-only dqred S129" --racecheck-report all >/tmp/ot_san_14.sum & spids+=($!)
    fi
    wait "${spids[@]}"
    for i in 1 2 3 4 5 6 7 8 10 11 12 13 14; do cat "/tmp/ot_san_$i.sum" 2>/dev/null; done
    for i in 1 2 3 4 5 6 7 8 10 11 12 13 14; do cat "/tmp/ot_san_$i.log" >>"$SAN" 2>/dev/null; done
  elif [ "${SAN_MIN:-0}" = 2 ]; then   # the one refilled-stage D128 case, racecheck only
    san racecheck "hopper-only causal Sq<Sk 100x1000 D128" --racecheck-report all
  elif [ "${SAN_MIN:-0}" = 3 ]; then   # the same case, racecheck and synccheck
    san racecheck "hopper-only causal Sq<Sk 100x1000 D128" --racecheck-report all
    san synccheck "hopper-only causal Sq<Sk 100x1000 D128"
  elif [ "${SAN_MIN:-0}" = 1 ]; then
    san memcheck "hopper-only causal Sq<Sk 100x1000 D128"
    san racecheck "hopper-only causal Sq<Sk 100x1000 D128" --racecheck-report all
    san racecheck "hopper-only S129" --racecheck-report all
  else
  # the Hopper backward's cases (OT_ATTN_IMPL=sm90: a declined call fails): D64 MQA with
  # the 64-query tail, D128 GQA1; memcheck also on a D128 Sq != Sk case through the dispatcher
  san memcheck "hopper-only S129"
  san memcheck "cuda Sq17 Sk1000 D128"
  san racecheck "hopper-only S129" --racecheck-report all
  san racecheck "hopper-only S128 D128" --racecheck-report all
  # D128 with refilled Q/dO stages (8 tiles a CTA; S128 D128 has 2, no refill)
  san racecheck "hopper-only causal Sq<Sk 100x1000 D128" --racecheck-report all
  san synccheck "hopper-only S128 D128"
  fi
fi
if [ -n "$TPID" ]; then
  wait "$TPID"; stamp "tests done: $(cat "$OUT/tests.rc" 2>/dev/null)"
  test_summary
fi
if has ab; then
  if [ -n "$ABPID" ]; then
    touch "$ABGO"; wait "$ABPID"
  else
    run_ab
  fi
  cat "$OUT/ab.rc"
  grep -E 'GEMM|^D[0-9]|failed|Error|^FAIL|^check |CHECK|^waited' "$OUT/ab.log" | cut -c1-300
fi
for alt in ${ALTS:-base}; do
  has sanitize_base && [ -x "$BIN/$alt/tests/test_ops" ] || continue
  stamp "racecheck, build $alt"
  timeout ${SAN_LIMIT:-60} compute-sanitizer --tool racecheck --racecheck-report all --print-limit 10 \
    "$BIN/$alt/tests/test_ops" --backend cuda --suite attention --filter "hopper-only S129" \
    >"$OUT/sanitize_$alt.log" 2>&1
  echo "   $alt racecheck 'hopper-only S129' rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/sanitize_$alt.log" | tail -1)"
done
for alt in ${ALTS:-base}; do
  has bench_base && [ -f "$BIN/$alt/libattention_shim.so" ] || continue
  stamp "bench, build $alt"
  timeout ${BENCH_LIMIT:-150} python3 ${BENCH_PY:-bench/bench_attention.py} --shim "$BIN/$alt/libattention_shim.so" \
    --bench ${BASE_BENCH_ARGS:-${BENCH_ARGS:-}} --json "$OUT/attention_$alt.json" --commit "$alt of $COMMIT" \
    >"$OUT/bench_$alt.log" 2>&1
  echo "bench $alt rc=$?"; grep -E 'GEMM|attention_f|failed|Error|not available' "$OUT/bench_$alt.log" | cut -c1-160
done
if has bench; then
  stamp "bench"
  timeout ${BENCH_LIMIT:-150} python3 ${BENCH_PY:-bench/bench_attention.py} --shim "$SHIM" --bench ${BENCH_ARGS:-} \
    --json "$OUT/attention.json" --plot "$OUT/attention.png" --commit "$COMMIT" \
    --command "scripts/device_attention_bwd_sm90.sh $COMMIT $STEPS" >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -E 'GEMM|attention_f|failed|Error|not available' "$OUT/bench.log" | cut -c1-160
fi
if has profile; then
  stamp "ncu: ours and cuDNN, ${PROFILE_CASES:-D128S4096c0,D128S4096c1} ${PROFILE_VARIANTS:-}"
  extra=()   # the memory tables (shared-memory wavefronts, bank conflicts) where listed
  secs=$(ncu --list-sections 2>/dev/null)
  for sec in MemoryWorkloadAnalysis_Tables MemoryWorkloadAnalysis_Chart; do
    grep -qw "$sec" <<<"$secs" && extra+=(--section "$sec")
  done
  pv=()
  for v in ${PROFILE_VARIANTS:-}; do pv+=(--variant "$v"); done
  timeout ${PROFILE_LIMIT:-120} ncu --clock-control none --profile-from-start off \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
    --section SourceCounters "${extra[@]}" -f -o /tmp/ot_bwd_prof \
    python3 bench/profile_attention_bwd.py --shim "$SHIM" --cases "${PROFILE_CASES:-D128S4096c0,D128S4096c1}" \
    "${pv[@]}" >"$OUT/ncu_run.log" 2>&1
  echo "ncu rc=$?"
  ncu --import /tmp/ot_bwd_prof.ncu-rep --print-summary none >"$OUT/ncu.txt" 2>&1
  ncu --import /tmp/ot_bwd_prof.ncu-rep --page raw --csv --metrics \
    gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread >"$OUT/ncu_durations.csv" 2>&1
  ncu --import /tmp/ot_bwd_prof.ncu-rep --page source --csv --print-source sass \
    -k regex:attn_bwd_sm90 -c 1 >"$OUT/ncu_src_ours.csv" 2>&1
  ncu --import /tmp/ot_bwd_prof.ncu-rep --page raw --csv >"$OUT/ncu_raw.csv" 2>&1
  python3 bench/profile_attention_bwd.py --summarize "$OUT/ncu_raw.csv" >"$OUT/ncu_summary.txt" 2>&1
  cut -c1-200 "$OUT/ncu_summary.txt" | head -60
fi
# Backward alone, Hopper (deterministic=0) against the portable one (deterministic=1):
# fwd+bwd ms of attn_portable_timing (bin.tar.xz may hold it) minus its fwd ms.
if has timing && [ -x "$BIN/attn_portable_timing" ]; then
  stamp "timing deterministic=0|1"
  for shape in ${TIMING_SHAPES:-8,16,4096,128}; do
    for c in 0 1; do
      timeout 60 "$BIN/attn_portable_timing" ${shape//,/ } $c 10 ${TIMING_SETS:-deterministic=0 deterministic=1} 2>&1 |
        tee -a "$OUT/timing.log"
    done
  done
fi
# The device tool returns at most 8 files of $OUT: past that, everything but ab.json,
# ncu_summary.txt and tests.log goes into logs.tar.gz (PACK=0: never).
if [ "${PACK:-1}" = 1 ] && [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name ab.json ! -name ncu_summary.txt \
     ! -name tests.log -printf '%f\n' >/tmp/ot_bwd_pack.lst &&
   tar czf logs.tar.gz -T /tmp/ot_bwd_pack.lst && xargs rm -f </tmp/ot_bwd_pack.lst)
  stamp "packed $(wc -l </tmp/ot_bwd_pack.lst) files into logs.tar.gz"
fi
stamp "end"
