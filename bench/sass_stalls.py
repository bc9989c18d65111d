#!/usr/bin/env python3
"""sass_stalls.py -- sum ncu's per-SASS-instruction warp-state samples by opcode.

  python3 bench/sass_stalls.py SOURCE.csv [SOURCE2.csv ...]

Each file is `ncu --import R --page source --csv --print-source sass` of one kernel (a report
taken with --section SourceCounters; scripts/device_fwd_variants.sh PROFILE=src). Prints, per
file: the columns found, the opcodes (predicate and modifiers dropped: `@P0 FMNMX.FTZ` ->
FMNMX) by their share of the sampled warp states, with the executed instruction count, and the
30 single instructions with the most samples. Column names differ between ncu versions, so
they are matched by substring ("Sampling (All", "Sampling (Not", "Instructions Executed");
every other numeric column whose name has "stall" in it (but not its "(Not Issued)" twin) is
summed per opcode as well.
"""
import csv
import io
import re
import sys
from collections import defaultdict


def _num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return None


def _opcode(src):
    s = src.strip()
    s = re.sub(r"^@!?U?P[T0-9]+\s+", "", s)
    op = s.split(" ")[0] if s else ""
    return op.split(".")[0]


def _rows(path):
    text = open(path, errors="replace").read()
    # ncu may print lines (==PROF== ...) before the CSV header: start at the first line that
    # looks like a quoted header with a Source column
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"') and "Source" in l), None)
    if start is None:
        return None, []
    rd = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    return rd.fieldnames, list(rd)


def report(path):
    cols, rows = _rows(path)
    print(f"== {path}: {len(rows)} rows")
    if not rows:
        print("   no CSV source rows (ncu's output follows)")
        print(open(path, errors="replace").read()[:2000])
        return
    def find(sub):
        return next((c for c in cols if sub.lower() in c.lower()), None)
    c_src = find("Source")
    c_all = find("Sampling (All")
    c_not = find("Sampling (Not")
    c_exe = find("Instructions Executed")
    # the all-samples reasons only (ncu also gives each a "(Not Issued)" twin)
    stall_cols = [c for c in cols if "stall" in c.lower() and "not issued" not in c.lower()
                  and c not in (c_all, c_not)]
    print(f"   columns: {cols}")
    if c_all is None:
        print("   no 'Warp Stall Sampling (All Samples)' column")
        return
    by = defaultdict(lambda: defaultdict(float))
    tot = 0.0
    for r in rows:
        v = _num(r.get(c_all)) or 0.0
        op = _opcode(r.get(c_src, ""))
        d = by[op]
        d["all"] += v
        d["n"] += 1
        if c_not:
            d["not"] += _num(r.get(c_not)) or 0.0
        if c_exe:
            d["exe"] += _num(r.get(c_exe)) or 0.0
        for c in stall_cols:
            d[c] += _num(r.get(c)) or 0.0
        tot += v
    print(f"   samples: {tot:.0f}")
    print(f"   {'opcode':12s} {'share':>6s} {'not-issued':>10s} {'sites':>5s} {'executed':>12s}")
    for op, d in sorted(by.items(), key=lambda kv: -kv[1]["all"])[:25]:
        print(f"   {op:12s} {d['all'] / max(tot, 1):6.1%} {d['not'] / max(tot, 1):10.1%} "
              f"{int(d['n']):5d} {d['exe']:12.0f}")
    if stall_cols:
        print("   stall columns by opcode (top 12 opcodes, nonzero columns):")
        for op, d in sorted(by.items(), key=lambda kv: -kv[1]["all"])[:12]:
            parts = [f"{c.strip()[-28:]}={d[c]:.0f}" for c in stall_cols if d[c]]
            print(f"   {op:12s} " + ", ".join(parts[:8]))
    print("   top instructions:")
    top = sorted(rows, key=lambda r: -(_num(r.get(c_all)) or 0.0))[:30]
    for r in top:
        addr = r.get(find("Address") or "", "")
        print(f"   {(_num(r.get(c_all)) or 0) / max(tot, 1):6.2%} {addr:>8s} "
              f"{r.get(c_src, '').strip()[:90]}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        report(p)
