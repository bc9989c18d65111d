"""bench_linear_ce.py -- the GEMM-backed ops and the optimizer on the GPU, against torch:

  linear    ot_linear_forward / _backward (cuBLASLt, bias and BGRADB epilogues) vs
            F.linear and torch's backward matmuls (TFLOP/s; ceiling: torch bf16 GEMM)
  softmax   ot_softmax_forward / _backward vs torch.softmax / _softmax_backward_data
            (TB/s, bytes read + written once; ceiling: device copy)
  adamw     ot_adamw_step over a 0.5 B-parameter list shaped like Qwen2-0.5B (290
            tensors) vs torch.optim.AdamW foreach and fused=True (TB/s of the update's
            traffic, and ms per step)
  linear_ce ot_linear_cross_entropy, 16k tokens x 4096 hidden x 128k vocab bf16, loss +
            dhidden + dweight, vs F.linear + F.cross_entropy + backward: ms per step and
            peak extra memory (torch.cuda.max_memory_allocated above the inputs; the
            workspace is a torch tensor, so it is counted), against the header's bound

Our ops are called through the public C API of the shared library (ctypes, DLTensor
views of torch tensors, the context's stream set to torch's current stream): what a C
user calls, validation included.

  python3 bench/bench_linear_ce.py --lib build-dev/libops_transformer.so \\
      [--only linear,softmax,adamw,linear_ce] [--small] [--json out.json --commit SHA]

Timing: CUDA events around `inner` calls after torch.cuda._sleep (host launch latency
hidden), median; peers and ours alternate in one loop.
"""

import argparse
import ctypes
import datetime
import json
import statistics
import sys

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------
# ctypes binding of the public API
# ---------------------------------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class CtxOptions(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int),
                ("stream", ctypes.c_void_p), ("num_threads", ctypes.c_int)]


class CEParams(ctypes.Structure):
    _fields_ = [("ignore_index", ctypes.c_int64), ("label_smoothing", ctypes.c_float),
                ("reduction", ctypes.c_int)]


class LCEParams(ctypes.Structure):
    _fields_ = [("ce", CEParams), ("chunk_tokens", ctypes.c_int64)]


class AdamWParams(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float),
                ("step", ctypes.c_int64)]


DT = {torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
      torch.int32: (0, 32), torch.int64: (0, 64)}


class View:
    """A DLTensor of a torch tensor (keeps its shape / stride arrays alive)."""

    def __init__(self, t):
        self.t = t
        n = t.dim()
        self.shape = (ctypes.c_int64 * max(n, 1))(*t.shape)
        self.strides = (ctypes.c_int64 * max(n, 1))(*t.stride())
        code, bits = DT[t.dtype]
        dev = DLDevice(2 if t.is_cuda else 1, t.device.index or 0)
        self.dl = DLTensor(t.data_ptr(), dev, n, DLDataType(code, bits, 1), self.shape,
                           self.strides, 0)
        self.ref = ctypes.byref(self.dl)


def V(t):
    return None if t is None else View(t).ref


class Lib:
    def __init__(self, path):
        self.L = ctypes.CDLL(path)
        self.L.ot_last_error.restype = ctypes.c_char_p
        o = CtxOptions(2, torch.cuda.current_device(), None, 0)
        self.ctx = ctypes.c_void_p()
        self.check(self.L.ot_context_create(ctypes.byref(o), ctypes.byref(self.ctx)), "context")

    def check(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: status {st}: {self.L.ot_last_error().decode()}")

    def stream(self):
        self.check(self.L.ot_context_set_stream(
            self.ctx, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)), "set_stream")

    # Each op returns a closure with its views built once (timing measures the op).
    def linear_fwd(self, x, w, b, y):
        args = [V(x), V(w), V(b), V(y)]
        return lambda: self.check(self.L.ot_linear_forward(self.ctx, *args), "linear_forward")

    def linear_bwd(self, dy, x, w, dx, dw, db):
        args = [V(dy), V(x), V(w), V(dx), V(dw), V(db)]
        return lambda: self.check(self.L.ot_linear_backward(self.ctx, *args), "linear_backward")

    def softmax_fwd(self, x, out):
        args = [V(x), V(out)]
        return lambda: self.check(self.L.ot_softmax_forward(self.ctx, *args), "softmax_forward")

    def softmax_bwd(self, dy, y, dx):
        args = [V(dy), V(y), V(dx)]
        return lambda: self.check(self.L.ot_softmax_backward(self.ctx, *args), "softmax_backward")

    def lce_workspace_bytes(self, T, H, Vv, dtype, chunk=0):
        p = LCEParams(CEParams(-100, 0.0, 0), chunk)
        n = ctypes.c_size_t()
        code, bits = DT[dtype]
        self.check(self.L.ot_linear_cross_entropy_workspace_size(
            ctypes.byref(p), ctypes.c_int64(T), ctypes.c_int64(H), ctypes.c_int64(Vv),
            DLDataType(code, bits, 1), ctypes.byref(n)), "workspace_size")
        return n.value

    def lce(self, h, w, y, loss, dh, dw, ws, chunk=0, reduction=0):
        p = LCEParams(CEParams(-100, 0.0, reduction), chunk)
        args = [V(h), V(w), V(y), V(loss), V(dh), V(dw), V(ws)]
        return lambda: self.check(self.L.ot_linear_cross_entropy(self.ctx, ctypes.byref(p),
                                                                 *args), "linear_cross_entropy")

    def adamw(self, params, grads, ms, vs, masters, lr=1e-3, step=1):
        n = len(params)
        arr = ctypes.c_void_p * n
        views = [[View(t) for t in lst] for lst in (params, grads, ms, vs)]
        lists = [arr(*[ctypes.addressof(v.dl) for v in vl]) for vl in views]
        if masters is not None:
            mv = [View(t) for t in masters]
            views.append(mv)
            lists.append(arr(*[ctypes.addressof(v.dl) for v in mv]))
        else:
            lists.append(None)
        p = AdamWParams(lr, 0.9, 0.999, 1e-8, 0.01, step)

        def call(views=views):  # the views (and tensors) live as long as the closure
            self.check(self.L.ot_adamw_step(self.ctx, ctypes.byref(p), n, *lists), "adamw_step")
        return call


# ---------------------------------------------------------------------------------
# Timing and ceilings
# ---------------------------------------------------------------------------------

def time_ms(fns, iters=15, inner=3, warmup=2):
    n = len(fns)
    for i in range(warmup * n):
        fns[i % n]()
    torch.cuda.synchronize()
    ts = [[] for _ in fns]
    for _ in range(iters):
        for j, fn in enumerate(fns):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)
            s.record()
            for _ in range(inner):
                fn()
            e.record()
            e.synchronize()
            ts[j].append(s.elapsed_time(e) / inner)
    return [statistics.median(t) for t in ts]


def copy_tbps():
    x = torch.empty(1024 ** 3, dtype=torch.bfloat16, device="cuda").uniform_()
    y = torch.empty_like(x)
    (ms,) = time_ms([lambda: y.copy_(x)])
    return 2 * x.numel() * 2 / (ms * 1e-3) / 1e12


def gemm_tflops():
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    (ms,) = time_ms([lambda: a @ b])
    return 2 * 8192 ** 3 / (ms * 1e-3) / 1e12


ROWS = []


def row(op, case, metric, ours, peers, ceiling=None, **extra):
    best = max(peers.values()) if peers else None
    if metric == "GB peak":
        best = min(peers.values()) if peers else None
        ratio = best / ours if best and ours else None
    else:
        ratio = ours / best if best else None
    r = {"op": op, "case": case, "metric": metric, "ours": round(ours, 4),
         "peers": {k: round(v, 4) for k, v in peers.items()},
         "ratio_best_peer": round(ratio, 3) if ratio else None}
    if ceiling:
        r["fraction_of_ceiling"] = round(ours / ceiling, 3)
    r.update(extra)
    ROWS.append(r)
    print(f"  {op:16s} {case:44s} {metric:8s} ours {ours:9.3f}  " +
          "  ".join(f"{k} {v:.3f}" for k, v in peers.items()) +
          (f"  ratio {ratio:.2f}" if ratio else ""), flush=True)


# ---------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------

def bench_linear(L, gemm, small):
    shapes = [(16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)]
    if small:
        shapes = [(512, 256, 384)]
    for (M, K, N) in shapes:
        dt = torch.bfloat16
        x = torch.randn(M, K, device="cuda", dtype=dt)
        w = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
        b = torch.randn(N, device="cuda", dtype=dt)
        y = torch.empty(M, N, device="cuda", dtype=dt)
        dy = torch.randn(M, N, device="cuda", dtype=dt)
        dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
        fwd = L.linear_fwd(x, w, b, y)
        bwd = L.linear_bwd(dy, x, w, dx, dw, db)
        fwd()
        torch.cuda.synchronize()
        err = (y.float() - F.linear(x, w, b).float()).abs().max().item()
        ours_f, torch_f = time_ms([fwd, lambda: F.linear(x, w, b)])

        def torch_bwd():
            torch.matmul(dy, w)
            torch.matmul(dy.t(), x)
            dy.sum(0)
        ours_b, torch_b = time_ms([bwd, torch_bwd])
        fl = 2 * M * N * K
        case = f"[{M},{K}]x[{N},{K}]^T bf16 +bias"
        row("linear_fwd", case, "TFLOP/s", fl / ours_f / 1e9, {"torch F.linear": fl / torch_f / 1e9},
            gemm, max_abs_err_vs_torch=err)
        row("linear_bwd", case + " dx,dW,db", "TFLOP/s", 2 * fl / ours_b / 1e9,
            {"torch matmuls + sum": 2 * fl / torch_b / 1e9}, gemm)
        del x, w, b, y, dy, dx, dw, db


def bench_softmax(L, copy, small):
    shapes = [(131072, 1024), (16384, 32000), (2048, 131072), (65536, 128)]
    if small:
        shapes = [(64, 1000), (8, 70001)]
    for (R, C) in shapes:
        dt = torch.bfloat16
        x = torch.randn(R, C, device="cuda", dtype=dt) * 3
        out = torch.empty_like(x)
        fwd = L.softmax_fwd(x, out)
        fwd()
        torch.cuda.synchronize()
        ref = torch.softmax(x.float(), -1)
        err = (out.float() - ref).abs().max().item()
        dy = torch.randn_like(x)
        dx = torch.empty_like(x)
        bwd = L.softmax_bwd(dy, out, dx)
        ours_f, torch_f = time_ms([fwd, lambda: torch.softmax(x, -1)])
        ours_b, torch_b = time_ms([bwd, lambda: torch._softmax_backward_data(dy, out, -1, dt)])
        nb = 2 * R * C * 2
        case = f"{R}x{C} bf16"
        row("softmax_fwd", case, "TB/s", nb / ours_f / 1e9, {"torch.softmax": nb / torch_f / 1e9},
            copy, max_abs_err_vs_fp32=err)
        nb = 3 * R * C * 2
        row("softmax_bwd", case, "TB/s", nb / ours_b / 1e9,
            {"torch _softmax_backward_data": nb / torch_b / 1e9}, copy)
        del x, out, dy, dx


def qwen05b_shapes(small):
    """A 0.5 B-parameter list shaped like Qwen2-0.5B (tied embedding, 24 layers)."""
    if small:
        return [(1000, 64), (64,), (128, 64), (1,)]
    H, I, KV = 896, 4864, 128
    shapes = [(151936, H), (H,)]
    for _ in range(24):
        shapes += [(H, H), (H,), (KV, H), (KV,), (KV, H), (KV,), (H, H), (I, H), (I, H),
                   (H, I), (H,), (H,)]
    return shapes


def bench_adamw(L, copy, small):
    shapes = qwen05b_shapes(small)
    n = sum(torch.Size(s).numel() for s in shapes)
    print(f"  adamw: {len(shapes)} tensors, {n / 1e6:.1f} M parameters", flush=True)
    # fp32 params, grads, states: ours vs torch foreach / fused (same arithmetic)
    ps = [torch.randn(s, device="cuda") for s in shapes]
    gs = [torch.randn(s, device="cuda") * 1e-2 for s in shapes]
    ms = [torch.zeros(s, device="cuda") for s in shapes]
    vs = [torch.zeros(s, device="cuda") for s in shapes]
    ours = L.adamw(ps, gs, ms, vs, None)
    tparams = [torch.nn.Parameter(p.clone()) for p in ps]
    for t, g in zip(tparams, gs):
        t.grad = g
    # correctness: one step from zero states against torch's fused step
    ref_opt = torch.optim.AdamW(tparams, lr=1e-3, weight_decay=0.01, fused=True)
    ref_opt.step()
    ours()
    torch.cuda.synchronize()
    err = max((p - t.detach()).abs().max().item() for p, t in zip(ps, tparams))
    del ref_opt
    fe = torch.optim.AdamW(tparams, lr=1e-3, weight_decay=0.01, foreach=True)
    fu = torch.optim.AdamW(tparams, lr=1e-3, weight_decay=0.01, fused=True)
    o_ms, fe_ms, fu_ms = time_ms([ours, fe.step, fu.step], iters=9, inner=2)
    nb = 28 * n  # read p, g, m, v; write p, m, v (float32)
    row("adamw_step", f"{n / 1e6:.0f}M params fp32 ({len(shapes)} tensors)", "TB/s",
        nb / o_ms / 1e9, {"torch AdamW foreach": nb / fe_ms / 1e9,
                          "torch AdamW fused": nb / fu_ms / 1e9}, copy,
        ms_per_step={"ours": round(o_ms, 3), "foreach": round(fe_ms, 3), "fused": round(fu_ms, 3)},
        max_abs_diff_vs_torch_fused_step1=err)
    del ps, gs, ms, vs, tparams, fe, fu
    torch.cuda.empty_cache()
    # bf16 params + grads, fp32 master and states (ours' mixed-precision mode)
    ws = [torch.randn(s, device="cuda") for s in shapes]
    ps = [w.to(torch.bfloat16) for w in ws]
    gs = [(torch.randn(s, device="cuda") * 1e-2).to(torch.bfloat16) for s in shapes]
    ms = [torch.zeros(s, device="cuda") for s in shapes]
    vs = [torch.zeros(s, device="cuda") for s in shapes]
    ours = L.adamw(ps, gs, ms, vs, ws)
    (o_ms,) = time_ms([ours], iters=9, inner=2)
    nb = (4 + 2 + 4 + 4) * n + (4 + 4 + 4 + 2) * n
    row("adamw_step", f"{n / 1e6:.0f}M params bf16 + fp32 master", "TB/s", nb / o_ms / 1e9, {},
        copy, ms_per_step={"ours": round(o_ms, 3)})
    del ws, ps, gs, ms, vs
    torch.cuda.empty_cache()


def bench_linear_ce(L, gemm, small):
    T, H, Vv = (16384, 4096, 128256) if not small else (512, 256, 5000)
    dt = torch.bfloat16
    h = torch.randn(T, H, device="cuda", dtype=dt)
    w = torch.randn(Vv, H, device="cuda", dtype=dt) / H ** 0.5
    y = torch.randint(0, Vv, (T,), device="cuda")
    y[::7] = -100
    torch.cuda.synchronize()

    def peak_of(fn):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 1e9, out

    wsb = L.lce_workspace_bytes(T, H, Vv, dt)

    def ours_step():
        loss = torch.empty((), device="cuda", dtype=torch.float32)
        dh, dw = torch.empty_like(h), torch.empty_like(w)
        ws = torch.empty((wsb + 3) // 4, device="cuda", dtype=torch.int32)
        L.stream()
        L.lce(h, w, y, loss, dh, dw, ws)()
        return loss, dh, dw

    def torch_step():
        hh = h.detach().requires_grad_()
        ww = w.detach().requires_grad_()
        loss = F.cross_entropy(F.linear(hh, ww), y)
        loss.backward()
        return loss.detach(), hh.grad, ww.grad

    ours_gb, (l1, dh1, dw1) = peak_of(ours_step)
    torch_gb, (l2, dh2, dw2) = peak_of(torch_step)
    dloss = abs(l1.item() - l2.item())
    ddh = ((dh1.float() - dh2.float()).abs().max() / dh2.float().abs().max()).item()
    ddw = ((dw1.float() - dw2.float()).abs().max() / dw2.float().abs().max()).item()
    del dh1, dw1, dh2, dw2
    out_gb = (h.numel() + w.numel()) * 2 / 1e9  # dhidden + dweight, in both
    chunk = max(1, min(T, (1 << 28) // (Vv * 2)))
    bound_gb = (wsb + 32 * 2 ** 20) / 1e9 + out_gb  # workspace + cuBLASLt workspace + grads
    print(f"  linear_ce: loss ours {l1.item():.5f} torch {l2.item():.5f}; max rel diff "
          f"dhidden {ddh:.2e} dweight {ddw:.2e}; chunk {chunk} tokens, workspace "
          f"{wsb / 1e6:.1f} MB", flush=True)
    case = f"T={T} H={H} V={Vv} bf16 loss+dh+dW"
    row("linear_ce_mem", case, "GB peak", ours_gb, {"torch F.linear+F.cross_entropy": torch_gb},
        None, bound_GB=round(bound_gb, 3), gradients_GB=round(out_gb, 3),
        workspace_MB=round(wsb / 1e6, 1), chunk_tokens=chunk)
    # time: ours with preallocated outputs; torch autograd
    loss = torch.empty((), device="cuda", dtype=torch.float32)
    dh, dw = torch.empty_like(h), torch.empty_like(w)
    ws = torch.empty((wsb + 3) // 4, device="cuda", dtype=torch.int32)
    L.stream()
    ours = L.lce(h, w, y, loss, dh, dw, ws)
    o_ms, t_ms = time_ms([ours, torch_step], iters=7, inner=1)
    fl = 6 * T * H * Vv
    row("linear_ce", case, "TFLOP/s", fl / o_ms / 1e9,
        {"torch F.linear+F.cross_entropy": fl / t_ms / 1e9}, gemm,
        ms={"ours": round(o_ms, 2), "torch": round(t_ms, 2)}, loss_abs_diff=dloss,
        dhidden_max_rel_diff=ddh, dweight_max_rel_diff=ddw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--only", default="linear_ce,adamw,linear,softmax")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--command", default=" ".join(sys.argv))
    args = ap.parse_args()
    torch.manual_seed(0)
    L = Lib(args.lib)
    L.stream()
    copy = copy_tbps()
    gemm = gemm_tflops()
    print(f"ceilings: copy {copy:.2f} TB/s, torch bf16 GEMM 8192^3 {gemm:.0f} TFLOP/s", flush=True)
    fns = {"linear_ce": lambda: bench_linear_ce(L, gemm, args.small),
           "adamw": lambda: bench_adamw(L, copy, args.small),
           "linear": lambda: bench_linear(L, gemm, args.small),
           "softmax": lambda: bench_softmax(L, copy, args.small)}
    for name in args.only.split(","):
        try:
            L.stream()
            fns[name]()
        except Exception as e:  # keep the other families' rows
            print(f"  {name}: FAILED: {e!r}", flush=True)
        torch.cuda.empty_cache()
        if args.json:
            doc = {"bench": "linear_ce", "device": torch.cuda.get_device_name(),
                   "date": datetime.date.today().isoformat(), "commit": args.commit,
                   "command": args.command, "torch": torch.__version__,
                   "ceilings": {"copy_TBps": round(copy, 3), "gemm_bf16_TFLOPs": round(gemm, 1)},
                   "timing": "CUDA events around 1-3 calls after torch.cuda._sleep, median, "
                             "ours and peers alternating",
                   "rows": ROWS}
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
