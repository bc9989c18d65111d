"""ops_transformer.config: library-wide options, validated when set.

    >>> import ops_transformer as ot
    >>> ot.config.matmul_precision            # read
    'highest'
    >>> with ot.config.override(matmul_precision="highest"):
    ...     pass                               # scoped change
    >>> ot.config.as_dict()                    # all options

Options (the first value listed is the default):

``memory_allocator``: ``"torch"`` | ``"arena"``
    Where the CUDA backend's own temporaries come from -- split-KV / split-K partials and
    other op scratch, cross-entropy row losses, the fused LM-head loss's workspace, the
    cuBLASLt workspace. ``"torch"``: per-context buffers (a growable ``cudaMalloc`` block,
    ``cudaMallocAsync``; src/cuda/context.cu). ``"arena"``: each CUDA context the frontend
    uses gets an ``ot_arena`` of ``memory_arena_bytes`` on its device (reserved once, at the
    context's next use) and ``ot_context_set_arena``: every op takes its temporaries from
    it on the op's stream and gives them back when it returns (the cuBLASLt workspace,
    32 MiB, stays taken while attached), so the library never calls ``cudaMalloc`` after
    that reservation and ``profiler.MemoryTracker`` reports the temporaries under the
    ``workspace`` tag and the op's name. An op whose temporaries do not fit raises
    ``ops_transformer.Error`` (status "out of memory") naming the op, the request and the
    largest free block: raise ``memory_arena_bytes``. Output tensors are still torch's
    (its caching allocator); CPU ops are not affected (their temporaries are per-call host
    allocations). Changing either option detaches the arenas (they are freed; new ones are
    made on next use). ``profiler.context_arena_stats(device)`` reads one. Before capturing
    a CUDA graph run one library op on the device (torch's usual warm-up): the arena's
    reservation is a ``cudaMalloc``, which a capture does not allow; captured ops keep
    their temporaries for the graph until the arena is detached.

``memory_arena_bytes``: an int >= 64 MiB (default 512 MiB)
    The size of each CUDA context's arena under ``memory_allocator="arena"`` (it must hold
    the 32 MiB cuBLASLt workspace plus the largest set of temporaries one op needs).

``matmul_precision``: ``"highest"`` | ``"high"`` | ``"medium"`` (``"tf32"`` = ``"high"``)
    Precision of float32 matrix products, in torch's vocabulary, applied when set to
    both torch and the library: ``torch.set_float32_matmul_precision(value)`` (``"high"``
    and ``"medium"`` let torch's float32 GEMMs -- the patched model's projections and
    the fused LM-head loss's chunk GEMMs -- use TF32 / bf16 tensor cores; torch sets
    ``torch.backends.cuda.matmul.allow_tf32`` from it) and, for the library's own GEMMs
    (``linear``, ``linear_cross_entropy`` on CUDA, cuBLASLt), the environment variable
    ``OT_MATMUL_ALLOW_TF32`` that src/cuda/gemm.h reads when a GEMM runs: ``"1"``
    (CUBLAS_COMPUTE_32F_FAST_TF32) for ``"high"`` and ``"medium"`` (the library has no
    bf16-product mode: ``"medium"`` is TF32 there), unset for ``"highest"``. The CPU
    backend always multiplies in float32. bfloat16 / float16 inputs are unaffected.

``fused_attention``: ``"auto"`` (default) | ``True`` | ``False``
    ``"auto"``: the library's kernel, except for attention that autograd will
    differentiate on a CUDA device: there the library's kernels run only where its Hopper
    backward takes the call (sm_90, bf16 / fp16, head dim 64 / 96 / 128 / 256, dense, no
    window) and torch's SDPA would run a backend the library beats (flash at head dim 96,
    128 and 256, efficient and math at 64 / 96 / 128 / 256); otherwise torch's SDPA.
    Decided once per (device, dtype, head dim, heads, kv heads, causal, length bucket: the
    sequence length's power of two) from ``torch._fused_sdp_choice`` (host-side, no device
    work; again when torch's SDPA flags change: enabled backends, priority order, flash
    implementation -- with FA3 / FA4 activated, flash is not the FA2 measured below and
    keeps the call); ``patch_model`` decides for the model's shape eagerly at the
    lengths 64, 128, ... up to min(max_position_embeddings, 16384), so torch.compile
    reads the decisions. ``True``: the patched models' attention runs the
    library's flash-attention kernel (the scores are never materialized) where the
    library has it for the device, dtype and head dim (probed once; torch's SDPA
    otherwise). ``False``: the patched attention calls torch's
    ``scaled_dot_product_attention`` instead (the q/k/v projections, RoPE and the rest
    stay the library's) -- for debugging or comparing. ``ops_transformer.attention``
    itself always runs the library's kernel.
    Measured on the H200 (docs/PERFORMANCE.md, "Training (CUDA)"; torch 2.11, cuDNN
    9.19): torch picks cuDNN for every Llama training shape there, and cuDNN's forward +
    backward is 1.5x the library's at 2k tokens (1.25x at 16k), so ``"auto"`` runs
    torch's SDPA in training there; the library's beats torch's flash backend at head dim
    128 (1.13x at 2k, 1.5x at 16k) but not at 64 (0.94x).

``persistent_kv_cache``: ``False`` | ``True``
    For ``ops_transformer.engine`` (the Python wrapper of the C engine, src/engine):
    ``True`` keeps the paged KV cache's block pool alive between ``generate()`` calls
    instead of freeing it after each. Accepted only when the engine module reads it
    (it then sets ``READS_PERSISTENT_KV_CACHE = True``); today's engine module does not
    (its pool lives as long as the ``Engine`` object), so setting ``True`` raises
    ``NotImplementedError`` rather than being silently ignored.

Invalid values raise ``ValueError`` (or ``TypeError`` for a wrong type); unknown
names raise ``AttributeError``.
"""

from __future__ import annotations

import contextlib

__all__ = ["Config", "config"]


class _Option:
    def __init__(self, name, kind, default, allowed, supported, subsystem, doc,
                 apply=None, aliases=None, minimum=None):
        self.apply = apply          # apply(value): the option's effect outside this object
        self.minimum = minimum      # int options: the smallest value
        self.aliases = aliases or {}
        self.name = name
        self.kind = kind            # bool or str
        self.default = default
        self.allowed = allowed      # every valid value
        self.supported = supported  # the values this build can honour
        self.subsystem = subsystem  # what is missing for the other values
        self.doc = doc

    def validate(self, value):
        value = self.aliases.get(value, value) if isinstance(value, str) else value
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"ops_transformer.config.{self.name}: expected an int, got "
                                f"{type(value).__name__} {value!r}")
            if value < self.minimum:
                raise ValueError(f"ops_transformer.config.{self.name}: {value}, expected >= "
                                 f"{self.minimum}")
            return value
        if self.kind is bool and value != "auto":
            if not isinstance(value, bool):
                others = [repr(a) for a in self.allowed if not isinstance(a, bool)]
                raise TypeError(f"ops_transformer.config.{self.name}: expected a bool"
                                f"{''.join(' or ' + o for o in others)}, got "
                                f"{type(value).__name__} {value!r}")
        elif self.kind is not bool and not isinstance(value, str):
            raise TypeError(f"ops_transformer.config.{self.name}: expected a str, got "
                            f"{type(value).__name__}")
        if value not in self.allowed:
            raise ValueError(f"ops_transformer.config.{self.name}: {value!r}, expected one of "
                             f"{', '.join(repr(a) for a in self.allowed)}")
        supported = self.supported() if callable(self.supported) else self.supported
        if value not in supported:
            raise NotImplementedError(
                f"ops_transformer.config.{self.name}={value!r} needs {self.subsystem}, which "
                f"this version of ops_transformer does not have yet (supported: "
                f"{', '.join(repr(a) for a in supported)})")
        return value


def _apply_matmul_precision(value):
    import os
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_float32_matmul_precision(value)
    if value == "highest":
        os.environ.pop("OT_MATMUL_ALLOW_TF32", None)
    else:
        os.environ["OT_MATMUL_ALLOW_TF32"] = "1"


def _apply_arena(_value=None):
    # Both memory options: the C binding's policy for the CUDA contexts (arenas are made
    # on each context's next use, so setting the options reserves nothing yet).
    from . import _C
    values = config._values if "config" in globals() else {}
    on = values.get("memory_allocator", "torch") == "arena"
    _C.context_arena_policy(values.get("memory_arena_bytes", _ARENA_DEFAULT) if on else 0)


_ARENA_DEFAULT = 512 << 20


def _kv_cache_values():
    # True only where the engine module says it reads the option (its module attribute
    # READS_PERSISTENT_KV_CACHE); otherwise True would be silently ignored.
    try:
        from . import engine
    except Exception:  # noqa: BLE001  (no engine module / its library in this build)
        return (False,)
    return (False, True) if getattr(engine, "READS_PERSISTENT_KV_CACHE", False) else (False,)


_OPTIONS = {
    o.name: o for o in [
        _Option("memory_allocator", str, "torch", ("torch", "arena"), ("torch", "arena"), "",
                "where the CUDA backend's temporaries (scratch, workspaces) come from: "
                "per-context buffers ('torch') or an ot_arena per context ('arena')",
                apply=_apply_arena),
        _Option("memory_arena_bytes", int, _ARENA_DEFAULT, None, None, "",
                "size of each CUDA context's arena under memory_allocator='arena'",
                apply=_apply_arena, minimum=64 << 20),
        _Option("matmul_precision", str, "highest", ("highest", "high", "medium"),
                ("highest", "high", "medium"), "",
                "precision of float32 matrix products (torch's and the library's GEMMs)",
                apply=_apply_matmul_precision, aliases={"tf32": "high"}),
        _Option("fused_attention", bool, "auto", ("auto", True, False), ("auto", True, False), "",
                "patched attention: the library's flash kernel (True), torch's SDPA "
                "(False), or the library's except where autograd differentiates it on "
                "CUDA ('auto')"),
        _Option("persistent_kv_cache", bool, False, (False, True), _kv_cache_values,
                "ops_transformer.engine reading it (READS_PERSISTENT_KV_CACHE)",
                "keep the KV block pool alive between generate() calls"),
    ]
}


class Config:
    """The options of ops_transformer; see the module docstring for each one."""

    __slots__ = ("_values",)

    def __init__(self):
        object.__setattr__(self, "_values", {n: o.default for n, o in _OPTIONS.items()})

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"ops_transformer.config has no option {name!r} (options: "
                                 f"{', '.join(_OPTIONS)})") from None

    def __setattr__(self, name, value):
        opt = _OPTIONS.get(name)
        if opt is None:
            raise AttributeError(f"ops_transformer.config has no option {name!r} (options: "
                                 f"{', '.join(_OPTIONS)})")
        self._store({name: opt.validate(value)})

    def __dir__(self):
        return list(_OPTIONS) + ["set", "override", "as_dict", "reset", "describe"]

    def set(self, **options):
        """Set several options at once; all are validated before any is changed."""
        checked = {}
        for name, value in options.items():
            opt = _OPTIONS.get(name)
            if opt is None:
                raise AttributeError(f"ops_transformer.config has no option {name!r}")
            checked[name] = opt.validate(value)
        self._store(checked)

    def _store(self, values):
        for name, value in values.items():
            self._values[name] = value
            if _OPTIONS[name].apply is not None:
                _OPTIONS[name].apply(value)

    @contextlib.contextmanager
    def override(self, **options):
        """Set options for the duration of a with-block."""
        saved = dict(self._values)
        self.set(**options)
        try:
            yield self
        finally:
            self._store(saved)

    def as_dict(self):
        return dict(self._values)

    def reset(self):
        """Back to the defaults."""
        self._store({n: o.default for n, o in _OPTIONS.items()})

    def describe(self):
        """One line per option: name, value, allowed values, effect."""
        lines = []
        for n, o in _OPTIONS.items():
            if o.kind is int:
                lines.append(f"{n} = {self._values[n]!r}  (an int >= {o.minimum}): {o.doc}")
                continue
            sup = o.supported() if callable(o.supported) else o.supported
            lines.append(f"{n} = {self._values[n]!r}  (allowed {list(o.allowed)}, supported "
                         f"{list(sup)}): {o.doc}")
        return "\n".join(lines)

    def __repr__(self):
        return "ops_transformer.config(" + ", ".join(
            f"{k}={v!r}" for k, v in self._values.items()) + ")"


config = Config()
