"""ops_transformer.profiler -- where the memory of a run went.

    >>> from ops_transformer.profiler import MemoryTracker
    >>> tracker = MemoryTracker()
    >>> with tracker.trace():
    ...     run_one_step()
    >>> print(tracker.format_report())      # or tracker.report() for a dict

The library side comes from the C tracker (``ot_memory_*``, see include/ops_transformer.h,
"Memory: tracker"): every arena block and KV pool the library hands out, by tag
(weights, kv_cache, activations, workspace, other) and by op name. Inside the window the
report gives each tag's and op's bytes at the start, at the end and at the window's
peak, and the allocations / frees made in it; ``peak_bytes`` is the peak of the sum
over all tags (not the sum of the tags' peaks).

Next to it, when torch is present and CUDA is initialized, the same window as torch's
caching allocator saw it (``torch.cuda.max_memory_allocated`` etc. after
``reset_peak_memory_stats``, the device synchronized at both ends): the two allocators
are separate, so ``combined_peak_upper_bound_bytes`` (library peak + torch peak) bounds
what the run needed of the device beyond the CUDA context itself.

The C counters are process-wide: a trace resets their peaks (``ot_memory_reset_peaks``),
so traces must not overlap (nesting raises), and allocations by other threads in the
window count too.

:class:`Arena` wraps ``ot_arena`` (one reservation, sub-allocated; tagged allocations
feed the tracker) for code that manages raw buffers from Python.
"""
import contextlib
import weakref

from . import _C

TAGS = ("weights", "kv_cache", "activations", "workspace", "other")
_TAG_INDEX = {t: i for i, t in enumerate(TAGS)}

__all__ = ["MemoryTracker", "Arena", "TAGS", "counters", "context_arena_stats"]

_ARENAS = weakref.WeakSet()  # every live Arena, for the device section of a report


def context_arena_stats(device=None):
    """Stats (as :meth:`Arena.stats`) of the arena that CUDA device `device`'s context
    takes its temporaries from (``config.memory_allocator = "arena"``), or None when it
    has none (not in arena mode, or no op ran on that device since)."""
    if device is None:
        import torch
        device = torch.cuda.current_device()
    cap = _C.context_arena(int(device))
    return None if cap is None else _C.arena_stats(cap)


def _arena_reserved(dev):
    """Bytes reserved on CUDA device `dev` by the arenas the frontend knows: Arena
    objects and the contexts' arenas."""
    total = sum(a.stats()["reserved"] for a in list(_ARENAS) if a.device == dev)
    ctx = context_arena_stats(dev)
    return total + (ctx["reserved"] if ctx else 0)


def counters():
    """The C tracker now: {"tags": {tag: {...}}, "ops": {op: {...}}, "total": {...}} with
    current, peak, allocs, frees (bytes / counts)."""
    raw = _C.memory_counters()

    def d(t):
        return {"current": t[0], "peak": t[1], "allocs": t[2], "frees": t[3]}

    return {"tags": {k: d(v) for k, v in raw["tags"].items()},
            "ops": {k: d(v) for k, v in raw["ops"].items()},
            "total": d(raw["total"])}


def _torch_cuda(device):
    """torch and the device index when torch's CUDA is initialized, else (None, None)."""
    try:
        import torch
    except ImportError:
        return None, None
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None, None
    if device is None:
        return torch, torch.cuda.current_device()
    if isinstance(device, int):
        return torch, device
    index = torch.device(device).index
    return torch, torch.cuda.current_device() if index is None else index


def _window(c0, c1):
    """Start / end / peak / allocs / frees of one counter across the window."""
    return {"start_bytes": c0["current"], "end_bytes": c1["current"], "peak_bytes": c1["peak"],
            "allocs": c1["allocs"] - c0["allocs"], "frees": c1["frees"] - c0["frees"]}


class MemoryTracker:
    """Memory of a traced window: the library's (C tracker) and torch's caching allocator.

    device: the CUDA device whose torch statistics are read (default: current).
    """

    def __init__(self, device=None):
        self.device = device
        self._active = False
        self._c0 = self._c1 = None
        self._t0 = self._t1 = None

    @contextlib.contextmanager
    def trace(self):
        if self._active:
            raise RuntimeError("MemoryTracker.trace: already tracing (traces must not nest: the "
                               "C tracker's peaks are process-wide)")
        self._active = True
        self._begin()
        try:
            yield self
        finally:
            self._end()
            self._active = False

    def _begin(self):
        self._c1 = self._t1 = None
        torch, dev = _torch_cuda(self.device)
        if torch is not None:
            torch.cuda.synchronize(dev)
            free, total = torch.cuda.mem_get_info(dev)
            self._t0 = {"allocated": torch.cuda.memory_allocated(dev),
                        "reserved": torch.cuda.memory_reserved(dev), "device": dev,
                        "used": total - free, "arenas": _arena_reserved(dev)}
            torch.cuda.reset_peak_memory_stats(dev)
        else:
            self._t0 = None
        _C.memory_reset_peaks()
        self._c0 = counters()

    def _end(self):
        if self._t0 is not None:
            import torch
            dev = self._t0["device"]
            torch.cuda.synchronize(dev)
            st = torch.cuda.memory_stats(dev)
            free, total = torch.cuda.mem_get_info(dev)
            self._t1 = {"used": total - free, "arenas": _arena_reserved(dev),
                        "allocated": torch.cuda.memory_allocated(dev),
                        "reserved": torch.cuda.memory_reserved(dev),
                        "peak_allocated": torch.cuda.max_memory_allocated(dev),
                        "peak_reserved": torch.cuda.max_memory_reserved(dev),
                        "alloc_retries": st.get("num_alloc_retries", 0),
                        "ooms": st.get("num_ooms", 0)}
        self._c1 = counters()

    def report(self):
        """The last traced window as a dict (see the module docstring)."""
        if self._c1 is None:
            raise RuntimeError("MemoryTracker.report: no finished trace (use `with "
                               "tracker.trace(): ...` first)")
        c0, c1 = self._c0, self._c1
        by_tag = {t: _window(c0["tags"][t], c1["tags"][t]) for t in TAGS}
        zero = {"current": 0, "peak": 0, "allocs": 0, "frees": 0}
        by_op = {}
        for op, now in c1["ops"].items():
            w = _window(c0["ops"].get(op, zero), now)
            if w["allocs"] or w["frees"] or w["end_bytes"]:
                by_op[op] = w
        lib = {"peak_bytes": c1["total"]["peak"], "start_bytes": c0["total"]["current"],
               "end_bytes": c1["total"]["current"],
               "allocs": c1["total"]["allocs"] - c0["total"]["allocs"],
               "frees": c1["total"]["frees"] - c0["total"]["frees"],
               "by_tag": by_tag, "by_op": by_op}
        out = {"library": lib, "torch": None, "device": None,
               "combined_peak_upper_bound_bytes": lib["peak_bytes"]}
        if self._t1 is not None:
            t0, t1 = self._t0, self._t1
            out["torch"] = {
                "device": t0["device"],
                "start_allocated_bytes": t0["allocated"],
                "end_allocated_bytes": t1["allocated"],
                "peak_allocated_bytes": t1["peak_allocated"],
                "peak_above_start_bytes": t1["peak_allocated"] - t0["allocated"],
                "start_reserved_bytes": t0["reserved"],
                "peak_reserved_bytes": t1["peak_reserved"],
                "alloc_retries": t1["alloc_retries"],
                "ooms": t1["ooms"],
            }
            out["combined_peak_upper_bound_bytes"] = lib["peak_bytes"] + t1["peak_allocated"]
            # What the device saw (cudaMemGetInfo), against what the two allocators
            # reserved in the window: the arenas' reservations and torch's segments.
            used = t1["used"] - t0["used"]
            arenas = t1["arenas"] - t0["arenas"]
            torch_res = t1["reserved"] - t0["reserved"]
            out["device"] = {"used_start_bytes": t0["used"], "used_end_bytes": t1["used"],
                             "used_delta_bytes": used,
                             "arena_reserved_delta_bytes": arenas,
                             "torch_reserved_delta_bytes": torch_res,
                             "unaccounted_bytes": used - arenas - torch_res}
        return out

    def format_report(self):
        """report() as a small text table (MiB)."""
        r = self.report()
        mib = lambda b: f"{b / 2**20:10.2f}"  # noqa: E731
        lib = r["library"]
        lines = [f"library (ot_arena / KV pools): peak {mib(lib['peak_bytes'])} MiB, start "
                 f"{mib(lib['start_bytes'])} MiB, end {mib(lib['end_bytes'])} MiB, "
                 f"{lib['allocs']} allocs, {lib['frees']} frees",
                 f"  {'tag / op':<32}{'start MiB':>11}{'peak MiB':>11}{'end MiB':>11}"
                 f"{'allocs':>8}{'frees':>8}"]
        rows = [(t, w) for t, w in lib["by_tag"].items()]
        rows += [("op " + o, w) for o, w in sorted(lib["by_op"].items(),
                                                   key=lambda kv: -kv[1]["peak_bytes"])]
        for name, w in rows:
            lines.append(f"  {name[:32]:<32}{mib(w['start_bytes'])} {mib(w['peak_bytes'])} "
                         f"{mib(w['end_bytes'])}{w['allocs']:>8}{w['frees']:>8}")
        t = r["torch"]
        if t is None:
            lines.append("torch caching allocator: not traced (no CUDA torch in use)")
        else:
            lines.append(f"torch caching allocator (cuda:{t['device']}): peak allocated "
                         f"{mib(t['peak_allocated_bytes'])} MiB ({mib(t['peak_above_start_bytes'])}"
                         f" MiB above start), peak reserved {mib(t['peak_reserved_bytes'])} MiB, "
                         f"{t['alloc_retries']} retries, {t['ooms']} OOMs")
        d = r["device"]
        if d is not None:
            lines.append(f"device (cudaMemGetInfo): used {mib(d['used_delta_bytes'])} MiB more at "
                         f"the end = arenas {mib(d['arena_reserved_delta_bytes'])} + torch "
                         f"segments {mib(d['torch_reserved_delta_bytes'])} + unaccounted "
                         f"{mib(d['unaccounted_bytes'])} MiB")
        lines.append(f"combined peak (upper bound): {mib(r['combined_peak_upper_bound_bytes'])} MiB")
        return "\n".join(lines)

    __str__ = format_report


class Arena:
    """ot_arena from Python: one reservation (host, or CUDA device `device`), 256-byte
    aligned blocks as integer addresses; tagged allocations feed the tracker."""

    def __init__(self, reserve_bytes, device=None):
        self.device = None if device is None else int(device)
        self._a = _C.arena_create(int(reserve_bytes), -1 if device is None else int(device))
        _ARENAS.add(self)

    def tensor(self, shape, dtype, tag="other", op=None):
        """A torch tensor of `shape` / `dtype` whose storage is a block of this arena
        (host memory: a CPU tensor; else on cuda:`device`), recorded under `tag` / `op`.
        Uninitialized. The block is given back when the tensor and every view of it are
        gone (freed on the legacy default stream: synchronize other streams first)."""
        import torch
        shape = tuple(int(n) for n in shape)
        esize = torch.empty((), dtype=dtype).element_size()
        nbytes = esize
        for n in shape:
            nbytes *= n
        addr = self.alloc(max(nbytes, 1), tag, op)
        typestr = {torch.float32: "<f4", torch.float16: "<f2", torch.bfloat16: "<i2",
                   torch.int32: "<i4", torch.int64: "<i8", torch.uint8: "|u1"}.get(dtype)
        if typestr is None:
            self.free(addr)
            raise ValueError(f"Arena.tensor: dtype {dtype} is not supported")
        iface = {"shape": shape, "typestr": typestr, "data": (addr, False), "version": 3,
                 "strides": None}
        holder = _Block()
        if self.device is None:
            import numpy as np
            holder.__array_interface__ = iface
            t = torch.from_numpy(np.asarray(holder))
        else:
            holder.__cuda_array_interface__ = iface
            t = torch.as_tensor(holder, device=f"cuda:{self.device}")
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        weakref.finalize(holder, _C.arena_free, self._a, addr)
        return t

    def alloc(self, nbytes, tag="other", op=None):
        if tag not in _TAG_INDEX:
            raise ValueError(f"tag: {tag!r}, expected one of {TAGS}")
        return _C.arena_alloc(self._a, int(nbytes), _TAG_INDEX[tag], op)

    def free(self, address):
        _C.arena_free(self._a, address)

    def stats(self):
        return _C.arena_stats(self._a)


class _Block:
    """Carries an arena block's array interface; its finalizer frees the block."""
