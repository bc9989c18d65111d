#!/usr/bin/env python3
"""bench_decode.py -- paged decode attention (ot_paged_attention on CUDA) against torch
SDPA, and the arena allocator against cudaMalloc / cudaMallocAsync.

Our op is called through bench/decode_shim.c (ctypes, raw device pointers of torch
tensors, torch's current stream): the public op, validation included.

  python3 bench/bench_decode.py --shim build/libdecode_shim.so [--arena-bin build/arena_bench] \
      [--json bench/results/decode.json] [--check]

Decode: bf16, heads_q 32, heads_kv 8, head_dim 128, one query token per sequence;
batch x context 1 x 64k, 16 x 4k, 64 x 1k, 64 x 4k; page sizes 16 and 64; each
sequence's pages a random permutation of the pool. Bytes = K and V read once + q read +
out written. Ceiling: a read-only reduction (torch.sum of a 4 GiB bf16 tensor, fp32
accumulation) measured in the same run. Peers: SDPA on a contiguous cache [B, Hkv, S, D]
with the cuDNN and the flash backend (GQA decode as Hkv heads of `group` query rows: one
query token needs no mask, so this is exact and reads K / V once), and the paged
gather (index_select of each sequence's pages into [B, Hkv, S, D]) followed by SDPA
(default backend choice), timed together. Timing as bench_fused_ops.py: CUDA events
around 5 calls after a ~1 ms torch.cuda._sleep, median of 25.
"""
import argparse
import ctypes
import datetime
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fused_ops import time_ms as _time_ms  # noqa: E402

C = ctypes
i64, vp, cint = C.c_int64, C.c_void_p, C.c_int
HQ, HKV, D = 32, 8, 128
DEV = "cuda"
SHAPES = [(1, 65536), (16, 4096), (64, 1024), (64, 4096)]
PAGES = [16, 64]
# forced split counts timed as variants of a row (TB/s), to check the planner's choice
SWEEP = {(1, 65536): [16, 64], (16, 4096): [1, 4], (64, 1024): [2]}


class Shim:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        L = self.lib
        L.shim_init.argtypes = [cint]
        L.shim_last_error.restype = C.c_char_p
        L.shim_paged_attention.argtypes = [vp, cint] + [i64] * 8 + [vp] * 9 + [cint]
        if L.shim_init(torch.cuda.current_device()) != 0:
            raise RuntimeError("shim_init: " + L.shim_last_error().decode())

    def paged(self, q, cu, kp, vp_, indptr, indices, lpl, out, lse=None, causal=1):
        tq, hq, d = q.shape
        st = self.lib.shim_paged_attention(
            torch.cuda.current_stream().cuda_stream, 3 if q.dtype == torch.bfloat16 else 2,
            tq, hq, kp.shape[1], d, kp.shape[0], kp.shape[2], indptr.numel() - 1, indices.numel(),
            q.data_ptr(), cu.data_ptr(), kp.data_ptr(), vp_.data_ptr(), indptr.data_ptr(),
            indices.data_ptr(), lpl.data_ptr(), out.data_ptr(),
            lse.data_ptr() if lse is not None else None, causal)
        if st != 0:
            raise RuntimeError("ot_paged_attention: " + self.lib.shim_last_error().decode())


def time_ms(fn, iters=25, inner=5, warmup=3):
    """bench_fused_ops.time_ms (a ~1 ms torch.cuda._sleep, then events around `inner`
    calls; median of `iters`) for one function."""
    return _time_ms([fn], iters=iters, inner=inner, warmup=warmup)


def read_ceiling():
    x = torch.randn(2 << 30, device=DEV, dtype=torch.bfloat16)  # 4 GiB
    ms = time_ms(lambda: torch.sum(x, dtype=torch.float32), iters=15, inner=2)
    tbps = x.numel() * 2 / (ms * 1e-3) / 1e12
    del x
    torch.cuda.empty_cache()
    return tbps


def make_case(b, ctx, bs, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    npb = (ctx + bs - 1) // bs
    P = b * npb + 3
    kp = torch.randn(P, HKV, bs, D, device=DEV, dtype=dtype, generator=g)
    vp_ = torch.randn(P, HKV, bs, D, device=DEV, dtype=dtype, generator=g)
    perm = torch.randperm(P, device=DEV, generator=g)[: b * npb].to(torch.int32)
    indptr = torch.arange(0, b * npb + 1, npb, device=DEV, dtype=torch.int32)
    lpl = torch.full((b,), ctx - (npb - 1) * bs, device=DEV, dtype=torch.int32)
    q = torch.randn(b, HQ, D, device=DEV, dtype=dtype, generator=g)
    cu = torch.arange(0, b + 1, device=DEV, dtype=torch.int32)
    return dict(kp=kp, vp=vp_, indices=perm, indptr=indptr, lpl=lpl, q=q, cu=cu, npb=npb)


def gather(c, b, ctx, bs):
    """[B, Hkv, S, D] contiguous from the pages (the gather peer's first half)."""
    idx = c["indices"].long()
    k = c["kp"].index_select(0, idx).view(b, c["npb"], HKV, bs, D)
    v = c["vp"].index_select(0, idx).view(b, c["npb"], HKV, bs, D)
    k = k.permute(0, 2, 1, 3, 4).reshape(b, HKV, c["npb"] * bs, D)[:, :, :ctx]
    v = v.permute(0, 2, 1, 3, 4).reshape(b, HKV, c["npb"] * bs, D)[:, :, :ctx]
    return k, v


def sdpa_grouped(q, k, v):
    """Decode GQA as Hkv heads of `group` query rows (exact for one query token)."""
    b = q.shape[0]
    qg = q.view(b, HKV, HQ // HKV, D)
    return F.scaled_dot_product_attention(qg, k, v).reshape(b, HQ, D)


def check(shim):
    """Ours against float32 attention on the gathered cache, incl. the bench shapes."""
    ok = True
    for (b, ctx) in [(3, 1000), (1, 65536), (16, 4096), (64, 1024)]:
        for bs in PAGES:
            c = make_case(b, ctx, bs, seed=b + ctx + bs)
            k, v = gather(c, b, ctx, bs)
            ref = sdpa_grouped(c["q"].float(), k.float(), v.float())
            for kern in ("auto", "split", "stream"):
                os.environ["OT_PAGED_KERNEL"] = kern
                try:
                    out = torch.full_like(c["q"], float("nan"))
                    shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"], c["indices"],
                               c["lpl"], out)
                finally:
                    os.environ.pop("OT_PAGED_KERNEL", None)
                err = (out.float() - ref).abs().max().item()
                good = err < 2e-2 and not torch.isnan(out).any().item()
                ok &= good
                print(f"check B{b} ctx {ctx} page {bs} {kern}: max |err| {err:.2e} "
                      f"{'ok' if good else 'FAIL'}")
    return ok


def probe(shim):
    """Per-call time of tiny decodes (the fixed cost: launches, start, merge), each kernel."""
    for (b, ctx) in [(1, 256), (64, 16), (16, 512)]:
        c = make_case(b, ctx, 16, seed=5)
        out = torch.empty_like(c["q"])
        call = lambda: shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],  # noqa: E731
                                  c["indices"], c["lpl"], out)
        res = []
        for kern in ("split", "stream"):
            os.environ["OT_PAGED_KERNEL"] = kern
            try:
                res.append(f"{kern} {time_ms(call) * 1e3:.1f} us")
            finally:
                os.environ.pop("OT_PAGED_KERNEL", None)
        print(f"probe B{b} x ctx {ctx} page 16: " + ", ".join(res), flush=True)


def bench(shim, ceiling):
    rows = []
    for (b, ctx) in SHAPES:
        # peers on a contiguous cache (same bytes), once per shape
        c0 = make_case(b, ctx, 16, seed=1)
        kc, vc = (t.contiguous() for t in gather(c0, b, ctx, 16))
        del c0
        peers_contig = {}
        for name, be in (("torch SDPA cuDNN (contiguous)", SDPBackend.CUDNN_ATTENTION),
                         ("torch SDPA flash (contiguous)", SDPBackend.FLASH_ATTENTION)):
            qx = torch.randn(b, HQ, D, device=DEV, dtype=torch.bfloat16)
            try:
                with sdpa_kernel([be]):
                    peers_contig[name] = (time_ms(lambda: sdpa_grouped(qx, kc, vc)),
                                          sdpa_grouped(qx, kc, vc), qx)
            except RuntimeError as e:
                print(f"  {name}: unavailable ({str(e).splitlines()[0][:80]})")
        del kc, vc
        torch.cuda.empty_cache()
        nbytes = 2 * b * ctx * HKV * D * 2 + 2 * b * HQ * D * 2
        for bs in PAGES:
            c = make_case(b, ctx, bs, seed=2 + bs)
            out = torch.empty_like(c["q"])
            call = lambda: shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],  # noqa: E731
                                      c["indices"], c["lpl"], out)
            ms = time_ms(call)
            variants = {}
            # each kernel forced, then forced split counts of the split kernel (environment
            # read at each call)
            runs = [{"OT_PAGED_KERNEL": "split"}, {"OT_PAGED_KERNEL": "stream"}]
            runs += [{"OT_PAGED_KERNEL": "split", "OT_PAGED_SPLITS": str(n)}
                     for n in SWEEP.get((b, ctx), [])]
            for env in runs:
                os.environ.update(env)
                try:
                    name = " ".join(f"{k}={v}" for k, v in env.items())
                    variants[name] = round(nbytes / (time_ms(call) * 1e-3) / 1e12, 3)
                finally:
                    for k in env:
                        os.environ.pop(k, None)

            def gather_sdpa():
                k, v = gather(c, b, ctx, bs)
                return sdpa_grouped(c["q"], k, v)

            ms_g = time_ms(gather_sdpa, iters=15)
            ref = gather_sdpa().float()
            call()
            err = (out.float() - ref).abs().max().item()
            raw = {k: nbytes / (v[0] * 1e-3) / 1e12 for k, v in peers_contig.items()}
            raw["paged gather + SDPA"] = nbytes / (ms_g * 1e-3) / 1e12
            peers = {k: round(v, 3) for k, v in raw.items()}
            tb = nbytes / (ms * 1e-3) / 1e12
            best = max(raw.values())
            rows.append({
                "op": "paged_decode",
                "case": f"B{b} x ctx {ctx} page {bs} bf16 Hq{HQ} Hkv{HKV} D{D}",
                "metric": "TB/s",
                "ours": round(tb, 3),
                "ours_us": round(ms * 1e3, 1),
                "variants": variants,
                "peers": peers,
                "peers_us": {k: round(v[0] * 1e3, 1) for k, v in peers_contig.items()} |
                            {"paged gather + SDPA": round(ms_g * 1e3, 1)},
                "ratio_best_peer": round(tb / best, 3),
                "ratio_cudnn": round(tb / raw["torch SDPA cuDNN (contiguous)"], 3)
                if "torch SDPA cuDNN (contiguous)" in raw else None,
                "ratio_gather": round(tb / raw["paged gather + SDPA"], 3),
                "fraction_of_ceiling": round(tb / ceiling, 3),
                "max_abs_err_vs_sdpa": float(f"{err:.3e}"),
            })
            r = rows[-1]
            print(f"{r['case']:<44} ours {r['ours']:.3f} TB/s ({r['ours_us']} us; variants "
                  f"{variants}) "
                  f"{r['fraction_of_ceiling']:.1%} of read; peers {peers}; err {err:.1e}", flush=True)
            del c, out
            torch.cuda.empty_cache()
        del peers_contig
    return rows


def arena_rows(binary):
    res = json.loads(subprocess.run([binary, "40000"], check=True, capture_output=True,
                                    text=True).stdout.strip().splitlines()[-1])
    a, m, s = (res["arena_ns_per_pair"], res["cudamalloc_ns_per_pair"],
               res["mallocasync_ns_per_pair"])
    return [{
        "op": "arena_alloc_free",
        "case": "random trace: <= 48 live, 60% 256 B-64 KiB, 30% 64 KiB-16 MiB, 10% 16-256 MiB",
        "metric": "M alloc+free pairs/s",
        "ours": round(1e3 / a, 3),
        "ours_ns_per_pair": a,
        "peers": {"cudaMalloc/cudaFree": round(1e3 / m, 3),
                  "cudaMallocAsync/cudaFreeAsync (pool kept)": round(1e3 / s, 3)},
        "peers_ns_per_pair": {"cudaMalloc/cudaFree": m,
                              "cudaMallocAsync/cudaFreeAsync (pool kept)": s},
        "ratio_best_peer": round(min(m, s) / a, 3),
        "ratio_cudamalloc": round(m / a, 1),
        "detail": res,
    }]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--arena-bin")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--profile-case", metavar="B,CTX,PAGE",
                    help="only call ours 4 times on this case (a target for ncu) and exit")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    shim = Shim(args.shim)
    if args.profile_case:
        b, ctx, bs = (int(x) for x in args.profile_case.split(","))
        c = make_case(b, ctx, bs, seed=5)
        out = torch.empty_like(c["q"])
        for _ in range(4):
            shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"], c["indices"], c["lpl"], out)
        torch.cuda.synchronize()
        raise SystemExit(0)
    ok = True
    if args.check:
        ok = check(shim)
    if args.no_bench:
        raise SystemExit(0 if ok else 1)
    probe(shim)
    ceiling = read_ceiling()
    print(f"read ceiling (torch.sum 4 GiB bf16): {ceiling:.3f} TB/s", flush=True)
    rows = bench(shim, ceiling)
    if args.arena_bin:
        rows += arena_rows(args.arena_bin)
        print(json.dumps(rows[-1]), flush=True)
    doc = {
        "bench": "decode",
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "commit": args.commit,
        "command": args.command,
        "torch": torch.__version__,
        "ceilings": {"read_TBps": round(ceiling, 3)},
        "timing": "CUDA events around 5 calls after a ~1 ms torch.cuda._sleep, median of 25 "
                  "(gather + SDPA: 15)",
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    # table last
    print(f"\n{'case':<46}{'ours TB/s':>10}{'% read':>8}{'cuDNN':>8}{'flash':>8}{'gather':>8}"
          f"{'x cuDNN':>9}{'x gath':>8}")
    for r in rows:
        if r["op"] != "paged_decode":
            continue
        p = r["peers"]
        print(f"{r['case'][:45]:<46}{r['ours']:>10.3f}{r['fraction_of_ceiling']:>8.1%}"
              f"{p.get('torch SDPA cuDNN (contiguous)', float('nan')):>8.3f}"
              f"{p.get('torch SDPA flash (contiguous)', float('nan')):>8.3f}"
              f"{p['paged gather + SDPA']:>8.3f}{r['ratio_cudnn'] or float('nan'):>9.2f}"
              f"{r['ratio_gather']:>8.2f}")
    for r in rows:
        if r["op"] == "arena_alloc_free":
            print(f"arena: {r['ours_ns_per_pair']:.0f} ns/pair; cudaMalloc/Free "
                  f"{r['peers_ns_per_pair']['cudaMalloc/cudaFree']:.0f} ns ({r['ratio_cudamalloc']}x); "
                  f"cudaMallocAsync {r['peers_ns_per_pair']['cudaMallocAsync/cudaFreeAsync (pool kept)']:.0f} ns")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
