#!/usr/bin/env bash
# scripts/device_memory.sh -- the arena as the source of the library's temporaries and the
# traced memory workload, on the GPU machine (issues 6 and 8):
#   1. test_ops --backend cuda --suite arena (ot_context_set_arena: ops' scratch from the
#      arena, OOMs, detach; cross-stream reuse with events), then the suites whose CUDA
#      temporaries changed path (softmax_ce, linear_ce; OT_MEM_EXTRA_SUITES="memory ..."
#      adds more) as a regression;
#   2. ops_transformer._C compiled against the carried library (the device's python);
#      pytest of tests/python/test_config_arena.py, test_memory_workload.py (CUDA case
#      prints its MemoryTracker report), test_profiler.py.
#
# Build here (no GPU), then run on the device with carry [".devcarry-mem"]:
#   bash scripts/device_memory.sh --pack BUILD_DIR     # BUILD_DIR: -DOT_CUDA=ON
#        -DOT_CUDA_ARCHS=90a Release, targets ops_transformer and test_ops built
#   bash scripts/device_memory.sh                       # on the device; logs under $OUT
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=.devcarry-mem
if [ "${1:-}" = "--pack" ]; then
  set -e
  B=${2:?usage: device_memory.sh --pack BUILD_DIR}
  grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >>.git/info/exclude
  S=$(mktemp -d)
  mkdir -p "$S/lib" "$S/include" "$CARRY"
  cp -a "$B"/libops_transformer.so* "$S/lib/"
  cp "$B/tests/test_ops" "$S/"
  DEPS=$ROOT/.carry/deps
  cp -a "$DEPS"/lib/libopenblas.so* "$DEPS"/lib/libgfortran.so.5 "$DEPS"/lib/libquadmath.so.0 "$S/lib/"
  if [ -f /usr/include/dlpack/dlpack.h ]; then cp -r /usr/include/dlpack "$S/include/"
  else cp -r "$DEPS/include/dlpack" "$S/include/"; fi
  tar czf "$CARRY/mem.tar.gz" -C "$S" .
  rm -rf "$S"
  ls -la "$CARRY"
  exit 0
fi
OUT=${OUT:-/tmp/ot_mem_out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
M=/tmp/ot_mem
rm -rf "$M" && mkdir -p "$M" && tar xzf "$CARRY/mem.tar.gz" -C "$M" || { echo "no $CARRY/mem.tar.gz"; exit 1; }
export LD_LIBRARY_PATH="$M/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

stamp "test_ops --backend cuda --suite arena"
timeout 40 "$M/test_ops" --backend cuda --suite arena -v >"$OUT/c_arena.log" 2>&1
echo "rc $?" >>"$OUT/c_arena.log"
grep -E "^(ok|FAIL|skip)|passed|rc " "$OUT/c_arena.log"
for s in softmax_ce linear_ce ${OT_MEM_EXTRA_SUITES:-}; do
  stamp "test_ops --backend cuda --suite $s"
  timeout 30 "$M/test_ops" --backend cuda --suite "$s" >"$OUT/c_$s.log" 2>&1
  echo "rc $?" >>"$OUT/c_$s.log"
  grep -E "^FAIL|passed,|rc " "$OUT/c_$s.log" | tail -3
done

stamp "_C against the carried library"
PY=$(command -v python3)
PKG=$M/pkg/ops_transformer
mkdir -p "$PKG"
cp python/ops_transformer/*.py "$PKG/"
EXT=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
PYINC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if ! cc -O2 -shared -fPIC -Wall -Wno-unused-parameter python/ops_transformer/_C.c -Iinclude \
     -I"$M/include" -I"$PYINC" -L"$M/lib" -lops_transformer -Wl,-rpath,"$M/lib" \
     -o "$PKG/_C$EXT" >"$OUT/ext.log" 2>&1; then
  cat "$OUT/ext.log"; echo "extension build failed"; exit 1
fi
stamp "pytest (config arena, memory workload, profiler)"
PYTHONPATH="$M/pkg" timeout 90 "$PY" -m pytest -q -s -p no:cacheprovider \
  tests/python/test_config_arena.py tests/python/test_memory_workload.py \
  tests/python/test_profiler.py >"$OUT/pytest.log" 2>&1
echo "rc $?" >>"$OUT/pytest.log"
grep -E "^(library|device|torch|combined)|passed|failed|Error|rc " "$OUT/pytest.log" | tail -20
stamp "done"
