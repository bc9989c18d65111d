#!/usr/bin/env python3
"""bench_decode.py -- paged decode attention (ot_paged_attention on CUDA) against torch
SDPA, and the arena allocator against cudaMalloc / cudaMallocAsync.

Our op is called through bench/decode_shim.c (ctypes, raw device pointers of torch
tensors, torch's current stream): the public op, validation included.

  python3 bench/bench_decode.py --shim build/libdecode_shim.so [--arena-bin build/arena_bench] \
      [--json bench/results/decode.json] [--check]

Decode: bf16, heads_q 32, heads_kv 8, head_dim 128, one query token per sequence;
batch x context 1 x 64k, 16 x 4k, 64 x 1k, 64 x 4k, and the engine's batch-1 decode at
1 x 512, 1 x 2k, 1 x 8k (latency-bound: rows give us per call too); page sizes 16 and 64; each
sequence's pages a random permutation of the pool. Bytes = K and V read once + q read +
out written. Ceiling: a read-only reduction (torch.sum of a 4 GiB bf16 tensor, fp32
accumulation) measured in the same run; beside it a plain streaming read of our own (a
Triton kernel summing the same 4 GiB in 64 KB blocks with evict-first loads, one float per
block; read_stream_ceiling, "unavailable" without Triton), since cuDNN's decode reads
faster than torch.sum's rate. Peers: SDPA on a contiguous cache [B, Hkv, S, D]
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
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fused_ops import time_ms as _time_ms  # noqa: E402
from benchutil import env_set, round_order  # noqa: E402

C = ctypes
i64, vp, cint = C.c_int64, C.c_void_p, C.c_int
HQ, HKV, D = 32, 8, 128
DEV = "cuda"
SHAPES = [(1, 65536), (16, 4096), (64, 1024), (64, 4096)]
# the engine's decode step (issue 7: Llama-3-8B batch 1 has the same heads / head_dim, one
# call per layer at context 2048; pages of 16): latency-bound, so its rows also give us
ENGINE_SHAPES = [(1, 512), (1, 2048), (1, 8192)]
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
        if hasattr(L, "shim_paged_last_plan"):  # (a shim of an older build: --quick only)
            L.shim_paged_last_plan.argtypes = [C.POINTER(cint)]
        if hasattr(L, "shim_paged_trace"):
            L.shim_paged_trace.argtypes = [vp, cint, cint]
        if hasattr(L, "shim_set_kv_ready"):
            L.shim_set_kv_ready.argtypes = [cint]
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

    def plan(self):
        """What the last call launched: (kernel name, splits, CTAs, launched with PDL, an
        early start (paged_kv_ready), the TMA ring (OT_PAGED_TMA, experiment builds), the
        aligned-page instance (OT_PAGED_ALIGNED), 8-warp CTAs (OT_PAGED_WARPS), an opt-in
        variant (OT_PAGED_VARIANT, builds of decode round 9 only; removed in round 10)). Flag 2,
        round 6's fused split merge (removed), is no longer set, nor are 128 / 256 (round 11's
        bulk ring, removed) and 512 / 1024 (round 12's V fragments by ldmatrix.trans,
        OT_PAGED_PV=ldsm / ldsm2, removed). Last: the page-id guess (flag 2048, the split
        kernel at batch 1 and at batch > 1 with equal table shares)."""
        a = (cint * 4)()
        self.lib.shim_paged_last_plan(a)
        return ({1: "split", 2: "stream", 3: "simple"}.get(a[0], "none"), a[1], a[2],
                bool(a[3] & 1), bool(a[3] & 4), bool(a[3] & 8), bool(a[3] & 16), bool(a[3] & 32),
                bool(a[3] & 64), bool(a[3] & 2048))


def plan_str(pl):
    extra = (", pdl" if pl[3] else "") + (", early" if pl[4] else "") + \
        (", tma" if len(pl) > 5 and pl[5] else "") + (", aligned" if len(pl) > 6 and pl[6] else "") + \
        (", 8 warps" if len(pl) > 7 and pl[7] else "") + (", variant" if len(pl) > 8 and pl[8] else "") + \
        (", guess" if len(pl) > 9 and pl[9] else "")
    return f"{pl[0]} x{pl[1]}, {pl[2]} CTAs{extra}"


def run_env(env, fn, shim=None):
    """fn() with the environment variables of `env` set (read by the library at each call),
    then the caller's values (or their absence) back. The key "kv_ready" (not a variable)
    sets paged_kv_ready of shim's calls instead (the early start; a shim without the hook
    raises)."""
    env = dict(env)
    ready = env.pop("kv_ready", None)
    if ready is not None:
        shim.lib.shim_set_kv_ready(int(ready))
    try:
        with env_set(env):
            return fn()
    finally:
        if ready is not None:
            shim.lib.shim_set_kv_ready(0)


def time_ms(fn, iters=25, inner=5, warmup=3, warm_ms=0.0):
    """bench_fused_ops.time_ms (a ~1 ms torch.cuda._sleep, then events around `inner`
    calls; median of `iters`) for one function."""
    return _time_ms([fn], iters=iters, inner=inner, warmup=warmup, warm_ms=warm_ms)


def read_ceiling():
    x = torch.randn(2 << 30, device=DEV, dtype=torch.bfloat16)  # 4 GiB
    ms = time_ms(lambda: torch.sum(x, dtype=torch.float32), iters=15, inner=2)
    tbps = x.numel() * 2 / (ms * 1e-3) / 1e12
    del x
    torch.cuda.empty_cache()
    return tbps


try:  # the streaming-read ceiling's kernel (Triton ships with the CUDA builds of torch)
    import triton
    import triton.language as tl

    @triton.jit
    def _stream_read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        """Block pid sums elements [pid * BLOCK * ITERS, + BLOCK * ITERS) of x (bf16) in
        float32 and stores one float: a read of every byte once, nothing else written."""
        pid = tl.program_id(0)
        base = pid.to(tl.int64) * (BLOCK * ITERS)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in tl.static_range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))
    _TRITON_ERR = None
except Exception as e:  # (no Triton: the ceiling reads "unavailable")
    _TRITON_ERR = str(e).splitlines()[0][:80] if str(e) else type(e).__name__


def read_stream_ceiling():
    """A plain streaming read of our own: _stream_read_kernel over a 4 GiB bf16 tensor (the
    same size as read_ceiling's), blocks of 4096 elements x 8 loads (64 KB per program, 32768
    programs), 8 warps; timed as read_ceiling. TB/s, or a string saying why not."""
    if _TRITON_ERR is not None:
        return f"unavailable ({_TRITON_ERR})"
    try:
        x = torch.randn(2 << 30, device=DEV, dtype=torch.bfloat16)
        BLOCK, ITERS = 4096, 8
        grid = (x.numel() + BLOCK * ITERS - 1) // (BLOCK * ITERS)
        part = torch.empty(grid, device=DEV, dtype=torch.float32)

        def run():
            _stream_read_kernel[(grid,)](x, part, x.numel(), BLOCK=BLOCK, ITERS=ITERS, num_warps=8)
        run()
        torch.cuda.synchronize()
        # the sums checked against torch's (the kernel read what it claims)
        want = torch.sum(x[: BLOCK * ITERS], dtype=torch.float32).item()
        if abs(part[0].item() - want) > 1e-2 * max(1.0, abs(want)):
            return f"unavailable (block 0 sums {part[0].item():.4f}, torch {want:.4f})"
        ms = time_ms(run, iters=15, inner=2)
        tbps = x.numel() * 2 / (ms * 1e-3) / 1e12
        del x, part
        torch.cuda.empty_cache()
        return tbps
    except Exception as e:  # a Triton / driver failure must not stop the benchmark
        torch.cuda.empty_cache()
        return f"unavailable ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"


def fmt_tbps(v):
    return f"{v:.3f} TB/s" if isinstance(v, float) else str(v)


def make_case(b, ctx, bs, dtype=torch.bfloat16, seed=0, in_order=False):
    """A paged cache of b sequences of ctx keys in pages of bs: the sequences' pages a random
    permutation of the pool, or (in_order) pages 0, 1, 2, ... in sequence order -- each kv
    head's keys then still come in runs of bs x 256 bytes (the pool is [pages, Hkv, bs, D]),
    but one page after the other in memory."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    npb = (ctx + bs - 1) // bs
    P = b * npb + 3
    kp = torch.randn(P, HKV, bs, D, device=DEV, dtype=dtype, generator=g)
    vp_ = torch.randn(P, HKV, bs, D, device=DEV, dtype=dtype, generator=g)
    perm = torch.randperm(P, device=DEV, generator=g)[: b * npb].to(torch.int32)
    if in_order:  # (the permutation is drawn anyway: q below stays the same values)
        perm = torch.arange(b * npb, device=DEV, dtype=torch.int32)
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
    # each variant on its own random data (seed), the kernel that ran read back and checked
    runs = [("auto", {}), ("split", {"OT_PAGED_KERNEL": "split"}),
            ("stream", {"OT_PAGED_KERNEL": "stream"}),
            ("split general", {"OT_PAGED_KERNEL": "split", "OT_PAGED_ALIGNED": "0"}),
            ("split 8 warps", {"OT_PAGED_KERNEL": "split", "OT_PAGED_WARPS": "8"})]
    # (1 x 2k: the batch-1 default's 64-key splits with guessed first page ids, pages 16 / 64)
    for (b, ctx) in [(3, 1000), (1, 65536), (16, 4096), (64, 1024), (1, 2048)]:
        for bs in PAGES:
            for vi, (name, env) in enumerate(runs):
                c = make_case(b, ctx, bs, seed=b + ctx + bs + 1000 * vi)
                k, v = gather(c, b, ctx, bs)
                ref = sdpa_grouped(c["q"].float(), k.float(), v.float())
                out = torch.full_like(c["q"], float("nan"))
                run_env(env, lambda: shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],
                                                c["indices"], c["lpl"], out))
                pl = shim.plan()
                want = env.get("OT_PAGED_KERNEL")
                ran_ok = (want is None or pl[0] == want) and \
                    (env.get("OT_PAGED_PDL") != "0" or not pl[3]) and \
                    (env.get("OT_PAGED_ALIGNED") != "0" or not pl[6]) and \
                    (env.get("OT_PAGED_WARPS") != "8" or pl[7])
                err = (out.float() - ref).abs().max().item()
                good = err < 2e-2 and not torch.isnan(out).any().item() and ran_ok
                ok &= good
                print(f"check B{b} ctx {ctx} page {bs} {name} (ran {plan_str(pl)}): max |err| "
                      f"{err:.2e} {'ok' if good else 'FAIL'}")
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


TR_FIELDS = ("entry", "waited", "tables", "first_stage", "loop_done", "end")


def trace_stamps(shim, kernel):
    """One kernel's per-CTA stamps (OT_PA_TRACE build): rows of 8 for the CTAs that ran."""
    buf = (C.c_ulonglong * (4096 * 8))()
    if shim.lib.shim_paged_trace(C.cast(buf, vp), kernel, 0) != 0:
        raise RuntimeError("shim_paged_trace failed (not an OT_PA_TRACE build?)")
    rows = [list(buf[i * 8:(i + 1) * 8]) for i in range(4096)]
    return [(i, r) for i, r in enumerate(rows) if r[0] != 0]


def trace(shim, cases):
    """Per-CTA %globaltimer stamps of the last of 5 back-to-back calls (after a ~1 ms sleep):
    when each CTA of the main kernel starts, passes the PDL wait, has read the tables, has
    its first stage, ends its key loop and ends; the merge CTAs' start, wait and end. Times
    in us from the first main CTA's entry."""
    out = []
    for spec in cases.split(";"):
        parts = spec.split(",")
        b, ctx, bs = (int(x) for x in parts[:3])
        env = {"OT_PAGED_KERNEL": parts[3]} if len(parts) > 3 else {}
        c = make_case(b, ctx, bs, seed=7)
        o = torch.empty_like(c["q"])
        call = lambda: shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],  # noqa: E731
                                  c["indices"], c["lpl"], o)
        with env_set(env):
            us_call = time_ms(call) * 1e3
            call()
            pl = plan_str(shim.plan())
            torch.cuda.synchronize()
            shim.lib.shim_paged_trace(None, 0, 1)
            _sleep()
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        main, merge = trace_stamps(shim, 0), trace_stamps(shim, 1)
        t0 = min(r[0] for _, r in main)
        full = [r for _, r in main if r[5] != 0]

        def q(vals):
            v = sorted(vals)
            if not v:
                return None
            return [round(v[0], 2), round(v[len(v) // 10], 2), round(v[len(v) // 2], 2),
                    round(v[(9 * len(v)) // 10], 2), round(v[-1], 2)]
        # (a stream-kernel CTA whose warp 0 has no steps stamps entry, waited and end only)
        summ = {f: q([(r[i] - t0) / 1e3 for r in full if r[i]]) for i, f in enumerate(TR_FIELDS)}
        summ["start_to_first_us"] = q([(r[3] - r[0]) / 1e3 for r in full if r[3]])
        summ["wait_to_first_us"] = q([(r[3] - r[1]) / 1e3 for r in full if r[3]])
        summ["loop_us"] = q([(r[4] - r[3]) / 1e3 for r in full if r[3] and r[4]])
        summ["epilogue_us"] = q([(r[5] - r[4]) / 1e3 for r in full if r[4]])
        # stamp 6 is the CTA's SM id, except in -DOT_PA_TRACE_EPI builds, where it is a
        # %globaltimer value (ns since the epoch): no SM counts from those
        epi = any(r[6] >= 1 << 32 for r in full)
        sms = {}
        if not epi:
            for r in full:
                sms[r[6]] = sms.get(r[6], 0) + 1
        m_full = [r for _, r in merge if r[5] != 0]
        summ["merge_entry"] = q([(r[0] - t0) / 1e3 for _, r in merge])
        summ["merge_waited"] = q([(r[1] - t0) / 1e3 for _, r in merge])
        summ["merge_end"] = q([(r[5] - t0) / 1e3 for r in m_full])
        ends = [r[5] for r in full] + [r[5] for r in m_full]
        rec = {"case": f"B{b} x ctx {ctx} page {bs}", "env": env, "plan": pl,
               "us_per_call_events": round(us_call, 2), "ctas": len(main),
               "ctas_early_exit": len(main) - len(full), "merge_ctas": len(merge),
               "sms_used": None if epi else len(sms),
               "max_ctas_per_sm": None if epi else max(sms.values()) if sms else 0,
               "span_us": round((max(ends) - t0) / 1e3, 2) if ends else None,
               "quantiles": "min, p10, p50, p90, max (us)", "summary": summ,
               "main_raw": [[i] + [x - t0 if j < 6 and x else x for j, x in enumerate(r)]
                            for i, r in main][:1200]}
        out.append(rec)
        s_ = summ
        print(f"trace {rec['case']} {env} ({pl}; {us_call:.1f} us/call by events): span "
              f"{rec['span_us']} us, {len(full)} CTAs on {rec['sms_used']} SMs; entry {s_['entry']}; "
              f"waited {s_['waited']}; tables {s_['tables']}; first stage {s_['first_stage']}; "
              f"loop done {s_['loop_done']}; end {s_['end']}; start->first {s_['start_to_first_us']}; "
              f"loop {s_['loop_us']}; epilogue {s_['epilogue_us']}; merge entry "
              f"{s_['merge_entry']} waited {s_['merge_waited']} end {s_['merge_end']}", flush=True)
        del c, o
        torch.cuda.empty_cache()
    return out


def ncu_cases(shims, cases):
    """For ncu --profile-from-start off: ours (each shim of `shims`, [(name, Shim)], in
    order), then cuDNN SDPA on the same cache made contiguous, each called once between
    cudaProfilerStart / Stop (after 3 warm calls)."""
    for spec in cases.split(";"):
        b, ctx, bs = (int(x) for x in spec.split(","))
        c = make_case(b, ctx, bs, seed=5)
        o = torch.empty_like(c["q"])
        kc, vc = (t.contiguous() for t in gather(c, b, ctx, bs))
        calls = [lambda S=S: S.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],
                                     c["indices"], c["lpl"], o) for _, S in shims]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for _ in range(3):
                for call in calls:
                    call()
                sdpa_grouped(c["q"], kc, vc)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            for call in calls:
                call()
            sdpa_grouped(c["q"], kc, vc)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        for (name, S), call in zip(shims, calls):
            call()
            print(f"ncu case B{b} x ctx {ctx} page {bs} {name}: {plan_str(S.plan())}", flush=True)
        del c, o, kc, vc


def _sleep():
    torch.cuda._sleep(2_000_000)  # ~1 ms: the host queues what follows while the GPU spins


def graph_us(fn, n=20, iters=15):
    """Per-call time of n calls captured in one CUDA graph (no host work between calls),
    median of iters replays, each after a ~1 ms sleep."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _sleep()
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / n)
    del g
    return statistics.median(ts)


def host_us(fn, n=200):
    """Host time per call (Python + ctypes + validation + plan + launches), the GPU kept
    busy ahead by a sleep so no launch waits for a free queue slot."""
    fn()
    torch.cuda.synchronize()
    _sleep()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / n


def trace_calls(fn, n=12):
    """GPU activities of n back-to-back calls (torch.profiler / CUPTI), after a sleep: per
    call the kernels and memsets with their mean durations, the gaps between consecutive
    activities, and the span from one call's first activity to the next's."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _sleep()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    path = f"/tmp/decode_trace_{os.getpid()}.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        evs = json.load(f)["traceEvents"]
    os.remove(path)
    acts = sorted((e for e in evs if e.get("ph") == "X" and e.get("cat") in
                   ("kernel", "gpu_memset", "gpu_memcpy")), key=lambda e: e["ts"])
    acts = [e for e in acts if "spin" not in e["name"] and "sleep" not in e["name"]]
    if not acts or len(acts) % n:
        return {"error": f"{len(acts)} GPU activities for {n} calls"}
    per = len(acts) // n
    names, durs, gaps = [], [[] for _ in range(per)], [[] for _ in range(per)]
    for i, e in enumerate(acts):
        j = i % per
        if i < per:
            names.append(e["name"].split("<")[0].split("(")[0][-40:])
        durs[j].append(e["dur"])
        if i > 0:  # gap from the previous activity's end (negative: they overlap, PDL)
            p = acts[i - 1]
            gaps[j].append(e["ts"] - (p["ts"] + p["dur"]))
    starts = [acts[i * per]["ts"] for i in range(n)]
    span = [b - a for a, b in zip(starts, starts[1:])]
    med = statistics.median
    return {"activities_per_call": per,
            "activities": [{"name": names[j], "us": round(med(durs[j]), 2),
                            "gap_before_us": round(med(gaps[j]), 2) if gaps[j] else None}
                           for j in range(per)],
            "span_per_call_us": round(med(span), 2)}


VARIANTS_FIXED = (("ours", {}), ("ours no-pdl", {"OT_PAGED_PDL": "0"}),
                  ("ours split", {"OT_PAGED_KERNEL": "split"}))


def fixed_times(f):
    """fixed_cost's measurements of one call f: events around 5 and 50 calls, host time per
    call, a CUDA graph of 20 calls (its error, if capture fails), the CUPTI trace."""
    r = {"events5_us": round(time_ms(f) * 1e3, 2),
         "events50_us": round(time_ms(f, iters=11, inner=50) * 1e3, 2),
         "host_us": round(host_us(f), 2)}
    try:
        r["graph_us"] = round(graph_us(f), 2)
    except Exception as e:  # noqa: BLE001
        r["graph_us"] = f"failed: {str(e).splitlines()[0][:80]}"
    r["trace"] = trace_calls(f)
    return r


def fixed_cost(shim):
    """Where the per-call fixed cost goes (issue 6): for tiny and benchmark shapes, ours
    (default, and with the main kernel's PDL off) and SDPA cuDNN on the contiguous cache:
    events around 5 calls after a sleep (the benchmark's method), around 50 calls, a CUDA
    graph of 20 calls (no host between calls), the host time per call, and a CUPTI trace
    of the GPU activities of one call (kernels, memsets, durations, gaps)."""
    res = []
    for (b, ctx) in [(1, 256), (64, 1024), (16, 4096), (1, 65536)]:
        c = make_case(b, ctx, 16, seed=7)
        out = torch.empty_like(c["q"])
        call = lambda: shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],  # noqa: E731
                                  c["indices"], c["lpl"], out)
        k, v = gather(c, b, ctx, 16)
        kc, vc = k.contiguous(), v.contiguous()
        nbytes = 2 * b * ctx * HKV * D * 2 + 2 * b * HQ * D * 2
        row = {"case": f"B{b} x ctx {ctx} page 16", "bytes": nbytes}
        for name, env in VARIANTS_FIXED:
            def m():
                call()
                return {"plan": plan_str(shim.plan()), **fixed_times(call)}
            row[name] = run_env(env, m)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            q2 = c["q"]
            f2 = lambda: sdpa_grouped(q2, kc, vc)  # noqa: E731
            try:
                r = fixed_times(f2)
            except RuntimeError as e:
                r = {"error": str(e).splitlines()[0][:80]}
            row["SDPA cuDNN"] = r
        res.append(row)
        for name in [v[0] for v in VARIANTS_FIXED] + ["SDPA cuDNN"]:
            r = row[name]
            if "error" in r:
                print(f"fixed {row['case']} {name}: {r['error']}")
                continue
            tr = r["trace"]
            acts = "; ".join(f"{a['name']} {a['us']} us (gap {a['gap_before_us']})"
                             for a in tr.get("activities", [])) or tr.get("error")
            print(f"fixed {row['case']:<22} {name:<12} {r.get('plan', ''):<28} ev5 "
                  f"{r['events5_us']:>7} ev50 {r['events50_us']:>7} graph {r['graph_us']:>7} "
                  f"host {r['host_us']:>6} | span {tr.get('span_per_call_us')} | {acts}",
                  flush=True)
        del c, out, k, v, kc, vc
        torch.cuda.empty_cache()
    return res


def bench(shim, ceiling, shapes=None, lean=False, ref_shim=None):
    """The grid (shapes: SHAPES + ENGINE_SHAPES unless given). lean: of the forced runs of
    a row only the engine shapes' kv_ready one. ref_shim: another build's shim (e.g. the commit
    before a kernel change) timed at each row in the same process, as the variants "ref"
    (and "ref kv_ready=1" at the engine shapes), with its largest |difference| from ours
    (0.0 only for the same bits)."""
    rows = []
    for (b, ctx) in shapes or SHAPES + ENGINE_SHAPES:
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
            call()
            plan_default = plan_str(shim.plan())
            plans = {}
            runs = [] if lean else [
                {"OT_PAGED_KERNEL": "split"}, {"OT_PAGED_KERNEL": "stream"},
                {"OT_PAGED_PDL": "0"}, {"OT_PAGED_ALIGNED": "0"},
                {"OT_PAGED_KERNEL": "split", "OT_PAGED_WARPS": "4"},
                {"OT_PAGED_KERNEL": "split", "OT_PAGED_WARPS": "8"}]
            if (b, ctx) in ENGINE_SHAPES:  # the engine's early start (paged_kv_ready)
                runs += [{"kv_ready": "1"}] + ([] if lean else [{"kv_ready": "1", "OT_PAGED_ALIGNED": "0"}])
            if not lean:
                runs += [{"OT_PAGED_KERNEL": "split", "OT_PAGED_SPLITS": str(n)}
                         for n in SWEEP.get((b, ctx), [])]
            ref_diff = None
            if ref_shim is not None:  # the other build on the same inputs, same process
                runs += [{"ref": "1"}] + ([{"ref": "1", "kv_ready": "1"}] if (b, ctx) in ENGINE_SHAPES else [])
                out_r = torch.empty_like(out)
                call_r = lambda: ref_shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],  # noqa: E731
                                           c["indices"], c["lpl"], out_r)
                call_r()
                call()
                torch.cuda.synchronize()
                ref_diff = (out.float() - out_r.float()).abs().max().item()
                if not ref_diff:
                    ref_diff = 0.0 if torch.equal(out.view(torch.int16), out_r.view(torch.int16)) \
                        else "0 but not bitwise"
            for env in runs:
                name = " ".join("ref" if k == "ref" else f"{k}={v}" for k, v in env.items())
                env = {k: v for k, v in env.items() if k != "ref"}
                S, fn = (ref_shim, call_r) if name.startswith("ref") else (shim, call)
                t = run_env(env, lambda: time_ms(fn), S)
                run_env(env, fn, S)
                pl = S.plan()
                if "OT_PAGED_KERNEL" in env and pl[0] != env["OT_PAGED_KERNEL"]:
                    raise RuntimeError(f"variant {name} ran {plan_str(pl)}")
                variants[name] = round(nbytes / (t * 1e-3) / 1e12, 3)
                plans[name] = plan_str(pl)

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
                "plan": plan_default,
                "variants": variants,
                "variants_plan": plans,
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
            if ref_shim is not None:
                rows[-1]["max_abs_diff_vs_ref"] = ref_diff
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


def ab_round(entries, r, order):
    """Round r's order of the --ab entries (builds, then the peers). "balanced" (the default
    since 2026-12-03): a row of a Williams Latin square (benchutil.round_order), so that over
    len(entries) rounds (2x for an odd count) each entry runs right after every other equally
    often. "legacy": the order before, the builds forward in even rounds and reversed in odd
    ones, then cuDNN, then flash every round (cuDNN always right after a build, the first
    build right after flash)."""
    if order == "legacy":
        b = [n for n in entries if n not in AB_PEERS]
        return (b if r % 2 == 0 else b[::-1]) + [n for n in entries if n in AB_PEERS]
    return [entries[i] for i in round_order(len(entries), r)]


def parse_ab_shapes(text):
    """--ab-shapes: "BxCTX[pPAGE][o],...": batch x context, the page size (default 16), "o"
    for the pages in order (make_case's in_order) instead of a random permutation of the pool.
    Returns [(b, ctx, page, in_order)]."""
    out = []
    for x in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)(?:p(\d+))?(o?)", x.strip())
        if not m:
            raise SystemExit(f"--ab-shapes: {x!r} is not BxCTX[pPAGE][o] (e.g. 16x4096, 16x4096p64o)")
        b, ctx, page = int(m.group(1)), int(m.group(2)), int(m.group(3) or 16)
        if b < 1 or ctx < 1 or page < 1:
            raise SystemExit(f"--ab-shapes: {x!r}: batch, context and page must be >= 1")
        out.append((b, ctx, page, m.group(4) == "o"))
    return out


def ab(args):
    """--ab: builds (one shim each, loaded in this process) and SDPA cuDNN / flash timed round
    by round at each shape (page 16 unless --ab-shapes says otherwise), in the order ab_round
    gives (--order), each entry's block after --warm-ms of its own untimed calls. Also the largest
    |difference| of each build's output from the first's (same inputs; 0.0 only when the
    bits are the same). A build NAME=SHIM@VAR=VALUE@... is SHIM with those variables (and
    the key kv_ready, run_env) set around its calls; --ab-shapes picks the shapes."""
    shims, envs, builds = {}, {}, []
    for x in args.ab.split(","):  # NAME=SHIM[@VAR=VALUE...]: a build, or one with its env
        n, spec = x.split("=", 1)
        pth, *kv = spec.split("@")
        if pth not in shims:
            shims[pth] = Shim(pth)
        builds.append((n, shims[pth]))
        envs[n] = dict(e.split("=", 1) for e in kv)
    shapes = [(b, ctx, 16, False) for b, ctx in SHAPES + ENGINE_SHAPES]
    if args.ab_shapes:
        shapes = parse_ab_shapes(args.ab_shapes)
    ceiling = read_ceiling()
    stream = read_stream_ceiling()
    print(f"ab read ceiling (torch.sum 4 GiB bf16): {ceiling:.3f} TB/s; streaming read (ours, "
          f"Triton): {fmt_tbps(stream)}", flush=True)
    rows = []
    for (b, ctx, bs, in_order) in shapes:
        c = make_case(b, ctx, bs, seed=3, in_order=in_order)
        nbytes = 2 * b * ctx * HKV * D * 2 + 2 * b * HQ * D * 2
        outs = {n: torch.empty_like(c["q"]) for n, _ in builds}
        raw = {n: (lambda S=S, o=outs[n]: S.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],
                                                   c["indices"], c["lpl"], o))
               for n, S in builds}
        # each build's environment (and kv_ready) set around its whole timing
        calls = {n: (lambda S=S, n=n, fn=None: run_env(envs[n], fn or raw[n], S)) for n, S in builds}
        kc, vc = (t.contiguous() for t in gather(c, b, ctx, bs))
        peers = {}  # timed inside their backend's context, as --quick
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    sdpa_grouped(c["q"], kc, vc)
                peers[name] = be
            except RuntimeError as e:
                print(f"ab {name} unavailable: {str(e).splitlines()[0][:80]}", flush=True)
        names = [n for n, _ in builds]
        entries = names + list(peers)
        us = {n: [] for n in entries}
        wm = args.warm_ms
        for r in range(args.rounds):
            for n in ab_round(entries, r, args.order):
                if n in peers:
                    with sdpa_kernel([peers[n]]):
                        us[n].append(round(time_ms(lambda: sdpa_grouped(c["q"], kc, vc),
                                                   warm_ms=wm) * 1e3, 2))
                else:
                    us[n].append(round(calls[n](fn=lambda: time_ms(raw[n], warm_ms=wm)) * 1e3, 2))
        plans, diff = {}, {}
        for n, S in builds:
            calls[n]()
            plans[n] = plan_str(S.plan()) if hasattr(S.lib, "shim_paged_last_plan") else "?"
        torch.cuda.synchronize()
        for n in names[1:]:
            diff[n] = (outs[n].float() - outs[names[0]].float()).abs().max().item()
            if not diff[n]:  # the same bits?
                diff[n] = 0.0 if torch.equal(outs[n].view(torch.int16), outs[names[0]].view(torch.int16)) \
                    else "0 but not bitwise"
        med = {n: round(statistics.median(v), 2) for n, v in us.items()}
        tbps = {n: round(nbytes / (m * 1e-6) / 1e12, 3) for n, m in med.items()}
        pct = {n: round(t / ceiling, 3) for n, t in tbps.items()}
        pct_s = {n: round(t / stream, 3) for n, t in tbps.items()} if isinstance(stream, float) else None
        lay = f" page {bs}{' in order' if in_order else ''}" if (bs, in_order) != (16, False) else ""
        print(f"ab B{b} x ctx {ctx}{lay}: median us {med} TB/s {tbps} of torch.sum read {pct} of "
              f"streaming read {pct_s} plans {plans} max|out - {names[0]}| {diff}", flush=True)
        rows.append({**ab_bench_fields(names, tbps, pct),
                     "case": f"B{b} x ctx {ctx} page {bs}{' (pages in order)' if in_order else ''} "
                             f"bf16 Hq{HQ} Hkv{HKV} D{D}",
                     "batch": b, "ctx": ctx, "page": bs, "pages_in_order": in_order,
                     "median_us": med, "TBps": tbps,
                     "fraction_of_read": pct, "fraction_of_stream_read": pct_s, "rounds_us": us,
                     "plans": plans, "max_abs_diff_vs_first": diff})
        del c, kc, vc, outs
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "decode_ab_same_process", "device": torch.cuda.get_device_name(),
                       "date": datetime.date.today().isoformat(), "commit": args.commit,
                       "command": args.command, "builds": args.ab, "rounds": args.rounds,
                       "timing": {"order": args.order, "warm_ms": args.warm_ms,
                                  "iters": "25 blocks of 5 calls a round, median"},
                       "ceilings": {"read_TBps": round(ceiling, 3),
                                    "read_stream_TBps": round(stream, 3)
                                    if isinstance(stream, float) else stream},
                       "rows": rows}, f, indent=1)


AB_PEERS = {"cudnn": "torch SDPA cuDNN (contiguous)", "flash": "torch SDPA flash (contiguous)"}


def ab_bench_fields(names, tbps, pct):
    """shared/BENCH.md's fields of an --ab row: the first build is "ours", the others its
    variants, cuDNN / flash SDPA on a contiguous cache the peers (TB/s; fraction of torch.sum's
    read)"""
    peers = {AB_PEERS[n]: tbps[n] for n in AB_PEERS if n in tbps}
    ours = tbps[names[0]]
    return {"op": "paged_attention_decode", "metric": "TB/s", "ours": ours, "peers": peers,
            "ratio_best_peer": round(ours / max(peers.values()), 4) if peers else None,
            "fraction_of_ceiling": pct[names[0]],
            "variants": {n: tbps[n] for n in names[1:]}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", help="the library's decode shim (required except with --ab)")
    ap.add_argument("--arena-bin")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--quick", action="store_true", help="ours alone, TB/s and us per call at the page-16 shapes "
                    "(SHAPES + ENGINE_SHAPES)")
    ap.add_argument("--peers", action="store_true",
                    help="with --quick: also the read ceiling and cuDNN / flash SDPA on the "
                    "contiguous cache, in the same process (else ignored)")
    ap.add_argument("--ab", metavar="NAME=SHIM[@VAR=VALUE...],...",
                    help="same-process A/B of builds (--shim is not loaded; a build may be a shim "
                    "with environment variables, or kv_ready=1, set around its calls, e.g. "
                    "new=lib.so@OT_PAGED_MERGE=1): at the shapes of --ab-shapes (default: the page-16 ones) "
                    "(SHAPES + ENGINE_SHAPES), --rounds rounds of each build's default call and SDPA "
                    "cuDNN / flash on the same cache made contiguous, the order of the builds "
                    "alternating by round; medians and every round's us per call (-> --json), and exit")
    ap.add_argument("--rounds", type=int, default=6, help="with --ab: rounds per shape")
    ap.add_argument("--order", choices=("balanced", "legacy"), default="balanced",
                    help="with --ab: the entries' order each round (ab_round)")
    ap.add_argument("--warm-ms", type=float, default=0.0,
                    help="with --ab: ms of untimed calls of each entry before its timed block "
                         "(bench_fused_ops.time_ms; 0: none, as before 2026-12-03)")
    ap.add_argument("--ab-shapes", metavar="BxCTX[pPAGE][o],...", help="with --ab: these shapes "
                    "(page 16 unless pPAGE; o: the pages in order, not a random permutation) "
                    "instead of SHAPES + ENGINE_SHAPES at page 16")
    ap.add_argument("--shapes", metavar="BxCTX,...", help="the grid at these shapes (pages 16 "
                    "and 64) instead of SHAPES + ENGINE_SHAPES")
    ap.add_argument("--lean", action="store_true", help="no probe, and of a row's forced runs "
                    "only the engine shapes' kv_ready one")
    ap.add_argument("--ref-shim", metavar="SHIM", help="another build timed at each row in the "
                    "same process (variants 'ref', 'ref kv_ready=1'), with its max |out - ours|")
    ap.add_argument("--fixed", action="store_true",
                    help="first measure where the per-call fixed cost goes (fixed_cost)")
    ap.add_argument("--profile-case", metavar="B,CTX,PAGE",
                    help="only call ours 4 times on this case (a target for ncu) and exit")
    ap.add_argument("--trace", metavar="B,CTX,PAGE[,KERNEL];...",
                    help="per-CTA stamps of an OT_PA_TRACE build's kernels (-> --json) and exit")
    ap.add_argument("--ncu-cases", metavar="B,CTX,PAGE;...",
                    help="ours and cuDNN once each inside cudaProfilerStart/Stop, and exit")
    ap.add_argument("--ncu-shims", metavar="NAME=SHIM,...",
                    help="with --ncu-cases: more builds, each called after --shim's")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default="")
    args = ap.parse_args()
    if not args.ab and not args.shim:
        ap.error("--shim is required (except with --ab)")
    if args.ab and (args.rounds < 1 or any("=" not in x for x in args.ab.split(","))):
        ap.error("--ab wants NAME=SHIM,... and --rounds >= 1")
    torch.manual_seed(0)
    if args.ab:
        ab(args)
        raise SystemExit(0)
    shim = Shim(args.shim)
    if args.profile_case:
        b, ctx, bs = (int(x) for x in args.profile_case.split(","))
        c = make_case(b, ctx, bs, seed=5)
        out = torch.empty_like(c["q"])
        for _ in range(4):
            shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"], c["indices"], c["lpl"], out)
        torch.cuda.synchronize()
        raise SystemExit(0)
    if args.trace:
        recs = trace(shim, args.trace)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bench": "decode_trace", "device": torch.cuda.get_device_name(),
                           "date": datetime.date.today().isoformat(), "commit": args.commit,
                           "command": args.command, "shim": args.shim, "cases": recs}, f)
        raise SystemExit(0)
    if args.ncu_cases:
        extra = [(n, Shim(pth)) for n, pth in (x.split("=", 1) for x in args.ncu_shims.split(","))] \
            if args.ncu_shims else []
        ncu_cases([("ours", shim)] + extra, args.ncu_cases)
        raise SystemExit(0)
    if args.quick:  # ours alone at the page-16 shapes: A/B of builds (one process per build)
        if args.peers:
            print(f"quick {args.shim} read ceiling (torch.sum 4 GiB bf16): {read_ceiling():.3f} TB/s; "
                  f"streaming read (ours, Triton): {fmt_tbps(read_stream_ceiling())}", flush=True)
        for (b, ctx) in SHAPES + ENGINE_SHAPES:
            c = make_case(b, ctx, 16, seed=3)
            out = torch.empty_like(c["q"])
            call = lambda: shim.paged(c["q"], c["cu"], c["kp"], c["vp"], c["indptr"],  # noqa: E731
                                      c["indices"], c["lpl"], out)
            nbytes = 2 * b * ctx * HKV * D * 2 + 2 * b * HQ * D * 2
            res, us = {}, {}
            for k, e in (("default", {}), ("split", {"OT_PAGED_KERNEL": "split"}),
                         ("stream", {"OT_PAGED_KERNEL": "stream"})):
                ms = run_env(e, lambda: time_ms(call))
                res[k], us[k] = round(nbytes / (ms * 1e-3) / 1e12, 3), round(ms * 1e3, 1)
            if args.peers:  # SDPA on the same cache made contiguous, same process
                kc, vc = (t.contiguous() for t in gather(c, b, ctx, 16))
                for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                 ("flash", SDPBackend.FLASH_ATTENTION)):
                    try:  # a backend this build / GPU lacks: as bench()
                        with sdpa_kernel([be]):
                            ms = time_ms(lambda: sdpa_grouped(c["q"], kc, vc))
                        res[name], us[name] = round(nbytes / (ms * 1e-3) / 1e12, 3), round(ms * 1e3, 1)
                    except RuntimeError as e:
                        res[name] = "unavailable (" + str(e).splitlines()[0][:80] + ")"
                del kc, vc
            pl = ""
            if hasattr(shim.lib, "shim_paged_last_plan"):
                call()
                pl = " [" + plan_str(shim.plan()) + "]"
            print(f"quick {args.shim} B{b} x ctx {ctx}: {res} us {us}{pl}", flush=True)
            del c, out
        raise SystemExit(0)
    ok = True
    if args.check:
        ok = check(shim)
    fixed = fixed_cost(shim) if args.fixed else None
    if args.no_bench:
        raise SystemExit(0 if ok else 1)
    if not args.lean:
        probe(shim)
    ceiling = read_ceiling()
    stream = read_stream_ceiling()
    print(f"read ceiling (torch.sum 4 GiB bf16): {ceiling:.3f} TB/s; streaming read (ours, "
          f"Triton): {fmt_tbps(stream)}", flush=True)
    shapes = [tuple(int(v) for v in x.split("x")) for x in args.shapes.split(",")] if args.shapes else None
    rows = bench(shim, ceiling, shapes, args.lean, Shim(args.ref_shim) if args.ref_shim else None)
    if isinstance(stream, float):  # the rows' share of the streaming read too
        for r in rows:
            if r.get("op") == "paged_decode":
                r["fraction_of_stream_read"] = round(r["ours"] / stream, 3)
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
        "ceilings": {"read_TBps": round(ceiling, 3),
                     "read_stream_TBps": round(stream, 3) if isinstance(stream, float) else stream},
        "timing": "CUDA events around 5 calls after a ~1 ms torch.cuda._sleep, median of 25 "
                  "(gather + SDPA: 15)",
        "rows": rows,
    }
    if fixed:
        doc["fixed_cost"] = fixed
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
