"""The eager autograd path of the ops (python/ops_transformer/_torch_ops.py `eager`):
outside torch.compile an op that autograd records runs through a torch.autograd.Function
that calls the implementation directly instead of the torch.ops.ops_transformer custom
op (less host time a call, which the patched model pays per layer). Same results and
gradients as the custom op (the same implementation and backward formula: bitwise on the
CPU; on CUDA up to the order of atomic additions);
fake / meta tensors, dispatch modes and torch.compile keep the custom op."""

import time

import pytest
import torch

import ops_transformer as ot
from ops_transformer import _torch_ops

torch_ops = torch.ops.ops_transformer
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and ot.has_cuda() else [])


def leafs(*shapes, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype).to(device).requires_grad_()
            for s in shapes]


def cases(device="cpu"):
    """(name, fn(ops namespace, *inputs) -> outputs to differentiate, input shapes)."""
    pos = torch.arange(6, device=device).view(1, 6)
    lab = torch.tensor([1, 5, -100, 3, 7, 0], device=device)
    return [
        ("rms_norm", lambda o, x, r, w: o.rms_norm(x, r, w, 1e-6)[:2], [(6, 16), (6, 16), (16,)]),
        ("layer_norm", lambda o, x, w, b: o.layer_norm(x, None, w, b, 1e-5)[:1],
         [(6, 16), (16,), (16,)]),
        ("rope", lambda o, q, k: o.rope(q, k, pos, None, 0, 0, 10000.0, 0.0, 0.0, 0.0, 0),
         [(1, 6, 4, 16), (1, 6, 2, 16)]),
        ("glu", lambda o, g, u: (o.glu(g, u, 0),), [(6, 16), (6, 16)]),
        ("softmax", lambda o, x: (o.softmax(x),), [(6, 16)]),
        ("cross_entropy", lambda o, x: o.cross_entropy(x, lab, -100, 0.1, 0)[:1], [(6, 16)]),
        ("attention", lambda o, q, k, v: o.attention(q, k, v, None, None, 0.25, 1, -1, -1, 0.0,
                                                     0)[:1],
         [(1, 6, 4, 16), (1, 6, 2, 16), (1, 6, 2, 16)]),
        ("linear", lambda o, x, w, b: (o.linear(x, w, b),), [(6, 16), (8, 16), (8,)]),
        ("linear_cross_entropy", lambda o, h, w: o.linear_cross_entropy(
            h, w, lab, -100, 0.0, 0, 4, True, True, False)[:1], [(6, 16), (12, 16)]),
    ]


def run(ns, fn, shapes, device="cpu", dtype=torch.float32):
    xs = leafs(*shapes, dtype=dtype, device=device)
    outs = fn(ns, *xs)
    g = torch.Generator().manual_seed(9)
    loss = sum((o.float() * torch.randn(o.shape, generator=g).to(device)).sum() for o in outs)
    grads = torch.autograd.grad(loss, xs)
    return [o.detach() for o in outs], grads, outs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("i", range(len(cases())), ids=[c[0] for c in cases()])
def test_eager_path_equals_the_custom_op(i, device):
    """CPU float32; CUDA bf16 (the library's CUDA attention has no float32)."""
    name, fn, shapes = cases(device)[i]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    o1, g1, outs1 = run(_torch_ops.eager, fn, shapes, device, dtype)
    o0, g0, outs0 = run(torch_ops, fn, shapes, device, dtype)
    assert "_eager" in type(outs1[0].grad_fn).__name__          # the Function ran
    assert "_eager" not in type(outs0[0].grad_fn).__name__
    for a, b in zip(o1 + list(g1), o0 + list(g0)):
        if device == "cpu":
            assert torch.equal(a, b)
        else:       # CUDA reductions with atomics may add in another order
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


def test_ops_module_takes_the_eager_path_outside_compile():
    x, w = leafs((4, 8), (8,))
    y = ot.rms_norm(x, w, 1e-6)
    assert "_eager" in type(y.grad_fn).__name__
    with torch.no_grad():                                     # the direct _C path
        assert ot.rms_norm(x, w, 1e-6).grad_fn is None


def test_fake_meta_and_dispatch_modes_keep_the_custom_op():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    with FakeTensorMode():
        x = torch.randn(4, 8, requires_grad=True)
        w = torch.randn(8, requires_grad=True)
        y = ot.rms_norm(x, w, 1e-6)
        assert y.shape == (4, 8)
    xm = torch.randn(4, 8, device="meta", requires_grad=True)
    wm = torch.randn(8, device="meta", requires_grad=True)
    assert ot.rms_norm(xm, wm, 1e-6).device.type == "meta"

    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))
    x, w = leafs((4, 8), (8,))
    with Spy():
        ot.rms_norm(x, w, 1e-6)
    assert any("ops_transformer.rms_norm" in s for s in seen), seen


def test_eager_path_costs_less_host_time_than_the_custom_op():
    """Per-call host time of a recorded forward call (CPU, tiny tensors: the call overhead
    dominates; the autograd node is built, not run): the eager path at most 0.8x the
    custom op's (best of 5 rounds of 300 calls, interleaved; ~0.3x on the build VM)."""
    x, w = leafs((2, 8), (8,))

    def round_of(ns):
        t0 = time.perf_counter()
        for _ in range(300):
            ns.rms_norm(x, None, w, 1e-6)
        return (time.perf_counter() - t0) / 300
    round_of(_torch_ops.eager), round_of(torch_ops)             # warm-up
    eager = custom = float("inf")
    for _ in range(5):
        eager = min(eager, round_of(_torch_ops.eager))
        custom = min(custom, round_of(torch_ops))
    assert eager < 0.8 * custom, (eager, custom)


def test_double_backward_is_refused_as_by_the_custom_op():
    """create_graph=True: the eager path's backward calls the custom backward op, whose
    node refuses a second backward with the custom op's message (the plain implementation
    would return gradients that silently carry no graph)."""
    for ns in (_torch_ops.eager, torch_ops):
        x, w = leafs((4, 8), (8,))
        y = ns.rms_norm(x, None, w, 1e-6)[0]
        g, = torch.autograd.grad((y * y).sum(), x, create_graph=True)
        assert g.requires_grad
        with pytest.raises(RuntimeError, match="no autograd formula"):
            torch.autograd.grad(g.sum(), x)


def test_functorch_transforms_keep_the_custom_op():
    """vmap over a call autograd records (a weight that requires grad): the custom op,
    which vmap runs; a ctx-style autograd.Function is refused under functorch."""
    x = torch.randn(3, 4, 8)
    w = torch.randn(8, requires_grad=True)
    y = torch.func.vmap(lambda t: ot.rms_norm(t, w, 1e-6))(x)
    ref = torch.stack([ot.rms_norm(t, w, 1e-6) for t in x])
    assert torch.equal(y, ref)


class _Sub(torch.Tensor):
    """A minimal tensor subclass (torch.Tensor's default __torch_function__ keeps it)."""


@pytest.mark.parametrize("i", range(len(cases())), ids=[c[0] for c in cases()])
def test_a_subclass_in_any_tensor_argument_takes_the_custom_op(i):
    """A subclass tensor (a DTensor weight, say) in any tensor argument, not only the
    first, sends the call to the custom op (which dispatches subclasses) instead of
    handing it to the C library through the eager path; the same results."""
    name, fn, shapes = cases()[i]
    o_ref, g_ref, outs = run(_torch_ops.eager, fn, shapes)
    assert "_eager" in type(outs[0].grad_fn).__name__
    for j in range(len(shapes)):
        xs = leafs(*shapes)
        xs[j] = xs[j].detach().as_subclass(_Sub).requires_grad_()
        outs = fn(_torch_ops.eager, *xs)
        assert "_eager" not in type(outs[0].grad_fn).__name__, (name, j)
        g = torch.Generator().manual_seed(9)
        loss = sum((o.float() * torch.randn(o.shape, generator=g)).sum() for o in outs)
        grads = torch.autograd.grad(loss, xs)
        for a, b in zip([o.detach() for o in outs] + list(grads), o_ref + list(g_ref)):
            assert torch.equal(a.as_subclass(torch.Tensor), b), (name, j)



@pytest.mark.parametrize("i", range(len(cases())), ids=[c[0] for c in cases()])
def test_parameters_take_the_eager_path(i):
    """nn.Parameter (the weights: a subclass, but a plain tensor to dispatch) in any
    argument keeps the eager path."""
    name, fn, shapes = cases()[i]
    outs = fn(_torch_ops.eager, *[torch.nn.Parameter(x.detach()) for x in leafs(*shapes)])
    assert "_eager" in type(outs[0].grad_fn).__name__, name

class _Cut(torch.autograd.Function):
    """Identity whose backward passes no gradient (None): the output it wraps is part of
    the graph but gets no gradient, as if unused."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return None


def all_outputs_cases():
    """(name, fn(ops namespace, requires_grad flags, *inputs) -> differentiable outputs,
    input shapes): every op, with its full set of differentiable outputs."""
    pos = torch.arange(6).view(1, 6)
    lab = torch.tensor([1, 5, -100, 3, 7, 0])
    return [
        ("rms_norm_residual", lambda o, rg, x, r, w: o.rms_norm(x, r, w, 1e-6)[:2],
         [(6, 16), (6, 16), (16,)]),
        ("rms_norm", lambda o, rg, x, w: o.rms_norm(x, None, w, 1e-6)[:1], [(6, 16), (16,)]),
        ("layer_norm_residual", lambda o, rg, x, r, w, b: o.layer_norm(x, r, w, b, 1e-5)[:2],
         [(6, 16), (6, 16), (16,), (16,)]),
        ("layer_norm", lambda o, rg, x, w: o.layer_norm(x, None, w, None, 1e-5)[:1],
         [(6, 16), (16,)]),
        ("rope", lambda o, rg, q, k: o.rope(q, k, pos, None, 0, 0, 10000.0, 0.0, 0.0, 0.0, 0),
         [(1, 6, 4, 16), (1, 6, 2, 16)]),
        ("glu", lambda o, rg, g, u: (o.glu(g, u, 0),), [(6, 16), (6, 16)]),
        ("softmax", lambda o, rg, x: (o.softmax(x),), [(6, 16)]),
        ("cross_entropy", lambda o, rg, x: o.cross_entropy(x, lab, -100, 0.1, 0)[:1], [(6, 16)]),
        ("attention", lambda o, rg, q, k, v: o.attention(q, k, v, None, None, 0.25, 1, -1, -1,
                                                         0.0, 0)[:1],
         [(1, 6, 4, 16), (1, 6, 2, 16), (1, 6, 2, 16)]),
        ("linear", lambda o, rg, x, w, b: (o.linear(x, w, b),), [(6, 16), (8, 16), (8,)]),
        ("linear_cross_entropy", lambda o, rg, h, w: o.linear_cross_entropy(
            h, w, lab, -100, 0.0, 1, 4, rg[0], rg[1], False)[:1], [(6, 16), (12, 16)]),
    ]


def _bits(t):
    return None if t is None else t.detach().view(torch.int32)


@pytest.mark.parametrize("i", range(len(all_outputs_cases())),
                         ids=[c[0] for c in all_outputs_cases()])
def test_outputs_without_gradient_equal_the_custom_op(i):
    """Every requires_grad combination of the inputs x every subset of the differentiable
    outputs that get a gradient (the others pass through _Cut: no gradient, which the eager
    Functions of rms_norm / layer_norm / cross_entropy / attention / linear_cross_entropy
    see as None instead of materialized zeros -- e.g. rms_norm_residual's residual output
    unused -- and the empty subset: a backward call with no gradient at all): the eager
    path's gradients are bitwise those of the custom op (which always gets zeros), None
    where the custom op's are None. CPU float32."""
    import itertools
    name, fn, shapes = all_outputs_cases()[i]
    n_out = len(fn(torch_ops, [True] * len(shapes), *leafs(*shapes)))
    for rg in itertools.product([False, True], repeat=len(shapes)):
        if not any(rg):
            continue
        for used in itertools.product([False, True], repeat=n_out):
            res = []
            for ns in (_torch_ops.eager, torch_ops):
                xs = [x.detach().requires_grad_(f) for x, f in zip(leafs(*shapes), rg)]
                outs = fn(ns, rg, *xs)
                assert ("_eager" in type(outs[0].grad_fn).__name__) == (ns is not torch_ops)
                g = torch.Generator().manual_seed(9)
                loss = sum(((o if u else _Cut.apply(o)).float()
                            * torch.randn(o.shape, generator=g)).sum()
                           for o, u in zip(outs, used))
                res.append(torch.autograd.grad(loss, [x for x in xs if x.requires_grad],
                                               allow_unused=True))
            for a, b in zip(*res):
                assert (a is None) == (b is None), (name, rg, used)
                assert a is None or torch.equal(_bits(a), _bits(b)), (name, rg, used)


def test_eager_backward_allocates_no_zero_gradients():
    """The eager Functions do not materialize zeros for the outputs that are never
    differentiated (rstd, mean, lse, linear_cross_entropy's hidden / weight gradients, the
    empty h of a norm without residual): no aten::zeros in their backward (before: one to
    three a call, two [V, H]-sized ones for linear_cross_entropy)."""
    from torch.profiler import ProfilerActivity, profile
    e = _torch_ops.eager
    lab = torch.tensor([1, 5, -100, 3, 7, 0])
    calls = [
        (lambda x, r, w: e.rms_norm(x, r, w, 1e-6)[:2], [(6, 16), (6, 16), (16,)]),
        (lambda x, w: e.rms_norm(x, None, w, 1e-6)[:1], [(6, 16), (16,)]),
        (lambda x, r, w, b: e.layer_norm(x, r, w, b, 1e-5)[:2],
         [(6, 16), (6, 16), (16,), (16,)]),
        (lambda x, w: e.layer_norm(x, None, w, None, 1e-5)[:1], [(6, 16), (16,)]),
        (lambda x: e.cross_entropy(x, lab, -100, 0.0, 1)[:1], [(6, 16)]),
        (lambda q, k, v: e.attention(q, k, v, None, None, 0.25, 1, -1, -1, 0.0, 0)[:1],
         [(1, 6, 4, 16), (1, 6, 2, 16), (1, 6, 2, 16)]),
        (lambda h, w: e.linear_cross_entropy(h, w, lab, -100, 0.0, 1, 4, True, True,
                                             False)[:1], [(6, 16), (12, 16)]),
    ]
    for f, shapes in calls:
        loss = sum(o.float().sum() for o in f(*leafs(*shapes)))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loss.backward()
        zeros = [ev.name for ev in prof.events() if "zero" in ev.name]
        assert not zeros, zeros
