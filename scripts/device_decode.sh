#!/usr/bin/env bash
# scripts/device_decode.sh [COMMIT] -- (DECODE_MODE=all|test|bench, default all) issue 6 on
# the lent GPU (NCU_CASE=B,CTX,PAGE adds one ncu profile of the main kernel; FIXED=1 runs
# bench_decode.py --fixed first: where the per-call fixed cost goes): the memory suite's CUDA
# cases (paged attention, kv append, OT_DEBUG checks), compute-sanitizer memcheck +
# racecheck over small paged / append cases, then bench/bench_decode.py (decode vs SDPA,
# arena vs cudaMalloc / cudaMallocAsync) -> $OUT/decode.json + decode.png; table last.
#
# Binaries come prebuilt (this machine has no GPU but the same CUDA 13 and an older
# glibc): scripts/device_decode.sh --pack [BUILD_DIR] here builds BUILD_DIR (default
# build-paged; configured sm_90a Release when it has no build.ninja yet) and
# packs tests/test_ops, libdecode_shim.so, arena_bench and the carried OpenBLAS/dlpack
# deps into .devcarry-paged/ (run with carry [".devcarry-paged"]). When the prebuilt
# test_ops does not start on the device, it builds there with scripts/device_build.sh.
# VARIANTS="name:object.o ..." with --pack also packs libdecode_shim_<name>.so per variant
# (the library with src/cuda/paged_attention.cu's object replaced by object.o: builds of
# other -D flags or another commit's kernel, compiled here), and DECODE_MODE=probe runs
# them: TRACE="name ..." (OT_PA_TRACE builds: bench_decode.py --trace over TRACE_CASES ->
# $OUT/trace_<name>.json), AB="name ..." (bench_decode.py --quick, one process per build, in
# that order; "default" is the packed library; PEERS_FOR="name ...": with --peers, i.e. the
# read ceiling and cuDNN / flash SDPA in the same process), CHECK=1 (--check of the default
# build), ABX="name ..." (the builds in ONE process, bench_decode.py --ab, AB_ROUNDS rounds
# with cuDNN / flash -> $OUT/ab.json; on failure AB falls back to them; an entry
# NAME=BUILD@VAR=VALUE@... is packed build BUILD with those variables set around its calls,
# e.g. merge0=default@OT_PAGED_MERGE=0, old=old@kv_ready=1; "aa" unpacked: a copy of the
# default library, an A/A control; AB_SHAPES="16x4096,16x4096p64o,..." the shapes (bench_decode.py --ab-shapes);
# AB_ARGS: more bench_decode.py arguments, e.g. "--order legacy --warm-ms 100"), MEM=1 (the memory
# suite, MEM_FILTER its filter, MEM_TIMEOUT s (180: the "paged attention" cases take ~120 s;
# under compute-sanitizer far more than SAN_TIMEOUT's default)), SAN_FILTERS / RACE_FILTERS / SYNC_FILTERS (as
# below), then the traces, NCU_CASES (ncu of ours and cuDNN).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=.devcarry-paged
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}

if [ "${1:-}" = "--pack" ]; then
  set -e
  B=${2:-build-paged}
  if [ "${PACK_NO_BUILD:-0}" != 1 ]; then  # 1: pack $B/libops_transformer.a + tests/test_ops as they are
    [ -f "$B/build.ninja" ] || cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOT_CUDA_ARCHS=90a
    cmake --build "$B" -j2 --target ops_transformer_static test_ops
  fi
  INC=(-Iinclude -Isrc -I.carry/deps/include -I"$CUDA_HOME/include")
  LIBS=("$B/libops_transformer.a" -L"$CUDA_HOME/lib64" -L.carry/deps/lib -lcudart -lcublasLt
        -lopenblas -fopenmp -lm -lstdc++)
  cc -O2 -shared -fPIC bench/decode_shim.c "${INC[@]}" "${LIBS[@]}" -o "$B/libdecode_shim.so"
  cc -O2 bench/arena_bench.c "${INC[@]}" "${LIBS[@]}" -o "$B/arena_bench"
  mkdir -p "$CARRY/stage/tests"
  git check-ignore -q "$CARRY/" || { echo "$0: $CARRY is not git-ignored (.gitignore: /.devcarry*/): name the pack .devcarry-*" >&2; exit 1; }
  cp "$B/tests/test_ops" "$CARRY/stage/tests/"
  cp "$B/libdecode_shim.so" "$B/arena_bench" "$CARRY/stage/"
  EXTRA=()
  for v in ${VARIANTS:-}; do  # name:object.o
    name=${v%%:*} obj=${v#*:}
    rm -rf "$CARRY/stage/ar_$name" && mkdir -p "$CARRY/stage/ar_$name"
    cp "$B/libops_transformer.a" "$CARRY/stage/ar_$name/lib.a"
    cp "$obj" "$CARRY/stage/ar_$name/paged_attention.cu.o"
    (cd "$CARRY/stage/ar_$name" && ar r lib.a paged_attention.cu.o)
    cc -O2 -shared -fPIC bench/decode_shim.c "${INC[@]}" "$CARRY/stage/ar_$name/lib.a" "${LIBS[@]:1}" \
      -o "$CARRY/stage/libdecode_shim_$name.so"
    rm -rf "$CARRY/stage/ar_$name"
    EXTRA+=("libdecode_shim_$name.so")
  done
  tar czf "$CARRY/prebuilt.tar.gz" -C "$CARRY/stage" tests/test_ops libdecode_shim.so arena_bench "${EXTRA[@]}"
  tar czf "$CARRY/deps.tar.gz" -C .carry/deps lib include
  rm -rf "$CARRY/stage"
  git rev-parse HEAD >"$CARRY/commit.txt"
  ls -la "$CARRY"
  exit 0
fi

COMMIT=${1:-$(cat "$CARRY/commit.txt" 2>/dev/null || echo unknown)}
OUT=${OUT:-/tmp/ot_decode_out}
mkdir -p "$OUT"
LOGS=build-dec/logs   # bulky logs stay on the machine; $OUT brings back at most 8 files
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

mkdir -p .carry/deps build-dec
[ -d .carry/deps/lib ] || tar xzf "$CARRY/deps.tar.gz" -C .carry/deps
export LD_LIBRARY_PATH="$ROOT/.carry/deps/lib:${LD_LIBRARY_PATH:-}"
tar xzf "$CARRY/prebuilt.tar.gz" -C build-dec
HELP=$(build-dec/tests/test_ops --help 2>&1)   # exits non-zero after printing its usage
if [ "${HELP#usage:}" = "$HELP" ]; then
  stamp "prebuilt test_ops does not start here ($(echo "$HELP" | head -1)): building"
  source scripts/device_build.sh
  ot_device_build build-dec "ops_transformer_static test_ops" || exit 1
  INC=(-Iinclude -Isrc -I.carry/deps/include -I"$CUDA_HOME/include")
  LIBS=(build-dec/libops_transformer.a -L"$CUDA_HOME/lib64" -L.carry/deps/lib -lcudart -lcublasLt
        -lopenblas -fopenmp -lm -lstdc++)
  cc -O2 -shared -fPIC bench/decode_shim.c "${INC[@]}" "${LIBS[@]}" -o build-dec/libdecode_shim.so
  cc -O2 bench/arena_bench.c "${INC[@]}" "${LIBS[@]}" -o build-dec/arena_bench
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

run_san() {  # SAN_LAST=1: after the benchmark (a short allowance: the numbers first)
stamp "compute-sanitizer"
# SAN_FILTERS: '|'-separated test-name filters for memcheck (default below); NO_RACECHECK=1
# skips racecheck (e.g. a rerun after only the append changed).
IFS='|' read -r -a FILTERS <<<"${SAN_FILTERS:-speculative|stream|kv append|OT_DEBUG}"
for f in "${FILTERS[@]}"; do
  timeout "${SAN_TIMEOUT:-45}" compute-sanitizer --tool memcheck --print-limit 10 build-dec/tests/test_ops \
    --backend cuda --suite memory --filter "$f" >"$LOGS/memcheck.log" 2>&1
  echo "memcheck [$f] rc=$?: $(grep -E 'ERROR SUMMARY' "$LOGS/memcheck.log") $(grep -E '^cuda ' "$LOGS/memcheck.log")"
  { echo "=== memcheck [$f]"; head -c 200000 "$LOGS/memcheck.log"; } >>"$OUT/san.log"
done
if [ "${NO_RACECHECK:-0}" != 1 ]; then
  # RACE_FILTERS: '|'-separated test-name filters for racecheck
  IFS='|' read -r -a RFILTERS <<<"${RACE_FILTERS:-speculative|stream B33}"
  for f in "${RFILTERS[@]}"; do
    timeout "${SAN_TIMEOUT:-60}" compute-sanitizer --tool racecheck --racecheck-report all --print-limit 10 \
      build-dec/tests/test_ops --backend cuda --suite memory --filter "$f" >"$LOGS/racecheck.log" 2>&1
    echo "racecheck [$f] rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$LOGS/racecheck.log" | tr '\n' ' ') $(grep -E '^cuda ' "$LOGS/racecheck.log")"
    { echo "=== racecheck [$f]"; head -c 200000 "$LOGS/racecheck.log"; } >>"$OUT/san.log"
  done
fi
# SYNC_FILTERS: '|'-separated test-name filters for synccheck (none by default)
if [ -n "${SYNC_FILTERS:-}" ]; then
  IFS='|' read -r -a YFILTERS <<<"$SYNC_FILTERS"
  for f in "${YFILTERS[@]}"; do
    timeout "${SAN_TIMEOUT:-60}" compute-sanitizer --tool synccheck --print-limit 10 \
      build-dec/tests/test_ops --backend cuda --suite memory --filter "$f" >"$LOGS/synccheck.log" 2>&1
    echo "synccheck [$f] rc=$?: $(grep -E 'ERROR SUMMARY' "$LOGS/synccheck.log" | tr '\n' ' ') $(grep -E '^cuda ' "$LOGS/synccheck.log")"
    { echo "=== synccheck [$f]"; head -c 200000 "$LOGS/synccheck.log"; } >>"$OUT/san.log"
  done
fi

}

MODE=${DECODE_MODE:-all}
if [ "$MODE" = probe ]; then
  shim_of() { [ "$1" = default ] && echo build-dec/libdecode_shim.so || echo "build-dec/libdecode_shim_$1.so"; }
  if [ -n "${ABX:-}" ]; then  # "name ...": one process (bench_decode.py --ab), rounds alternating
    # "aa" without a packed variant of that name: the default library loaded a second time
    # from a copy (an A/A control of the cross-library noise; nothing more to carry)
    case " $ABX " in
      *" aa "*) [ -f build-dec/libdecode_shim_aa.so ] || cp build-dec/libdecode_shim.so build-dec/libdecode_shim_aa.so ;;
    esac
    spec=
    for v in $ABX; do
      case $v in
        *=*) n=${v%%=*} r=${v#*=}; b=${r%%@*}; spec="${spec:+$spec,}$n=$(shim_of "$b")${r#"$b"}" ;;
        *) spec="${spec:+$spec,}$v=$(shim_of "$v")" ;;
      esac
    done
    stamp "ab (one process): $ABX"
    abcmd="DECODE_MODE=${DECODE_MODE:-} ABX=\"$ABX\" AB_ROUNDS=${AB_ROUNDS:-6}${AB_SHAPES:+ AB_SHAPES=$AB_SHAPES}${AB_ARGS:+ AB_ARGS=\"$AB_ARGS\"} bash scripts/device_decode.sh"
    timeout "${ABX_TIMEOUT:-60}" python3 bench/bench_decode.py --shim none --ab "$spec" --rounds "${AB_ROUNDS:-6}" \
      ${AB_SHAPES:+--ab-shapes "$AB_SHAPES"} ${AB_ARGS:-} --json "$OUT/ab.json" --commit "$COMMIT" --command "$abcmd" >"$LOGS/ab.log" 2>&1
    rc=$?; echo "ab rc=$rc"; grep '^ab' "$LOGS/ab.log" | tee -a "$OUT/probe.log"
    if [ $rc != 0 ]; then tail -5 "$LOGS/ab.log"; [ -n "${AB:-}" ] || AB=$ABX; fi  # then one process per build
  fi
  for v in ${AB:-}; do
    stamp "quick $v"
    PEERS=; case " ${PEERS_FOR:-} " in *" $v "*) PEERS=--peers ;; esac
    timeout 40 python3 bench/bench_decode.py --shim "$(shim_of "$v")" --quick $PEERS >"$LOGS/quick.log" 2>&1
    echo "quick $v rc=$?"; grep '^quick' "$LOGS/quick.log" | tee -a "$OUT/probe.log"
  done
  if [ "${CHECK:-0}" = 1 ]; then
    stamp "check"
    timeout 60 python3 bench/bench_decode.py --shim build-dec/libdecode_shim.so --check --no-bench >"$LOGS/check.log" 2>&1
    echo "check rc=$? ok $(grep -c ' ok$' "$LOGS/check.log") FAIL $(grep -c FAIL "$LOGS/check.log")"
    grep FAIL "$LOGS/check.log" | head -5; cat "$LOGS/check.log" >>"$OUT/probe.log"
  fi
  if [ "${MEM:-0}" = 1 ]; then
    stamp "memory suite [${MEM_FILTER:-all}]"
    timeout "${MEM_TIMEOUT:-180}" build-dec/tests/test_ops --backend cuda --suite memory ${MEM_FILTER:+--filter "$MEM_FILTER"} >"$OUT/test.log" 2>&1
    echo "memory rc=$?"; grep -E '^cuda ' "$OUT/test.log"; grep -E 'FAIL' "$OUT/test.log" | head -10
  fi
  [ -n "${SAN_FILTERS:-}" ] && run_san
  for v in ${TRACE:-}; do
    stamp "trace $v"
    timeout 40 python3 bench/bench_decode.py --shim "$(shim_of "$v")" --trace "${TRACE_CASES:-1,256,16;64,1024,16;16,4096,16;1,65536,16}" \
      --json "$OUT/trace_$v.json" --commit "$COMMIT" >"$LOGS/trace_$v.log" 2>&1
    echo "trace $v rc=$?"; cat "$LOGS/trace_$v.log" >>"$OUT/probe.log"
  done
  if [ -n "${NCU_CASES:-}" ]; then
    # NCU_SHIM: the build profiled (default "default"); NCU_EXTRA="name ...": more builds in the
    # same process, each called after it; NCU_METRICS=0: the sections alone (no stall /
    # DRAM / L2 metrics)
    stamp "ncu $NCU_CASES"
    xs=; for v in ${NCU_EXTRA:-}; do xs="${xs:+$xs,}$v=$(shim_of "$v")"; done
    MET=(); [ "${NCU_METRICS:-1}" = 1 ] && MET=(--metrics "regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,dram__bytes_read.sum,dram__bytes_read.sum.per_second,lts__t_sector_op_read_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,sm__warps_active.avg.pct_of_peak_sustained_active")
    timeout "${NCU_TIMEOUT:-40}" ncu --clock-control none --profile-from-start off --section LaunchStats \
      --section Occupancy --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
      "${MET[@]}" python3 bench/bench_decode.py --shim "$(shim_of "${NCU_SHIM:-default}")" \
      ${xs:+--ncu-shims "$xs"} --ncu-cases "$NCU_CASES" >"$OUT/ncu.txt" 2>&1
    rc=$?; echo "ncu rc=$rc"
    if [ $rc != 0 ] && [ ${#MET[@]} != 0 ]; then  # a metric this ncu lacks: the sections alone
      tail -3 "$OUT/ncu.txt"; mv "$OUT/ncu.txt" "$OUT/ncu_failed.txt"
      timeout "${NCU_TIMEOUT:-40}" ncu --clock-control none --profile-from-start off --section LaunchStats \
        --section Occupancy --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 bench/bench_decode.py --shim "$(shim_of "${NCU_SHIM:-default}")" \
        ${xs:+--ncu-shims "$xs"} --ncu-cases "$NCU_CASES" >"$OUT/ncu.txt" 2>&1
      echo "ncu (sections only) rc=$?"
    fi
    grep -E '^  [a-zA-Z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|dram__bytes_read.sum.per_second|^ncu case' "$OUT/ncu.txt" | head -80
  fi
  stamp "done"
  grep '^trace' "$OUT/probe.log" | cut -c1-900
  exit 0
fi
if [ "$MODE" != bench ]; then
stamp "test_ops --backend cuda --suite memory"
timeout "${MEM_TIMEOUT:-150}" build-dec/tests/test_ops --backend cuda --suite memory >"$OUT/test.log" 2>&1
echo "memory rc=$?"; grep -E '^cuda ' "$OUT/test.log"; grep -E 'FAIL' "$OUT/test.log" | head -20
if [ "${NO_ROPE:-0}" != 1 ]; then  # NO_ROPE=1: skip the rope suite (append unchanged)
timeout 60 build-dec/tests/test_ops --backend cuda --suite rope >"$LOGS/test_rope.log" 2>&1
echo "rope rc=$?"; grep -E '^cuda ' "$LOGS/test_rope.log"; grep -E 'FAIL' "$LOGS/test_rope.log" | head -5
fi

[ "${SAN_LAST:-0}" = 1 ] || run_san
fi
if [ "$MODE" != test ]; then
stamp "bench_decode"
CMD="bash scripts/device_decode.sh $COMMIT (run tool, nvidia-h200, carry [\".devcarry-paged\"])"
timeout "${BENCH_TIMEOUT:-170}" python3 bench/bench_decode.py --shim build-dec/libdecode_shim.so --arena-bin build-dec/arena_bench \
  --check ${FIXED:+--fixed} --json "$OUT/decode.json" --commit "$COMMIT" --command "$CMD" \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$?"
python3 bench/plot_decode.py "$OUT/decode.json" "$OUT/decode.png" >>"$OUT/bench.log" 2>&1 || echo "plot failed"
fi
[ "${SAN_LAST:-0}" = 1 ] && [ "$MODE" != bench ] && run_san
if [ -n "${NCU_CASE:-}" ]; then  # e.g. NCU_CASE=16,4096,16: one main-kernel launch under ncu
  stamp "ncu $NCU_CASE"
  timeout 60 ncu --clock-control none --kernel-name regex:pa_mma_kernel --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section LaunchStats --section Occupancy python3 bench/bench_decode.py \
    --shim build-dec/libdecode_shim.so --profile-case "$NCU_CASE" >"$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"; grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu.txt" | head -12
fi
stamp "done"
[ -f "$OUT/bench.log" ] && { grep -E '^check.*FAIL' "$OUT/bench.log"; echo "checks ok: $(grep -cE '^check.* ok$' "$OUT/bench.log")"; tail -14 "$OUT/bench.log"; }
