#!/usr/bin/env bash
# scripts/device_norm_ab.sh -- one device call for a norm / RoPE round: several builds of
# the fused-ops shim in one process (ours, and e.g. the parent's, as bench_fused_ops.py
# --ab-shim), so that a change is timed against what it replaces without run-time switches
# in the library.
#   1. test_ops --backend cuda --suite norm, --suite rope (ours, and each other build's
#      tests/test_ops_NAME in the prebuilt archive);
#   2. python3 bench/bench_fused_ops.py --bench --no-compile --only norm,rope --ab-shim
#      NAME=build-dev/libfused_ops_shim_X.so ... (OT_AB; peers, copy and the other shims in
#      the same process) -> $OUT/fused_ops.json;
#   3. compute-sanitizer memcheck and racecheck over a few test_ops cases (OT_SAN_FILTERS);
#   4. ncu --clock-control none (SpeedOfLight, MemoryWorkloadAnalysis, Occupancy,
#      WarpStateStats, LaunchStats) over bench_fused_ops.py --ncu: torch.neg, the norm
#      forward / backward and RoPE kernels at 16k x 4096 bf16, A's first, then ours.
# Environment:
#   OT_PREBUILT=DIR (default .devcarry-normab): prebuilt.tar.gz (tests/test_ops[_NAME],
#     libfused_ops_shim.so and the others' libfused_ops_shim_X.so for sm_90a, as
#     scripts/device_prebuild.sh packs them, the others added by hand) and deps.tar.gz;
#     carry DIR.
#   OT_AB="NAME=FILE ..." (default "parent=libfused_ops_shim_A.so", files in build-dev),
#   OT_COMMIT, OT_NCU=0 (skip step 4), OT_NCU_TIMEOUT (60), OT_SAN (below)
P=${OT_PREBUILT:-.devcarry-normab}; OUT=${OUT:-/tmp/ot_device_out}; mkdir -p "$OUT"
T0=$(date +%s); st() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p build-dev/deps && tar xzf $P/prebuilt.tar.gz -C build-dev && tar xzf $P/deps.tar.gz -C build-dev/deps || exit 1
export LD_LIBRARY_PATH=$PWD/build-dev/deps:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
T=build-dev/tests/test_ops; SHIM=build-dev/libfused_ops_shim.so
ABARGS=(); for a in ${OT_AB:-parent=libfused_ops_shim_A.so}; do ABARGS+=(--ab-shim "${a%%=*}=build-dev/${a#*=}"); done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
st "test_ops"
for t in build-dev/tests/test_ops*; do
  for s in norm rope; do
    log=$OUT/$(basename $t)_$s.log  # one log per build and suite (each build's failures kept)
    timeout 40 $t --backend cuda --suite $s >$log 2>&1; echo "$(basename $t) --suite $s rc=$?"
    grep -E '^cuda |FAIL' $log | head -8
  done
done
st "bench"
timeout 90 python3 bench/bench_fused_ops.py --shim $SHIM "${ABARGS[@]}" --bench --no-compile --only norm,rope \
  --json $OUT/fused_ops.json --commit "${OT_COMMIT:-unknown}" \
  --command "scripts/device_norm_ab.sh: python3 bench/bench_fused_ops.py --shim build-dev/libfused_ops_shim.so ${ABARGS[*]} --bench --no-compile --only norm,rope" \
  >$OUT/bench.log 2>&1
echo "bench rc=$?"; grep -E '^copy|TB/s|failed|Error' $OUT/bench.log | cut -c1-330
st "sanitizers"
# OT_SAN: "BIN:SUITE:FILTER|..." (BIN under build-dev/tests), memcheck and racecheck each
IFS='|' read -r -a SANS <<<"${OT_SAN:-test_ops:norm:layernorm bf16 plain rows=33 H=4096|test_ops:norm:bf16 dres saved-stats rows=33 H=4096|test_ops:rope:neox gqa 40/8 T=9 D=128 cache}"
for e in "${SANS[@]}"; do
  bin=${e%%:*}; rest=${e#*:}; suite=${rest%%:*}; f=${rest#*:}
  for tool in memcheck racecheck; do
    extra=; [ $tool = racecheck ] && extra="--racecheck-report all"
    timeout 20 compute-sanitizer --tool $tool $extra --print-limit 10 build-dev/tests/$bin --backend cuda --suite $suite --filter "$f" >$OUT/san.log 2>&1
    echo "$tool $bin [$f] rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san.log | tr '\n' ' ') $(grep -E 'passed' $OUT/san.log | tail -1)"
  done
done
if [ "${OT_NCU:-1}" = 1 ]; then
  st "ncu"
  timeout "${OT_NCU_TIMEOUT:-60}" ncu --clock-control none --kernel-name-base demangled \
    --kernel-name 'regex:ot::norm_|ot::rope_|neg_kernel' \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
    --section LaunchStats --metrics dram__bytes_read.sum,dram__bytes_write.sum \
    python3 bench/bench_fused_ops.py --shim $SHIM "${ABARGS[@]}" --ncu >$OUT/ncu.log 2>&1
  echo "ncu rc=$?"
  grep -E '^  [a-z].*\(|ncu run:|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Block Limit Reg|Warp Cycles Per Issued|L2 Hit Rate ' $OUT/ncu.log | cut -c1-120 | sed 's/  */ /g' | head -150
fi
st end
