"""ops_transformer.config: library-wide options, validated when set.

    >>> import ops_transformer as ot
    >>> ot.config.matmul_precision            # read
    'highest'
    >>> with ot.config.override(matmul_precision="highest"):
    ...     pass                               # scoped change
    >>> ot.config.as_dict()                    # all options

Options (the first value listed is the default):

``memory_allocator``: ``"torch"`` | ``"arena"``
    Where the frontend's output and workspace tensors come from. ``"torch"``: torch's
    caching allocator (NumPy's for NumPy inputs). ``"arena"``: the library's own
    arena allocator -- not built yet, so setting it raises ``NotImplementedError``.

``matmul_precision``: ``"highest"`` | ``"high"`` | ``"medium"``
    Precision of the products inside ``linear`` (and of future GEMM-based ops), in
    torch's vocabulary. ``"highest"``: float32 products and accumulation -- what every
    backend does today. ``"high"`` (TF32) and ``"medium"`` (bf16 products) would let the
    CUDA backend use faster tensor-core modes; no backend has them yet, so setting them
    raises ``NotImplementedError`` rather than being silently ignored.

``fused_attention``: ``True`` | ``False``
    ``True``: ``attention`` runs the library's flash-attention kernel (the scores are
    never materialized). ``False`` would select an unfused reference path for
    debugging; there is none yet, so setting ``False`` raises ``NotImplementedError``.

``persistent_kv_cache``: ``False`` | ``True``
    ``True`` would keep the paged KV cache's block pool alive between generate()
    calls. The paged KV cache is not built yet: setting ``True`` raises
    ``NotImplementedError``.

Invalid values raise ``ValueError`` (or ``TypeError`` for a wrong type); unknown
names raise ``AttributeError``.
"""

from __future__ import annotations

import contextlib

__all__ = ["Config", "config"]


class _Option:
    def __init__(self, name, kind, default, allowed, supported, subsystem, doc):
        self.name = name
        self.kind = kind            # bool or str
        self.default = default
        self.allowed = allowed      # every valid value
        self.supported = supported  # the values this build can honour
        self.subsystem = subsystem  # what is missing for the other values
        self.doc = doc

    def validate(self, value):
        if self.kind is bool:
            if not isinstance(value, bool):
                raise TypeError(f"ops_transformer.config.{self.name}: expected a bool, got "
                                f"{type(value).__name__}")
        elif not isinstance(value, str):
            raise TypeError(f"ops_transformer.config.{self.name}: expected a str, got "
                            f"{type(value).__name__}")
        if value not in self.allowed:
            raise ValueError(f"ops_transformer.config.{self.name}: {value!r}, expected one of "
                             f"{', '.join(repr(a) for a in self.allowed)}")
        if value not in self.supported:
            raise NotImplementedError(
                f"ops_transformer.config.{self.name}={value!r} needs {self.subsystem}, which "
                f"this version of ops_transformer does not have yet (supported: "
                f"{', '.join(repr(a) for a in self.supported)})")
        return value


_OPTIONS = {
    o.name: o for o in [
        _Option("memory_allocator", str, "torch", ("torch", "arena"), ("torch",),
                "the library's arena allocator",
                "where outputs and workspace are allocated"),
        _Option("matmul_precision", str, "highest", ("highest", "high", "medium"),
                ("highest",), "a TF32 / bf16 tensor-core GEMM path in a backend",
                "precision of the products inside linear"),
        _Option("fused_attention", bool, True, (True, False), (True,),
                "an unfused reference attention path",
                "attention runs the flash-attention kernel"),
        _Option("persistent_kv_cache", bool, False, (False, True), (False,),
                "the paged KV cache (block pool)",
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
        self._values[name] = opt.validate(value)

    def __dir__(self):
        return list(_OPTIONS) + ["set", "override", "as_dict", "reset", "describe"]

    def set(self, **options):
        """Set several options at once; all are validated before any is changed."""
        for name, value in options.items():
            opt = _OPTIONS.get(name)
            if opt is None:
                raise AttributeError(f"ops_transformer.config has no option {name!r}")
            opt.validate(value)
        self._values.update(options)

    @contextlib.contextmanager
    def override(self, **options):
        """Set options for the duration of a with-block."""
        saved = dict(self._values)
        self.set(**options)
        try:
            yield self
        finally:
            self._values.clear()
            self._values.update(saved)

    def as_dict(self):
        return dict(self._values)

    def reset(self):
        """Back to the defaults."""
        self._values.update({n: o.default for n, o in _OPTIONS.items()})

    def describe(self):
        """One line per option: name, value, allowed values, effect."""
        lines = []
        for n, o in _OPTIONS.items():
            lines.append(f"{n} = {self._values[n]!r}  (allowed {list(o.allowed)}, supported "
                         f"{list(o.supported)}): {o.doc}")
        return "\n".join(lines)

    def __repr__(self):
        return "ops_transformer.config(" + ", ".join(
            f"{k}={v!r}" for k, v in self._values.items()) + ")"


config = Config()
