"""Replace a torch function by an ops_transformer implementation for the calls it
supports.

    >>> import ops_transformer as ot
    >>> @ot.custom_op(replace="torch.nn.functional.scaled_dot_product_attention")
    ... def my_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
    ...             scale=None, enable_gqa=False):
    ...     if attn_mask is not None:
    ...         raise ot.Unsupported("attn_mask")        # -> torch's own function
    ...     return ...
    >>> my_sdpa.restore()                                 # torch's function is back

    >>> with ot.custom_op(replace="torch.nn.functional.scaled_dot_product_attention"):
    ...     ...       # ot.sdpa (the built-in implementation) replaces torch's function here

Decorating installs the replacement at once (``module.attr`` is set to a dispatcher)
and returns a :class:`Replacement`: callable like the function, with ``.restore()``
and ``.install()``, and usable as a context manager (restores on exit). The
implementation raises :class:`Unsupported` (with a reason) for a call it does not
handle; the dispatcher then calls the original function with the same arguments and
logs the reason once (logger ``"ops_transformer"``).

``custom_op(replace=name)`` without decorating, as a context manager, installs the
built-in implementation for ``name`` (or ``impl=``) for the with-block. Built-in
implementations: ``torch.nn.functional.scaled_dot_product_attention`` -> :func:`sdpa`.

The dispatcher replaces the attribute of the module named in ``replace``; code that
looked the function up before (``from torch.nn.functional import
scaled_dot_product_attention``) keeps calling torch's.
"""

from __future__ import annotations

import functools
import importlib
import logging

import torch

from . import ops as _ops
from ._C import Error

__all__ = ["custom_op", "Replacement", "Unsupported", "sdpa"]

logger = logging.getLogger("ops_transformer")
_LOGGED = set()


class Unsupported(Exception):
    """Raised by a replacement implementation for a call it does not handle; the
    dispatcher then runs the original function."""


def _log_once(key, msg):
    # Not while torch.compile traces: a logging call is a graph break (and a break inside
    # a patched layer splits the model's graph); the first eager call logs it.
    if torch.compiler.is_compiling():
        return
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.warning("ops_transformer: %s", msg)


def _resolve(name):
    if not isinstance(name, str) or "." not in name:
        raise ValueError(f"ops_transformer.custom_op: replace={name!r}: expected a dotted "
                         "name such as 'torch.nn.functional.scaled_dot_product_attention'")
    mod_name, attr = name.rsplit(".", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError:
        raise ValueError(f"ops_transformer.custom_op: replace={name!r}: no module "
                         f"{mod_name!r}") from None
    if not hasattr(mod, attr):
        raise ValueError(f"ops_transformer.custom_op: replace={name!r}: {mod_name} has no "
                         f"attribute {attr!r}")
    return mod, attr


class Replacement:
    """A function installed in place of a torch function (see the module docstring)."""

    def __init__(self, target, impl):
        self.target = target
        self.impl = impl
        self._module, self._attr = _resolve(target)
        self.original = None         # the function replaced, while installed
        self._dispatch = self._make_dispatch()
        functools.update_wrapper(self, impl)

    def _make_dispatch(self):
        impl, target = self.impl, self.target

        def dispatch(*args, **kwargs):
            original = self.original if self.original is not None else \
                getattr(self._module, self._attr)
            try:
                return impl(*args, **kwargs)
            except Unsupported as e:
                _log_once((target, str(e)), f"{target}: {e}: the original function is used")
                return original(*args, **kwargs)

        dispatch.__name__ = getattr(impl, "__name__", "replacement")
        dispatch.__doc__ = impl.__doc__
        dispatch._ot_replacement = self
        return dispatch

    @property
    def installed(self):
        return getattr(self._module, self._attr, None) is self._dispatch

    def install(self):
        """Set ``module.attr`` to this replacement (remembering the current function)."""
        if self.installed:
            return self
        self.original = getattr(self._module, self._attr)
        setattr(self._module, self._attr, self._dispatch)
        return self

    def restore(self):
        """Put the replaced function back."""
        if self.original is None:
            return
        if not self.installed:
            raise RuntimeError(f"ops_transformer.custom_op: {self.target} was replaced again "
                               "after this replacement; restore that one first")
        setattr(self._module, self._attr, self.original)
        self.original = None

    def __call__(self, *args, **kwargs):
        if self.original is None:        # not installed: dispatch against the current one
            try:
                return self.impl(*args, **kwargs)
            except Unsupported as e:
                _log_once((self.target, str(e)),
                          f"{self.target}: {e}: the original function is used")
                return getattr(self._module, self._attr)(*args, **kwargs)
        return self._dispatch(*args, **kwargs)

    def __enter__(self):
        self.install()
        return self

    def __exit__(self, *exc):
        self.restore()
        return False

    def __repr__(self):
        state = "installed" if self.installed else "not installed"
        return f"<ops_transformer replacement of {self.target} by {self.impl!r} ({state})>"


class custom_op:
    """``@custom_op(replace="torch....")`` decorator, or ``with custom_op(replace=...)``
    context manager using the built-in (or ``impl=``) implementation."""

    def __init__(self, replace, impl=None):
        _resolve(replace)
        self.replace = replace
        self.impl = impl
        self._active = []

    def __call__(self, fn):
        return Replacement(self.replace, fn).install()

    def _default_impl(self):
        if self.impl is not None:
            return self.impl
        impl = _BUILTIN.get(self.replace)
        if impl is None:
            raise ValueError(f"ops_transformer.custom_op: no built-in implementation for "
                             f"{self.replace!r} (built-in: {', '.join(_BUILTIN)}); decorate "
                             "a function or pass impl=")
        return impl

    def __enter__(self):
        r = Replacement(self.replace, self._default_impl()).install()
        self._active.append(r)
        return r

    def __exit__(self, *exc):
        self._active.pop().restore()
        return False


# ---------------------------------------------------------------------------------
# Built-in implementation: scaled_dot_product_attention
# ---------------------------------------------------------------------------------

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` on
    :func:`ops_transformer.attention`, for [B, H, S, D] tensors.

    Supported: no ``attn_mask``, ``dropout_p == 0``, ``is_causal`` (with equal query and
    key lengths: torch aligns the causal mask top-left, the library bottom-right),
    ``scale``, ``enable_gqa`` (query heads a multiple of key heads), float32 / float16 /
    bfloat16 of one dtype, 4-D tensors, equal q/k/v head dims, CPU tensors (CUDA ones
    when the package has the CUDA backend). Other calls raise :class:`Unsupported`
    (the replacement then uses torch's function). The q/k/v layouts are transposed to
    [B, S, H, D] as views; the output is a [B, H, S, D] view of a [B, S, H, D] tensor.
    """
    if attn_mask is not None:
        raise Unsupported("attn_mask is not supported")
    if dropout_p:
        raise Unsupported("dropout_p > 0 is not supported")
    for t in (query, key, value):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.is_nested:
            raise Unsupported("only 4-D [B, H, S, D] tensors are supported")
        if t.dtype != query.dtype or t.dtype not in _DTYPES:
            raise Unsupported("q/k/v must share one of float32 / float16 / bfloat16")
        if t.device != query.device:
            raise Unsupported("q/k/v on different devices")
    if query.device.type not in ("cpu", "cuda") or (query.device.type == "cuda"
                                                    and not _C_has_cuda()):
        raise Unsupported(f"device {query.device.type} is not supported by this build")
    B, Hq, Sq, D = query.shape
    Hk, Sk = key.shape[1], key.shape[2]
    if value.shape[-1] != D or key.shape[-1] != D:
        raise Unsupported("q, k and v head dims differ")
    if Hq != Hk and not (enable_gqa and Hq % Hk == 0):
        raise Unsupported("query heads != key heads without enable_gqa")
    if scale is not None and not scale > 0:
        raise Unsupported("scale <= 0 is not supported")
    if is_causal and Sq != Sk:
        raise Unsupported("is_causal with query length != key length (torch aligns "
                          "top-left)")
    try:
        out = _ops.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                             causal=bool(is_causal), softmax_scale=scale)
    except Error as e:
        raise Unsupported(f"ops_transformer.attention: {e}") from None
    return out.transpose(1, 2)


def _C_has_cuda():
    from . import _C
    return _C.has_cuda()


_BUILTIN = {"torch.nn.functional.scaled_dot_product_attention": sdpa}
