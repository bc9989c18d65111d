"""linear against torch.nn.functional.linear, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import DTYPES, assert_close, leaf


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [((1, 1), 1), ((5, 7), 3), ((2, 3, 64), 65), ((33, 128), 96)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward(dtype, shape, bias):
    xs, N = shape
    K = xs[-1]
    x = torch.randn(xs).to(dtype)
    w = (torch.randn(N, K) / K ** 0.5).to(dtype)
    b = torch.randn(N).to(dtype) if bias else None
    y = ot.linear(x, w, b)
    assert y.shape == xs[:-1] + (N,) and y.dtype == dtype
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert_close(y, ref, dtype, scale=4)


def test_linear_out_strided_rows():
    x = torch.randn(6, 40)[:, :32]
    w = torch.randn(16, 32)
    out = torch.empty(6, 16)
    assert ot.linear(x, w, out=out) is out
    assert_close(out, F.linear(x, w), scale=10)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("need", ["all", "x_only", "w_only"])
def test_linear_grad(bias, need):
    x, w = torch.randn(2, 5, 24), torch.randn(10, 24)
    b = torch.randn(10) if bias else None
    g = torch.randn(2, 5, 10)
    rx, rw = need in ("all", "x_only"), need in ("all", "w_only")
    xa, wa = leaf(x, rx), leaf(w, rw)
    ba = leaf(b) if bias else None
    (ot.linear(xa, wa, ba) * g).sum().backward()
    xb, wb = leaf(x, rx), leaf(w, rw)
    bb = leaf(b) if bias else None
    (F.linear(xb, wb, bb) * g).sum().backward()
    for a, r in [(xa, xb), (wa, wb), (ba, bb)]:
        if a is not None and a.requires_grad:
            assert_close(a.grad, r.grad, scale=20)
        elif a is not None:
            assert a.grad is None


def test_linear_backward_direct():
    x, w, dy = torch.randn(7, 12), torch.randn(5, 12), torch.randn(7, 5)
    dx, dw, db = ot.linear_backward(dy, x, w, need_dbias=True)
    assert_close(dx, dy @ w, scale=20)
    assert_close(dw, dy.t() @ x, scale=20)
    assert_close(db, dy.sum(0), scale=20)
