"""swiglu / geglu against a reference written here, both layouts, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import DTYPES, assert_close, leaf


def ref_glu(gate, up, kind):
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    gate, up = gate.float(), up.float()
    if kind == "swiglu":
        a = F.silu(gate)
    elif kind == "geglu":
        a = F.gelu(gate)
    else:
        a = F.gelu(gate, approximate="tanh")
    return a * up


def run(kind, gate, up):
    if kind == "swiglu":
        return ot.swiglu(gate, up)
    return ot.geglu(gate, up, approximate="tanh" if kind == "geglu_tanh" else "none")


KINDS = ["swiglu", "geglu", "geglu_tanh"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 3, 100)])
@pytest.mark.parametrize("fused", [False, True])
def test_glu_forward(dtype, kind, shape, fused):
    if fused:
        gate, up = (torch.randn(shape[:-1] + (2 * shape[-1],)) * 3).to(dtype), None
    else:
        gate, up = (torch.randn(shape) * 3).to(dtype), torch.randn(shape).to(dtype)
    y = run(kind, gate, up)
    assert y.shape == shape and y.dtype == dtype
    assert_close(y, ref_glu(gate, up, kind), dtype, scale=4)


def test_swiglu_out_and_strided_rows():
    g = torch.randn(6, 80)[:, :40]
    u = torch.randn(6, 40)
    out = torch.empty(6, 40)
    assert ot.swiglu(g, u, out=out) is out
    assert_close(out, ref_glu(g, u, "swiglu"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fused", [False, True])
def test_glu_grad(kind, fused):
    F_ = 24
    gate = torch.randn(4, 3, 2 * F_ if fused else F_) * 2
    up = None if fused else torch.randn(4, 3, F_)
    g = torch.randn(4, 3, F_)
    ga = leaf(gate)
    ua = leaf(up) if up is not None else None
    (run(kind, ga, ua) * g).sum().backward()
    gb = leaf(gate)
    ub = leaf(up) if up is not None else None
    (ref_glu(gb, ub, kind) * g).sum().backward()
    assert_close(ga.grad, gb.grad, scale=10)
    if up is not None:
        assert_close(ua.grad, ub.grad, scale=10)


def test_glu_backward_direct():
    gate, up, dout = torch.randn(5, 8), torch.randn(5, 8), torch.randn(5, 8)
    dg, du = ot.glu_backward(dout, gate, up, kind=ot.ops.GLU_SWIGLU)
    gb, ub = leaf(gate), leaf(up)
    ref_glu(gb, ub, "swiglu").backward(dout)
    assert_close(dg, gb.grad, scale=10)
    assert_close(du, ub.grad, scale=10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fused", [False, True])
def test_glu_backward_recompute(dtype, kind, fused):
    """glu_backward(recompute=True): dgate / dup as without it, and out bit for bit the
    forward's output for the same gate and up (strided rows, odd F)."""
    kinds = {"swiglu": ot.ops.GLU_SWIGLU, "geglu": ot.ops.GLU_GEGLU,
             "geglu_tanh": ot.ops.GLU_GEGLU_TANH}
    F_ = 37
    gate = (torch.randn(6, 2 * F_ + 3) * 3).to(dtype)[:, :2 * F_ if fused else F_]
    up = None if fused else torch.randn(6, F_).to(dtype)
    dout = torch.randn(6, F_).to(dtype)
    dg, du = ot.glu_backward(dout, gate, up, kind=kinds[kind])
    dg2, du2, out = ot.glu_backward(dout, gate, up, kind=kinds[kind], recompute=True)
    assert torch.equal(dg2, dg)
    assert (du2 is None) if fused else torch.equal(du2, du)
    assert torch.equal(out, run(kind, gate, up))
    assert_close(out, ref_glu(gate, up, kind), dtype, scale=4)


def test_glu_backward_recompute_custom_op():
    """The custom op behind the patched MLP's backward: schema and fake implementation
    (opcheck), and its three outputs against glu / glu_backward."""
    gate, up, dout = torch.randn(4, 9), torch.randn(4, 9), torch.randn(4, 9)
    op = torch.ops.ops_transformer.glu_backward_recompute.default
    torch.library.opcheck(op, (dout, gate, up, 0))
    torch.library.opcheck(op, (dout, torch.randn(4, 18), None, 0))
    dg, du, out = op(dout, gate, up, 0)
    ref_dg, ref_du = torch.ops.ops_transformer.glu_backward(dout, gate, up, 0)
    assert torch.equal(dg, ref_dg) and torch.equal(du, ref_du)
    assert torch.equal(out, torch.ops.ops_transformer.glu(gate, up, 0))
