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


# ---------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
             eps: float) -> tuple[Tensor, Tensor, Tensor]:
    x, residual, weight = map(_last_dim_contiguous, (x, residual, weight))
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else None
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
    _C.rmsnorm_forward(None, x, residual, weight, eps, out, h, rstd)
    return out, _none0(h, x), rstd


@rms_norm.register_fake
def _(x, residual, weight, eps):
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else x.new_empty(0)
    return out, h, x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(f"{_LIB}::rms_norm_backward", mutates_args=())
def rms_norm_backward(dy: Tensor, dresidual_out: Optional[Tensor], h: Tensor,
                      weight: Optional[Tensor], rstd: Tensor,
                      eps: float) -> tuple[Tensor, Tensor]:
    h, weight = map(_last_dim_contiguous, (h, weight))
    dx = torch.empty_like(h, memory_format=torch.contiguous_format)
    dw = torch.empty_like(weight) if weight is not None else None
    _C.rmsnorm_backward(None, dy, dresidual_out, h, weight, rstd, eps, dx, dw)
    return dx, _none0(dw, h)


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
    dres = _grad(dh) if ctx.has_residual else None
    dx, dw = rms_norm_backward(_grad(dout), dres, h, weight, rstd, ctx.eps)
    return dx, (dx if ctx.has_residual else None), (dw if weight is not None else None), None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


# ---------------------------------------------------------------------------------
# LayerNorm
# ---------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::layer_norm", mutates_args=())
def layer_norm(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
               bias: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x, residual, weight, bias = map(_last_dim_contiguous, (x, residual, weight, bias))
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else None
    mean = x.new_empty(x.shape[:-1], dtype=torch.float32)
    rstd = torch.empty_like(mean)
    _C.layernorm_forward(None, x, residual, weight, bias, eps, out, h, mean, rstd)
    return out, _none0(h, x), mean, rstd


@layer_norm.register_fake
def _(x, residual, weight, bias, eps):
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(out) if residual is not None else x.new_empty(0)
    mean = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return out, h, mean, torch.empty_like(mean)


@torch.library.custom_op(f"{_LIB}::layer_norm_backward", mutates_args=())
def layer_norm_backward(dy: Tensor, dresidual_out: Optional[Tensor], h: Tensor,
                        weight: Optional[Tensor], mean: Tensor, rstd: Tensor, eps: float,
                        need_dbias: bool) -> tuple[Tensor, Tensor, Tensor]:
    h, weight = map(_last_dim_contiguous, (h, weight))
    dx = torch.empty_like(h, memory_format=torch.contiguous_format)
    dw = torch.empty_like(weight) if weight is not None else None
    db = h.new_empty(h.shape[-1:]) if need_dbias else None
    _C.layernorm_backward(None, dy, dresidual_out, h, weight, mean, rstd, eps, dx,
                          dw, db)
    return dx, _none0(dw, h), _none0(db, h)


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
    dres = _grad(dh) if ctx.has_residual else None
    dx, dw, db = layer_norm_backward(_grad(dout), dres, h, weight, mean, rstd, ctx.eps,
                                     ctx.has_bias)
    return (dx, dx if ctx.has_residual else None, dw if weight is not None else None,
            db if ctx.has_bias else None, None)


layer_norm.register_autograd(_ln_backward, setup_context=_ln_setup)


# ---------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::rope", mutates_args=())
def rope(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor],
         mode: int, rotary_dim: int, theta: float, llama3_factor: float, llama3_low: float,
         llama3_high: float, llama3_original_max_position: int) -> tuple[Tensor, Tensor]:
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    qo = torch.empty_like(q, memory_format=torch.contiguous_format)
    ko = torch.empty_like(k, memory_format=torch.contiguous_format) if k is not None else None
    _C.rope_forward(None, mode, rotary_dim, theta, llama3_factor, llama3_low, llama3_high,
                    llama3_original_max_position, q, k, positions, cos_sin_cache, qo, ko)
    return qo, _none0(ko, q)


@rope.register_fake
def _(q, k, positions, cos_sin_cache, *params):
    qo = torch.empty_like(q, memory_format=torch.contiguous_format)
    ko = torch.empty_like(k, memory_format=torch.contiguous_format) if k is not None \
        else q.new_empty(0)
    return qo, ko


@torch.library.custom_op(f"{_LIB}::rope_backward", mutates_args=())
def rope_backward(dq_out: Tensor, dk_out: Optional[Tensor], positions: Tensor,
                  cos_sin_cache: Optional[Tensor], mode: int, rotary_dim: int, theta: float,
                  llama3_factor: float, llama3_low: float, llama3_high: float,
                  llama3_original_max_position: int) -> tuple[Tensor, Tensor]:
    dq = torch.empty_like(dq_out)
    dk = torch.empty_like(dk_out) if dk_out is not None else None
    _C.rope_backward(None, mode, rotary_dim, theta, llama3_factor, llama3_low,
                     llama3_high, llama3_original_max_position, dq_out, dk_out, positions,
                     cos_sin_cache, dq, dk)
    return dq, _none0(dk, dq_out)


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
    dq, dk = rope_backward(_grad(dqo), dko, positions, cache, *ctx.params)
    return (dq, dk if ctx.has_k else None) + (None,) * (2 + len(ctx.params))


rope.register_autograd(_rope_bwd, setup_context=_rope_setup)


# ---------------------------------------------------------------------------------
# Gated activations
# ---------------------------------------------------------------------------------

def _glu_out_shape(gate, up):
    if up is None:
        return tuple(gate.shape[:-1]) + (gate.shape[-1] // 2,)
    return tuple(gate.shape)


@torch.library.custom_op(f"{_LIB}::glu", mutates_args=())
def glu(gate: Tensor, up: Optional[Tensor], kind: int) -> Tensor:
    gate, up = _last_dim_contiguous(gate), _last_dim_contiguous(up)
    out = gate.new_empty(_glu_out_shape(gate, up))
    _C.glu_forward(None, kind, gate, up, out)
    return out


@glu.register_fake
def _(gate, up, kind):
    return gate.new_empty(_glu_out_shape(gate, up))


@torch.library.custom_op(f"{_LIB}::glu_backward", mutates_args=())
def glu_backward(dout: Tensor, gate: Tensor, up: Optional[Tensor],
                 kind: int) -> tuple[Tensor, Tensor]:
    dgate = torch.empty_like(gate, memory_format=torch.contiguous_format)
    dup = torch.empty_like(up, memory_format=torch.contiguous_format) if up is not None \
        else None
    _C.glu_backward(None, kind, dout, gate, up, dgate, dup)
    return dgate, _none0(dup, gate)


@glu_backward.register_fake
def _(dout, gate, up, kind):
    dup = torch.empty_like(up, memory_format=torch.contiguous_format) if up is not None \
        else gate.new_empty(0)
    return torch.empty_like(gate, memory_format=torch.contiguous_format), dup


def _glu_setup(ctx, inputs, output):
    gate, up, kind = inputs
    ctx.kind = kind
    ctx.has_up = up is not None
    ctx.save_for_backward(_last_dim_contiguous(gate), _last_dim_contiguous(up))


def _glu_bwd(ctx, dout):
    gate, up = ctx.saved_tensors
    dgate, dup = glu_backward(_grad(dout), gate, up, ctx.kind)
    return dgate, (dup if ctx.has_up else None), None


glu.register_autograd(_glu_bwd, setup_context=_glu_setup)


# ---------------------------------------------------------------------------------
# Softmax and cross-entropy
# ---------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::softmax", mutates_args=())
def softmax(x: Tensor) -> Tensor:
    x = _last_dim_contiguous(x)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _C.softmax_forward(None, x, out)
    return out


@softmax.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::softmax_backward", mutates_args=())
def softmax_backward(dy: Tensor, y: Tensor) -> Tensor:
    dx = torch.empty_like(y, memory_format=torch.contiguous_format)
    _C.softmax_backward(None, dy, y, dx)
    return dx


@softmax_backward.register_fake
def _(dy, y):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_bwd(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_backward(_grad(dy), y)


softmax.register_autograd(_softmax_bwd, setup_context=_softmax_setup)


def _ce_loss_shape(logits, reduction):
    return (logits.shape[0],) if reduction == 2 else ()


@torch.library.custom_op(f"{_LIB}::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int, label_smoothing: float,
                  reduction: int) -> tuple[Tensor, Tensor]:
    logits = _last_dim_contiguous(logits)
    loss = logits.new_empty(_ce_loss_shape(logits, reduction), dtype=torch.float32)
    lse = logits.new_empty(logits.shape[:1], dtype=torch.float32)
    _C.cross_entropy_forward(None, ignore_index, label_smoothing, reduction, logits,
                             labels, loss, lse)
    return loss, lse


@cross_entropy.register_fake
def _(logits, labels, ignore_index, label_smoothing, reduction):
    loss = logits.new_empty(_ce_loss_shape(logits, reduction), dtype=torch.float32)
    return loss, logits.new_empty(logits.shape[:1], dtype=torch.float32)


@torch.library.custom_op(f"{_LIB}::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(dloss: Tensor, logits: Tensor, labels: Tensor, lse: Tensor,
                           ignore_index: int, label_smoothing: float,
                           reduction: int) -> Tensor:
    dlogits = torch.empty_like(logits, memory_format=torch.contiguous_format)
    _C.cross_entropy_backward(None, ignore_index, label_smoothing, reduction,
                              dloss, logits, labels, lse, dlogits)
    return dlogits


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
    dloss = _grad(dloss).to(torch.float32)
    return cross_entropy_backward(dloss, logits, labels, lse, *ctx.params), None, None, None, None


cross_entropy.register_autograd(_ce_bwd, setup_context=_ce_setup)


# ---------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------

def _lse_shape(q):
    if q.dim() == 4:
        return (q.shape[0], q.shape[2], q.shape[1])
    return (q.shape[1], q.shape[0])


@torch.library.custom_op(f"{_LIB}::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], softmax_scale: float, causal: int,
              window_left: int, window_right: int, softcap: float,
              deterministic: int) -> tuple[Tensor, Tensor]:
    q, k, v = map(_last_dim_contiguous, (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    _C.attention_forward(None, softmax_scale, causal, window_left, window_right, softcap,
                         deterministic, q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse)
    return out, lse


@attention.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, *params):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.custom_op(f"{_LIB}::attention_backward", mutates_args=())
def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                       cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                       softmax_scale: float, causal: int, window_left: int, window_right: int,
                       softcap: float, deterministic: int) -> tuple[Tensor, Tensor, Tensor]:
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    _C.attention_backward(None, softmax_scale, causal, window_left, window_right, softcap,
                          deterministic, q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k,
                          dq, dk, dv)
    return dq, dk, dv


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
    dq, dk, dv = attention_backward(q, k, v, out, _grad(dout), lse, cu_q, cu_k, *ctx.params)
    return (dq, dk, dv) + (None,) * (2 + len(ctx.params))


attention.register_autograd(_attn_bwd, setup_context=_attn_setup)


# ---------------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    x = _last_dim_contiguous(x)
    weight = weight.contiguous()
    y = x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))
    _C.linear_forward(None, x, weight, bias, y)
    return y


@linear.register_fake
def _(x, weight, bias):
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


@torch.library.custom_op(f"{_LIB}::linear_backward", mutates_args=())
def linear_backward(dy: Tensor, x: Tensor, weight: Tensor, need_dx: bool, need_dweight: bool,
                    need_dbias: bool) -> tuple[Tensor, Tensor, Tensor]:
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else None
    dw = torch.empty_like(weight) if need_dweight else None
    db = dy.new_empty(dy.shape[-1:]) if need_dbias else None
    _C.linear_backward(None, dy, x, weight, dx, dw, db)
    return _none0(dx, x), _none0(dw, x), _none0(db, x)


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
    dx, dw, db = linear_backward(_grad(dy), x, weight, need_dx, need_dw,
                                 bool(need_db and ctx.has_bias))
    return (dx if need_dx else None, dw if need_dw else None,
            db if (need_db and ctx.has_bias) else None)


linear.register_autograd(_linear_bwd, setup_context=_linear_setup)


# ---------------------------------------------------------------------------------
# Fused linear + cross-entropy: the gradients are computed in the forward call (the
# logits never exist); the backward scales them by the incoming gradient.
# ---------------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int,
                         label_smoothing: float, reduction: int, chunk_tokens: int,
                         need_dhidden: bool, need_dweight: bool,
                         accumulate_fp32: bool) -> tuple[Tensor, Tensor, Tensor]:
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
    g = _grad(dloss).to(torch.float32)
    gh = (dh * g).to(dh.dtype) if ctx.need[0] else None
    gw = (dw * g).to(dw.dtype) if ctx.need[1] else None
    return gh, gw, None, None, None, None, None, None, None, None


linear_cross_entropy.register_autograd(_lce_bwd, setup_context=_lce_setup)
