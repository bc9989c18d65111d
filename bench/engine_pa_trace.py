"""Where the batch-1 decode's attention window goes inside the engine: the paged attention's
per-CTA %globaltimer stamps (a library built with -DOT_PA_TRACE, paged_attention.cu's
PA_TR) from one decode step of a named configuration with random weights, under the
environment variants given.

The stamps are per CTA and overwritten by each layer's launch, so one step leaves the last
layer's: the main kernel's (kernel 0: 0 entry, 1 after the PDL wait, 2 tables read, 3 first
stage landed, 4 key loop done, 5 end) and the merge kernel's (kernel 1: 0 entry, 1 after the
PDL wait, 5 end), printed as min / median / max over the CTAs that ran, in microseconds
from the main kernel's first entry. What they answer: how long after the main kernel's last
CTA ends the merge's PDL wait returns, and how long its few loads then take -- against the
nsys timeline's kernel spans (bench_engine.py --timeline-variants), which show the merge
ending ~13 us after the main kernel in the engine and ~2-3 us in a standalone call.

    OT_ENGINE_LIB=<trace build>/src/engine/libot_engine.so \\
      python3 bench/engine_pa_trace.py --config llama3-8b --variants default,OTE_FUSED_OPROJ=0
A variant is "default" or NAME=VALUE[+NAME=VALUE...]. Output: a table per variant, and
--json FILE with the raw summaries.

--kernel attn_oproj: the batch-1 decode's attention + o_proj kernel instead (every variant
under OTE_FUSED_ATTN_OPROJ=2), from an engine built with -DOT_ENGINE_AO_TRACE=ON
(OT_ENGINE_LIB=<build>/src/engine/libot_engine_ao_trace.so): its per-CTA stamps (AO_NAMES;
fused_kernels.cu's OTE_AO_TRACE comment says where each is taken), in microseconds from
its first CTA's entry.
"""
import argparse
import ctypes
import datetime
import json
import pathlib
import random
import statistics
import subprocess

from benchutil import engine_module, env_set  # bench/ is on sys.path (python3 bench/NAME.py)

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAMPS = {0: (0, 1, 2, 3, 4, 5), 1: (0, 1, 5)}
NAMES = {0: "entry", 1: "after PDL wait", 2: "tables read", 3: "first stage", 4: "key loop done",
         5: "end"}
# the attention + o_proj kernel's stamps, in the kernel's order
AO_NAMES = {0: "entry", 1: "after PDL wait", 11: "(no range) weights landed",
            10: "first K row landed", 8: "q landed", 13: "last V row landed",
            12: "first load done", 9: "key loop done", 2: "partial stored",
            3: "range arrived", 4: "head merged", 5: "barrier open", 6: "weights landed",
            7: "end"}


def parse_variant(v):
    if v == "default":
        return {}
    env = {}
    for kv in v.split("+"):
        k, _, val = kv.partition("=")
        if not k or not _:
            raise SystemExit(f"--variants: '{kv}' is not NAME=VALUE")
        env[k] = val
    return env


def read_stamps(lib, k):
    buf = (ctypes.c_uint64 * (4096 * 8))()
    if lib.ot_cuda_paged_trace(buf, k, 0) != 0:
        raise SystemExit("ot_cuda_paged_trace failed: is the library an -DOT_PA_TRACE build?")
    rows = [list(buf[i * 8:(i + 1) * 8]) for i in range(4096)]
    return [r for r in rows if r[0] != 0]  # the CTAs that ran (stamps cleared before the step)


def read_ao_stamps(lib):
    buf = (ctypes.c_uint64 * (1024 * 16))()
    if lib.ote_ao_trace(buf, 0) != 0:
        raise SystemExit("ote_ao_trace failed")
    rows = [list(buf[i * 16:(i + 1) * 16]) for i in range(1024)]
    return [r for r in rows if r[0] != 0]


def summary(rows, t0, stamps, names):
    """min / median / max over the CTAs of each stamp in `stamps` (named by `names`)"""
    out = {"ctas": len(rows)}
    for i in stamps:
        v = sorted((r[i] - t0) / 1e3 for r in rows if r[i] != 0)
        if v:
            out[names[i]] = [round(v[0], 2), round(statistics.median(v), 2), round(v[-1], 2)]
    return out


def print_summary(title, s, names):
    print(f"  {title} ({s['ctas']} CTAs)")
    for i in names:
        if names[i] in s:
            a, m, b = s[names[i]]
            print(f"    {names[i]:<26} {a:8.2f} {m:8.2f} {b:8.2f}")


def trace_ao(args, eng, E, prompt):
    """--kernel attn_oproj: the fused kernel's stamps, a variant at a time"""
    lib = E._load()
    if not hasattr(lib, "ote_ao_trace"):
        raise SystemExit("the engine library has no ote_ao_trace: set OT_ENGINE_LIB to a "
                         "libot_engine_ao_trace.so (cmake -DOT_ENGINE_AO_TRACE=ON)")
    lib.ote_ao_trace.argtypes = [ctypes.c_void_p, ctypes.c_int]
    results = {}
    for v in args.variants.split(","):
        env = {"OTE_FUSED_ATTN_OPROJ": "2", **parse_variant(v)}
        with env_set(env):
            nxt = eng.prefill([prompt], greedy=True)
            for _ in range(4):
                nxt = eng.decode(nxt, greedy=True)
            per = []
            for _ in range(args.steps):
                lib.ote_ao_trace(None, 1)
                nxt = eng.decode(nxt, greedy=True)
                rows = read_ao_stamps(lib)
                if not rows:
                    raise SystemExit(f"{v}: no stamps: the kernel did not run")
                t0 = min(r[0] for r in rows)
                per.append({"ao": summary(rows, t0, AO_NAMES, AO_NAMES),
                            "gpu_ms": eng.last_timing()["gpu"]})
            eng.free(0)
        per.sort(key=lambda p: p["ao"]["end"][2])
        pick = per[len(per) // 2]
        results[v] = {"picked": pick, "all_end_max": [p["ao"]["end"][2] for p in per]}
        print(f"\n== attn_oproj {v}: step gpu {pick['gpu_ms']:.3f} ms; last layer's stamps, us "
              f"from the first CTA's entry (min / median / max over CTAs)")
        print_summary("attn_oproj", pick["ao"], AO_NAMES)
        print(f"  end max over the steps: {results[v]['all_end_max']}")
    return results


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def record(args, results):
    """../shared/BENCH.md's layout: a row per variant, the picked step's stamps in it"""
    rows = []
    if args.kernel == "attn_oproj":
        for v, r in results.items():
            p = r["picked"]
            rows.append({"op": "engine_decode_ao_trace", "case": f"{args.config} bf16, batch 1, "
                         f"context {args.prompt_len}, OTE_FUSED_ATTN_OPROJ=2, variant {v}",
                         "metric": "us from the kernel's first CTA entry, last layer (min / "
                         "median / max over CTAs)", "ours": p["ao"]["end"][2], "peers": {},
                         "ratio_best_peer": None, "step_gpu_ms": p["gpu_ms"], "ao": p["ao"],
                         "all_end_max": r["all_end_max"]})
    else:
        rows += [paged_row(args, v, r) for v, r in results.items()]
    return {"bench": f"engine_{'pa' if args.kernel == 'paged' else 'ao'}_trace",
            "device": gpu_name(), "date": datetime.date.today().isoformat(),
            "commit": args.commit, "command": args.command, "ceilings": {}, "rows": rows}


def paged_row(args, v, r):
    """record's row of one variant of the paged attention's stamps"""
    p = r["picked"]
    return {"op": "engine_decode_pa_trace", "case": f"{args.config} bf16, batch 1, "
            f"context {args.prompt_len}, variant {v}", "metric": "us from the main "
            "kernel's first CTA entry, last layer (min / median / max over CTAs)",
            "ours": p["main"]["end"][2], "peers": {}, "ratio_best_peer": None,
            "step_gpu_ms": p["gpu_ms"], "main": p["main"], "merge": p["merge"],
            "all_main_end_max": r["all_main_end_max"],
            "all_merge_end_max": r["all_merge_end_max"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="llama3-8b")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--variants", default="default")
    ap.add_argument("--steps", type=int, default=5, help="traced steps a variant (the median)")
    ap.add_argument("--kernel", choices=("paged", "attn_oproj"), default="paged",
                    help="the library's paged attention (an OT_PA_TRACE library) or the "
                         "engine's attention + o_proj kernel (an OT_ENGINE_AO_TRACE engine)")
    ap.add_argument("--json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default="")
    args = ap.parse_args()
    E = engine_module()
    eng = E.Engine.random(args.config, seed=1, dtype="bf16", device="cuda", max_seqs=1,
                          max_len=args.prompt_len + 64)
    vocab = 32000
    prompt = [random.Random(2).randrange(vocab) for _ in range(args.prompt_len)]
    if args.kernel == "attn_oproj":
        results = trace_ao(args, eng, E, prompt)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(record(args, results), indent=1))
        eng.close()
        return
    # the library the engine loaded (the same instance: dlopen by soname)
    lib = ctypes.CDLL("libops_transformer.so.0")
    lib.ot_cuda_paged_trace.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    results = {}
    for v in args.variants.split(","):
        env = parse_variant(v)
        with env_set(env):
            nxt = eng.prefill([prompt], greedy=True)
            for _ in range(4):  # warm: the graph captured, clocks up
                nxt = eng.decode(nxt, greedy=True)
            per = []
            for _ in range(args.steps):
                lib.ot_cuda_paged_trace(None, 0, 1)
                nxt = eng.decode(nxt, greedy=True)
                k0, k1 = read_stamps(lib, 0), read_stamps(lib, 1)
                t0 = min(r[0] for r in k0)
                per.append({"main": summary(k0, t0, STAMPS[0], NAMES),
                            "merge": summary(k1, t0, STAMPS[1], NAMES) if k1 else None,
                            "gpu_ms": eng.last_timing()["gpu"]})
            eng.free(0)
        # the step whose main-kernel end is the median
        per.sort(key=lambda s: s["main"]["end"][2])
        pick = per[len(per) // 2]
        results[v] = {"picked": pick, "all_main_end_max": [s["main"]["end"][2] for s in per],
                      "all_merge_end_max": [s["merge"]["end"][2] if s["merge"] else None
                                            for s in per]}
        print(f"\n== {v}: step gpu {pick['gpu_ms']:.3f} ms; last layer's stamps, us from the "
              f"main kernel's first entry (min / median / max over CTAs)")
        for kern in ("main", "merge"):
            s = pick[kern]
            if not s:
                print(f"  {kern}: no CTAs (one split: no merge kernel)")
                continue
            print_summary(kern, s, {i: NAMES[i] for i in STAMPS[0 if kern == "main" else 1]})
        print(f"  main end max over the steps: {results[v]['all_main_end_max']}; merge end max: "
              f"{results[v]['all_merge_end_max']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(record(args, results), indent=1))
    eng.close()


if __name__ == "__main__":
    main()
