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
      [--variant NAME=VAR=VAL,... ...]
  case: D<d>S<s>c<0|1> (c1: causal)
--variant (repeatable): our forward + backward once more per variant, its switches set around
the calls (e.g. --variant red=OT_ATTN_BWD_SM90_DQ=red in an experiment build: the kernels differ
by name, attn_bwd_sm90_kernel<T, D, X>); without it, once with no switch.

  python3 bench/profile_attention_bwd.py --summarize ncu_raw.csv
prints, from `ncu --import R --page raw --csv` of such a run, the main kernels' (ours, cuDNN's
backward: the launches over 0.3 ms) duration, cycles and every collected shared-memory,
L1 / LSU and tensor-pipe metric side by side (what names the sections collected: none is
asked for by name, so a metric the installed ncu lacks cannot fail the profile).
"""
import argparse
import csv
import os
import re
import sys

SUMMARY_PAT = re.compile(r"shared|l1tex__data_bank|l1tex__data_pipe_lsu|l1tex__throughput|"
                         r"tensor|gmma|pipe_lsu|inst_executed_op_|lsu_mem|sm__throughput|"
                         r"smsp__cycles_active|sm__cycles_elapsed|dram__throughput|lts__t_bytes")


def summarize(path):
    """The main kernels of an ncu raw CSV side by side (see the module doc)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    hi = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head, units, data = rows[hi], rows[hi + 1], rows[hi + 2:]
    col = {h: i for i, h in enumerate(head)}
    dur = col.get("gpu__time_duration.sum")

    def num(x):
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return None
    scale = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "msecond": 1.0, "ms": 1.0, "nsecond": 1e-6}
    kern = []
    for r in data:
        if len(r) != len(head):
            continue
        ms = num(r[dur]) * scale.get(units[dur], 1.0) if dur is not None and num(r[dur]) else 0
        if ms >= 0.3:
            name = r[col["Kernel Name"]]
            short = ("ours X" + m.group(1) if (m := re.search(r"attn_bwd_sm90_kernel<[^>]*?(\d+)\s*>",
                                                              name)) else name[:40])
            kern.append((short, r, ms))
    if not kern:
        print("no kernel of 0.3 ms or more in", path)
        return 1
    print(f"{'metric':80s} " + " ".join(f"{k[0][:22]:>22s}" for k in kern))
    print(f"{'duration (ms)':80s} " + " ".join(f"{k[2]:22.3f}" for k in kern))
    for h in head:
        if SUMMARY_PAT.search(h):
            vals = [k[1][col[h]] for k in kern]
            if any(v not in ("", "n/a") for v in vals):
                print(f"{(h + ' (' + units[col[h]] + ')')[:80]:80s} " +
                      " ".join(f"{v[:22]:>22s}" for v in vals))
    return 0


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--summarize":
    sys.exit(summarize(sys.argv[2]))   # no torch needed for this

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402
from ab_attention_bwd import bwd_problem  # noqa: E402
from benchutil import env_set  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--cases", default="D128S4096c0")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--time", action="store_true", help="CUDA-event timings, no profiled range")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=VAR=VAL,...: ours again with these switches set")
    args = ap.parse_args()
    variants = [("default", {})] if not args.variant else []
    for v_ in args.variant:
        name, _, envs = v_.partition("=")
        variants.append((name, dict(e.split("=", 1) for e in envs.split(",") if e)))
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
            for _n, env in variants:
                with env_set(env):
                    fwd(); bwd()
            if not args.no_cudnn:
                cudnn()
        torch.cuda.synchronize()
        if args.time:
            line = f"{c}:"
            for vname, env in variants:
                with env_set(env):
                    fb = ba.time_ms(lambda: (fwd(), bwd()), iters=10)
                    fwd()
                    b_ = ba.time_ms(bwd, iters=10)
                line += f" ours[{vname}] fwd+bwd {fb:.3f} ms ({3.5 * flops / fb / 1e9:.1f} " \
                        f"TFLOP/s), bwd {b_:.3f} ms ({2.5 * flops / b_ / 1e9:.1f});"
            if not args.no_cudnn:
                cd = ba.time_ms(cudnn, iters=10)
                line += f" cuDNN fwd+bwd {cd:.3f} ms ({3.5 * flops / cd / 1e9:.1f})"
            print(line, flush=True)
        else:
            cudart.cudaProfilerStart()
            for _n, env in variants:
                with env_set(env):
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
