#!/usr/bin/env python3
"""scripts/inductor_norm_code.py -- the Triton code torch.compile (inductor) generates for the
fused-ops benchmark's RMSNorm forward (bench_fused_ops.hf_rms, bf16, static shapes), printed
with its launch configuration: what our kernel is compared against at 16k x 8192.

  python3 scripts/inductor_norm_code.py [--rows 16384] [--hidden 8192]

Needs a CUDA GPU and torch with inductor (the device machine)."""
import argparse
import re

import torch
from torch._inductor.utils import run_and_get_code


def hf_rms(x, w, eps):  # bench/bench_fused_ops.py's hf_rms
    dt = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=8192)
    a = ap.parse_args()
    x = torch.randn(a.rows, a.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(a.hidden, device="cuda", dtype=torch.bfloat16) + 0.5
    f = torch.compile(hf_rms, dynamic=False)
    _, codes = run_and_get_code(f, x, w, 1e-6)
    for c in codes:
        # the kernels (@triton.jit bodies with their heuristics) and the launch lines
        keep = False
        for line in c.splitlines():
            if line.startswith("@triton_heuristics") or line.startswith("@triton.jit"):
                keep = True
            if keep:
                print(line)
            if keep and line.strip() == "''', device_str='cuda')":
                keep = False
                print()
            elif not keep and re.search(r"\.run\(|num_warps|R0_BLOCK|XBLOCK", line):
                print(line)
    # the configuration autotuning chose (the launchers left after it)
    import gc
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    for o in gc.get_objects():
        try:
            tuner = isinstance(o, CachingAutotuner)
        except ReferenceError:  # a weak proxy whose object is gone
            continue
        if tuner:
            for ln in getattr(o, "launchers", []):
                print(f"chosen: {getattr(o.fn, '__name__', o.fn)} {getattr(ln, 'config', '?')} "
                      f"registers {getattr(ln, 'n_regs', '?')} spills {getattr(ln, 'n_spills', '?')}")


if __name__ == "__main__":
    main()
