#!/usr/bin/env python3
"""Ours against the best peer per SM clock, from a bench_attention.py record taken with
--clocks (each entry's mean SM clock and board power from nvidia-smi while its rounds ran).

A ratio below 1.0 splits into the kernel (work per clock: ours_rate / ours_MHz against the
peer's) and the clock (the peer's entry ran at another mean clock: under the H200's 700 W
cap, the kernel that draws more power per cycle runs slower). Where the power is below the
cap the clocks are alike and the ratio is the kernel's.

  python3 bench/clock_ratio.py bench/results/attention_grid_warm.json [--peer "torch SDPA cuDNN"]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record")
    ap.add_argument("--peer", default="torch SDPA cuDNN")
    args = ap.parse_args()
    with open(args.record) as f:
        d = json.load(f)
    rows = [r for r in d.get("rows", []) if r.get("clocks")]
    if not rows:
        sys.exit(f"{args.record}: no row has clocks (run bench_attention.py with --clocks)")
    print(f"{d.get('device')} {d.get('date')} {d.get('commit', '')}")
    print(f"{'op / case':52s} {'ratio':>6s} {'per clock':>9s} {'clock':>6s} | "
          f"{'MHz ours':>8s} {'W':>4s} | {'MHz peer':>8s} {'W':>4s}")
    for r in rows:
        c = r["clocks"]
        o, p = c.get("ours"), c.get(args.peer)
        po, pp = r.get("ours"), r.get("peers", {}).get(args.peer)
        if not (o and p and po and pp and o.get("sm_mhz") and p.get("sm_mhz")):
            continue
        ratio = po / pp
        clock = o["sm_mhz"] / p["sm_mhz"]
        print(f"{r['op'] + ' ' + r['case']:52.52s} {ratio:6.3f} {ratio / clock:9.3f} "
              f"{clock:6.3f} | {o['sm_mhz']:8.0f} {o['power_w']:4.0f} | {p['sm_mhz']:8.0f} "
              f"{p['power_w']:4.0f}")


if __name__ == "__main__":
    main()
