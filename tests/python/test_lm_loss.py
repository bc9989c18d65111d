"""The fused LM-head loss of the patched causal LM (ops_transformer.patch.lm_head_loss):
the logits are never materialized, the loss and gradients are HF's (label shift,
ignore_index -100, mean or sum / num_items_in_batch). On the CPU, and on CUDA when the
package has the CUDA backend and a GPU is present."""

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from ops_transformer import patch as ot_patch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and ot.has_cuda() else [])
B, S, V = 2, 16, 256


def reference(hidden, weight, labels, ignore_index=-100, num_items=None, shift=None):
    """HF's ForCausalLMLoss on float32 logits."""
    logits = (hidden @ weight.t()).float()
    if shift is None:
        shift = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    red = "mean" if num_items is None else "sum"
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), shift.reshape(-1),
                           ignore_index=ignore_index, reduction=red)
    return loss if num_items is None else loss / num_items


def inputs(device, dtype, T=(3, 11), H=24, Vv=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*T, H, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(Vv, H, generator=g) * 0.3).to(device=device, dtype=dtype)
    lab = torch.randint(0, Vv, T, generator=g).to(device)
    lab[0, :4] = -100
    lab[2, -1] = -100
    return h.requires_grad_(), w.requires_grad_(), lab


TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("chunk", [None, 1, 5, 32])
@pytest.mark.parametrize("mode", ["mean", "num_items_int", "num_items_tensor", "shift"])
def test_chunked_matches_linear_plus_cross_entropy(device, dtype, chunk, mode):
    h, w, lab = inputs(device, dtype)
    kw, rkw = {}, {}
    if mode == "num_items_int":
        kw["num_items_in_batch"] = rkw["num_items"] = 13
    elif mode == "num_items_tensor":
        kw["num_items_in_batch"] = rkw["num_items"] = torch.tensor(13, device=device)
    elif mode == "shift":
        shift = lab.clone()              # labels already aligned with the positions
        kw["shift_labels"] = rkw["shift"] = shift
    loss = ot_patch.lm_head_loss(h, w, lab, chunk_rows=chunk, impl="chunked", **kw)
    # an upstream gradient other than 1 (a power of two: exact in any dtype)
    (loss * 4).backward()
    h2, w2 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = reference(h2, w2, lab, **rkw)
    (ref * 4).backward()
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss, ref, **TOL[dtype])
    torch.testing.assert_close(h.grad.float(), h2.grad, **TOL[dtype])
    torch.testing.assert_close(w.grad.float(), w2.grad, **TOL[dtype])
    assert h.grad.dtype == dtype and w.grad.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_grad_only_where_needed_and_no_grad(device):
    h, w, lab = inputs(device, torch.float32)
    w.requires_grad_(False)
    loss = ot_patch.lm_head_loss(h, w, lab, chunk_rows=4, impl="chunked")
    loss.backward()
    assert w.grad is None and h.grad is not None
    with torch.no_grad():
        l2 = ot_patch.lm_head_loss(h, w, lab, chunk_rows=4, impl="chunked")
    assert not l2.requires_grad
    torch.testing.assert_close(l2, loss.detach())
    torch.testing.assert_close(l2, reference(h.detach(), w, lab), rtol=2e-5, atol=2e-5)


def test_bad_impl():
    h, w, lab = inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="impl"):
        ot_patch.lm_head_loss(h, w, lab, impl="nope")
    with pytest.raises(ValueError, match="lm_loss_impl"):
        ot.patch_model(tiny(), lm_loss_impl="nope")


@pytest.mark.skipif(not hasattr(ot, "linear_cross_entropy"),
                    reason="ops_transformer.linear_cross_entropy is not in this build")
@pytest.mark.parametrize("device", DEVICES)
def test_library_impl_matches(device):
    h, w, lab = inputs(device, torch.float32)
    assert ot_patch._library_lce_usable(torch.device(device))
    loss = ot_patch.lm_head_loss(h, w, lab, impl="library", num_items_in_batch=13)
    loss.backward()
    h2, w2 = h.detach().requires_grad_(), w.detach().requires_grad_()
    ref = reference(h2, w2, lab, num_items=13)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(h.grad, h2.grad, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(w.grad, w2.grad, rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------------
# In the patched model
# ---------------------------------------------------------------------------------

def tiny(device="cpu", dtype=torch.float32, **overrides):
    torch.manual_seed(0)
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
               max_position_embeddings=128)
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg)).to(device=device, dtype=dtype)


def run(model, ids, **kw):
    model.zero_grad(set_to_none=True)
    out = model(ids, **kw)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def assert_grads_close(g0, g1, rtol=1e-5):
    assert g0.keys() == g1.keys()
    for n in g0:
        scale = g0[n].abs().max().item()
        err = (g0[n].float() - g1[n].float()).abs().max().item()
        assert err <= rtol * max(scale, 1e-6) + 1e-7, f"{n}: max err {err}, max |g| {scale}"


@pytest.fixture
def ids():
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("kw", [{}, {"num_items_in_batch": 23}, {"ignore": True}],
                         ids=["mean", "num_items", "ignored"])
def test_patched_fused_loss_matches_hf(device, tied, kw, ids):
    kw = dict(kw)
    ids = ids.to(device)
    labels = ids.clone()
    if kw.pop("ignore", False):
        labels[0, :5] = -100
    model = tiny(device, tie_word_embeddings=tied)
    model.train()
    out0, g0 = run(model, ids, labels=labels, use_cache=False, **kw)
    ot.patch_model(model, lm_loss_impl="chunked")
    calls = []
    orig = ot_patch.lm_head_loss
    ot_patch.lm_head_loss = lambda *a, **k: calls.append(1) or orig(*a, **k)
    try:
        out1, g1 = run(model, ids, labels=labels, use_cache=False, **kw)
    finally:
        ot_patch.lm_head_loss = orig
    assert calls == [1]
    assert out1.logits is None and out0.logits is not None     # never materialized
    assert "logits" not in out1.keys() and out1[0] is out1.loss
    torch.testing.assert_close(out1.loss, out0.loss, rtol=1e-5, atol=1e-6)
    assert_grads_close(g0, g1, rtol=2e-5)
    # logits on request (skip_logits=False) and in eval mode: HF's forward, the
    # (unfused) library cross-entropy
    out2, g2 = run(model, ids, labels=labels, use_cache=False, skip_logits=False, **kw)
    torch.testing.assert_close(out2.logits, out0.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2.loss, out0.loss, rtol=1e-5, atol=1e-6)
    model.eval()
    with torch.no_grad():
        out3 = model(ids, labels=labels, **kw)
    assert out3.logits is not None
    torch.testing.assert_close(out3.loss, out0.loss, rtol=1e-5, atol=1e-6)
    ot.unpatch(model)
    assert "forward" not in model.__dict__ and "forward" not in model.lm_head.__dict__
    assert "_ot_lm_loss_impl" not in model.__dict__


def test_fused_loss_fallbacks_are_logged(ids, caplog):
    import logging
    model = tiny()
    model.train()
    with torch.no_grad():
        ref = model(ids, labels=ids, use_cache=False).loss
    ot.patch_model(model)
    ot_patch._LOGGED.clear()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ops_transformer"):
        out = model(ids, labels=ids, use_cache=False, logits_to_keep=S)
        tup = model(ids, labels=ids, use_cache=False, return_dict=False)
    assert out.logits is not None and out.logits.shape == (B, S, V)
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tup[0], ref, rtol=1e-5, atol=1e-6)
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert "logits_to_keep" in msgs and "return_dict=False" in msgs


def test_fused_loss_compiles_fullgraph(ids):
    # The whole patched training forward (fused loss included) is one graph.
    torch._dynamo.reset()
    model = tiny()
    model.train()
    out0, g0 = run(model, ids, labels=ids, use_cache=False)
    ot.patch_model(model, lm_loss_impl="chunked")
    explanation = torch._dynamo.explain(model)(ids, labels=ids, use_cache=False)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    model.zero_grad(set_to_none=True)
    out1 = compiled(ids, labels=ids, use_cache=False)
    out1.loss.backward()
    assert out1.logits is None
    torch.testing.assert_close(out1.loss, out0.loss, rtol=1e-5, atol=1e-6)
    assert_grads_close(g0, {n: p.grad for n, p in model.named_parameters()}, rtol=1e-4)


def test_fused_loss_with_gradient_checkpointing(ids):
    model = tiny()
    model.train()
    out0, g0 = run(model, ids, labels=ids, use_cache=False)
    (getattr(model, "activation_checkpointing_enable", None)
     or model.gradient_checkpointing_enable)()
    ot.patch_model(model)
    out1, g1 = run(model, ids, labels=ids, use_cache=False)
    assert out1.logits is None
    torch.testing.assert_close(out1.loss, out0.loss, rtol=1e-5, atol=1e-6)
    assert_grads_close(g0, g1, rtol=2e-5)


def test_patched_training_saves_less_and_no_logits():
    # What autograd keeps for the backward (activations: parameters excluded), counted by
    # storage: the patched model keeps less than half of HF's here (no [tokens, vocab]
    # logits, RMSNorm without float32 intermediates, the MLP's swiglu output recomputed
    # in the backward), and no tensor as large as the logits.
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=4096,
                      max_position_embeddings=512)
    model = LlamaForCausalLM(cfg)
    model.train()
    ids = torch.randint(0, 4096, (2, 256), generator=torch.Generator().manual_seed(1))

    def saved(model):
        params = {p.data_ptr() for p in model.parameters()}
        storages = {}

        def pack(t):
            if t.numel() and t.data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        model.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return storages, loss.detach()

    hf, loss0 = saved(model)
    ot.patch_model(model)
    ours, loss1 = saved(model)
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    logits_bytes = ids.numel() * cfg.vocab_size * 4
    assert max(hf.values()) >= logits_bytes            # HF keeps the logits
    assert max(ours.values()) < logits_bytes / 2       # (the largest: dweight, V x H)
    assert sum(ours.values()) < 0.6 * sum(hf.values()), (sum(ours.values()), sum(hf.values()))
