"""ops_transformer.linear_cross_entropy against F.linear + F.cross_entropy (CPU)."""

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot


def _inputs(T, H, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) / H ** 0.5).to(dtype)
    y = torch.randint(0, V, (T,), generator=g)
    y[1::4] = -100
    return h, w, y


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk", [0, 3])
def test_forward_backward_fp32(reduction, chunk):
    h, w, y = _inputs(13, 16, 37, torch.float32)
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss1 = ot.linear_cross_entropy(h1, w1, y, reduction=reduction, chunk_tokens=chunk,
                                    label_smoothing=0.1)
    loss2 = F.cross_entropy(F.linear(h2, w2), y, reduction=reduction, label_smoothing=0.1)
    torch.testing.assert_close(loss1, loss2, rtol=1e-5, atol=1e-5)
    (2.5 * loss1).backward()
    (2.5 * loss2).backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-6)


def test_bf16_close_to_torch():
    h, w, y = _inputs(40, 32, 100, torch.bfloat16)
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss1 = ot.linear_cross_entropy(h1, w1, y, chunk_tokens=16, accumulate_fp32=True)
    loss2 = F.cross_entropy(F.linear(h.float(), w.float()), y)
    torch.testing.assert_close(loss1, loss2, rtol=2e-2, atol=2e-2)
    loss1.backward()
    assert h1.grad.dtype == torch.bfloat16 and w1.grad.dtype == torch.bfloat16


def test_no_grad_and_none_reduction():
    h, w, y = _inputs(9, 8, 11, torch.float32)
    with torch.no_grad():
        l = ot.linear_cross_entropy(h, w, y, reduction="none")
    ref = F.cross_entropy(F.linear(h, w), y, reduction="none")
    torch.testing.assert_close(l, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ot.Error, match="none"):
        ot.linear_cross_entropy(h.requires_grad_(), w, y, reduction="none")


def test_leading_dims_and_bad_labels():
    h, w, y = _inputs(12, 8, 11, torch.float32)
    l = ot.linear_cross_entropy(h.reshape(3, 4, 8), w, y.reshape(3, 4))
    torch.testing.assert_close(l, F.cross_entropy(F.linear(h, w), y), rtol=1e-5, atol=1e-5)
    y2 = y.clone()
    y2[0] = 11
    with pytest.raises(ot.Error, match="labels"):
        ot.linear_cross_entropy(h, w, y2)
