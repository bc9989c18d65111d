#!/usr/bin/env python3
"""Whether two builds' kernels have the same SASS, function by function.

usage: scripts/sass_same.py BEFORE AFTER [--only SUBSTR]

BEFORE / AFTER: object files (cuobjdump -sass is run: $CUOBJDUMP, else cuobjdump on PATH,
else .venv-test's triton copy) or saved `cuobjdump -sass` listings. Addresses, the encoding
comments and the source file name are stripped; each function present in both is compared
instruction by instruction (and per cubin section: sm_80 / sm_90a objects list each arch).
Prints `same` / `DIFFERENT` per function, then the functions only one side has (a new
variant's kernels). Exit status 1 when a common function differs.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pa_sass_count import functions as sass_functions, read_sass  # noqa: E402  (cuobjdump -sass of an object, or a listing)


def functions(text):
    """{(arch, name): [instruction text]} (addresses dropped)"""
    return {(a, n): [t for _, t in ins] for a, n, ins in sass_functions(text, with_arch=True)}


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    a, b = functions(read_sass(argv[1])), functions(read_sass(argv[2]))
    bad = 0
    for k in sorted(set(a) & set(b)):
        if only and only not in k[1]:
            continue
        same = a[k] == b[k]
        bad += not same
        print("%-9s %-7s %s (%d instructions)" % ("same" if same else "DIFFERENT", k[0], k[1],
                                                 len(a[k])))
    for side, x, y in (("only in BEFORE", a, b), ("only in AFTER", b, a)):
        for k in sorted(set(x) - set(y)):
            if not only or only in k[1]:
                print("%s: %s %s" % (side, k[0], k[1]))
    print("%d common functions differ" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
