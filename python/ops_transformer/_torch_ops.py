"""torch.library registration: ``torch.ops.ops_transformer.*``.

Every op is a custom op with a fake (meta) implementation, so torch.compile and
FakeTensor tracing see its output shapes without running it, and the forward ops have
autograd formulas that call the library's own backward ops -- also custom ops, so a
compiled graph's backward runs them too.

The ops never return None: where an output does not exist (no residual, no weight) an
empty tensor of shape [0] stands in.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C

_LIB = "ops_transformer"


def _dense(t):
    # contiguous() keeps the strides of an empty tensor (e.g. an expanded [0, H]
    # gradient with stride 0), which the C library's stride check refuses.
    return t.new_empty(t.shape) if t.numel() == 0 else t.contiguous()


def _last_dim_contiguous(t):
    if t is None:
        return None
    if t.dim() > 0 and t.stride(-1) != 1:
        return _dense(t)
    return t


def _grad(t):
    """Autograd's incoming gradient, densified (it may be expanded or strided)."""
    return None if t is None else _dense(t)


def _none0(t, like):
    return t if t is not None else like.new_empty(0)


def _dense_or_zeros(g, like):
    """An output's incoming gradient densified, or contiguous zeros shaped like the
    output (`like`) where none reached it. The eager path's Functions (:data:`eager`) of
    the ops with outputs that are never differentiated (rstd, mean, lse,
    linear_cross_entropy's gradients) turn off torch's zeros for every output without a
    gradient; their backward formulas make zeros only for an output they read (the
    custom ops' autograd always passes tensors: the same values)."""
    return _dense(g) if g is not None else torch.zeros_like(
        like, memory_format=torch.contiguous_format)


def _pick(ctx, op, impl):
    """The backward op a backward formula calls: the custom op (torch.compile's graphs
    and the custom ops' own autograd), or its plain implementation when the forward ran
    through the eager path (:data:`eager`) -- except under create_graph=True (grad mode
    on in a backward), where only the custom op records the node that refuses a double
    backward (the implementation's outputs would silently carry no gradient)."""
    return impl if getattr(ctx, "_ot_eager", False) and not torch.is_grad_enabled() else op


# ---------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------

def _rms_norm_impl(x, residual, weight, eps):
    x, residual, weight = map(_last_dim_contiguous, (x, residual, weight))
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else None
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
    _C.rmsnorm_forward(None, x, residual, weight, eps, out, h, rstd)
    return out, _none0(h, x), rstd


@torch.library.custom_op(f"{_LIB}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
             eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return _rms_norm_impl(x, residual, weight, eps)


@rms_norm.register_fake
def _(x, residual, weight, eps):
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else x.new_empty(0)
    return out, h, x.new_empty(x.shape[:-1], dtype=torch.float32)


def _rms_norm_backward_impl(dy, dresidual_out, h, weight, rstd, eps):
    h, weight = map(_last_dim_contiguous, (h, weight))
    dx = torch.empty_like(h, memory_format=torch.contiguous_format)
    dw = torch.empty_like(weight) if weight is not None else None
    _C.rmsnorm_backward(None, dy, dresidual_out, h, weight, rstd, eps, dx, dw)
    return dx, _none0(dw, h)


@torch.library.custom_op(f"{_LIB}::rms_norm_backward", mutates_args=())
def rms_norm_backward(dy: Tensor, dresidual_out: Optional[Tensor], h: Tensor,
                      weight: Optional[Tensor], rstd: Tensor,
                      eps: float) -> tuple[Tensor, Tensor]:
    return _rms_norm_backward_impl(dy, dresidual_out, h, weight, rstd, eps)


@rms_norm_backward.register_fake
def _(dy, dresidual_out, h, weight, rstd, eps):
    dw = torch.empty_like(weight) if weight is not None else h.new_empty(0)
    return torch.empty_like(h, memory_format=torch.contiguous_format), dw


def _rms_setup(ctx, inputs, output):
    x, residual, weight, eps = inputs
    out, h, rstd = output
    ctx.has_residual = residual is not None
    ctx.eps = eps
    ctx.save_for_backward(h if residual is not None else x, weight, rstd)
    ctx.mark_non_differentiable(rstd)


def _rms_backward(ctx, dout, dh, drstd):
    h, weight, rstd = ctx.saved_tensors
    # An unused h with a residual still adds zeros: the kernel's + 0 turns a -0 of dx
    # into +0 as on the custom op (no dresidual_out would leave it: not bitwise).
    dres = _dense_or_zeros(dh, h) if ctx.has_residual else None
    dy = _dense_or_zeros(dout, h)
    dx, dw = _pick(ctx, rms_norm_backward, _rms_norm_backward_impl)(dy, dres, h, weight, rstd, ctx.eps)
    return dx, (dx if ctx.has_residual else None), (dw if weight is not None else None), None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


# ---------------------------------------------------------------------------------
# LayerNorm
# ---------------------------------------------------------------------------------

def _layer_norm_impl(x, residual, weight, bias, eps):
    x, residual, weight, bias = map(_last_dim_contiguous, (x, residual, weight, bias))
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else None
    mean = x.new_empty(x.shape[:-1], dtype=torch.float32)
    rstd = torch.empty_like(mean)
    _C.layernorm_forward(None, x, residual, weight, bias, eps, out, h, mean, rstd)
    return out, _none0(h, x), mean, rstd


@torch.library.custom_op(f"{_LIB}::layer_norm", mutates_args=())
def layer_norm(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
               bias: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _layer_norm_impl(x, residual, weight, bias, eps)


@layer_norm.register_fake
def _(x, residual, weight, bias, eps):
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else x.new_empty(0)
    mean = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return out, h, mean, torch.empty_like(mean)


def _layer_norm_backward_impl(dy, dresidual_out, h, weight, mean, rstd, eps, need_dbias):
    h, weight = map(_last_dim_contiguous, (h, weight))
    dx = torch.empty_like(h, memory_format=torch.contiguous_format)
    dw = torch.empty_like(weight) if weight is not None else None
    db = h.new_empty(h.shape[-1:]) if need_dbias else None
    _C.layernorm_backward(None, dy, dresidual_out, h, weight, mean, rstd, eps, dx,
                          dw, db)
    return dx, _none0(dw, h), _none0(db, h)


@torch.library.custom_op(f"{_LIB}::layer_norm_backward", mutates_args=())
def layer_norm_backward(dy: Tensor, dresidual_out: Optional[Tensor], h: Tensor,
                        weight: Optional[Tensor], mean: Tensor, rstd: Tensor, eps: float,
                        need_dbias: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _layer_norm_backward_impl(dy, dresidual_out, h, weight, mean, rstd, eps, need_dbias)


@layer_norm_backward.register_fake
def _(dy, dresidual_out, h, weight, mean, rstd, eps, need_dbias):
    dw = torch.empty_like(weight) if weight is not None else h.new_empty(0)
    db = h.new_empty(h.shape[-1:]) if need_dbias else h.new_empty(0)
    return torch.empty_like(h, memory_format=torch.contiguous_format), dw, db


def _ln_setup(ctx, inputs, output):
    x, residual, weight, bias, eps = inputs
    out, h, mean, rstd = output
    ctx.has_residual = residual is not None
    ctx.has_bias = bias is not None
    ctx.eps = eps
    ctx.save_for_backward(h if residual is not None else x, weight, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _ln_backward(ctx, dout, dh, dmean, drstd):
    h, weight, mean, rstd = ctx.saved_tensors
    dres = _dense_or_zeros(dh, h) if ctx.has_residual else None    # (as in _rms_backward)
    dy = _dense_or_zeros(dout, h)
    dx, dw, db = _pick(ctx, layer_norm_backward, _layer_norm_backward_impl)(dy, dres, h, weight, mean, rstd, ctx.eps,
                                     ctx.has_bias)
    return (dx, dx if ctx.has_residual else None, dw if weight is not None else None,
            db if ctx.has_bias else None, None)


layer_norm.register_autograd(_ln_backward, setup_context=_ln_setup)


# ---------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------

def _rope_impl(q, k, positions, cos_sin_cache, mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high, llama3_original_max_position):
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    qo = torch.empty_like(q, memory_format=torch.contiguous_format)
    ko = torch.empty_like(k, memory_format=torch.contiguous_format) if k is not None else None
    _C.rope_forward(None, mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high,
                    llama3_original_max_position, q, k, positions, cos_sin_cache, qo, ko)
    return qo, _none0(ko, q)


@torch.library.custom_op(f"{_LIB}::rope", mutates_args=())
def rope(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor],
         mode: int, rotary_dim: int, theta: float, llama3_factor: float, llama3_low: float,
         llama3_high: float, llama3_original_max_position: int) -> tuple[Tensor, Tensor]:
    return _rope_impl(q, k, positions, cos_sin_cache, mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high, llama3_original_max_position)


@rope.register_fake
def _(q, k, positions, cos_sin_cache, *params):
    qo = torch.empty_like(q, memory_format=torch.contiguous_format)
    ko = torch.empty_like(k, memory_format=torch.contiguous_format) if k is not None \
        else q.new_empty(0)
    return qo, ko


def _rope_backward_impl(dq_out, dk_out, positions, cos_sin_cache, mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high, llama3_original_max_position):
    dq = torch.empty_like(dq_out)
    dk = torch.empty_like(dk_out) if dk_out is not None else None
    _C.rope_backward(None, mode, rotary_dim, theta, llama3_factor, llama3_low,
                     llama3_high, llama3_original_max_position, dq_out, dk_out, positions,
                     cos_sin_cache, dq, dk)
    return dq, _none0(dk, dq_out)


@torch.library.custom_op(f"{_LIB}::rope_backward", mutates_args=())
def rope_backward(dq_out: Tensor, dk_out: Optional[Tensor], positions: Tensor,
                  cos_sin_cache: Optional[Tensor], mode: int, rotary_dim: int, theta: float,
                  llama3_factor: float, llama3_low: float, llama3_high: float,
                  llama3_original_max_position: int) -> tuple[Tensor, Tensor]:
    return _rope_backward_impl(dq_out, dk_out, positions, cos_sin_cache, mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high, llama3_original_max_position)


@rope_backward.register_fake
def _(dq_out, dk_out, positions, cos_sin_cache, *params):
    dk = torch.empty_like(dk_out) if dk_out is not None else dq_out.new_empty(0)
    return torch.empty_like(dq_out), dk


def _rope_setup(ctx, inputs, output):
    q, k, positions, cache = inputs[:4]
    ctx.params = inputs[4:]
    ctx.has_k = k is not None
    ctx.save_for_backward(positions, cache)


def _rope_bwd(ctx, dqo, dko):
    positions, cache = ctx.saved_tensors
    dko = _grad(dko) if ctx.has_k else None
    dq, dk = _pick(ctx, rope_backward, _rope_backward_impl)(_grad(dqo), dko, positions, cache, *ctx.params)
    return (dq, dk if ctx.has_k else None) + (None,) * (2 + len(ctx.params))


rope.register_autograd(_rope_bwd, setup_context=_rope_setup)


# ---------------------------------------------------------------------------------
# Gated activations
# ---------------------------------------------------------------------------------

def _glu_out_shape(gate, up):
    if up is None:
        return tuple(gate.shape[:-1]) + (gate.shape[-1] // 2,)
    return tuple(gate.shape)


def _glu_impl(gate, up, kind):
    gate, up = _last_dim_contiguous(gate), _last_dim_contiguous(up)
    out = gate.new_empty(_glu_out_shape(gate, up))
    _C.glu_forward(None, kind, gate, up, out)
    return out


@torch.library.custom_op(f"{_LIB}::glu", mutates_args=())
def glu(gate: Tensor, up: Optional[Tensor], kind: int) -> Tensor:
    return _glu_impl(gate, up, kind)


@glu.register_fake
def _(gate, up, kind):
    return gate.new_empty(_glu_out_shape(gate, up))


def _glu_backward_impl(dout, gate, up, kind):
    dgate = torch.empty_like(gate, memory_format=torch.contiguous_format)
    dup = torch.empty_like(up, memory_format=torch.contiguous_format) if up is not None \
        else None
    _C.glu_backward(None, kind, dout, gate, up, dgate, dup)
    return dgate, _none0(dup, gate)


@torch.library.custom_op(f"{_LIB}::glu_backward", mutates_args=())
def glu_backward(dout: Tensor, gate: Tensor, up: Optional[Tensor],
                 kind: int) -> tuple[Tensor, Tensor]:
    return _glu_backward_impl(dout, gate, up, kind)


@glu_backward.register_fake
def _(dout, gate, up, kind):
    dup = torch.empty_like(up, memory_format=torch.contiguous_format) if up is not None \
        else gate.new_empty(0)
    return torch.empty_like(gate, memory_format=torch.contiguous_format), dup


def _glu_backward_recompute_impl(dout, gate, up, kind):
    """glu_backward plus the forward's output act(gate) * up (bit for bit glu's), from
    the same reads: for a backward that needs the product again (the next projection's
    weight gradient) without having kept it."""
    dgate = torch.empty_like(gate, memory_format=torch.contiguous_format)
    dup = torch.empty_like(up, memory_format=torch.contiguous_format) if up is not None \
        else None
    out = dout.new_empty(_glu_out_shape(gate, up))
    _C.glu_backward_recompute(None, kind, dout, gate, up, dgate, dup, out)
    return dgate, _none0(dup, gate), out


@torch.library.custom_op(f"{_LIB}::glu_backward_recompute", mutates_args=())
def glu_backward_recompute(dout: Tensor, gate: Tensor, up: Optional[Tensor],
                           kind: int) -> tuple[Tensor, Tensor, Tensor]:
    return _glu_backward_recompute_impl(dout, gate, up, kind)


@glu_backward_recompute.register_fake
def _(dout, gate, up, kind):
    dup = torch.empty_like(up, memory_format=torch.contiguous_format) if up is not None \
        else gate.new_empty(0)
    return (torch.empty_like(gate, memory_format=torch.contiguous_format), dup,
            dout.new_empty(_glu_out_shape(gate, up)))


def _glu_setup(ctx, inputs, output):
    gate, up, kind = inputs
    ctx.kind = kind
    ctx.has_up = up is not None
    ctx.save_for_backward(_last_dim_contiguous(gate), _last_dim_contiguous(up))


def _glu_bwd(ctx, dout):
    gate, up = ctx.saved_tensors
    dgate, dup = _pick(ctx, glu_backward, _glu_backward_impl)(_grad(dout), gate, up, ctx.kind)
    return dgate, (dup if ctx.has_up else None), None


glu.register_autograd(_glu_bwd, setup_context=_glu_setup)


# ---------------------------------------------------------------------------------
# Softmax and cross-entropy
# ---------------------------------------------------------------------------------

def _softmax_impl(x):
    x = _last_dim_contiguous(x)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _C.softmax_forward(None, x, out)
    return out


@torch.library.custom_op(f"{_LIB}::softmax", mutates_args=())
def softmax(x: Tensor) -> Tensor:
    return _softmax_impl(x)


@softmax.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _softmax_backward_impl(dy, y):
    dx = torch.empty_like(y, memory_format=torch.contiguous_format)
    _C.softmax_backward(None, dy, y, dx)
    return dx


@torch.library.custom_op(f"{_LIB}::softmax_backward", mutates_args=())
def softmax_backward(dy: Tensor, y: Tensor) -> Tensor:
    return _softmax_backward_impl(dy, y)


@softmax_backward.register_fake
def _(dy, y):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_bwd(ctx, dy):
    (y,) = ctx.saved_tensors
    return _pick(ctx, softmax_backward, _softmax_backward_impl)(_grad(dy), y)


softmax.register_autograd(_softmax_bwd, setup_context=_softmax_setup)


def _ce_loss_shape(logits, reduction):
    return (logits.shape[0],) if reduction == 2 else ()


def _cross_entropy_impl(logits, labels, ignore_index, label_smoothing, reduction):
    logits = _last_dim_contiguous(logits)
    loss = logits.new_empty(_ce_loss_shape(logits, reduction), dtype=torch.float32)
    lse = logits.new_empty(logits.shape[:1], dtype=torch.float32)
    _C.cross_entropy_forward(None, ignore_index, label_smoothing, reduction, logits,
                             labels, loss, lse)
    return loss, lse


@torch.library.custom_op(f"{_LIB}::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int, label_smoothing: float,
                  reduction: int) -> tuple[Tensor, Tensor]:
    return _cross_entropy_impl(logits, labels, ignore_index, label_smoothing, reduction)


@cross_entropy.register_fake
def _(logits, labels, ignore_index, label_smoothing, reduction):
    loss = logits.new_empty(_ce_loss_shape(logits, reduction), dtype=torch.float32)
    return loss, logits.new_empty(logits.shape[:1], dtype=torch.float32)


def _cross_entropy_backward_impl(dloss, logits, labels, lse, ignore_index, label_smoothing, reduction):
    dlogits = torch.empty_like(logits, memory_format=torch.contiguous_format)
    _C.cross_entropy_backward(None, ignore_index, label_smoothing, reduction,
                              dloss, logits, labels, lse, dlogits)
    return dlogits


@torch.library.custom_op(f"{_LIB}::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(dloss: Tensor, logits: Tensor, labels: Tensor, lse: Tensor,
                           ignore_index: int, label_smoothing: float,
                           reduction: int) -> Tensor:
    return _cross_entropy_backward_impl(dloss, logits, labels, lse, ignore_index, label_smoothing, reduction)


@cross_entropy_backward.register_fake
def _(dloss, logits, labels, lse, ignore_index, label_smoothing, reduction):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _ce_setup(ctx, inputs, output):
    logits, labels, ignore_index, label_smoothing, reduction = inputs
    ctx.params = (ignore_index, label_smoothing, reduction)
    ctx.save_for_backward(_last_dim_contiguous(logits), labels, output[1])
    ctx.mark_non_differentiable(output[1])


def _ce_bwd(ctx, dloss, dlse):
    logits, labels, lse = ctx.saved_tensors
    if dloss is None:       # (eager path: see _dense_or_zeros)
        dloss = logits.new_zeros(_ce_loss_shape(logits, ctx.params[2]), dtype=torch.float32)
    dloss = _grad(dloss).to(torch.float32)
    ce_bwd = _pick(ctx, cross_entropy_backward, _cross_entropy_backward_impl)
    return ce_bwd(dloss, logits, labels, lse, *ctx.params), None, None, None, None


cross_entropy.register_autograd(_ce_bwd, setup_context=_ce_setup)


# ---------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------

def _lse_shape(q):
    if q.dim() == 4:
        return (q.shape[0], q.shape[2], q.shape[1])
    return (q.shape[1], q.shape[0])


def _attention_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    q, k, v = map(_last_dim_contiguous, (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    _C.attention_forward(None, softmax_scale, causal, window_left, window_right, softcap,
                         deterministic, q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse)
    return out, lse


@torch.library.custom_op(f"{_LIB}::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], softmax_scale: float, causal: int,
              window_left: int, window_right: int, softcap: float,
              deterministic: int) -> tuple[Tensor, Tensor]:
    return _attention_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, deterministic)


@attention.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, *params):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(_lse_shape(q), dtype=torch.float32)


def _attention_backward_impl(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    _C.attention_backward(None, softmax_scale, causal, window_left, window_right, softcap,
                          deterministic, q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k,
                          dq, dk, dv)
    return dq, dk, dv


@torch.library.custom_op(f"{_LIB}::attention_backward", mutates_args=())
def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                       cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                       softmax_scale: float, causal: int, window_left: int, window_right: int,
                       softcap: float, deterministic: int) -> tuple[Tensor, Tensor, Tensor]:
    return _attention_backward_impl(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, deterministic)


@attention_backward.register_fake
def _(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, *params):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _attn_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    ctx.params = inputs[5:]
    out, lse = output
    ctx.save_for_backward(*map(_last_dim_contiguous, (q, k, v)), out, lse, cu_q, cu_k)
    ctx.mark_non_differentiable(lse)


def _attn_bwd(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    bwd = _pick(ctx, attention_backward, _attention_backward_impl)
    dq, dk, dv = bwd(q, k, v, out, _dense_or_zeros(dout, out), lse, cu_q, cu_k, *ctx.params)
    return (dq, dk, dv) + (None,) * (2 + len(ctx.params))


attention.register_autograd(_attn_bwd, setup_context=_attn_setup)


# ---------------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------------

def _linear_impl(x, weight, bias):
    x = _last_dim_contiguous(x)
    weight = weight.contiguous()
    y = x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))
    _C.linear_forward(None, x, weight, bias, y)
    return y


@torch.library.custom_op(f"{_LIB}::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return _linear_impl(x, weight, bias)


@linear.register_fake
def _(x, weight, bias):
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


def _linear_backward_impl(dy, x, weight, need_dx, need_dweight, need_dbias):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else None
    dw = torch.empty_like(weight) if need_dweight else None
    db = dy.new_empty(dy.shape[-1:]) if need_dbias else None
    _C.linear_backward(None, dy, x, weight, dx, dw, db)
    return _none0(dx, x), _none0(dw, x), _none0(db, x)


@torch.library.custom_op(f"{_LIB}::linear_backward", mutates_args=())
def linear_backward(dy: Tensor, x: Tensor, weight: Tensor, need_dx: bool, need_dweight: bool,
                    need_dbias: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _linear_backward_impl(dy, x, weight, need_dx, need_dweight, need_dbias)


@linear_backward.register_fake
def _(dy, x, weight, need_dx, need_dweight, need_dbias):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx \
        else x.new_empty(0)
    dw = torch.empty_like(weight) if need_dweight else x.new_empty(0)
    db = dy.new_empty(dy.shape[-1:]) if need_dbias else x.new_empty(0)
    return dx, dw, db


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(_last_dim_contiguous(x), weight.contiguous())


def _linear_bwd(ctx, dy):
    x, weight = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad
    dx, dw, db = _pick(ctx, linear_backward, _linear_backward_impl)(_grad(dy), x, weight, need_dx, need_dw,
                                 bool(need_db and ctx.has_bias))
    return (dx if need_dx else None, dw if need_dw else None,
            db if (need_db and ctx.has_bias) else None)


linear.register_autograd(_linear_bwd, setup_context=_linear_setup)


# ---------------------------------------------------------------------------------
# Fused linear + cross-entropy: the gradients are computed in the forward call (the
# logits never exist); the backward scales them by the incoming gradient.
# ---------------------------------------------------------------------------------

def _linear_cross_entropy_impl(hidden, weight, labels, ignore_index, label_smoothing, reduction, chunk_tokens, need_dhidden, need_dweight, accumulate_fp32):
    from .ops import _lce_workspace
    hidden = _last_dim_contiguous(hidden)
    weight = weight.contiguous()
    loss = hidden.new_empty(_ce_loss_shape(hidden, reduction), dtype=torch.float32)
    dh = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_dhidden \
        else hidden.new_empty(0)
    dw = (torch.empty_like(weight, dtype=torch.float32) if accumulate_fp32
          else torch.empty_like(weight)) if need_dweight else hidden.new_empty(0)
    ws = _lce_workspace(hidden, weight.shape[0], chunk_tokens)
    _C.linear_cross_entropy(None, ignore_index, label_smoothing, reduction, chunk_tokens,
                            hidden, weight, labels, loss, dh if need_dhidden else None,
                            dw if need_dweight else None, ws)
    del ws
    if need_dweight and accumulate_fp32:
        dw = dw.to(weight.dtype)
    return loss, dh, dw


@torch.library.custom_op(f"{_LIB}::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int,
                         label_smoothing: float, reduction: int, chunk_tokens: int,
                         need_dhidden: bool, need_dweight: bool,
                         accumulate_fp32: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _linear_cross_entropy_impl(hidden, weight, labels, ignore_index, label_smoothing, reduction, chunk_tokens, need_dhidden, need_dweight, accumulate_fp32)


@linear_cross_entropy.register_fake
def _(hidden, weight, labels, ignore_index, label_smoothing, reduction, chunk_tokens,
      need_dhidden, need_dweight, accumulate_fp32):
    loss = hidden.new_empty(_ce_loss_shape(hidden, reduction), dtype=torch.float32)
    dh = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_dhidden \
        else hidden.new_empty(0)
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dweight \
        else hidden.new_empty(0)
    return loss, dh, dw


def _lce_setup(ctx, inputs, output):
    ctx.need = (inputs[7], inputs[8])
    ctx.save_for_backward(output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _lce_bwd(ctx, dloss, ddh, ddw):
    dh, dw = ctx.saved_tensors
    # dloss None (eager path: see _dense_or_zeros): the loss is 0-d wherever the formula
    # applies ('mean' / 'sum'; ops.linear_cross_entropy refuses gradients for 'none').
    g = _grad(dloss).to(torch.float32) if dloss is not None else dh.new_zeros(
        (), dtype=torch.float32)
    gh = _scale(dh, g) if ctx.need[0] else None
    gw = _scale(dw, g) if ctx.need[1] else None
    return gh, gw, None, None, None, None, None, None, None, None


def _scale(t, g):
    """t * g (g: a 0-d float32 tensor on t's device) as a new tensor of t's dtype.

    On CUDA `t * g` is TensorIterator's non-vectorized kernel (g broadcast with stride 0;
    0.30-0.40 ms a step for the [V, H] and [T, H] bf16 gradients at 0.54 B, docs/
    PERFORMANCE.md Training); _foreach_mul reads g through a pointer and takes the
    vectorized multi-tensor kernel when g has t's dtype (else it falls back to `t * g`).
    Same values as `t * g` on CUDA, which loads g in the common dtype too (bf16 for a
    bf16 tensor and a 0-d float32 one: CUDALoops.cuh's fetch_and_cast): t times g rounded
    to t's dtype, in float32, rounded once. On the CPU `t * g` keeps g in float32: equal
    where g is a bf16 / fp16 value (1, powers of two), within a rounding of g otherwise.
    Out of place: the saved gradients stay as they are for a retain_graph backward."""
    return torch._foreach_mul([t], g.to(t.dtype))[0]


linear_cross_entropy.register_autograd(_lce_bwd, setup_context=_lce_setup)


# ---------------------------------------------------------------------------------
# Paged KV cache ops (inference: no autograd). kv_cache.py calls these only while
# torch.compile traces; otherwise it calls _C directly (less host time a call). (No
# argument is named `mode`: functionalizing a mutating op passes a `mode` of its own.) The
# appends write the pages and rotate q (and, for rope_kv_append, k_new) in place: the
# out-of-place forms are a copy into the output and the in-place op on it.
# ---------------------------------------------------------------------------------

def _kv_rope_params(rope, rope_mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high,
                    llama3_original_max_position):
    if not rope:
        return None
    return (rope_mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high,
            llama3_original_max_position)


@torch.library.custom_op(f"{_LIB}::kv_append", mutates_args=("k_pages", "v_pages", "q"))
def kv_append(k_pages: Tensor, v_pages: Tensor, k_new: Tensor, v_new: Tensor, indptr: Tensor,
              indices: Tensor, last_page_len: Tensor, cu_seqlens_new: Tensor,
              positions: Optional[Tensor], q: Optional[Tensor], rope: bool, rope_mode: int,
              rotary_dim: int, theta: float, llama3_factor: float, llama3_low: float,
              llama3_high: float, llama3_original_max_position: int) -> None:
    """Writes k_new, v_new into their pages; with rope, k (as written) and q (in place)
    rotated first."""
    _C.kv_append(None, _kv_rope_params(rope, rope_mode, rotary_dim, theta, llama3_factor,
                                       llama3_low, llama3_high, llama3_original_max_position),
                 k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_new, k_new,
                 v_new, positions, q, q, None)


@kv_append.register_fake
def _(k_pages, v_pages, k_new, v_new, indptr, indices, last_page_len, cu_seqlens_new,
      positions, q, *params):
    return None


@torch.library.custom_op(f"{_LIB}::rope_kv_append",
                         mutates_args=("k_pages", "v_pages", "q", "k_new"))
def rope_kv_append(k_pages: Tensor, v_pages: Tensor, q: Optional[Tensor], k_new: Tensor,
                   v_new: Tensor, indptr: Tensor, indices: Tensor, last_page_len: Tensor,
                   cu_seqlens_new: Tensor, positions: Optional[Tensor], rope_mode: int,
                   rotary_dim: int, theta: float, llama3_factor: float, llama3_low: float,
                   llama3_high: float, llama3_original_max_position: int) -> None:
    """Rotates q and k_new in place and writes the rotated k_new and v_new into their
    pages."""
    _C.kv_append(None, (rope_mode, rotary_dim, theta, llama3_factor, llama3_low,
                        llama3_high, llama3_original_max_position),
                 k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_new, k_new,
                 v_new, positions, q, q, k_new)


@rope_kv_append.register_fake
def _(k_pages, v_pages, q, k_new, v_new, indptr, indices, last_page_len, cu_seqlens_new,
      positions, *params):
    return None


def _paged_lse_shape(q):
    return (q.shape[1], q.shape[0]) if q.dim() == 3 else (0,)


@torch.library.custom_op(f"{_LIB}::paged_attention", mutates_args=())
def paged_attention(q: Tensor, k_pages: Tensor, v_pages: Tensor, indptr: Tensor,
                    indices: Tensor, last_page_len: Tensor, cu_seqlens_q: Tensor,
                    softmax_scale: float, causal: int, window_left: int, window_right: int,
                    softcap: float, return_lse: bool) -> tuple[Tensor, Tensor]:
    """(out, lse); lse is an empty [0] tensor unless return_lse."""
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(_paged_lse_shape(q) if return_lse else (0,), dtype=torch.float32)
    _C.paged_attention(None, softmax_scale, causal, window_left, window_right, softcap, 0,
                       q, cu_seqlens_q, k_pages, v_pages, indptr, indices, last_page_len,
                       out, lse if return_lse else None)
    return out, lse


@paged_attention.register_fake
def _(q, k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_q, softmax_scale,
      causal, window_left, window_right, softcap, return_lse):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(_paged_lse_shape(q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


# ---------------------------------------------------------------------------------
# The eager path: the same ops through torch.autograd.Function
# ---------------------------------------------------------------------------------
# A call of a custom op above goes through torch's dispatcher and torch.library's Python
# autograd wrapper (argument defaults, a generated autograd.Function, a redispatch) before
# it reaches the implementation: ~60-90 us of host time a forward call on a CPU where the
# implementation itself takes ~10 us (tests/python/test_patch.py measures it). Outside
# torch.compile the ops module calls `eager.<op>` instead: one autograd.Function whose
# forward is the implementation and whose backward is the same formula with the plain
# backward implementation -- the same results, the same saved tensors. Calls with any
# tensor argument that is not a plain dense tensor (fake, meta first argument, functional,
# other subclasses: a DTensor weight), under a TorchDispatchMode or a functorch
# transform (vmap, grad: a ctx-style autograd.Function is refused there), or while
# torch.compile traces keep the custom op.

def _eager_fn(name, impl, setup, backward, materialize_grads):
    def forward(ctx, *args):
        out = impl(*args)
        setup(ctx, args, out)
        ctx._ot_eager = True
        if not materialize_grads:
            ctx.set_materialize_grads(False)
        return out
    return type(f"{name}_eager", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


# The argument types the eager path takes: plain tensors -- nn.Parameter is one to
# dispatch (its __torch_function__ is disabled): the weights -- and None (an absent
# Tensor? argument). Any other subclass goes to the custom op.
_PLAIN_ARGS = frozenset((Tensor, torch.nn.Parameter, type(None)))


def _plain(t):
    """Whether a call whose first argument is t can take the eager path (checked first:
    not while torch.compile traces, so dynamo never sees the rest); the call's other
    tensor arguments must be plain too (_PLAIN_ARGS, :meth:`_Eager._make`)."""
    return (not torch.compiler.is_compiling()
            and (type(t) is Tensor or type(t) is torch.nn.Parameter)
            and t.device.type != "meta" and not torch._C._len_torch_dispatch_stack()
            and not torch._C._are_functorch_transforms_active())


class _Eager:
    """torch.ops.ops_transformer's differentiable ops with the custom ops' signatures and
    results, autograd through torch.autograd.Function (see above)."""

    def __init__(self):
        table = {"rms_norm": (rms_norm, _rms_norm_impl, _rms_setup, _rms_backward),
                 "layer_norm": (layer_norm, _layer_norm_impl, _ln_setup, _ln_backward),
                 "rope": (rope, _rope_impl, _rope_setup, _rope_bwd),
                 "glu": (glu, _glu_impl, _glu_setup, _glu_bwd),
                 "softmax": (softmax, _softmax_impl, _softmax_setup, _softmax_bwd),
                 "cross_entropy": (cross_entropy, _cross_entropy_impl, _ce_setup, _ce_bwd),
                 "attention": (attention, _attention_impl, _attn_setup, _attn_bwd),
                 "linear": (linear, _linear_impl, _linear_setup, _linear_bwd),
                 "linear_cross_entropy": (linear_cross_entropy, _linear_cross_entropy_impl,
                                          _lce_setup, _lce_bwd)}
        # These backward formulas take None for an output no gradient reached
        # (_dense_or_zeros). rope keeps torch's zeros (both outputs are differentiated;
        # a missing gradient of qo or ko still has to become a zero gradient of q or k);
        # glu, softmax and linear have one output.
        no_zeros = ("rms_norm", "layer_norm", "cross_entropy", "attention",
                    "linear_cross_entropy")
        for name, (op, impl, setup, backward) in table.items():
            fn = _eager_fn(name, impl, setup, backward, name not in no_zeros)
            setattr(self, name, self._make(op, fn.apply))

    @staticmethod
    def _make(op, apply):
        # The positions in *args of the op's other Tensor / Tensor? arguments (from its
        # schema): a subclass there (a DTensor weight next to a plain x, a
        # __torch_function__ subclass) takes the custom op, which dispatches it.
        tensor = torch._C.OptionalType.ofTensor()
        rest = tuple(i - 1 for i, a in enumerate(op._opoverload._schema.arguments)
                     if i and a.type.isSubtypeOf(tensor))

        def call(first, *args):
            if _plain(first):
                for i in rest:
                    if type(args[i]) not in _PLAIN_ARGS:
                        return op(first, *args)
                return apply(first, *args)
            return op(first, *args)
        call.__name__ = op.__name__ if hasattr(op, "__name__") else "op"
        return call

    def __getattr__(self, name):          # the backward ops and anything else
        return getattr(torch.ops.ops_transformer, name)


eager = _Eager()

