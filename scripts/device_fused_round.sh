#!/usr/bin/env bash
# scripts/device_fused_round.sh -- one device call for a fused-ops round (norms, RoPE,
# SwiGLU): several builds of the fused-ops shim in one process (ours and e.g. the
# parent's, bench_fused_ops.py --ab-shim), so that a change is timed against what it
# replaces, with torch's peers, in the same run. Steps (each optional):
#   1. test_ops --backend cuda --suite S for S in OT_SUITES (default "norm rope glu");
#   1b. OT_CHECK=FAMILIES: bench_fused_ops.py --check --small --only FAMILIES for ours and
#      every --ab-shim build (float64 references, odd and strided shapes); OT_BITS=1:
#      bench_fused_ops.py --bits-ab (the norm forward of every --ab-shim build bit for bit
#      against ours);
#   2. python3 bench/bench_fused_ops.py --bench --only OT_ONLY --hidden OT_HIDDEN
#      [--no-compile] --ab-shim NAME=build-dev/FILE ... -> $OUT/fused_ops.json;
#      OT_ONLY may name "train" (the 0.54 B training shapes: SwiGLU 8192 x 5632 against
#      torch.compile's fused kernels, the RMSNorm backward 8192 x 2048 with and without
#      dweight) and "rmsbwd" (the RMSNorm backward's A/B: the default kernels against their
#      ring / width knobs and the --ab-shim builds at 8192 x 1024 / 2048 and 16k x 2048 with
#      dres, 16k x 4096 without / with it; torch.compile's backward in the same process, at
#      the 2048-wide cases, with OT_COMPILE=train);
#   3. compute-sanitizer memcheck and racecheck over test_ops cases (OT_SAN, below);
#   4. ncu --clock-control none (SpeedOfLight, Occupancy, WarpStateStats, LaunchStats,
#      InstructionStats, SchedulerStats) over bench_fused_ops.py --ncu: torch.neg, the norm
#      forward / backward and RoPE kernels at 16k x 4096 bf16, then SwiGLU and the RMSNorm
#      backward at the training shapes (inductor's kernels with ours; OT_NCU_AB=1: the A/B
#      builds' kernels first).
# Environment:
#   OT_PREBUILT=DIR (default .devcarry-p5): prebuilt.tar.gz or .tar.xz (tests/test_ops,
#     libfused_ops_shim.so and the other builds' libfused_ops_shim_X.so, sm_90a, packed
#     here as scripts/device_prebuild.sh does) and deps.tar.gz; carry DIR.
#   OT_AB="NAME=FILE ..." (files in build-dev; default "parent=libfused_ops_shim_A.so"; ""
#     for none: an A/B of run-time switches in one build, e.g. --cut-ab below),
#   OT_SUITES, OT_ONLY (default "norm,rope,glu,train"), OT_HIDDEN (default 4096),
#   OT_COMPILE=1 (torch.compile peers; =train: for the training shapes only), OT_COMMIT,
#   OT_NCU=0 (skip step 4), OT_NCU_AB=1 (the A/B builds' kernels under ncu too),
#   OT_NCU_TRAIN=0 (ncu without the training shapes and torch.compile),
#   OT_BENCH_EXTRA (more bench_fused_ops.py flags, e.g. "--ab-rounds 4 --cases 8192x2048
#     --rope-tail"; "--cut-ab": the RMSNorm / RoPE opt-ins of 2026-11-30 night against the
#     defaults in --ab-rounds' balanced rounds, docs/PERFORMANCE.md), OT_NCU_TIMEOUT (60),
#   OT_BENCH_TIMEOUT (90), OT_TEST_TIMEOUT (40, per suite),
#   OT_SAN="BIN:SUITE:FILTER|..." ("" skips 3).
P=${OT_PREBUILT:-.devcarry-p5}; OUT=${OUT:-/tmp/ot_device_out}; mkdir -p "$OUT"
T0=$(date +%s); st() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
PK=$P/prebuilt.tar.gz; [ -f $P/prebuilt.tar.xz ] && PK=$P/prebuilt.tar.xz # prebuild_norm_ab.sh's: xz
mkdir -p build-dev/deps
{ tar xf $PK -C build-dev 2>/dev/null || # no xz program: Python's lzma
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' $PK build-dev; } &&
  tar xzf $P/deps.tar.gz -C build-dev/deps || exit 1
export LD_LIBRARY_PATH=$PWD/build-dev/deps:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
T=build-dev/tests/test_ops; SHIM=build-dev/libfused_ops_shim.so
ABARGS=(); for a in ${OT_AB-parent=libfused_ops_shim_A.so}; do ABARGS+=(--ab-shim "${a%%=*}=build-dev/${a#*=}"); done
CFLAG=--no-compile; [ "${OT_COMPILE:-0}" = 1 ] && CFLAG=
[ "${OT_COMPILE:-0}" = train ] && CFLAG="--no-compile --train-compile"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
st "test_ops"
for s in ${OT_SUITES-norm rope glu}; do
  timeout "${OT_TEST_TIMEOUT:-40}" $T --backend cuda --suite $s >$OUT/test_$s.log 2>&1; echo "test_ops --suite $s rc=$?"
  grep -E '^cuda |FAIL' $OUT/test_$s.log | head -8
done
if [ -n "${OT_CHECK:-}" ]; then
  st "check"
  timeout 60 python3 bench/bench_fused_ops.py --shim $SHIM "${ABARGS[@]}" --check --small --only $OT_CHECK >$OUT/check.log 2>&1
  echo "check rc=$?"; grep -E '^check|FAIL|Error' $OUT/check.log | head -20
fi
if [ "${OT_BITS:-0}" = 1 ]; then
  st "bits"
  timeout 60 python3 bench/bench_fused_ops.py --shim $SHIM "${ABARGS[@]}" --bits-ab >$OUT/bits.log 2>&1
  echo "bits rc=$?"; grep -E '^bits|differ|Error' $OUT/bits.log | head -12
fi
if [ -n "${OT_ONLY-norm,rope,glu,train}" ]; then
  st "bench"
  CMD="python3 bench/bench_fused_ops.py --shim $SHIM ${ABARGS[*]} --bench $CFLAG --only ${OT_ONLY-norm,rope,glu,train} --hidden ${OT_HIDDEN-4096} ${OT_BENCH_EXTRA:-}"
  timeout "${OT_BENCH_TIMEOUT:-90}" $CMD --json $OUT/fused_ops.json --commit "${OT_COMMIT:-unknown}" \
    --command "scripts/device_fused_round.sh: $CMD" >$OUT/bench.log 2>&1
  echo "bench rc=$?"; grep -E '^copy|TB/s|failed|Error' $OUT/bench.log | cut -c1-360
fi
IFS='|' read -r -a SANS <<<"${OT_SAN-}"
[ ${#SANS[@]} -gt 0 ] && st "sanitizers"
n=0
for e in "${SANS[@]}"; do
  bin=${e%%:*}; rest=${e#*:}; suite=${rest%%:*}; f=${rest#*:}; n=$((n + 1))
  for tool in memcheck racecheck; do
    extra=; [ $tool = racecheck ] && extra="--racecheck-report all"
    log=$OUT/san_${n}_$tool.log # one log a run (test_ops exits 1, "no case ran", on a filter that matches nothing)
    timeout 25 compute-sanitizer --tool $tool $extra --print-limit 10 build-dev/tests/$bin --backend cuda --suite $suite --filter "$f" >$log 2>&1
    echo "$tool [$suite: $f] rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $log | tr '\n' ' ') $(grep -E 'passed|no case ran' $log | tail -1)"
  done
done
if [ "${OT_NCU:-1}" = 1 ]; then
  st "ncu"
  TORCHINDUCTOR_COMPILE_THREADS=1 timeout "${OT_NCU_TIMEOUT:-60}" ncu --clock-control none --kernel-name-base demangled \
    --kernel-name 'regex:ot::norm_|ot::rope_|ot::glu_|neg_kernel|triton' \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section InstructionStats --section SchedulerStats --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum \
    python3 bench/bench_fused_ops.py --shim $SHIM $([ "${OT_NCU_AB:-0}" = 1 ] && echo "${ABARGS[@]}") --ncu $([ "${OT_NCU_TRAIN:-1}" = 1 ] && echo --ncu-train) >$OUT/ncu.log 2>&1
  echo "ncu rc=$?"
  grep -E '^  [a-zA-Z_].*\(|ncu run:|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|smsp__inst_executed.sum|dram__bytes_(read|write).sum|Grid Size|Block Size' $OUT/ncu.log \
    | cut -c1-110 | sed 's/  */ /g' | head -260
fi
st end
