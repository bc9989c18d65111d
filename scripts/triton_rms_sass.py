#!/usr/bin/env python3
"""scripts/triton_rms_sass.py -- compile, without a GPU, a Triton kernel of the form
torch.compile (inductor) generates for the benchmark's RMSNorm forward at 16k x 8192 bf16
(bench_fused_ops.hf_rms): one row per program, a first loop over the row's blocks that loads x
with evict_last and sums the squares, a second that loads x again (evict_first) and the weight
(evict_last) and stores out. It prints its registers and the SASS's global loads, stores and
barriers, for comparing the instruction stream with ours (norm.cuh's forward v2).

  python3 -m venv /tmp/tri && /tmp/tri/bin/pip install triton
  /tmp/tri/bin/python scripts/triton_rms_sass.py [R0_BLOCK ...] [--warps 16]

Needs only the triton wheel (its bundled ptxas / nvdisasm / cuobjdump); sm_90a target. With
16-byte divisibility on the pointers (as inductor's kernel metadata gives them) and the row
length a constant, the first loop is unrolled: every load of the row is issued first.
"""
import argparse
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.language.extra import libdevice


@triton.jit
def rms_two_loops(x_ptr, w_ptr, out_ptr, n_rows, n_cols, R0_BLOCK: tl.constexpr):
    n_cols = 8192  # a constant, as inductor's kernels have it (static shapes); n_rows unused
    row = tl.program_id(0)
    cols = tl.arange(0, R0_BLOCK)
    acc = tl.zeros([R0_BLOCK], dtype=tl.float32)
    for off in tl.range(0, n_cols, R0_BLOCK):
        x = tl.load(x_ptr + row * 8192 + off + cols, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = libdevice.rsqrt(tl.sum(acc, 0) / 8192.0 + 1e-6)
    for off in tl.range(0, n_cols, R0_BLOCK):
        w = tl.load(w_ptr + off + cols, eviction_policy="evict_last").to(tl.float32)
        x = tl.load(x_ptr + row * 8192 + off + cols, eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + row * 8192 + off + cols, w * (x * rstd))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("blocks", nargs="*", type=int, default=[2048, 4096, 8192])
    ap.add_argument("--warps", type=int, default=16)
    args = ap.parse_args()
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "n_rows": "i32",
           "n_cols": "i32", "R0_BLOCK": "constexpr"}
    for rb in args.blocks:
        src = ASTSource(fn=rms_two_loops, signature=sig, constexprs={"R0_BLOCK": rb},
                        attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": args.warps, "num_stages": 1})
        with tempfile.TemporaryDirectory() as d:
            cubin = os.path.join(d, "k.cubin")
            open(cubin, "wb").write(k.asm["cubin"])
            res = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin],
                                 capture_output=True, text=True).stdout
            sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", cubin],
                                  capture_output=True, text=True).stdout
        regs = re.search(r"REG:(\d+)", res)
        print(f"R0_BLOCK {rb}, {args.warps} warps: {regs.group(1) if regs else '?'} registers")
        for line in sass.splitlines():
            if re.search(r"\b(LDG|STG|BAR)", line):
                print("   ", re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", line).split(";")[0])


if __name__ == "__main__":
    main()
