"""rms_norm / layer_norm against torch.nn.functional, forward and backward."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import DTYPES, assert_close, leaf

SHAPES = [(1, 1), (3, 7), (2, 5, 33), (17, 130), (4, 1024)]


def ref_rms(x, w, eps):
    return F.rms_norm(x.float(), (x.shape[-1],), None if w is None else w.float(), eps)


def ref_ln(x, w, b, eps):
    return F.layer_norm(x.float(), (x.shape[-1],), None if w is None else w.float(),
                        None if b is None else b.float(), eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_forward(dtype, shape, with_weight):
    x = torch.randn(shape).to(dtype)
    w = torch.randn(shape[-1]).to(dtype) if with_weight else None
    y = ot.rms_norm(x, w, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, ref_rms(x, w, 1e-6), dtype, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_residual(dtype, shape):
    x, r = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    w = torch.randn(shape[-1]).to(dtype)
    y, h = ot.rms_norm(x, w, 1e-5, residual=r)
    h_ref = (x.float() + r.float()).to(dtype)
    assert torch.equal(h, h_ref)
    assert_close(y, ref_rms(h_ref, w, 1e-5), dtype, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_layer_norm_forward(dtype, shape, affine):
    x = (torch.randn(shape) * 3 + 1).to(dtype)
    w = torch.randn(shape[-1]).to(dtype) if affine != "none" else None
    b = torch.randn(shape[-1]).to(dtype) if affine == "wb" else None
    y = ot.layer_norm(x, w, b, 1e-5)
    assert_close(y, ref_ln(x, w, b, 1e-5), dtype, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_residual(dtype):
    x, r = torch.randn(6, 50).to(dtype), torch.randn(6, 50).to(dtype)
    w, b = torch.randn(50).to(dtype), torch.randn(50).to(dtype)
    y, h = ot.layer_norm(x, w, b, 1e-5, residual=r)
    h_ref = (x.float() + r.float()).to(dtype)
    assert torch.equal(h, h_ref)
    assert_close(y, ref_ln(h_ref, w, b, 1e-5), dtype, scale=2)


def test_out_in_place_and_strided_rows():
    base = torch.randn(8, 96)
    x = base[:, :64]  # rows strided, last dim contiguous
    w = torch.randn(64)
    expected = ref_rms(x, w, 1e-6)
    y = ot.rms_norm(x, w, 1e-6)
    assert_close(y, expected)
    xc = x.clone()
    r = ot.rms_norm(xc, w, 1e-6, out=xc)
    assert r is xc
    assert_close(xc, expected)


@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 33), (16, 256)])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_grad(shape, residual):
    x, w = torch.randn(shape), torch.randn(shape[-1])
    r = torch.randn(shape) if residual else None
    g = torch.randn(shape)
    gh = torch.randn(shape)
    # ours
    xa, wa = leaf(x), leaf(w)
    ra = leaf(r) if residual else None
    if residual:
        y, h = ot.rms_norm(xa, wa, 1e-6, residual=ra)
        ((y * g).sum() + (h * gh).sum()).backward()
    else:
        (ot.rms_norm(xa, wa, 1e-6) * g).sum().backward()
    # reference
    xb, wb = leaf(x), leaf(w)
    rb = leaf(r) if residual else None
    hb = xb + rb if residual else xb
    loss = (F.rms_norm(hb, (shape[-1],), wb, 1e-6) * g).sum()
    if residual:
        loss = loss + (hb * gh).sum()
    loss.backward()
    assert_close(xa.grad, xb.grad, scale=10)
    assert_close(wa.grad, wb.grad, scale=10)
    if residual:
        assert_close(ra.grad, rb.grad, scale=10)


@pytest.mark.parametrize("affine", ["wb", "w", "none"])
@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_grad(affine, residual):
    shape = (5, 3, 40)
    x = torch.randn(shape) * 2 + 0.5
    w = torch.randn(40) if affine != "none" else None
    b = torch.randn(40) if affine == "wb" else None
    r = torch.randn(shape) if residual else None
    g = torch.randn(shape)
    xa = leaf(x)
    wa, ba, ra = (leaf(t) if t is not None else None for t in (w, b, r))
    out = ot.layer_norm(xa, wa, ba, 1e-5, residual=ra)
    (out[0] if residual else out).mul(g).sum().backward()
    xb = leaf(x)
    wb, bb, rb = (leaf(t) if t is not None else None for t in (w, b, r))
    hb = xb + rb if residual else xb
    F.layer_norm(hb, (40,), wb, bb, 1e-5).mul(g).sum().backward()
    assert_close(xa.grad, xb.grad, scale=10)
    for a, b_ in [(wa, wb), (ba, bb), (ra, rb)]:
        if a is not None:
            assert_close(a.grad, b_.grad, scale=10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_grad_low_precision(dtype):
    x, w, g = torch.randn(9, 70), torch.randn(70), torch.randn(9, 70)
    xa, wa = leaf(x.to(dtype)), leaf(w.to(dtype))
    (ot.rms_norm(xa, wa).float() * g).sum().backward()
    assert xa.grad.dtype == dtype and wa.grad.dtype == dtype
    xb, wb = leaf(x.to(dtype).float()), leaf(w.to(dtype).float())
    (F.rms_norm(xb, (70,), wb, 1e-6) * g.to(dtype).float()).sum().backward()
    assert_close(xa.grad, xb.grad, dtype, scale=4)
    assert_close(wa.grad, wb.grad, dtype, scale=8)


def test_backward_functions_direct():
    x, w, dy = torch.randn(4, 32), torch.randn(32), torch.randn(4, 32)
    dx, dw = ot.rms_norm_backward(dy, x, w)
    xb, wb = leaf(x), leaf(w)
    F.rms_norm(xb, (32,), wb, 1e-6).backward(dy)
    assert_close(dx, xb.grad, scale=10)
    assert_close(dw, wb.grad, scale=10)
    dx, dw, db = ot.layer_norm_backward(dy, x, w)
    xb, wb = leaf(x), leaf(w)
    F.layer_norm(xb, (32,), wb, None, 1e-5).backward(dy)
    assert_close(dx, xb.grad, scale=10)
    assert_close(dw, wb.grad, scale=10)
    assert_close(db, dy.sum(0), scale=10)


def test_numpy_inputs():
    x = np.random.default_rng(0).standard_normal((5, 24)).astype(np.float32)
    w = np.ones(24, np.float32)
    y = ot.rms_norm(x, w)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    ref = ref_rms(torch.from_numpy(x), torch.from_numpy(w), 1e-6).numpy()
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)
    y16 = ot.layer_norm(x.astype(np.float16))
    assert y16.dtype == np.float16


def test_zero_rows():
    x = torch.randn(0, 8, requires_grad=True)
    w = torch.ones(8, requires_grad=True)
    y = ot.rms_norm(x, w)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 8)
    assert torch.equal(w.grad, torch.zeros(8))
    with torch.no_grad():
        assert ot.layer_norm(torch.randn(0, 3, 8)).shape == (0, 3, 8)
