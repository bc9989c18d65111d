"""Patch a Hugging Face transformers causal LM to run on ops_transformer's fused ops.

    >>> import ops_transformer as ot
    >>> ot.patch_model(model)        # LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM
    >>> loss = model(input_ids, labels=input_ids).loss
    >>> ot.unpatch(model)            # everything back as it was

What :func:`patch_model` replaces, on the given *instance* (or on every instance of a
given class constructed afterwards: ``patch_model(LlamaForCausalLM)``; parameters, buffers and
``state_dict`` are untouched; modules keep their identity; only ``forward`` attributes
of instances, the model's ``loss_function`` and ``config._attn_implementation`` change):

* every ``*RMSNorm`` module: ``forward`` becomes :func:`ops_transformer.rms_norm`
  (inputs whose dtype differs from the weight's keep HF's code, which promotes);
* every decoder layer: the residual add before ``post_attention_layernorm`` is fused
  into that norm (``rms_norm(x, w, residual=...)``);
* every attention module: q/k/v projections stay ``nn.Linear``; the rotary embedding
  is :func:`ops_transformer.rope` fed with HF's own cos/sin (as a ``cos_sin_cache``, so
  every HF rope type -- default, llama3, yarn, dynamic... -- is reproduced), and the
  attention is :func:`ops_transformer.attention` in [B, S, H, D] layout (no transposes,
  GQA without repeating k/v, causal, sliding window for Mistral / Qwen2). The
  attention function is also registered with transformers' attention and mask
  interfaces as ``"ops_transformer"`` and the model's ``config._attn_implementation``
  set to it: with a kv cache (generation, or HF's default ``use_cache`` in training) the
  patched forward updates the cache in HF's [B, H, S, D] layout and calls it, and it
  serves HF's own attention forward when ``rope=False``;
* every MLP with a SiLU activation: ``down(swiglu(gate(x), up(x)))``;
* the loss: ``model.loss_function`` becomes :func:`ops_transformer.cross_entropy` with
  HF's label shift, ``ignore_index=-100`` and ``num_items_in_batch``.

Falls back to HF's implementation (logged once per reason, logger
``"ops_transformer"``): padded batches (any materialized attention mask: the call
goes to transformers' SDPA attention with that mask),
attention dropout in training, a cache with a query/key length mismatch other than
one-token decode, mixed dtypes in a norm or an MLP. Packed batches (position ids
restarting inside a row, no attention mask, ``use_cache=False`` -- when HF itself
detects packing) run the library's varlen attention instead of HF's block-diagonal
mask, except under torch.compile (the split is data-dependent: HF's mask then).

Not done yet (issue 8): a fused linear + cross-entropy that never materializes the
logits does not exist in the library -- the lm_head still writes the full
[tokens, vocab] logits and only the loss itself is fused.
"""

from __future__ import annotations

import logging
import threading
import types

import torch
import torch.nn.functional as F

from . import ops as _ops

__all__ = ["patch_model", "patch_llama", "unpatch", "is_patched", "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "ops_transformer"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

logger = logging.getLogger("ops_transformer")
_LOGGED = set()


def _log_once(key, msg):
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.warning("ops_transformer: %s", msg)


class _TraceState:
    # Read and written only while torch.compile traces (dynamo models the writes; a
    # threading.local would break its guards): True while a patched base model traces
    # a call that needs no attention mask (no padding mask, no position ids, no cache).
    # The registered mask function then returns None where HF would materialize a
    # causal mask (its packed-sequence detection cannot read position ids while
    # tracing).
    trivial_mask = False


_TRACE = _TraceState()
# Eager calls, per thread: no_mask (the mask function returns None) and cu_seqlens
# (int32 [segments + 1] over the flattened [B * S] tokens of a packed batch: attention
# runs the library's varlen path instead of HF's block-diagonal SDPA mask).
_LOCAL = threading.local()


def _no_mask():
    if torch.compiler.is_compiling():
        return _TRACE.trivial_mask
    return getattr(_LOCAL, "no_mask", False)


def _cu_seqlens():
    if torch.compiler.is_compiling():
        return None
    return getattr(_LOCAL, "cu_seqlens", None)


def _packed_cu_seqlens(position_ids, batch):
    """cu_seqlens of the sequences packed in position_ids ([1 or B, S]) as HF's
    find_packed_sequence_indices splits them (a new sequence where the position does
    not increase by one), or None when no row holds more than one sequence."""
    pos = position_ids.expand(batch, -1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = torch.diff(pos, dim=-1) != 1
    if int(starts.sum()) == batch:
        return None
    idx = torch.nonzero(starts.reshape(-1)).reshape(-1)
    end = torch.tensor([pos.numel()], device=idx.device, dtype=idx.dtype)
    return torch.cat([idx, end]).to(torch.int32)


# ---------------------------------------------------------------------------------
# Replacement forwards
# ---------------------------------------------------------------------------------

def _rms_norm_forward(self, hidden_states):
    w = self.weight
    if hidden_states.dtype != w.dtype:
        _log_once("rms_dtype", f"{type(self).__name__}: input dtype {hidden_states.dtype} != "
                  f"weight dtype {w.dtype}: HF's RMSNorm used")
        return self._ot_orig_forward(hidden_states)
    return _ops.rms_norm(hidden_states, w, self.variance_epsilon)


def _add_rms_norm(x, residual, norm):
    """(norm(residual + x), residual + x), fused when the norm is patched."""
    w = getattr(norm, "weight", None)
    if (getattr(norm, "_ot_patched", False) and w is not None
            and x.dtype == residual.dtype == w.dtype and x.shape == residual.shape):
        return _ops.rms_norm(x, w, norm.variance_epsilon, residual=residual)
    h = residual + x
    return norm(h), h


def _decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None,
                           cache=None, use_cache=False, position_embeddings=None,
                           past_key_values=None, **kwargs):
    if cache is None:
        cache = past_key_values
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, cache=cache,
                                      use_cache=use_cache,
                                      position_embeddings=position_embeddings, **kwargs)
    hidden_states, residual = _add_rms_norm(hidden_states, residual,
                                            self.post_attention_layernorm)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states


def _mlp_forward(self, x):
    g, u = self.gate_proj(x), self.up_proj(x)
    if g.dtype != u.dtype:
        _log_once("mlp_dtype", f"{type(self).__name__}: gate/up dtypes differ: HF's MLP used")
        return self.down_proj(self.act_fn(g) * u)
    return self.down_proj(_ops.swiglu(g, u))


def _sliding_window(module):
    if hasattr(module, "sliding_window"):          # Qwen2: per layer type
        return module.sliding_window
    return getattr(module.config, "sliding_window", None)   # Mistral: config-wide


def _window(sliding_window):
    # HF: key j is seen by query i when i - sliding_window < j <= i.
    return None if not sliding_window else (int(sliding_window) - 1, 0)


def _rope_cache(cos, sin, B, S):
    """HF's cos / sin [Bc, S, D] (Bc = 1 or B) as ot.rope's cos_sin_cache + positions."""
    D = cos.shape[-1]
    half = D // 2
    cache = torch.cat([cos[..., :half], sin[..., :half]], dim=-1).to(torch.float32)
    cache = cache.reshape(-1, D)
    pos = torch.arange(cache.shape[0], device=cos.device)
    pos = pos.view(1, S).expand(B, S) if cos.shape[0] == 1 else pos.view(B, S)
    return cache, pos


def _attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                       cache=None, past_key_values=None, **kwargs):
    if cache is None:
        cache = past_key_values
    dropout = self.attention_dropout if self.training else 0.0
    fast = not dropout and position_embeddings is not None and hidden_states.dim() == 3
    if fast:
        cos, sin = position_embeddings
        B, S = hidden_states.shape[:2]
        fast = (cos.dim() == 3 and cos.shape[-1] == self.head_dim and cos.shape[1] == S
                and cos.shape[0] in (1, B))
    if not fast:
        if dropout:
            _log_once("attn_dropout", "attention dropout > 0: transformers' SDPA attention used")
        return self._ot_orig_forward(hidden_states, position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, cache=cache, **kwargs)
    D = self.head_dim
    q = self.q_proj(hidden_states).view(B, S, -1, D)
    k = self.k_proj(hidden_states).view(B, S, -1, D)
    v = self.v_proj(hidden_states).view(B, S, -1, D)
    cs, pos = _rope_cache(cos, sin, B, S)
    q, k = _ops.rope(q, k, pos, cos_sin_cache=cs)
    if cache is None and attention_mask is None:
        # [B, S, H, D] throughout: no transposes, no repeated k/v heads
        cu = _cu_seqlens()
        if cu is not None:           # packed sequences: [B * S, H, D] varlen
            q, k, v = q.reshape(B * S, -1, D), k.reshape(B * S, -1, D), v.reshape(B * S, -1, D)
        o = _ops.attention(q, k, v, causal=getattr(self, "is_causal", True),
                           softmax_scale=self.scaling, window=_window(_sliding_window(self)),
                           cu_seqlens_q=cu, cu_seqlens_k=cu)
    else:
        # HF's cache layout is [B, H, S, D]; the interface function takes it as views
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        o, _ = ot_attention_forward(self, q.transpose(1, 2), k, v, attention_mask,
                                    scaling=self.scaling, sliding_window=_sliding_window(self))
    return self.o_proj(o.reshape(B, S, -1)), None


def _base_model_forward(self, *args, **kwargs):
    no_cache = kwargs.get("cache") is None and kwargs.get("past_key_values") is None
    plain = len(args) <= 1 and kwargs.get("attention_mask") is None and no_cache
    cu = None
    if plain and kwargs.get("position_ids") is not None:
        use_cache = kwargs.get("use_cache")
        if use_cache is None:
            use_cache = getattr(self.config, "use_cache", False)
        # HF looks for packed sequences only without a cache (it creates one when
        # use_cache); under torch.compile the split is data-dependent: HF's mask then.
        if use_cache or torch.compiler.is_compiling():
            plain = False
        else:
            ref = args[0] if args else kwargs.get("input_ids")
            if ref is None:
                ref = kwargs.get("inputs_embeds")
            cu = _packed_cu_seqlens(kwargs["position_ids"], ref.shape[0])
    if not plain:
        return self._ot_orig_forward(*args, **kwargs)
    if torch.compiler.is_compiling():
        prev = _TRACE.trivial_mask
        _TRACE.trivial_mask = True
        try:
            return self._ot_orig_forward(*args, **kwargs)
        finally:
            _TRACE.trivial_mask = prev
    prev = getattr(_LOCAL, "no_mask", False), getattr(_LOCAL, "cu_seqlens", None)
    _LOCAL.no_mask, _LOCAL.cu_seqlens = True, cu
    try:
        return self._ot_orig_forward(*args, **kwargs)
    finally:
        _LOCAL.no_mask, _LOCAL.cu_seqlens = prev


# ---------------------------------------------------------------------------------
# transformers' attention and mask interfaces
# ---------------------------------------------------------------------------------

def ot_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                         sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers attention-interface function (q/k/v [B, H, S, D]; returns
    ([B, S, H, D], None)). ops_transformer.attention when no mask is materialized;
    transformers' SDPA attention otherwise (logged once)."""
    Sq, Sk = query.shape[2], key.shape[2]
    reason = None
    if attention_mask is not None:
        reason = "a materialized attention mask (padding or packed sequences)"
    elif dropout:
        reason = "attention dropout > 0"
    elif Sq != Sk and Sq != 1:
        reason = f"query length {Sq} != key length {Sk} (not a one-token decode)"
    elif query.shape[-1] != value.shape[-1]:
        reason = "value head dim differs from the query's"
    if reason is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if sliding_window is None and hasattr(module, "config"):
            sliding_window = _sliding_window(module)
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        cu = _cu_seqlens()
        if cu is not None and Sq == Sk and q.shape[0] * Sq == int(cu[-1]):
            B = q.shape[0]
            q, k, v = (t.reshape(B * Sq, t.shape[2], t.shape[3]) for t in (q, k, v))
        else:
            cu = None
        o = _ops.attention(q, k, v, causal=bool(causal), softmax_scale=scaling,
                           window=_window(sliding_window), softcap=float(softcap or 0.0),
                           cu_seqlens_q=cu, cu_seqlens_k=cu)
        if cu is not None:
            o = o.view(query.shape[0], Sq, o.shape[1], o.shape[2])
        return o, None
    _log_once("attn_fallback:" + reason.split(" ")[0],
              f"attention with {reason}: transformers' SDPA attention used")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


def ot_attention_mask(*args, **kwargs):
    """transformers mask-interface function: None when the patched model knows no mask
    is needed, otherwise transformers' SDPA mask (None where it can skip it)."""
    if _no_mask():
        return None
    from transformers.masking_utils import sdpa_mask
    return sdpa_mask(*args, **kwargs)


_REGISTERED = False


def _register():
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(ATTN_IMPLEMENTATION, ot_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, ot_attention_mask)
    _REGISTERED = True


# ---------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------

def ot_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                      shift_labels=None, **kwargs):
    """HF's ForCausalLMLoss on ops_transformer.cross_entropy: labels shifted left by one
    (the last position ignored), mean over non-ignored tokens, or the sum divided by
    ``num_items_in_batch`` when given. The logits stay in their dtype (the library
    accumulates in float32), so no float32 copy of the logits is made."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    logits = logits.reshape(-1, vocab_size)
    shift_labels = shift_labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return _ops.cross_entropy(logits, shift_labels, ignore_index=ignore_index)
    loss = _ops.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


# ---------------------------------------------------------------------------------
# patch / unpatch
# ---------------------------------------------------------------------------------

_MISSING = object()


def _set_forward(module, fn, log):
    old = module.__dict__.get("forward", _MISSING)
    module._ot_orig_forward = module.forward           # bound method (class or instance)
    module.forward = types.MethodType(fn, module)
    module._ot_patched = True
    log.append(("forward", module, old))


def _kind(m):
    name = type(m).__name__
    if name.endswith("RMSNorm") and hasattr(m, "weight") and hasattr(m, "variance_epsilon"):
        return "norm"
    if (name.endswith("Attention") and all(hasattr(m, a) for a in
                                           ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim",
                                            "scaling"))):
        return "attn"
    if name.endswith("MLP") and all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj")):
        return "mlp"
    if name.endswith("DecoderLayer") and all(hasattr(m, a) for a in
                                             ("input_layernorm", "post_attention_layernorm",
                                              "self_attn", "mlp")):
        return "layer"
    if hasattr(m, "layers") and hasattr(m, "rotary_emb") and hasattr(m, "embed_tokens"):
        return "base"
    return None


def is_patched(model):
    return getattr(model, "_ot_patch_log", None) is not None


def patch_model(model, *, rms_norm=True, fuse_residual=True, attention=True, rope=True,
                swiglu=True, loss=True):
    """Route a HF ``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen2ForCausalLM``
    (or their base ``*Model``) through ops_transformer's ops, in place; returns the
    model. Given the class instead (``patch_model(LlamaForCausalLM)``, before
    construction), every instance of exactly that class constructed afterwards --
    ``from_pretrained`` included -- is patched at the end of its ``__init__``. Each keyword turns one replacement off (``rope=False`` keeps HF's rotary
    code and its own attention interface call; ``attention=False`` keeps HF's attention
    entirely). See the module docstring for what is replaced and when HF's code still
    runs. :func:`unpatch` restores the model exactly.

    Fused linear + cross-entropy (the loss without materializing the logits) is not in
    the library yet: the logits are still computed by the lm_head; only the loss is
    ops_transformer's.
    """
    if isinstance(model, type):
        return _patch_class(model, dict(rms_norm=rms_norm, fuse_residual=fuse_residual,
                                        attention=attention, rope=rope, swiglu=swiglu,
                                        loss=loss))
    if is_patched(model):
        raise RuntimeError("ops_transformer.patch_model: the model is already patched "
                           "(ops_transformer.unpatch first)")
    config = getattr(model, "config", None)
    mtype = getattr(config, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(f"ops_transformer.patch_model: model_type {mtype!r} is not "
                                  f"supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    log = []
    if attention:
        _register()
        log.append(("attn_impl", config, config._attn_implementation))
        config._attn_implementation = ATTN_IMPLEMENTATION
    silu = getattr(config, "hidden_act", None) in ("silu", "swish")
    for m in model.modules():
        kind = _kind(m)
        if kind == "norm" and rms_norm:
            _set_forward(m, _rms_norm_forward, log)
        elif kind == "layer" and fuse_residual and rms_norm:
            _set_forward(m, _decoder_layer_forward, log)
        elif kind == "attn" and attention and rope:
            _set_forward(m, _attention_forward, log)
        elif kind == "mlp" and swiglu and silu:
            _set_forward(m, _mlp_forward, log)
        elif kind == "base" and attention:
            _set_forward(m, _base_model_forward, log)
    if loss and hasattr(model, "lm_head"):
        log.append(("loss", model, model.__dict__.get("_loss_function", _MISSING)))
        model.loss_function = ot_causal_lm_loss
    model._ot_patch_log = log
    return model


def _patch_class(cls, options):
    """Patch every instance of cls constructed from now on (at the end of its
    __init__, so from_pretrained's instances too); unpatch(cls) stops it."""
    if "_ot_class_patch" in cls.__dict__:
        raise RuntimeError(f"ops_transformer.patch_model: {cls.__name__} is already patched "
                           "(ops_transformer.unpatch first)")
    config_cls = getattr(cls, "config_class", None)
    mtype = getattr(config_cls, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(f"ops_transformer.patch_model: {cls.__name__}: model_type "
                                  f"{mtype!r} is not supported (supported: "
                                  f"{', '.join(SUPPORTED_MODEL_TYPES)})")
    own_init = cls.__dict__.get("__init__", _MISSING)
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if type(self) is cls and not is_patched(self):
            patch_model(self, **options)

    __init__.__wrapped__ = init
    cls.__init__ = __init__
    cls._ot_class_patch = own_init
    return cls


def _unpatch_class(cls):
    if "_ot_class_patch" not in cls.__dict__:
        raise RuntimeError(f"ops_transformer.unpatch: {cls.__name__} is not patched")
    own_init = cls.__dict__["_ot_class_patch"]
    if own_init is _MISSING:
        del cls.__init__
    else:
        cls.__init__ = own_init
    del cls._ot_class_patch
    return cls


def patch_llama(model, **kwargs):
    """:func:`patch_model` for Llama-family models (Llama, Mistral, Qwen2)."""
    return patch_model(model, **kwargs)


def unpatch(model):
    """Undo :func:`patch_model`: instance forwards, loss function and attention
    implementation back to what they were. Returns the model. For a class: instances
    constructed afterwards are no longer patched (existing ones stay as they are)."""
    if isinstance(model, type):
        return _unpatch_class(model)
    log = getattr(model, "_ot_patch_log", None)
    if log is None:
        raise RuntimeError("ops_transformer.unpatch: the model is not patched")
    for what, obj, old in reversed(log):
        if what == "forward":
            del obj.forward
            if old is not _MISSING:
                obj.forward = old
            del obj._ot_orig_forward
            del obj._ot_patched
        elif what == "attn_impl":
            obj._attn_implementation = old
        elif what == "loss":
            if old is _MISSING:
                del obj._loss_function
            else:
                obj._loss_function = old
    del model._ot_patch_log
    return model
