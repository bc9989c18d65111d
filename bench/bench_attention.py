#!/usr/bin/env python3
"""bench_attention.py -- correctness checks and benchmark of the CUDA flash attention
(the Hopper sm_90a forward kernel, and forward + backward through the public API)
against torch SDPA (cuDNN and flash backends).

Our kernels are called through bench/attention_shim.c (ctypes, raw device pointers of
torch tensors, torch's current stream), independently of the Python frontend.

  python3 bench/bench_attention.py --shim build/libattention_shim.so --check
  python3 bench/bench_attention.py --shim ... --sanitize      (small cases, no reference)
  python3 bench/bench_attention.py --shim ... --bench --json bench/results/attention.json

--check: the Hopper forward on random inputs against a float64 torch reference (GQA,
causal / sliding windows with Sq != Sk, lengths that are not tile multiples, 1-token
sequences, strided layouts: packed qkv, BHSD, padded rows), outputs NaN-poisoned and
surrounded by NaN guards that must survive; lse too. Configurations the kernel does not
cover must come back handled=false with the output untouched.
--bench: shared/BENCH.md. bf16, D 64/128/256, S 1k/4k/16k, causal and not, batch*seq = 32k
tokens, heads*D = 2048. FLOPs 4*B*H*Sq*Sk*D (half for causal), backward 2.5x forward.
cuBLAS bf16 GEMM 8192^3 measured in the same run is the ceiling. CUDA events, warm-up;
per case --rounds rounds (default 6: a balanced set for 3 entries): each round times every
entry (ours, cuDNN, flash; forward, then forward + backward) with --iters calls (median) after
--warm-ms (100) of untimed calls of the same entry, in a balanced order (--order balanced:
rows of a Williams Latin square, so each entry follows every other equally often over
len(entries) rounds, 2x for an odd count; 3 entries: 6 rounds). Until 2026-12-03
(twenty-seventh session) the order was a cyclic rotation with no warm-up (--order rotate
--warm-ms 0): ours always ran right after flash, an --ab variant right after flash or the
variant before it, and a 10-call block right after a low-power entry ran before the power cap
pulled the clock back, up to ~10% fast (bench/results/attention_order_ab.json); figures
recorded before then read ours high by up to ~5-9% against cuDNN at some shapes. The JSON's
"timing" records the order, the warm-up, rounds and iters. A figure is the median of its
rounds, and each row also keeps its rounds and the median of the per-round ratio ours / best
peer ("paired_ratio_best_peer": the two sides of a round ran seconds apart, so clock drift
over the grid cancels). Before 2026-12-01 one pass per entry (20 calls): a D128 S4k causal fwd
+ bwd row read 0.946x there against 1.046x in a balanced A/B of the same build in the same
hour.
--clocks (with --bench): nvidia-smi samples the SM clock and board power every --clocks-ms
while the rounds run (benchutil.GpuSampler); each row gets "clocks", per entry the means of
the samples taken while that entry's blocks of calls ran: whether a faster or slower entry
ran at another clock (the H200 caps its board power), e.g. the Hopper backward's persistent
walk at head dim 128 (docs/ATTENTION.md).
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # --table needs no torch
    torch = None

C = ctypes
i64, vp, f32, cint = C.c_int64, C.c_void_p, C.c_float, C.c_int
I64x3 = i64 * 3
DT = {torch.float16: 2, torch.bfloat16: 3} if torch else {}


class Shim:
    def __init__(self, path):
        L = self.lib = C.CDLL(path)
        L.shim_init.argtypes = [cint]
        L.shim_last_error.restype = C.c_char_p
        L.shim_attn_sm90.argtypes = [vp, cint, i64, i64, i64, i64, i64, i64, f32, i64, i64,
                                     vp, I64x3, vp, I64x3, vp, I64x3, vp, I64x3, vp, I64x3,
                                     C.POINTER(cint)]
        L.shim_attn_fwd.argtypes = [vp, cint, i64, i64, i64, i64, i64, i64, cint, vp, vp, vp,
                                    vp, vp]
        L.shim_attn_bwd.argtypes = [vp, cint, i64, i64, i64, i64, i64, i64, cint, vp, vp, vp,
                                    vp, vp, vp, vp, vp, vp]
        st = L.shim_init(torch.cuda.current_device())
        if st != 0:
            raise RuntimeError("shim_init: " + L.shim_last_error().decode())

    def err(self):
        return self.lib.shim_last_error().decode()


def stream():
    return torch.cuda.current_stream().cuda_stream


def bshd_strides(t):
    """(batch, token, head) element strides of a [B, S, H, D] view."""
    return I64x3(t.stride(0), t.stride(1), t.stride(2))


def sm90_call(S, q, k, v, out, lse, scale, wl=-1, wr=-1):
    """Closure calling the Hopper kernel on [B,S,H,D] views; lse is a [B,H,S] view or None."""
    B, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    ls = I64x3(lse.stride(0), lse.stride(2), lse.stride(1)) if lse is not None else I64x3(0, 0, 0)
    args = (None, DT[q.dtype], B, hq, hkv, d, sq, sk, scale, wl, wr,
            q.data_ptr(), bshd_strides(q), k.data_ptr(), bshd_strides(k), v.data_ptr(),
            bshd_strides(v), out.data_ptr(), bshd_strides(out),
            lse.data_ptr() if lse is not None else None, ls)
    handled = cint(0)

    def f():
        st = S.lib.shim_attn_sm90(stream(), *args[1:], C.byref(handled))
        if st != 0:
            raise RuntimeError("sm90 forward: " + S.err())
        return bool(handled.value)
    return f


# ---------------------------------------------------------------------------------------
# reference

def reference(q, k, v, scale, wl, wr):
    """float64 out [B,Sq,Hq,D] and lse [B,Hq,Sq] with the library's bottom-right masks."""
    B, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qd = q.double().transpose(1, 2)
    kd = k.double().transpose(1, 2).repeat_interleave(g, dim=1)
    vd = v.double().transpose(1, 2).repeat_interleave(g, dim=1)
    s = torch.matmul(qd, kd.transpose(-1, -2)) * scale
    i = torch.arange(sq, device=q.device).view(-1, 1) + (sk - sq)
    j = torch.arange(sk, device=q.device).view(1, -1)
    ok = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if wr >= 0:
        ok &= j <= i + wr
    if wl >= 0:
        ok &= j >= i - wl
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    p = torch.nan_to_num(p, nan=0.0)
    out = torch.matmul(p, vd).transpose(1, 2)
    return out, lse


def rnd(shape, dtype):
    return (torch.randn(shape, device="cuda", dtype=torch.float32)).to(dtype)


def make_qkv(B, sq, sk, hq, hkv, d, dtype, layout):
    """q, k, v as [B,S,H,D] views in the given memory layout."""
    if layout == "bshd":
        return rnd((B, sq, hq, d), dtype), rnd((B, sk, hkv, d), dtype), rnd((B, sk, hkv, d), dtype)
    if layout == "bhsd":
        f = lambda s, h: rnd((B, h, s, d), dtype).transpose(1, 2)
        return f(sq, hq), f(sk, hkv), f(sk, hkv)
    if layout == "packed":  # one qkv tensor [B, S, 3, H, D] (needs sq == sk, hq == hkv)
        qkv = rnd((B, sq, 3, hq, d), dtype)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if layout == "padded":  # rows padded by 8 elements after D, heads interleaved
        f = lambda s, h: rnd((B, s, h, d + 8), dtype)[..., :d]
        return f(sq, hq), f(sk, hkv), f(sk, hkv)
    raise ValueError(layout)


def guarded(shape, dtype, pad):
    """A NaN-filled view of `shape` inside a larger NaN buffer (pad elements on the last
    dim of each row); returns (view, buffer)."""
    buf = torch.full(shape[:-1] + (shape[-1] + pad,), float("nan"), device="cuda", dtype=dtype)
    return buf[..., : shape[-1]], buf


class Checker:
    def __init__(self):
        self.fails = 0
        self.n = 0

    def report(self, name, ok, msg):
        self.n += 1
        if not ok:
            self.fails += 1
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {msg}", flush=True)


def broken_variant(env):
    """The env setting of a variant that hung in the device script's smoke step
    (OT_BENCH_BROKEN="KEY=VAL,..."), or None."""
    broken = [x for x in os.environ.get("OT_BENCH_BROKEN", "").split(",") if x]
    for k_, v_ in env.items():
        if f"{k_}={v_}" in broken:
            return f"{k_}={v_}"
    return None


from benchutil import GpuSampler, env_set, round_order  # noqa: E402  (env_set: the OT_ATTN_SM90_* switches, read per call)


def check_case(S, ck, B, sq, sk, hq, hkv, d, dtype=None, wl=-1, wr=-1, scale=None,
               layout="bshd", expect_handled=True, with_lse=True, env=None):
    dtype = dtype or torch.bfloat16
    torch.manual_seed(1000 + sq * 7 + sk * 13 + d + hq + wl * 3 + wr * 5)
    env = env or {}
    if broken_variant(env):
        ck.report(f"d{d} sq{sq} sk{sk} {env}", False, f"not run: {broken_variant(env)} hung in smoke")
        return
    with env_set(env):
        _check_case(S, ck, B, sq, sk, hq, hkv, d, dtype, wl, wr, scale, layout, expect_handled,
                    with_lse, " ".join(f"{k_[13:]}={v_}" for k_, v_ in env.items()))


def _check_case(S, ck, B, sq, sk, hq, hkv, d, dtype, wl, wr, scale, layout, expect_handled,
                with_lse, tag):
    q, k, v = make_qkv(B, sq, sk, hq, hkv, d, dtype, layout)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out, obuf = guarded((B, sq, hq, d), dtype, 8)
    lse_t, lbuf = guarded((B, hq, sq), torch.float32, 4)
    name = (f"{str(dtype)[6:]} B{B} sq{sq} sk{sk} h{hq}/{hkv} d{d} wl{wl} wr{wr} "
            f"scale{scale:.3g} {layout}{'' if with_lse else ' nolse'} {tag}")
    handled = sm90_call(S, q, k, v, out, lse_t if with_lse else None, scale, wl, wr)()
    torch.cuda.synchronize()
    if not expect_handled:
        ck.report(name, not handled and bool(torch.isnan(obuf).all()),
                  f"handled={handled} (expected false, output untouched)")
        return
    if not handled:
        ck.report(name, False, "not handled")
        return
    ref, ref_lse = reference(q, k, v, scale, wl, wr)
    err = (out.double() - ref).abs()
    bf = dtype == torch.bfloat16
    atol, rtol = (1.2e-2, 1.2e-2) if bf else (2e-3, 2e-3)
    tol = atol + rtol * ref.abs()
    bad = ~(err <= tol)
    guard_ok = bool(torch.isnan(obuf[..., d:]).all())
    msg = f"max err {err.max().item():.2e}"
    ok = not bool(bad.any()) and guard_ok
    if not guard_ok:
        msg += " (guard overwritten)"
    if with_lse:
        finite = torch.isfinite(ref_lse)
        lerr = (lse_t.double() - ref_lse).abs()
        lok = bool((lerr[finite] <= 1e-3 + 1e-4 * ref_lse[finite].abs()).all()) and bool(
            (lse_t[~finite] == float("-inf")).all()) and bool(torch.isnan(lbuf[..., sq:]).all())
        msg += f", lse max err {lerr[finite].max().item() if finite.any() else 0:.2e}"
        ok = ok and lok
    if bad.any():
        idx = bad.nonzero()[0].tolist()
        msg += f", first bad at {idx}: got {out[tuple(idx)].item()} ref {ref[tuple(idx)].item()}"
    ck.report(name, ok, msg)


def run_checks(S, small=False):
    ck = Checker()
    bf, fp = torch.bfloat16, torch.float16
    if small:
        for d in (64, 128, 256):
            check_case(S, ck, 1, 150, 200, 2, 1, d, wr=0)
            check_case(S, ck, 1, 130, 190, 2, 2, d)
        return ck
    for d in (64, 128, 256):
        for wr in (-1, 0):
            check_case(S, ck, 2, 1000, 1000, 4, 2, d, wr=wr)
            check_case(S, ck, 1, 333, 517, 2, 1, d, wr=wr)
            check_case(S, ck, 1, 517, 333, 2, 2, d, wr=wr)
        check_case(S, ck, 1, 200, 300, 4, 4, d, dtype=fp, wr=0)
        check_case(S, ck, 1, 257, 129, 2, 1, d, dtype=fp)
    # tiny and degenerate lengths
    for d in (64, 128):
        check_case(S, ck, 3, 1, 77, 4, 2, d)
        check_case(S, ck, 3, 1, 77, 4, 2, d, wr=0)
        check_case(S, ck, 2, 77, 1, 4, 2, d)
        check_case(S, ck, 2, 77, 1, 4, 2, d, wr=0)   # most rows see no key
        check_case(S, ck, 1, 1, 1, 1, 1, d)
        check_case(S, ck, 1, 300, 100, 2, 2, d, wr=0)
    # sliding windows
    for d in (64, 128, 256):
        check_case(S, ck, 1, 700, 700, 2, 1, d, wl=64, wr=0)
        check_case(S, ck, 1, 600, 650, 2, 2, d, wl=100, wr=37)
        check_case(S, ck, 1, 500, 400, 2, 2, d, wl=-1, wr=150)
        check_case(S, ck, 1, 450, 450, 2, 2, d, wl=90, wr=-1)
    # long sequences (many ring phases), MQA, custom scale, no lse
    check_case(S, ck, 1, 4096, 4096, 2, 1, 128)
    check_case(S, ck, 1, 4096, 4096, 2, 1, 128, wr=0)
    check_case(S, ck, 1, 3000, 5000, 4, 1, 64, wr=0, scale=0.3)
    check_case(S, ck, 1, 2048, 2048, 2, 2, 256, wr=0, with_lse=False)
    # more tiles than SMs: persistent CTAs (rings and the Q barrier across tiles), causal
    # tiles with no visible key among them (Sq > Sk), sections of heads (the last one short)
    for d in (64, 128, 256):
        for wr in (-1, 0):
            check_case(S, ck, 4, 1000, 1000, 8, 2, d, wr=wr)
        check_case(S, ck, 3, 700, 300, 16, 4, d, wr=0)
    check_case(S, ck, 1, 4096, 8192, 5, 5, 256, wr=0)
    check_case(S, ck, 2, 1500, 1500, 12, 3, 128, wl=200, wr=0)
    # the other settings of the switches
    for d in (64, 128, 256):
        check_case(S, ck, 2, 333, 517, 4, 2, d, wr=0, env={"OT_ATTN_SM90_GRID": "3"})
        check_case(S, ck, 2, 517, 333, 4, 2, d, env={"OT_ATTN_SM90_GRID": "5"})
    for d in (64, 128):
        check_case(S, ck, 4, 1000, 900, 8, 2, d, wr=0, env={"OT_ATTN_SM90_NONPERSISTENT": "1"})
        check_case(S, ck, 4, 1000, 900, 8, 2, d, env={"OT_ATTN_SM90_TILE": "small"})
    # the rescale threshold (kFlResc, OT_ATTN_SM90_RESC) off and on where it is compiled; with
    # scale 1 the row max of later key tiles grows by more than 2^8 (the rebase path)
    for d in (128, 256):
        for resc in ("0", "1"):
            env = {"OT_ATTN_SM90_RESC": resc}
            check_case(S, ck, 1, 1000, 1000, 4, 2, d, wr=0, scale=1.0, env=env)
            check_case(S, ck, 1, 700, 900, 4, 4, d, scale=1.0, env=env)
            check_case(S, ck, 2, 517, 333, 4, 2, d, wl=50, wr=0, env={**env, "OT_ATTN_SM90_GRID": "3"})
    # head dim 64: 3 consumer warpgroups (192-row tiles, the default except for masked calls
    # of at most 64 query tiles) and 2 (OT_ATTN_SM90_WG forces either)
    wg2, wg3 = {"OT_ATTN_SM90_WG": "2"}, {"OT_ATTN_SM90_WG": "3"}
    for wr in (-1, 0):
        check_case(S, ck, 2, 1000, 1000, 4, 2, 64, wr=wr, env=wg3)
        check_case(S, ck, 1, 333, 517, 2, 1, 64, wr=wr, env=wg3)
        check_case(S, ck, 1, 517, 333, 2, 2, 64, wr=wr, env=wg3)
        check_case(S, ck, 4, 1000, 1000, 8, 2, 64, wr=wr, env=wg3)
        check_case(S, ck, 4, 1000, 1000, 8, 2, 64, wr=wr, env=wg2)
        check_case(S, ck, 1, 9000, 9000, 2, 1, 64, wr=wr)
    check_case(S, ck, 1, 200, 300, 4, 4, 64, dtype=fp, wr=0, env=wg3)
    check_case(S, ck, 1, 257, 129, 2, 1, 64, dtype=fp, env=wg3)
    check_case(S, ck, 2, 77, 1, 4, 2, 64, wr=0, env=wg3)
    check_case(S, ck, 1, 1, 1, 1, 1, 64, env=wg3)
    check_case(S, ck, 1, 700, 700, 2, 1, 64, wl=64, wr=0, env=wg3)
    check_case(S, ck, 1, 600, 650, 2, 2, 64, wl=100, wr=37, env=wg3)
    check_case(S, ck, 1, 3000, 5000, 4, 1, 64, wr=0, scale=0.3, env=wg3)
    check_case(S, ck, 3, 700, 300, 16, 4, 64, wr=0, env={**wg3, "OT_ATTN_SM90_GRID": "3"})
    check_case(S, ck, 2, 333, 517, 4, 2, 64, env={**wg3, "OT_ATTN_SM90_GRID": "3"})
    check_case(S, ck, 2, 517, 333, 4, 2, 64, wr=0, env={**wg3, "OT_ATTN_SM90_GRID": "5"})
    check_case(S, ck, 2, 300, 400, 4, 2, 64, layout="padded", wr=0, env=wg3)
    check_case(S, ck, 2, 300, 300, 4, 4, 64, layout="packed", env=wg3)
    check_case(S, ck, 4, 1000, 900, 8, 2, 64, wr=0, env={**wg3, "OT_ATTN_SM90_NONPERSISTENT": "1"})
    # layouts
    for d in (64, 128):
        check_case(S, ck, 2, 300, 300, 4, 4, d, layout="packed", wr=0)
        check_case(S, ck, 2, 300, 400, 4, 2, d, layout="bhsd")
        check_case(S, ck, 2, 300, 400, 4, 2, d, layout="padded", wr=0)
    # not covered: must decline and write nothing
    check_case(S, ck, 1, 100, 100, 2, 2, 96, expect_handled=False)
    check_case(S, ck, 1, 100, 100, 2, 2, 32, expect_handled=False)
    return ck


def check_api(S, ck):
    """Forward (+ backward when available) through the public API on one small case."""
    B, s, h, d = 2, 300, 4, 128
    for causal in (0, 1):
        q, k, v = make_qkv(B, s, s, h, h, d, torch.bfloat16, "bshd")
        out = torch.full_like(q, float("nan"))
        lse = torch.full((B, h, s), float("nan"), device="cuda")
        st = S.lib.shim_attn_fwd(stream(), 3, B, h, h, d, s, s, causal, q.data_ptr(),
                                 k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr())
        torch.cuda.synchronize()
        if st != 0:
            print(f"api forward not available: {S.err()}")
            return False
        ref, _ = reference(q, k, v, 1 / math.sqrt(d), -1, 0 if causal else -1)
        err = (out.double() - ref).abs().max().item()
        ck.report(f"api forward causal={causal}", err < 2e-2, f"max err {err:.2e}")
    return True


# ---------------------------------------------------------------------------------------
# benchmark

# --sleep-us N: a GPU spin of N microseconds queued before each timed call's start event, so
# that the call's host work (the library's argument checks and tensor-map encodes; torch
# SDPA's dispatch; the environment scan of an --ab variant's OT_ATTN_SM90_* switches) runs
# while the GPU is still busy and the events time the kernels alone. 0 (the default, every
# record so far): the host work between the start event and the launch is in the time.
SLEEP_US = 0
WARM_MS_DEFAULT = 100.0


def time_ms(fn, iters=20, warmup=3, warm_ms=None):
    """Median ms of `iters` calls of fn (CUDA events, each call synchronized), after `warmup`
    calls and then, where warm_ms > 0, more calls until warm_ms of wall time has passed: the
    chip's clock under its power cap then is this entry's own steady state, not what the
    entry run before left (a block of ~10 ms right after a low-power peer ran up to ~10%
    fast on the H200: bench_attention.py's docstring, --warm-ms). warm_ms None:
    WARM_MS_DEFAULT (what attn_fwd_variants.py and ab_attention_bwd.py get; their --warm-ms
    sets it)."""
    if warm_ms is None:
        warm_ms = WARM_MS_DEFAULT
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if warm_ms > 0:
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < warm_ms:
            fn()
            torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if SLEEP_US > 0:
            torch.cuda._sleep(int(SLEEP_US * 2000))   # ~2 GHz SM clock: cycles
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


WG2 = {"OT_ATTN_SM90_WG": "2"}
WG3 = {"OT_ATTN_SM90_WG": "3"}


def variant_envs(d, s, causal):
    """Other settings of the Hopper kernel timed on the same inputs (OT_ATTN_SM90_* switches of
    src/cuda/sm90/attention_fwd_sm90.cu), for the record and for choosing the defaults.
    Variants that hung in the smoke step (OT_BENCH_BROKEN) are left out."""
    v = []
    if d == 64:
        v.append(("2 consumer WGs", WG2))
        v.append(("3 consumer WGs", WG3))
        if causal:
            v.append(("2 WGs, one CTA per tile", {**WG2, "OT_ATTN_SM90_NONPERSISTENT": "1"}))
            v.append(("3 WGs, one CTA per tile", {**WG3, "OT_ATTN_SM90_NONPERSISTENT": "1"}))
    if d == 256 or (d == 128 and (causal or s <= 2048)):   # where kFlResc is compiled
        v.append(("rescale every step", {"OT_ATTN_SM90_RESC": "0"}))
        v.append(("rescale on max growth > 2^8", {"OT_ATTN_SM90_RESC": "1"}))
    return [(n, e) for n, e in v if not broken_variant(e)]


def timed_rounds(entries, rounds, iters, sampler=None, order="balanced", warm_ms=None):
    """{name: [ms per round]} for entries [(name, fn, ctx)]: each round times every entry
    (median of `iters` calls after 2 warm-ups and warm_ms (None: WARM_MS_DEFAULT) of more
    calls, inside ctx() when ctx is not None -- e.g. sdpa_kernel, entered once per block of
    calls, not per call).
    order "balanced": round r runs the entries in row r of a Williams Latin square
    (benchutil.round_order): over len(entries) rounds (2x for an odd count) every entry takes
    every position and runs right after every other entry equally often. order "rotate" (the
    order before 2026-12-03's twenty-seventh session): round r starts one entry later, a cyclic
    rotation that keeps each entry's predecessor -- with 3 entries ours always ran right
    after flash, an --ab variant right after flash or the variant before it, and the entry
    after the low-power flash peer ran up to ~10% fast (bench/results/attention_order_ab.json).
    sampler (benchutil.GpuSampler): each block of calls is a span of the entry's name."""
    if order not in ("balanced", "rotate"):
        raise ValueError(f"order: '{order}' is not balanced or rotate")
    got = {n: [] for n, _, _ in entries}
    for r in range(rounds):
        idx = (round_order(len(entries), r) if order == "balanced"
               else [(r + j) % len(entries) for j in range(len(entries))])
        for i in idx:
            n, fn, ctx = entries[i]
            with (ctx() if ctx is not None else contextlib.nullcontext()), \
                    (sampler.span(n) if sampler is not None else contextlib.nullcontext()):
                got[n].append(time_ms(fn, iters=iters, warmup=2, warm_ms=warm_ms))
    return got


def gemm_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.matmul(a, b), iters=20, warmup=5)
    return 2 * 8192 ** 3 / ms / 1e9


def bench_cases(args):
    """(B, H, HKV, S, D) of each benchmark case: --shapes when given (e.g. the engine's
    Llama-3-8B prefill, 1:32:8:2048:128), else the grid of --dims x --seqs (batch * seq =
    32k tokens, heads * D = 2048, no GQA)."""
    if args.shapes:
        out = []
        for spec in args.shapes.split(","):
            f = [int(x) for x in spec.split(":")]
            if len(f) != 5 or min(f) < 1 or f[1] % f[2]:
                raise SystemExit(f"--shapes: '{spec}' is not B:HQ:HKV:S:D with HQ a multiple of HKV")
            out.append(tuple(f))
        return out
    return [(32768 // s, 2048 // d, 2048 // d, s, d)
            for d in (int(x) for x in args.dims.split(","))
            for s in (int(x) for x in args.seqs.split(","))]


def ab_envs(args):
    """--ab 'NAME=K:V[,K:V];NAME=...' as [(NAME, {K: V})]; a key _causal_only (any value)
    times the variant in causal cases only, _full_only in non-causal ones only; _fb times
    it in forward + backward (through the API, as ours there) instead of the forward."""
    out = []
    for spec in filter(None, (args.ab or "").split(";")):
        name, _, kv = spec.partition("=")
        pairs = [x.split(":", 1) for x in kv.split(",") if x]
        env = dict(pairs) if all(len(x) == 2 for x in pairs) else {}
        if not name or not env:
            raise SystemExit(f"--ab: '{spec}' is not NAME=KEY:VALUE[,KEY:VALUE]")
        out.append((name, env))
    return out


def bench(S, args):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    gemm = gemm_tflops()
    print(f"cuBLAS bf16 GEMM 8192^3: {gemm:.0f} TFLOP/s", flush=True)
    rows = []
    sampler = GpuSampler(period_ms=args.clocks_ms) if args.clocks else None
    try:
        return _bench_cases(S, args, gemm, rows, sampler, SDPBackend, sdpa_kernel)
    finally:
        if sampler is not None:
            sampler.close()


def _bench_cases(S, args, gemm, rows, sampler, SDPBackend, sdpa_kernel):
    api_fwd = api_bwd = None  # probed on the first case
    for B, H, HKV, s, d in bench_cases(args):
        for causal in (False, True):
            gqa = HKV != H
            dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
            q, k, v = make_qkv(B, s, s, H, HKV, d, dt, "bshd")
            out = torch.empty_like(q)
            lse = torch.empty(B, H, s, device="cuda")
            flops = 4 * B * H * s * s * d / (2 if causal else 1)
            case = (f"D{d} S{s} {'causal' if causal else 'full'} {args.dtype} B{B} H{H}" +
                    (f" HKV{HKV}" if gqa else ""))
            f_ours = sm90_call(S, q, k, v, out, lse, 1 / math.sqrt(d), -1, 0 if causal else -1)
            f_ok = f_ours()
            if not f_ok and not args.api_fb_only:
                print(f"{case}: sm90 kernel did not take the call")
                continue
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            # the timed entries: (name, fn, flops, context); forward first, then
            # forward + backward (--api-fb-only where the Hopper forward declines, D 96:
            # forward + backward through the API only, no forward row)
            fwd, fb_entries = ([("ours", f_ours, flops, None)] if f_ok else []), []
            # --ab NAME=ENV[;NAME=ENV]: the same kernel under other OT_ATTN_SM90_* switches,
            # timed in the same rounds as ours and the peers (entries "ours NAME": not peers)
            for vname, venv in ab_envs(args):
                if (venv.get("_causal_only") and not causal) or (venv.get("_full_only") and causal):
                    continue
                if venv.get("_fb"):
                    continue    # forward + backward: added with ours there, below
                e = {k_: v_ for k_, v_ in venv.items() if not k_.startswith("_")}
                fwd.append((f"ours {vname}", f_ours, flops, lambda e=e: env_set(e)))
            for name, be in (("torch SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                             ("torch SDPA flash", SDPBackend.FLASH_ATTENTION)):
                backend = (lambda be=be: sdpa_kernel([be]))
                try:
                    # GQA: SDPA's enable_gqa (the peers read the kv heads as they are)
                    def fn():
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                       **({"enable_gqa": True} if gqa else {}))
                    with backend():
                        fn()
                    fwd.append((name, fn, flops, backend))
                    if args.fwd_only:
                        continue
                    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (qt, kt, vt))
                    do = torch.randn_like(qt)

                    # autograd.grad, not .backward(): the gradients come back as new
                    # tensors, as ours do, with no accumulation into .grad (an extra
                    # read-add-write of q, k and v per call after the first)
                    def fb(qg=qg, kg=kg, vg=vg, do=do):
                        o = F.scaled_dot_product_attention(
                            qg, kg, vg, is_causal=causal, **({"enable_gqa": True} if gqa else {}))
                        torch.autograd.grad(o, (qg, kg, vg), do)
                    with backend():
                        fb()
                    fb_entries.append((name, fb, 3.5 * flops, backend))
                except Exception as e:  # backend unavailable for this shape
                    print(f"{case}: {name} failed: {str(e)[:100]}")
            # forward + backward through the public API (the dispatcher and fa80's kernels)
            if api_bwd is not False and not args.fwd_only:
                dq, dk, dv, do = (torch.empty_like(x) for x in (q, k, v, q))
                do.normal_()

                def api_fb():
                    st = S.lib.shim_attn_fwd(stream(), DT[dt], B, H, HKV, d, s, s, int(causal),
                                             q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                             out.data_ptr(), lse.data_ptr())
                    st = st or S.lib.shim_attn_bwd(stream(), DT[dt], B, H, HKV, d, s, s,
                                                   int(causal),
                                                   q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                   out.data_ptr(), do.data_ptr(), lse.data_ptr(),
                                                   dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
                    if st != 0:
                        raise RuntimeError(S.err())
                try:
                    api_fb()
                    api_bwd = True
                    fb_entries.insert(0, ("ours", api_fb, 3.5 * flops, None))
                    for vname, venv in ab_envs(args):
                        if (not venv.get("_fb") or (venv.get("_causal_only") and not causal)
                                or (venv.get("_full_only") and causal)):
                            continue
                        e = {k_: v_ for k_, v_ in venv.items() if not k_.startswith("_")}
                        fb_entries.append((f"ours {vname}", api_fb, 3.5 * flops,
                                           lambda e=e: env_set(e)))
                except RuntimeError as e:
                    print(f"forward+backward through the API not available: {e}")
                    api_bwd = False
            results, clocks = {}, {}
            for op, entries in (("attention_fwd", fwd), ("attention_fwd_bwd", fb_entries)):
                if not entries or entries[0][0] != "ours":
                    continue
                if sampler is not None:
                    sampler.reset()
                ms = timed_rounds([(n, f, c) for n, f, _, c in entries], args.rounds,
                                  args.iters, sampler, order=args.order, warm_ms=args.warm_ms)
                if sampler is not None:
                    clocks[op] = sampler.summary()
                tf = {n: [fl / m / 1e9 for m in ms[n]] for n, _, fl, _ in entries}
                results[op] = tf
            ours_f = (statistics.median(results["attention_fwd"]["ours"])
                      if "attention_fwd" in results else None)
            variants = {}
            if not args.no_variants:
                for vname, env in variant_envs(d, s, causal):
                    with env_set(env):
                        variants[vname] = round(flops / time_ms(f_ours) / 1e9, 1)
                    print(f"  variant {vname:28s} {case}: {variants[vname]:.1f} (default {ours_f:.1f})",
                          flush=True)
            for op, tf in results.items():
                ours = statistics.median(tf["ours"])
                peers = {n: statistics.median(v_) for n, v_ in tf.items()
                         if n != "ours" and not n.startswith("ours ")}
                ab = {n[5:]: {"median": round(statistics.median(v_), 1),
                              "paired_ratio_to_ours": round(statistics.median(
                                  b / o for b, o in zip(v_, tf["ours"])), 3)}
                      for n, v_ in tf.items() if n.startswith("ours ")}
                best_name = max(peers, key=peers.get) if peers else None
                best = peers[best_name] if peers else None
                paired = (statistics.median(o / b for o, b in zip(tf["ours"], tf[best_name]))
                          if peers else None)
                rows.append({"op": op, "case": case, "metric": "TFLOP/s",
                             "ours": round(ours, 1),
                             "peers": {k_: round(v_, 1) for k_, v_ in peers.items()},
                             "ratio_best_peer": round(ours / best, 3) if best else None,
                             "paired_ratio_best_peer": round(paired, 3) if paired else None,
                             "rounds": {k_: [round(x, 1) for x in v_] for k_, v_ in tf.items()},
                             "fraction_of_ceiling": round(ours / gemm, 3)})
                if op == "attention_fwd" and variants:
                    rows[-1]["variants"] = variants
                if op in clocks:
                    rows[-1]["clocks"] = clocks[op]
                    print(f"  clocks {case}: " + "  ".join(
                        f"{k_}: {c_['sm_mhz']:.0f} MHz {c_['power_w']:.0f} W"
                        for k_, c_ in clocks[op].items()), flush=True)
                if ab:
                    rows[-1]["ab"] = ab
                    for n, a_ in ab.items():
                        print(f"  ab {n:24s} {case}: {a_['median']:.1f} "
                              f"({a_['paired_ratio_to_ours']:.3f}x ours, paired)", flush=True)
                r = rows[-1]
                print(f"{op:18s} {case:34s} ours {r['ours']:6.1f}  " +
                      "  ".join(f"{k_.split()[-1]} {v_:6.1f}" for k_, v_ in r["peers"].items()) +
                      f"  ratio {r['ratio_best_peer']}  of-gemm {r['fraction_of_ceiling']}",
                      flush=True)
            del q, k, v, out, lse
            torch.cuda.empty_cache()
            if args.json:  # what is done so far survives a timeout
                write_json(args, gemm, rows)
    return gemm, rows


def write_json(args, gemm, rows):
    doc = {"bench": "attention", "device": torch.cuda.get_device_name(),
           "date": datetime.date.today().isoformat(), "commit": args.commit,
           "command": args.command, "ceilings": {"gemm_bf16_TFLOPs": round(gemm, 1)},
           "timing": {"order": args.order, "warm_ms": args.warm_ms, "rounds": args.rounds,
                      "iters": args.iters},
           "rows": rows}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    return doc


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in doc["rows"] if r["op"] == "attention_fwd"]
    dims = sorted({int(r["case"].split()[0][1:]) for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(5 * len(dims), 4), squeeze=False)
    for ax, d in zip(axes[0], dims):
        for causal, ls in (("full", "-"), ("causal", "--")):
            sel = [r for r in rows if r["case"].startswith(f"D{d} ") and f" {causal} " in r["case"]]
            xs = [int(r["case"].split()[1][1:]) for r in sel]
            ax.plot(xs, [r["ours"] for r in sel], "o" + ls, color="C0", label=f"ours {causal}")
            for i, peer in enumerate(("torch SDPA cuDNN", "torch SDPA flash")):
                ax.plot(xs, [r["peers"].get(peer, float("nan")) for r in sel], "s" + ls,
                        color=f"C{i + 1}", label=f"{peer.split()[-1]} {causal}")
        ax.axhline(doc["ceilings"]["gemm_bf16_TFLOPs"], color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"attention forward bf16, D={d}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(doc):
    """The PERFORMANCE.md table of a result file."""
    lines = ["| op | case | ours | cuDNN | flash | ours / best peer | of GEMM |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        pe = r["peers"]
        f = lambda x: "-" if x is None else f"{x:.0f}"
        lines.append(f"| {'fwd' if r['op'] == 'attention_fwd' else 'fwd+bwd'} | {r['case']} | "
                     f"{r['ours']:.0f} | {f(pe.get('torch SDPA cuDNN'))} | "
                     f"{f(pe.get('torch SDPA flash'))} | {r['ratio_best_peer']:.2f} | "
                     f"{r['fraction_of_ceiling']:.2f} |")
    return "\n".join(lines)


SMOKE = [("default", None, {}),
         ("2 consumer WGs", "OT_ATTN_SM90_WG=2", {**WG2, "OT_ATTN_SM90_GRID": "2"}),
         ("3 consumer WGs", "OT_ATTN_SM90_WG=3", {**WG3, "OT_ATTN_SM90_GRID": "2"}),
         ("rescale on max growth", "OT_ATTN_SM90_RESC=1", {"OT_ATTN_SM90_RESC": "1", "OT_ATTN_SM90_GRID": "2"}),
         ("rescale every step", "OT_ATTN_SM90_RESC=0", {"OT_ATTN_SM90_RESC": "0", "OT_ATTN_SM90_GRID": "2"})]


def smoke(S, seconds=20):
    """The small checks under each variant, one process: a variant whose kernel hangs (a wrong
    barrier phase) is named on stdout (HUNG KEY=VAL) and the process exits with 3, so that the
    device script can run the rest without it (OT_BENCH_BROKEN)."""
    import threading
    rc = 0
    for name, key, env in SMOKE:
        if key and broken_variant({key.split("=")[0]: key.split("=")[1]}):
            continue
        timer = threading.Timer(seconds, lambda k=key: (print(f"HUNG {k}", flush=True), os._exit(3)))
        timer.start()
        with env_set(env):
            ck = run_checks(S, small=True)
        timer.cancel()
        print(f"smoke {name}: {ck.n - ck.fails}/{ck.n} passed", flush=True)
        rc = rc or (1 if ck.fails else 0)
    return rc


def sanitize(S):
    """Each kernel variant once on small shapes (for compute-sanitizer), no reference; the
    persistent multi-tile path with 2 CTAs."""
    os.environ["OT_ATTN_SM90_GRID"] = "2"
    for env in ({}, WG3, WG2):
        if broken_variant(env):
            continue
        for d in ((64,) if env.get("OT_ATTN_SM90_WG") else (64, 128, 256)):
            for wr in (-1, 0):
                q, k, v = make_qkv(1, 150 if wr < 0 else 450, 200, 2, 1, d, torch.bfloat16, "bshd")
                out = torch.empty_like(q)
                lse = torch.empty(1, 2, q.shape[1], device="cuda")
                with env_set(env):
                    h = sm90_call(S, q, k, v, out, lse, 0.125, -1, wr)()
                torch.cuda.synchronize()
                print(f"sanitize run {env} d{d} wr{wr} handled={h} "
                      f"finite={bool(torch.isfinite(out).all())}")


def profile_one(S):
    """One forward call of the benchmark's D128 S4k non-causal case (for ncu -c 1)."""
    B, H, s, d = 8, 16, 4096, 128
    q, k, v = make_qkv(B, s, s, H, H, d, torch.bfloat16, "bshd")
    out = torch.empty_like(q)
    lse = torch.empty(B, H, s, device="cuda")
    sm90_call(S, q, k, v, out, lse, 1 / math.sqrt(d))()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim")
    ap.add_argument("--table", help="print the markdown table of this result file and exit")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--dims", default="128,64,256")
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--shapes", default="",
                    help="explicit cases B:HQ:HKV:S:D[,...] instead of the --dims x --seqs grid")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--ab", default="",
                    help="'NAME=KEY:VALUE[,KEY:VALUE];...': the forward under these switches "
                         "timed in the same rounds (e.g. 'static=OT_ATTN_SM90_DYN:0,_causal_only:1')")
    ap.add_argument("--clocks", action="store_true",
                    help="--bench: sample the SM clock and board power (nvidia-smi) while each "
                         "entry is timed; each row gets their means per entry ('clocks')")
    ap.add_argument("--clocks-ms", type=int, default=20,
                    help="--clocks: the sampling period (ms)")
    ap.add_argument("--rounds", type=int, default=6,
                    help="rounds per case (--bench; each times every entry; the order balances "
                         "over len(entries) rounds, 2x for an odd count)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                    help="--bench: the storage type of q, k, v (ours and the peers alike)")
    ap.add_argument("--order", choices=("balanced", "rotate"), default="balanced",
                    help="--bench: each round's order of the entries: rows of a Williams Latin "
                         "square (every entry right after every other equally often over "
                         "len(entries) rounds, 2x for an odd count) or the cyclic rotation used "
                         "before 2026-12-03 (each entry's predecessor fixed)")
    ap.add_argument("--warm-ms", type=float, default=WARM_MS_DEFAULT,
                    help="--bench: wall ms of untimed calls before each entry's timed calls in "
                         "each round (the clock settles under the power cap to the entry's own)")
    ap.add_argument("--iters", type=int, default=10,
                    help="timed calls per entry and round (their median)")
    ap.add_argument("--fwd-only", action="store_true", help="no forward + backward timings")
    ap.add_argument("--api-fb-only", action="store_true",
                    help="shapes the Hopper forward declines (D 96): forward + backward through "
                         "the API only (use with --no-variants)")
    ap.add_argument("--sleep-us", type=float, default=0.0,
                    help="a GPU spin this long before each timed call (its host work then "
                         "overlaps it: kernel time alone); 0: host work included")
    ap.add_argument("--smoke", action="store_true", help="small checks under every variant")
    ap.add_argument("--profile-one", action="store_true", help="one D128 S4k call (for ncu)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default=" ".join(sys.argv))
    args = ap.parse_args()
    global SLEEP_US
    SLEEP_US = args.sleep_us
    ab_envs(args)   # a malformed --ab stops here, before any GPU work
    bench_cases(args)
    if args.table:
        with open(args.table) as f:
            print(markdown(json.load(f)))
        return 0
    S = Shim(args.shim)
    rc = 0
    if args.smoke:
        rc = smoke(S)
    if args.profile_one:
        profile_one(S)
    if args.sanitize:
        sanitize(S)
    if args.check:
        ck = run_checks(S, args.small)
        if not args.small:
            check_api(S, ck)
        print(f"check: {ck.n - ck.fails}/{ck.n} passed, {ck.fails} failed")
        rc = 1 if ck.fails else 0
    if args.bench:
        gemm, rows = bench(S, args)
        doc = write_json(args, gemm, rows) if args.json else {
            "ceilings": {"gemm_bf16_TFLOPs": gemm}, "rows": rows}
        if args.plot:
            try:
                plot(doc, args.plot)
            except Exception as e:
                print(f"plot failed: {e}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
