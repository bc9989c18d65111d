#!/usr/bin/env python3
"""CPU benchmark: ops_transformer's CPU backend against torch on the CPU, same machine,
same thread count, same dtype, in one run.

Cases (issue 2): attention forward at B=1, H=16, S=2048, D=128 (causal and not) and RMSNorm
forward at 8192x4096, in bfloat16 and float32. Ours is timed by `ot-bench` (which also checks
its result against a float64 reference); torch is timed here: F.scaled_dot_product_attention
and F.rms_norm / the eager formula, median of several runs after a warm-up.

Writes bench/results/cpu_ops.json (the shape of shared/BENCH.md) and the CPU table of
docs/PERFORMANCE.md (between its cpu_bench markers).

    /tmp/bench-venv/bin/python bench/cpu_bench.py [--ot-bench build/tools/ot-bench]
        [--threads N] [--quick]

torch goes into a private venv outside the repository, e.g.
    python3 -m venv /tmp/bench-venv && /tmp/bench-venv/bin/pip install torch numpy
"""
import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "<!-- cpu_bench:begin -->"
END = "<!-- cpu_bench:end -->"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    except Exception:
        return "unknown"


def time_torch(fn, min_runs=5, min_time=1.0, max_runs=50):
    fn()  # warm-up
    times = []
    t_all = time.perf_counter()
    while len(times) < max_runs:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= min_runs and time.perf_counter() - t_all > min_time:
            break
    return statistics.median(times) * 1e3


def run_ours(exe, op, shape, dtype, threads, causal=None):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        path = tf.name
    cmd = [exe, "--cpu", "--op", op, "--shape", shape, "--dtype", dtype, "--threads", str(threads),
           "--json", path]
    if causal is not None:
        cmd += ["--causal", str(int(causal))]
    p = subprocess.run(cmd, text=True, capture_output=True)
    sys.stdout.write(p.stdout)
    with open(path) as f:
        rows = json.load(f)["rows"]
    os.unlink(path)
    row = rows[0]
    if p.returncode != 0 or row.get("check") != "pass":
        raise SystemExit(f"ot-bench failed its check for {op} {shape} {dtype}: rc {p.returncode}\n"
                         f"{p.stderr}")
    return row["time_ms"], " ".join(shlex.quote(c) for c in cmd[:-2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ot-bench", default=os.path.join(ROOT, "build", "tools", "ot-bench"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke test)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cpu_ops.json"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "PERFORMANCE.md"))
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    B, H, S, D = (1, 16, 2048, 128) if not args.quick else (1, 4, 512, 64)
    R, C = (8192, 4096) if not args.quick else (1024, 1024)

    load_before = os.getloadavg()
    rows = []
    for dname, tdt in dtypes.items():
        es = torch.empty((), dtype=tdt).element_size()
        # --- attention forward, BSHD for ours, BHSD for torch (its layout; a transpose view
        # would make torch copy)
        for causal in (False, True):
            shape = f"{B}x{H}x{S}x{D}"
            ours_ms, cmd = run_ours(args.ot_bench, "attention_fwd", shape, dname, args.threads,
                                    causal)
            q = torch.randn(B, H, S, D, dtype=tdt)
            k = torch.randn(B, H, S, D, dtype=tdt)
            v = torch.randn(B, H, S, D, dtype=tdt)
            t_sdpa = time_torch(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
            rows.append(dict(op="attention_fwd", case=f"{shape}{' causal' if causal else ''} {dname}",
                             metric="GFLOP/s", ours=flops / ours_ms / 1e6, ours_ms=ours_ms,
                             peers={"torch F.scaled_dot_product_attention": flops / t_sdpa / 1e6},
                             peers_ms={"torch F.scaled_dot_product_attention": t_sdpa},
                             ours_command=cmd))
        # --- RMSNorm forward
        shape = f"{R}x{C}"
        ours_ms, cmd = run_ours(args.ot_bench, "rmsnorm_fwd", shape, dname, args.threads)
        x = torch.randn(R, C, dtype=tdt)
        w = torch.rand(C, dtype=tdt) + 0.5
        eps = 1e-5
        peers_ms = {}
        if hasattr(F, "rms_norm"):
            peers_ms["torch F.rms_norm"] = time_torch(lambda: F.rms_norm(x, (C,), w, eps))

        def eager():  # the usual Llama module, computing in float32
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(tdt) * w

        peers_ms["torch eager (Llama RMSNorm)"] = time_torch(eager)
        nbytes = 2.0 * R * C * es
        rows.append(dict(op="rmsnorm_fwd", case=f"{shape} {dname}", metric="GB/s",
                         ours=nbytes / ours_ms / 1e6, ours_ms=ours_ms,
                         peers={k2: nbytes / t / 1e6 for k2, t in peers_ms.items()},
                         peers_ms=peers_ms, ours_command=cmd))

    for r in rows:
        best = max(r["peers"].values())
        r["ratio_best_peer"] = round(r["ours"] / best, 3)
        r["fraction_of_ceiling"] = None
        r["ours"] = round(r["ours"], 2)
        r["peers"] = {k2: round(v2, 2) for k2, v2 in r["peers"].items()}

    date = datetime.date.today().isoformat()
    device = f"cpu: {cpu_model()}"
    command = "python bench/cpu_bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    record = {
        "bench": "cpu_ops",
        "device": device,
        "date": date,
        "commit": git_commit(),
        "command": command.strip(),
        "threads": args.threads,
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "torch": torch.__version__,
        "ceilings": {},
        "rows": rows,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")

    lines = [BEGIN, "",
             f"Measured {date} on `{device}`, {args.threads} threads (ours: OpenMP; torch: "
             f"`torch.set_num_threads`), torch {torch.__version__}, commit "
             f"`{record['commit'][:10]}`, library built as `scripts/run.sh` builds it (Release, "
             f"no `-march=native`).",
             f"Command: `{record['command']}` (raw record: `{os.path.relpath(args.out, ROOT)}`; "
             f"1-minute load average {record['loadavg_1m_before_after'][0]} before, "
             f"{record['loadavg_1m_before_after'][1]} after). "
             "Ours is timed by `ot-bench` (median after a warm-up, and checked against a float64 "
             "reference in the same run); torch is timed in the script (median of >= 5 runs after a "
             "warm-up). Rates: attention 4·B·H·S²·D FLOPs (halved for causal), RMSNorm bytes read "
             "+ written once.",
             ]
    if max(record["loadavg_1m_before_after"]) > 0.5 * (os.cpu_count() or 1):
        lines += ["", f"**Caveat: the machine was busy with other work during this run (load "
                  f"average {max(record['loadavg_1m_before_after'])} on {os.cpu_count()} cores); "
                  "both sides ran in the same window, but the numbers are noisy and torch's "
                  "thread pool suffers more from oversubscription. Rerun on an idle machine.**"]
    lines += ["",
             "| op | case | ours | ours ms | torch | torch ms | ours / best torch |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        peer_txt = "<br>".join(f"{k2}: {v2} {r['metric']}" for k2, v2 in r["peers"].items())
        peer_ms = "<br>".join(f"{v2:.2f}" for v2 in r["peers_ms"].values())
        lines.append(f"| {r['op']} | {r['case']} | {r['ours']} {r['metric']} | {r['ours_ms']:.2f} | "
                     f"{peer_txt} | {peer_ms} | {r['ratio_best_peer']:.2f}x |")
    lines += ["", END]
    block = "\n".join(lines)
    try:
        with open(args.doc) as f:
            doc = f.read()
    except FileNotFoundError:
        doc = "# Performance\n\n## CPU backend\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN in doc and END in doc:
        doc = doc[:doc.index(BEGIN)] + block + doc[doc.index(END) + len(END):]
    else:
        doc += "\n## CPU backend\n\n" + block + "\n"
    with open(args.doc, "w") as f:
        f.write(doc)
    print(block)


if __name__ == "__main__":
    main()
