#!/usr/bin/env bash
# scripts/device_train.sh -- the PyTorch integration on the GPU machine (issue 8):
# build the Python extension with the CUDA backend, run the CUDA cases of the Python
# tests and examples/train_llama.py on CUDA, then bench/bench_training.py (HF
# LlamaForCausalLM training, patched vs HF).
#
#   bash scripts/device_train.sh [commit-sha]        # `run` with carry [".carry"]
#
# Environment: OT_TRAIN_PREBUILT (a folder made by --pack: use its library, build nothing),
# OT_TRAIN_BUILD_DIR (default build-dev), OT_TRAIN_BENCH_ARGS (extra
# bench_training.py arguments, e.g. "--quick --device cpu" for a dry run, or "--profile
# patched@0.54b:1x16384" for a profile of a measured case), OT_TRAIN_BUDGET_S (whole script, default 420 s; the benchmark gets what
# the build, the tests and the example leave, at least 30 s), OT_TRAIN_SKIP_TESTS=1 (the
# benchmark only: no probe print, Python tests or example), OT_TRAIN_PYTEST (the pytest
# arguments instead of the default "-k cuda" selection over the five test files, e.g.
# '-k "cuda and (eager or matches_hf)" tests/python/test_train_eager_ops.py
# tests/python/test_patch.py'), OT_TRAIN_SKIP_EXAMPLE=1 (no examples/train_llama.py run),
# OT_TRAIN_SKIP_PROBE=1 (no print of the library's ops probed on CUDA),
# OT_TRAIN_TESTS_LAST=1 (the Python tests after the benchmark, which then leaves them
# OT_TRAIN_PYTEST_TIMEOUT s, default 150: the pytest limit either way), OUT (default
# /tmp/ot_train_out). Results under $OUT: training.json (bench/results/training.json
# format), training_loss.png (docs/img/training_loss.png), training.md (the table for
# docs/PERFORMANCE.md), pytest.log, bench.log, traces.tar (the profiles' chrome traces,
# trace_<variant>_<case>.json.gz). The table is printed last.
set -uo pipefail
T0=$(date +%s)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "${1:-}" = "--pack" ]; then
  # scripts/device_train.sh --pack BUILD_DIR [CARRY_DIR]: build the shared library here
  # (BUILD_DIR configured with -DOT_CUDA=ON -DOT_CUDA_ARCHS=90a) and pack it for carry;
  # then run with OT_TRAIN_PREBUILT=CARRY_DIR and carry [".carry", "CARRY_DIR"].
  set -e
  B=${2:?usage: device_train.sh --pack BUILD_DIR [CARRY_DIR]}
  C=${3:-.devcarry-train}
  cmake --build "$B" -j "$(nproc)" --target ops_transformer
  mkdir -p "$C"
  git check-ignore -q "$C/" || { echo "$0: $C is not git-ignored (.gitignore: /.devcarry*/): name the pack .devcarry-*" >&2; exit 1; }
  tar czf "$C/libops.tar.gz" -C "$B" $(cd "$B" && ls libops_transformer.so*)
  git rev-parse --short HEAD >"$C/commit.txt"
  ls -la "$C"
  exit 0
fi
OUT=${OUT:-/tmp/ot_train_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
BUDGET=${OT_TRAIN_BUDGET_S:-420}
COMMIT=${1:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
PY=$(command -v python3)

stamp "python: $PY $("$PY" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"
PYINC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if [ ! -f "$PYINC/Python.h" ]; then
  echo "device_train: no Python.h in $PYINC: cannot build the extension"; exit 1
fi

# 1. the library (CUDA, sm_90a) in build-dev -- configured exactly as
#    scripts/device_test_cuda.sh configures it, so that whichever of the two runs second
#    only links -- and ops_transformer._C compiled against it (one C file, seconds)
stamp "build (build-dev, sm_90a: target ops_transformer) + _C"
# shellcheck source=device_build.sh
source scripts/device_build.sh
BD=${OT_TRAIN_BUILD_DIR:-build-dev}
if [ -n "${OT_TRAIN_PREBUILT:-}" ] && [ -f "$OT_TRAIN_PREBUILT/libops.tar.gz" ]; then
  # libops_transformer.so built off the device (sm_90a, same CUDA 13) by
  # `scripts/device_train.sh --pack BUILD_DIR`: the device spends no time compiling
  mkdir -p "$BD/logs"
  tar xzf "$OT_TRAIN_PREBUILT/libops.tar.gz" -C "$BD"
  ot_device_deps || exit 1
  stamp "prebuilt library from $OT_TRAIN_PREBUILT ($(cat "$OT_TRAIN_PREBUILT/commit.txt" 2>/dev/null))"
elif ! ot_device_build "$BD" "ops_transformer"; then
  echo "device_train: build failed"; exit 1
fi
PKG=build-train/pkg/ops_transformer
rm -rf build-train/pkg && mkdir -p "$PKG"
cp python/ops_transformer/*.py "$PKG/"
cp -a "$BD"/libops_transformer.so* "$PKG/"
EXT=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if ! cc -O2 -shared -fPIC -Wall -Wno-unused-parameter python/ops_transformer/_C.c -Iinclude \
     -I"$OT_DEVICE_DLPACK_INCLUDE" -I"$PYINC" -L"$BD" -lops_transformer -Wl,-rpath,'$ORIGIN' \
     -o "$PKG/_C$EXT" >"$BD/logs/ext.log" 2>&1; then
  cat "$BD/logs/ext.log"; echo "device_train: extension build failed"; exit 1
fi
export PYTHONPATH="$ROOT/build-train/pkg${PYTHONPATH:+:$PYTHONPATH}"
SKIP_TESTS=${OT_TRAIN_SKIP_TESTS:-0}
SKIP_PROBE=$SKIP_TESTS
[ "${OT_TRAIN_SKIP_PROBE:-0}" = 1 ] && SKIP_PROBE=1
[ "$SKIP_PROBE" = 1 ] || stamp "built; probe of the library's ops on CUDA (bf16):"
[ "$SKIP_PROBE" = 1 ] || timeout 120 "$PY" - <<'PYEOF' 2>&1 | tail -20
import torch, ops_transformer as ot
from ops_transformer import patch
print("has_cuda", ot.has_cuda(), torch.cuda.get_device_name(0))
for k, v in patch.probe_device("cuda", torch.bfloat16).items():
    print(f"  {k:28s} {'ok' if v else 'NOT USABLE (torch code used)'}")
print("  fused linear_cross_entropy:", patch._library_lce_usable(torch.device("cuda")))
PYEOF

# 2. the CUDA cases of the Python tests (the CPU ones run in CI); with
#    OT_TRAIN_TESTS_LAST=1 after the benchmark instead (which then leaves them
#    OT_TRAIN_PYTEST_TIMEOUT seconds of the budget): tests that torch.compile on the GPU
#    take ~14 s each from a cold start (the run of 46066f4: 3 of them 42.5 s, and the
#    benchmark after them was left too little of its budget to run)
PYTEST_TIMEOUT=${OT_TRAIN_PYTEST_TIMEOUT:-150}
run_tests() {
  [ "$SKIP_TESTS" = 1 ] && return 0
  stamp "pytest (CUDA cases)"
  if [ -n "${OT_TRAIN_PYTEST:-}" ]; then
    eval "timeout $PYTEST_TIMEOUT \"\$PY\" -m pytest -q -p no:cacheprovider $OT_TRAIN_PYTEST" \
      >"$OUT/pytest.log" 2>&1
  else
    timeout "$PYTEST_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider -k "cuda" \
      tests/python/test_lm_loss.py tests/python/test_config.py tests/python/test_patch.py \
      tests/python/test_train_eager_ops.py tests/python/test_patch_projections.py \
      >"$OUT/pytest.log" 2>&1
  fi
  echo "pytest rc=$?"; grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -15
}
TESTS_LAST=${OT_TRAIN_TESTS_LAST:-0}
[ "$TESTS_LAST" = 1 ] || run_tests

# 3. the example on CUDA: 0.54b, bf16, AdamW (ops_transformer's where it runs), 2-step accumulation
if [ "$SKIP_TESTS" != 1 ] && [ "${OT_TRAIN_SKIP_EXAMPLE:-0}" != 1 ]; then
  stamp "examples/train_llama.py (0.54b, bf16, CUDA)"
  timeout 120 "$PY" examples/train_llama.py --config 0.54b --batch 4 --seq 2048 --bf16 \
    --grad-accum 2 --steps 4 --no-progress --device cuda --json "$OUT/train_llama.json" \
    >"$OUT/train_llama.log" 2>&1
  echo "train_llama rc=$?"; grep -E "^(model|done|ops_transformer.optim)" "$OUT/train_llama.log" | head -4
fi

# 4. the benchmark, with what is left of the budget
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
[ "$TESTS_LAST" = 1 ] && [ "$SKIP_TESTS" != 1 ] && LEFT=$(( LEFT - PYTEST_TIMEOUT ))
[ "$LEFT" -lt 30 ] && LEFT=30
stamp "bench_training (budget ${LEFT} s)"
timeout $(( LEFT + 30 )) "$PY" bench/bench_training.py --budget-s "$LEFT" --json "$OUT/training.json" \
  --plot "$OUT/training_loss.png" --commit "$COMMIT" --command "bash scripts/device_train.sh" \
  --trace-dir "$OUT/traces" ${OT_TRAIN_BENCH_ARGS:-} \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$?"
[ "$TESTS_LAST" = 1 ] && run_tests
# the profiles' chrome traces (--profile VARIANT@CFG:BxS, or the plan's profile kinds) in
# one file: the run tool returns at most 8 files
if [ -d "$OUT/traces" ]; then
  tar cf "$OUT/traces.tar" -C "$OUT" traces && rm -rf "$OUT/traces"
fi
"$PY" bench/bench_training.py --markdown "$OUT/training.json" >"$OUT/training.md" 2>&1 || true
stamp "done"
grep -E "^ +profile |incomplete|skipped" "$OUT/bench.log" | cut -c1-400
# the A/B rows' per-round ratios (x MEDIAN vs REF over N rounds, MIN-MAX, 95% interval)
# and the fused-add path verdicts (groups 11 / 12), the clocks with them
grep -E " vs [a-z_]+ over [0-9]+ rounds|fused path|path_not_taken" "$OUT/bench.log" \
  | sed -E 's/ loss [0-9.]+ .*//' | cut -c1-400
sed -n '/^case /,$p' "$OUT/bench.log"
