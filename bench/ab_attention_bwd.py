#!/usr/bin/env python3
"""ab_attention_bwd.py -- same-process A/B of attention backward builds against torch SDPA.

Each --shim NAME=PATH is a bench/attention_shim.c library of one build (its own static copy
of the library, loaded with RTLD_LOCAL). Per case (bf16, BSHD, batch * seq = 32k tokens,
heads * D = 2048, as bench_attention.py): forward + backward through the public API of each
build and of torch SDPA's cuDNN and flash backends, and each build's backward alone, in
ROUNDS rounds; CUDA events, median of 20 calls (10 above S 4k) after 3 warm-ups per entry and
round; reported: the median over rounds. The order is balanced (benchutil.round_order,
rows of a Williams Latin square): over len(entries) rounds (2x for an odd count) each entry
takes every position and runs right after every other entry equally often, so that clock
drift and the entry run just before hit every entry alike. ROUNDS defaults to the entry count
(2 per build + 2 peers, always even: 6 for two builds), the fewest rounds that balance it.
Until 2026-11-30 ~12:00 UTC the order was a cyclic rotation, which kept every entry's
predecessor (runs 4-7 of attention_bwd_sm90_ab.json).
FLOPs: 4 B H S^2 D (half for causal) forward, 2.5x that backward (bench_attention.py).

  python3 bench/ab_attention_bwd.py --shim base=A.so --shim new=B.so [--cases D128S4096,...]
      [--rounds N] [--json out.json] [--commit C] [--command CMD]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402  (Shim, make_qkv, time_ms, stream, gemm_tflops)
from benchutil import round_order  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def parse_cases(text):
    out = []
    for c in text.split(","):
        d, s = c.strip().lstrip("D").split("S")
        out.append((int(d), int(s)))
    return out


def bwd_problem(d, s):
    """The grid's bf16 problem at head dim d, length s (batch * seq = 32k tokens, heads * D =
    2048): B, H and the BSHD tensors q, k, v, out, lse, dq, dk, dv, do (do random)."""
    B, H = 32768 // s, 2048 // d
    q, k, v = ba.make_qkv(B, s, s, H, H, d, torch.bfloat16, "bshd")
    out = torch.empty_like(q)
    lse = torch.empty(B, H, s, device="cuda")
    dq, dk, dv, do = (torch.empty_like(x) for x in (q, k, v, q))
    do.normal_()
    return B, H, q, k, v, out, lse, dq, dk, dv, do


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--cases", default="D128S4096,D128S16384,D64S4096")
    ap.add_argument("--rounds", type=int, default=0,
                    help="rounds per case (default: the case's entry count, 2 x builds + 2, "
                         "the smallest balanced number)")
    ap.add_argument("--json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default=" ".join(sys.argv))
    args = ap.parse_args()
    shims = []
    for s in args.shim:
        name, path = s.split("=", 1)
        shims.append((name, ba.Shim(path)))
    gemm = ba.gemm_tflops()
    print(f"cuBLAS bf16 GEMM 8192^3: {gemm:.0f} TFLOP/s", flush=True)
    rows = []
    for d, s in parse_cases(args.cases):
        for causal in (False, True):
            B, H, q, k, v, out, lse, dq, dk, dv, do = bwd_problem(d, s)
            flops = 4 * B * H * s * s * d / (2 if causal else 1)
            case = f"D{d} S{s} {'causal' if causal else 'full'} bf16 B{B} H{H}"
            iters = 20 if s <= 4096 else 10  # S 16k: ~30 ms a call

            def fwd(S):
                return S.lib.shim_attn_fwd(ba.stream(), 3, B, H, H, d, s, s, int(causal),
                                           q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                           out.data_ptr(), lse.data_ptr())

            def bwd(S):
                return S.lib.shim_attn_bwd(ba.stream(), 3, B, H, H, d, s, s, int(causal),
                                           q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                           out.data_ptr(), do.data_ptr(), lse.data_ptr(),
                                           dq.data_ptr(), dk.data_ptr(), dv.data_ptr())

            entries = []  # (key, fn, flop count)
            for name, S in shims:
                def fb(S=S):
                    if fwd(S) or bwd(S):
                        raise RuntimeError(S.err())

                def b_only(S=S):
                    if bwd(S):
                        raise RuntimeError(S.err())
                entries.append((("fwd_bwd", name), fb, 3.5 * flops))
                entries.append((("bwd", name), b_only, 2.5 * flops))
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            qg, kg, vg = (x.detach().clone().requires_grad_() for x in (qt, kt, vt))
            dot = do.transpose(1, 2)
            # torch.autograd.grad, not .backward(): the gradients come back as new tensors, as
            # ours are written into dq / dk / dv; .backward() would add each call's into the
            # leaves' .grad (three elementwise adds, ~0.3 ms at these shapes, in the peers' time).
            for pname, be in (("torch SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                              ("torch SDPA flash", SDPBackend.FLASH_ATTENTION)):
                def pfb(be=be):
                    with sdpa_kernel([be]):
                        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        torch.autograd.grad(o, (qg, kg, vg), dot)
                entries.append((("fwd_bwd", pname), pfb, 3.5 * flops))
            res = {e[0]: [] for e in entries}
            for r in range(args.rounds or len(entries)):
                for key, fn, fl in (entries[i] for i in round_order(len(entries), r)):
                    try:
                        if key[0] == "bwd":  # out / lse of this build, or no timing
                            S = dict(shims)[key[1]]
                            if fwd(S):
                                raise RuntimeError(f"forward before the timing: {S.err()}")
                        res[key].append(fl / ba.time_ms(fn, iters=iters) / 1e9)
                    except Exception as e:  # a peer unavailable for this shape
                        print(f"{case} {key}: failed: {str(e)[:100]}", flush=True)
            med = {k_: round(statistics.median(v_), 1) for k_, v_ in res.items() if v_}
            peers = {k_[1]: v_ for k_, v_ in med.items() if k_[1].startswith("torch")}
            best = max(peers.values()) if peers else None
            line = [f"{case:32s}"] + [f"{p[11:]} {v_:.1f}" for p, v_ in peers.items()]
            for name, _ in shims:
                fbv, bv = med.get(("fwd_bwd", name)), med.get(("bwd", name))
                if fbv is None:
                    continue
                line.append(f"{name} {fbv:.1f} ({fbv / best:.3f}x, bwd {bv})" if best else
                            f"{name} {fbv:.1f}")
                rows.append({"op": "attention_fwd_bwd", "case": case, "metric": "TFLOP/s",
                             "build": name, "ours": fbv, "bwd_only_TFLOPs": bv,
                             "rounds": [round(x, 1) for x in res[("fwd_bwd", name)]],
                             "bwd_rounds": [round(x, 1) for x in res[("bwd", name)]],
                             "peers": peers,
                             "ratio_best_peer": round(fbv / best, 3) if best else None,
                             "fraction_of_ceiling": round(fbv / gemm, 3)})
            print("  ".join(line), flush=True)
            if args.json:  # after every case: a run cut by its time limit keeps what it timed
                ba.write_json(args, gemm, rows)
            del q, k, v, out, lse, dq, dk, dv, do, qg, kg, vg
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
