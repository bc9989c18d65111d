#!/usr/bin/env bash
# scripts/device_memory.sh -- the arena as the source of the library's temporaries and the
# traced memory workload, on the GPU machine (issues 6 and 8): the memory subset of
# scripts/device_verify.sh (same pack, same carry: .devcarry-verify):
#   1. test_ops --backend cuda --suite arena (ot_context_set_arena: ops' scratch from the
#      arena, OOMs, detach; cross-stream reuse with events), then the suites whose CUDA
#      temporaries come from it (softmax_ce, linear_ce; OT_MEM_EXTRA_SUITES="memory ..."
#      adds more);
#   2. pytest of tests/python/test_config_arena.py, test_memory_workload.py (its CUDA case
#      prints its MemoryTracker report into $OUT/pytest.log), test_profiler.py.
#
#   bash scripts/device_memory.sh --pack BUILD_DIR     # here; BUILD_DIR as device_verify.sh says
#   bash scripts/device_memory.sh [COMMIT]             # on the device, carry [".devcarry-verify"]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--pack" ]; then exec bash "$ROOT/scripts/device_verify.sh" "$@"; fi
OT_VERIFY_SUITES="arena softmax_ce linear_ce ${OT_MEM_EXTRA_SUITES:-}" OT_VERIFY_C_TIMEOUT=40 \
OT_VERIFY_PY_TIMEOUT=90 \
OT_VERIFY_PYTESTS="-s tests/python/test_config_arena.py tests/python/test_memory_workload.py tests/python/test_profiler.py" \
  exec bash "$ROOT/scripts/device_verify.sh" "$@"
