"""The paged KV cache and the paged ops: ``KVCache``, ``kv_append``, ``rope_kv_append``,
``paged_attention``.

``KVCache`` owns an ``ot_kv_cache`` (a pool of pages, all layers' K and V, with sequences
as block tables; see the "Memory: paged KV cache" section of ``ops_transformer.h`` and
docs/MEMORY.md). The bookkeeping is the C library's; this module only converts
arguments. ``layer(l)`` returns the pages as views (no copy) that keep the pool alive,
also after the ``KVCache`` object is gone.

The ops take the pages and a batch's CSR page table (``indptr``, ``indices``,
``last_page_len``, from ``KVCache.page_table``) as tensors; they never see the cache.
A decode step per layer::

    cache.reserve(ids, [1] * len(ids))                 # one new slot per sequence
    table = cache.page_table(ids)                      # (indptr, indices, last_page_len)
    k_pages, v_pages = cache.layer(l)
    q = ot.rope_kv_append(q, k, v, k_pages, v_pages, *table, cu)[0]   # or kv_append
    out = ot.paged_attention(q, k_pages, v_pages, *table, cu, causal=True)

These are inference ops: no autograd. While torch.compile traces they go through the
``torch.ops.ops_transformer`` custom ops (``kv_append``, ``rope_kv_append``,
``paged_attention``: fake implementations, the pages -- and q / k when rotated in place --
declared as mutated); otherwise they call the C library directly (less host time a call).
"""

from __future__ import annotations

import numpy as _np

from . import _C
from ._C import Error
from .ops import _arr, _attn_args, _empty, _empty_like, _rope_args

try:
    import torch as _torch
    _is_compiling = _torch.compiler.is_compiling
except ImportError:  # NumPy-only use
    _torch = None

    def _is_compiling():
        return False

__all__ = ["KVCache", "kv_append", "rope_kv_append", "paged_attention"]

_kDLCPU, _kDLCUDA = 1, 2
# NumPy >= 2 takes DLPack 1.0 capsules, and only from those makes writable arrays.
_NUMPY_VERSIONED = int(_np.__version__.split(".")[0]) >= 2
_NUMPY_CODES = {_np.dtype(_np.float32): (2, 32), _np.dtype(_np.float16): (2, 16)}
_INT = (int, _np.integer)
_NAMES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16)}


def _dtype_code(dtype):
    """(DLPack code, bits, as_torch) of a torch dtype, a NumPy dtype or a dtype name."""
    if _torch is not None and isinstance(dtype, _torch.dtype):
        from .ops import _DLPACK_CODES
        if dtype in (_torch.float32, _torch.float16, _torch.bfloat16):
            return _DLPACK_CODES[dtype] + (True,)
    elif isinstance(dtype, str) and dtype in _NAMES:
        if _torch is None and dtype == "bfloat16":
            raise Error("ops_transformer.KVCache: dtype: bfloat16 pages need torch")
        return _NAMES[dtype] + (_torch is not None,)
    else:
        try:
            code = _NUMPY_CODES.get(_np.dtype(dtype))
        except TypeError:
            code = None
        if code is not None:
            return code + (False,)
    raise Error(f"ops_transformer.KVCache: dtype: {dtype!r}, expected float32, float16 "
                "or bfloat16 (a torch dtype, a NumPy dtype or its name)")


def _device_ordinal(device):
    """-1 for the CPU, else the CUDA ordinal of a device spec ("cuda", "cuda:1", ...)."""
    if _torch is not None:
        d = _torch.device(device)
        if d.type == "cpu":
            return -1
        if d.type == "cuda":
            return _torch.cuda.current_device() if d.index is None else d.index
    else:
        s = str(device)
        if s == "cpu":
            return -1
        if s == "cuda" or s.startswith("cuda:"):
            return int(s[5:] or 0)
    raise Error(f"ops_transformer.KVCache: device: {device!r}, expected cpu or cuda")


class _Capsule:
    """A DLPack producer around one of ``_C``'s "dltensor" capsules, for consumers that
    want ``__dlpack__`` (numpy.from_dlpack). The capsule can be consumed once."""

    __slots__ = ("capsule", "device")

    def __init__(self, capsule, device):
        self.capsule, self.device = capsule, device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        # The pages are written on torch's current stream (the ops' default), so there is
        # no other stream for the consumer's to wait on.
        cap, self.capsule = self.capsule, None
        if cap is None:
            raise Error("ops_transformer: this DLPack export was already consumed")
        return cap

    def __dlpack_device__(self):
        return self.device


def _import(capsule, ordinal, as_torch):
    if as_torch:
        return _torch.from_dlpack(capsule)
    dev = (_kDLCPU, 0) if ordinal < 0 else (_kDLCUDA, ordinal)
    return _np.from_dlpack(_Capsule(capsule, dev))


def _to_device_one_copy(arrays, device):
    """int32 CPU tensors -> views of one `device` tensor, filled by one non-blocking copy
    from a pinned staging buffer (torch's caching host allocator keeps the staging block
    until the copy has run). Each view starts at a multiple of 4 elements (16 bytes)."""
    if device.type != "cuda":
        return tuple(a.to(device) for a in arrays)
    offs, total = [], 0
    for a in arrays:
        offs.append(total)
        total += (a.numel() + 3) // 4 * 4
    host = _torch.empty(max(total, 4), dtype=_torch.int32, pin_memory=True)
    for a, o in zip(arrays, offs):
        host[o:o + a.numel()].copy_(a)
    dev = host.to(device, non_blocking=True)
    return tuple(dev[o:o + a.numel()] for a, o in zip(arrays, offs))


class KVCache:
    """A paged KV cache: a pool of ``num_pages`` pages of ``block_size`` tokens, each page
    holding every layer's keys and values (``ot_kv_cache``).

    Parameters
    ----------
    num_layers, num_pages, block_size (1..256), heads_kv, head_dim : int
    dtype : float32, float16 or bfloat16, as a torch dtype (the pages are torch
        tensors), a NumPy dtype (NumPy arrays; no bfloat16) or a name (torch tensors when
        torch is installed)
    device : "cpu" (default), or a CUDA device ("cuda", "cuda:N", a torch.device) when
        the library was built with CUDA; the pages live there
    arena : ``ops_transformer.profiler.Arena`` on the same device, or None: the pages are
        one block of that arena (kept alive by the cache) instead of the cache's own
        reservation

    Sequences are int ids: :meth:`add_sequence`, :meth:`reserve` (grow by token slots,
    all or nothing; ``Error`` when the pool lacks pages), :meth:`fork` (shares every page;
    copy-on-write on the next reserve), :meth:`free`. Page contents start undefined; the
    reserved slots are written by :func:`kv_append` / :func:`rope_kv_append`, once per
    layer. The bookkeeping is not thread-safe (one scheduler thread).
    """

    def __init__(self, num_layers, num_pages, block_size, heads_kv, head_dim, dtype,
                 device="cpu", *, arena=None):
        code, bits, self._as_torch = _dtype_code(dtype)
        self._ordinal = _device_ordinal(device)
        if arena is not None and getattr(arena, "device", None) != (
                None if self._ordinal < 0 else self._ordinal):
            raise Error("ops_transformer.KVCache: arena: not on the cache's device")
        self._cache = _C.kv_cache_create(int(num_layers), int(num_pages), int(block_size),
                                         int(heads_kv), int(head_dim), code, bits,
                                         self._ordinal, None if arena is None else arena._a)
        self._layers = {}
        self._versioned = not self._as_torch and _NUMPY_VERSIONED
        self.num_layers = int(num_layers)
        self.block_size = int(block_size)

    @property
    def device(self):
        """"cpu" or "cuda:N"."""
        return "cpu" if self._ordinal < 0 else f"cuda:{self._ordinal}"

    def add_sequence(self):
        """A new empty sequence; returns its id."""
        return _C.kv_cache_seq(self._cache, 0, 0)

    def reserve(self, seq_ids, num_tokens):
        """Grow each sequence ``seq_ids[i]`` by ``num_tokens[i]`` token slots (an int for
        all), all or nothing: when the pool lacks pages ``Error`` says how many were
        needed and free, and no sequence changes. The ids must be distinct. A shared
        partial last page is copied first (copy-on-write; on CUDA on torch's current
        stream)."""
        if isinstance(seq_ids, _INT):
            seq_ids = (seq_ids,)
        if isinstance(num_tokens, _INT):
            num_tokens = (num_tokens,) * len(seq_ids)
        _C.kv_cache_reserve(None, self._cache, seq_ids, num_tokens)

    def free(self, seq_id):
        """Drop a sequence; its pages go back to the pool when no other holds them."""
        _C.kv_cache_seq(self._cache, 1, seq_id)

    def fork(self, seq_id):
        """A new sequence sharing every page and the length of ``seq_id``; returns its
        id."""
        return _C.kv_cache_seq(self._cache, 2, seq_id)

    def length(self, seq_id):
        """The number of tokens (reserved slots) of a sequence."""
        return _C.kv_cache_seq(self._cache, 3, seq_id)[0]

    def num_pages(self, seq_id):
        """The number of pages a sequence holds."""
        return _C.kv_cache_seq(self._cache, 3, seq_id)[1]

    def layer(self, layer):
        """``(k_pages, v_pages)`` of one layer: views of the pool, each
        ``[num_pages, heads_kv, block_size, head_dim]`` contiguous, on the cache's device
        (page p, kv head h, slot s holds token ``p_index * block_size + s`` of the
        sequences whose table has page p). They keep the pool alive."""
        pages = self._layers.get(layer)
        if pages is None:
            k, v = _C.kv_cache_layer(self._cache, layer, self._versioned)
            pages = (_import(k, self._ordinal, self._as_torch),
                     _import(v, self._ordinal, self._as_torch))
            self._layers[layer] = pages
        return pages

    def page_table(self, seq_ids, device=None):
        """The CSR page table of the batch ``seq_ids``: ``(indptr [n + 1], indices
        [pages of the batch], last_page_len [n])``, new int32 tensors (NumPy arrays for a
        NumPy cache), on ``device`` (default: the cache's device -- copied there for
        CUDA). Sequence b's pages are ``indices[indptr[b]:indptr[b + 1]]``; its length is
        ``(pages - 1) * block_size + last_page_len[b]``. A snapshot: reserve / fork / free
        do not change it.

        For a CUDA target the three arrays travel in one copy from pinned host memory,
        asynchronous on torch's current stream (no host synchronization, so a decode
        loop's host side can run ahead of the GPU): they are views of one device buffer,
        each starting on a 16-byte boundary."""
        if isinstance(seq_ids, _INT):
            seq_ids = (seq_ids,)
        caps = _C.kv_cache_page_table(self._cache, seq_ids, self._versioned)
        table = tuple(_import(c, -1, self._as_torch) for c in caps)
        target = self.device if device is None else device
        if self._as_torch and _torch.device(target).type != "cpu":
            table = _to_device_one_copy(table, _torch.device(target))
        return table

    def info(self):
        """The pool's state: num_layers, block_size, heads_kv, head_dim, num_pages,
        free_pages, shared_pages (held by 2 or more sequences), num_sequences, bytes
        (page storage, all layers, K and V)."""
        return _C.kv_cache_info(self._cache)

    def __repr__(self):
        i = self.info()
        return (f"KVCache(layers={i['num_layers']}, pages={i['num_pages']} "
                f"({i['free_pages']} free), block_size={i['block_size']}, "
                f"heads_kv={i['heads_kv']}, head_dim={i['head_dim']}, device={self.device})")


def _opt_rope(rope, rotary_dim, theta, interleaved, llama3_scaling):
    return _rope_args(interleaved, rotary_dim, theta, llama3_scaling) if rope else None


def _inplace_target(t, out):
    """What a custom op that rotates in place gets for input t and output out (compile
    path): t itself when out is t, else a copy of t (in out, or a new tensor)."""
    if t is None or out is t:
        return t
    return t.clone(memory_format=_torch.contiguous_format) if out is None else out.copy_(t)


def kv_append(k_new, v_new, k_pages, v_pages, indptr, indices, last_page_len,
              cu_seqlens_new, *, positions=None, rope=False, q=None, q_out=None,
              rotary_dim=0, theta=10000.0, interleaved=False, llama3_scaling=None):
    """Write new tokens' keys and values into their pages (``ot_kv_append``), optionally
    rotating k (and q) by RoPE first.

    The new tokens of sequence b are the last ``n_b`` tokens of its page table (the slots
    :meth:`KVCache.reserve` just added): rows ``cu_seqlens_new[b] .. cu_seqlens_new[b+1]``
    of ``k_new`` / ``v_new``.

    Parameters
    ----------
    k_new, v_new : [T_new, heads_kv, head_dim] in the pages' dtype (rows may be strided);
        not modified
    k_pages, v_pages : [num_pages, heads_kv, block_size, head_dim] (``KVCache.layer``)
    indptr, indices, last_page_len : int32, the batch's page table
        (``KVCache.page_table``)
    cu_seqlens_new : int32 [batch + 1] (a CPU tensor on the CPU)
    positions : int32 / int64 [T_new] or None: RoPE positions (None: each token's index
        in its sequence, ``length_b - n_b + i``)
    rope : bool, rotate k (and q) as :func:`rope` does with the parameters below
        (bit for bit the same values); needs ``rope=True`` for ``q``
    q : [T_new, heads_q, head_dim] or None, rotated into ``q_out`` (allocated when
        None; may be q itself)
    rotary_dim, theta, interleaved, llama3_scaling : as :func:`rope`

    Returns
    -------
    None, or ``q_out`` when q is given.
    """
    q = _arr(q, "q")
    if _is_compiling():
        # The custom op rotates q in place: rotate a copy of q (in q_out, or a new one).
        q_out = _inplace_target(q, q_out)
        _torch.ops.ops_transformer.kv_append(
            k_pages, v_pages, _arr(k_new, "k_new"), _arr(v_new, "v_new"), indptr, indices,
            last_page_len, cu_seqlens_new, positions, q_out, bool(rope),
            *_rope_args(interleaved, rotary_dim, theta, llama3_scaling))
        return q_out
    if q is not None and q_out is None:
        q_out = _empty_like(q)
    _C.kv_append(None, _opt_rope(rope, rotary_dim, theta, interleaved, llama3_scaling),
                 k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_new,
                 _arr(k_new, "k_new"), _arr(v_new, "v_new"), positions, q, q_out, None)
    return q_out


def rope_kv_append(q, k_new, v_new, k_pages, v_pages, indptr, indices, last_page_len,
                   cu_seqlens_new, *, positions=None, rotary_dim=0, theta=10000.0,
                   interleaved=False, llama3_scaling=None, inplace=False, q_out=None,
                   k_out=None):
    """RoPE on q and k and the scatter of k and v into their pages in one call
    (``ot_rope_kv_append``, the prefill form of :func:`kv_append`): the rotated k is
    written to the pages and also returned, for an attention that reads the new keys
    from the dense tensor.

    Parameters
    ----------
    q : [T_new, heads_q, head_dim] or None
    k_new, v_new, k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_new,
    positions : as :func:`kv_append`
    rotary_dim, theta, interleaved, llama3_scaling : as :func:`rope`
    inplace : rotate q and k_new in place (``q_out = q``, ``k_out = k_new``)
    q_out, k_out : optional preallocated outputs, q's and k_new's shapes (``k_out`` is
        k_new itself or shares no memory with any other argument)

    Returns
    -------
    ``(q_rot, k_rot)``, or ``k_rot`` when q is None. The pages' k and ``k_rot`` are bit
    for bit what :func:`rope` gives, ``q_rot`` likewise.
    """
    q = _arr(q, "q")
    k_new = _arr(k_new, "k_new")
    if inplace:
        q_out, k_out = q, k_new
    if _is_compiling():
        # The custom op rotates q and k_new in place: rotate copies unless in place.
        q_out = _inplace_target(q, q_out)
        k_out = _inplace_target(k_new, k_out)
        _torch.ops.ops_transformer.rope_kv_append(
            k_pages, v_pages, q_out, k_out, _arr(v_new, "v_new"), indptr, indices,
            last_page_len, cu_seqlens_new, positions,
            *_rope_args(interleaved, rotary_dim, theta, llama3_scaling))
        return (q_out, k_out) if q is not None else k_out
    if q is not None and q_out is None:
        q_out = _empty_like(q)
    if k_out is None:
        k_out = _empty_like(k_new)
    _C.kv_append(None, _rope_args(interleaved, rotary_dim, theta, llama3_scaling),
                 k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_new, k_new,
                 _arr(v_new, "v_new"), positions, q, q_out, k_out)
    return (q_out, k_out) if q is not None else k_out


def paged_attention(q, k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_q, *,
                    causal=False, softmax_scale=None, window=None, softcap=0.0, out=None,
                    return_lse=False):
    """Attention of new query tokens over the keys and values in the page table
    (``ot_paged_attention``): decode (1 query per sequence), a few (speculative
    decoding) or a chunk of already appended tokens (chunked prefill).

    Parameters
    ----------
    q : [T_q, heads_q, head_dim]; sequence b's queries are rows
        ``cu_seqlens_q[b] .. cu_seqlens_q[b+1]``; heads_q a multiple of heads_kv (GQA)
    k_pages, v_pages : [num_pages, heads_kv, block_size, head_dim] (``KVCache.layer``)
    indptr, indices, last_page_len : int32, the batch's page table
        (``KVCache.page_table``)
    cu_seqlens_q : int32 [batch + 1] (a CPU tensor on the CPU)
    causal : bool; the queries are the last n_b tokens of their sequence (bottom-right
        aligned, as :func:`attention` with Sq = n_b, Sk = length_b)
    softmax_scale, window, softcap : as :func:`attention`
    out : optional preallocated output, q's shape (must not overlap q or the pages)
    return_lse : also return lse, float32 [heads_q, T_q]

    Returns
    -------
    out, or ``(out, lse)``. Rows that see no key give out = 0, lse = -inf.
    """
    q = _arr(q, "q")
    if _is_compiling():
        o, lse = _torch.ops.ops_transformer.paged_attention(
            q, k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_q,
            *_attn_args(softmax_scale, causal, window, softcap, False)[:5], bool(return_lse))
        if out is not None:
            o = out.copy_(o)
        return (o, lse) if return_lse else o
    if out is None:
        out = _empty_like(q)
    lse = None
    if return_lse:   # (a q of another rank gets the C library's error about q)
        lse = _empty(q, (q.shape[1], q.shape[0]) if q.ndim == 3 else (0,), float32=True)
    _C.paged_attention(None, *_attn_args(softmax_scale, causal, window, softcap, False),
                       q, cu_seqlens_q, k_pages, v_pages, indptr, indices, last_page_len,
                       out, lse)
    return (out, lse) if return_lse else out
