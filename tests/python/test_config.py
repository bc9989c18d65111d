"""The effects of ops_transformer.config's options (CPU; CUDA where present)."""

import logging
import os

import pytest
import torch

import ops_transformer as ot
from ops_transformer import patch as ot_patch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and ot.has_cuda() else [])


@pytest.fixture(autouse=True)
def _restore():
    saved = torch.get_float32_matmul_precision(), os.environ.get("OT_MATMUL_ALLOW_TF32")
    yield
    ot.config.reset()
    torch.set_float32_matmul_precision(saved[0])
    if saved[1] is None:
        os.environ.pop("OT_MATMUL_ALLOW_TF32", None)
    else:
        os.environ["OT_MATMUL_ALLOW_TF32"] = saved[1]


@pytest.mark.parametrize("value,torch_value,env", [("high", "high", "1"), ("tf32", "high", "1"),
                                                    ("medium", "medium", "1"),
                                                    ("highest", "highest", None)])
def test_matmul_precision_sets_torch_and_the_library(value, torch_value, env):
    ot.config.matmul_precision = value
    assert ot.config.matmul_precision == torch_value
    assert torch.get_float32_matmul_precision() == torch_value
    # src/cuda/gemm.h reads OT_MATMUL_ALLOW_TF32 when a GEMM runs
    assert os.environ.get("OT_MATMUL_ALLOW_TF32") == env
    if torch_value != "highest":
        assert torch.backends.cuda.matmul.allow_tf32
    with ot.config.override(matmul_precision="highest"):
        assert torch.get_float32_matmul_precision() == "highest"
        assert "OT_MATMUL_ALLOW_TF32" not in os.environ
    assert torch.get_float32_matmul_precision() == torch_value
    assert os.environ.get("OT_MATMUL_ALLOW_TF32") == env


def test_matmul_precision_validated_before_any_change():
    ot.config.matmul_precision = "high"
    with pytest.raises(TypeError):
        ot.config.set(matmul_precision="highest", fused_attention="no")
    assert ot.config.matmul_precision == "high"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_matmul_precision_high_changes_torch_fp32_gemm_on_cuda():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(512, 512, generator=g).cuda()
    b = torch.randn(512, 512, generator=g).cuda()
    ref = a.double() @ b.double()
    ot.config.matmul_precision = "highest"
    err_full = ((a @ b).double() - ref).abs().max().item()
    ot.config.matmul_precision = "high"
    err_tf32 = ((a @ b).double() - ref).abs().max().item()
    assert err_tf32 > 10 * err_full


def _tiny():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=256,
                                        max_position_embeddings=128))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_attention_false_uses_torch_sdpa(device, monkeypatch, caplog):
    pytest.importorskip("transformers")
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    model = _tiny().to(device)
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    ot.patch_model(model)
    calls = {"ot": 0, "torch": 0}
    orig_ot, orig_torch = ot.ops.attention, torch.nn.functional.scaled_dot_product_attention

    def spy_ot(*a, **k):
        calls["ot"] += 1
        return orig_ot(*a, **k)

    def spy_torch(*a, **k):
        calls["torch"] += 1
        return orig_torch(*a, **k)
    monkeypatch.setattr(ot.ops, "attention", spy_ot)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy_torch)
    ot_patch._LOGGED.clear()
    with torch.no_grad():
        with caplog.at_level(logging.WARNING, logger="ops_transformer"):
            with ot.config.override(fused_attention=False):
                out_off = model(ids, use_cache=False).logits
                out_off_cache = model(ids).logits        # through the attention interface
        assert calls == {"ot": 0, "torch": 4}, calls
        assert any("fused_attention=False" in r.getMessage() for r in caplog.records)
        out_on = model(ids, use_cache=False).logits
    # fused_attention=True: the library's kernel where it has this dtype / head dim
    lib = ot_patch._usable("attention", torch.device(device), torch.float32,
                           (16, 2, True, None))
    assert calls == ({"ot": 2, "torch": 4} if lib else {"ot": 0, "torch": 6}), calls
    for out in (out_off, out_off_cache, out_on):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fused_attention_false_sliding_window_and_packed():
    # the torch fallback keeps the library's semantics: bottom-right causal, windows,
    # packed (varlen) sequences
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 9, 4, 16, generator=g)
    k = torch.randn(2, 9, 2, 16, generator=g)
    v = torch.randn(2, 9, 2, 16, generator=g)
    for window in (None, (3, 0)):
        ref = ot.attention(q, k, v, causal=True, softmax_scale=0.25, window=window)
        out = ot_patch._torch_attention(q, k, v, True, 0.25, window)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    ref = ot.attention(q, k[:, :5], v[:, :5], causal=True, softmax_scale=0.25)
    out = ot_patch._torch_attention(q[:, :5][:, -3:], k[:, :5], v[:, :5], True, 0.25, None)
    torch.testing.assert_close(out, ot.attention(q[:, :5][:, -3:], k[:, :5], v[:, :5],
                                                 causal=True, softmax_scale=0.25),
                               rtol=1e-5, atol=1e-5)
    cu = torch.tensor([0, 4, 11, 18], dtype=torch.int32)
    qp, kp, vp = q.reshape(18, 4, 16), k.reshape(18, 2, 16), v.reshape(18, 2, 16)
    ref = ot.attention(qp, kp, vp, causal=True, softmax_scale=0.25, cu_seqlens_q=cu,
                       cu_seqlens_k=cu)
    out = ot_patch._torch_attention(qp, kp, vp, True, 0.25, None, cu)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_probes_of_the_library_ops_pass(device):
    # every probe the patch runs before trusting a library op on a device (on the CPU
    # they are skipped -- the CPU backend has every op -- so run them here directly)
    for dtype in (torch.float32, torch.bfloat16):
        for op, extra in [("rms_norm", ()), ("rms_norm_residual", ()), ("swiglu", ()),
                          ("cross_entropy", ()), ("rope", (64,)), ("rope", (128,)),
                          ("attention", (64, 1, True, None)), ("attention", (128, 4, True, None)),
                          ("attention", (64, 2, True, (7, 0)))]:
            if device == "cuda" and dtype == torch.float32 and op == "attention":
                continue          # the CUDA flash kernels may be 16-bit only: probed, not required
            assert ot_patch._run_probe(op, torch.device(device), dtype, extra), (op, dtype, extra)


def test_probe_failure_falls_back_and_is_logged(monkeypatch, caplog):
    # a library op that raises (as an op a backend lacks does) is probed once, logged,
    # and torch's code serves instead
    ot_patch._USABLE.clear()
    monkeypatch.setattr(ot_patch, "_run_probe", lambda *a: (_ for _ in ()).throw(
        ot.Error("ot_attention_forward: not implemented on cuda")))
    dev = torch.device("meta")
    with caplog.at_level(logging.WARNING, logger="ops_transformer"):
        assert not ot_patch._usable("attention", dev, torch.bfloat16, (64, 1, True, None))
        assert not ot_patch._usable("attention", dev, torch.bfloat16, (64, 1, True, None))
    msgs = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert len(msgs) == 1 and "not implemented" in msgs[0]
    ot_patch._USABLE.clear()


def test_persistent_kv_cache_routes_to_the_engine():
    try:
        from ops_transformer import engine
    except Exception:  # noqa: BLE001
        engine = None
    if getattr(engine, "READS_PERSISTENT_KV_CACHE", False):
        ot.config.persistent_kv_cache = True
        assert ot.config.persistent_kv_cache is True
    else:
        with pytest.raises(NotImplementedError, match="READS_PERSISTENT_KV_CACHE"):
            ot.config.persistent_kv_cache = True
    assert "persistent_kv_cache" in ot.config.describe()


def test_fused_attention_auto_routes_cuda_backward_to_torch():
    """'auto' (the default): the library's attention, except where autograd will
    differentiate it on CUDA (torch's SDPA there, measured faster while the library's
    CUDA attention backward is the portable kernel)."""
    from types import SimpleNamespace as NS
    assert ot.config.fused_attention == "auto"
    cuda = NS(device=torch.device("cuda"), requires_grad=True)
    cuda_nograd = NS(device=torch.device("cuda"), requires_grad=False)
    cpu = NS(device=torch.device("cpu"), requires_grad=True)
    assert ot_patch._auto_torch_backward(cuda, cuda)
    assert ot_patch._auto_torch_backward(cuda_nograd, cuda)      # k needs the backward
    assert not ot_patch._auto_torch_backward(cuda_nograd, cuda_nograd)
    assert not ot_patch._auto_torch_backward(cpu, cpu)             # the CPU backward is ours
    with torch.no_grad():
        assert not ot_patch._auto_torch_backward(cuda, cuda)       # inference: ours
    for explicit in (True, False):
        with ot.config.override(fused_attention=explicit):
            assert not ot_patch._auto_torch_backward(cuda, cuda)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_attention_auto_with_grad(device, monkeypatch):
    """A patched model in training under 'auto': the library's attention on the CPU,
    torch's SDPA on CUDA; the loss is the same either way."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      max_position_embeddings=128)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
    ids = torch.randint(0, 256, (2, 16), device=device)
    ref = model(ids, labels=ids).loss.float().item()
    ot.patch_llama(model)
    n = {"attention": 0}
    orig = ot.ops.attention

    def spy(*a, **k):
        n["attention"] += 1
        return orig(*a, **k)
    monkeypatch.setattr(ot.ops, "attention", spy)
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert abs(loss.float().item() - ref) <= (2e-2 if dtype == torch.bfloat16 else 1e-4) * abs(ref)
    assert n["attention"] == (0 if device == "cuda" else 2)
    ot.unpatch(model)
