#!/usr/bin/env bash
# scripts/test_python.sh -- the Python frontend's tests (scripts/test.sh calls this).
#   1. a virtual environment (.venv-test, git-ignored) with torch (CPU use), numpy,
#      pytest, scikit-build-core and cffi; installed once, reused afterwards
#   2. pip install . (scikit-build-core + CMake; incremental in build-python/)
#   3. pytest tests/python, the docs/PYTHON.md example, and a short run of the
#      binding benchmark
# Environment: OT_PY_VENV (venv folder), OT_PY_CUDA=ON to compile the CUDA backend
# into the Python package (off by default: the CPU tests do not need it), OT_PY_TF_OLD (the
# older transformers release the patch's checkpointing cases run again under; default 5.17.0,
# the GPU machine's; "none" skips that step).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
TMP=${TMPDIR:-/tmp}
VENV=${OT_PY_VENV:-.venv-test}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
if ! "$PY" -c "import torch, numpy, pytest, scikit_build_core, cffi, transformers" 2>/dev/null; then
  echo "--- installing torch, numpy, pytest, scikit-build-core, cffi into $VENV"
  "$PY" -m pip install -q --upgrade pip
  # torch's CPU-only wheels are much smaller; where that index cannot be reached the
  # default wheel from PyPI serves (it runs on the CPU as well).
  "$PY" -m pip install -q --retries 0 --timeout 20 \
      --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null \
    || "$PY" -m pip install -q torch
  "$PY" -m pip install -q numpy pytest "scikit-build-core>=0.10" cffi transformers safetensors
fi

echo "--- pip install . (OT_CUDA=${OT_PY_CUDA:-OFF})"
OT_CUDA=${OT_PY_CUDA:-OFF} "$PY" -m pip install -q --no-build-isolation --no-deps . \
  >"$TMP/ot_pip_install.log" 2>&1 \
  || { cat "$TMP/ot_pip_install.log"; exit 1; }

for doc in README.md docs/PYTHON.md; do
  echo "--- $doc Python example"
  awk '/^<!-- example.py -->/{f=1; next} f && /^```python$/{p=1; next} p && /^```$/{exit} p' \
    "$doc" >"$TMP/ot_python_example.py"
  [ -s "$TMP/ot_python_example.py" ] || { echo "no example in $doc"; exit 1; }
  (cd "$TMP" && "$PY" ot_python_example.py)
done

echo "--- binding overhead (short run; python -m ops_transformer.bench_binding for real)"
(cd "$TMP" && "$PY" -m ops_transformer.bench_binding --iters 300)

echo "--- pytest tests/python"
"$PY" -m pytest -q tests/python

# The patch against the transformers the project's GPU machine runs (5.17: decoder layers
# checkpointed in GradientCheckpointingLayer.__call__, not in the class's forward as in the
# newer release pip gives the venv): the checkpointing and packed-batch cases again, with that
# release first on the path. A packed batch under checkpointing passed here and failed there
# (2026-11-30). Where the pinned release cannot be fetched this step says so and is skipped;
# a test that fails under it fails the run.
TF_OLD=${OT_PY_TF_OLD:-5.17.0}
TF_DIR="$TMP/ot_transformers_$TF_OLD"
if [ "$TF_OLD" != "none" ]; then
  echo "--- pytest test_patch.py -k 'packed or checkpoint' under transformers $TF_OLD"
  # the release and the hub it needs without their dependencies (the venv's numpy, tokenizers,
  # safetensors serve; installing them again under TF_DIR would shadow the venv's), httpx with
  # its own few (anyio, h11, httpcore, idna, certifi)
  if [ -d "$TF_DIR/transformers" ] || {
       "$PY" -m pip install -q --no-deps --target "$TF_DIR" "transformers==$TF_OLD" \
         "huggingface-hub>=1.5,<2" \
       && "$PY" -m pip install -q --target "$TF_DIR" httpx; } >"$TMP/ot_tf_old.log" 2>&1; then
    PYTHONPATH="$TF_DIR" "$PY" -c "import transformers as t; assert t.__version__ == '$TF_OLD', t.__version__"
    PYTHONPATH="$TF_DIR" "$PY" -m pytest -q tests/python/test_patch.py -k "packed or checkpoint"
  else
    tail -3 "$TMP/ot_tf_old.log"
    echo "transformers $TF_OLD not installable here: step skipped"
  fi
fi
