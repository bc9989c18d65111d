#!/usr/bin/env python3
"""plot_training.py -- the loss curves (HF sdpa vs patched, same initialization and
data) and the tokens/s of every variant from bench/results/training.json.

  python3 bench/plot_training.py bench/results/training.json docs/img/training_loss.png
"""
import json
import sys


def main(src, dst):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(src) as f:
        rec = json.load(f)
    curve = rec.get("loss_curve") or {}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    for key, label, style in (("hf_sdpa", "HF transformers (sdpa)", "-"),
                              ("patched", "patched (ops_transformer)", "--")):
        if key in curve:
            ax.plot(range(1, len(curve[key]) + 1), curve[key], style, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"{curve.get('case', '')}: same init and data"
                 + (f" (max |diff| {curve['max_abs_diff']:.3f})" if "max_abs_diff" in curve
                    else "")
                 + (f"\nrun of {curve['from_run']}" if curve.get("from_run") else ""),
                 fontsize=9)
    ax.legend()
    runs = [r for r in rec.get("runs", []) if r.get("status") == "ok"]
    cases = list(dict.fromkeys(r["case"] for r in runs))
    labels = list(dict.fromkeys(r["label"] for r in runs))
    width = 0.8 / max(len(labels), 1)
    for i, lab in enumerate(labels):
        xs, ys = [], []
        for j, c in enumerate(cases):
            r = next((r for r in runs if r["case"] == c and r["label"] == lab), None)
            if r is not None:
                xs.append(j + i * width)
                ys.append(r["tokens_per_s"] / 1e3)
        bx.bar(xs, ys, width, label=lab)
    bx.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))])
    bx.set_xticklabels(cases, fontsize=8)
    bx.set_ylabel("k tokens/s (fwd + bwd + AdamW)")
    bx.set_title(f"{rec.get('device', '')}, {rec.get('date', '')}, {rec.get('commit', '')[:7]}",
                 fontsize=9)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
