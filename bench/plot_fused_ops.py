#!/usr/bin/env python3
"""plot_fused_ops.py -- bar chart of bench/results/fused_ops.json: for each op and case,
ours and each peer in TB/s, with the measured copy bandwidth as a line.

  python3 bench/plot_fused_ops.py bench/results/fused_ops.json docs/img/fused_ops.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    doc = json.load(open(src))
    rows = [r for r in doc["rows"] if r.get("metric", "TB/s") == "TB/s"]  # not the GB rows
    copy = doc["ceilings"]["copy_TBps"]
    labels = [f"{r['op']}\n{r['case'].replace(' bf16', '')}" for r in rows]
    peer_names = []
    for r in rows:
        for k in r["peers"]:
            if k not in peer_names:
                peer_names.append(k)
    # Group peers into three families so the chart stays readable.
    def family(name):
        if "compile" in name:
            return "torch.compile"
        if "eager" in name and "autograd" not in name:
            return "torch eager"
        return "torch fused / autograd"
    fams = ["torch eager", "torch fused / autograd", "torch.compile"]
    series = {"ours (ops-transformer)": [r["ours"] for r in rows]}
    for f in fams:
        vals = []
        for r in rows:
            v = [x for k, x in r["peers"].items() if family(k) == f]
            vals.append(max(v) if v else 0.0)
        series[f] = vals
    n = len(rows)
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(10, 0.75 * n), 5.5))
    colors = ["#d62728", "#7f7f7f", "#1f77b4", "#2ca02c"]
    for j, (name, vals) in enumerate(series.items()):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(n)]
        ax.bar(xs, vals, width, label=name, color=colors[j % len(colors)])
    ax.axhline(copy, color="k", linestyle="--", linewidth=1, label=f"copy bandwidth {copy:.2f} TB/s")
    ax.axhline(0.9 * copy, color="k", linestyle=":", linewidth=1, label="90% of copy")
    ax.set_xticks(range(n))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TB/s (bytes read + written once)")
    ax.set_title(f"Fused ops, bf16, {doc['device']} ({doc['date']})")
    ax.legend(fontsize=8, ncol=3, loc="lower left")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("wrote", dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
