"""attention against torch.nn.functional.scaled_dot_product_attention (incl. enable_gqa
and is_causal) and an explicit masked reference (bottom-right causal alignment when
Sq != Sk, sliding window, softcap), dense BSHD and packed varlen; forward and backward."""

import math

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import DTYPES, assert_close, leaf


def sdpa(q, k, v, **kw):
    """SDPA on BSHD tensors."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       **kw)
    return o.transpose(1, 2)


def ref_attention(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0):
    """Explicit reference on BSHD float tensors; returns (out, lse [B, Hq, Sq])."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = scale or 1.0 / math.sqrt(D)
    rep = Hq // Hkv
    qh = q.float().transpose(1, 2)
    kh = k.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    s = qh @ kh.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq)[:, None] + (Sk - Sq)
    j = torch.arange(Sk)[None, :]
    allowed = torch.ones(Sq, Sk, dtype=torch.bool)
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    if wl >= 0:
        allowed &= j >= i - wl
    if wr >= 0:
        allowed &= j <= i + wr
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ vh).transpose(1, 2), lse


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dims", [(1, 1, 1, 1, 8), (2, 7, 4, 4, 32), (1, 33, 8, 2, 64),
                                  (3, 16, 6, 1, 16)])
def test_attention_vs_sdpa(dtype, causal, dims):
    B, S, Hq, Hkv, D = dims
    q = torch.randn(B, S, Hq, D).to(dtype)
    k = torch.randn(B, S, Hkv, D).to(dtype)
    v = torch.randn(B, S, Hkv, D).to(dtype)
    out, lse = ot.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (B, Hq, S) and lse.dtype == torch.float32
    ref = sdpa(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=Hq != Hkv)
    assert_close(out, ref, dtype, scale=4)
    _, ref_lse = ref_attention(q, k, v, causal)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("Sq,Sk", [(5, 9), (9, 5), (1, 17)])
@pytest.mark.parametrize("opts", [dict(causal=True), dict(window=(3, 1)),
                                  dict(causal=True, window=(4, -1)), dict(softcap=5.0),
                                  dict(softmax_scale=0.3)])
def test_attention_masks(Sq, Sk, opts):
    q, k, v = torch.randn(2, Sq, 4, 16), torch.randn(2, Sk, 2, 16), torch.randn(2, Sk, 2, 16)
    out = ot.attention(q, k, v, **opts)
    ref, _ = ref_attention(q, k, v, causal=opts.get("causal", False),
                           scale=opts.get("softmax_scale"), window=opts.get("window", (-1, -1)),
                           softcap=opts.get("softcap", 0.0))
    assert_close(out, ref, scale=10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_varlen(dtype, causal):
    lens_q = [3, 0, 1, 9]
    lens_k = [3, 2, 4, 9] if not causal else [5, 2, 1, 9]
    Hq, Hkv, D = 4, 2, 32
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), Hq, D).to(dtype)
    k = torch.randn(sum(lens_k), Hkv, D).to(dtype)
    v = torch.randn(sum(lens_k), Hkv, D).to(dtype)
    out, lse = ot.attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                            return_lse=True)
    assert out.shape == q.shape and lse.shape == (Hq, sum(lens_q))
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        ref, ref_lse = ref_attention(q[None, qs], k[None, ks], v[None, ks], causal)
        assert_close(out[qs], ref[0], dtype, scale=4)
        torch.testing.assert_close(lse[:, qs], ref_lse[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_attention_grad(causal, gqa):
    B, S, Hq, D = 2, 11, 4, 16
    Hkv = 2 if gqa else Hq
    q, k, v = torch.randn(B, S, Hq, D), torch.randn(B, S, Hkv, D), torch.randn(B, S, Hkv, D)
    g = torch.randn(B, S, Hq, D)
    qa, ka, va = leaf(q), leaf(k), leaf(v)
    (ot.attention(qa, ka, va, causal=causal) * g).sum().backward()
    qb, kb, vb = leaf(q), leaf(k), leaf(v)
    (sdpa(qb, kb, vb, is_causal=causal, enable_gqa=gqa) * g).sum().backward()
    for a, b in [(qa, qb), (ka, kb), (va, vb)]:
        assert_close(a.grad, b.grad, scale=20)


def test_attention_grad_window_softcap_sq_ne_sk():
    q, k, v = torch.randn(1, 6, 2, 8), torch.randn(1, 10, 1, 8), torch.randn(1, 10, 1, 8)
    g = torch.randn(1, 6, 2, 8)
    opts = dict(causal=True, window=(5, -1), softcap=3.0)
    qa, ka, va = leaf(q), leaf(k), leaf(v)
    (ot.attention(qa, ka, va, **opts) * g).sum().backward()
    qb, kb, vb = leaf(q), leaf(k), leaf(v)
    (ref_attention(qb, kb, vb, causal=True, window=(5, -1), softcap=3.0)[0] * g).sum().backward()
    for a, b in [(qa, qb), (ka, kb), (va, vb)]:
        assert_close(a.grad, b.grad, scale=20)


def test_attention_varlen_grad():
    lens = [4, 7]
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    q, k, v = torch.randn(11, 2, 8), torch.randn(11, 1, 8), torch.randn(11, 1, 8)
    g = torch.randn(11, 2, 8)
    qa, ka, va = leaf(q), leaf(k), leaf(v)
    (ot.attention(qa, ka, va, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu) * g).sum().backward()
    qb, kb, vb = leaf(q), leaf(k), leaf(v)
    outs = []
    for b in range(2):
        s = slice(cu[b], cu[b + 1])
        outs.append(ref_attention(qb[None, s], kb[None, s], vb[None, s], causal=True)[0][0])
    (torch.cat(outs) * g).sum().backward()
    for a, b in [(qa, qb), (ka, kb), (va, vb)]:
        assert_close(a.grad, b.grad, scale=20)


def test_attention_backward_direct():
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    out, lse = ot.attention(q, k, v, return_lse=True)
    dout = torch.randn_like(out)
    dq, dk, dv = ot.attention_backward(q, k, v, out, dout, lse)
    qb, kb, vb = leaf(q), leaf(k), leaf(v)
    sdpa(qb, kb, vb).backward(dout)
    for a, b in [(dq, qb), (dk, kb), (dv, vb)]:
        assert_close(a, b.grad, scale=20)


@pytest.mark.skipif(not (torch.cuda.is_available() and ot.has_cuda()), reason="needs CUDA")
@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_grad_cuda_bf16(D, causal):
    """bf16 on the GPU through autograd, GQA 4 / 2, S 300 (a partial last tile of every
    kernel's): on a 9.0 device the Hopper forward and backward at all four head dims (D
    256's backward and D 96's both since 2026-12-03: the D 128 kernels on zero-filled
    columns), elsewhere the portable ones; against float32 SDPA on the same rounded
    inputs. A wrong key block or column half moves the relative error to O(1)."""
    B, S, Hq, Hkv = 2, 300, 4, 2
    q, k, v = (torch.randn(B, S, h, D, device="cuda").to(torch.bfloat16)
               for h in (Hq, Hkv, Hkv))
    g = torch.randn(B, S, Hq, D, device="cuda").to(torch.bfloat16)
    qa, ka, va = leaf(q), leaf(k), leaf(v)
    (ot.attention(qa, ka, va, causal=causal).float() * g.float()).sum().backward()
    qb, kb, vb = leaf(q.float()), leaf(k.float()), leaf(v.float())
    (sdpa(qb, kb, vb, is_causal=causal, enable_gqa=True) * g.float()).sum().backward()
    for name, a, b in [("dq", qa, qb), ("dk", ka, kb), ("dv", va, vb)]:
        assert a.grad.dtype == torch.bfloat16 and torch.isfinite(a.grad).all()
        rel = ((a.grad.float() - b.grad).norm() / b.grad.norm()).item()
        assert rel < 1.5e-2, f"{name}: relative error {rel:.3g}"
        assert_close(a.grad, b.grad, torch.bfloat16, scale=4, msg=name)
