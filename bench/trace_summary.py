#!/usr/bin/env python3
"""trace_summary.py -- per-step summaries of bench_training.py's torch.profiler chrome
traces (--trace-dir: trace_<VARIANT>_<CFG>_<BxS>.json.gz), and two traces side by side.

  python3 bench/trace_summary.py TRACE.json.gz [TRACE2.json.gz ...] [--json OUT.json]
  python3 bench/trace_summary.py A.json.gz --vs B.json.gz        # kernel by kernel

A trace holds 2 training steps (bench_training._profile); a step is split off at the
host's end of its `Optimizer.zero_grad` (or at its `ot_step<i>` annotation where the
trace has one). Per step: host time to issue it, its GPU span (first kernel start to
last end), GPU busy (the union of kernels, copies and memsets), idle time inside the
span, and of that idle time the part where the GPU waited for the host (the next GPU
operation was launched after the previous one ended: `starved`) against idle time with
work already queued (waits on the device itself, e.g. after a synchronization);
kernel launches; GPU time by kind (GEMM, attention forward / backward, the library's
kernels by family, inductor's triton kernels, optimizer, the rest); the host time
inside the library's custom ops; and the kernels by GPU time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCH = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
           "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel")


def kind(name):
    """A GPU operation's kind, finer than bench_training's _kernel_kind."""
    n = name.lower()
    if name.startswith("Memcpy"):
        return "copies"
    if name.startswith("Memset"):
        return "memsets"
    if "ot::" in name:
        for key, label in (("norm_", "library norms"), ("rope", "library rope"),
                           ("glu", "library glu"), ("lce", "library loss"),
                           ("attn", "library attention"), ("adamw", "optimizer")):
            if key in n:
                return label
        return "library other"
    if any(t in n for t in ("cudnn", "flash", "fmha", "sdpa", "attention")):
        return "attention backward" if any(t in n for t in ("bprop", "bwd", "backward",
                                                            "dot_do_o", "convert_dq")) \
            else "attention forward"
    if any(t in n for t in ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas", "wgmma")):
        return "GEMM"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    if n.startswith("triton_"):
        return "inductor triton (" + ("reduction" if "_red_" in n or "_per_" in n
                                      else "pointwise") + ")"
    if any(t in n for t in ("softmax", "nll_loss", "cross_entropy", "log_softmax")):
        return "torch loss"
    return "other torch (elementwise, reductions)"


def short(name):
    """A kernel's name without `void ` and its argument list: up to the first '(' outside
    the template brackets, so that a template argument such as `(ot::Kind)1` or a
    lambda's `(int)` does not cut it (two instantiations keep two names)."""
    s = name.replace("(anonymous namespace)", "anon").replace("void ", "")
    if s.startswith("Mem"):
        return s
    depth = 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0:
            return s[:i]
    return s


def clip(name, n=60):
    """name for a table cell: its start and end where longer than n."""
    return name if len(name) <= n else name[:n - 18] + " .. " + name[-14:]


def _union(iv):
    busy, end = 0.0, None
    for s, e in sorted(iv):
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        d = json.load(f)
    # (chrome's trace format also allows a bare list of events)
    return d["traceEvents"] if isinstance(d, dict) else d


def summarize(path, top=40):
    ev = load(path)
    host = [e for e in ev if e.get("ph") == "X" and e.get("cat") in
            ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")]
    gpu = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") in _GPU_CATS),
                 key=lambda e: e["ts"])
    launch_of = {}
    for e in host:
        if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launch_of[e["args"]["correlation"]] = e
    # step boundaries (host time): ot_step<i> annotations, else the zero_grad ends
    marks = sorted((e for e in host if e["cat"] == "user_annotation"
                    and re.fullmatch(r"ot_step\d+", e["name"])), key=lambda e: e["ts"])
    if marks:
        bounds = [(m["ts"], m["ts"] + m["dur"]) for m in marks]
    else:
        zg = sorted((e for e in host if e["cat"] == "user_annotation"
                     and e["name"].startswith("Optimizer.zero_grad")), key=lambda e: e["ts"])
        starts = [e["ts"] for e in host if e["cat"] in ("cpu_op", "user_annotation")]
        bounds, start = [], min(starts, default=0)
        for z in zg:
            bounds.append((start, z["ts"] + z["dur"]))
            start = z["ts"] + z["dur"]
    steps = []
    for i, (h0, h1) in enumerate(bounds):
        ops = []
        for g in gpu:
            ln = launch_of.get(g.get("args", {}).get("correlation"))
            if ln is not None and h0 <= ln["ts"] <= h1:
                ops.append((g, ln))
        if not ops:
            continue
        iv = [(g["ts"], g["ts"] + g["dur"]) for g, _ in ops]
        span = max(e for _, e in iv) - min(s for s, _ in iv)
        busy = _union(iv)
        starved = queued = 0.0
        gaps20 = 0
        end = None
        for g, ln in ops:
            s = g["ts"]
            if end is not None and s > end:
                gap = s - end
                gaps20 += gap > 20
                # the part of the gap before the next operation's launch call began:
                # the GPU had run dry waiting for the host
                dry = min(gap, max(0.0, ln["ts"] - end))
                starved += dry
                queued += gap - dry
            end = max(end or 0, g["ts"] + g["dur"])
        by_kind, by_kernel = {}, {}
        for g, _ in ops:
            k = kind(g["name"])
            by_kind[k] = by_kind.get(k, 0) + g["dur"]
            key = short(g["name"])
            t, c = by_kernel.get(key, (0.0, 0))
            by_kernel[key] = (t + g["dur"], c + 1)
        custom = {}
        for e in host:
            if (e["cat"] == "cpu_op" and h0 <= e["ts"] <= h1
                    and (e["name"].startswith("ops_transformer::")
                         or e["name"].endswith(("_eager", "_eagerBackward")))
                    and not e["name"].startswith("autograd::")):
                t, c = custom.get(e["name"], (0.0, 0))
                custom[e["name"]] = (t + e["dur"], c + 1)
        steps.append(dict(
            host_ms=(h1 - h0) / 1e3, gpu_span_ms=span / 1e3, gpu_busy_ms=busy / 1e3,
            gpu_idle_ms=(span - busy) / 1e3, idle_host_starved_ms=starved / 1e3,
            idle_work_queued_ms=queued / 1e3, gaps_over_20us=gaps20,
            gpu_ops=len(ops),
            launches=sum(1 for e in host if e["cat"] in ("cuda_runtime", "cuda_driver")
                         and e["name"] in _LAUNCH and h0 <= e["ts"] <= h1),
            kind_ms={k: v / 1e3 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            kernels=[dict(name=k, ms=t / 1e3, calls=c) for k, (t, c) in
                     sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]],
            custom_op_host_ms={k: dict(ms=t / 1e3, calls=c) for k, (t, c) in
                               sorted(custom.items(), key=lambda kv: -kv[1][0])}))
    return dict(trace=path, steps=steps)


def print_summary(s):
    print(f"== {s['trace']}")
    if not s["steps"]:
        print("  no step found (no ot_step<i> range, no Optimizer.zero_grad with GPU work)")
    for i, st in enumerate(s["steps"]):
        print(f"  step {i}: host {st['host_ms']:.2f} ms, GPU span {st['gpu_span_ms']:.2f}, "
              f"busy {st['gpu_busy_ms']:.2f}, idle {st['gpu_idle_ms']:.2f} (host-starved "
              f"{st['idle_host_starved_ms']:.2f}, queued {st['idle_work_queued_ms']:.2f}; "
              f"{st['gaps_over_20us']} gaps > 20 us), {st['gpu_ops']} GPU ops, "
              f"{st['launches']} launches")
        print("    " + ", ".join(f"{k} {v:.2f}" for k, v in st["kind_ms"].items()))
        if st["custom_op_host_ms"]:
            tot = sum(v["ms"] for v in st["custom_op_host_ms"].values())
            print(f"    library op host time {tot:.2f} ms: " + ", ".join(
                f"{k.split('::')[-1]} {v['ms']:.2f} (x{v['calls']})"
                for k, v in list(st["custom_op_host_ms"].items())[:8]))


def compare(a, b, step=-1, n=30):
    """Kernel by kernel (by kind, then the longest kernels of each) of one step of two
    summaries; returns markdown lines."""
    for s in (a, b):
        if not s["steps"]:
            raise SystemExit(f"{s['trace']}: no step found, nothing to compare")
    sa, sb = a["steps"][step], b["steps"][step]
    kinds = sorted(set(sa["kind_ms"]) | set(sb["kind_ms"]),
                   key=lambda k: -max(sa["kind_ms"].get(k, 0), sb["kind_ms"].get(k, 0)))
    lines = ["| GPU time a step (ms) | A | B | B - A |", "|---|---|---|---|"]
    for k in kinds:
        x, y = sa["kind_ms"].get(k, 0), sb["kind_ms"].get(k, 0)
        lines.append(f"| {k} | {x:.2f} | {y:.2f} | {y - x:+.2f} |")
    for key, label in (("gpu_busy_ms", "GPU busy"), ("gpu_idle_ms", "GPU idle in the span"),
                       ("gpu_span_ms", "GPU span"), ("host_ms", "host time to issue")):
        lines.append(f"| **{label}** | {sa[key]:.2f} | {sb[key]:.2f} | {sb[key] - sa[key]:+.2f} |")
    lines.append(f"| launches | {sa['launches']} | {sb['launches']} | "
                 f"{sb['launches'] - sa['launches']:+d} |")
    ka = {k["name"]: k for k in sa["kernels"]}
    kb = {k["name"]: k for k in sb["kernels"]}
    names = sorted(set(ka) | set(kb), key=lambda k: -max(ka.get(k, {}).get("ms", 0),
                                                         kb.get(k, {}).get("ms", 0)))[:n]
    lines += ["", "| kernel | kind | A ms (calls) | B ms (calls) |", "|---|---|---|---|"]
    shown = {}                  # (clipped names can coincide: numbered; --json has them whole)
    for k in names:
        x, y = ka.get(k), kb.get(k)
        c = clip(k)
        shown[c] = shown.get(c, 0) + 1
        lines.append(f"| `{c}`{f' #{shown[c]}' if shown[c] > 1 else ''} | {kind(k)} | "
                     + (f"{x['ms']:.2f} ({x['calls']})" if x else "-") + " | "
                     + (f"{y['ms']:.2f} ({y['calls']})" if y else "-") + " |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--vs", default=None, help="a second trace: kernel by kernel against "
                   "the first (markdown, the last step of each)")
    p.add_argument("--json", default=None, help="write the summaries here")
    args = p.parse_args(argv)
    sums = [summarize(t) for t in args.traces]
    for s in sums:
        print_summary(s)
    if args.vs:
        b = summarize(args.vs)
        print_summary(b)
        print(f"\nA = {args.traces[0]}, B = {args.vs} (last step of each)")
        print("\n".join(compare(sums[0], b)))
        sums.append(b)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(sums, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
