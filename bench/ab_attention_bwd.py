#!/usr/bin/env python3
"""ab_attention_bwd.py -- same-process A/B of attention backward builds against torch SDPA.

Each --shim NAME=PATH is a bench/attention_shim.c library of one build (its own static copy of
the library, loaded with RTLD_LOCAL). Per case (bf16, BSHD, batch * seq = 32k tokens, heads *
D = 2048, as bench_attention.py): forward + backward through the public API of each build and
of torch SDPA's cuDNN and flash backends, and each build's backward alone, in ROUNDS rounds;
CUDA events, median of 20 calls (10 above S 4k) after 3 warm-ups and --warm-ms (100; since
2026-12-03) of more calls per entry and round; reported: the median over rounds. The order is
balanced (benchutil.round_order, rows of a Williams Latin square): over len(entries) rounds
(2x for an odd count) each entry takes every position and runs right after every other entry
equally often, so that clock drift and the entry run just before hit every entry alike. ROUNDS
defaults to the entry count (2 per build + 2 peers, always even: 6 for two builds), the fewest
rounds that balance it. Until 2026-11-30 ~12:00 UTC the order was a cyclic rotation, which
kept every entry's predecessor (runs 4-7 of attention_bwd_sm90_ab.json). FLOPs: 4 B H S^2 D
(half for causal) forward, 2.5x that backward (bench_attention.py).

A shim may carry environment settings, NAME=PATH@VAR=VAL[,VAR=VAL...]: set around each of its
calls (checks and timed entries), so that one experiment build can be timed with and without a
switch it reads per call (e.g. --shim x0=X.so --shim red=X.so@OT_ATTN_BWD_SM90_DQ=red).
--check first runs float64 checks of every shim's forward + backward (check_bwd: GQA / MQA,
causal with Sq != Sk and keyless rows, split units, fp16; outputs NaN-poisoned), records which
main kernel ran (the torch profiler's kernel names: attn_bwd_sm90_kernel<T, D, X>), and times
nothing if a check fails or a shim named in --expect-x NAME=X ran another X (a switch the
build does not read runs the default kernel silently).

--wait-for FILE: after the checks, wait (at most 600 s) until FILE exists before any timing, so
that the import and the checks run beside other work of the same device call (tests,
compute-sanitizer; scripts/device_attention_bwd_sm90.sh AB_EARLY=1) and the timing does not.

  python3 bench/ab_attention_bwd.py --shim base=A.so --shim new=B.so [--cases D128S4096,...]
      [--rounds N] [--check] [--expect-x NAME=X|NAME=D:X,D:X] [--wait-for FILE] [--json out.json]
      [--commit C] [--command CMD]
"""
import argparse
import math
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402  (Shim, make_qkv, time_ms, stream, gemm_tflops)
from benchutil import env_set, round_order  # noqa: E402
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


def parse_shim(text):
    """NAME=PATH[@VAR=VAL,...] -> (name, path, env dict)."""
    name, rest = text.split("=", 1)
    path, _, envs = rest.partition("@")
    env = dict(e.split("=", 1) for e in envs.split(",") if e)
    return name, path, env


def reference_bwd(q, k, v, do, causal):
    """float64 dq, dk, dv of softmax(q k^T / sqrt(D)) v (BSHD, GQA by repeating the kv heads,
    causal bottom-right: key j visible to query i when j <= i + Sk - Sq; rows with no visible
    key: output 0, no gradient)."""
    B, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    kr, vr = (x.repeat_interleave(hq // hkv, dim=2) for x in (kd, vd))
    s = torch.einsum("bihd,bjhd->bhij", qd, kr) / math.sqrt(d)
    if causal:
        vis = (torch.arange(sk, device=q.device)[None, :] <=
               torch.arange(sq, device=q.device)[:, None] + (sk - sq))
        s = s.masked_fill(~vis, -1e30)   # finite: a keyless row's softmax stays finite ...
        keep = vis.any(-1).double()[None, None, :, None]
    p = torch.softmax(s, dim=-1)
    if causal:
        p = p * keep                     # ... and is dropped here (zero output, no gradient)
    o = torch.einsum("bhij,bjhd->bihd", p, vr)
    return torch.autograd.grad(o, (qd, kd, vd), do.double())


def main_kernel_x(fn):
    """The X (experiment bits) of the attn_bwd_sm90_kernel instances fn launched, from the
    torch profiler's kernel names; an empty set: none ran (the portable backward) or the
    profiler saw no kernels."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    xs = set()
    for e in prof.key_averages():
        m = (re.search(r"attn_bwd_sm90_kernel<[^<>]*?,\s*(?:\(int\))?(\d+)\s*,\s*(?:\(int\))?"
                       r"(\d+)\s*>", e.key) or
             re.search(r"attn_bwd_sm90_kernelI\w+?Li(\d+)ELi(\d+)EE", e.key))  # demangled or not
        if m:
            xs.add(int(m.group(2)))
    return xs


def check_bwd(name, S, env, expect_x=None):
    """float64 checks of one shim's forward + backward (public API, its dispatch) on shapes
    that reach every part of the Hopper backward: GQA / MQA (the query head of a walk
    index), D 128 / 64, causal with refilled stages, Sq > Sk (whole keyless query tiles),
    the split units of a non-causal last partial wave (S 129 MQA8 B2, S 1000 B2), fp16.
    Outputs NaN-poisoned; error: max |got - ref| over max |ref| per gradient, at most 2e-2
    (bf16) / 5e-3 (fp16). expect_x: the X every shape must run, or {head dim: X}.
    Returns (failures, checked, kernel Xs seen)."""
    fails, n, seen = 0, 0, set()
    for (B, sq, sk, hq, hkv, d, causal, dt) in (
            (1, 100, 1000, 8, 2, 128, 1, 3), (2, 129, 129, 8, 1, 64, 0, 3),
            (2, 700, 130, 4, 2, 128, 1, 3), (2, 1000, 1000, 2, 2, 128, 0, 2),
            (1, 1000, 1000, 8, 2, 64, 1, 3), (2, 1000, 1000, 4, 2, 128, 1, 3),
            (1, 64, 64, 2, 1, 64, 1, 2)):
        dtype = torch.bfloat16 if dt == 3 else torch.float16
        torch.manual_seed(sq * 7 + sk * 13 + d + hq)
        q, k, v = ba.make_qkv(B, sq, sk, hq, hkv, d, dtype, "bshd")
        do = torch.randn_like(q)
        out = torch.empty_like(q)
        lse = torch.empty(B, hq, sq, device="cuda")
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))

        def call():
            if S.lib.shim_attn_fwd(ba.stream(), dt, B, hq, hkv, d, sq, sk, causal, q.data_ptr(),
                                   k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr()) or \
               S.lib.shim_attn_bwd(ba.stream(), dt, B, hq, hkv, d, sq, sk, causal, q.data_ptr(),
                                   k.data_ptr(), v.data_ptr(), out.data_ptr(), do.data_ptr(),
                                   lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()):
                raise RuntimeError(S.err())
        case = (f"{name} B{B} sq{sq} sk{sk} h{hq}/{hkv} d{d} {'causal' if causal else 'full'} "
                f"{str(dtype)[6:]}")
        try:
            with env_set(env):
                xs = main_kernel_x(call)
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {case}: {str(e)[:200]}", flush=True)
            fails, n = fails + 1, n + 1
            continue
        seen |= xs
        refs = reference_bwd(q, k, v, do, causal)
        tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
        msg, ok = [], True
        for gname, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
            scale = ref.abs().max().item() or 1.0
            e = ((got.double() - ref).abs().max().item()) / scale
            nan = bool(torch.isnan(got).any())
            ok = ok and not nan and e <= tol
            msg.append(f"{gname} {e:.2e}{' NaN' if nan else ''}")
        want = expect_x.get(d) if isinstance(expect_x, dict) else expect_x
        if want is not None and xs != {want}:
            ok = False
            msg.append(f"main kernel X {sorted(xs)}, expected {want}")
        else:
            msg.append(f"X {sorted(xs)}")
        print(f"{'ok  ' if ok else 'FAIL'} {case}: " + ", ".join(msg), flush=True)
        fails, n = fails + (not ok), n + 1
    return fails, n, seen


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", action="append", required=True, help="NAME=PATH[@VAR=VAL,...]")
    ap.add_argument("--cases", default="D128S4096,D128S16384,D64S4096")
    ap.add_argument("--rounds", type=int, default=0,
                    help="rounds per case (default: the case's entry count, 2 x builds + 2, "
                         "the smallest balanced number)")
    ap.add_argument("--check", action="store_true",
                    help="float64 checks of every shim first (check_bwd); no timing on a failure")
    ap.add_argument("--expect-x", action="append", default=[],
                    help="NAME=X or NAME=D:X[,D:X] (per head dim, e.g. new=128:1,64:0): the "
                         "shim's checks must run attn_bwd_sm90_kernel<T, D, X>")
    ap.add_argument("--wait-for", help="FILE: wait until it exists before timing")
    ap.add_argument("--warm-ms", type=float, default=ba.WARM_MS_DEFAULT,
                    help="wall ms of untimed calls before each entry's timed calls in each round "
                         "(bench_attention.time_ms; 0: none, as before 2026-12-03)")
    ap.add_argument("--json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default=" ".join(sys.argv))
    args = ap.parse_args(argv)
    # what bench_attention.write_json records under "timing" (its own options there): the
    # order here is always balanced, 20 calls a block (10 above S 4k)
    args.order, args.iters = "balanced", "20 (10 above S 4096)"
    return args


def main():
    args = parse_args()
    ba.WARM_MS_DEFAULT = args.warm_ms
    shims, envs, loaded = [], {}, {}
    for s in args.shim:
        name, path, env = parse_shim(s)
        if path not in loaded:  # one library copy a path: switches select, not copies
            loaded[path] = ba.Shim(path)
        shims.append((name, loaded[path]))
        envs[name] = env
    if args.check:
        expect = {n: ({int(a): int(b) for a, b in (p.split(":") for p in x.split(","))}
                      if ":" in x else int(x))
                  for n, x in (e.split("=", 1) for e in args.expect_x)}
        bad = 0
        for name, S in shims:
            f, n, seen = check_bwd(name, S, envs[name], expect.get(name))
            print(f"check {name} ({envs[name] or 'no switches'}): {n - f}/{n} passed, "
                  f"main kernel X {sorted(seen)}", flush=True)
            bad += f
        if bad:
            print("CHECK FAILED: no timing", flush=True)
            return 3
    if args.wait_for:
        t0 = time.time()
        while not os.path.exists(args.wait_for) and time.time() - t0 < 600:
            time.sleep(0.2)
        print(f"waited {time.time() - t0:.1f} s for {args.wait_for}", flush=True)
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
                def fb(S=S, env=envs[name]):
                    with env_set(env):
                        if fwd(S) or bwd(S):
                            raise RuntimeError(S.err())

                def b_only(S=S, env=envs[name]):
                    with env_set(env):
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
