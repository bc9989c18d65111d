"""Gradients in float16 / bfloat16 storage: the library's backward ops against torch
autograd of a float32 reference evaluated on the same (rounded) inputs. The gradient
comes back in the input's dtype; tolerances are a few units of that dtype's rounding
(float32 accumulation inside, one rounding of the stored result)."""

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import assert_close
from test_glu import ref_glu
from test_rope import ref_rope


def sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                          v.transpose(1, 2), **kw).transpose(1, 2)


CASES = {
    # name: (make inputs, ours, reference in float32)
    "attention": (lambda: [torch.randn(2, 9, 4, 16), torch.randn(2, 9, 2, 16),
                           torch.randn(2, 9, 2, 16)],
                  lambda q, k, v: ot.attention(q, k, v, causal=True),
                  lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True)),
    "linear": (lambda: [torch.randn(5, 3, 32), torch.randn(12, 32) / 6, torch.randn(12)],
               lambda x, w, b: ot.linear(x, w, b),
               lambda x, w, b: F.linear(x, w, b)),
    "swiglu": (lambda: [torch.randn(4, 7, 40) * 2, torch.randn(4, 7, 40)],
               lambda g, u: ot.swiglu(g, u),
               lambda g, u: ref_glu(g, u, "swiglu")),
    "softmax": (lambda: [torch.randn(6, 50) * 3],
                lambda x: ot.softmax(x),
                lambda x: torch.softmax(x, -1)),
    "layer_norm": (lambda: [torch.randn(6, 48) * 2 + 1, torch.randn(48), torch.randn(48)],
                   lambda x, w, b: ot.layer_norm(x, w, b),
                   lambda x, w, b: F.layer_norm(x, (48,), w, b, 1e-5)),
    "rope": (lambda: [torch.randn(8, 3, 32), torch.randn(8, 1, 32)],
             lambda q, k: torch.cat([t.flatten(1) for t in ot.rope(q, k, torch.arange(8))], 1),
             lambda q, k: torch.cat([ref_rope(q, torch.arange(8)).flatten(1),
                                     ref_rope(k, torch.arange(8)).flatten(1)], 1)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_grad_low_precision(dtype, name):
    make, ours, ref = CASES[name]
    inputs = [t.to(dtype) for t in make()]
    a = [t.clone().requires_grad_() for t in inputs]
    b = [t.float().requires_grad_() for t in inputs]
    ya = ours(*a)
    g = torch.randn(ya.shape).to(dtype)
    ya.float().mul(g.float()).sum().backward()
    ref(*b).mul(g.float()).sum().backward()
    for x, r in zip(a, b):
        assert x.grad.dtype == dtype
        # gradients sum over rows: scale the tolerance with the reduced length
        assert_close(x.grad, r.grad, dtype, scale=8)
