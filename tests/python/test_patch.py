"""ops_transformer.patch_model / unpatch on a small random HF LlamaForCausalLM (CPU,
float32), and the custom_op(replace=...) SDPA replacement."""

import logging

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ops_transformer import patch as ot_patch  # noqa: E402

B, S, V = 2, 16, 256


def tiny_llama(**overrides):
    torch.manual_seed(0)
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
               max_position_embeddings=128, rope_theta=10000.0)
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg)).float()


def loss_and_grads(model, ids, call=None, **kw):
    """Loss, logits and parameter gradients of model(ids, labels=ids); `call` (a
    compiled wrapper of model, say) runs the forward when given."""
    model.zero_grad(set_to_none=True)
    out = (model if call is None else call)(ids, labels=ids, **kw)
    out.loss.backward()
    return (out.loss.detach(), out.logits.detach(),
            {n: p.grad.detach().clone() for n, p in model.named_parameters()})


@pytest.fixture
def ids():
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of the ops the patch routes to (looked up at call time)."""
    counts = {}
    for name in ("rms_norm", "rope", "attention", "swiglu", "cross_entropy"):
        orig = getattr(ot.ops, name)

        def spy(*a, _orig=orig, _name=name, **k):
            counts[_name] = counts.get(_name, 0) + 1
            return _orig(*a, **k)
        monkeypatch.setattr(ot.ops, name, spy)
    return counts


def assert_grads_close(g_ref, g, rtol=1e-5):
    assert g_ref.keys() == g.keys()
    for n in g_ref:
        scale = g_ref[n].abs().max().item()
        err = (g_ref[n] - g[n]).abs().max().item()
        assert err <= rtol * max(scale, 1e-6) + 1e-7, f"{n}: max err {err}, max |g| {scale}"


def test_patched_matches_hf_loss_and_grads(ids, calls):
    model = tiny_llama()
    loss0, logits0, g0 = loss_and_grads(model, ids)
    ot.patch_llama(model)
    assert ot_patch.is_patched(model)
    loss1, logits1, g1 = loss_and_grads(model, ids)
    # every replacement ran (2 layers: 5 norms, 2 attentions, 2 MLPs, one loss)
    assert calls == {"rms_norm": 5, "rope": 2, "attention": 2, "swiglu": 2,
                     "cross_entropy": 1}, calls
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=0)
    torch.testing.assert_close(logits1, logits0, rtol=1e-5, atol=1e-5)
    assert_grads_close(g0, g1)


def test_unpatch_restores_bitwise(ids):
    model = tiny_llama()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    cls_forwards = {id(m): type(m).forward for m in model.modules()}
    loss0, logits0, g0 = loss_and_grads(model, ids)
    ot.patch_model(model)
    assert model.config._attn_implementation == "ops_transformer"
    assert model.state_dict().keys() == sd.keys()
    loss_and_grads(model, ids)
    ot.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    assert "_loss_function" not in model.__dict__
    for m in model.modules():
        assert "forward" not in m.__dict__ and type(m).forward is cls_forwards[id(m)]
        assert not hasattr(m, "_ot_orig_forward")
    loss2, logits2, g2 = loss_and_grads(model, ids)
    assert torch.equal(loss2, loss0) and torch.equal(logits2, logits0)
    for n in g0:
        assert torch.equal(g0[n], g2[n]), n
    with pytest.raises(RuntimeError):
        ot.unpatch(model)


def test_patch_twice_and_unsupported_model():
    model = tiny_llama()
    ot.patch_model(model)
    with pytest.raises(RuntimeError, match="already patched"):
        ot.patch_model(model)
    ot.unpatch(model)
    with pytest.raises(NotImplementedError, match="model_type"):
        ot.patch_model(torch.nn.Linear(2, 2))


def test_padded_batch_falls_back_logged_once(ids, caplog, calls):
    model = tiny_llama()
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, :5] = 0                       # left padding in the second row
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
        ref_ones = model(ids, attention_mask=torch.ones_like(mask)).logits
    ot.patch_model(model)
    ot_patch._LOGGED.clear()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ops_transformer"):
        out = model(ids, attention_mask=mask).logits
        out = model(ids, attention_mask=mask).logits
    msgs = [r.getMessage() for r in caplog.records if "materialized attention mask" in
            r.getMessage()]
    assert len(msgs) == 1, msgs           # logged once over 2 calls x 2 layers
    assert calls.get("attention", 0) == 0
    keep = mask.bool()
    torch.testing.assert_close(out[keep], ref[keep], rtol=1e-5, atol=1e-5)
    # an all-ones mask needs no mask: the library's attention runs
    with torch.no_grad():
        out_ones = model(ids, attention_mask=torch.ones_like(mask)).logits
    assert calls["attention"] == 2
    torch.testing.assert_close(out_ones, ref_ones, rtol=1e-5, atol=1e-5)


def test_generate_with_kv_cache_matches(ids):
    model = tiny_llama()
    ref = model.generate(ids[:1, :8], max_new_tokens=6, do_sample=False)
    ot.patch_model(model)
    out = model.generate(ids[:1, :8], max_new_tokens=6, do_sample=False)
    assert torch.equal(out, ref)


def test_loss_num_items_and_ignore_index(ids):
    model = tiny_llama()
    labels = ids.clone()
    labels[0, :4] = -100
    with torch.no_grad():
        ref = model(ids, labels=labels, num_items_in_batch=torch.tensor(20)).loss
        ref_mean = model(ids, labels=labels).loss
        ot.patch_model(model)
        out = model(ids, labels=labels, num_items_in_batch=torch.tensor(20)).loss
        out_mean = model(ids, labels=labels).loss
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(out_mean, ref_mean, rtol=1e-5, atol=0)


def test_sliding_window_qwen2_style(ids):
    # Mistral with a sliding window shorter than the sequence: the window is applied by
    # the library's attention (the patch returns no mask), matching HF's masked SDPA.
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=V, max_position_embeddings=128,
        sliding_window=5)).float()
    loss0, logits0, g0 = loss_and_grads(model, ids)
    ot.patch_model(model)
    loss1, logits1, g1 = loss_and_grads(model, ids)
    torch.testing.assert_close(logits1, logits0, rtol=1e-5, atol=1e-5)
    assert_grads_close(g0, g1)


def test_torch_compile_patched_model(ids, calls):
    torch._dynamo.reset()
    model = tiny_llama(num_hidden_layers=1)
    loss0, _, g0 = loss_and_grads(model, ids)
    ot.patch_model(model)
    compiled = torch.compile(model, fullgraph=False)
    loss1, _, g1 = loss_and_grads(model, ids, call=compiled)
    assert calls.get("attention", 0) >= 1          # traced through the library's op
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=0)
    assert_grads_close(g0, g1, rtol=1e-4)


def test_patched_model_has_no_graph_breaks(ids):
    torch._dynamo.reset()
    model = tiny_llama()
    ot.patch_model(model)
    explanation = torch._dynamo.explain(model)(ids, labels=ids)
    assert explanation.graph_break_count == 0, explanation.break_reasons
