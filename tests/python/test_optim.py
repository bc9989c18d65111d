"""ops_transformer.optim.AdamW against torch.optim.AdamW (CPU)."""

import pytest
import torch

import ops_transformer as ot
import ops_transformer.optim


def _params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(1,), (3,), (17, 5), (70000,), (2, 3, 4)]
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


def _grads(params, step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in params]


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_matches_torch_fp32(wd):
    ours = _params()
    ref = [p.detach().clone().requires_grad_() for p in ours]
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=wd)
    o1 = ops_transformer.optim.AdamW(ours, **kw)
    o2 = torch.optim.AdamW(ref, foreach=False, **kw)
    for step in range(5):
        for p, q, g in zip(ours, ref, _grads(ours, step)):
            p.grad = g.clone()
            q.grad = g.clone()
        o1.step()
        o2.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
        s1, s2 = o1.state[p], o2.state[q]
        torch.testing.assert_close(s1["exp_avg"], s2["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(s1["exp_avg_sq"], s2["exp_avg_sq"], rtol=1e-5, atol=1e-9)
        assert s1["step"] == 5


def test_adamw_master_weights_bf16():
    ours = _params(torch.bfloat16)
    ref = [p.detach().float().requires_grad_() for p in ours]
    kw = dict(lr=1e-2, weight_decay=0.01)
    o1 = ops_transformer.optim.AdamW(ours, master_weights=True, **kw)
    o2 = torch.optim.AdamW(ref, foreach=False, **kw)
    for step in range(3):
        for p, q, g in zip(ours, ref, _grads(ours, step)):
            p.grad = g.clone()
            q.grad = g.float()
        o1.step()
        o2.step()
    for p, q in zip(ours, ref):
        m = o1.state[p]["master"]
        assert m.dtype == torch.float32
        torch.testing.assert_close(m, q.detach(), rtol=1e-5, atol=1e-6)
        assert torch.equal(p.detach(), m.to(torch.bfloat16))


def test_adamw_skips_params_without_grad_and_groups():
    a, b = torch.randn(4, requires_grad=True), torch.randn(3, requires_grad=True)
    before = b.detach().clone()
    opt = ops_transformer.optim.AdamW([{"params": [a]}, {"params": [b], "lr": 0.5}])
    a.grad = torch.randn(4)
    opt.step()
    assert torch.equal(b.detach(), before)
    assert opt.state[a]["step"] == 1 and len(opt.state[b]) == 0


def test_adamw_step_errors():
    p = torch.randn(4)
    with pytest.raises(ot.Error, match="beta1"):
        ot.adamw_step([p], [p.clone()], [torch.zeros(4)], [torch.zeros(4)], lr=1e-3,
                      betas=(1.0, 0.9), step=1)
    with pytest.raises(ot.Error, match="grads\\[0\\]"):
        ot.adamw_step([p], [torch.zeros(5)], [torch.zeros(4)], [torch.zeros(4)], lr=1e-3,
                      step=1)


def test_adamw_failed_step_leaves_state():
    """A step the library refuses (a bad hyper-parameter reaches ot_adamw_step) changes
    neither the parameters nor the step count: the next good step is step 1, as in
    torch.optim.AdamW."""
    params = _params()
    ref = [p.detach().clone().requires_grad_() for p in params]
    opt = ops_transformer.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999))
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.999))
    for p, r, g in zip(params, ref, _grads(params, 0)):
        p.grad, r.grad = g.clone(), g.clone()
    before = [p.detach().clone() for p in params]
    opt.param_groups[0]["betas"] = (1.5, 0.999)          # refused by the library
    with pytest.raises(ot.Error, match="beta1"):
        opt.step()
    assert all(opt.state[p]["step"] == 0 for p in params)
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    opt.param_groups[0]["betas"] = (0.9, 0.999)
    opt.step()
    ref_opt.step()
    assert all(opt.state[p]["step"] == 1 for p in params)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


_CUDA = torch.cuda.is_available() and ot.has_cuda()


def _cuda_params(dtype, seed=0):
    # shapes across the kernels' paths: vector groups of 8 and 4, ragged tails, more than
    # one 64K-element chunk
    g = torch.Generator().manual_seed(seed)
    shapes = [(1,), (7,), (299,), (17, 5), (65536 + 13,), (3, 70001), (4104,)]
    return [(torch.randn(s, generator=g) * 0.5).to("cuda", dtype).requires_grad_()
            for s in shapes]


@pytest.mark.skipif(not _CUDA, reason="needs the CUDA backend")
@pytest.mark.parametrize("impl", ["", "v4", "v8", "exact", "fast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adamw_impl_cuda_matches_torch_fused(monkeypatch, impl, dtype):
    """ops_transformer.optim.AdamW on CUDA under OT_ADAMW_IMPL (unset and "fast": the
    default kernel, approximate square root and division; "exact" / "v8": IEEE arithmetic;
    "v4": the W = 4 kernel, docs/PERFORMANCE.md) against torch's fused AdamW with the
    training benchmark's hyperparameters: float32 within a few ulps of the update, bf16
    (parameters, gradients, moments) within one bf16 rounding."""
    if impl:
        monkeypatch.setenv("OT_ADAMW_IMPL", impl)
    else:
        monkeypatch.delenv("OT_ADAMW_IMPL", raising=False)
    ours = _cuda_params(dtype)
    ref = [p.detach().clone().requires_grad_() for p in ours]
    kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    o1 = ops_transformer.optim.AdamW(ours, **kw)
    o2 = torch.optim.AdamW(ref, fused=True, **kw)
    for step in range(3):
        for p, q, g in zip(ours, ref, _grads(ours, step)):
            p.grad = g.to("cuda")
            q.grad = g.to("cuda")
        o1.step()
        o2.step()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.detach(), q.detach(), **tol)
        torch.testing.assert_close(o1.state[p]["exp_avg"], o2.state[q]["exp_avg"], **tol)
        torch.testing.assert_close(o1.state[p]["exp_avg_sq"], o2.state[q]["exp_avg_sq"],
                                   rtol=tol["rtol"], atol=1e-8)


@pytest.mark.skipif(not _CUDA, reason="needs the CUDA backend")
@pytest.mark.parametrize("ref,impl", [("exact", "v4"), ("exact", "v8"), ("fast", None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adamw_impl_cuda_same_bits(monkeypatch, ref, impl, dtype):
    """OT_ADAMW_IMPL=v4 (four elements a thread) and "v8" (another name of "exact") keep
    "exact"'s arithmetic, and the default (OT_ADAMW_IMPL unset) is "fast":
    the same bits, the tensors' ragged tails included (sizes 1, 7, 299, 65549, ...)."""
    a, b = _cuda_params(dtype, seed=3), _cuda_params(dtype, seed=3)
    kw = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    oa, ob = ops_transformer.optim.AdamW(a, **kw), ops_transformer.optim.AdamW(b, **kw)
    for step in range(3):
        for p, q, g in zip(a, b, _grads(a, step)):
            p.grad = g.to("cuda")
            q.grad = g.to("cuda")
        monkeypatch.setenv("OT_ADAMW_IMPL", ref)
        oa.step()
        if impl is None:
            monkeypatch.delenv("OT_ADAMW_IMPL", raising=False)
        else:
            monkeypatch.setenv("OT_ADAMW_IMPL", impl)
        ob.step()
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(oa.state[p]["exp_avg"], ob.state[q]["exp_avg"])
        assert torch.equal(oa.state[p]["exp_avg_sq"], ob.state[q]["exp_avg_sq"])
