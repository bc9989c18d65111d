#!/usr/bin/env bash
# scripts/test_python.sh -- the Python frontend's tests (scripts/test.sh calls this).
#   1. a virtual environment (.venv-test, git-ignored) with torch (CPU use), numpy,
#      pytest, scikit-build-core and cffi; installed once, reused afterwards
#   2. pip install . (scikit-build-core + CMake; incremental in build-python/)
#   3. pytest tests/python, the docs/PYTHON.md example, and a short run of the
#      binding benchmark
# Environment: OT_PY_VENV (venv folder), OT_PY_CUDA=ON to compile the CUDA backend
# into the Python package (off by default: the CPU tests do not need it).
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
