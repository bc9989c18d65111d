#!/usr/bin/env python3
"""The Hopper forward's pipelined step in the SASS: counts, and an issue model of its softmax.

usage: scripts/fwd_step_sass.py OBJ_OR_LISTING SUBSTR TPV [SUBSTR TPV ...]

OBJ_OR_LISTING: an object of src/cuda/sm90/attention_fwd_sm90.cu (cuobjdump -sass is run as
scripts/sass_same.py does: $CUOBJDUMP, ...) or a saved listing. SUBSTR picks one sm_90a kernel
by a piece of its mangled name, the first that holds it (e.g. bfloat16Li128ELi176ELi2ELi33552E:
<bf16, 128, 176, 2, narrow_bits(3) | kFlPin>); TPV: the cycles after S is ready at which the step's own P V
completes (its tensor cycles: 64 x BC x D MACs at 2048 a cycle, e.g. 704 at D128 BC 176).

The step is the pipelined loop around the kernel's first `WARPGROUP.DEPBAR.LE gsb0, 0x1` (the
Q K^T's wait). Printed: the kernel's instructions, highest register, WARPGROUP.ARRIVE /
DEPBAR counts; the step's opcodes between the Q K^T's wait and the P V's (`DEPBAR ... 0x0`)
and after it (both paths of the element-mask branch counted); then a model of one warp
issuing the unmasked path in order from the join after the mask test (S ready at t = 0) to the
loop's backward branch: one instruction a cycle, results after 4 cycles (24: SHFL / VOTE; 18:
MUFU), MUFU busy 8 cycles a warp instruction (16 lanes a cycle per SM), the ALU pipe's
FMNMX / FSEL / ISETP / FSETP / F2FP / LOP3 / PLOP3 2 cycles each, the P V's DEPBAR passing
at TPV at the earliest; branches fall through. It gives the first and last exponential,
when the P V's wait passes and V's stage is released (the first SYNCS.ARRIVE after it), and
the cycle of the loop's end: dependency and issue counts for one warp alone (no other warp
on its SMSP, no bank conflicts, no clock), not timings.
"""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pa_sass_count import functions, read_sass  # noqa: E402

ALU = ("FMNMX", "FSEL", "ISETP", "FSETP", "F2FP", "LOP3", "PLOP3", "SEL")
NODST = ("BRA", "BAR", "SYNCS", "NANOSLEEP", "WARPSYNC", "NOP", "WARPGROUP", "BSYNC", "BSSY",
         "HGMMA")


def kernel(text, substr):
    """the instructions of the first sm_90a function whose name holds substr"""
    for arch, name, ins in functions(text, with_arch=True):
        if arch == "sm_90a" and substr in name:
            return ins
    return []


def op(i):
    t = i.split()
    return t[1] if t[0].startswith("@") else t[0]


def target(i):
    return int(re.search(r"0x([0-9a-f]+)", i).group(1), 16)


def backward_bra(ins, k):
    while not (op(ins[k][1]).startswith("BRA") and target(ins[k][1]) < ins[k][0]):
        k += 1
    return k


def counts(ins, lo, hi):
    c = collections.Counter()
    for _, i in ins[lo:hi]:
        o = op(i)
        b = o.split(".")[0]
        c[o if b in ("MUFU", "SHFL", "VOTE") else b] += 1
    return c


def model(ins, s, e, tpv):
    ready, t = {}, 0
    mufu_free = alu_free = 0
    first = last = wait = rel = None
    for _, i in ins[s:e + 1]:
        o = op(i)
        b = o.split(".")[0]
        body = i.split(None, 1)[1] if i.split()[0].startswith("@") else i
        rest = body.split(None, 1)[1] if len(body.split(None, 1)) > 1 else ""
        regs = re.findall(r"\b(U?P[0-6]|U?R\d+)\b", rest)
        pred = re.match(r"@!?(U?P\d)", i)
        nd = 2 if b in ("ISETP", "FSETP", "VOTE", "PLOP3") and len(regs) > 1 and \
            re.match(r"U?P", regs[1]) else 1
        dst = [] if b in NODST else regs[:nd]
        src = regs[len(dst):] + ([pred.group(1)] if pred else [])
        start = max([t] + [ready.get(r, 0) for r in src])
        if "DEPBAR.LE gsb0, 0x0" in i:
            start = max(start, tpv)
            wait = start
        lat = 4
        if b == "MUFU":
            start = max(start, mufu_free)
            mufu_free, lat = start + 8, 18
            first = start if first is None else first
            last = start
        elif b in ALU:
            start = max(start, alu_free)
            alu_free = start + 2
        elif b in ("SHFL", "VOTE"):
            lat = 24
        if "SYNCS.ARRIVE" in i and wait is not None and rel is None:
            rel = start
        for r in dst:
            ready[r] = start + lat
        t = start + 1
    return first, last, wait, rel, t


def main(argv):
    if len(argv) < 4 or (len(argv) - 2) % 2:
        print(__doc__)
        return 2
    text = read_sass(argv[1])
    for substr, tpv in zip(argv[2::2], argv[3::2]):
        ins = kernel(text, substr)
        if not ins:
            print(f"{substr}: no sm_90a kernel")
            continue
        maxr = max(int(r) for _, i in ins for r in re.findall(r"\bR(\d+)\b", i))
        arr = sum("WARPGROUP.ARRIVE" in i for _, i in ins)
        dep = sum("WARPGROUP.DEPBAR" in i for _, i in ins)
        print(f"{substr}: {len(ins)} instructions, R{maxr}, {arr} WARPGROUP.ARRIVE, {dep} DEPBAR")
        k = next(n for n, (_, i) in enumerate(ins) if "DEPBAR.LE gsb0, 0x1" in i)
        j = next(n for n in range(k, len(ins)) if "DEPBAR.LE gsb0, 0x0" in ins[n][1])
        e = backward_bra(ins, j)
        keys = ("MUFU.EX2", "FFMA", "FADD", "FMNMX", "F2FP", "FMUL", "SHFL.BFLY", "VOTE.ANY",
                "NANOSLEEP")
        for name, lo, hi in (("before the P V's wait", k + 1, j), ("after it", j + 1, e + 1)):
            c = counts(ins, lo, hi)
            print(f"  {name}: {hi - lo} instr, " + ", ".join(f"{x} {c[x]}" for x in keys if c[x]))
        # the unmasked path starts at the target of the first unconditional BRA after the wait
        u = next(n for n in range(k, j) if op(ins[n][1]) == "BRA" and
                 not ins[n][1].startswith("@"))
        s = next(n for n, (a, _) in enumerate(ins) if a == target(ins[u][1]))
        first, last, wait, rel, end = model(ins, s, e, int(tpv))
        print(f"  model (P V done at {tpv}): {e - s + 1} instr; exponentials {first}..{last}, "
              f"P V's wait passes {wait}, V released {rel}, loop end {end}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
