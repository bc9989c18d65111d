"""rope against a reference RoPE written here (NeoX and GPT-J pairing, partial rotary
dimension, Llama-3 frequency scaling, explicit cos/sin cache), forward and backward."""

import math

import pytest
import torch

import ops_transformer as ot
from conftest import DTYPES, assert_close, leaf


def inv_freq(rotary_dim, theta, llama3=None):
    f = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    if llama3:
        factor, lo, hi = llama3["factor"], llama3["low_freq_factor"], llama3["high_freq_factor"]
        old = llama3["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        f = torch.where(medium, smoothed, scaled)
    return f


def ref_rope(x, positions, rotary_dim=0, theta=10000.0, interleaved=False, llama3=None):
    """x [..., H, D], positions x's leading shape without H, D. Float64 angles."""
    D = x.shape[-1]
    rd = rotary_dim or D
    ang = positions.to(torch.float64)[..., None] * inv_freq(rd, theta, llama3)  # [..., rd/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]  # broadcast over heads
    xf = x.double()
    rot, rest = xf[..., :rd], xf[..., rd:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        a, b = rot[..., : rd // 2], rot[..., rd // 2:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return torch.cat([out, rest], dim=-1).float()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["thd", "bshd"])
def test_rope_forward(dtype, interleaved, layout):
    if layout == "thd":
        q, k = torch.randn(13, 4, 32), torch.randn(13, 2, 32)
        pos = torch.randint(0, 300, (13,))
    else:
        q, k = torch.randn(2, 7, 3, 64), torch.randn(2, 7, 1, 64)
        pos = torch.arange(7).repeat(2, 1) + torch.tensor([[0], [100]])
    q, k = q.to(dtype), k.to(dtype)
    qo, ko = ot.rope(q, k, pos, interleaved=interleaved)
    assert qo.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    assert_close(qo, ref_rope(q, pos, interleaved=interleaved), dtype, scale=10)
    assert_close(ko, ref_rope(k, pos, interleaved=interleaved), dtype, scale=10)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_partial_q_only_int32(interleaved):
    q = torch.randn(9, 5, 48)
    pos = torch.randint(0, 64, (9,), dtype=torch.int32)
    qo = ot.rope(q, None, pos, rotary_dim=16, theta=500000.0, interleaved=interleaved)
    expected = ref_rope(q, pos, rotary_dim=16, theta=500000.0, interleaved=interleaved)
    assert_close(qo, expected, scale=10)
    assert torch.equal(qo[..., 16:], q[..., 16:])


def test_rope_llama3_scaling():
    s = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    q = torch.randn(6, 2, 128)
    pos = torch.tensor([0, 1, 17, 100, 511, 1000])
    qo = ot.rope(q, None, pos, theta=500000.0, llama3_scaling=s)
    assert_close(qo, ref_rope(q, pos, theta=500000.0, llama3=s), scale=50)


def test_rope_cos_sin_cache_and_inplace():
    D = 32
    max_pos = 64
    f = inv_freq(D, 10000.0)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * f
    cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()
    q, k = torch.randn(10, 3, D), torch.randn(10, 3, D)
    pos = torch.randint(0, max_pos, (10,))
    eq, ek = ref_rope(q, pos), ref_rope(k, pos)
    qo, ko = ot.rope(q, k, pos, cos_sin_cache=cache, theta=1.0)  # theta ignored with a cache
    assert_close(qo, eq, scale=10)
    assert_close(ko, ek, scale=10)
    qo, ko = ot.rope(q, k, pos, inplace=True)
    assert qo is q and ko is k
    assert_close(q, eq, scale=10)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [0, 8])
def test_rope_grad(interleaved, rotary_dim):
    q, k = torch.randn(2, 5, 4, 16), torch.randn(2, 5, 2, 16)
    pos = torch.randint(0, 50, (2, 5))
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    qa, ka = leaf(q), leaf(k)
    qo, ko = ot.rope(qa, ka, pos, rotary_dim=rotary_dim, interleaved=interleaved)
    ((qo * gq).sum() + (ko * gk).sum()).backward()
    qb, kb = leaf(q), leaf(k)
    ((ref_rope(qb, pos, rotary_dim, interleaved=interleaved) * gq).sum()
     + (ref_rope(kb, pos, rotary_dim, interleaved=interleaved) * gk).sum()).backward()
    assert_close(qa.grad, qb.grad, scale=10)
    assert_close(ka.grad, kb.grad, scale=10)
    # the plain backward binding agrees
    dq, dk = ot.rope_backward(gq, gk, pos, rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close(dq, qb.grad, scale=10)
    assert_close(dk, kb.grad, scale=10)
