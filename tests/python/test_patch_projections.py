"""patch.py's _Projections (q / k / v and gate / up as one autograd Function whose
backward sums the input gradient inside the GEMMs: addmm with beta 1 instead of one GEMM
per projection plus autograd's elementwise adds), the plain-tensor checks of the MLP's
_SwiGLUDown backward, and the fused LM-head loss's chunk (_lce_chunk_tokens). CPU float32 (the tests with a `device` parameter run on CUDA too,
bf16, when the package has the CUDA backend and a GPU is present)."""

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from ops_transformer import _torch_ops
from ops_transformer import patch as ot_patch

transformers = pytest.importorskip("transformers")
from test_patch import (B, S, V, assert_grads_close, loss_and_grads,  # noqa: E402
                        tiny_family, tiny_llama)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and ot.has_cuda() else [])


def linears(device="cpu", dtype=torch.float32, bias=False, outs=(16, 8, 8), seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Linear(16, n, bias=bias).to(device, dtype) for n in outs]


def grads_of(outs, inputs, seed=3):
    g = torch.Generator().manual_seed(seed)
    gs = [torch.randn(o.shape, generator=g).to(o.device, o.dtype) for o in outs]
    return torch.autograd.grad(outs, inputs, gs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [False, True])
def test_projections_equal_the_linears(device, bias):
    """Outputs bitwise the Linears' (the same F.linear calls); input, weight and bias
    gradients those of autograd over the separate Linears (the input gradient summed in
    another order: float32 to 1e-5, bf16 to its rounding)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    ls = linears(device, dtype, bias)
    x = torch.randn(2, 5, 16, device=device, dtype=dtype, requires_grad=True)
    params = [p for m in ls for p in m.parameters()]
    outs = ot_patch._project(x, ls)
    assert type(outs[0].grad_fn).__name__ == "_ProjectionsBackward"
    ref = [m(x) for m in ls]
    for a, b in zip(outs, ref):
        assert torch.equal(a, b)
    g1, g0 = grads_of(outs, [x] + params), grads_of(ref, [x] + params)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_projections_input_gradient_is_accumulated_in_the_gemm(monkeypatch):
    """dx = dy_0 w_0 (mm) then += dy_i w_i (addmm_, in place): no separate add."""
    ls = linears()
    x = torch.randn(2, 5, 16, requires_grad=True)
    outs = ot_patch._project(x, ls)
    seen = []
    real = torch.Tensor.addmm_

    def spy(self, *a, **k):
        seen.append(self.shape)
        return real(self, *a, **k)
    monkeypatch.setattr(torch.Tensor, "addmm_", spy)
    with torch.profiler.profile() as prof:
        grads_of(outs, [x])
    names = [e.name for e in prof.events()]
    assert seen == [(10, 16), (10, 16)]
    assert "aten::add" not in names and "aten::add_" not in names


@pytest.mark.parametrize("out", ["contiguous", "transposed", "strided"])
def test_addmm_inplace_op(out):
    """ops_transformer::addmm_inplace (the compiled backward's beta-1 sum): schema with
    the mutation declared, fake impl, autograd registration and AOT dispatch (opcheck),
    also when the accumulated tensor is a view; eager: out += a @ b through the view."""
    torch.manual_seed(0)
    shape, view = {"contiguous": ((8, 6), lambda t: t),
                   "transposed": ((6, 8), lambda t: t.t()),
                   "strided": ((8, 12), lambda t: t[:, ::2])}[out]
    base = torch.randn(shape)
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    torch.library.opcheck(ot_patch._addmm_inplace, (view(base.clone()), a, b))
    ref = base.clone()
    view(ref).addmm_(a, b)
    ot_patch._addmm_inplace(view(base), a, b)
    torch.testing.assert_close(base, ref, rtol=1e-6, atol=1e-6)


def test_projections_compiled_backward_sums_in_place():
    """Under torch.compile _Projections' backward sums the input gradient with
    ops_transformer::addmm_inplace, both calls into the buffer of the first mm (before:
    aten.addmm_, which the graph made functional: a new output and a copy each), with
    the gradients of the eager Function."""
    run_and_get_code = pytest.importorskip("torch._inductor.utils").run_and_get_code
    import re
    ls = linears(bias=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    params = [p for m in ls for p in m.parameters()]

    def f(x):
        return sum(o.square().sum() for o in ot_patch._project(x, ls))
    g0 = torch.autograd.grad(f(x), [x] + params)
    cf = torch.compile(f, fullgraph=True)
    g1, codes = run_and_get_code(lambda: torch.autograd.grad(cf(x), [x] + params))
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    calls = [m for c in codes for m in
             re.findall(r"ops_transformer\.addmm_inplace\.default\((\w+),", c)]
    assert len(calls) == 2 and len(set(calls)) == 1, calls


def test_projections_unused_output_and_frozen_parts():
    """An output with no gradient adds nothing (no zeros multiplied); only what needs a
    gradient gets one (a frozen weight, an input that does not require grad)."""
    ls = linears()
    x = torch.randn(2, 5, 16, requires_grad=True)
    q, k, v = ot_patch._project(x, ls)
    g = torch.autograd.grad(q.sum() + v.pow(2).sum(), x)[0]
    g0 = torch.autograd.grad(ls[0](x).sum() + ls[2](x).pow(2).sum(), x)[0]
    torch.testing.assert_close(g, g0, rtol=1e-5, atol=1e-6)
    # only k's gradient reaches x: the others give no term at all
    q, k, v = ot_patch._project(x, ls)
    torch.testing.assert_close(torch.autograd.grad(k.sum(), x)[0],
                               torch.autograd.grad(ls[1](x).sum(), x)[0])
    ls[1].weight.requires_grad_(False)
    xf = x.detach()                                  # no input gradient
    outs = ot_patch._project(xf, ls)
    assert type(outs[0].grad_fn).__name__ == "_ProjectionsBackward"
    sum(o.sum() for o in outs).backward()
    assert xf.grad is None and ls[1].weight.grad is None
    assert ls[0].weight.grad is not None and ls[2].weight.grad is not None


def test_projections_save_x_only_for_weight_gradients():
    """x is saved only where a weight needs its gradient: frozen projections of an input
    that needs its own keep no activation, as the Linears' own nodes (before: x always
    saved, one [tokens, hidden] tensor a group per frozen layer); the input and bias
    gradients are the Linears' then too."""
    ls = linears(bias=True)
    x = torch.randn(2, 5, 16, requires_grad=True)

    def saved(f):
        got = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (got.append(t), t)[1],
                                                      lambda t: t):
            outs = f()
        return outs, [t.data_ptr() for t in got]
    _, ptrs = saved(lambda: ot_patch._project(x, ls))
    assert x.data_ptr() in ptrs                          # weight gradients need x
    for m in ls:
        m.weight.requires_grad_(False)
    outs, ptrs = saved(lambda: ot_patch._project(x, ls))
    assert type(outs[0].grad_fn).__name__ == "_ProjectionsBackward"
    assert x.data_ptr() not in ptrs
    inputs = [x] + [m.bias for m in ls]
    for a, b in zip(grads_of(outs, inputs), grads_of([m(x) for m in ls], inputs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_projections_double_backward():
    ls = linears()
    x = torch.randn(2, 5, 16, requires_grad=True)

    def gg(outs):
        g, = torch.autograd.grad(sum((o ** 2).sum() for o in outs), x, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), x)[0]
    torch.testing.assert_close(gg(ot_patch._project(x, ls)), gg([m(x) for m in ls]),
                               rtol=1e-5, atol=1e-5)


def test_projections_keep_the_module_calls_where_they_must():
    """Module calls (hooks run, subclasses keep their forward) when a Linear has a hook
    or is not exactly nn.Linear, a global module hook is set, autocast is on, in no-grad
    mode, or when nothing needs a gradient."""
    x = torch.randn(2, 5, 16, requires_grad=True)

    def fn(ls, x=x):
        outs = ot_patch._project(x, ls)
        return outs[0].grad_fn is not None and \
            type(outs[0].grad_fn).__name__ == "_ProjectionsBackward"
    ls = linears()
    assert fn(ls)
    ran = []
    h = ls[1].register_forward_hook(lambda m, i, o: ran.append(m))
    assert not fn(ls) and ran == [ls[1]]
    h.remove()
    h = ls[2].register_forward_pre_hook(lambda m, i: None)
    assert not fn(ls)
    h.remove()
    h = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        assert not fn(ls)
    finally:
        h.remove()
    assert fn(ls)

    class MyLinear(torch.nn.Linear):
        pass
    torch.manual_seed(0)
    assert not fn(ls[:2] + [MyLinear(16, 8)])
    assert not ot_patch._plain_linear(ls[0], torch.float64)          # another dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fn(ls)
    with torch.no_grad():
        assert ot_patch._project(x, ls)[0].grad_fn is None
    for m in ls:
        m.requires_grad_(False)
    assert ot_patch._project(x.detach(), ls)[0].grad_fn is None


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_patched_model_runs_the_projections(ids, family, monkeypatch):
    """Each layer's attention (q / k / v; Qwen2's with biases) and MLP (gate / up) go
    through _Projections in training; the loss and every gradient match HF's (the
    checks test_patch.py makes, here with the projections counted)."""
    model = tiny_family(family)
    loss0, _, g0 = loss_and_grads(model, ids)
    ot.patch_model(model)
    n = []
    real = ot_patch._Projections.apply
    monkeypatch.setattr(ot_patch._Projections, "apply",
                        staticmethod(lambda *a: (n.append(len(a)), real(*a))[1]))
    loss1, _, g1 = loss_and_grads(model, ids)
    layers = model.config.num_hidden_layers
    assert sorted(n) == [5] * layers + [7] * layers        # x + (w, b) x 2 and x 3
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=0)
    assert_grads_close(g0, g1)


@pytest.fixture
def ids():
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))


class _Sub(torch.Tensor):
    """A minimal tensor subclass (torch.Tensor's default __torch_function__ keeps it)."""


class _CountingOps:
    """patch._tops with the plain GLU implementations counted (the custom ops call the
    real module's functions, so they are not)."""

    def __init__(self):
        self.plain = 0

    def __getattr__(self, name):
        got = getattr(_torch_ops, name)
        if name in ("_glu_impl", "_glu_backward_impl", "_glu_backward_recompute_impl"):
            def counted(*a):
                self.plain += 1
                return got(*a)
            return counted
        return got


@pytest.mark.parametrize("which", ["none", "up", "weight", "dy"])
def test_swiglu_down_backward_plain_only_for_plain_tensors(which, monkeypatch):
    """_SwiGLUDown's backward hands the C library its tensors directly (the plain GLU
    implementations) only when gate, up, the down weight and the incoming gradient are
    all plain tensors; a subclass in any of them (a DTensor weight, say) goes through the
    custom ops, which dispatch it (before: only gate was checked). Same results."""
    torch.manual_seed(0)
    gate, up = torch.randn(6, 16, requires_grad=True), torch.randn(6, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    ref = ot_patch._SwiGLUDown.apply(gate, up, w, None)
    dy = torch.randn(6, 8)
    g_ref = torch.autograd.grad(ref, (gate, up, w), dy)
    counting = _CountingOps()
    monkeypatch.setattr(ot_patch, "_tops", counting)
    up2 = up.detach().as_subclass(_Sub).requires_grad_() if which == "up" else up
    w2 = w.detach().as_subclass(_Sub).requires_grad_() if which == "weight" else w
    dy2 = dy.as_subclass(_Sub) if which == "dy" else dy
    out = ot_patch._SwiGLUDown.apply(gate, up2, w2, None)
    g = torch.autograd.grad(out, (gate, up2, w2), dy2)
    # one plain call: the backward's glu_backward_recompute (dgate, dup and the product
    # for the weight gradient from one pass)
    assert counting.plain == (1 if which == "none" else 0), which
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a.as_subclass(torch.Tensor), b, rtol=1e-5, atol=1e-6)


def test_swiglu_down_backward_switch_to_two_passes(monkeypatch):
    """patch.SWIGLU_RECOMPUTE = False (OT_PATCH_SWIGLU_RECOMPUTE=0 at import): the backward
    as before (glu, then glu_backward: two plain calls instead of one
    glu_backward_recompute), the same gradients; the global as it was at the forward
    decides, and an explicit argument overrides it."""
    torch.manual_seed(2)
    gate, up = torch.randn(6, 16, requires_grad=True), torch.randn(6, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    dy = torch.randn(6, 8)
    got = {}
    for how, flag, arg in (("global on", True, None), ("global off", False, None),
                           ("argument off", True, False), ("argument on", False, True)):
        monkeypatch.setattr(ot_patch, "SWIGLU_RECOMPUTE", flag)
        counting = _CountingOps()
        monkeypatch.setattr(ot_patch, "_tops", counting)
        out = ot_patch._SwiGLUDown.apply(gate, up, w, None, None, arg)
        monkeypatch.setattr(ot_patch, "SWIGLU_RECOMPUTE", not flag)  # (after the forward)
        got[how] = torch.autograd.grad(out, (gate, up, w), dy)
        one = flag if arg is None else arg
        assert counting.plain == (1 if one else 2), how
    for how in ("global off", "argument off", "argument on"):
        for a, b in zip(got["global on"], got[how]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("need", ["all", "weight", "inputs"])
def test_swiglu_down_backward_each_gradient_subset(need):
    """_SwiGLUDown's backward by the gradients asked for: all three through one
    glu_backward_recompute (its product feeds the weight gradient), the weight alone
    through glu, the inputs alone through glu_backward -- the same values as HF's
    composition in float64."""
    torch.manual_seed(1)
    gate64, up64, w64 = torch.randn(5, 12, dtype=torch.float64), \
        torch.randn(5, 12, dtype=torch.float64), torch.randn(7, 12, dtype=torch.float64)
    dy = torch.randn(5, 7)
    req = {"all": (True, True, True), "weight": (False, False, True),
           "inputs": (True, True, False)}[need]
    gate, up, w = (t.float().requires_grad_(r) for t, r in zip((gate64, up64, w64), req))
    out = ot_patch._SwiGLUDown.apply(gate, up, w, None)
    wrt = [t for t in (gate, up, w) if t.requires_grad]
    got = torch.autograd.grad(out, wrt, dy)
    g2, u2, w2 = (t.clone().requires_grad_(r) for t, r in zip((gate64, up64, w64), req))
    ref_out = F.linear(F.silu(g2) * u2, w2)
    ref = torch.autograd.grad(ref_out, [t for t in (g2, u2, w2) if t.requires_grad],
                              dy.double())
    torch.testing.assert_close(out.double(), ref_out.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_lce_chunk_tokens():
    """The fused loss's chunk: the library's default (0: 256 MiB of logits) where that
    holds 2048 rows or every token; else 2048 rows, or as many as fit 512 MiB of logits
    when fewer (the measured optimum at V 128256: docs/PERFORMANCE.md)."""
    f = ot_patch._lce_chunk_tokens
    assert f(8192, 128256, 2) == 2048          # default 1046 rows
    assert f(8192, 32000, 2) == 0              # default 4194 rows
    assert f(16384, 32000, 2) == 0
    assert f(8192, 151936, 2) == 1766          # 512 MiB / (151936 x 2 B)
    assert f(8192, 128256, 4) == 1046          # float32: default 523 rows
    # default 1046 rows: not every token, so one 2048-row chunk (clamped to T by the
    # library) instead of two (before: 0, the default's two chunks)
    assert f(2048, 128256, 2) == 2048
    assert f(1500, 128256, 2) == 2048
    assert f(1046, 128256, 2) == 0             # the default holds every token
    for T, V, e in [(8192, 128256, 2), (70000, 50000, 4), (9000, 151936, 2), (9000, 10 ** 6, 2)]:
        c = f(T, V, e)
        default = ot_patch._LCE_CHUNK_BYTES // (V * e)
        assert c == 0 or (default < c <= 2048 and c * V * e <= 2 * ot_patch._LCE_CHUNK_BYTES)


def test_lce_chunk_rows_env(monkeypatch):
    """OT_LCE_CHUNK_ROWS=N (opt-in, read per call) is the chunk wherever it is a
    non-negative integer (0: the library's default); unset, empty or anything else: the
    rule above."""
    f = ot_patch._lce_chunk_tokens
    for v, want in [("8192", 8192), ("4096", 4096), ("0", 0), ("300", 300)]:
        monkeypatch.setenv("OT_LCE_CHUNK_ROWS", v)
        assert f(8192, 128256, 2) == want, v
        assert f(8192, 32000, 2) == want, v
    for v in ("", "-1", "abc", "2048.5"):
        monkeypatch.setenv("OT_LCE_CHUNK_ROWS", v)
        assert f(8192, 128256, 2) == 2048, v
        assert f(8192, 32000, 2) == 0, v
    monkeypatch.delenv("OT_LCE_CHUNK_ROWS")
    assert f(8192, 128256, 2) == 2048


def _lm_head_loss_spied(monkeypatch, seed):
    """lm_head_loss (impl="library") on 600 random tokens (H 16, V 1000, float32, CPU) with
    the library's fused loss spied on; its loss and gradients checked against the library's
    default chunk. Returns the chunk_tokens of each call."""
    T, H, V = 600, 16, 1000
    seen = []
    real = ot_patch._library_lce()

    def spy(*a, **k):
        seen.append(k.get("chunk_tokens"))
        return real(*a, **k)
    monkeypatch.setattr(ot_patch, "_library_lce", lambda: spy)
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2, T // 2, H, generator=g, requires_grad=True)
    w = (torch.randn(V, H, generator=g) * 0.1).requires_grad_()
    lab = torch.randint(0, V, (2, T // 2), generator=g)
    loss = ot_patch.lm_head_loss(h, w, lab, impl="library")
    gh, gw = torch.autograd.grad(loss, (h, w))
    shift = torch.nn.functional.pad(lab, (0, 1), value=-100)[..., 1:].reshape(-1)
    ref = real(h.reshape(-1, H), w, shift, ignore_index=-100, reduction="mean")
    rh, rw = torch.autograd.grad(ref, (h, w))
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, rh, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-7)
    return seen


@pytest.mark.parametrize("rows", ["600", "300", "0"])
def test_lm_head_loss_chunk_rows_env_matches_the_default(monkeypatch, rows):
    """Under OT_LCE_CHUNK_ROWS lm_head_loss hands the library that chunk (600: every token
    in one chunk, no beta = 1 pass over the weight gradient; 300: two; 0: the library's
    default), with the loss and gradients of the default chunk (float32, CPU)."""
    if not ot_patch._library_lce_usable(torch.device("cpu")):
        pytest.skip("the library's linear_cross_entropy is not in this build")
    monkeypatch.setenv("OT_LCE_CHUNK_ROWS", rows)
    assert _lm_head_loss_spied(monkeypatch, 5) == [int(rows)]


def test_lm_head_loss_passes_the_chunk_and_matches_the_default(monkeypatch):
    """lm_head_loss hands the library's fused loss the chunk of _lce_chunk_tokens; the
    loss and gradients equal those of the library's default chunk (float32, CPU; the
    chunk changes only the order of the weight gradient's additions)."""
    if not ot_patch._library_lce_usable(torch.device("cpu")):
        pytest.skip("the library's linear_cross_entropy is not in this build")
    monkeypatch.setattr(ot_patch, "_LCE_CHUNK_BYTES", 100 * 1000 * 4 + 5)   # default 100 rows
    monkeypatch.setattr(ot_patch, "_LCE_MIN_ROWS", 256)
    assert _lm_head_loss_spied(monkeypatch, 4) == [200]   # 2 x the default's logits < 256 rows
