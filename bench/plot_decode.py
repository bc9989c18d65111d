#!/usr/bin/env python3
"""plot_decode.py -- bar chart of bench/results/decode.json: paged decode attention (ours)
against SDPA cuDNN / flash on a contiguous cache and gather + SDPA, in TB/s of K/V read,
with the measured read bandwidth as a line.

  python3 bench/plot_decode.py bench/results/decode.json docs/img/decode.png
  python3 bench/plot_decode.py bench/results/decode.json --markdown   # the PERFORMANCE.md table
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    doc = json.load(open(src))
    rows = [r for r in doc["rows"] if r["op"] == "paged_decode"]
    names = ["ours"]
    for r in rows:
        for k in r["peers"]:
            if k not in names:
                names.append(k)
    labels = [r["case"].split(" bf16")[0].replace(" x ctx ", " x ").replace(" page ", "\npage ")
              for r in rows]
    w = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(rows)), 4.5))
    for i, n in enumerate(names):
        vals = [r["ours"] if n == "ours" else r["peers"].get(n, 0) for r in rows]
        ax.bar([j + (i - (len(names) - 1) / 2) * w for j in range(len(rows))], vals, w, label=n)
    read = doc["ceilings"]["read_TBps"]
    ax.axhline(read, color="k", ls="--", lw=1)
    ax.text(len(rows) - 0.5, read, f" read {read:.2f} TB/s", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("TB/s (K + V read once)")
    ax.set_title(f"Paged decode attention, bf16 Hq32 Hkv8 D128, {doc['device']} ({doc['date']})",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def markdown(src):
    doc = json.load(open(src))
    read = doc["ceilings"]["read_TBps"]
    print(f"Read ceiling (torch.sum over 4 GiB bf16, same run): {read:.2f} TB/s.\n")
    print("| case | ours TB/s (us) | % of read | SDPA cuDNN | SDPA flash | gather + SDPA "
          "| x cuDNN | x gather |")
    print("|---|---|---|---|---|---|---|---|")
    for r in doc["rows"]:
        if r["op"] != "paged_decode":
            continue
        p = r["peers"]
        g = lambda k: f"{p[k]:.2f}" if k in p else "n/a"  # noqa: E731
        star = " *" if "note" in r else ""  # a row flagged by hand (its note says why)
        print(f"| {r['case'].split(' bf16')[0]}{star} | {r['ours']:.2f} ({r['ours_us']:.0f}) | "
              f"{r['fraction_of_ceiling']:.0%} | {g('torch SDPA cuDNN (contiguous)')} | "
              f"{g('torch SDPA flash (contiguous)')} | {g('paged gather + SDPA')} | "
              f"{r['ratio_cudnn'] if r['ratio_cudnn'] is not None else 'n/a'} | "
              f"{r['ratio_gather']} |")
    for r in doc["rows"]:
        if r["op"] == "arena_alloc_free":
            pn = r["peers_ns_per_pair"]
            print(f"\nArena ({r['case']}): {r['ours_ns_per_pair']:.0f} ns per alloc + free; "
                  f"cudaMalloc / cudaFree {pn['cudaMalloc/cudaFree']:.0f} ns "
                  f"({r['ratio_cudamalloc']}x slower); cudaMallocAsync / cudaFreeAsync (pool kept) "
                  f"{pn['cudaMallocAsync/cudaFreeAsync (pool kept)']:.0f} ns.")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--markdown":
        markdown(sys.argv[1])
    else:
        main(sys.argv[1], sys.argv[2])
