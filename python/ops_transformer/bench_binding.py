"""Binding overhead per call on a tiny tensor: python -m ops_transformer.bench_binding

Compares, for ot_softmax_forward and ot_rmsnorm_forward on a float32 [1, N] tensor
(N = 64 by default) with preallocated outputs:

  C loop            the op called from C (the floor: what the C call itself costs)
  _C extension      ops_transformer._C (CPython extension, METH_FASTCALL), torch tensors
  _C, NumPy         the same with NumPy arrays (the generic __dlpack__ path)
  ctypes            DLTensor structs built per call from the torch tensors, ctypes call
  cffi (ABI mode)   the same with cffi
  ot.<op>(out=)     the public function (Python wrapper + _C), output preallocated
  ot.<op>()         the public function allocating its output (torch.empty_like)
  torch.ops (custom op) the torch.library custom op (dispatcher), allocating
  torch eager       torch's own op, for scale

Each number is the median of several repetitions of a timed loop, in microseconds.
``--clock thread`` (the default) times the calling thread's CPU time, which a busy
machine does not inflate by descheduling; ``--clock wall`` times wall-clock time.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import torch

import ops_transformer as ot
from ops_transformer import _C

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "libops_transformer.so")


CLOCK = time.thread_time_ns


def timeit(fn, iters, reps=7):
    fn()
    fn()
    out = []
    for _ in range(reps):
        t0 = CLOCK()
        for _ in range(iters):
            fn()
        out.append((CLOCK() - t0) / iters / 1000.0)
    return statistics.median(out)


# --- ctypes -------------------------------------------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def ctypes_binding():
    lib = ctypes.CDLL(LIB)
    ctx = ctypes.c_void_p()
    assert lib.ot_context_create(None, ctypes.byref(ctx)) == 0
    P = ctypes.POINTER(DLTensor)
    lib.ot_softmax_forward.argtypes = [ctypes.c_void_p, P, P]
    lib.ot_rmsnorm_forward.argtypes = [ctypes.c_void_p, P, P, P, ctypes.c_float, P, P, P]
    lib.ot_last_error.restype = ctypes.c_char_p
    codes = {torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16)}

    def dl(t):
        n = t.dim()
        shape = (ctypes.c_int64 * n)(*t.shape)
        strides = (ctypes.c_int64 * n)(*t.stride())
        c, b = codes[t.dtype]
        d = DLTensor(t.data_ptr(), DLDevice(1, 0), n, DLDataType(c, b, 1), shape, strides, 0)
        d._keep = (shape, strides)
        return d

    def check(st):
        if st:
            raise ot.Error(lib.ot_last_error().decode())

    def softmax(x, out):
        check(lib.ot_softmax_forward(ctx, dl(x), dl(out)))

    def rmsnorm(x, w, out):
        check(lib.ot_rmsnorm_forward(ctx, dl(x), None, dl(w), 1e-6, dl(out), None, None))

    return softmax, rmsnorm


# --- cffi ---------------------------------------------------------------------------

CDEF = """
typedef struct { int device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct { void *data; DLDevice device; int32_t ndim; DLDataType dtype;
                 int64_t *shape; int64_t *strides; uint64_t byte_offset; } DLTensor;
typedef struct ot_context ot_context;
int ot_context_create(const void *options, ot_context **out);
int ot_softmax_forward(ot_context *ctx, const DLTensor *x, const DLTensor *out);
int ot_rmsnorm_forward(ot_context *ctx, const DLTensor *x, const DLTensor *residual,
                       const DLTensor *weight, float eps, const DLTensor *out,
                       const DLTensor *residual_out, const DLTensor *rstd);
const char *ot_last_error(void);
"""


def cffi_binding():
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    lib = ffi.dlopen(LIB)
    pctx = ffi.new("ot_context **")
    assert lib.ot_context_create(ffi.NULL, pctx) == 0
    ctx = pctx[0]
    codes = {torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16)}
    NULL = ffi.NULL

    def dl(t, keep):
        shape = ffi.new("int64_t[]", tuple(t.shape))
        strides = ffi.new("int64_t[]", t.stride())
        c, b = codes[t.dtype]
        d = ffi.new("DLTensor *", {"data": ffi.cast("void *", t.data_ptr()),
                                   "device": {"device_type": 1, "device_id": 0},
                                   "ndim": t.dim(), "dtype": {"code": c, "bits": b, "lanes": 1},
                                   "shape": shape, "strides": strides})
        keep.append((shape, strides))
        return d

    def check(st):
        if st:
            raise ot.Error(ffi.string(lib.ot_last_error()).decode())

    def softmax(x, out):
        keep = []
        check(lib.ot_softmax_forward(ctx, dl(x, keep), dl(out, keep)))

    def rmsnorm(x, w, out):
        keep = []
        check(lib.ot_rmsnorm_forward(ctx, dl(x, keep), NULL, dl(w, keep), 1e-6, dl(out, keep),
                                     NULL, NULL))

    return softmax, rmsnorm


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64, help="row length of the [1, N] tensor")
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread",
                    help="thread CPU time (default) or wall-clock time")
    args = ap.parse_args(argv)
    global CLOCK
    thread = args.clock == "thread"
    CLOCK = time.thread_time_ns if thread else time.perf_counter_ns
    n, iters = args.n, args.iters
    torch.set_grad_enabled(False)
    x = torch.rand(1, n)
    w = torch.ones(n)
    out = torch.empty(1, n)
    xn, wn, outn = x.numpy(), w.numpy(), out.numpy().copy()

    rows = []
    c_soft = statistics.median(_C._bench_c_call(0, n, iters, thread) for _ in range(7)) / 1000.0
    c_rms = statistics.median(_C._bench_c_call(1, n, iters, thread) for _ in range(7)) / 1000.0
    rows.append(("C loop (no Python)", c_soft, c_rms))
    rows.append(("_C extension, torch tensors",
                 timeit(lambda: _C.softmax_forward(0, x, out), iters),
                 timeit(lambda: _C.rmsnorm_forward(0, x, None, w, 1e-6, out, None, None), iters)))
    rows.append(("_C extension, NumPy arrays (__dlpack__)",
                 timeit(lambda: _C.softmax_forward(0, xn, outn), iters),
                 timeit(lambda: _C.rmsnorm_forward(0, xn, None, wn, 1e-6, outn, None, None),
                        iters)))
    cs, cr = ctypes_binding()
    rows.append(("ctypes, torch tensors", timeit(lambda: cs(x, out), iters),
                 timeit(lambda: cr(x, w, out), iters)))
    try:
        fs, fr = cffi_binding()
        rows.append(("cffi (ABI mode), torch tensors", timeit(lambda: fs(x, out), iters),
                     timeit(lambda: fr(x, w, out), iters)))
    except ImportError:
        rows.append(("cffi (not installed)", float("nan"), float("nan")))
    rows.append(("ot.<op>(..., out=out)", timeit(lambda: ot.softmax(x, out=out), iters),
                 timeit(lambda: ot.rms_norm(x, w, out=out), iters)))
    rows.append(("ot.<op>(...) allocating", timeit(lambda: ot.softmax(x), iters),
                 timeit(lambda: ot.rms_norm(x, w), iters)))
    ops = torch.ops.ops_transformer
    rows.append(("torch.ops.ops_transformer (custom op)", timeit(lambda: ops.softmax(x), iters),
                 timeit(lambda: ops.rms_norm(x, None, w, 1e-6), iters)))
    rows.append(("torch eager (softmax, F.rms_norm)", timeit(lambda: torch.softmax(x, -1), iters),
                 timeit(lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-6), iters)))

    print(f"per-call {args.clock} time, float32 [1, {n}], median of 7 x {iters} calls, in us "
          f"(torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f})")
    print(f"{'path':44s} {'softmax':>9s} {'+over C':>8s} {'rms_norm':>9s} {'+over C':>8s}")
    for name, a, b in rows:
        print(f"{name:44s} {a:9.2f} {a - c_soft:8.2f} {b:9.2f} {b - c_rms:8.2f}")


if __name__ == "__main__":
    main()
