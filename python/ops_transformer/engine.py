"""ops_transformer.engine: the library's Llama-family engine (src/engine) from Python.

    >>> from ops_transformer.engine import Engine
    >>> eng = Engine.random("tiny", seed=1)                 # a named shape, random weights
    >>> out = eng.generate([1, 2, 3], max_new_tokens=8)
    >>> out.tokens, out.first_token_ms, out.tokens_per_s

    >>> eng = Engine.from_pretrained("path/to/hf_dir", dtype="bf16", device="cuda")
    >>> eng.generate("Once upon a time", max_new_tokens=32).text   # with a HF tokenizer

The engine is a C library of its own, ``libot_engine.so`` (built with the tools:
``cmake -DOT_BUILD_TOOLS=ON``), loaded here with ctypes: the work per call is a whole
prefill or decode step, so a thin binding costs nothing measurable. It is found at
``$OT_ENGINE_LIB``, beside this file, or in the source tree's build folders
(``build*/src/engine``), in that order.

Prompts: a list of token ids, a list of such lists (one sequence each, prefilled together
as one packed batch), or text (a string or a list of strings) when a tokenizer is given
or the model directory has one and ``transformers`` is installed.
"""

from __future__ import annotations

import array
import ctypes
import glob
import os
import pathlib
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

__all__ = ["Engine", "GenerateResult", "EngineError", "config_names", "find_library"]


class EngineError(RuntimeError):
    """A failed engine call; the message is the engine's (naming the file, tensor or op)."""


class _Sampler(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int),
                ("top_p", ctypes.c_float), ("rng_state", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _fields_ = [("load_ms", ctypes.c_double), ("first_token_ms", ctypes.c_double),
                ("decode_ms", ctypes.c_double), ("decode_steps", ctypes.c_long),
                ("decode_tokens", ctypes.c_long), ("cuda_graph", ctypes.c_int)]


class _Memory(ctypes.Structure):
    _fields_ = [("weights", ctypes.c_size_t), ("kv_cache", ctypes.c_size_t),
                ("activations", ctypes.c_size_t), ("weights_host", ctypes.c_size_t),
                ("offload_ring", ctypes.c_size_t)]


_LOGITS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int,
                              ctypes.POINTER(ctypes.c_float), ctypes.c_int)
_lib = None


def find_library() -> str:
    """The path of libot_engine.so that :class:`Engine` loads."""
    env = os.environ.get("OT_ENGINE_LIB")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    if (here / "libot_engine.so").exists():
        return str(here / "libot_engine.so")
    root = here.parents[1]
    found = sorted(glob.glob(str(root / "build*" / "src" / "engine" / "libot_engine.so")),
                   key=lambda p: (pathlib.Path(p).parts[-4] != "build", -os.path.getmtime(p)))
    if not found:
        raise EngineError("libot_engine.so not found: build the tools (cmake -DOT_BUILD_TOOLS=ON; "
                          "scripts/test.sh builds build/) or set OT_ENGINE_LIB")
    return found[0]


def _load():
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(find_library())
    P, I, U64, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p
    i32p = ctypes.POINTER(ctypes.c_int32)
    intp = ctypes.POINTER(ctypes.c_int)
    sig = {
        "ote_last_error": (S, []),
        "ote_config_names": (S, []),
        "ote_engine_open": (I, [S, S, U64, S, S, I, I, I, I, ctypes.c_size_t,
                                ctypes.POINTER(P)]),
        "ote_engine_destroy": (None, [P]),
        "ote_engine_shape": (None, [P, ctypes.POINTER(ctypes.c_int64)]),
        "ote_engine_memory": (_Memory, [P]),
        "ote_prefill": (I, [P, I, intp, i32p, i32p, ctypes.POINTER(ctypes.c_float)]),
        "ote_decode": (I, [P, I, intp, i32p, ctypes.POINTER(ctypes.c_float)]),
        "ote_prefill_greedy": (I, [P, I, intp, i32p, i32p, i32p]),
        "ote_decode_greedy": (I, [P, I, intp, i32p, i32p]),
        "ote_seq_len": (I, [P, I]),
        "ote_seq_free": (None, [P, I]),
        "ote_generate": (I, [P, I, i32p, i32p, I, ctypes.POINTER(_Sampler), i32p, I, i32p, intp,
                             _LOGITS_FN, P, ctypes.POINTER(_Stats)]),
        "ote_decode_graph_active": (I, [P]),
        "ote_decode_graph_note": (S, [P]),
        "ote_engine_export": (I, [P, S, P, ctypes.c_size_t]),
        "ote_engine_set_profile": (I, [P, I]),
        "ote_engine_profile_report": (None, [P, ctypes.c_char_p, ctypes.c_size_t]),
        "ote_engine_last_timing": (None, [P, ctypes.POINTER(ctypes.c_double)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib = lib
    return lib


def config_names() -> list:
    """The named configurations (shapes) :meth:`Engine.random` knows."""
    return [s.strip() for s in _load().ote_config_names().decode().split(",")]


def _i32(values):
    # through array.array: ~6x faster than ctypes' argument unpacking for a 2048-token
    # prompt (~0.06 vs ~0.4 ms, host time before the prefill starts), and an id outside
    # int32 raises OverflowError where the ctypes constructor would wrap it silently
    a = array.array("i", values)
    if not a:
        return (ctypes.c_int32 * 1)()
    return (ctypes.c_int32 * len(a)).from_buffer_copy(a)


@dataclass
class GenerateResult:
    """Tokens generated per prompt (the prompt excluded), text when a tokenizer was used,
    and the timings of the run (milliseconds; decode_ms covers every decode step)."""
    tokens: list
    text: Optional[list] = None
    first_token_ms: float = 0.0
    decode_ms: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0
    cuda_graph: bool = False
    logits: Optional[list] = field(default=None, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens * 1e3 / self.decode_ms if self.decode_ms > 0 else 0.0


class Engine:
    """One loaded model. ``dtype``: "f32", "bf16" or "f16" (storage of weights,
    activations and KV cache); ``device``: "cpu" or "cuda" ("cuda:N");
    ``max_seqs``: sequences per batch; ``max_len``: tokens per sequence (prompt and
    generated; 0 = min(max_position, 4096)); ``threads``: CPU threads (0 = OpenMP's);
    ``offload`` (CUDA): stream the layers' weights from pinned host memory;
    ``offload_budget``: with offload, device bytes for all weights -- the first layers
    that fit stay resident, the others stream (0: every layer streams)."""

    def __init__(self, model_dir=None, *, config=None, seed=0, dtype="f32", device="cpu",
                 max_seqs=1, max_len=0, threads=0, offload=False, offload_budget=0,
                 tokenizer=None):
        if (model_dir is None) == (config is None):
            raise ValueError("give a model directory or config=<name>")
        if offload_budget < 0:
            raise ValueError("offload_budget is a number of bytes (>= 0)")
        self._lib = _load()
        self._e = ctypes.c_void_p()
        st = self._lib.ote_engine_open(
            None if model_dir is None else str(model_dir).encode(),
            None if config is None else config.encode(), int(seed), dtype.encode(),
            device.encode(), int(max_seqs), int(max_len), int(threads), int(bool(offload)),
            int(offload_budget), ctypes.byref(self._e))
        if st != 0:
            raise EngineError(self._lib.ote_last_error().decode())
        v = (ctypes.c_int64 * 9)()
        self._lib.ote_engine_shape(self._e, v)
        (self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn,
         self.vocab, self.max_position, eos) = list(v)
        self.eos_token_id = None if eos < 0 else eos
        self.dtype, self.device, self.max_seqs = dtype, device, max_seqs
        self.model_dir = model_dir
        self._tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, model_dir, **kw) -> "Engine":
        """A HF model directory (config.json + *.safetensors, sharded or not)."""
        return cls(model_dir, **kw)

    @classmethod
    def random(cls, config, seed=1, **kw) -> "Engine":
        """A named configuration (:func:`config_names`) or a model directory's
        config.json, with random weights from ``seed`` (>= 1)."""
        if seed == 0:
            raise ValueError("seed must be >= 1 (0 means 'load the weights')")
        if os.path.isdir(str(config)) or str(config).endswith(".json"):
            return cls(config, seed=seed, **kw)
        return cls(config=config, seed=seed, **kw)

    # ---- lifetime ---------------------------------------------------------------------
    def close(self):
        if getattr(self, "_e", None) and self._e.value:
            self._lib.ote_engine_destroy(self._e)
            self._e = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check(self, st):
        if st != 0:
            raise EngineError(self._lib.ote_last_error().decode())

    # ---- facts ------------------------------------------------------------------------
    def memory(self) -> dict:
        """Bytes held by tag: weights (device), kv_cache, activations; with weight
        streaming also weights_host (pinned) and offload_ring (device slots)."""
        m = self._lib.ote_engine_memory(self._e)
        return {"weights": m.weights, "kv_cache": m.kv_cache, "activations": m.activations,
                "weights_host": m.weights_host, "offload_ring": m.offload_ring}

    def seq_len(self, seq: int) -> int:
        return self._lib.ote_seq_len(self._e, seq)

    def free(self, seq: int):
        """Empty a sequence slot (its KV pages go back to the pool)."""
        self._lib.ote_seq_free(self._e, seq)

    @property
    def cuda_graph(self) -> bool:
        """Whether the last decode step replayed a CUDA graph."""
        return bool(self._lib.ote_decode_graph_active(self._e))

    @property
    def cuda_graph_note(self) -> str:
        return self._lib.ote_decode_graph_note(self._e).decode()

    def set_profile(self, on: bool):
        """CUDA: time every op of each forward (eagerly, with events); clears the sums and
        the decode graphs (captured again once it is off). A no-op on the CPU. Raises
        EngineError when the profile's CUDA events cannot be created (it stays off)."""
        self._check(self._lib.ote_engine_set_profile(self._e, 1 if on else 0))

    def profile_report(self) -> str:
        """Mean milliseconds per forward by kind of op, per phase (see set_profile)."""
        buf = ctypes.create_string_buffer(4096)
        self._lib.ote_engine_profile_report(self._e, buf, len(buf))
        return buf.value.decode()

    def last_timing(self) -> dict:
        """Where the last prefill / decode call spent its time (milliseconds): ``host_prep``
        before the forward was enqueued, ``enqueue`` (the ops' host work, or one graph
        launch), ``wait`` for the GPU and the results, ``gpu`` from the forward's first op
        to its last (CUDA events; -1 on the CPU or with the profile on), ``total``; and
        ``phase`` ("prefill" / "decode")."""
        v = (ctypes.c_double * 6)()
        self._lib.ote_engine_last_timing(self._e, v)
        keys = ("host_prep", "enqueue", "wait", "gpu", "total")
        out = {k: float(v[i]) for i, k in enumerate(keys)}
        out["phase"] = "decode" if v[5] else "prefill"
        return out

    # ---- tokens -----------------------------------------------------------------------
    def tokenizer(self):
        """The HF tokenizer of the model directory (transformers), or None."""
        if self._tokenizer is None and self.model_dir is not None:
            try:
                from transformers import AutoTokenizer
                self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
            except Exception:
                self._tokenizer = False
        return self._tokenizer or None

    def _prompts(self, prompts, tokenizer):
        is_text = isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], str))
        if is_text:
            tok = tokenizer or self.tokenizer()
            if tok is None:
                raise EngineError("text prompts need a tokenizer (transformers and a tokenizer "
                                  "in the model directory, or tokenizer=)")
            texts = [prompts] if isinstance(prompts, str) else list(prompts)
            return [list(tok(t)["input_ids"]) for t in texts], tok
        if prompts and isinstance(prompts[0], int):
            return [list(prompts)], None
        return [list(p) for p in prompts], None

    # ---- steps ------------------------------------------------------------------------
    def prefill(self, prompts: Sequence[Sequence[int]], seqs=None, greedy=False):
        """Prefill prompts into slots ``seqs`` (default 0..n-1; they are emptied first).
        Returns float32 logits [n, vocab] of each prompt's last token (numpy), or with
        greedy=True the argmax ids (computed on the device)."""
        import numpy as np
        n = len(prompts)
        seqs = list(range(n)) if seqs is None else list(seqs)
        cu = [0]
        for p in prompts:
            cu.append(cu[-1] + len(p))
        flat = [t for p in prompts for t in p]
        sa = (ctypes.c_int * n)(*seqs)
        if greedy:
            out = (ctypes.c_int32 * n)()
            self._check(self._lib.ote_prefill_greedy(self._e, n, sa, _i32(flat), _i32(cu), out))
            return list(out)
        lg = np.empty((n, self.vocab), dtype=np.float32)
        self._check(self._lib.ote_prefill(self._e, n, sa, _i32(flat), _i32(cu),
                                          lg.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        return lg

    def decode(self, tokens: Sequence[int], seqs=None, greedy=False):
        """One decode step: tokens[i] appended to slot seqs[i] (default 0..n-1).
        Returns logits [n, vocab] (numpy float32), or the argmax ids with greedy=True."""
        import numpy as np
        n = len(tokens)
        seqs = list(range(n)) if seqs is None else list(seqs)
        sa = (ctypes.c_int * n)(*seqs)
        if greedy:
            out = (ctypes.c_int32 * n)()
            self._check(self._lib.ote_decode_greedy(self._e, n, sa, _i32(list(tokens)), out))
            return list(out)
        lg = np.empty((n, self.vocab), dtype=np.float32)
        self._check(self._lib.ote_decode(self._e, n, sa, _i32(list(tokens)),
                                         lg.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        return lg

    def export(self, name: str, ptr: int, nbytes: int):
        """Copy the weight HF calls ``name`` into memory at ``ptr`` (the engine's device:
        e.g. a torch tensor's data_ptr() of the engine's dtype) of exactly its size."""
        self._check(self._lib.ote_engine_export(self._e, name.encode(), ctypes.c_void_p(ptr),
                                                int(nbytes)))

    def generate(self, prompts: Union[str, Sequence], max_new_tokens=32, *, temperature=0.0,
                 top_k=0, top_p=1.0, seed=0, stop=None, tokenizer=None,
                 return_logits=False) -> GenerateResult:
        """Generate up to max_new_tokens per prompt: greedy by default (argmax on the
        device), else temperature / top-k / top-p sampling from ``seed``. ``stop``: token
        ids that end a sequence (default: the model's eos when it has one; [] for none).
        return_logits: the float32 logits of every step, a list of [n_live, vocab]."""
        import numpy as np
        ids, tok = self._prompts(prompts, tokenizer)
        n = len(ids)
        if n == 0 or any(len(p) == 0 for p in ids):
            raise ValueError("empty prompt")
        if stop is None:
            stop = [] if self.eos_token_id is None else [self.eos_token_id]
        cu = [0]
        for p in ids:
            cu.append(cu[-1] + len(p))
        flat = [t for p in ids for t in p]
        smp = _Sampler(float(temperature), int(top_k), float(top_p), int(seed))
        m = max(int(max_new_tokens), 1)
        out = (ctypes.c_int32 * (n * m))()
        n_out = (ctypes.c_int * n)()
        stats = _Stats()
        steps = []

        def on_logits(_user, n_live, lg, vocab):
            steps.append(np.ctypeslib.as_array(lg, shape=(n_live * vocab,))
                         .reshape(n_live, vocab).copy())

        cb = _LOGITS_FN(on_logits) if return_logits else _LOGITS_FN()
        self._check(self._lib.ote_generate(self._e, n, _i32(flat), _i32(cu), int(max_new_tokens),
                                           ctypes.byref(smp), _i32(list(stop)), len(stop), out,
                                           n_out, cb, None, ctypes.byref(stats)))
        tokens = [list(out[i * m: i * m + n_out[i]]) for i in range(n)]
        text = [tok.decode(t) for t in tokens] if tok is not None else None
        return GenerateResult(tokens=tokens, text=text, first_token_ms=stats.first_token_ms,
                              decode_ms=stats.decode_ms, decode_steps=stats.decode_steps,
                              decode_tokens=stats.decode_tokens,
                              cuda_graph=bool(stats.cuda_graph),
                              logits=steps if return_logits else None)
