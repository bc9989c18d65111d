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
* every attention module: q/k/v projections stay ``nn.Linear`` modules (in training, plain
  ones without hooks are computed from their weights by one autograd Function,
  :class:`_Projections`, whose backward sums the input gradient inside the GEMMs --
  likewise gate / up); the rotary embedding
  is :func:`ops_transformer.rope` fed with HF's own cos/sin (as a ``cos_sin_cache``, so
  every HF rope type -- default, llama3, yarn, dynamic... -- is reproduced), and the
  attention is :func:`ops_transformer.attention` in [B, S, H, D] layout (no transposes,
  GQA without repeating k/v, causal, sliding window for Mistral / Qwen2) -- in training
  on CUDA only where it is faster than torch's SDPA for the shape
  (``config.fused_attention="auto"``: :func:`_auto_library`). The
  attention function is also registered with transformers' attention and mask
  interfaces as ``"ops_transformer"`` and the model's ``config._attn_implementation``
  set to it: with a kv cache (generation, or HF's default ``use_cache`` in training) the
  patched forward updates the cache in HF's [B, H, S, D] layout and calls it, and it
  serves HF's own attention forward when ``rope=False``;
* every MLP with a SiLU activation: ``down(swiglu(gate(x), up(x)))``;
* the LM head + loss, in training with labels (``model.training`` and ``labels`` given,
  or ``skip_logits=True`` in the call; ``skip_logits=False`` keeps the logits): the
  model's and the ``lm_head``'s ``forward`` are patched so that HF's forward runs
  without labels, the lm_head hands its input over instead of computing logits, and
  the loss is :func:`lm_head_loss` -- a fused linear + cross-entropy that never
  materializes the [tokens, vocab] logits (the library's
  ``ops_transformer.linear_cross_entropy`` where this build has it and it runs on the
  device, otherwise chunks of tokens through torch's GEMM and the library's
  cross-entropy kernels, the gradients computed in the forward), with HF's label
  shift, ``ignore_index=-100``, ``shift_labels`` and ``num_items_in_batch``. The output
  then has ``loss`` and no ``logits`` (as Liger-Kernel's). Not fused (logged once):
  ``logits_to_keep``, ``return_dict=False``, an lm_head with a bias, autocast;
* the loss otherwise (eval, or logits requested): ``model.loss_function`` becomes
  :func:`ops_transformer.cross_entropy` with HF's label shift, ``ignore_index=-100``
  and ``num_items_in_batch``.

Falls back to HF's implementation (logged once per reason, logger
``"ops_transformer"``): padded batches (any materialized attention mask: the call
goes to transformers' SDPA attention with that mask),
attention dropout in training, a cache with a query/key length mismatch other than
one-token decode, mixed dtypes in a norm or an MLP. Packed batches (position ids
restarting inside a row, no attention mask, ``use_cache=False`` -- when HF itself
detects packing) run the library's varlen attention instead of HF's block-diagonal
mask, except under torch.compile (the split is data-dependent: HF's mask then).
In the eager calls that need no mask, transformers' packed-sequence check
(``masking_utils.find_packed_sequence_indices``, a host read of a device value: a
synchronization per forward on CUDA) is skipped -- its answer is unused there; the
function is wrapped once, at the first patch, and unchanged elsewhere.
"""

from __future__ import annotations

import os
import threading
import types

import torch
import torch.nn.attention  # noqa: F401  (current_flash_attention_impl, where torch has it)
import torch.nn.functional as F
from torch.nn.modules import module as _nn_module  # the global module hooks (_plain_linear)

from . import _torch_ops as _tops
from . import ops as _ops
from .config import config as _config
from .replace import _LOGGED, _log_once  # noqa: F401  (one logged-once set for the package)

__all__ = ["patch_model", "patch_llama", "unpatch", "is_patched", "lm_head_loss",
           "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "ops_transformer"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")



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
# Which library ops run on a device (probed once per device type / dtype / shape kind)
# ---------------------------------------------------------------------------------

# (op, device type, dtype, extra) -> bool. A build's CUDA backend may lack an op (or a
# dtype / head dim of it): the patched layers then keep torch's code for that op (logged
# once) instead of failing. Probed eagerly on tiny inputs against torch (forward and
# backward); while torch.compile traces, an op not probed yet counts as usable.
_USABLE = {}


def _close(a, b, tol):
    a, b = a.detach().float(), b.detach().float()
    return bool(torch.isfinite(a).all()) and \
        float((a - b).abs().max()) <= tol * max(float(b.abs().max()), 1e-3)


def _probe_tensors(device, dtype, *shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(device=device, dtype=dtype).requires_grad_(True)
            for s in shapes]


def _fwd_bwd(fn, xs):
    out = fn(*xs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    g = torch.Generator().manual_seed(7)
    loss = sum((o.float() * torch.randn(o.shape, generator=g).to(o.device)).sum() for o in outs)
    grads = torch.autograd.grad(loss, xs)
    return list(outs) + list(grads)


def _probe(name, device, dtype, extra, ours, ref, shapes):
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    xs = _probe_tensors(device, dtype, *shapes)
    got = _fwd_bwd(ours, xs)
    want = _fwd_bwd(ref, [x.detach().float().requires_grad_(True) for x in xs])
    return all(_close(a, b, tol) for a, b in zip(got, want))


def _ref_rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _ref_rope(q, k, pos, cache):
    half = q.shape[-1] // 2
    cos, sin = cache[pos, :half].unsqueeze(-2), cache[pos, half:].unsqueeze(-2)

    def rot(t):
        t1, t2 = t[..., :half], t[..., half:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)
    return rot(q), rot(k)


def _ref_attention(q, k, v, causal, scale, window):
    """[B, S, H, D] attention in float32 with torch (bottom-right causal alignment)."""
    Hq, Hk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(Hq // Hk, dim=2)
    v = v.repeat_interleave(Hq // Hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    Sq, Sk = q.shape[1], k.shape[1]
    i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=q.device)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= (j >= i - window[0]) & (j <= i + window[1])
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.float())


def _usable(op, device, dtype, extra=()):
    key = (op, device.type, dtype, extra)
    ok = _USABLE.get(key)
    if ok is not None:
        return ok
    if torch.compiler.is_compiling():
        return True
    if device.type == "cpu":
        ok = True                                 # the CPU backend has every op
    else:
        ok = False
        try:
            ok = _run_probe(op, device, dtype, extra)
            if not ok:
                _log_once("probe:" + repr(key), f"ops_transformer.{op} ({device.type}, "
                          f"{dtype}, {extra}) disagrees with torch on a small input: "
                          "torch's code is used for it")
        except Exception as e:  # noqa: BLE001  (not implemented on this backend / dtype)
            _log_once("probe:" + repr(key), f"ops_transformer.{op} unusable on "
                      f"{device.type} ({dtype}, {extra}): {type(e).__name__}: "
                      f"{str(e)[:200]}: torch's code is used for it")
    _USABLE[key] = ok
    return ok


def _run_probe(op, device, dtype, extra):
    with torch.enable_grad():
        if op == "rms_norm":
            return _probe(op, device, dtype, extra,
                          lambda x, w: _ops.rms_norm(x, w, 1e-6), _ref_rms, [(37, 72), (72,)])
        if op == "rms_norm_residual":
            return _probe(op, device, dtype, extra,
                          lambda x, r, w: _ops.rms_norm(x, w, 1e-6, residual=r),
                          lambda x, r, w: (_ref_rms(x + r, w), x + r),
                          [(37, 72), (37, 72), (72,)])
        if op == "swiglu":
            return _probe(op, device, dtype, extra, _ops.swiglu,
                          lambda g, u: F.silu(g) * u, [(37, 72), (37, 72)])
        if op == "rope":
            D = extra[0]
            cache = torch.cat([torch.cos(torch.arange(40.)[:, None] * torch.rand(D // 2)),
                               torch.sin(torch.arange(40.)[:, None] * torch.rand(D // 2))],
                              -1).to(device)
            pos = torch.arange(37, device=device).view(1, 37)
            return _probe(op, device, dtype, extra,
                          lambda q, k: _ops.rope(q, k, pos, cos_sin_cache=cache),
                          lambda q, k: _ref_rope(q, k, pos, cache),
                          [(1, 37, 4, D), (1, 37, 2, D)])
        if op == "cross_entropy":
            lab = torch.randint(0, 300, (37,), generator=torch.Generator().manual_seed(3))
            lab[5] = -100
            lab = lab.to(device)
            return _probe(op, device, dtype, extra,
                          lambda x: _ops.cross_entropy(x, lab),
                          lambda x: F.cross_entropy(x.float(), lab), [(37, 300)])
        if op == "attention":
            D, ratio, causal, window = extra
            scale = D ** -0.5
            return _probe(op, device, dtype, extra,
                          lambda q, k, v: _ops.attention(q, k, v, causal=causal,
                                                         softmax_scale=scale, window=window),
                          lambda q, k, v: _ref_attention(q, k, v, causal, scale, window),
                          [(2, 77, 2 * ratio, D), (2, 77, 2, D), (2, 77, 2, D)])
    raise ValueError(op)


def _fused_attention():
    return _config.fused_attention


def _auto_torch_backward(q, k):
    """fused_attention='auto' and autograd will differentiate this CUDA attention: the
    call goes to torch's SDPA unless :func:`_auto_library` finds the library's kernels
    faster for it."""
    return (_config.fused_attention == "auto" and q.device.type == "cuda"
            and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))


# fused_attention="auto", attention that autograd differentiates on CUDA: which kernels
# serve it, decided once per (device, dtype, head dim, heads, kv heads, causal, length
# bucket) -- the bucket is the sequence length's bit length (lengths 2^(b-1) .. 2^b - 1
# share one decision: torch's pick can depend on the length, e.g. per backend length
# limits, but a decision per length would re-decide for every new batch shape);
# patch_model probes the buckets of 64 .. min(max_position_embeddings, 16384) eagerly, so
# torch.compile finds them -- and kept here: key -> (library: bool, the backend
# torch's SDPA would run, torch's SDPA flags then: enabled backends, their priority
# order, the flash backend's kernels). An eager call decides again when the flags
# changed (a torch.nn.attention.sdpa_kernel context, say). While
# torch.compile traces, a key not decided yet means torch's SDPA (nothing is stored: a
# store would fail the guards of the graph), and the length is not looked at: the
# library there only where every length bucket decided for the shape picked it. The
# flags are not compared there either (torch.compile does not guard on them): a graph
# keeps the routing it was traced with after an sdpa_kernel context or an
# enable_*_sdp call -- torch._dynamo.reset() (a recompile) picks the change up; the
# calls that graph sends to torch's SDPA follow the flags (torch reads them per call).
_AUTO = {}
# The torch SDPA backends the library's fwd + bwd (its Hopper backward) beats, with the
# head dims where it does. Measured on the H200 (torch 2.11, cuDNN 9.19; causal bf16 fwd +
# bwd, TFLOP/s; docs/PERFORMANCE.md "Training (CUDA)"): D 128 4 x 2048 16 / 16 heads:
# library 264, flash 233, cuDNN 393, efficient 116; D 128 1 x 16384: 456, flash 299,
# cuDNN 570; D 128 GQA 32 / 8: 282, flash 245, cuDNN 421; D 64 GQA 32 / 8: 199, flash
# 211 (flash wins), cuDNN 305. cuDNN beat the library everywhere then (torch 2.11 picks
# it at all of these shapes); efficient / math are slower than flash. Re-measured
# 2026-12-01 with the Hopper backward's 16-byte dK / dV stores (bench_training.py group
# 14, bench/results/training_issue8.json): D 128 4 x 2048 library 396 vs cuDNN 390, GQA
# 32 / 8 408 vs 404, 1 x 16384 626 vs 569; D 64 GQA 274 vs 304 -- and the 0.54 B compiled
# step with the library's attention forced level with cuDNN's (1.127x vs 1.131x HF sdpa +
# compile), so cuDNN keeps the call (a length-aware rule for D 128 at >= 8k, where the
# library led by 10%, is not measured on a step). "Flash" is torch's
# built-in FA2: with another flash implementation activated (FA3 / FA4,
# torch.nn.attention.activate_flash_attention_impl) the backend is unmeasured and keeps
# the call (_sdpa_flags()[4]).
# Head dim 256 (the Hopper backward's since 2026-12-03; bench/results/attention_bwd256_dsown.json,
# fwd + bwd bf16 through the API, B 32 / 8 / 2 at S 1k / 4k / 16k, 8 heads): library 393 /
# 421 / 426, causal 306 / 419 / 432 against torch's flash 228 / 268 / 277, causal 182 /
# 242 / 269 (1.5-1.7x); cuDNN 336 / 426 / 406, causal 264 / 381 / 413 (0.99-1.17x): cuDNN
# keeps the call there as at D 128 until a training step measures it. Head dim 96 (the Hopper
# forward and backward since 2026-12-03; bench/results/attention_d96_kstep.json, fwd + bwd
# bf16, B 32 / 8 / 4 at S 1k / 4k / 16k, 32 heads): library 370 / 429 / 461, causal 273 /
# 394 / 446 against flash 255 / 306 / 316, causal 194 / 260 / 288 (1.41-1.55x); cuDNN 359 /
# 420 / 435, causal 265 / 372 / 421 (1.02-1.06x): cuDNN keeps the call, as at D 128 and 256.
_AUTO_LIBRARY_BEATS = {"FLASH_ATTENTION": (96, 128, 256),
                       "EFFICIENT_ATTENTION": (64, 96, 128, 256), "MATH": (64, 96, 128, 256)}
_SDP_PRIORITY = getattr(torch._C, "_get_sdp_priority_order", lambda: ())


def _flash_impl():
    """The flash implementation activated in torch's SDPA, None for its built-in FA2."""
    current = getattr(torch.nn.attention, "current_flash_attention_impl", None)
    return current() if current is not None else None


def _sdpa_flags():
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.cudnn_sdp_enabled(), b.mem_efficient_sdp_enabled(),
            b.math_sdp_enabled(), _flash_impl(), tuple(_SDP_PRIORITY()))


def _len_bucket(S):
    """The length bucket of 'auto''s key: S's bit length (S in [2^(b-1), 2^b))."""
    return int(S).bit_length()


def _auto_key(q, k, causal, bucket=None):
    return (q.device.type, q.device.index, q.dtype, q.shape[-1], q.shape[-2], k.shape[-2],
            bool(causal), _len_bucket(q.shape[1]) if bucket is None else bucket)


def _hopper_backward_off():
    """OT_ATTN_SM90=0 / OT_ATTN_IMPL=portable, read here on every call and parsed as the
    library parses them. The library reads OT_ATTN_IMPL per call too, but OT_ATTN_SM90
    only once, at the process's first Hopper attention call (sm90_attention_env_off,
    docs/ENVIRONMENT.md): a change after that reaches this guess, not the kernels."""
    env = os.environ
    return (env.get("OT_ATTN_SM90", "").startswith("0")
            or env.get("OT_ATTN_IMPL") == "portable")


def _hopper_backward_applies(q, window, cu_seqlens):
    """Whether the library's Hopper attention backward (sm90/attention_bwd_sm90.cu)
    takes this call: a 9.0 device, bf16 / fp16, head dim 64, 96, 128 or 256, dense, no window
    (causal or not), non-deterministic (the patch never asks for determinism), Hopper
    kernels not switched off by OT_ATTN_SM90=0 / OT_ATTN_IMPL=portable. (A library
    built without sm_90a runs the portable backward there: not detectable from here.)"""
    return (not _hopper_backward_off() and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[-1] in (64, 96, 128, 256) and window is None and cu_seqlens is None
            and q.dim() == 4 and torch.cuda.get_device_capability(q.device) == (9, 0))


def _torch_sdpa_backend(q, k, v, causal, scale):
    """The backend torch's SDPA picks for _torch_attention's call on these [B, S, H, D]
    tensors (torch._fused_sdp_choice: host-side checks, no device work), by name."""
    from torch.nn.attention import SDPBackend
    try:
        i = torch._fused_sdp_choice(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    attn_mask=None, dropout_p=0.0, is_causal=bool(causal),
                                    scale=scale, enable_gqa=q.shape[2] != k.shape[2])
        return SDPBackend(i).name
    except Exception as e:  # noqa: BLE001  (a torch without it: count it as unknown)
        return f"unknown ({type(e).__name__})"


def _auto_library(q, k, v, causal, scale, window, cu_seqlens):
    """fused_attention='auto' for a differentiated CUDA call: whether the library's
    kernels serve it (True) or torch's SDPA (False). The library's where its Hopper
    backward takes the call and torch's SDPA would run a kernel listed in
    _AUTO_LIBRARY_BEATS for the head dim (flash, say); torch's SDPA otherwise (cuDNN,
    or a call only the library's portable backward would take)."""
    if torch.compiler.is_compiling():
        # no lookup by the length's bucket (it would specialize a dynamic length, and a
        # SymInt cannot be told from an int while dynamo traces): the library only where
        # every bucket decided for the shape picked it
        if window is not None or cu_seqlens is not None:
            return False
        base = _auto_key(q, k, causal, bucket=0)[:-1]
        got = [v[0] for kk, v in _AUTO.items() if kk[:-1] == base]
        return bool(got) and all(got)
    if (q.shape[1] != k.shape[1] or window is not None or cu_seqlens is not None
            or q.dim() != 4 or _hopper_backward_off()):
        return False            # not stored: a dense call of the same key may still apply
    key = _auto_key(q, k, causal)
    got = _AUTO.get(key)
    flags = _sdpa_flags()
    if got is not None and got[2] == flags:
        return got[0]
    if _hopper_backward_applies(q, window, cu_seqlens):
        backend = _torch_sdpa_backend(q, k, v, causal, scale)
        if backend == "FLASH_ATTENTION" and flags[4] is not None:
            backend = f"FLASH_ATTENTION ({flags[4]})"       # not the measured FA2
        lib = q.shape[-1] in _AUTO_LIBRARY_BEATS.get(backend, ())
        why = f"torch's SDPA would run {backend}"
    else:                       # device, dtype or head dim (all in the key)
        backend, lib = None, False
        why = "the library's Hopper backward does not take it"
    _AUTO[key] = (lib, backend, flags)
    _log_once("attn_auto:" + repr(key[2:]) + str(backend), "config.fused_attention='auto': "
              f"attention differentiated on CUDA (D {q.shape[-1]}, {q.shape[-2]} / "
              f"{k.shape[-2]} heads, {'causal' if causal else 'not causal'}, {q.dtype}): "
              + ("the library's kernels (Hopper backward)" if lib else "torch's SDPA")
              + f" ({why})")
    return lib


def _attention_ok(q, k, causal, window, v=None, scale=None, cu_seqlens=None):
    """Whether ops_transformer.attention serves this call ([B, S, H, D] q / k)."""
    if not _fused_attention():
        return False
    if _auto_torch_backward(q, k) and (v is None or not _auto_library(
            q, k, v, causal, scale, window, cu_seqlens)):
        return False
    extra = (q.shape[-1], q.shape[-2] // k.shape[-2], bool(causal),
             None if window is None else tuple(window))
    return _usable("attention", q.device, q.dtype, extra)


def _torch_attention(q, k, v, causal, scale, window, cu_seqlens=None):
    """torch's SDPA on [B, S, H, D] (or packed [T, H, D] with cu_seqlens) tensors, for
    config.fused_attention=False and devices / dtypes the library's attention lacks:
    returns [B, S, H, D] (or [T, H, D])."""
    if cu_seqlens is not None:
        outs = []
        bounds = cu_seqlens.tolist()
        for s, e in zip(bounds[:-1], bounds[1:]):
            outs.append(_torch_attention(q[None, s:e], k[None, s:e], v[None, s:e], causal,
                                         scale, window)[0])
        return torch.cat(outs, 0)
    Sq, Sk = q.shape[1], k.shape[1]
    mask = None
    if window is not None or (causal and Sq != Sk):
        i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
        j = torch.arange(Sk, device=q.device)[None, :]
        mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
        if causal:
            mask &= j <= i
        if window is not None:
            mask &= (j >= i - window[0]) & (j <= i + window[1])
        causal = False
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, is_causal=bool(causal), scale=scale,
                                       enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def _attention(q, k, v, causal, scale, window, cu_seqlens=None):
    if _attention_ok(q, k, causal, window, v, scale, cu_seqlens):
        return _ops.attention(q, k, v, causal=causal, softmax_scale=scale, window=window,
                              cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens)
    if not _fused_attention():
        _log_once("attn_unfused", "config.fused_attention=False: torch's SDPA attention used")
    elif _auto_torch_backward(q, k):
        _log_once("attn_auto", "config.fused_attention='auto': torch's SDPA for attention "
                  "differentiated on CUDA where the library's kernels are not faster")
    return _torch_attention(q, k, v, causal, scale, window, cu_seqlens)


def probe_device(device, dtype=torch.bfloat16, head_dims=(64, 128)):
    """Probe the library's ops on `device` / `dtype` now (eagerly; patch_model calls it
    for the model's device and for CUDA when present) and return {op: usable}."""
    device = torch.device(device)
    res = {}
    for op in ("rms_norm", "rms_norm_residual", "swiglu", "cross_entropy"):
        res[op] = _usable(op, device, dtype)
    for D in head_dims:
        res[f"rope D={D}"] = _usable("rope", device, dtype, (D,))
        for ratio in (1, 4):
            res[f"attention D={D} gqa={ratio}"] = _usable(
                "attention", device, dtype, (D, ratio, True, None)) if _fused_attention() \
                else False
    return res


# ---------------------------------------------------------------------------------
# Replacement forwards
# ---------------------------------------------------------------------------------

def _rms_norm_forward(self, hidden_states):
    if torch.compiler.is_compiling() and not self._ot_compiled_lib:
        return self._ot_orig_forward(hidden_states)     # inductor fuses HF's composite
    w = self.weight
    if hidden_states.dtype != w.dtype:
        _log_once("rms_dtype", f"{type(self).__name__}: input dtype {hidden_states.dtype} != "
                  f"weight dtype {w.dtype}: HF's RMSNorm used")
        return self._ot_orig_forward(hidden_states)
    if not _usable("rms_norm", hidden_states.device, hidden_states.dtype):
        return self._ot_orig_forward(hidden_states)
    return _ops.rms_norm(hidden_states, w, self.variance_epsilon)


def _add_rms_norm(x, residual, norm):
    """(norm(residual + x), residual + x), fused when the norm is patched."""
    w = getattr(norm, "weight", None)
    if (getattr(norm, "_ot_patched", False) and w is not None
            and (norm._ot_compiled_lib or not torch.compiler.is_compiling())
            and x.dtype == residual.dtype == w.dtype and x.shape == residual.shape
            and _usable("rms_norm_residual", x.device, x.dtype)):
        return _ops.rms_norm(x, w, norm.variance_epsilon, residual=residual)
    h = residual + x
    return norm(h), h


def _hf_checkpoints_forward():
    """Whether transformers checkpoints a GradientCheckpointingLayer in its class's
    forward (later transformers 5, e.g. 5.24: wrapped by __init_subclass__, which the
    patched instance forward replaces) rather than in __call__ (<= 5.17, the device's
    version: around the patched forward)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return False
    return "__call__" not in GradientCheckpointingLayer.__dict__


def _decoder_layer_forward(self, *args, **kwargs):
    """The patched decoder layer, checkpointed as transformers' own forward wrapper does
    when gradient checkpointing is on (transformers after 5.17): the recompute in the
    backward runs the same body, with the forward's packed-sequence split (_LOCAL.cu_seqlens,
    which the backward would not see otherwise)."""
    if not (getattr(self, "gradient_checkpointing", False) and self.training
            and torch.is_grad_enabled() and _hf_checkpoints_forward()):
        cu = _recompute_split(self, kwargs)
        if cu is None:
            return _decoder_layer_body(self, *args, **kwargs)
        _LOCAL.cu_seqlens = cu
        try:
            return _decoder_layer_body(self, *args, **kwargs)
        finally:
            _LOCAL.cu_seqlens = None
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    if not getattr(self, "_can_checkpoint_with_cache", False):
        for name in ("cache", "past_key_values"):
            if kwargs.get(name) is not None:
                kwargs[name] = None
    cu = None if torch.compiler.is_compiling() else getattr(_LOCAL, "cu_seqlens", None)

    def run(*a):
        if torch.compiler.is_compiling():
            return _decoder_layer_body(self, *a, **kwargs)
        prev = getattr(_LOCAL, "cu_seqlens", None)
        _LOCAL.cu_seqlens = cu
        try:
            return _decoder_layer_body(self, *a, **kwargs)
        finally:
            _LOCAL.cu_seqlens = prev
    return self._gradient_checkpointing_func(run, *args)


def _recompute_split(layer, kwargs):
    """The packed-sequence split of a checkpointed layer's recompute where transformers
    checkpoints in __call__ (<= 5.17: around the patched forward, which then runs again in
    the backward, outside the base model's forward and its _LOCAL.cu_seqlens): the
    split _base_model_forward found for these position_ids (the layer's kwargs hold the
    same tensor object), else None -- also in every forward that is not such a
    recompute (the split is already set, no checkpointing, or no packed batch)."""
    if (getattr(_LOCAL, "cu_seqlens", None) is not None
            or not getattr(layer, "gradient_checkpointing", False) or not layer.training
            or torch.compiler.is_compiling()):
        return None
    return getattr(kwargs.get("position_ids"), "_ot_cu_seqlens", None)


def _decoder_layer_body(self, hidden_states, attention_mask=None, position_ids=None,
                        cache=None, use_cache=False, position_embeddings=None,
                        past_key_values=None, **kwargs):
    if cache is None:
        cache = past_key_values
    residual = hidden_states
    norm = self.input_layernorm
    if FUSE_LAYER_ADDS and _keep_input_ok(norm, hidden_states):
        # the residual stream through the input norm: its backward sums the two gradients
        hidden_states, residual = _NormKeepInput.apply(hidden_states, norm.weight,
                                                       norm.variance_epsilon)
    else:
        hidden_states = norm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, cache=cache,
                                      use_cache=use_cache,
                                      position_embeddings=position_embeddings, **kwargs)
    hidden_states, residual = _add_rms_norm(hidden_states, residual,
                                            self.post_attention_layernorm)
    mlp = self.mlp
    if FUSE_LAYER_ADDS and _fuse_mlp_ok(mlp):
        return _mlp_forward(mlp, hidden_states, residual=residual)
    hidden_states = mlp(hidden_states)
    return residual + hidden_states


# Off by default (docs/PERFORMANCE.md, "Training (CUDA)": where the compiled step loses):
# the decoder layer's two residual adds that are left as separate kernels (inductor
# pointwise kernels under torch.compile, 3 x 33.5 MB each a layer at 0.54 B 4 x 2048, ~30 us):
# - forward, the closing residual + mlp(x): in the down projection's GEMM, one addmm (cuBLAS
#   adds the residual in its epilogue, beta 1; _SwiGLUDown) -- the sum rounds once (float32
#   inside the GEMM) where the unfused one rounds the GEMM's output first;
# - backward, the layer input's gradient through the input norm plus the one through the
#   residual: the residual stream passes through the input norm (_NormKeepInput returns
#   its input as a second output), whose backward adds the residual's gradient in the norm
#   backward kernel (its dresidual_out) instead of autograd's add.
# Its A/B on the H200 (bench/bench_training.py groups 11 / 12, call of fa0fbb6: interleaved,
# 12 rounds, both halves taken in every fused step; the median per-round ratio and the 95%
# bootstrap interval of the mean): compiled 0.994x (0.989-1.000) at 0.54 B, 1.000x (0.996-1.003) at
# 1.5 B; eager 1.001x (0.998-1.010) / 1.000x (0.999-1.007): no gain, so off. (1c2f893's
# compiled rows had traced no fused add: torch 2.11's dynamo reads `forward.__func__` as
# missing; the checks read _ot_patched since 3292e35.) Read per call (torch.compile guards
# on it).
FUSE_LAYER_ADDS = False


def _fuse_mlp_ok(mlp):
    """Whether the decoder layer may call the patched MLP with the residual
    (FUSE_LAYER_ADDS: the closing add in the down projection's GEMM): the patch set its
    forward (_mlp_forward: patch_model gives an MLP no other) and no module hook would be
    skipped. (Not `mlp.forward.__func__ is _mlp_forward`: torch 2.11's dynamo reads a
    bound method's __func__ as missing, so that test was False while torch.compile
    traced -- both halves of FUSE_LAYER_ADDS off in the compiled step.)"""
    return getattr(mlp, "_ot_patched", False) and _no_module_hooks(mlp)


def _keep_input_ok(norm, x):
    """Whether the decoder layer may run its input norm as :class:`_NormKeepInput`: the
    patch's library RMSNorm would run (as _rms_norm_forward decides), no module hooks,
    autograd recording, a plain tensor (not a DTensor, say). :func:`_keep_input_why`
    names the first condition that fails."""
    return _keep_input_why(norm, x) is None


def _keep_input_why(norm, x):
    """None where :func:`_keep_input_ok` holds, else the name of its first failing
    condition (the CUDA test of the fused adds under torch.compile reports it: on the
    H200's torch 2.11 the compiled step did not take this path, run of 1c2f893 -- the
    "forward" check, then a bound-method identity test dynamo 2.11 cannot read)."""
    w = getattr(norm, "weight", None)
    if not getattr(norm, "_ot_patched", False):      # its forward: _rms_norm_forward
        return "forward"                             # (as _add_rms_norm; see _fuse_mlp_ok)
    if w is None or x.dtype != w.dtype:
        return "weight"
    if not torch.is_grad_enabled() or not (x.requires_grad or w.requires_grad):
        return "grad"
    if not _no_module_hooks(norm):
        return "hooks"
    if not (norm._ot_compiled_lib or not torch.compiler.is_compiling()):
        return "compiled_lib"
    if not (type(x) in (torch.Tensor, torch.nn.Parameter)
            and type(w) in (torch.Tensor, torch.nn.Parameter)):
        return "tensor_type"
    if not (_usable("rms_norm", x.device, x.dtype)
            and _usable("rms_norm_residual", x.device, x.dtype)):
        return "usable"
    return None


class _NormKeepInput(torch.autograd.Function):
    """(rms_norm(x) * weight, x): the layer's input norm with the layer input passed on as
    the residual stream (FUSE_LAYER_ADDS), so that the residual's gradient reaches this
    backward and is added inside the norm backward kernel (dresidual_out) -- the sum of
    the two gradients of x without autograd's elementwise add. The second output is a
    view of x (no copy)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        fwd = _tops._rms_norm_impl if _tops._plain(x) else torch.ops.ops_transformer.rms_norm
        o, _, rstd = fwd(x, None, weight, float(eps))
        ctx.save_for_backward(x, weight, rstd)
        ctx.eps = float(eps)
        return o, x.view_as(x)

    @staticmethod
    def backward(ctx, do, dres):
        x, weight, rstd = ctx.saved_tensors
        plain = (_tops._plain(x) and not torch.is_grad_enabled()
                 and all(type(t) in _tops._PLAIN_ARGS for t in (weight, do, dres)))
        bwd = _tops._rms_norm_backward_impl if plain \
            else torch.ops.ops_transformer.rms_norm_backward
        do = _tops._dense_or_zeros(do, x)
        dres = None if dres is None else _tops._dense(dres)
        dx, dw = bwd(do, dres, x, weight, rstd, ctx.eps)
        return dx, (dw if ctx.needs_input_grad[1] else None), None


def _no_module_hooks(m):
    """Whether calling m's forward directly skips nothing: no hooks on m, no global module
    hooks (FSDP2's fully_shard, a profiler's or a user's hook keep the module call)."""
    g = _nn_module
    return not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks or g._global_forward_hooks
                or g._global_forward_pre_hooks or g._global_backward_hooks
                or g._global_backward_pre_hooks)


def _plain_linear(m, dtype):
    """Whether the patched forward may compute nn.Linear m from its weight directly
    (:class:`_Projections`, :class:`_SwiGLUDown`): exactly nn.Linear (not a LoRA /
    quantized subclass), weight of the activations' dtype, no module hooks (a hook on
    the Linear -- or a global one -- would be skipped), no autocast."""
    return (type(m) is torch.nn.Linear and m.weight.dtype == dtype and _no_module_hooks(m)
            and not torch.is_autocast_enabled(m.weight.device.type))


class _Projections(torch.autograd.Function):
    """Several nn.Linear projections of one input (q / k / v; gate / up): the outputs
    F.linear(x, w_i, b_i) as the Linears compute them, and in the backward the input
    gradient dx = sum_i dy_i w_i accumulated by the GEMMs (addmm with beta 1: cuBLAS
    adds the previous sum in its epilogue) instead of one GEMM per projection and
    autograd's elementwise sums of the partial gradients (2 adds a layer for q / k / v,
    1 for gate / up: ~23 us each at 4 x 2048 x 2048 bf16 on the H200). The weight and
    bias gradients are the Linears' (dy_i^T x, sum of dy_i); the tensors saved are the
    Linears' (the weights, and x only where a weight needs its gradient: frozen
    projections keep no activation). The summation order of dx differs from autograd's
    (float32 accumulation inside the GEMM, one rounding per term)."""

    @staticmethod
    def forward(ctx, x, *wb):                    # x, w0, b0, w1, b1, ...
        ws, bs = wb[0::2], wb[1::2]
        ctx.save_for_backward(x if any(ctx.needs_input_grad[1::2]) else None, *ws)
        ctx.has_bias = tuple(b is not None for b in bs)
        if not torch.compiler.is_compiling():
            ctx.set_materialize_grads(False)     # an unused output: no zeros GEMM'd
        return tuple(F.linear(x, w, b) for w, b in zip(ws, bs))

    @staticmethod
    def backward(ctx, *dys):
        x, *ws = ctx.saved_tensors               # x: None where no weight needs a gradient
        grads = [None] * (1 + 2 * len(ws))
        x2 = None if x is None else x.reshape(-1, x.shape[-1])
        dx = lead = None
        for i, (dy, w) in enumerate(zip(dys, ws)):
            if dy is None:
                continue
            lead = dy.shape[:-1]                 # x's leading dims
            dy2 = dy.reshape(-1, dy.shape[-1])
            if ctx.needs_input_grad[0]:
                if dx is None:
                    dx = dy2.mm(w)
                elif torch.compiler.is_compiling():
                    _addmm_inplace(dx, dy2, w)
                else:
                    dx.addmm_(dy2, w)
            if ctx.needs_input_grad[1 + 2 * i]:
                grads[1 + 2 * i] = dy2.t().mm(x2)
            if ctx.has_bias[i] and ctx.needs_input_grad[2 + 2 * i]:
                grads[2 + 2 * i] = dy2.sum(0)
        if dx is not None:                       # (no output differentiated: None)
            grads[0] = dx.view(*lead, dx.shape[-1])
        return tuple(grads)


@torch.library.custom_op("ops_transformer::addmm_inplace", mutates_args=("out",))
def _addmm_inplace(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b in place (cuBLAS's beta = 1 epilogue): :class:`_Projections`'s
    backward under torch.compile. The graph's aten.addmm is functional there: inductor
    gives it a new output and copies the sum into it first (a device-to-device copy
    of [tokens, hidden] per addmm: 3 a layer, 0.39 ms a step at 0.54 B 4 x 2048 on the
    H200, run of 8ca13d3); a mutating custom op is reinplaced by inductor instead."""
    out.addmm_(a, b)


@_addmm_inplace.register_fake
def _(out, a, b):
    return None


def _project(x, linears):
    """(lin(x) for lin in linears): through :class:`_Projections` when autograd
    records and every Linear is a plain one of x's dtype, else the modules' calls."""
    if (torch.is_grad_enabled() and x.dim() >= 2
            and all(_plain_linear(m, x.dtype) for m in linears)
            and (x.requires_grad or any(m.weight.requires_grad for m in linears))):
        args = []
        for m in linears:
            args += (m.weight, m.bias)
        return _Projections.apply(x, *args)
    return tuple(m(x) for m in linears)


# OT_PATCH_SWIGLU_RECOMPUTE=0: _SwiGLUDown's backward as before 2026-12-01 (glu for the
# weight gradient, then glu_backward), for A/Bs; otherwise one glu_backward_recompute. Read
# from the environment when this module is imported; set patch.SWIGLU_RECOMPUTE at run time.
# The patched MLP reads this global in its forward and hands it to _SwiGLUDown, so that
# torch.compile guards on it: a flip recompiles (a backward read only at trace time would
# let two settings share one compiled graph -- what the bench's first A/B of it measured).
SWIGLU_RECOMPUTE = os.environ.get("OT_PATCH_SWIGLU_RECOMPUTE", "1") != "0"


class _SwiGLUDown(torch.autograd.Function):
    """down(swiglu(gate, up)) that saves gate and up only: the backward recomputes
    swiglu(gate, up) (one elementwise pass) instead of keeping it from the forward, so
    each MLP holds two [tokens, ffn] activations instead of three (HF's holds four:
    gate, silu(gate), up and the product) -- 2 * tokens * ffn bytes less per layer in
    bf16 (134 MB at 8192 tokens x FFN 8192). With ``residual`` (FUSE_LAYER_ADDS):
    residual + down(...) as one GEMM, the residual added in its epilogue; its gradient is
    the output's."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias, residual=None, recompute=None):
        a = _ops.swiglu(gate, up)          # (grad mode is off here: no autograd record)
        ctx.save_for_backward(gate, up, weight)
        ctx.has_bias = bias is not None
        # (None: the module's SWIGLU_RECOMPUTE now -- direct calls; the MLP passes it)
        ctx.recompute = SWIGLU_RECOMPUTE if recompute is None else bool(recompute)
        if residual is None:
            return F.linear(a, weight, bias)
        if bias is not None:
            return residual + F.linear(a, weight, bias)
        out = torch.addmm(residual.reshape(-1, residual.shape[-1]),
                          a.reshape(-1, a.shape[-1]), weight.t())
        return out.view(residual.shape)

    @staticmethod
    def backward(ctx, dy):
        gate, up, weight = ctx.saved_tensors
        # the plain implementations in eager mode (no custom-op dispatch: less host
        # time), the custom ops while torch.compile traces, on fake / meta tensors, and
        # under create_graph=True (their nodes refuse a double backward; the plain
        # implementations' outputs would silently carry no gradient)
        # every tensor the backward computes with must be a plain one (a DTensor
        # weight or dy next to a plain gate would reach the C library otherwise)
        plain = (_tops._plain(gate) and not torch.is_grad_enabled()
                 and all(type(t) in _tops._PLAIN_ARGS for t in (up, weight, dy)))
        glu = _tops._glu_impl if plain else torch.ops.ops_transformer.glu
        glu_backward = _tops._glu_backward_impl if plain \
            else torch.ops.ops_transformer.glu_backward
        glu_backward_recompute = _tops._glu_backward_recompute_impl if plain \
            else torch.ops.ops_transformer.glu_backward_recompute
        dw = db = a = None
        dg = du = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            da = dy.matmul(weight)
            if ctx.needs_input_grad[2] and ctx.recompute:
                # the product again from the backward's own reads of gate and up (one pass,
                # not a glu recompute plus the backward; the forward's bits). Under
                # torch.compile also what keeps the product out of the saved activations:
                # with a separate glu here the partitioner merged it with the forward's glu
                # and saved the product (one [tokens, ffn] activation more per layer)
                dg, du, a = glu_backward_recompute(da, gate, up, _ops.GLU_SWIGLU)
            else:
                dg, du = glu_backward(da, gate, up, _ops.GLU_SWIGLU)
        if ctx.needs_input_grad[2]:
            if a is None:
                a = glu(gate, up, _ops.GLU_SWIGLU)
            dw = dy.reshape(-1, dy.shape[-1]).t().mm(a.reshape(-1, a.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[3]:
            db = dy.reshape(-1, dy.shape[-1]).sum(0)
        dres = dy if len(ctx.needs_input_grad) > 4 and ctx.needs_input_grad[4] else None
        return dg, du, dw, db, dres, None


def _mlp_forward(self, x, residual=None):
    """The patched MLP; with ``residual`` (the decoder layer under FUSE_LAYER_ADDS)
    residual + mlp(x), the add inside the down projection's GEMM where _SwiGLUDown runs."""
    def plus(y):
        return y if residual is None else residual + y
    g, u = _project(x, (self.gate_proj, self.up_proj))
    if g.dtype != u.dtype:
        _log_once("mlp_dtype", f"{type(self).__name__}: gate/up dtypes differ: HF's MLP used")
        return plus(self.down_proj(self.act_fn(g) * u))
    if not _usable("swiglu", g.device, g.dtype) or (
            torch.compiler.is_compiling() and not self._ot_compiled_lib):
        return plus(self.down_proj(self.act_fn(g) * u))  # (compiled: inductor fuses it)
    down = self.down_proj
    if (torch.is_grad_enabled() and _plain_linear(down, g.dtype)
            and (g.requires_grad or u.requires_grad or down.weight.requires_grad)):
        if residual is not None and (residual.dtype != g.dtype
                                     or residual.shape[:-1] != g.shape[:-1]):
            residual_in = None
        else:
            residual_in = residual
        out = _SwiGLUDown.apply(g, u, down.weight, down.bias, residual_in,
                                 SWIGLU_RECOMPUTE)
        return out if residual_in is not None or residual is None else residual + out
    return plus(down(_ops.swiglu(g, u)))


def _sliding_window(module):
    if hasattr(module, "sliding_window"):          # Qwen2: per layer type
        return module.sliding_window
    return getattr(module.config, "sliding_window", None)   # Mistral: config-wide


def _window(sliding_window):
    # HF: key j is seen by query i when i - sliding_window < j <= i.
    return None if not sliding_window else (int(sliding_window) - 1, 0)


def _rope_cache(cos, sin, B, S):
    """HF's cos / sin [Bc, S, D] (Bc = 1 or B) as ot.rope's cos_sin_cache + positions.
    Every layer of a forward gets the same cos / sin tensors: in eager the result for the
    last (cos, sin, B) of this thread (unmodified since, no autograd) is reused instead of
    rebuilt per layer."""
    if torch.compiler.is_compiling() or cos.requires_grad or sin.requires_grad:
        return _build_rope_cache(cos, sin, B, S)
    key = (cos, sin, cos._version, sin._version, B)
    last = getattr(_LOCAL, "rope_cache", None)
    if (last is not None and last[0] is cos and last[1] is sin
            and last[2:5] == key[2:]):
        return last[5], last[6]
    cache, pos = _build_rope_cache(cos, sin, B, S)
    _LOCAL.rope_cache = key + (cache, pos)
    return cache, pos


def _rope_composite(q, k, cos, sin):
    """HF's apply_rotary_pos_emb in the patch's [B, S, H, D] layout (cos / sin [Bc, S, D]
    as HF's rotary embedding returns them): the torch code that torch.compile runs where
    the library's rope is not among the compiled ops (:func:`patch_model`'s
    ``compiled_ops``); inductor fuses it into its neighbours' kernels."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    half = q.shape[-1] // 2

    def rot(t):
        return torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def _build_rope_cache(cos, sin, B, S):
    D = cos.shape[-1]
    half = D // 2
    cache = torch.cat([cos[..., :half], sin[..., :half]], dim=-1).to(torch.float32)
    cache = cache.reshape(-1, D)
    pos = torch.arange(cache.shape[0], device=cos.device)
    pos = pos.view(1, S).expand(B, S) if cos.shape[0] == 1 else pos.view(B, S)
    return cache, pos


_OLD_STYLE_UPDATE = {}


def _cache_update(cache, k, v, layer_idx, cos, sin, kwargs):
    """cache.update as the installed transformers calls it: ``update(k, v, idx,
    kwargs=kwargs)`` (5.2x) or ``update(k, v, idx, cache_kwargs)`` with cos / sin /
    cache_position (earlier versions, whose update has a ``cache_kwargs`` parameter)."""
    cls = type(cache)
    old = _OLD_STYLE_UPDATE.get(cls)
    if old is None:
        import inspect
        try:
            old = "cache_kwargs" in inspect.signature(cls.update).parameters
        except (TypeError, ValueError):
            old = False
        _OLD_STYLE_UPDATE[cls] = old
    if old:
        return cache.update(k, v, layer_idx, {"sin": sin, "cos": cos,
                                              "cache_position": kwargs.get("cache_position")})
    return cache.update(k, v, layer_idx, kwargs=kwargs)


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
                and cos.shape[0] in (1, B)
                and _usable("rope", hidden_states.device, hidden_states.dtype,
                            (self.head_dim,)))
    if not fast:
        if dropout:
            _log_once("attn_dropout", "attention dropout > 0: transformers' SDPA attention used")
        return self._ot_orig_forward(hidden_states, position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, cache=cache, **kwargs)
    D = self.head_dim
    q, k, v = (t.view(B, S, -1, D) for t in
               _project(hidden_states, (self.q_proj, self.k_proj, self.v_proj)))
    if torch.compiler.is_compiling() and not self._ot_compiled_lib:
        q, k = _rope_composite(q, k, cos, sin)          # inductor fuses HF's math
    else:
        cs, pos = _rope_cache(cos, sin, B, S)
        q, k = _ops.rope(q, k, pos, cos_sin_cache=cs)
    if cache is None and attention_mask is None:
        # [B, S, H, D] throughout: no transposes, no repeated k/v heads
        cu = _cu_seqlens()
        if cu is not None:           # packed sequences: [B * S, H, D] varlen
            q, k, v = q.reshape(B * S, -1, D), k.reshape(B * S, -1, D), v.reshape(B * S, -1, D)
        o = _attention(q, k, v, getattr(self, "is_causal", True), self.scaling,
                       _window(_sliding_window(self)), cu)
    else:
        # HF's cache layout is [B, H, S, D]; the interface function takes it as views
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = _cache_update(cache, k, v, self.layer_idx, cos, sin, kwargs)
        o, _ = ot_attention_forward(self, q.transpose(1, 2), k, v, attention_mask,
                                    scaling=self.scaling, sliding_window=_sliding_window(self))
    return self.o_proj(o.reshape(B, S, -1)), None


def _base_model_forward(self, *args, **kwargs):
    no_cache = kwargs.get("cache") is None and kwargs.get("past_key_values") is None
    plain = len(args) <= 1 and kwargs.get("attention_mask") is None and no_cache
    cu = None
    pos = kwargs.get("position_ids")
    if plain and pos is not None:
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
            cu = _packed_cu_seqlens(pos, ref.shape[0])
            # attention dropout runs transformers' SDPA attention, which takes no
            # cu_seqlens: a packed batch keeps HF's block-diagonal mask then
            if (cu is not None and self.training
                    and getattr(self.config, "attention_dropout", 0.0)):
                plain = False
    if (self.training and isinstance(pos, torch.Tensor) and not torch.compiler.is_compiling()
            and any(getattr(m, "gradient_checkpointing", False)
                    for m in getattr(self, "layers", ()))):
        # the split of a recompute outside this forward (_recompute_split); None in every
        # forward that has none (a cache, a mask, dropout), so that a position_ids tensor
        # reused from a packed call does not hand its old split to this one's layers
        pos._ot_cu_seqlens = cu if plain else None
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
        if softcap:
            o = _ops.attention(q, k, v, causal=bool(causal), softmax_scale=scaling,
                               window=_window(sliding_window), softcap=float(softcap),
                               cu_seqlens_q=cu, cu_seqlens_k=cu)
        else:
            o = _attention(q, k, v, bool(causal), scaling, _window(sliding_window), cu)
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


def _find_packed_sequence_indices(position_ids, *args, **kwargs):
    """transformers.masking_utils.find_packed_sequence_indices, except in an eager call of
    a patched base model that needs no mask (_no_mask(): the mask function returns None
    whatever the packing, and a packed batch runs the library's varlen attention from
    cu_seqlens): None there without looking. HF's check ends in a Python bool of a device
    tensor -- a host-device synchronization at the start of every forward."""
    if not torch.compiler.is_compiling() and getattr(_LOCAL, "no_mask", False):
        return None
    return _find_packed_sequence_indices.orig(position_ids, *args, **kwargs)


def _register():
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers import masking_utils
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(ATTN_IMPLEMENTATION, ot_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, ot_attention_mask)
    # masking_utils looks the function up by its module-global name on every call; the
    # wrapper behaves as the original outside the patched models' mask-free eager calls
    orig = getattr(masking_utils, "find_packed_sequence_indices", None)
    if orig is not None and getattr(orig, "orig", None) is None:
        _find_packed_sequence_indices.orig = orig
        masking_utils.find_packed_sequence_indices = _find_packed_sequence_indices
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
    if not _usable("cross_entropy", logits.device, logits.dtype):
        loss = F.cross_entropy(logits.float(), shift_labels, ignore_index=ignore_index,
                               reduction="mean" if num_items_in_batch is None else "sum")
        if num_items_in_batch is None:
            return loss
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        return loss / num_items_in_batch
    if num_items_in_batch is None:
        return _ops.cross_entropy(logits, shift_labels, ignore_index=ignore_index)
    loss = _ops.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


# ---------------------------------------------------------------------------------
# Fused LM head + loss (the logits are never materialized)
# ---------------------------------------------------------------------------------

# Logits elements per chunk of the fallback below: 2^27 (256 MiB in bfloat16), as the
# library's ot_linear_cross_entropy picks its default chunk.
_LM_CHUNK_ELEMS = 1 << 27


def _lm_chunk_rows(tokens, vocab):
    rows = _LM_CHUNK_ELEMS // max(int(vocab), 1)
    if rows >= 256:
        rows -= rows % 128              # GEMM-friendly row counts (4096 at a 32k vocab)
    return max(1, min(int(tokens), rows))


@torch.library.custom_op("ops_transformer::lm_head_loss_chunked", mutates_args=())
def _lm_head_loss_chunked(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                          scale: torch.Tensor, ignore_index: int, chunk_rows: int,
                          need_dhidden: bool, need_dweight: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sum over tokens of cross_entropy(hidden W^T, labels) * scale, and (computed here,
    in the forward, as the loss is a scalar) its gradients for hidden and weight, in
    chunks of chunk_rows tokens: logits_c = hidden_c W^T (torch's GEMM), the library's
    cross-entropy forward and backward on them (the gradient written over the chunk's
    logits), dhidden_c = dlogits_c W, dweight += dlogits_c^T hidden_c."""
    from . import _C
    hidden = hidden.contiguous()
    weight = weight.contiguous()
    T = hidden.shape[0]
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    part = torch.empty((), dtype=torch.float32, device=hidden.device)
    scale = scale.to(device=hidden.device, dtype=torch.float32).reshape(())
    dh = torch.empty_like(hidden) if need_dhidden else hidden.new_empty(0)
    dw = torch.empty_like(weight) if need_dweight else hidden.new_empty(0)
    grads = need_dhidden or need_dweight
    lse = None
    for s in range(0, T, chunk_rows):
        e = min(T, s + chunk_rows)
        h, lab = hidden[s:e], labels[s:e]
        logits = torch.mm(h, weight.t())
        if grads:
            if lse is None or lse.shape[0] != e - s:
                lse = torch.empty(e - s, dtype=torch.float32, device=hidden.device)
            _C.cross_entropy_forward(None, ignore_index, 0.0, 1, logits, lab, part, lse)
            total += part
            # d(scale * sum)/d logits, written over the logits
            _C.cross_entropy_backward(None, ignore_index, 0.0, 1, scale, logits, lab, lse,
                                      logits)
            if need_dhidden:
                torch.mm(logits, weight, out=dh[s:e])
            if need_dweight:
                if s == 0:
                    torch.mm(logits.t(), h, out=dw)
                else:
                    dw.addmm_(logits.t(), h)
        else:
            _C.cross_entropy_forward(None, ignore_index, 0.0, 1, logits, lab, part, None)
            total += part
        del logits
    return total * scale, dh, dw


@_lm_head_loss_chunked.register_fake
def _(hidden, weight, labels, scale, ignore_index, chunk_rows, need_dhidden, need_dweight):
    loss = hidden.new_empty((), dtype=torch.float32)
    dh = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_dhidden \
        else hidden.new_empty(0)
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dweight \
        else hidden.new_empty(0)
    return loss, dh, dw


def _lm_loss_setup(ctx, inputs, output):
    ctx.need = inputs[6], inputs[7]
    ctx.save_for_backward(output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _lm_loss_bwd(ctx, gloss, gdh, gdw):
    dh, dw = ctx.saved_tensors
    # The gradients were computed for an upstream gradient of 1; scale them by the
    # actual one (exact for 1 and powers of two, as in gradient accumulation by 2^k;
    # otherwise rounded to the storage dtype once).
    g = gloss.to(dh.dtype)
    return (dh * g if ctx.need[0] else None, dw * g if ctx.need[1] else None,
            None, None, None, None, None, None)


_lm_head_loss_chunked.register_autograd(_lm_loss_bwd, setup_context=_lm_loss_setup)


def _library_lce():
    """The library's fused linear + cross-entropy (ops_transformer.linear_cross_entropy),
    or None when this build does not have it."""
    return getattr(_ops, "linear_cross_entropy", None)


_LCE_OK = {}      # device type -> whether the library's op runs and agrees there


def _library_lce_usable(device):
    """Whether ops_transformer.linear_cross_entropy exists, runs on `device` and agrees
    with the chunked path on a small input (checked once per device type, eagerly; under
    torch.compile the answer of an earlier eager call -- patch_model makes one -- or
    False)."""
    key = device.type
    if key in _LCE_OK:
        return _LCE_OK[key]
    fn = _library_lce()
    if fn is None or key not in ("cpu", "cuda"):
        return False
    if torch.compiler.is_compiling():
        return False
    ok = False
    try:
        g = torch.Generator().manual_seed(0)
        h = torch.randn(5, 16, generator=g).to(device).requires_grad_(True)
        w = torch.randn(40, 16, generator=g).to(device).requires_grad_(True)
        lab = torch.tensor([3, -100, 39, 0, 7], device=device)
        loss = fn(h, w, lab, ignore_index=-100, reduction="sum")
        loss.backward()
        h2, w2 = h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
        ref = F.cross_entropy(h2 @ w2.t(), lab, ignore_index=-100, reduction="sum")
        ref.backward()
        ok = bool(torch.allclose(loss.detach().float(), ref.detach(), rtol=1e-4, atol=1e-4)
                  and torch.allclose(h.grad, h2.grad, rtol=1e-3, atol=1e-4)
                  and torch.allclose(w.grad, w2.grad, rtol=1e-3, atol=1e-4))
        if not ok:
            _log_once("lce_mismatch", f"ops_transformer.linear_cross_entropy disagrees with "
                      f"torch on {key}: the chunked fallback is used")
    except Exception as e:  # noqa: BLE001  (not implemented on this backend, other API)
        _log_once("lce_fail:" + key, f"ops_transformer.linear_cross_entropy unusable on "
                  f"{key} ({type(e).__name__}: {e}): the chunked fallback is used")
    _LCE_OK[key] = ok
    return ok


# The library's default chunk of linear_cross_entropy: as many tokens as fit 256 MiB of
# logits (src/core/linear_cross_entropy.h OT_LCE_DEFAULT_CHUNK_BYTES).
_LCE_CHUNK_BYTES = 1 << 28
# The fused loss's chunk where the default holds fewer rows: 2048 rows, within twice the
# default's logits. Measured on the H200 (bench_training.py "lce", 8192 tokens x H 2048
# bf16, forward + backward; docs/PERFORMANCE.md "Training (CUDA)"): V 128256 (default
# 1046 rows) 21.84 ms, 1024 rows 21.87, 2048 rows 20.68, 4096 rows 20.52 (+0.5 GB peak);
# V 32000 (default 4194 rows) 4.79 ms, 4096 rows 5.06, 2048 rows 5.01 -- fewer, larger
# chunks run fewer beta = 1 passes over the [V, H] weight gradient.
_LCE_MIN_ROWS = 2048


def _lce_env_rows():
    """OT_LCE_CHUNK_ROWS (docs/ENVIRONMENT.md), read per call: tokens per chunk of the
    fused loss (0: the library's default), or None where it is unset or not a
    non-negative integer."""
    v = os.environ.get("OT_LCE_CHUNK_ROWS")
    if not v:
        return None
    try:
        n = int(v)
    except ValueError:
        return None
    return n if n >= 0 else None


def _lce_chunk_tokens(T, V, elem):
    """Tokens per chunk of the fused loss: 0 (the library's default, 256 MiB of logits)
    where that holds at least 2048 rows or every token; else 2048 rows, or as many as
    fit twice the default's logits when fewer (so that the chunk's logits never take
    more than 512 MiB). At V 128256 bf16: 2048 instead of 1046 rows (the forward's
    workspace grows by 257 MiB; the backward's transient copy of the [V, H] weight
    gradient, 513 MiB, stays the larger). With T <= that many tokens: one chunk (the
    library clamps the chunk to T). OT_LCE_CHUNK_ROWS=N (opt-in; measured 2026-12-01 at N =
    8192 in the compiled training step: 0.99x / 1.00x, not kept) takes N instead: fewer, larger GEMMs -- at 8192 tokens one
    chunk, the LM head's three GEMMs at HF's shapes and no beta = 1 pass over the [V, H]
    weight gradient -- for N x V x elem bytes of logits (2.1 GB at 8192 x 128256 bf16)."""
    env = _lce_env_rows()
    if env is not None:
        return env
    row = max(1, int(V) * int(elem))
    default = _LCE_CHUNK_BYTES // row
    rows = min(_LCE_MIN_ROWS, 2 * _LCE_CHUNK_BYTES // row)
    if default >= T or rows <= default:
        return 0
    return rows


def lm_head_loss(hidden, weight, labels, *, ignore_index=-100, num_items_in_batch=None,
                 shift_labels=None, chunk_rows=None, impl="auto"):
    """HF's causal-LM loss of ``hidden @ weight.T`` without materializing the logits.

    hidden: [..., S, H]; weight: [V, H] (the lm_head's); labels: [..., S] (shifted left
    by one here, as HF does, unless ``shift_labels`` is given); mean over non-ignored
    tokens, or the sum divided by ``num_items_in_batch``. ``impl``: ``"library"``
    (ops_transformer.linear_cross_entropy), ``"chunked"`` (torch's GEMMs per chunk of
    tokens + the library's cross-entropy kernels, gradients computed in the forward), or
    ``"auto"``: the library's op where it runs on this device, otherwise chunked.
    Returns a float32 scalar."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    H = hidden.shape[-1]
    hidden = hidden.reshape(-1, H)
    shift_labels = shift_labels.reshape(-1).to(hidden.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    if impl == "library" or (impl == "auto" and _library_lce_usable(hidden.device)):
        loss = _library_lce()(hidden, weight, shift_labels, ignore_index=ignore_index,
                              reduction=reduction,
                              chunk_tokens=_lce_chunk_tokens(hidden.shape[0], weight.shape[0],
                                                             hidden.element_size()))
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        return loss
    if impl not in ("auto", "chunked", "library"):
        raise ValueError(f"ops_transformer.lm_head_loss: impl={impl!r}, expected 'auto', "
                         "'library' or 'chunked'")
    if num_items_in_batch is None:
        scale = 1.0 / (shift_labels != ignore_index).sum().to(torch.float32)
    elif torch.is_tensor(num_items_in_batch):
        scale = 1.0 / num_items_in_batch.to(device=hidden.device, dtype=torch.float32)
    else:
        scale = torch.full((), 1.0 / num_items_in_batch, dtype=torch.float32,
                           device=hidden.device)
    grad = torch.is_grad_enabled()
    rows = chunk_rows or _lm_chunk_rows(hidden.shape[0], weight.shape[0])
    loss, _, _ = _lm_head_loss_chunked(hidden, weight, shift_labels, scale, int(ignore_index),
                                       int(rows), bool(grad and hidden.requires_grad),
                                       bool(grad and weight.requires_grad))
    return loss


def _lm_head_forward(self, hidden_states):
    # The list a patched causal-LM forward computing the fused loss hangs on its lm_head
    # (None otherwise). Module state, not thread or trace state: after a graph break the
    # causal-LM forward and the lm_head may run one eagerly and the other compiled, and
    # both must see the same list.
    box = self._ot_capture
    if box is not None:
        # The patched causal-LM forward computes the loss from these hidden states with
        # the fused op; HF's forward gets an empty [..., 0] tensor as its logits.
        box.append(hidden_states)
        return hidden_states.new_empty(tuple(hidden_states.shape[:-1]) + (0,))
    return self._ot_orig_forward(hidden_states)


def _fused_loss_reason(self, args, kwargs):
    """Why this call cannot use the fused LM-head loss (None when it can)."""
    if len(args) > 1:
        return "positional arguments beyond input_ids"
    if kwargs.get("return_dict") is False:
        return "return_dict=False"
    ltk = kwargs.get("logits_to_keep", kwargs.get("num_logits_to_keep", 0))
    if not (isinstance(ltk, int) and ltk == 0):
        return "logits_to_keep"
    head = self.lm_head
    if not getattr(head, "_ot_patched", False) or getattr(head, "bias", None) is not None:
        return "an lm_head with a bias"
    dev = head.weight.device
    if torch.is_autocast_enabled(dev.type) if dev.type in ("cpu", "cuda") else False:
        return "autocast"
    for k in ("label_smoothing",):
        if kwargs.get(k):
            return k
    if not _usable("cross_entropy", dev, head.weight.dtype):
        return "the library's cross-entropy is unusable on this device"
    return None


def _causal_lm_forward(self, *args, **kwargs):
    labels = kwargs.get("labels")
    skip = kwargs.pop("skip_logits", None)
    if skip is None:
        skip = self.training and labels is not None
    if not skip or labels is None:
        return self._ot_orig_forward(*args, **kwargs)
    reason = _fused_loss_reason(self, args, kwargs)
    if reason is not None:
        _log_once("lm_loss:" + reason, f"fused LM-head loss not used ({reason}): the logits "
                  "are materialized")
        return self._ot_orig_forward(*args, **kwargs)
    kwargs["labels"] = None
    box = []
    head = self.lm_head
    prev = head._ot_capture
    head._ot_capture = box
    try:
        out = self._ot_orig_forward(*args, **kwargs)
    finally:
        head._ot_capture = prev
    if len(box) != 1:
        raise RuntimeError("ops_transformer: the patched lm_head was not called exactly once "
                           f"in {type(self).__name__}.forward ({len(box)} calls)")
    hidden = box[0]
    weight = self.lm_head.weight
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    loss = lm_head_loss(hidden, weight, labels,
                        ignore_index=kwargs.get("ignore_index", -100),
                        num_items_in_batch=kwargs.get("num_items_in_batch"),
                        shift_labels=kwargs.get("shift_labels"),
                        impl=getattr(self, "_ot_lm_loss_impl", "auto"))
    fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    return type(out)(loss=loss, logits=None, **fields)


# ---------------------------------------------------------------------------------
# patch / unpatch
# ---------------------------------------------------------------------------------

_MISSING = object()


def _set_forward(module, fn, log, compiled_lib=None):
    """module.forward = fn; compiled_lib (norms, attention, MLPs): whether its library op
    runs under torch.compile (patch_model's compiled_ops), module._ot_compiled_lib."""
    old = module.__dict__.get("forward", _MISSING)
    module._ot_orig_forward = module.forward           # bound method (class or instance)
    module.forward = types.MethodType(fn, module)
    module._ot_patched = True
    log.append(("forward", module, old))
    if compiled_lib is not None:
        module._ot_compiled_lib = compiled_lib
        log.append(("attr", module, "_ot_compiled_lib"))


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


# The library's elementwise ops that run under torch.compile by default
# (patch_model(compiled_ops="auto")); the others run torch's code there, which inductor
# fuses with its neighbours. All three: the fastest set in the per-op A/B on the H200
# (bench/bench_training.py --only 3, run of 6c0e246, 0.54 B 4 x 2048 compiled per layer,
# medians of 20 steps against HF sdpa + torch.compile's 50.79 ms: all three 46.44 ms,
# torch's RoPE 46.78, torch's SwiGLU 46.93, torch's RMSNorm 47.51, none 47.42;
# docs/PERFORMANCE.md, "Training (CUDA)").
COMPILED_OPS_AUTO = ("rms_norm", "rope", "swiglu")
_COMPILED_OPS = ("rms_norm", "rope", "swiglu")


def _compiled_ops(value):
    """patch_model's ``compiled_ops`` as a frozenset of op names."""
    if isinstance(value, str):
        named = {"auto": COMPILED_OPS_AUTO, "all": _COMPILED_OPS, "none": ()}
        if value not in named:
            raise ValueError(f"ops_transformer.patch_model: compiled_ops={value!r}, expected "
                             "'auto', 'all', 'none' or a collection of "
                             f"{', '.join(repr(o) for o in _COMPILED_OPS)}")
        value = named[value]
    try:
        ops = frozenset(value)
    except TypeError:
        raise TypeError("ops_transformer.patch_model: compiled_ops must be 'auto', 'all', "
                        f"'none' or a collection of op names, got {type(value).__name__}") \
            from None
    bad = sorted(str(o) for o in ops - set(_COMPILED_OPS))
    if bad:
        raise ValueError(f"ops_transformer.patch_model: compiled_ops: unknown op(s) "
                         f"{', '.join(bad)} (known: {', '.join(_COMPILED_OPS)})")
    return ops


def patch_model(model, *, rms_norm=True, fuse_residual=True, attention=True, rope=True,
                swiglu=True, loss=True, fused_lm_loss=True, lm_loss_impl="auto",
                compiled_ops="auto"):
    """Route a HF ``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen2ForCausalLM``
    (or their base ``*Model``) through ops_transformer's ops, in place; returns the
    model. Given the class instead (``patch_model(LlamaForCausalLM)``, before
    construction), every instance of exactly that class constructed afterwards --
    ``from_pretrained`` included -- is patched at the end of its ``__init__``. Each keyword turns one replacement off (``rope=False`` keeps HF's rotary
    code and its own attention interface call; ``attention=False`` keeps HF's attention
    entirely). See the module docstring for what is replaced and when HF's code still
    runs. :func:`unpatch` restores the model exactly.

    ``fused_lm_loss=False`` keeps the lm_head (logits materialized, the loss still the
    library's cross-entropy); ``lm_loss_impl`` picks the fused loss's implementation
    (``"auto"``, ``"library"``, ``"chunked"``: see :func:`lm_head_loss`).

    ``compiled_ops`` picks which of the patched elementwise ops run the library's
    kernels while torch.compile traces the model: a collection of ``"rms_norm"`` (the
    norms and the fused residual add), ``"rope"``, ``"swiglu"``, or ``"all"``,
    ``"none"``, ``"auto"`` (the default: :data:`COMPILED_OPS_AUTO`, all three: the
    fastest set measured on the H200). An op left out runs torch's code under
    torch.compile -- HF's RMSNorm (after a plain residual add), HF's rotary math in the
    patch's layout, ``down(act(gate) * up)`` -- which inductor fuses with its neighbours;
    eager calls always run the library's kernels (as the other keywords select them).
    """
    ops = _compiled_ops(compiled_ops)
    if isinstance(model, type):
        return _patch_class(model, dict(rms_norm=rms_norm, fuse_residual=fuse_residual,
                                        attention=attention, rope=rope, swiglu=swiglu,
                                        loss=loss, fused_lm_loss=fused_lm_loss,
                                        lm_loss_impl=lm_loss_impl, compiled_ops=ops))
    if lm_loss_impl not in ("auto", "library", "chunked"):
        raise ValueError(f"ops_transformer.patch_model: lm_loss_impl={lm_loss_impl!r}, "
                         "expected 'auto', 'library' or 'chunked'")
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
            _set_forward(m, _rms_norm_forward, log, "rms_norm" in ops)
        elif kind == "layer" and fuse_residual and rms_norm:
            _set_forward(m, _decoder_layer_forward, log)
        elif kind == "attn" and attention and rope:
            _set_forward(m, _attention_forward, log, "rope" in ops)
        elif kind == "mlp" and swiglu and silu:
            _set_forward(m, _mlp_forward, log, "swiglu" in ops)
        elif kind == "base" and attention:
            _set_forward(m, _base_model_forward, log)
    if loss and hasattr(model, "lm_head"):
        log.append(("loss", model, model.__dict__.get("_loss_function", _MISSING)))
        model.loss_function = ot_causal_lm_loss
        head = model.lm_head
        if fused_lm_loss and isinstance(head, torch.nn.Linear) and head.bias is None:
            _set_forward(head, _lm_head_forward, log)
            log.append(("attr", head, "_ot_capture"))
            head._ot_capture = None
            _set_forward(model, _causal_lm_forward, log)
            log.append(("attr", model, "_ot_lm_loss_impl"))
            model._ot_lm_loss_impl = lm_loss_impl
            if lm_loss_impl == "auto":       # decided eagerly (torch.compile reuses it)
                devices = {head.weight.device.type} & {"cpu", "cuda"}   # not meta
                if torch.cuda.is_available():
                    devices.add("cuda")
                for d in sorted(devices):
                    _library_lce_usable(torch.device(d))
    model._ot_patch_log = log
    _probe_model_devices(model)
    return model


def _probe_model_devices(model):
    """Probe the library's ops eagerly (torch.compile then reuses the answers) on the
    model's device and on CUDA when present, for the model's dtype and head dim."""
    try:
        p = next(model.parameters())
    except StopIteration:
        return
    cfg = model.config
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ratio = cfg.num_attention_heads // (getattr(cfg, "num_key_value_heads", None)
                                        or cfg.num_attention_heads)
    devices = {p.device}
    if torch.cuda.is_available():
        devices.add(torch.device("cuda", torch.cuda.current_device()))
    dtypes = {p.dtype, torch.bfloat16}
    # the attention keys the layers will ask for: a config-wide sliding window (Mistral,
    # Qwen2) is part of the key, and a probe made inside the first forward would run
    # there (under torch.compile it would not run at all)
    windows = {None}
    if getattr(cfg, "sliding_window", None):
        windows.add(_window(cfg.sliding_window))
    for dev in devices:
        if dev.type != "cuda":       # the CPU backend has every op; meta runs nothing
            continue
        for dt in dtypes:
            for op in ("rms_norm", "rms_norm_residual", "swiglu", "cross_entropy"):
                _usable(op, dev, dt)
            _usable("rope", dev, dt, (D,))
            if _fused_attention():
                for window in windows:
                    _usable("attention", dev, dt, (D, ratio, True, window))
            if _fused_attention() == "auto":
                _probe_auto(dev, dt, D, cfg.num_attention_heads,
                            cfg.num_attention_heads // ratio,
                            _probe_lengths(getattr(cfg, "max_position_embeddings", None)))


def _probe_lengths(max_len):
    """The lengths patch_model probes 'auto' at: 64, 128, ... up to min(max_len, 16384)
    (one per length bucket; the probe tensors are [1, S, H, D])."""
    cap = min(int(max_len or 64), 16384)
    out, S = [], 64
    while S <= cap or not out:
        out.append(S)
        S *= 2
    return tuple(out)


def _probe_auto(device, dtype, D, Hq, Hkv, lengths=(64,)):
    """fused_attention='auto': decide for the model's attention shape now (eagerly:
    torch.compile then reads the decisions), at each length in `lengths` (one decision
    per length bucket), on uninitialized [1, S, H, D] tensors (no device work). Lengths
    already decided under torch's current SDPA flags allocate nothing; the others share
    one q and one k / v allocation of the longest of them (each length's tensors are
    leading slices, viewed with the sizes and strides of fresh ones: torch's
    backend choice looks at those, and a FakeTensor's answer differs -- MATH where the
    H200 answers CUDNN, run of 8ca13d3). (Before: two allocations per length, up to
    [1, 16384, Hq, D] each.)"""
    try:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        flags = _sdpa_flags()
        todo = []
        for S in lengths:
            got = _AUTO.get((dev.type, dev.index, dtype, D, Hq, Hkv, True, _len_bucket(S)))
            if got is None or got[2] != flags:
                todo.append(S)
        if not todo:
            return
        n = max(todo)
        qbuf = torch.empty(n * Hq * D, device=dev, dtype=dtype)
        kvbuf = torch.empty(n * Hkv * D, device=dev, dtype=dtype)
        with torch.enable_grad():
            for S in todo:
                q = qbuf[:S * Hq * D].view(1, S, Hq, D).detach().requires_grad_()
                kv = kvbuf[:S * Hkv * D].view(1, S, Hkv, D)
                _auto_library(q, kv, kv, True, D ** -0.5, None, None)
    except Exception as e:  # noqa: BLE001  (no decision stored: torch's SDPA when compiled)
        _log_once("probe_auto", f"config.fused_attention='auto': no decision for D {D}, "
                  f"{Hq} / {Hkv} heads on {device}: {type(e).__name__}: {e}")


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
        elif what == "attr":
            obj.__dict__.pop(old, None)
        elif what == "loss":
            if old is _MISSING:
                del obj._loss_function
            else:
                obj._loss_function = old
    del model._ot_patch_log
    return model
