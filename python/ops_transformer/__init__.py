"""ops_transformer: fused transformer operators in C / CUDA, for PyTorch and NumPy.

    >>> import torch, ops_transformer as ot
    >>> x = torch.randn(4, 64)
    >>> y = ot.rms_norm(x, torch.ones(64))

Functions (see each docstring for shapes): rms_norm, layer_norm (both with a fused
residual add), rope, swiglu, geglu, softmax, cross_entropy, attention (dense BSHD and
packed varlen), linear, linear_cross_entropy (the LM head's loss without the
logits), adamw_step, and the plain bindings of their backward ops (``*_backward``).
The paged KV cache: ``KVCache`` with ``kv_append``, ``rope_kv_append`` and
``paged_attention`` (``ops_transformer.kv_cache``).
With torch installed each op is also ``torch.ops.ops_transformer.<name>``, with fake
implementations (torch.compile) and autograd through the library's backward ops.

With torch: ``patch_llama`` / ``patch_model`` / ``unpatch`` route a HF transformers
Llama / Mistral / Qwen2 model through these ops (``ops_transformer.patch``);
``custom_op(replace="torch.nn.functional.scaled_dot_product_attention")`` puts a
function (the built-in ``sdpa``) in place of a torch function (``ops_transformer.replace``).

Errors raise :class:`Error` (a RuntimeError) with the C library's message.
Options: :data:`config`.
"""

from . import _C
from ._C import Error
from .config import config
from .ops import *  # noqa: F401,F403
from .ops import __all__ as _ops_all
from .kv_cache import KVCache, kv_append, paged_attention, rope_kv_append  # noqa: F401

try:
    import torch as _torch  # noqa: F401
except ImportError:
    _torch = None
if _torch is not None:
    from . import _torch_ops  # noqa: F401  (registers torch.ops.ops_transformer.*)
    from .patch import patch_llama, patch_model, unpatch  # noqa: F401  (HF transformers)
    from .replace import Unsupported, custom_op, sdpa  # noqa: F401
    from . import optim  # noqa: F401  (ops_transformer.optim.AdamW)

__version__ = _C.version()


def has_cuda():
    """Whether the bundled library was built with the CUDA backend."""
    return _C.has_cuda()


def last_error():
    """The C library's ot_last_error() of this thread ('' if nothing failed)."""
    return _C.last_error()


__all__ = ["Error", "config", "has_cuda", "last_error", "__version__"] + list(_ops_all)
__all__ += ["KVCache", "kv_append", "rope_kv_append", "paged_attention"]
if _torch is not None:
    __all__ += ["patch_llama", "patch_model", "unpatch", "custom_op", "sdpa", "Unsupported"]
