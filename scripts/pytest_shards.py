#!/usr/bin/env python3
"""scripts/pytest_shards.py N DIR [EXCLUDE] [DURATIONS_LOG] -- split DIR's test_*.py files into
at most N bins of about equal expected time, greedy (longest file first into the bin with the
least so far), and print one bin a line (space-separated paths, as given to pytest).

A file's expected time: the sum of its tests' lines in DURATIONS_LOG (a pytest log with a
"slowest durations" section, as scripts/device_verify.sh writes with --durations=0), else its
size times the seconds per byte of the files that have durations, else its size alone.
EXCLUDE: a path left out (scripts/device_verify.sh runs it alone). Used by device_verify.sh's
OT_VERIFY_SHARDS."""
import os
import re
import sys

_DUR = re.compile(r"^\s*([0-9.]+)s\s+(?:call|setup|teardown)\s+(\S+?\.py)::")


def durations(path):
    """{file: seconds} summed over a pytest log's durations lines (empty without a log)"""
    out = {}
    if not path or not os.path.isfile(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            m = _DUR.match(line)
            if m:
                out[m.group(2)] = out.get(m.group(2), 0.0) + float(m.group(1))
    return out


def shards(n, files, weight):
    """greedy bins: heaviest first into the lightest bin; empty bins dropped"""
    bins = [[0.0, []] for _ in range(max(1, n))]
    for f in sorted(files, key=lambda f: (-weight[f], f)):
        b = min(bins, key=lambda b: b[0])
        b[0] += weight[f]
        b[1].append(f)
    return [sorted(b[1]) for b in bins if b[1]]


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    n, d = int(argv[1]), argv[2]
    exclude = os.path.normpath(argv[3]) if len(argv) > 3 and argv[3] else None
    files = sorted(os.path.join(d, f) for f in os.listdir(d)
                   if f.startswith("test_") and f.endswith(".py"))
    files = [f for f in files if os.path.normpath(f) != exclude]
    dur = durations(argv[4] if len(argv) > 4 else "")
    size = {f: os.path.getsize(f) for f in files}
    by_norm = {os.path.normpath(k): v for k, v in dur.items()}
    known = [f for f in files if os.path.normpath(f) in by_norm]
    rate = (sum(by_norm[os.path.normpath(f)] for f in known) / max(1, sum(size[f] for f in known))
            if known else 1.0)
    weight = {f: by_norm.get(os.path.normpath(f), size[f] * rate) for f in files}
    for b in shards(n, files, weight):
        print(" ".join(b))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
