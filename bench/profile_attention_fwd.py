#!/usr/bin/env python3
"""profile_attention_fwd.py -- one process for ncu: the Hopper forward (bench/attention_shim.c)
and torch SDPA's cuDNN backend on the same bf16 inputs, each warmed up outside the profiled
range, then launched once inside cudaProfilerStart / Stop (run under
`ncu --profile-from-start off ...`; scripts/device_fwd_variants.sh PROFILE=1 does).

  python3 bench/profile_attention_fwd.py SHIM [--d 128] [--s 4096] [--causal] [--env K=V,...]

Batch * seq = 32k tokens, heads * D = 2048 (the benchmark grid). --env: ';'-separated sets of
OT_ATTN_SM90_* switches (K=V,K=V), one more launch of ours inside the range for each."""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shim")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--env", default="")
    a = ap.parse_args()
    S = ba.Shim(a.shim)
    d, s = a.d, a.s
    B, H = 32768 // s, 2048 // d
    q, k, v = ba.make_qkv(B, s, s, H, H, d, torch.bfloat16, "bshd")
    out = torch.empty_like(q)
    lse = torch.empty(B, H, s, device="cuda")
    f = ba.sm90_call(S, q, k, v, out, lse, 1 / math.sqrt(d), -1, 0 if a.causal else -1)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal)
    envs = [dict(kv.split("=") for kv in e.split(",") if kv) for e in a.env.split(";") if e]
    if not f():
        sys.exit("the Hopper forward did not take the call")

    def once():
        f()
        cudnn()
        for env in envs:
            with ba.env_set(env):
                f()
        torch.cuda.synchronize()
    for _ in range(3):
        once()
    rt = torch.cuda.cudart()
    rt.cudaProfilerStart()
    once()
    rt.cudaProfilerStop()
    print(f"profiled D{d} S{s} B{B} H{H} {'causal' if a.causal else 'full'}: ours, cuDNN"
          + "".join(f", ours with {e}" for e in envs), flush=True)


if __name__ == "__main__":
    main()
