#!/usr/bin/env python3
"""scripts/fused_order_probe.py -- does a norm forward's measured rate depend on what ran before
it? bench_fused_ops.py's time_ms (its --warm-ms warm-up included) of our RMSNorm / LayerNorm
forward (16k x H bf16) in a fixed sequence: ours three times, then each torch peer (eager,
F.rms_norm / F.layer_norm, torch.compile) followed by ours twice. Prints each timing.

  python3 scripts/fused_order_probe.py --shim build-dev/libfused_ops_shim.so [--hidden 8192]
      [--warm-ms 100] [--layer 1] [--l2-scrub-mb 256]"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bench_fused_ops as bf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--warm-ms", type=float, default=100.0)
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--l2-scrub-mb", type=int, default=0, help="bench_fused_ops.py --l2-scrub-mb")
    a = ap.parse_args()
    bf.WARM_MS[0] = a.warm_ms
    bf.L2_SCRUB_MB[0] = a.l2_scrub_mb
    S = bf.Shim(a.shim)
    N, H, dt, eps = a.rows, a.hidden, torch.bfloat16, 1e-5
    sets = [dict(x=bf.rnd(N, H, dtype=dt)) for _ in range(2)]
    w = bf.rnd(H, dtype=dt, lo=0.5, hi=1.5)
    b = bf.rnd(H, dtype=dt)
    outs = [torch.empty(N, H, dtype=dt, device="cuda") for _ in range(2)]
    mean = torch.empty(N, device="cuda")
    rstd = torch.empty(N, device="cuda")
    layer = a.layer
    ours = [bf.norm_fwd_call(S, layer, s["x"], None, w, b if layer else None, eps, outs[i], None,
                             mean if layer else None, rstd) for i, s in enumerate(sets)]
    eager = (lambda x: bf.eager_ln(x, w, b, eps)) if layer else (lambda x: bf.hf_rms(x, w, eps))
    fused = (lambda x: F.layer_norm(x, (H,), w, b, eps)) if layer else (lambda x: F.rms_norm(x, (H,), w, eps))
    comp = torch.compile(eager, dynamic=False)
    peers = {"torch eager": eager, "torch fused": fused, "torch.compile": comp}
    nbytes = 2 * N * H * 2
    tb = lambda ms: nbytes / (ms * 1e-3) / 1e12
    name = "layernorm" if layer else "rmsnorm"
    for k in range(3):
        print(f"{name} {H} ours #{k}: {tb(bf.time_ms(ours)):.3f} TB/s", flush=True)
    for pn, pf in peers.items():
        t = bf.time_ms([lambda s=s: pf(s["x"]) for s in sets])
        print(f"{name} {H} {pn}: {tb(t):.3f} TB/s", flush=True)
        for k in range(2):
            print(f"{name} {H}   ours after {pn} #{k}: {tb(bf.time_ms(ours)):.3f} TB/s", flush=True)


if __name__ == "__main__":
    main()
