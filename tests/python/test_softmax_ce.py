"""softmax and cross_entropy against torch, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import DTYPES, assert_close, leaf


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (4, 7), (2, 3, 129), (3, 5000)])
def test_softmax_forward(dtype, shape):
    x = (torch.randn(shape) * 4).to(dtype)
    y = ot.softmax(x)
    assert y.dtype == dtype
    assert_close(y, torch.softmax(x.float(), -1), dtype, scale=2)


def test_softmax_in_place_and_extreme():
    x = torch.tensor([[1e4, 0.0, -1e4], [-30.0, -30.0, -30.0]])
    expected = torch.softmax(x, -1)
    assert ot.softmax(x, out=x) is x
    assert_close(x, expected)


@pytest.mark.parametrize("shape", [(3, 9), (2, 4, 33)])
def test_softmax_grad(shape):
    x, g = torch.randn(shape), torch.randn(shape)
    xa, xb = leaf(x), leaf(x)
    (ot.softmax(xa) * g).sum().backward()
    (torch.softmax(xb, -1) * g).sum().backward()
    assert_close(xa.grad, xb.grad, scale=10)
    y = torch.softmax(x, -1)
    assert_close(ot.softmax_backward(g, y), xb.grad, scale=10)


def make_ce(N, V, dtype, ignore_frac=0.25, label_dtype=torch.int64, ignore_index=-100):
    logits = (torch.randn(N, V) * 3).to(dtype)
    labels = torch.randint(0, V, (N,))
    drop = torch.rand(N) < ignore_frac
    labels[drop] = ignore_index
    return logits, labels.to(label_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("NV", [(1, 1), (7, 13), (33, 1000)])
def test_cross_entropy_forward(dtype, reduction, smoothing, NV):
    logits, labels = make_ce(*NV, dtype)
    loss = ot.cross_entropy(logits, labels, label_smoothing=smoothing, reduction=reduction)
    ref = F.cross_entropy(logits.float(), labels, label_smoothing=smoothing,
                          reduction=reduction)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    torch.testing.assert_close(loss, ref, atol=1e-4 * max(1, NV[0]), rtol=1e-4, equal_nan=True)


@pytest.mark.parametrize("label_dtype", [torch.int32, torch.int64])
def test_cross_entropy_ignore_index_and_label_dtype(label_dtype):
    logits, labels = make_ce(20, 50, torch.float32, 0.4, label_dtype, ignore_index=7)
    loss = ot.cross_entropy(logits, labels, ignore_index=7, reduction="none")
    ref = F.cross_entropy(logits, labels.long(), ignore_index=7, reduction="none")
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    assert (loss[labels == 7] == 0).all()


def test_cross_entropy_all_ignored_mean_is_nan_and_3d():
    logits = torch.randn(4, 10)
    labels = torch.full((4,), -100)
    assert torch.isnan(ot.cross_entropy(logits, labels))
    logits, labels = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    loss = ot.cross_entropy(logits, labels, reduction="none")
    assert loss.shape == (2, 5)
    ref = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(loss, ref.reshape(2, 5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_grad(reduction, smoothing):
    logits, labels = make_ce(12, 37, torch.float32)
    la, lb = leaf(logits), leaf(logits)
    w = torch.randn(12) if reduction == "none" else torch.tensor(1.7)
    (ot.cross_entropy(la, labels, label_smoothing=smoothing, reduction=reduction) * w).sum() \
        .backward()
    (F.cross_entropy(lb, labels, label_smoothing=smoothing, reduction=reduction) * w).sum() \
        .backward()
    assert_close(la.grad, lb.grad, scale=10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cross_entropy_grad_low_precision(dtype):
    logits, labels = make_ce(16, 64, dtype)
    la = leaf(logits)
    ot.cross_entropy(la, labels).backward()
    assert la.grad.dtype == dtype
    lb = leaf(logits.float())
    F.cross_entropy(lb, labels).backward()
    assert_close(la.grad, lb.grad, dtype, scale=2)


def test_cross_entropy_backward_direct():
    logits, labels = make_ce(6, 9, torch.float32)
    d = ot.cross_entropy_backward(torch.tensor(1.0), logits, labels)
    lb = leaf(logits)
    F.cross_entropy(lb, labels).backward()
    assert_close(d, lb.grad, scale=10)
