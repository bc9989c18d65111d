#!/usr/bin/env bash
# scripts/device_norm_bwd.sh -- one short device call for the norm backward (the run of
# 8b0b8b7, docs/PERFORMANCE.md "CUDA fused ops"): test_ops --suite norm on CUDA, the norm
# backward rows of bench_fused_ops.py (--only normbwd, peers and copy in the same process,
# variants such as "old sum" = OT_NORM_REDUCE=old), then compute-sanitizer memcheck and
# racecheck over a few backward cases of the partials' sum. Output under $OUT.
#   OT_PREBUILT=DIR (default .devcarry-fused2): prebuilt.tar.gz (tests/test_ops,
#   libfused_ops_shim.so for sm_90a, as scripts/device_prebuild.sh makes them) and
#   deps.tar.gz; carry DIR. OT_COMMIT: the commit recorded in the JSON.
# (The run of 8b0b8b7 ran this as .devcarry-fused2/run.sh with the commit written in.)
P=${OT_PREBUILT:-.devcarry-fused2}; OUT=${OUT:-/tmp/ot_device_out}; mkdir -p "$OUT"; T0=$(date +%s); st() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p build-dev/deps && tar xzf $P/prebuilt.tar.gz -C build-dev && tar xzf $P/deps.tar.gz -C build-dev/deps || exit 1
export LD_LIBRARY_PATH=$PWD/build-dev/deps:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T=build-dev/tests/test_ops; SHIM=build-dev/libfused_ops_shim.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
st "test_ops norm"
timeout 25 $T --backend cuda --suite norm >$OUT/test_norm.log 2>&1; echo "test_ops rc=$?"
grep -E '^cuda |passed|FAIL' $OUT/test_norm.log | head -12
st "bench"
timeout 30 python3 bench/bench_fused_ops.py --shim $SHIM --bench --no-compile --only normbwd --json $OUT/fused_ops.json \
  --commit "${OT_COMMIT:-unknown}" --command "scripts/device_norm_bwd.sh: python3 bench/bench_fused_ops.py --shim build-dev/libfused_ops_shim.so --bench --no-compile --only normbwd" >$OUT/bench.log 2>&1
echo "bench rc=$?"; grep -E 'copy|_bwd|failed|Error' $OUT/bench.log | head -12
st "memcheck"
timeout 8 compute-sanitizer --tool memcheck --print-limit 10 $T --backend cuda --suite norm --filter "H=72 many partials" >$OUT/memcheck.log 2>&1
echo "memcheck rc=$?"; grep -E 'ERROR SUMMARY|passed|FAIL' $OUT/memcheck.log | tail -3
st "racecheck"
timeout 8 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 10 $T --backend cuda --suite norm --filter "bf16 dres saved-stats rows=33 H=4096" >$OUT/racecheck.log 2>&1
echo "racecheck rc=$?"; grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|hazard|passed|FAIL' $OUT/racecheck.log | tail -4
st end
