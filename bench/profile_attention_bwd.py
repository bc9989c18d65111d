#!/usr/bin/env python3
"""profile_attention_bwd.py -- one profiled forward + backward of ours and of torch SDPA's
cuDNN backend in one process, for Nsight Compute (run it under `ncu --profile-from-start off`:
only the calls between cudaProfilerStart / Stop are profiled, after warm-ups).

Per case (bf16, BSHD, batch * seq = 32k tokens, heads * D = 2048, as bench_attention.py):
our forward + backward through the shim (prep, main and dQ-convert kernels), then cuDNN's
forward + backward (torch.autograd.grad). Without the profiler it also prints CUDA-event
times (median of 10) of both, backward alone for ours.

  ncu --clock-control none --profile-from-start off ... \
      python3 bench/profile_attention_bwd.py --shim libattention_shim.so [--cases D128S4096c0,...]
  case: D<d>S<s>c<0|1> (c1: causal)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402
from ab_attention_bwd import bwd_problem  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--cases", default="D128S4096c0")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--time", action="store_true", help="CUDA-event timings, no profiled range")
    args = ap.parse_args()
    S = ba.Shim(args.shim)
    cudart = torch.cuda.cudart()
    for c in args.cases.split(","):
        d, rest = c.lstrip("D").split("S")
        s, causal = rest.split("c")
        d, s, causal = int(d), int(s), bool(int(causal))
        B, H, q, k, v, out, lse, dq, dk, dv, do = bwd_problem(d, s)

        def fwd():
            assert S.lib.shim_attn_fwd(ba.stream(), 3, B, H, H, d, s, s, int(causal),
                                       q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                       out.data_ptr(), lse.data_ptr()) == 0, S.err()

        def bwd():
            assert S.lib.shim_attn_bwd(ba.stream(), 3, B, H, H, d, s, s, int(causal),
                                       q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                       out.data_ptr(), do.data_ptr(), lse.data_ptr(),
                                       dq.data_ptr(), dk.data_ptr(), dv.data_ptr()) == 0, S.err()

        qg, kg, vg = (x.transpose(1, 2).detach().clone().requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2)

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                torch.autograd.grad(o, (qg, kg, vg), dot)

        flops = 4 * B * H * s * s * d / (2 if causal else 1)
        for _ in range(3):
            fwd(); bwd()
            if not args.no_cudnn:
                cudnn()
        torch.cuda.synchronize()
        if args.time:
            fb = ba.time_ms(lambda: (fwd(), bwd()), iters=10)
            fwd()
            b_ = ba.time_ms(bwd, iters=10)
            line = f"{c}: ours fwd+bwd {fb:.3f} ms ({3.5 * flops / fb / 1e9:.1f} TFLOP/s), " \
                   f"bwd {b_:.3f} ms ({2.5 * flops / b_ / 1e9:.1f})"
            if not args.no_cudnn:
                cd = ba.time_ms(cudnn, iters=10)
                line += f"; cuDNN fwd+bwd {cd:.3f} ms ({3.5 * flops / cd / 1e9:.1f})"
            print(line, flush=True)
        else:
            cudart.cudaProfilerStart()
            fwd(); bwd()
            if not args.no_cudnn:
                cudnn()
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()
            print(f"{c}: profiled", flush=True)
        del q, k, v, out, lse, dq, dk, dv, do, qg, kg, vg
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
