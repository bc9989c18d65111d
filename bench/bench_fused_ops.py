#!/usr/bin/env python3
"""bench_fused_ops.py -- correctness checks and benchmarks of the CUDA fused ops
(RMSNorm, LayerNorm, RoPE, SwiGLU/GeGLU; forward and backward) against torch.

Our kernels are called through bench/fused_ops_shim.c (ctypes, raw device pointers
of torch tensors, torch's current stream), so this runs without the Python frontend.

  python3 bench/bench_fused_ops.py --shim build/libfused_ops_shim.so --check [--small]
  python3 bench/bench_fused_ops.py --shim ... --bench [--json bench/results/fused_ops.json]
  python3 bench/bench_fused_ops.py --shim ours.so --ab-shim parent=parent.so --bench (A/B)

--check compares every op with a float64 torch reference on odd shapes, strided
rows, fp32/fp16/bf16, in place and out of place, with NaN-poisoned outputs.
--bench follows shared/BENCH.md: copy bandwidth measured in the same run, each case
against torch eager, torch's fused function and torch.compile of the eager
composite; CUDA events around batches of calls, warm-up, median of >= 20; two input
sets alternate (each > L2 at the benchmark sizes). Bytes = inputs read once +
outputs written once.
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

DT = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
C = ctypes
i64, vp, f32, f64, cint = C.c_int64, C.c_void_p, C.c_float, C.c_double, C.c_int


class Shim:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        L = self.lib
        L.shim_init.argtypes = [cint]
        L.shim_last_error.restype = C.c_char_p
        L.shim_norm_forward.argtypes = [cint, vp, cint, i64, i64, vp, i64, vp, i64, vp, vp, f32,
                                        vp, i64, vp, i64, vp, vp]
        L.shim_norm_backward.argtypes = [cint, vp, cint, i64, i64, vp, i64, vp, i64, vp, i64, vp,
                                         vp, vp, f32, vp, i64, vp, vp]
        L.shim_rope.argtypes = [vp, cint, cint, cint, i64, i64, i64, i64, C.POINTER(vp),
                                C.POINTER(i64), C.POINTER(i64), vp, cint, i64, i64, vp, i64, f64,
                                f64, f64, f64, f64]
        L.shim_glu_forward.argtypes = [vp, cint, cint, i64, i64, vp, i64, vp, i64, vp, i64]
        L.shim_glu_backward.argtypes = [vp, cint, cint, i64, i64, vp, i64, vp, i64, vp, i64, vp,
                                        i64, vp, i64]
        if hasattr(L, "shim_glu_backward_recompute"):   # builds of 2026-12-01 on
            L.shim_glu_backward_recompute.argtypes = [vp, cint, cint, i64, i64, vp, i64, vp, i64,
                                                      vp, i64, vp, i64, vp, i64, vp, i64]
        L.shim_ce_forward.argtypes = [vp, cint, i64, i64, vp, i64, vp, i64, cint, i64, f32, cint,
                                      vp, i64, vp, i64]
        L.shim_ce_backward.argtypes = [vp, cint, i64, i64, vp, i64, vp, i64, vp, i64, cint, i64,
                                       f32, cint, vp, i64, vp, i64]
        st = L.shim_init(torch.cuda.current_device())
        if st != 0:
            raise RuntimeError("shim_init: " + L.shim_last_error().decode())

    def check(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: status {st}: {self.lib.shim_last_error().decode()}")


def P(t):
    return None if t is None else t.data_ptr()


def RS(t):
    return 0 if t is None else t.stride(0)


def stream():
    return torch.cuda.current_stream().cuda_stream


# ---------------------------------------------------------------------------------------
# Calls (each returns a zero-argument closure with its ctypes arguments bound, so that
# timing loops pay no argument marshalling beyond the ctypes call itself)

def norm_fwd_call(S, layer, x, res, w, b, eps, out, rout, mean, rstd):
    rows, cols = x.shape
    args = (layer, stream(), DT[x.dtype], rows, cols, P(x), RS(x), P(res), RS(res), P(w), P(b),
            eps, P(out), RS(out), P(rout), RS(rout), P(mean), P(rstd))
    f = S.lib.shim_norm_forward
    return lambda: S.check(f(*args), "norm_forward")


def norm_bwd_call(S, layer, dy, dres, h, w, mean, rstd, eps, dx, dw, db):
    rows, cols = h.shape
    args = (layer, stream(), DT[h.dtype], rows, cols, P(dy), RS(dy), P(dres), RS(dres), P(h),
            RS(h), P(w), P(mean), P(rstd), eps, P(dx), RS(dx), P(dw), P(db))
    f = S.lib.shim_norm_backward
    return lambda: S.check(f(*args), "norm_backward")


def _heads4(t):
    """[B, S, H, D] or [T, H, D] -> (heads, (stride_b, stride_s, stride_h))"""
    if t is None:
        return 0, (0, 0, 0)
    if t.dim() == 4:
        return t.shape[2], (t.stride(0), t.stride(1), t.stride(2))
    return t.shape[1], (0, t.stride(0), t.stride(1))


def rope_call(S, q, k, q_out, k_out, pos, cache, mode=0, rotary_dim=0, theta=10000.0,
              inverse=False, llama3=None):
    if q.dim() == 4:
        B, Sq, _, D = q.shape
    else:
        B, (Sq, _, D) = 1, q.shape
    rd = rotary_dim or D
    ts = [q, k, q_out, k_out]
    ptrs = (vp * 4)(*[P(t) for t in ts])
    heads = (i64 * 4)()
    strides = (i64 * 12)()
    for i, t in enumerate(ts):
        h, s = _heads4(t)
        heads[i] = h
        strides[3 * i:3 * i + 3] = s
    if pos.dim() == 2:
        psb, pss = pos.stride(0), pos.stride(1)
    else:
        psb, pss = 0, pos.stride(0)
    l3 = llama3 or (0.0, 1.0, 4.0, 8192.0)
    args = (stream(), DT[q.dtype], mode, int(inverse), B, Sq, D, rd, ptrs, heads, strides, P(pos),
            int(pos.dtype == torch.int64), psb, pss, P(cache),
            0 if cache is None else cache.shape[0], theta, *l3)
    f = S.lib.shim_rope
    keep = (ptrs, heads, strides)  # noqa: F841 (keep the ctypes arrays alive)
    return lambda: S.check(f(*args), "rope") if keep else None


def glu_fwd_call(S, kind, gate, up, out):
    rows, Fd = out.shape
    args = (stream(), kind, DT[gate.dtype], rows, Fd, P(gate), RS(gate), P(up), RS(up), P(out),
            RS(out))
    f = S.lib.shim_glu_forward
    return lambda: S.check(f(*args), "glu_forward")


def glu_bwd_call(S, kind, dout, gate, up, dgate, dup):
    rows, Fd = dout.shape
    args = (stream(), kind, DT[gate.dtype], rows, Fd, P(dout), RS(dout), P(gate), RS(gate), P(up),
            RS(up), P(dgate), RS(dgate), P(dup), RS(dup))
    f = S.lib.shim_glu_backward
    return lambda: S.check(f(*args), "glu_backward")


def glu_bwd_recompute_call(S, kind, dout, gate, up, dgate, dup, out):
    rows, Fd = dout.shape
    args = (stream(), kind, DT[gate.dtype], rows, Fd, P(dout), RS(dout), P(gate), RS(gate), P(up),
            RS(up), P(dgate), RS(dgate), P(dup), RS(dup), P(out), RS(out))
    f = S.lib.shim_glu_backward_recompute
    return lambda: S.check(f(*args), "glu_backward_recompute")


def ce_fwd_call(S, z, labels, loss, lse, reduction=0, smoothing=0.0, ignore=-100):
    """reduction 0 MEAN, 1 SUM, 2 NONE (loss [N]); lse [N] or None."""
    N, V = z.shape
    args = (stream(), DT[z.dtype], N, V, P(z), RS(z), P(labels), labels.stride(0),
            int(labels.dtype == torch.int64), ignore, smoothing, reduction, P(loss),
            loss.stride(0) if reduction == 2 else 0, P(lse), RS(lse))
    f = S.lib.shim_ce_forward
    return lambda: S.check(f(*args), "ce_forward")


def ce_bwd_call(S, dloss, z, labels, lse, dz, reduction=0, smoothing=0.0, ignore=-100):
    N, V = z.shape
    args = (stream(), DT[z.dtype], N, V, P(dloss), dloss.stride(0) if reduction == 2 else 0,
            P(z), RS(z), P(labels), labels.stride(0), int(labels.dtype == torch.int64), ignore,
            smoothing, reduction, P(lse), RS(lse), P(dz), RS(dz))
    f = S.lib.shim_ce_backward
    return lambda: S.check(f(*args), "ce_backward")


# ---------------------------------------------------------------------------------------
# float64 references

def ref_norm(layer, h, w, b, eps):
    h = h.double()
    if layer:
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        y = (h - mu) / torch.sqrt(var + eps)
    else:
        y = h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y


def inv_freq_ref(rd, theta, llama3=None):
    f = [theta ** (-(2 * i) / rd) for i in range(rd // 2)]
    if llama3 and llama3[0] > 0:
        fac, low, high, orig = llama3
        out = []
        for x in f:
            wl = 2 * math.pi / x
            if wl < orig / high:
                out.append(x)
            elif wl > orig / low:
                out.append(x / fac)
            else:
                s = (orig / wl - low) / (high - low)
                out.append((1 - s) * x / fac + s * x)
        f = out
    return torch.tensor(f, dtype=torch.float64)


def ref_rope(x, pos, rd, mode, inv_freq, inverse):
    """x: [B, S, H, D] (double), pos: [B, S]"""
    x = x.double().clone()
    ang = pos.double()[..., None] * inv_freq.to(x.device)  # [B, S, rd/2]
    c, s = torch.cos(ang)[:, :, None, :], torch.sin(ang)[:, :, None, :]
    if inverse:
        s = -s
    if mode == 0:
        x1, x2 = x[..., :rd // 2].clone(), x[..., rd // 2:rd].clone()
        x[..., :rd // 2] = x1 * c - x2 * s
        x[..., rd // 2:rd] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., 0:rd:2].clone(), x[..., 1:rd:2].clone()
        x[..., 0:rd:2] = x1 * c - x2 * s
        x[..., 1:rd:2] = x2 * c + x1 * s
    return x


def act_ref(kind, g):
    g = g.double()
    if kind == 0:
        return g * torch.sigmoid(g)
    if kind == 1:
        return 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))
    return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))


# ---------------------------------------------------------------------------------------
# checks

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


class Checker:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def close(self, name, got, ref, tol):
        got = got.double()
        ref = ref.double()
        if not torch.isfinite(got).all():
            self.failed.append(f"{name}: non-finite output ({(~torch.isfinite(got)).sum().item()})")
            return
        num = (got - ref).norm().item()
        den = ref.norm().item() + 1e-30
        rel = num / den
        mx = (got - ref).abs().max().item() / (ref.abs().max().item() + 1e-30)
        if rel > tol or mx > 8 * tol:
            self.failed.append(f"{name}: rel err {rel:.3e} max {mx:.3e} > tol {tol:.1e}")
        else:
            self.passed += 1

    def equal(self, name, got, ref):
        if not torch.equal(got, ref):
            self.failed.append(f"{name}: not bit-equal (max diff "
                               f"{(got.double() - ref.double()).abs().max().item():.3e})")
        else:
            self.passed += 1


def rnd(*shape, dtype, lo=-2.0, hi=2.0):
    return (torch.rand(*shape, device="cuda", dtype=torch.float32) * (hi - lo) + lo).to(dtype)


def strided_rows(rows, cols, dtype, pad):
    """[rows, cols] view with row stride cols + pad (pad 0: contiguous)."""
    base = rnd(rows, cols + pad, dtype=dtype)
    return base[:, :cols]


def nan_like(t):
    return torch.full_like(t, float("nan"))


def check_norms(S, ck, small):
    # (3001, 4096): more rows than the persistent backward's grid holds, so each block
    # loops over several rows (and its ring wraps)
    shapes = [(37, 7), (5, 1000), (64, 4096), (3, 4104), (9, 40000)] + ([] if small else
                                                                         [(300, 8192), (17, 12288), (3001, 4096)])
    eps = 1e-5
    for layer in (0, 1):
        nm = "layernorm" if layer else "rmsnorm"
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for (rows, cols) in shapes:
                for fused in (False, True):
                    for pad in ((0, 8) if cols % 8 == 0 else (0, 3)):
                        tag = f"{nm} {str(dtype)[6:]} {rows}x{cols} res={int(fused)} pad={pad}"
                        x = strided_rows(rows, cols, dtype, pad)
                        r = strided_rows(rows, cols, dtype, pad) if fused else None
                        w = rnd(cols, dtype=dtype, lo=0.5, hi=1.5)
                        b = rnd(cols, dtype=dtype) if layer else None
                        out = nan_like(x)
                        rout = nan_like(x) if fused else None
                        mean = torch.full((rows,), float("nan"), device="cuda") if layer else None
                        rstd = torch.full((rows,), float("nan"), device="cuda")
                        norm_fwd_call(S, layer, x, r, w, b, eps, out, rout, mean, rstd)()
                        h = (x.double() + r.double()).to(dtype) if fused else x
                        if fused:
                            ck.equal(tag + " residual_out", rout, h)
                        ck.close(tag + " out", out, ref_norm(layer, h, w, b, eps), TOL[dtype])
                        hd = h.double()
                        if layer:
                            mu = hd.mean(-1)
                            # shifted: the mean of random data is near 0, so compare absolutely
                            ck.close(tag + " mean", mean.double() + 3, mu + 3, 1e-6)
                            var = ((hd - mu[:, None]) ** 2).mean(-1)
                        else:
                            var = (hd * hd).mean(-1)
                        ck.close(tag + " rstd", rstd, 1 / torch.sqrt(var + eps), 1e-5)
                        # backward (saved stats, and recomputed on the fused variant)
                        dy = strided_rows(rows, cols, dtype, pad)
                        dres = strided_rows(rows, cols, dtype, pad) if fused else None
                        dx = nan_like(dy)
                        dw = torch.full((cols,), float("nan"), device="cuda", dtype=dtype)
                        db = torch.full((cols,), float("nan"), device="cuda", dtype=dtype) if layer else None
                        use_stats = not fused
                        norm_bwd_call(S, layer, dy, dres, h, w, mean if use_stats else None,
                                      rstd if use_stats else None, eps, dx, dw, db)()
                        hh = h.double().clone().requires_grad_(True)
                        wd = w.double().clone().requires_grad_(True)
                        bd = b.double().clone().requires_grad_(True) if layer else None
                        y = ref_norm(layer, hh, wd, bd, eps)
                        gr = torch.autograd.grad(y, [hh, wd] + ([bd] if layer else []), dy.double())
                        dxr = gr[0] + (dres.double() if fused else 0)
                        ck.close(tag + " dx", dx, dxr, TOL[dtype] * 2)
                        ck.close(tag + " dweight", dw, gr[1], TOL[dtype] * 2)
                        if layer:
                            ck.close(tag + " dbias", db, gr[2], TOL[dtype] * 2)
            # in place: out = x, residual_out = residual, dx = dy
            rows, cols = 33, 4096
            x = rnd(rows, cols, dtype=dtype)
            r = rnd(rows, cols, dtype=dtype)
            w = rnd(cols, dtype=dtype, lo=0.5, hi=1.5)
            b = rnd(cols, dtype=dtype) if layer else None
            h = (x.double() + r.double()).to(dtype)
            ref = ref_norm(layer, h, w, b, eps)
            norm_fwd_call(S, layer, x, r, w, b, eps, x, r, None, None)()
            ck.equal(f"{nm} {dtype} in-place residual_out", r, h)
            ck.close(f"{nm} {dtype} in-place out", x, ref, TOL[dtype])
            dy = rnd(rows, cols, dtype=dtype)
            hh = h.double().clone().requires_grad_(True)
            y = ref_norm(layer, hh, w, b, eps)
            (gx,) = torch.autograd.grad(y, [hh], dy.double())
            norm_bwd_call(S, layer, dy, None, h, w, None, None, eps, dy, None, None)()
            ck.close(f"{nm} {dtype} in-place dx", dy, gx, TOL[dtype] * 2)
            # no weight / no bias
            x = rnd(rows, cols, dtype=dtype)
            out = nan_like(x)
            norm_fwd_call(S, layer, x, None, None, None, eps, out, None, None, None)()
            ck.close(f"{nm} {dtype} no-weight out", out, ref_norm(layer, x, None, None, eps), TOL[dtype])


def check_rope(S, ck, small):
    configs = [
        # (B, S, Hq, Hk, D, rd, mode)
        (2, 37, 4, 2, 128, 128, 0), (2, 37, 4, 2, 128, 128, 1), (1, 50, 3, 1, 64, 32, 0),
        (1, 50, 3, 1, 64, 32, 1), (2, 9, 2, 2, 80, 80, 0), (1, 11, 2, 1, 6, 4, 0),
        (1, 11, 2, 1, 6, 4, 1), (1, 7, 2, 0, 96, 64, 0), (3, 5, 2, 1, 36, 36, 0),
    ]
    for (B, Sq, Hq, Hk, D, rd, mode) in configs:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for packed in (False, True):
                for use_cache in (False, True):
                    for inverse in (False, True):
                        for in_place in (False, True):
                            tag = (f"rope B{B} S{Sq} H{Hq}/{Hk} D{D} rd{rd} mode{mode} "
                                   f"{str(dtype)[6:]} packed={int(packed)} cache={int(use_cache)} "
                                   f"inv={int(inverse)} inplace={int(in_place)}")
                            if packed:  # q and k views into one [B, S, Hq + 2Hk, D] buffer
                                qkv = rnd(B, Sq, Hq + 2 * Hk, D, dtype=dtype)
                                q, k = qkv[:, :, :Hq], (qkv[:, :, Hq:Hq + Hk] if Hk else None)
                            else:
                                q = rnd(B, Sq, Hq, D, dtype=dtype)
                                k = rnd(B, Sq, Hk, D, dtype=dtype) if Hk else None
                            pos = torch.randint(0, 70000, (B, Sq), device="cuda",
                                                dtype=torch.int64 if use_cache else torch.int32)
                            llama3 = (8.0, 1.0, 4.0, 8192.0) if (D == 128 and not use_cache) else None
                            invf = inv_freq_ref(rd, 10000.0, llama3)
                            cache = None
                            if use_cache:
                                pos = pos % 4096
                                ang = torch.arange(4096, dtype=torch.float64)[:, None] * invf
                                cache = torch.cat([torch.cos(ang), torch.sin(ang)], 1).float().cuda()
                            qr = ref_rope(q, pos, rd, mode, invf, inverse)
                            kr = ref_rope(k, pos, rd, mode, invf, inverse) if k is not None else None
                            if in_place:
                                qo, ko = q, k
                            else:
                                qo = nan_like(q)
                                ko = nan_like(k) if k is not None else None
                            rope_call(S, q, k, qo, ko, pos, cache, mode, rd, 10000.0, inverse,
                                      llama3)()
                            ck.close(tag + " q", qo, qr, TOL[dtype])
                            if k is not None:
                                ck.close(tag + " k", ko, kr, TOL[dtype])
                            if in_place and packed and Hk:  # v untouched
                                pass


def check_glu(S, ck, small):
    # (6, 5632): contiguous rows (the launch's one-row path), the others strided
    shapes = [(13, 7), (5, 1000), (64, 4096), (7, 2050), (6, 5632)] + ([] if small else [(100, 8192)])
    for kind in (0, 1, 2):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for (rows, Fd) in shapes:
                for fused in (False, True):
                    tag = f"glu kind{kind} {str(dtype)[6:]} {rows}x{Fd} fused={int(fused)}"
                    if fused:
                        gu = rnd(rows, 2 * Fd, dtype=dtype, lo=-4, hi=4)
                        g, u = gu[:, :Fd], gu[:, Fd:]
                    else:
                        g = rnd(rows, Fd, dtype=dtype) if Fd == 5632 else strided_rows(rows, Fd, dtype, 8)
                        u = rnd(rows, Fd, dtype=dtype)
                    out = nan_like(u)
                    glu_fwd_call(S, kind, g, u, out)()
                    ck.close(tag + " out", out, act_ref(kind, g) * u.double(), TOL[dtype])
                    dout = rnd(rows, Fd, dtype=dtype)
                    gd = g.double().clone().requires_grad_(True)
                    ud = u.double().clone().requires_grad_(True)
                    dg_r, du_r = torch.autograd.grad(act_ref(kind, gd) * ud, [gd, ud], dout.double())
                    if fused:  # in place into the packed buffer (activation recompute style)
                        glu_bwd_call(S, kind, dout, g, u, g, u)()
                        dg, du = g, u
                    else:
                        dg, du = nan_like(g), nan_like(u)
                        glu_bwd_call(S, kind, dout, g, u, dg, du)()
                    ck.close(tag + " dgate", dg, dg_r, TOL[dtype] * 2)
                    ck.close(tag + " dup", du, du_r, TOL[dtype] * 2)


def check_ce(S, ck, small):
    """Cross-entropy against torch's F.cross_entropy in float64 (loss, lse, dlogits),
    strided rows, ignored rows, label smoothing, every reduction, in place."""
    shapes = [(4, 7, 1), (5, 1000, 0), (3, 32003, 3)] + ([] if small else [(64, 4096, 8), (2, 131072, 0)])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for (N, V, pad) in shapes:
            for red in (0, 1, 2):
                for sm in (0.0, 0.1):
                    tag = f"ce {str(dtype)[6:]} {N}x{V} pad={pad} red={red} s={sm}"
                    z = strided_rows(N, V, dtype, pad)
                    z.mul_(8)
                    y = torch.randint(0, V, (N,), device="cuda",
                                      dtype=torch.int64 if red != 1 else torch.int32)
                    y[1::3] = -100
                    zd = z.double().clone().requires_grad_(True)
                    rname = ("mean", "sum", "none")[red]
                    lref = F.cross_entropy(zd, y.long(), reduction=rname, label_smoothing=sm)
                    loss = torch.full((N,) if red == 2 else (), float("nan"), device="cuda")
                    lse = torch.full((N,), float("nan"), device="cuda")
                    ce_fwd_call(S, z, y, loss, lse, red, sm)()
                    ck.close(tag + " loss", loss, lref.detach(), 1e-5)
                    ck.close(tag + " lse", lse, torch.logsumexp(zd.detach(), 1), 1e-6)
                    dloss = torch.rand((N,) if red == 2 else (), device="cuda") + 0.5
                    (gref,) = torch.autograd.grad(lref, [zd], dloss.double())
                    inplace = red == 1
                    dz = z if inplace else nan_like(z)
                    ce_bwd_call(S, dloss, z, y, lse if sm == 0.0 else None, dz, red, sm)()
                    ck.close(tag + f" dlogits{' inplace' if inplace else ''}", dz, gref,
                             TOL[dtype] * 2)


# Opt-in kernel selections (src/cuda/norm.cuh, rope.cu) that --sanitize covers besides
# the defaults (device_test_cuda.sh's OT_VARIANT_ENV runs the tests under such a set):
# forward v3, backward v2, RoPE's block-per-token kernel v1 on rows the warp kernel takes.
# (LayerNorm's bulk-copy backward, sm_90, is a default: the first pass runs it.)
ALT_KERNELS = {"OT_NORM_FWD_IMPL": "v3", "OT_NORM_BWD_IMPL": "v2", "OT_ROPE_IMPL": "v1"}
# The norms' options off their defaults (src/cuda/norm.cuh): plain launches (no
# programmatic dependent launch), the old partials' sum. --sanitize runs the norms (and
# RoPE) under them first, then under the defaults and ALT_KERNELS.
NORM_KNOBS = {"OT_NORM_PDL": "0", "OT_NORM_REDUCE": "old"}


def sanitize_run(S, only="norm,rope,glu,ce"):
    """Our kernels only (no references), small shapes covering every kernel variant:
    for compute-sanitizer racecheck, where torch's own kernels would be slow. The norm
    and RoPE part runs under NORM_KNOBS, the defaults and ALT_KERNELS. `only`: SwiGLU / cross-entropy kernels
    only when named there ("glu", "ce")."""
    for knobs in (NORM_KNOBS, {}, ALT_KERNELS):
        os.environ.update(knobs)
        try:
            sanitize_once(S, not knobs and ("glu" in only or "ce" in only))
        finally:
            for k in knobs:
                os.environ.pop(k, None)
        torch.cuda.synchronize()
        print("sanitize pass done:", knobs or "defaults", flush=True)
    print("sanitize run: done")


def sanitize_once(S, all_families):
    for dtype in (torch.float32, torch.bfloat16):
        for (rows, cols, pad) in ((9, 7, 3), (5, 1000, 0), (6, 4096, 8), (3, 8192, 0),
                                  (3, 40000, 0), (2, 20000, 0)):
            for layer in (0, 1):
                x = strided_rows(rows, cols, dtype, pad)
                r = strided_rows(rows, cols, dtype, pad)
                w = rnd(cols, dtype=dtype)
                b = rnd(cols, dtype=dtype) if layer else None
                out, rout = nan_like(x), nan_like(x)
                mean = torch.empty(rows, device="cuda") if layer else None
                rstd = torch.empty(rows, device="cuda")
                norm_fwd_call(S, layer, x, r, w, b, 1e-5, out, rout, mean, rstd)()
                norm_fwd_call(S, layer, x, None, w, b, 1e-5, out, None, mean, rstd)()
                dx = nan_like(x)
                dw = torch.empty(cols, dtype=dtype, device="cuda")
                db = torch.empty(cols, dtype=dtype, device="cuda") if layer else None
                norm_bwd_call(S, layer, r, x, out, w, None, None, 1e-5, dx, dw, db)()
                norm_bwd_call(S, layer, r, None, out, w, mean, rstd, 1e-5, dx, dw, db)()
        for (D, rd, mode) in ((128, 128, 0), (128, 128, 1), (64, 32, 0), (6, 4, 1)):
            q = rnd(2, 5, 4, D, dtype=dtype)
            k = rnd(2, 5, 2, D, dtype=dtype)
            pos = torch.randint(0, 100, (2, 5), device="cuda")
            ang = torch.arange(128, dtype=torch.float64)[:, None] * inv_freq_ref(rd, 1e4)
            cache = torch.cat([torch.cos(ang), torch.sin(ang)], 1).float().cuda()
            rope_call(S, q, k, nan_like(q), nan_like(k), pos, None, mode, rd)()
            rope_call(S, q, k, q, k, pos, cache, mode, rd, inverse=True)()
        if not all_families:
            continue
        for (rows, Fd) in ((3, 7), (4, 4096), (2, 2050)):
            g, u = rnd(rows, Fd, dtype=dtype), rnd(rows, Fd, dtype=dtype)
            out = nan_like(g)
            for kind in (0, 1, 2):
                glu_fwd_call(S, kind, g, u, out)()
                glu_bwd_call(S, kind, out, g, u, nan_like(g), nan_like(u))()
        for (N, V, pad) in ((4, 7, 1), (3, 5000, 3), (2, 40000, 0)):
            z = strided_rows(N, V, dtype, pad)
            y = torch.randint(0, V, (N,), device="cuda")
            y[1] = -100
            lse = torch.empty(N, device="cuda")
            for red in (0, 1, 2):
                loss = torch.empty((N,) if red == 2 else (), device="cuda")
                ce_fwd_call(S, z, y, loss, lse, red, 0.1)()
                ce_bwd_call(S, torch.ones_like(loss), z, y, None, nan_like(z), red, 0.1)()
                ce_bwd_call(S, torch.ones_like(loss), z, y, lse, z, red, 0.1)()


# ---------------------------------------------------------------------------------------
# benchmarks

SLEEP_CYCLES = 2_000_000 if hasattr(torch.cuda, "_sleep") else 0  # ~1 ms at 1.98 GHz


WARM_MS = [0.0]  # --warm-ms: time_ms's default warm-up
# --l2-scrub-mb M: after the warm-up, before the timed batches, read M MB of an unrelated buffer
# with plain loads, so that no line of the entry's inputs left by an earlier entry is in L2.
# Why (inferred, not proven): a kernel whose loads carry the evict-first hint (ld.global.cs)
# picks evict-first lines as victims, so normal-priority lines of its input that an earlier
# entry left in L2 (a peer's or another build's plain loads of the same tensors) stay there
# through its whole timing and serve it from L2: on the H200 our RMSNorm forward 16k x 8192
# (then evict-first) read 4.07 TB/s in build A/B rounds with builds loading x plainly, 3.94
# with the scrub (2026-12-04). The scrub does not remove a jump seen right after
# torch.compile's kernel (3.95 -> 4.11, cause unknown; scripts/fused_order_probe.py).
# 0: no scrub (as before).
L2_SCRUB_MB = [0]
_SCRUB = []


def l2_scrub():
    if L2_SCRUB_MB[0] <= 0:
        return
    if not _SCRUB:
        _SCRUB.append(torch.empty(L2_SCRUB_MB[0] * 1024 * 1024 // 2, dtype=torch.bfloat16,
                                  device="cuda").uniform_())
    _SCRUB[0].sum(dtype=torch.float32)


def time_ms(fns, iters=25, inner=5, warmup=3, warm_ms=None, record=True):
    """median over `iters` of (events around `inner` calls) / inner; fns alternate.
    warm_ms > 0: after the `warmup` calls, more calls until warm_ms of wall time has passed,
    so that the H200's clock under its power cap is this entry's own, not what the entry
    timed before it left (bench_attention.time_ms, whose blocks read up to ~10% fast right
    after a low-power peer). 0 (the default): as before 2026-12-03; bench_decode.py --ab
    passes its --warm-ms; here --warm-ms sets the default of every entry, the copy ceiling's
    included."""
    if warm_ms is None:
        warm_ms = WARM_MS[0]
    n = len(fns)
    for i in range(warmup * n):
        fns[i % n]()
    torch.cuda.synchronize()
    if warm_ms > 0:
        t0, i = time.perf_counter(), 0
        while (time.perf_counter() - t0) * 1e3 < warm_ms:
            fns[i % n]()
            i += 1
            torch.cuda.synchronize()
    l2_scrub()
    ts = []
    k = 0
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        # A blocking kernel first (as nvbench does): the host queues the `inner` calls
        # while the GPU spins, so the events time the GPU work, not the host's launch
        # latency of the first call (~10 us of ctypes / Python per call). Same for every
        # variant and peer.
        if SLEEP_CYCLES:
            torch.cuda._sleep(SLEEP_CYCLES)
        s.record()
        for _ in range(inner):
            fns[k % n]()
            k += 1
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / inner)
    ms = statistics.median(ts)
    if record and PEER_ROUNDS[0] > 1:
        _TIMED.append((fns, ms))
    return ms


# --peer-rounds R: every row's ours and peers timed again in R balanced rounds (the order
# reversed every other round), the medians reported. time_ms records the calls it timed with
# the float it returned (_TIMED); row() finds the calls of its ours_ms and of each peer's ms
# by identity of those floats, so the rows' code passes what time_ms returned, unchanged.
PEER_ROUNDS = [1]
_TIMED = []


def rounds_retime(ours_ms, peers_ms, rounds=None):
    """(ours_ms, peers_ms, single) with ours and every peer whose time came from time_ms in
    this row timed again in `rounds` (default --peer-rounds) balanced rounds: each one's
    median over the rounds; `single`: the first timings ({"ours": ms, peer: ms}), or None
    when nothing was re-timed (one round, or ours' calls not found). A peer failing in a
    round is reported as None."""
    rounds = PEER_ROUNDS[0] if rounds is None else rounds
    rec = list(_TIMED)
    _TIMED.clear()
    if rounds <= 1:
        return ours_ms, peers_ms, None
    find = lambda v: next((f for f, r in rec if r is v), None)
    of = find(ours_ms)
    if of is None:
        return ours_ms, peers_ms, None
    found = {k: find(v) for k, v in peers_ms.items() if v is not None}
    entries = [(None, of)] + [(k, f) for k, f in found.items() if f is not None]
    ts = {k: [] for k, _ in entries}
    for r in range(rounds):
        for k, f in (entries if r % 2 == 0 else entries[::-1]):
            if ts[k] is None:
                continue
            try:
                ts[k].append(time_ms(f, record=False))
            except Exception as e:  # a peer failing must not stop the benchmark (ours must not fail)
                if k is None:
                    raise
                print("  peer failed in a round:", k, type(e).__name__, str(e)[:200], flush=True)
                ts[k] = None
    single = {"ours": ours_ms, **{k: v for k, v in peers_ms.items() if v is not None}}
    new_peers = dict(peers_ms)
    for k, v in ts.items():
        if k is not None:
            new_peers[k] = statistics.median(v) if v else None
    return statistics.median(ts[None]), new_peers, single


# --ab-shim NAME=PATH: other builds of the shim (e.g. the parent commit's), whose calls are
# timed as variants of ours in the same process (A/B without run-time switches in the
# library), then ours once more ("ours again": the drift over the row's timings).
AB_SHIMS = []


def time_env_ms(calls, env):
    """time_ms(calls) with the environment variables of `env` set, unset afterwards."""
    for k, v in env.items():
        os.environ[k] = v
    try:
        return time_ms(calls)
    finally:
        for k in env:
            os.environ.pop(k, None)


def variants_ms(calls, envs, mk=None):
    """Time `calls` (ours) under each {name: {ENV: value}} setting of the kernels'
    tuning knobs (read by src/cuda/norm.cuh, rope.cu, glu.cu at each call), and through
    each --ab-shim (mk(shim): the same calls through that shim). With --cut-ab
    (ENV_ROUNDS) the env settings join --ab-rounds' balanced rounds."""
    out = {}
    env_rounds = ENV_ROUNDS[0] and AB_ROUNDS[0] > 1 and envs
    if not env_rounds:
        for name, env in envs.items():
            out[name] = time_env_ms(calls, env)
    shims = AB_SHIMS if mk is not None else []
    if (shims or env_rounds) and AB_ROUNDS[0] > 1:
        # --ab-rounds R: ours and every --ab-shim build (with --cut-ab: every env setting)
        # timed R times in rounds, the order reversed every other round (ABBA...), each
        # one's median over the rounds ("ours (rounds)": ours' median)
        fns = [("ours (rounds)", calls, {})]
        if env_rounds:
            fns += [(name, calls, env) for name, env in envs.items()]
        fns += [(name, mk(S2), {}) for name, S2 in shims]
        ts = {name: [] for name, _, _ in fns}
        for r in range(AB_ROUNDS[0]):
            for name, f, env in (fns if r % 2 == 0 else fns[::-1]):
                ts[name].append(time_env_ms(f, env))
        for name, _, _ in fns:
            out[name] = statistics.median(ts[name])
    elif mk is not None and AB_SHIMS:
        for name, S2 in AB_SHIMS:
            out[name] = time_ms(mk(S2))
        out["ours again"] = time_ms(calls)
    return out


AB_ROUNDS = [1]
ENV_ROUNDS = [False]  # --cut-ab


def copy_bandwidth(nbytes=2 * 2 * 1024 ** 3, iters=20, inner=3):
    """The ceiling: y.copy_(x) (a device-to-device cudaMemcpyAsync), nbytes moved per
    call (half read, half written); default 2 GiB each way. copy_same_bytes: the same
    copy moving a row's bytes, timed like the rows (5 calls per batch, two sets)."""
    x = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda").uniform_()
    y = torch.empty_like(x)
    ms = time_ms([lambda: y.copy_(x)], iters=iters, inner=inner, record=False)
    return 2 * x.numel() * 2 / (ms * 1e-3) / 1e12


def copy_same_bytes(nbytes, _cache={}):
    if nbytes not in _cache:
        xs = [torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda").uniform_() for _ in range(2)]
        ys = [torch.empty_like(xs[0]) for _ in range(2)]
        ms = time_ms([lambda i=i: ys[i].copy_(xs[i]) for i in range(2)], record=False)
        _cache[nbytes] = nbytes / (ms * 1e-3) / 1e12
        del xs, ys
    return _cache[nbytes]


def hf_rms(x, w, eps):
    dt = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dt)


def hf_rms_res(x, r, w, eps):
    h = x + r
    return hf_rms(h, w, eps), h


def eager_ln(x, w, b, eps):
    dt = x.dtype
    h = x.float()
    mu = h.mean(-1, keepdim=True)
    var = (h - mu).pow(2).mean(-1, keepdim=True)
    return ((h - mu) * torch.rsqrt(var + eps) * w.float() + b.float()).to(dt)


def eager_ln_res(x, r, w, b, eps):
    h = x + r
    return eager_ln(h, w, b, eps), h


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(q, k, cos_c, sin_c, pos):
    cos = cos_c[pos].unsqueeze(-2).to(q.dtype)
    sin = sin_c[pos].unsqueeze(-2).to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def eager_swiglu(g, u):
    return g * torch.sigmoid(g) * u


def bench_all(S, args):
    torch.manual_seed(0)
    rows_list = [16384]
    H_list = [int(h) for h in args.hidden.split(",") if h]
    dtype = torch.bfloat16
    eps = 1e-6
    results = []
    copy_tbps = copy_bandwidth()
    print(f"copy bandwidth: {copy_tbps:.3f} TB/s", flush=True)
    comp = None if args.no_compile else {}

    def compiled(name, fn):
        if comp is None:
            return None
        if name not in comp:
            comp[name] = torch.compile(fn, dynamic=False)
        return comp[name]

    variants = variants_ms

    # Defaults (src/cuda/norm.cuh, rope.cu): forward v2; backward v3 (RMSNorm) and the
    # bulk-copy (TMA) kernel with register partials, 2 vectors per thread and a ring of 3
    # slots (LayerNorm, sm_90, rows of 4-16 KB); RoPE's warp kernel v3. The variants:
    # LayerNorm's backward v3 and its bulk-copy ring of 2 slots / the automatic depth. (The run of
    # a342519 timed the bulk-copy forward, RMSNorm backward and RoPE kernels, all slower
    # or tied, removed; earlier runs forward v3 / v4, rows per block, backward v2 and 2
    # rows per iteration: docs/PERFORMANCE.md.)
    # The forward v2 option left to switch off: programmatic dependent launch (evict-first
    # out stores without the residual are compiled in since ecdf3b4). The run of 718ecab
    # timed pdl / cs / pdl+cs as opt-ins, a blocks-per-SM cap (lost everywhere: removed)
    # and the partials' sum unrolled by 16 (no change: removed): docs/PERFORMANCE.md.
    # The run of ecdf3b4 timed LayerNorm's forward held to 64 / 56 registers (the first the
    # default since), one-reduction statistics (removed) and RoPE's warp kernel held to 3-4
    # blocks per SM (spills, removed); the run of ef875c3 the backward's weight in fp32
    # registers (the default since: LayerNorm's bulk-copy kernel, RMSNorm's v3 in blocks
    # of <= 256 threads): docs/PERFORMANCE.md.
    FWD_VARIANTS = {"no pdl": {"OT_NORM_PDL": "0"}}
    LN_FWD_VARIANTS = FWD_VARIANTS
    # "old sum": the partials' sum by the 32 x 32 kernel of 4-byte loads (OT_NORM_REDUCE=old),
    # the default before norm_reduce_partials_v2_kernel.
    BWD_VARIANTS = {"no pdl": {"OT_NORM_PDL": "0"}, "old sum": {"OT_NORM_REDUCE": "old"}}
    # LayerNorm's bulk-copy ring: 3 slots by default (with dx stored evict-first, since
    # 4cdbb62); 2, 4 and the automatic depth (4 at 4096 / 8192) as variants.
    LN_BWD_VARIANTS = dict(BWD_VARIANTS, **{"v3": {"OT_NORM_BWD_IMPL": "v3"},
                                            "tma S=2": {"OT_NORM_BWD_TMA_STAGES": "2"},
                                            "tma S=4": {"OT_NORM_BWD_TMA_STAGES": "4"},
                                            "tma auto": {"OT_NORM_BWD_TMA_STAGES": "0"}})
    ROPE_VARIANTS = {}
    if args.cut_ab:
        # the opt-ins prepared on 2026-11-30 night, each against the default in the same
        # process (balanced rounds with --ab-rounds): RMSNorm's forward with LayerNorm's
        # instruction cut (16-bit rows of <= 4096 elements; wider rows take the default, so
        # its 8192 rows time the default again; cut56: its instances without the residual
        # held to 56 registers) and RoPE's rope_warp4_kernel (w4; w4o, held to 4 blocks per
        # SM, measured 15% behind in the run of a092c77: dropped; the cross-token pipeline
        # OT_ROPE_IMPL=pipe / pipe6, measured 5-7% behind on 2026-12-01: removed,
        # docs/PERFORMANCE.md); the other variants left out
        # (the cut is the default since ba6f82c: "plain" is the row work before it)
        FWD_VARIANTS = {"plain": {"OT_NORM_RMS_FWD_CUT": "0"}, "cut56": {"OT_NORM_RMS_FWD_CUT": "2"}}
        LN_FWD_VARIANTS = BWD_VARIANTS = LN_BWD_VARIANTS = {}
        ROPE_VARIANTS = {"w4": {"OT_ROPE_IMPL": "w4"}}
    if args.no_env_variants:
        FWD_VARIANTS = LN_FWD_VARIANTS = BWD_VARIANTS = LN_BWD_VARIANTS = ROPE_VARIANTS = {}
    only = set(args.only.split(","))

    def row(op, case, nbytes, ours_ms, peers_ms, var_ms=None):
        ours_ms, peers_ms, single = rounds_retime(ours_ms, peers_ms)
        ours = nbytes / (ours_ms * 1e-3) / 1e12
        peers = {k: nbytes / (v * 1e-3) / 1e12 for k, v in peers_ms.items() if v is not None}
        best = max(peers.values()) if peers else None
        r = {"op": op, "case": case, "metric": "TB/s", "ours": round(ours, 3),
             "ours_ms": round(ours_ms, 4),
             "peers": {k: round(v, 3) for k, v in peers.items()},
             "ratio_best_peer": round(ours / best, 3) if best else None,
             "fraction_of_ceiling": round(ours / copy_tbps, 3)}
        if op.startswith(("rmsnorm", "layernorm", "rope")):
            cs = copy_same_bytes(nbytes)
            r["copy_same_bytes_TBps"] = round(cs, 3)
            r["fraction_of_same_bytes_copy"] = round(ours / cs, 3)
        if var_ms:
            r["variants"] = {k: round(nbytes / (v * 1e-3) / 1e12, 3) for k, v in var_ms.items()}
        if single:
            r["peer_rounds"] = PEER_ROUNDS[0]
            r["single_pass_TBps"] = {k: round(nbytes / (v * 1e-3) / 1e12, 3) for k, v in single.items()}
        results.append(r)
        write_doc(args, copy_tbps, results)
        pk = ", ".join(f"{k} {v:.2f}" for k, v in r["peers"].items())
        if var_ms:
            pk += " || variants: " + ", ".join(f"{k} {v:.2f}" for k, v in r["variants"].items())
        if "copy_same_bytes_TBps" in r:
            pk += f" || same-bytes copy {r['copy_same_bytes_TBps']:.2f}"
        print(f"{op:24s} {case:18s} ours {ours:5.2f} TB/s ({r['fraction_of_ceiling']*100:4.1f}% copy)"
              f"  x{r['ratio_best_peer']}  | {pk}", flush=True)

    def safe(fn):
        try:
            return fn()
        except Exception as e:  # a peer failing must not stop the benchmark
            print("  peer failed:", type(e).__name__, str(e)[:200], flush=True)
            return None

    if args.ce_first and "ce" in only:
        bench_ce(S, args, copy_tbps, results, row, safe)
    # (--only train / rmsbwd / ce alone: no 16k-row sets)
    cases = [(N, H) for N in rows_list for H in H_list]
    cases += [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",") if c]
    for N, H in cases if only & {"glu", "norm", "normbwd", "rope"} else ():
        case = (f"{N // 1024}k" if N % 1024 == 0 else str(N)) + f" x {H} bf16"  # --cases: any N
        E = 2  # bytes per element
        sets = []
        for _ in range(2):
            sets.append(dict(x=rnd(N, H, dtype=dtype), r=rnd(N, H, dtype=dtype),
                             dy=rnd(N, H, dtype=dtype)))
        w = rnd(H, dtype=dtype, lo=0.5, hi=1.5)
        bvec = rnd(H, dtype=dtype)
        outs = [torch.empty(N, H, dtype=dtype, device="cuda") for _ in range(2)]
        routs = [torch.empty(N, H, dtype=dtype, device="cuda") for _ in range(2)]
        rstd = torch.empty(N, device="cuda")
        mean = torch.empty(N, device="cuda")
        dws = torch.empty(H, dtype=dtype, device="cuda")
        dbs = torch.empty(H, dtype=dtype, device="cuda")

        # SwiGLU, F = H (separate gate / up tensors)
        if "glu" in only:
            bench_glu(S, N, H, case, sets, outs, row, safe, compiled)

        for layer in ((0, 1) if "norm" in only or "normbwd" in only else ()):
            nm = "layernorm" if layer else "rmsnorm"
            bb = bvec if layer else None
            mm = mean if layer else None
            if "norm" in only:  # "normbwd": the backward rows only
                # forward, unfused (x) and with the residual (x, r): the same row but for
                # the inputs; torch's fused function takes x + r (the add timed with it)
                for res in (False, True):
                    mk = lambda S_: [norm_fwd_call(S_, layer, s["x"], s["r"] if res else None, w, bb, eps, outs[i],
                                                   routs[i] if res else None, mm, rstd)
                                     for i, s in enumerate(sets)]
                    ours = mk(S)
                    t_ours = time_ms(ours)
                    var_ms = variants(ours, LN_FWD_VARIANTS if layer else FWD_VARIANTS, mk)
                    ins = (lambda s: (s["x"], s["r"])) if res else (lambda s: (s["x"],))
                    prm = (w, bvec, eps) if layer else (w, eps)
                    eager = (eager_ln_res if res else eager_ln) if layer else (hf_rms_res if res else hf_rms)
                    fused = ((lambda h: F.layer_norm(h, (H,), w, bvec, eps)) if layer
                             else (lambda h: F.rms_norm(h, (H,), w, eps)))
                    peers = {
                        "torch eager": safe(lambda: time_ms([lambda s=s: eager(*ins(s), *prm) for s in sets])),
                        ("torch add + " if res else "torch ") + ("F.layer_norm" if layer else "F.rms_norm"):
                            safe(lambda: time_ms([lambda s=s: fused(s["x"] + s["r"] if res else s["x"]) for s in sets])),
                    }
                    c = compiled(("ln" if layer else "rms") + ("res" if res else "") + str(H), eager)
                    if c is not None:
                        peers["torch.compile eager"] = safe(lambda: time_ms([lambda s=s: c(*ins(s), *prm) for s in sets]))
                    row(f"{nm}{'_residual' if res else ''}_fwd", case, (4 if res else 2) * N * H * E, t_ours, peers,
                        var_ms)

            # backward: dx, dweight (+ dbias), saved statistics
            for i, s in enumerate(sets):
                norm_fwd_call(S, layer, s["x"], None, w, bb, eps, outs[i], None, mm, rstd)()
            mk = lambda S_: [norm_bwd_call(S_, layer, s["dy"], None, s["x"], w, mm, rstd, eps, routs[i], dws,
                                           dbs if layer else None) for i, s in enumerate(sets)]
            ours = mk(S)
            t_ours = time_ms(ours)
            var_ms = variants(ours, LN_BWD_VARIANTS if layer else BWD_VARIANTS, mk)

            def torch_bwd(fn):
                gs = []
                for s in sets:
                    xx = s["x"].detach().clone().requires_grad_(True)
                    ww = w.detach().clone().requires_grad_(True)
                    bb2 = bvec.detach().clone().requires_grad_(True)
                    y = fn(xx, ww, bb2)
                    ins = [xx, ww, bb2] if layer else [xx, ww]
                    gs.append(lambda y=y, ins=ins, dy=s["dy"]: torch.autograd.grad(
                        y, ins, dy, retain_graph=True))
                return time_ms(gs)
            if layer:
                peers = {"torch F.layer_norm autograd": safe(lambda: torch_bwd(
                    lambda xx, ww, b2: F.layer_norm(xx, (H,), ww, b2, eps)))}
            else:
                peers = {"torch F.rms_norm autograd": safe(lambda: torch_bwd(
                    lambda xx, ww, b2: F.rms_norm(xx, (H,), ww, eps)))}
            row(f"{nm}_bwd", case, 3 * N * H * E, t_ours, peers, var_ms)
            torch.cuda.empty_cache()


        # RoPE: q [N, H/128, 128], k [N, 8, 128], NeoX, positions int64, cos/sin cache
        D = 128
        Hq, Hk = H // D, 8
        rsets = []
        for _ in range(2):
            rsets.append(dict(q=rnd(N, Hq, D, dtype=dtype), k=rnd(N, Hk, D, dtype=dtype),
                              pos=torch.randint(0, 8192, (N,), device="cuda", dtype=torch.int64)))
        qo = [torch.empty(N, Hq, D, dtype=dtype, device="cuda") for _ in range(2)]
        ko = [torch.empty(N, Hk, D, dtype=dtype, device="cuda") for _ in range(2)]
        invf = inv_freq_ref(D, 10000.0)
        ang = torch.arange(8192, dtype=torch.float64)[:, None] * invf
        cache = torch.cat([torch.cos(ang), torch.sin(ang)], 1).float().cuda()
        cos_c = torch.cat([torch.cos(ang)] * 2, 1).float().cuda()
        sin_c = torch.cat([torch.sin(ang)] * 2, 1).float().cuda()
        nbytes = 2 * N * (Hq + Hk) * D * E
        for inverse in ((False, True) if "rope" in only else ()):
            for use_cache in (True, False):
                mk = lambda S_: [rope_call(S_, s["q"], s["k"], qo[i], ko[i], s["pos"],
                                           cache if use_cache else None, 0, D, 10000.0, inverse)
                                 for i, s in enumerate(rsets)]
                ours = mk(S)
                t_ours = time_ms(ours)
                var_ms = variants(ours, ROPE_VARIANTS, mk)
                op = ("rope_bwd" if inverse else "rope_fwd") + ("" if use_cache else "_computed_cos_sin")
                if not inverse:
                    if use_cache:
                        peers = {"torch eager (HF)": safe(lambda: time_ms(
                            [lambda s=s: hf_rope(s["q"], s["k"], cos_c, sin_c, s["pos"]) for s in rsets]))}
                        c = compiled(f"rope{H}", hf_rope)
                        if c is not None:
                            peers["torch.compile eager"] = safe(lambda: time_ms(
                                [lambda s=s: c(s["q"], s["k"], cos_c, sin_c, s["pos"]) for s in rsets]))
                        rope_peers = peers
                    else:
                        peers = rope_peers
                else:
                    def rope_autograd():
                        gs = []
                        for s in rsets:
                            qq = s["q"].detach().clone().requires_grad_(True)
                            kk = s["k"].detach().clone().requires_grad_(True)
                            yq, yk = hf_rope(qq, kk, cos_c, sin_c, s["pos"])
                            gs.append(lambda yq=yq, yk=yk, qq=qq, kk=kk, s=s: torch.autograd.grad(
                                (yq, yk), (qq, kk), (s["q"], s["k"]), retain_graph=True))
                        return time_ms(gs)
                    if use_cache:
                        rope_bpeers = {"torch eager (HF) autograd": safe(rope_autograd)}
                    peers = rope_bpeers
                row(op, case, nbytes, t_ours, peers, var_ms)
                if args.rope_tail and not inverse and use_cache:
                    rope_tail_probe(S, N, Hq, Hk, D, dtype, cache, row)
        del rsets, qo, ko, sets, outs, routs
        torch.cuda.empty_cache()
    if not args.ce_first and "ce" in only:
        bench_ce(S, args, copy_tbps, results, row, safe)
    if "train" in only:
        bench_train(S, args, row, safe)
    if "rmsbwd" in only:
        bench_rms_bwd_ab(S, args, row, safe)
    return copy_tbps, results


def bench_glu(S, N, H, case, sets, outs, row, safe, compiled):
    """SwiGLU forward and backward at F = H (separate gate / up tensors)."""
    dtype, E = torch.bfloat16, 2
    variants = variants_ms
    mk = lambda S_: [glu_fwd_call(S_, 0, s["x"], s["r"], outs[i]) for i, s in enumerate(sets)]
    ours = mk(S)
    t_ours = time_ms(ours)
    glu_var = variants(ours, {"v2 (64-256 thr x 4 vec)": {"OT_GLU_FWD_IMPL": "v2"}}, mk)
    peers = {
        "torch eager": safe(lambda: time_ms([lambda s=s: eager_swiglu(s["x"], s["r"]) for s in sets])),
        "torch F.silu(g)*u": safe(lambda: time_ms([lambda s=s: F.silu(s["x"]) * s["r"] for s in sets])),
    }
    c = compiled(f"swiglu{H}", eager_swiglu)
    if c is not None:
        peers["torch.compile eager"] = safe(lambda: time_ms([lambda s=s: c(s["x"], s["r"]) for s in sets]))
    row("swiglu_fwd", case, 3 * N * H * E, t_ours, peers, glu_var)

    dg = [torch.empty(N, H, dtype=dtype, device="cuda") for _ in range(2)]
    mk = lambda S_: [glu_bwd_call(S_, 0, s["dy"], s["x"], s["r"], outs[i], dg[i]) for i, s in enumerate(sets)]
    ours = mk(S)
    t_ours = time_ms(ours)
    glu_bvar = variants(ours, {}, mk)

    def swiglu_autograd():
        gs = []
        for s in sets:
            gg = s["x"].detach().clone().requires_grad_(True)
            uu = s["r"].detach().clone().requires_grad_(True)
            y = F.silu(gg) * uu
            gs.append(lambda y=y, ins=[gg, uu], dy=s["dy"]: torch.autograd.grad(y, ins, dy, retain_graph=True))
        return time_ms(gs)
    row("swiglu_bwd", case, 5 * N * H * E, t_ours, {"torch F.silu(g)*u autograd": safe(swiglu_autograd)},
        glu_bvar)
    if hasattr(S.lib, "shim_glu_backward_recompute"):
        # the backward with the forward's product (the patched MLP's backward since
        # 2026-12-01: one pass, 6 tensors) against the two passes it replaced (glu, then
        # glu_backward: 8 tensors)
        po = [torch.empty(N, H, dtype=dtype, device="cuda") for _ in range(2)]
        rec = [glu_bwd_recompute_call(S, 0, s["dy"], s["x"], s["r"], outs[i], dg[i], po[i])
               for i, s in enumerate(sets)]
        pairs = [(glu_fwd_call(S, 0, s["x"], s["r"], po[i]),
                  glu_bwd_call(S, 0, s["dy"], s["x"], s["r"], outs[i], dg[i]))
                 for i, s in enumerate(sets)]
        two = [(lambda f=f, b=b: (f(), b())) for f, b in pairs]
        row("swiglu_bwd_recompute", case, 6 * N * H * E, time_ms(rec),
            {"ours: glu + glu_backward (two passes)": safe(lambda: time_ms(two))}, {})
        del po
    del dg
    torch.cuda.empty_cache()


def swiglu_bwd_ref(g, u, dy):
    """The SwiGLU backward as inductor fuses it (one kernel: dy, gate, up in; dgate, dup out)."""
    s = torch.sigmoid(g.float())
    gf, uf, dyf = g.float(), u.float(), dy.float()
    return (dyf * uf * s * (1 + gf * (1 - s))).to(g.dtype), (dyf * gf * s).to(g.dtype)


# RMSNorm's backward at the training shape: the v3 ring's depth (2 by default) and 4 vectors
# per thread, against programmatic dependent launch off.
NORM_TRAIN_BWD_VARIANTS = {"no pdl": {"OT_NORM_PDL": "0"}, "S=3": {"OT_NORM_BWD_STAGES": "3"},
                           "S=4": {"OT_NORM_BWD_STAGES": "4"}, "S auto": {"OT_NORM_BWD_STAGES": "0"},
                           "4 vec/thread": {"OT_NORM_BWD_V3NV": "4"}}


def rms_bwd_inputs(S, N, H, with_dres, eps):
    """The RMSNorm backward's bf16 inputs, two sets: dict(x, dy, dr (None without dres)),
    the weight, dx buffers, each set's rstd (our forward's), a dweight buffer."""
    dtype = torch.bfloat16
    sets = [dict(x=rnd(N, H, dtype=dtype), dy=rnd(N, H, dtype=dtype),
                 dr=rnd(N, H, dtype=dtype) if with_dres else None) for _ in range(2)]
    w = rnd(H, dtype=dtype, lo=0.5, hi=1.5)
    dx = [torch.empty(N, H, dtype=dtype, device="cuda") for _ in range(2)]
    out = torch.empty(N, H, dtype=dtype, device="cuda")
    rstd = [torch.empty(N, device="cuda") for _ in range(2)]
    for i, s in enumerate(sets):
        norm_fwd_call(S, 0, s["x"], None, w, None, eps, out, None, None, rstd[i])()
    return sets, w, dx, rstd, torch.empty(H, dtype=dtype, device="cuda")


def rope_tail_probe(S, N, Hq, Hk, D, dtype, cache, row):
    """--rope-tail: the RoPE forward (cache) at token counts around N that are whole
    rounds of the warp kernel's warp slots (SMs x 3 blocks x 4 warps: 167 registers, 128
    threads) and at N itself, timed in one alternating set: how much the last partial
    round (the wave tail) costs."""
    slots = torch.cuda.get_device_properties(0).multi_processor_count * 12
    for n in sorted({N, (N // slots) * slots, (N // slots + 1) * slots}):
        ss = [dict(q=rnd(n, Hq, D, dtype=dtype), k=rnd(n, Hk, D, dtype=dtype),
                   pos=torch.randint(0, 8192, (n,), device="cuda", dtype=torch.int64))
              for _ in range(2)]
        qo = [torch.empty(n, Hq, D, dtype=dtype, device="cuda") for _ in range(2)]
        ko = [torch.empty(n, Hk, D, dtype=dtype, device="cuda") for _ in range(2)]
        calls = [rope_call(S, s["q"], s["k"], qo[i], ko[i], s["pos"], cache, 0, D, 10000.0, False)
                 for i, s in enumerate(ss)]
        t = time_ms(calls, iters=41)
        row("rope_fwd_tail_probe", f"{n} x {Hq * D} bf16 ({n / slots:.2f} rounds of {slots} warps)",
            2 * n * (Hq + Hk) * D * 2, t, {})
        del ss, qo, ko


def bench_train(S, args, row, safe):
    """The 0.54 B training step's shapes (examples/train_llama.py: hidden 2048, MLP 5632,
    batch 4 x 2048 = 8192 tokens): SwiGLU forward and backward against F.silu(g)*u and
    torch.compile's (inductor's) fused forward and its compiled backward; the RMSNorm
    backward with the residual's gradient and dweight (the patched layers' norm), and the
    same without dweight (no partials, no partials' sum: the difference is their cost)."""
    dtype, E = torch.bfloat16, 2
    N, H, Fm = 8192, 2048, 5632
    case = "8k x 5632 bf16"
    sets = [dict(g=rnd(N, Fm, dtype=dtype), u=rnd(N, Fm, dtype=dtype), dy=rnd(N, Fm, dtype=dtype))
            for _ in range(2)]
    outs = [torch.empty(N, Fm, dtype=dtype, device="cuda") for _ in range(2)]
    dg = [torch.empty(N, Fm, dtype=dtype, device="cuda") for _ in range(2)]
    mk = lambda S_: [glu_fwd_call(S_, 0, s["g"], s["u"], outs[i]) for i, s in enumerate(sets)]
    ours = mk(S)
    t = time_ms(ours)
    var = variants_ms(ours, {}, mk)
    peers = {"torch F.silu(g)*u": safe(lambda: time_ms([lambda s=s: F.silu(s["g"]) * s["u"] for s in sets]))}
    use_compile = not args.no_compile or args.train_compile
    if use_compile:
        cf = torch.compile(lambda g, u: F.silu(g) * u, dynamic=False)
        peers["torch.compile silu(g)*u"] = safe(lambda: time_ms([lambda s=s: cf(s["g"], s["u"]) for s in sets]))
    row("swiglu_fwd", case, 3 * N * Fm * E, t, peers, var)
    mk = lambda S_: [glu_bwd_call(S_, 0, s["dy"], s["g"], s["u"], outs[i], dg[i]) for i, s in enumerate(sets)]
    ours = mk(S)
    t = time_ms(ours)
    var = variants_ms(ours, {}, mk)
    peers = {}
    if use_compile:
        def compiled_autograd():
            cf = torch.compile(lambda g, u: F.silu(g) * u, dynamic=False)
            gs = []
            for s in sets:
                gg = s["g"].detach().clone().requires_grad_(True)
                uu = s["u"].detach().clone().requires_grad_(True)
                y = cf(gg, uu)
                gs.append(lambda y=y, ins=[gg, uu], dy=s["dy"]: torch.autograd.grad(y, ins, dy, retain_graph=True))
            return time_ms(gs)
        peers["torch.compile silu(g)*u autograd"] = safe(compiled_autograd)
        cb = torch.compile(swiglu_bwd_ref, dynamic=False)
        peers["torch.compile bwd formula"] = safe(lambda: time_ms([lambda s=s: cb(s["g"], s["u"], s["dy"]) for s in sets]))
    row("swiglu_bwd", case, 5 * N * Fm * E, t, peers, var)
    del sets, outs, dg

    case = "8k x 2048 bf16"
    eps = 1e-6
    sets, w, dx, rstd, dw = rms_bwd_inputs(S, N, H, True, eps)
    for want_dw in (True, False):
        mk = lambda S_: [norm_bwd_call(S_, 0, s["dy"], s["dr"], s["x"], w, None, rstd[i], eps, dx[i],
                                       dw if want_dw else None, None) for i, s in enumerate(sets)]
        ours = mk(S)
        t = time_ms(ours)
        var = variants_ms(ours, NORM_TRAIN_BWD_VARIANTS, mk)
        peers = {}
        if want_dw:
            def torch_bwd():
                gs = []
                for s in sets:
                    xx = s["x"].detach().clone().requires_grad_(True)
                    ww = w.detach().clone().requires_grad_(True)
                    y = F.rms_norm(xx, (H,), ww, eps)
                    gs.append(lambda y=y, ins=[xx, ww], dy=s["dy"]: torch.autograd.grad(y, ins, dy, retain_graph=True))
                return time_ms(gs)
            peers["torch F.rms_norm autograd (no dres)"] = safe(torch_bwd)
        row("rmsnorm_dres_bwd" + ("" if want_dw else "_no_dweight"), case, 4 * N * H * E, t, peers, var)
    del sets, dx
    torch.cuda.empty_cache()


# --only rmsbwd: RMSNorm's backward, the default kernels (v3) against its ring / width knobs, all
# through the same shim in one process (and any --ab-shim build: e.g. the parent's kernels).
# OT_NORM_RMS_BWD_VARIANT's warp-row kernels, timed here in the run of 1d1bbbc, lost at every
# shape (8k x 2048 dres 2.27-2.42 against 3.27 TB/s) and were removed (docs/PERFORMANCE.md).
RMS_BWD_AB_VARIANTS = {"S=3": {"OT_NORM_BWD_STAGES": "3"}, "S auto": {"OT_NORM_BWD_STAGES": "0"},
                       "4 vec/thread": {"OT_NORM_BWD_V3NV": "4"}}
# (rows, hidden, dres): 8192 x 2048 is the 0.54 B step at 4 x 2048, 16k x 2048 its long-context
# step (1 x 16384)
RMS_BWD_AB_CASES = [(8192, 1024, True), (8192, 2048, True), (16384, 2048, True), (16384, 4096, False),
                    (16384, 4096, True)]


def bench_rms_bwd_ab(S, args, row, safe):
    """RMSNorm backward A/B (--only rmsbwd): bf16, saved rstd, dweight; 8192 rows x 1024 /
    2048 and 16k x 2048 with the residual's gradient (dres: the patched layers' norm at the
    0.54 B training shapes, 4 x 2048 and 1 x 16384 tokens) and 16k x 4096 without / with it. Ours (the default kernels), each
    RMS_BWD_AB_VARIANTS setting, ours again (the drift), against torch.compile's backward of
    the HF RMSNorm (with dres: of (rms(x + r) * w, x + r), the gradients dy and dres: dx and
    dweight), and torch's F.rms_norm autograd. Bytes: h, dy (, dres) read, dx written."""
    E, eps = 2, 1e-6
    for N, H, with_dres in RMS_BWD_AB_CASES:
        # torch.compile (one compile a shape, most of the bench's time on a fresh machine):
        # at the training width 2048 only, unless --no-compile is absent
        use_compile = not args.no_compile or (args.train_compile and H == 2048)
        case = f"{N // 1024}k x {H} bf16" + (" dres" if with_dres else "")
        sets, w, dx, rstd, dw = rms_bwd_inputs(S, N, H, with_dres, eps)
        mk = lambda S_: [norm_bwd_call(S_, 0, s["dy"], s["dr"], s["x"], w, None, rstd[i], eps, dx[i], dw, None)
                         for i, s in enumerate(sets)]
        ours = mk(S)
        t = time_ms(ours)
        var = variants_ms(ours, RMS_BWD_AB_VARIANTS, mk)
        var["ours again"] = time_ms(ours)
        peers = {}

        def autograd_ms(fn):
            gs = []
            for s in sets:
                xx = s["x"].detach().clone().requires_grad_(True)
                ww = w.detach().clone().requires_grad_(True)
                if with_dres:
                    y, h = fn(xx, torch.zeros_like(xx), ww)
                    outs, grads = (y, h), (s["dy"], s["dr"])
                else:
                    outs, grads = (fn(xx, ww),), (s["dy"],)
                gs.append(lambda o=outs, ins=[xx, ww], g=grads: torch.autograd.grad(o, ins, g, retain_graph=True))
            return time_ms(gs)
        if with_dres:
            peers["torch F.rms_norm autograd"] = safe(lambda: autograd_ms(
                lambda x, r, w_: (lambda h: (F.rms_norm(h, (H,), w_, eps), h))(x + r)))
            if use_compile:
                cf = torch.compile(lambda x, r, w_: hf_rms_res(x, r, w_, eps), dynamic=False)
                peers["torch.compile HF RMSNorm backward"] = safe(lambda: autograd_ms(cf))
        else:
            peers["torch F.rms_norm autograd"] = safe(lambda: autograd_ms(lambda x, w_: F.rms_norm(x, (H,), w_, eps)))
            if use_compile:
                cf = torch.compile(lambda x, w_: hf_rms(x, w_, eps), dynamic=False)
                peers["torch.compile HF RMSNorm backward"] = safe(lambda: autograd_ms(cf))
        row("rmsnorm_bwd_ab", case, (4 if with_dres else 3) * N * H * E, t, peers, var)
        del sets, dx
        torch.cuda.empty_cache()


def bench_ce(S, args, copy_tbps, results, row, safe):
    """Cross-entropy, 16k tokens, bf16 logits, MEAN, no smoothing. Ours: forward saving
    lse, then the backward in place (dlogits = logits). Peer: F.cross_entropy on the bf16
    logits (+ autograd backward). Bytes: forward reads the logits once; forward +
    backward reads them twice and writes the gradient once."""
    N, E = 16384, 2
    for V in (32768, 131072):
        case = f"16k x {V // 1024}k bf16"
        try:
            zs = [torch.randn(N, V, device="cuda", dtype=torch.bfloat16).mul_(3) for _ in range(2)]
            ys = [torch.randint(0, V, (N,), device="cuda") for _ in range(2)]
        except Exception as e:
            print("  ce setup failed:", type(e).__name__, str(e)[:200], flush=True)
            return
        lse = torch.empty(N, device="cuda")
        loss = torch.empty((), device="cuda")
        dloss = torch.ones((), device="cuda")
        fw = [ce_fwd_call(S, zs[i], ys[i], loss, lse) for i in range(2)]
        t_f = time_ms(fw)
        row("cross_entropy_fwd", case, N * V * E, t_f,
            {"torch F.cross_entropy": safe(lambda: time_ms(
                [lambda i=i: F.cross_entropy(zs[i], ys[i]) for i in range(2)]))})
        steps = []
        for i in range(2):
            f, b = fw[i], ce_bwd_call(S, dloss, zs[i], ys[i], lse, zs[i])
            steps.append(lambda f=f, b=b: (f(), b()))
        t_fb = time_ms(steps)

        def torch_fb():
            fns = []
            for i in range(2):
                zz = zs[i].detach().requires_grad_(True)

                def step(zz=zz, y=ys[i]):
                    torch.autograd.grad(F.cross_entropy(zz, y), [zz])
                fns.append(step)
            t = time_ms(fns)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fns[0]()
            torch.cuda.synchronize()
            return t, (torch.cuda.max_memory_allocated() - base) / 1e9
        tp = safe(torch_fb)
        row("cross_entropy_fwd_bwd", case, 3 * N * V * E, t_fb,
            {"torch F.cross_entropy autograd": tp[0] if tp else None})
        if tp:
            ours_gb = 2 * N * 4 / 1e9  # lse (kept for the backward) + the row-loss scratch
            results.append({"op": "cross_entropy_fwd_bwd_extra_memory", "case": case,
                            "metric": "GB peak", "ours": round(ours_gb, 6),
                            "peers": {"torch F.cross_entropy autograd": round(tp[1], 3)},
                            "ratio_best_peer": round(tp[1] / ours_gb, 1),
                            "note": "ours: N*4 B lse + N*4 B stream-ordered scratch, gradient "
                                    "in place (counted, not measured: cudaMallocAsync is outside "
                                    "torch's allocator); torch: max_memory_allocated over one "
                                    "forward + backward minus the allocated before"})
            write_doc(args, copy_tbps, results)
            print(f"{'cross_entropy extra memory':24s} {case:18s} ours {ours_gb:.4f} GB | torch "
                  f"{tp[1]:.2f} GB", flush=True)
        del zs, ys
        torch.cuda.empty_cache()


def write_doc(args, copy_tbps, rows):
    if not args.json:
        return
    doc = {
        "bench": "fused_ops",
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "commit": args.commit,
        "command": args.command,
        "torch": torch.__version__,
        "ceilings": {"copy_TBps": round(copy_tbps, 3)},
        "timing": ("CUDA events around 5 calls after a ~1 ms torch.cuda._sleep (host launch "
                   "latency hidden), median of 25, two input sets alternating"
                   + (f"; {args.warm_ms:g} ms of calls before each entry's batches"
                      if args.warm_ms > 0 else "")
                   + (f"; then {args.l2_scrub_mb} MB of another buffer read (L2 scrub)"
                      if args.l2_scrub_mb > 0 else "")
                   + (f"; ours and the peers again in {args.peer_rounds} balanced rounds, medians"
                      if args.peer_rounds > 1 else "")),
        "rows": rows,
    }
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


def ncu_run(S, train=False, torch_too=True):
    """For ncu (--kernel-name-base demangled --kernel-name 'regex:ot::norm_|ot::rope_|
    neg_kernel'), 16k x 4096 bf16, each kernel once: a copy-like elementwise kernel
    (torch.neg(x, out=y): the copy's ceiling as a kernel, which cudaMemcpyAsync is not), RMSNorm / LayerNorm forward
    (defaults), RMSNorm / LayerNorm backward
    (saved statistics, dweight / dbias: main kernel + partials' sum), RoPE q + k (NeoX,
    cache, q [16k, 32, 128], k [16k, 8, 128]), default. With train, ncu_train's kernels
    after them (ours: add 'ot::glu_', and 'triton' for inductor's, to the regex, as
    scripts/device_fused_round.sh does)."""
    N, H, dt = 16384, 4096, torch.bfloat16
    x, dy = rnd(N, H, dtype=dt), rnd(N, H, dtype=dt)
    w, b = rnd(H, dtype=dt, lo=0.5, hi=1.5), rnd(H, dtype=dt)
    out, dx = torch.empty_like(x), torch.empty_like(x)
    mean, rstd = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
    dw, db = torch.empty(H, dtype=dt, device="cuda"), torch.empty(H, dtype=dt, device="cuda")
    torch.neg(x, out=out)
    for layer in (0, 1):
        m = mean if layer else None
        norm_fwd_call(S, layer, x, None, w, b if layer else None, 1e-6, out, None, m, rstd)()
    # saved statistics made on the CPU (no kernel on the GPU besides the profiled ones)
    xc = x.cpu().float()
    mu_c = xc.mean(1)
    stats = {0: (None, torch.rsqrt(xc.pow(2).mean(1) + 1e-6).cuda()),
             1: (mu_c.cuda(), torch.rsqrt((xc - mu_c[:, None]).pow(2).mean(1) + 1e-6).cuda())}
    del xc
    for layer in (0, 1):
        m, r = stats[layer]
        norm_bwd_call(S, layer, dy, None, x, w, m, r, 1e-6, dx, dw, db if layer else None)()
    D = 128
    q, k = x.view(N, H // D, D), rnd(N, 8, D, dtype=dt)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    pos = torch.randint(0, 8192, (N,), device="cuda", dtype=torch.int64)
    ang = torch.arange(8192, dtype=torch.float64)[:, None] * inv_freq_ref(D, 10000.0)
    cache = torch.cat([torch.cos(ang), torch.sin(ang)], 1).float().cuda()
    rope_call(S, q, k, qo, ko, pos, cache, 0, D, 10000.0, False)()
    torch.cuda.synchronize()
    del x, dy, out, dx, q, k, qo, ko
    if train:
        ncu_train(S, torch_too)
    print("ncu run: done")


def ncu_rms_wide(S, H=8192):
    """For ncu with --profile-from-start off: torch.compile of hf_rms compiled and run first
    (its autotuning outside the profiled range), then inside cudaProfilerStart / Stop each
    once at 16k x H bf16: torch.neg (the copy-like kernel), our RMSNorm forward, inductor's
    kernel. Run it with TORCH_LOGS=output_code to see inductor's source. (2026-12-04 at 8192:
    inductor's looped two-pass reduction 122-123 us, DRAM 86-87% busy; ours 130-134 us,
    80-82%, under every row shape, occupancy and load hint tried; docs/PERFORMANCE.md.)"""
    N, dt = 16384, torch.bfloat16
    x, w = rnd(N, H, dtype=dt), rnd(H, dtype=dt, lo=0.5, hi=1.5)
    out, rstd = torch.empty_like(x), torch.empty(N, device="cuda")
    c = torch.compile(hf_rms, dynamic=False)
    for _ in range(3):
        c(x, w, 1e-6)
    torch.neg(x, out=out)
    call = norm_fwd_call(S, 0, x, None, w, None, 1e-6, out, None, None, rstd)
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    torch.neg(x, out=out)
    call()
    y = c(x, w, 1e-6)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    err = (y.float() - out.float()).abs().max().item()
    print(f"ncu rms wide: done (H {H}; max |inductor - ours| {err:.3g})")


def ncu_train(S, torch_too):
    """The 0.54 B training shapes once each (after ncu_run's): SwiGLU forward and backward
    at 8192 x 5632 bf16 (ours; with torch_too, inductor's fused forward and its compiled
    backward, torch.compile of F.silu(g) * u), the RMSNorm backward with dres and dweight
    at 8192 x 2048 (main kernel + partials' sum)."""
    N, H, Fm, dt = 8192, 2048, 5632, torch.bfloat16
    g, u, dy = (rnd(N, Fm, dtype=dt) for _ in range(3))
    o, dg = torch.empty_like(g), torch.empty_like(g)
    glu_fwd_call(S, 0, g, u, o)()
    glu_bwd_call(S, 0, dy, g, u, o, dg)()
    if torch_too:
        cf = torch.compile(lambda a, b: F.silu(a) * b, dynamic=False)
        gg, uu = g.detach().clone().requires_grad_(True), u.detach().clone().requires_grad_(True)
        y = cf(gg, uu)
        torch.autograd.grad(y, (gg, uu), dy)
    del g, u, dy, o, dg
    x, dy, dr = (rnd(N, H, dtype=dt) for _ in range(3))
    w = rnd(H, dtype=dt, lo=0.5, hi=1.5)
    rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
    dx, dw = torch.empty_like(x), torch.empty(H, dtype=dt, device="cuda")
    norm_bwd_call(S, 0, dy, dr, x, w, None, rstd, 1e-6, dx, dw, None)()
    torch.cuda.synchronize()


def bits_ab(S, ab):
    """--bits-ab: the norm forward (RMSNorm / LayerNorm, with and without the residual) through
    each --ab-shim build, compared bit for bit with ours (out, residual_out, mean, rstd), over
    row groups of 32-256 threads (H 1000-16384) in bfloat16 and float32. For a change meant to
    keep the bits (e.g. a row sum in the same order). Returns the number of differing calls."""
    bad = 0
    for name, S2 in ab:
        same = diff = 0
        for dt in (torch.bfloat16, torch.float32):
            for H in (1000, 2048, 4096, 8192, 16384):
                N = 37
                x = rnd(N, H, dtype=dt, lo=-1.0, hi=3.0)
                r = rnd(N, H, dtype=dt)
                w = rnd(H, dtype=dt, lo=0.5, hi=1.5)
                b = rnd(H, dtype=dt)
                for layer in (0, 1):
                    for res in (None, r):
                        outs = []
                        for SS in (S, S2):
                            o, ro = nan_like(x), nan_like(x)
                            mean = torch.full((N,), float("nan"), device="cuda")
                            rstd = torch.full((N,), float("nan"), device="cuda")
                            norm_fwd_call(SS, layer, x, res, w, b if layer else None, 1e-5, o,
                                          ro if res is not None else None, mean if layer else None, rstd)()
                            torch.cuda.synchronize()
                            outs.append([o, ro, mean, rstd])
                        eq = all(torch.equal(a.view(torch.int32 if a.dtype == torch.float32 else torch.int16),
                                             c.view(torch.int32 if c.dtype == torch.float32 else torch.int16))
                                 for a, c in zip(*outs))
                        same += eq
                        diff += not eq
                        if not eq:
                            md = max(((a.double() - c.double()).nan_to_num(0.0).abs().max().item() if a.numel() else 0.0)
                                     for a, c in zip(*outs) if a is not None and c is not None)
                            print(f"  bits differ ({name}): {'layernorm' if layer else 'rmsnorm'} {dt} H={H}"
                                  f"{' residual' if res is not None else ''}: max |diff| {md:.3g}")
        print(f"bits-ab ({name}): {same} calls equal bit for bit, {diff} differ")
        bad += diff
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--only", default="norm,rope,glu,ce")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="torch.neg, the norm and RoPE kernels once each, for ncu")
    ap.add_argument("--ncu-train", action="store_true",
                    help="--ncu: then the training shapes (ncu_train: SwiGLU 8k x 5632 with "
                         "torch.compile's kernels, the RMSNorm backward 8k x 2048)")
    ap.add_argument("--ncu-rms-wide", type=int, default=0, metavar="H",
                    help="for ncu --profile-from-start off: ours and torch.compile's RMSNorm forward "
                         "at 16k x H bf16 (ncu_rms_wide)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--hidden", default="4096,8192", help="--bench: hidden sizes (16k rows each)")
    ap.add_argument("--train-compile", action="store_true",
                    help="--only train / rmsbwd: torch.compile peers even with --no-compile "
                         "(rmsbwd: its 2048-wide cases)")
    ap.add_argument("--ce-last", dest="ce_first", action="store_false",
                    help="cross-entropy rows last (default: first, the newest kernels first)")
    ap.add_argument("--ab-shim", action="append", default=[], metavar="NAME=PATH",
                    help="--bench: time the same calls through this shim too (a variant NAME); "
                         "--ncu: its kernels first")
    ap.add_argument("--bits-ab", action="store_true",
                    help="the norm forward through each --ab-shim compared bit for bit with ours")
    ap.add_argument("--ab-rounds", type=int, default=1,
                    help="--bench with --ab-shim: ours and every build timed in R rounds, the "
                         "order reversed every other round; medians over the rounds")
    ap.add_argument("--cases", default="",
                    help="--bench: more ROWSxHIDDEN cases after the 16k-row ones, e.g. 8192x2048")
    ap.add_argument("--cut-ab", action="store_true",
                    help="--bench: the variants are the opt-ins of 2026-11-30 night (RMSNorm "
                         "forward OT_NORM_RMS_FWD_CUT=1 / 2, RoPE OT_ROPE_IMPL=w4), timed in "
                         "--ab-rounds' balanced rounds with ours")
    ap.add_argument("--peer-rounds", type=int, default=1,
                    help="--bench: each row's ours and peers timed again in R balanced rounds "
                         "(order reversed every other round) and reported as the medians; the "
                         "first timings kept in the row as single_pass_TBps")
    ap.add_argument("--l2-scrub-mb", type=int, default=0,
                    help="--bench: before each entry's timed batches (after its warm-up), read this "
                         "many MB of another buffer with plain loads, so that no L2 line an earlier "
                         "entry left serves the entry (0: none; 256 covers the H200's 50 MB L2)")
    ap.add_argument("--no-env-variants", action="store_true",
                    help="--bench: no run-time-switch variants (OT_NORM_* / OT_ROPE_IMPL rows), "
                         "so that a build A/B (--ab-shim) times only ours and the builds")
    ap.add_argument("--rope-tail", action="store_true",
                    help="--bench: the RoPE forward also at whole rounds of its warp slots")
    ap.add_argument("--warm-ms", type=float, default=0.0,
                    help="--bench: before each entry's timed batches, calls until this many ms "
                         "have passed (the steady state under the power cap; 0: none)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--command", default=None)
    args = ap.parse_args()
    torch.manual_seed(1234)
    S = Shim(args.shim)
    AB_ROUNDS[0] = args.ab_rounds
    PEER_ROUNDS[0] = args.peer_rounds
    L2_SCRUB_MB[0] = args.l2_scrub_mb
    WARM_MS[0] = args.warm_ms
    ENV_ROUNDS[0] = args.cut_ab
    for spec in args.ab_shim:
        name, path = spec.split("=", 1)
        AB_SHIMS.append((name, Shim(path)))
    rc = 0
    if args.check:  # ours, then each --ab-shim build
        for name, S2 in [("ours", S)] + AB_SHIMS:
            ck = Checker()
            for fam, fn in (("norm", check_norms), ("rope", check_rope), ("glu", check_glu),
                            ("ce", check_ce)):
                if fam in args.only:
                    fn(S2, ck, args.small)
                    torch.cuda.synchronize()
            who = "" if S2 is S else f" ({name})"  # ours: "check: ..." as the scripts grep it
            print(f"check{who}: {ck.passed} passed, {len(ck.failed)} failed")
            for f in ck.failed[:60]:
                print("  FAIL", f)
            rc = 1 if ck.failed else rc
    if args.bits_ab:
        rc = 1 if bits_ab(S, AB_SHIMS) else rc
    if args.sanitize:
        sanitize_run(S, args.only)
    if args.ncu:
        for name, S2 in AB_SHIMS:
            print(f"ncu run: {name} ({len(AB_SHIMS)} shim(s) before ours)")
            ncu_run(S2, args.ncu_train, torch_too=False)
        ncu_run(S, args.ncu_train)
    if args.ncu_rms_wide:
        ncu_rms_wide(S, args.ncu_rms_wide)
    if args.bench:
        copy_tbps, rows = bench_all(S, args)
        write_doc(args, copy_tbps, rows)
        print()
        print(f"{'op':32s} {'case':16s} {'ours TB/s':>9s} {'%copy':>6s} {'best peer':>9s} {'ratio':>6s}")
        for r in rows:
            if r.get("metric") != "TB/s":
                continue
            bp = max(r["peers"].values()) if r["peers"] else float("nan")
            print(f"{r['op']:32s} {r['case']:16s} {r['ours']:9.2f} {r['fraction_of_ceiling']*100:5.1f}% "
                  f"{bp:9.2f} {r['ratio_best_peer'] or float('nan'):6.2f}")
        print(f"copy bandwidth {copy_tbps:.2f} TB/s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
