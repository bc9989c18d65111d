"""The ops: one Python function per op of ``ops_transformer.h``.

Every forward function takes ``torch.Tensor`` objects, NumPy arrays, or any other
object with ``__dlpack__`` (converted with ``torch.from_dlpack`` when torch is
installed, ``numpy.from_dlpack`` otherwise). Outputs are allocated with the type and
device of the first input unless given with ``out=``. Failures raise
:class:`ops_transformer.Error` with the C library's message.

Two paths lead to the C library:

* the direct path (inference, NumPy, ``torch.no_grad()``): the function allocates the
  outputs and calls the extension module ``_C`` -- a few microseconds per call;
* the autograd path, taken when torch records gradients for an input or when
  ``torch.compile`` traces the call: the function calls the ``torch.ops.ops_transformer``
  custom op (``_torch_ops.py``), whose backward is the library's own backward op -- in
  eager mode through ``_torch_ops.eager`` (the same implementation and backward in a
  ``torch.autograd.Function``, without the custom op's dispatch: less host time a call).

The ``*_backward`` functions are the plain bindings of the backward ops.

The first argument of every ``_C`` call is the CUDA stream: None, as passed here,
means torch's current stream of the tensors' device (looked up by ``_C`` only for
CUDA tensors).

Layout rules are the C API's: the last dimension of every floating-point tensor must
be contiguous; leading dimensions may be strided where the header says so.
"""

from __future__ import annotations

import numpy as _np

from . import _C
from ._C import Error

try:
    import torch as _torch
except ImportError:  # NumPy-only use
    _torch = None

__all__ = [
    "rms_norm", "rms_norm_backward", "layer_norm", "layer_norm_backward",
    "rope", "rope_backward", "swiglu", "geglu", "glu_backward",
    "softmax", "softmax_backward", "cross_entropy", "cross_entropy_backward",
    "attention", "attention_backward", "linear", "linear_backward",
    "linear_cross_entropy", "adamw_step",
]

# ot_glu_kind, ot_reduction, ot_rope_mode
GLU_SWIGLU, GLU_GEGLU, GLU_GEGLU_TANH = 0, 1, 2
_REDUCTIONS = {"mean": 0, "sum": 1, "none": 2}
_ROPE_MODES = {"neox": 0, "gptj": 1}

if _torch is not None:
    _Tensor = _torch.Tensor
    _ARRAY_TYPES = (_torch.Tensor, _np.ndarray)
    _is_compiling = _torch.compiler.is_compiling
    _is_grad_enabled = _torch.is_grad_enabled
    _DLPACK_CODES = {
        _torch.float32: (2, 32), _torch.float16: (2, 16), _torch.bfloat16: (4, 16),
        _torch.int32: (0, 32), _torch.int64: (0, 64), _torch.float64: (2, 64),
        _torch.int8: (0, 8), _torch.uint8: (1, 8), _torch.int16: (0, 16),
    }
    _C._register_torch(_torch.Tensor, _DLPACK_CODES,
                       lambda ordinal: _torch.cuda.current_stream(ordinal).cuda_stream,
                       getattr(_torch._C, "_to_dlpack", None))
else:
    _Tensor = ()
    _ARRAY_TYPES = (_np.ndarray,)


# ---------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------

def _arr(x, name="x"):
    """A torch.Tensor or NumPy array from x (None stays None)."""
    if x is None or isinstance(x, _ARRAY_TYPES):
        return x
    if hasattr(x, "__dlpack__"):
        return _torch.from_dlpack(x) if _torch is not None else _np.from_dlpack(x)
    raise Error(f"ops_transformer: {name}: expected a torch.Tensor, a NumPy array or a "
                f"DLPack producer, got {type(x).__name__}")


def _empty(ref, shape, float32=False):
    """An uninitialized output of ref's kind (torch / NumPy), device and dtype."""
    if isinstance(ref, _np.ndarray):
        return _np.empty(shape, dtype=_np.float32 if float32 else ref.dtype)
    if float32:
        return ref.new_empty(shape, dtype=_torch.float32)
    return ref.new_empty(shape)


def _empty_like(ref):
    if isinstance(ref, _np.ndarray):
        return _np.empty_like(ref)
    return _torch.empty_like(ref, memory_format=_torch.contiguous_format)


def _autograd(*ts):
    """Whether the call goes through the torch custom op (autograd or compile)."""
    if _torch is None:
        return False
    if _is_grad_enabled():
        for t in ts:
            if isinstance(t, _Tensor) and t.requires_grad:
                return True
    return _is_compiling()


def _no_out(op, **outs):
    for k, v in outs.items():
        if v is not None:
            raise Error(f"ops_transformer.{op}: {k}= is not supported when autograd records "
                        "the call or torch.compile traces it (use torch.no_grad())")


_EAGER = None      # _torch_ops.eager, imported on first use (_torch_ops imports this module)


def _ops():
    """The autograd ops: torch.ops.ops_transformer while torch.compile traces, otherwise
    _torch_ops.eager (the same ops through torch.autograd.Function: a fraction of the
    custom ops' per-call host time; it hands fake / meta tensors to the custom ops)."""
    global _EAGER
    if _is_compiling():
        return _torch.ops.ops_transformer
    if _EAGER is None:    # (a function-level import costs ~2 us a call)
        from ._torch_ops import eager
        _EAGER = eager
    return _EAGER


# ---------------------------------------------------------------------------------
# RMSNorm / LayerNorm
# ---------------------------------------------------------------------------------

def rms_norm(x, weight=None, eps=1e-6, *, residual=None, out=None, residual_out=None):
    """RMSNorm over the last dimension, with an optional fused residual add.

    Parameters
    ----------
    x : tensor [..., H] (float32, float16 or bfloat16)
    weight : tensor [H] or None (None means 1), same dtype as x
    eps : float
    residual : tensor [..., H] or None
        When given, ``h = x + residual`` (rounded to x's dtype) is normalized and also
        returned.
    out, residual_out : tensors [..., H] or None
        Preallocated outputs (``out`` may be ``x``; ``residual_out`` may be ``x`` or
        ``residual``). Not supported on the autograd path.

    Returns
    -------
    out : ``h * rsqrt(mean(h^2) + eps) * weight``, or ``(out, h)`` with ``residual``.
    """
    x = _arr(x)
    weight = _arr(weight, "weight")
    residual = _arr(residual, "residual")
    if _autograd(x, weight, residual):
        _no_out("rms_norm", out=out, residual_out=residual_out)
        o, h, _ = _ops().rms_norm(x, residual, weight, float(eps))
        return (o, h) if residual is not None else o
    if out is None:
        out = _empty_like(x)
    if residual is not None and residual_out is None:
        residual_out = _empty_like(x)
    _C.rmsnorm_forward(None, x, residual, weight, eps, out, residual_out, None)
    return (out, residual_out) if residual is not None else out


def rms_norm_backward(dy, h, weight=None, rstd=None, eps=1e-6, *, dresidual_out=None,
                      dx=None, need_dweight=True):
    """Backward of :func:`rms_norm`. Returns ``(dx, dweight)``.

    ``h`` is the normalized input (x, or the ``h`` returned with a residual); ``rstd``
    (float32, x's leading shape) as saved by a forward, or None to recompute it;
    ``dresidual_out`` is added to dx. dweight is None when weight is None.
    """
    dx = _empty_like(dy) if dx is None else dx
    dw = _empty(weight, weight.shape) if (weight is not None and need_dweight) else None
    _C.rmsnorm_backward(None, dy, dresidual_out, h, weight, rstd, eps, dx, dw)
    return dx, dw


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, residual=None, out=None,
               residual_out=None):
    """LayerNorm over the last dimension, with an optional fused residual add.

    Parameters
    ----------
    x : tensor [..., H]
    weight, bias : tensors [H] or None (1 and 0), x's dtype
    eps : float
    residual : tensor [..., H] or None; when given ``h = x + residual`` is normalized
        and returned too.
    out, residual_out : optional preallocated outputs [..., H].

    Returns
    -------
    out : ``(h - mean) * rsqrt(var + eps) * weight + bias``, or ``(out, h)`` with
    ``residual``.
    """
    x = _arr(x)
    weight = _arr(weight, "weight")
    bias = _arr(bias, "bias")
    residual = _arr(residual, "residual")
    if _autograd(x, weight, bias, residual):
        _no_out("layer_norm", out=out, residual_out=residual_out)
        o, h, _, _ = _ops().layer_norm(x, residual, weight, bias, float(eps))
        return (o, h) if residual is not None else o
    if out is None:
        out = _empty_like(x)
    if residual is not None and residual_out is None:
        residual_out = _empty_like(x)
    _C.layernorm_forward(None, x, residual, weight, bias, eps, out, residual_out,
                         None, None)
    return (out, residual_out) if residual is not None else out


def layer_norm_backward(dy, h, weight=None, mean=None, rstd=None, eps=1e-5, *,
                        dresidual_out=None, dx=None, need_dweight=True, need_dbias=True):
    """Backward of :func:`layer_norm`. Returns ``(dx, dweight, dbias)``.

    ``mean`` and ``rstd`` (float32) are both given or both None (recomputed).
    dweight is None without weight; dbias (the sum of dy over rows) only when asked.
    """
    dx = _empty_like(dy) if dx is None else dx
    H = dy.shape[-1]
    dw = _empty(weight, weight.shape) if (weight is not None and need_dweight) else None
    db = _empty(dy, (H,)) if need_dbias else None
    _C.layernorm_backward(None, dy, dresidual_out, h, weight, mean, rstd, eps, dx,
                          dw, db)
    return dx, dw, db


# ---------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------

def _rope_args(interleaved, rotary_dim, theta, llama3_scaling):
    mode = 1 if interleaved else 0
    f = lo = hi = 0.0
    orig = 0
    if llama3_scaling:
        s = dict(llama3_scaling)
        f = float(s.pop("factor"))
        lo = float(s.pop("low_freq_factor", 1.0))
        hi = float(s.pop("high_freq_factor", 4.0))
        orig = int(s.pop("original_max_position_embeddings",
                         s.pop("original_max_position", 8192)))
        s.pop("rope_type", None)
        if s:
            raise Error(f"ops_transformer.rope: llama3_scaling: unknown keys {sorted(s)}")
    return mode, int(rotary_dim), float(theta), f, lo, hi, orig


def rope(q, k, positions, *, rotary_dim=0, theta=10000.0, interleaved=False,
         llama3_scaling=None, cos_sin_cache=None, inplace=False, q_out=None, k_out=None):
    """Rotary position embedding of q and (optionally) k, in one call.

    Parameters
    ----------
    q : tensor [tokens, Hq, D] or [B, S, Hq, D]
    k : tensor with q's leading shape and Hk heads, or None
    positions : int32 / int64 tensor [tokens] or [B, S]
    rotary_dim : int, the leading features of each head that rotate (0 = D)
    theta : float, frequency base
    interleaved : bool, GPT-J pairs (2i, 2i+1) instead of NeoX/Llama "rotate half"
    llama3_scaling : dict or None, Llama-3 frequency scaling: ``factor``,
        ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``
        (the keys of a HF ``rope_scaling`` config).
    cos_sin_cache : float32 [max_position, rotary_dim] or None (cos | sin per row)
    inplace : bool, rotate q and k in place (direct path only)
    q_out, k_out : optional preallocated outputs

    Returns
    -------
    ``(q_rot, k_rot)``, or ``q_rot`` when k is None.
    """
    q = _arr(q, "q")
    k = _arr(k, "k")
    positions = _arr(positions, "positions")
    cos_sin_cache = _arr(cos_sin_cache, "cos_sin_cache")
    args = _rope_args(interleaved, rotary_dim, theta, llama3_scaling)
    if _autograd(q, k):
        _no_out("rope", q_out=q_out, k_out=k_out)
        if inplace:
            raise Error("ops_transformer.rope: inplace=True is not supported when autograd "
                        "records the call or torch.compile traces it")
        qo, ko = _ops().rope(q, k, positions, cos_sin_cache, *args)
        return (qo, ko) if k is not None else qo
    if inplace:
        q_out, k_out = q, k
    if q_out is None:
        q_out = _empty_like(q)
    if k is not None and k_out is None:
        k_out = _empty_like(k)
    _C.rope_forward(None, *args, q, k, positions, cos_sin_cache, q_out, k_out)
    return (q_out, k_out) if k is not None else q_out


def rope_backward(dq_out, dk_out, positions, *, rotary_dim=0, theta=10000.0,
                  interleaved=False, llama3_scaling=None, cos_sin_cache=None):
    """Backward of :func:`rope` (the rotation by the opposite angle). Returns (dq, dk)."""
    args = _rope_args(interleaved, rotary_dim, theta, llama3_scaling)
    dq = _empty_like(dq_out)
    dk = _empty_like(dk_out) if dk_out is not None else None
    _C.rope_backward(None, *args, dq_out, dk_out, positions, cos_sin_cache, dq, dk)
    return dq, dk


# ---------------------------------------------------------------------------------
# Gated activations
# ---------------------------------------------------------------------------------

def _glu(kind, name, gate, up, out):
    gate = _arr(gate, "gate")
    up = _arr(up, "up")
    if _autograd(gate, up):
        _no_out(name, out=out)
        return _ops().glu(gate, up, kind)
    if out is None:
        if up is None:
            out = _empty(gate, tuple(gate.shape[:-1]) + (gate.shape[-1] // 2,))
        else:
            out = _empty_like(gate)
    _C.glu_forward(None, kind, gate, up, out)
    return out


def swiglu(gate, up=None, *, out=None):
    """SwiGLU: ``silu(gate) * up``.

    Parameters
    ----------
    gate : tensor [..., F], or [..., 2F] holding gate | up when ``up`` is None
        (the output of a fused gate+up projection)
    up : tensor [..., F] or None
    out : optional preallocated output [..., F]
    """
    return _glu(GLU_SWIGLU, "swiglu", gate, up, out)


def geglu(gate, up=None, *, approximate="none", out=None):
    """GeGLU: ``gelu(gate) * up``; ``approximate='tanh'`` uses the tanh GELU.

    Shapes as :func:`swiglu`.
    """
    if approximate not in ("none", "tanh"):
        raise Error(f"ops_transformer.geglu: approximate: {approximate!r}, expected "
                    "'none' or 'tanh'")
    return _glu(GLU_GEGLU if approximate == "none" else GLU_GEGLU_TANH, "geglu", gate, up, out)


def glu_backward(dout, gate, up=None, *, kind=GLU_SWIGLU, recompute=False):
    """Backward of :func:`swiglu` / :func:`geglu`. Returns ``(dgate, dup)``; with
    ``up=None`` dgate holds both halves ([..., 2F]) and dup is None. ``recompute=True``
    returns ``(dgate, dup, out)``, out the forward's output (bit for bit what the forward
    returns), made from the same reads of gate and up: for a backward that needs the
    product again -- the next projection's weight gradient -- without having kept it."""
    dgate = _empty_like(gate)
    dup = _empty_like(up) if up is not None else None
    if not recompute:
        _C.glu_backward(None, kind, dout, gate, up, dgate, dup)
        return dgate, dup
    out = _empty_like(dout)
    _C.glu_backward_recompute(None, kind, dout, gate, up, dgate, dup, out)
    return dgate, dup, out


# ---------------------------------------------------------------------------------
# Softmax and cross-entropy
# ---------------------------------------------------------------------------------

def softmax(x, *, out=None):
    """Softmax over the last dimension. x: [..., N]; ``out`` may be x."""
    x = _arr(x)
    if _autograd(x):
        _no_out("softmax", out=out)
        return _ops().softmax(x)
    if out is None:
        out = _empty_like(x)
    _C.softmax_forward(None, x, out)
    return out


def softmax_backward(dy, y, *, dx=None):
    """``dx = y * (dy - sum(dy * y))``; y is the forward's output."""
    dx = _empty_like(dy) if dx is None else dx
    _C.softmax_backward(None, dy, y, dx)
    return dx


def _reduction(reduction):
    try:
        return _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise Error(f"ops_transformer.cross_entropy: reduction: {reduction!r}, expected "
                    "'mean', 'sum' or 'none'") from None


def cross_entropy(logits, labels, *, ignore_index=-100, label_smoothing=0.0,
                  reduction="mean"):
    """Cross-entropy of logits against integer labels, as
    ``torch.nn.functional.cross_entropy`` (class dimension last).

    Parameters
    ----------
    logits : tensor [..., V] (float32 / float16 / bfloat16)
    labels : int32 / int64 tensor with logits' leading shape; values in [0, V) or
        ``ignore_index``
    ignore_index : int
    label_smoothing : float in [0, 1]
    reduction : 'mean' | 'sum' | 'none'

    Returns
    -------
    loss : float32, 0-d for 'mean' and 'sum', labels' shape for 'none'.
    """
    logits = _arr(logits, "logits")
    labels = _arr(labels, "labels")
    red = _reduction(reduction)
    lead = tuple(labels.shape)
    if logits.ndim != 2:
        logits = logits.reshape(-1, logits.shape[-1])
        labels = labels.reshape(-1)
    if _autograd(logits):
        loss, _ = _ops().cross_entropy(logits, labels, int(ignore_index),
                                       float(label_smoothing), red)
    else:
        loss = _empty(logits, (logits.shape[0],) if red == 2 else (), float32=True)
        _C.cross_entropy_forward(None, ignore_index, label_smoothing, red, logits,
                                 labels, loss, None)
    if red == 2 and loss.shape != lead:
        loss = loss.reshape(lead)
    return loss


def cross_entropy_backward(dloss, logits, labels, lse=None, *, ignore_index=-100,
                           label_smoothing=0.0, reduction="mean", dlogits=None):
    """Backward of :func:`cross_entropy` for [N, V] logits: ``dlogits`` in logits'
    dtype. ``dloss`` is float32 with the loss's shape; ``lse`` float32 [N] or None."""
    red = _reduction(reduction)
    dlogits = _empty_like(logits) if dlogits is None else dlogits
    _C.cross_entropy_backward(None, ignore_index, label_smoothing, red, dloss,
                              logits, labels, lse, dlogits)
    return dlogits


# ---------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------

def _attn_args(softmax_scale, causal, window, softcap, deterministic):
    wl, wr = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return (0.0 if softmax_scale is None else float(softmax_scale), int(bool(causal)), wl, wr,
            float(softcap), int(bool(deterministic)))


def attention(q, k, v, *, causal=False, softmax_scale=None, window=None, softcap=0.0,
              deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None, out=None,
              return_lse=False):
    """Flash attention: ``softmax(scale * q k^T + mask) v``.

    Parameters
    ----------
    q : [B, Sq, Hq, D] (dense BSHD) or [Tq, Hq, D] (varlen, with cu_seqlens)
    k, v : [B, Sk, Hkv, D] or [Tk, Hkv, D]; Hq must be a multiple of Hkv (GQA / MQA)
    causal : bool, causal mask aligned to the bottom-right corner
    softmax_scale : float or None (1 / sqrt(D))
    window : (left, right) or None: sliding window, negative = unbounded
    softcap : float, tanh soft-capping of the scores (0 = off)
    deterministic : bool, deterministic backward
    cu_seqlens_q, cu_seqlens_k : int32 [B + 1] or None: packed variable-length layout
        (on the CPU they must be CPU tensors)
    out : optional preallocated output, q's shape
    return_lse : also return lse, float32 [B, Hq, Sq] (or [Hq, Tq])

    Returns
    -------
    out, or ``(out, lse)``.
    """
    q = _arr(q, "q")
    k = _arr(k, "k")
    v = _arr(v, "v")
    cu_seqlens_q = _arr(cu_seqlens_q, "cu_seqlens_q")
    cu_seqlens_k = _arr(cu_seqlens_k, "cu_seqlens_k")
    args = _attn_args(softmax_scale, causal, window, softcap, deterministic)
    if _autograd(q, k, v):
        _no_out("attention", out=out)
        o, lse = _ops().attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *args)
        return (o, lse) if return_lse else o
    if out is None:
        out = _empty_like(q)
    lse = None
    if return_lse:
        if q.ndim == 4:
            lse = _empty(q, (q.shape[0], q.shape[2], q.shape[1]), float32=True)
        else:
            lse = _empty(q, (q.shape[1], q.shape[0]), float32=True)
    _C.attention_forward(None, *args, q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse)
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, out, dout, lse, *, causal=False, softmax_scale=None,
                       window=None, softcap=0.0, deterministic=False, cu_seqlens_q=None,
                       cu_seqlens_k=None):
    """Backward of :func:`attention` from the saved lse. Returns ``(dq, dk, dv)``;
    the parameters must equal the forward's."""
    args = _attn_args(softmax_scale, causal, window, softcap, deterministic)
    dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
    _C.attention_backward(None, *args, q, k, v, out, dout, lse, cu_seqlens_q,
                          cu_seqlens_k, dq, dk, dv)
    return dq, dk, dv


# ---------------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------------

def linear(x, weight, bias=None, *, out=None):
    """``y = x W^T + b``. x: [..., K]; weight: [N, K] contiguous; bias: [N] or None;
    returns y [..., N]. All one dtype, float32 accumulation."""
    x = _arr(x)
    weight = _arr(weight, "weight")
    bias = _arr(bias, "bias")
    if _autograd(x, weight, bias):
        _no_out("linear", out=out)
        return _ops().linear(x, weight, bias)
    if out is None:
        out = _empty(x, tuple(x.shape[:-1]) + (weight.shape[0],))
    _C.linear_forward(None, x, weight, bias, out)
    return out


def linear_backward(dy, x, weight, *, need_dx=True, need_dweight=True, need_dbias=False):
    """Backward of :func:`linear`. Returns ``(dx, dweight, dbias)`` (None where not
    asked)."""
    dx = _empty_like(x) if need_dx else None
    dw = _empty_like(weight) if need_dweight else None
    db = _empty(dy, (dy.shape[-1],)) if need_dbias else None
    _C.linear_backward(None, dy, x, weight, dx, dw, db)
    return dx, dw, db


# ---------------------------------------------------------------------------------
# Fused linear + cross-entropy
# ---------------------------------------------------------------------------------

def _lce_workspace(hidden, V, chunk_tokens):
    """The op's workspace as an int32 tensor of hidden's kind and device."""
    code, bits = _DLPACK_CODES[hidden.dtype] if not isinstance(hidden, _np.ndarray) \
        else ((4, 16) if str(hidden.dtype) == "bfloat16" else (2, hidden.dtype.itemsize * 8))
    n = _C.linear_cross_entropy_workspace_size(hidden.shape[0], hidden.shape[1], V, code, bits,
                                               int(chunk_tokens))
    if isinstance(hidden, _np.ndarray):
        return _np.empty((n + 3) // 4, dtype=_np.int32)
    return hidden.new_empty(((n + 3) // 4,), dtype=_torch.int32)


def linear_cross_entropy(hidden, weight, labels, *, ignore_index=-100, label_smoothing=0.0,
                         reduction="mean", chunk_tokens=0, accumulate_fp32=False):
    """``cross_entropy(hidden @ weight.T, labels)`` without materializing the logits.

    The tokens are processed in chunks of ``chunk_tokens`` rows (0: as many as fit
    256 MiB of logits); per chunk the logits GEMM, the cross-entropy and -- when autograd
    needs them -- the gradients of hidden and weight are computed at once, in the
    forward call (the backward only scales them by the incoming gradient). Extra memory:
    chunk x V logits in hidden's dtype plus O(T) floats.

    Parameters
    ----------
    hidden : tensor [..., H] (float32 / float16 / bfloat16)
    weight : tensor [V, H], hidden's dtype (the LM head / tied embedding)
    labels : int32 / int64 tensor with hidden's leading shape
    ignore_index, label_smoothing, reduction : as :func:`cross_entropy` (gradients need
        'mean' or 'sum')
    chunk_tokens : int, tokens per chunk (0 = default)
    accumulate_fp32 : bool, accumulate weight's gradient in float32 (an extra V x H
        float32 buffer) instead of rounding each chunk's sum into weight's dtype

    Returns
    -------
    loss : float32, 0-d for 'mean' / 'sum', labels' shape for 'none'.
    """
    hidden = _arr(hidden, "hidden")
    weight = _arr(weight, "weight")
    labels = _arr(labels, "labels")
    red = _reduction(reduction)
    lead = tuple(labels.shape)
    if hidden.ndim != 2:
        hidden = hidden.reshape(-1, hidden.shape[-1])
        labels = labels.reshape(-1)
    if _autograd(hidden, weight):
        need_dh = bool(hidden.requires_grad)
        need_dw = bool(weight.requires_grad)
        if red == 2 and (need_dh or need_dw):
            raise Error("ops_transformer.linear_cross_entropy: reduction='none' has no "
                        "gradient; use 'mean' or 'sum'")
        loss, _, _ = _ops().linear_cross_entropy(hidden, weight, labels, int(ignore_index),
                                                 float(label_smoothing), red,
                                                 int(chunk_tokens), need_dh, need_dw,
                                                 bool(accumulate_fp32))
    else:
        loss = _empty(hidden, (hidden.shape[0],) if red == 2 else (), float32=True)
        ws = _lce_workspace(hidden, weight.shape[0], chunk_tokens)
        _C.linear_cross_entropy(None, ignore_index, label_smoothing, red, chunk_tokens,
                                hidden, weight, labels, loss, None, None, ws)
    if red == 2 and loss.shape != lead:
        loss = loss.reshape(lead)
    return loss


# ---------------------------------------------------------------------------------
# Optimizer step
# ---------------------------------------------------------------------------------

def adamw_step(params, grads, exp_avg, exp_avg_sq, *, lr, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=1e-2, step, master_params=None):
    """One AdamW step (``torch.optim.AdamW``'s update) over lists of tensors, in place,
    in a few kernel launches: see ``ot_adamw_step`` in the C header for the dtypes.
    ``step`` is the number of this step (1 for the first); ``master_params`` an optional
    list of float32 master weights of low-precision ``params``."""
    _C.adamw_step(None, float(lr), float(betas[0]), float(betas[1]), float(eps),
                  float(weight_decay), int(step), list(params), list(grads), list(exp_avg),
                  list(exp_avg_sq), None if master_params is None else list(master_params))
