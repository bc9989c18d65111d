#!/usr/bin/env bash
# scripts/run.sh -- the main job: set up, build (CUDA backend when nvcc is found), then run
# ot-bench, which runs, checks and times every op on the best backend present, then ot-run,
# the engine (src/engine) end to end: the tiny Llama configuration with random weights.
# Arguments go to ot-bench (e.g. --op attention_fwd --shape 1x16x2048x128, --list).
# OT_CUDA=ON|OFF forces the CUDA backend on or off.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=setup.sh
source scripts/setup.sh >&2
# CUDA only where it can run: nvcc present and a GPU visible (compiling the kernels on a
# machine without a GPU would only cost minutes; scripts/test.sh compiles them for CI).
if [ -n "${OT_CUDA:-}" ]; then CUDA=$OT_CUDA; elif [ -n "$OT_NVCC" ] && [ -n "$OT_GPU" ]; then CUDA=ON; else CUDA=OFF; fi
ARGS=(-DCMAKE_BUILD_TYPE=Release -DOT_CUDA="$CUDA" -DOT_BUILD_TOOLS=ON)
[ "$CUDA" = ON ] && ARGS+=(-DCMAKE_CUDA_COMPILER="$OT_NVCC")
t0=$(date +%s)
cmake -S . -B build "${ARGS[@]}" >/dev/null
cmake --build build -j"$(nproc)" --target ot-bench ot-run >&2
echo "build (OT_CUDA=$CUDA): $(($(date +%s) - t0))s" >&2
./build/tools/ot-bench "$@"
echo
echo "--- ot-run: the engine on the tiny configuration (random weights), greedy"
exec ./build/tools/ot-run --config tiny --random-weights --seed 1 --prompt-ids 1,2,3,4,5,6,7,8 \
  --max-new-tokens 32
