#!/usr/bin/env python3
"""Count the instructions of the paged-decode key loop, per 16-key step, from the SASS.

usage: scripts/pa_sass_count.py OBJ_OR_SASS [--filter SUBSTR] [--blocks] [--json OUT]

OBJ_OR_SASS: an object file (cuobjdump -sass is run on it: $CUOBJDUMP, else cuobjdump on
PATH, else the one under .venv-test's triton) or a saved `cuobjdump -sass` listing. Every
pa_mma_kernel / ps_kernel function (names demangled by hand: T, D, S, XT / P, AL, NW) gets:

  - its key loop: the innermost conditional backward branch whose body holds the most HMMA (the
    `#pragma unroll 1` loop over a warp's steps: 32 HMMA at head_dim 128);
  - `static`: the instructions of that body (every path, the cold ones included);
  - `path`: the instructions one warp issues per step on the common path of that instance,
    found as the shortest path through the body's control-flow graph (back edges and
    BRA.DIV fallbacks left out) that passes every block holding an HMMA, the page-id load
    (LDG.E.CONSTANT) and the step's copies: the 16 K / V LDGSTS without ZFILL where the
    instance has them (the aligned-page copies, a whole step), else the general ones. So:
    a whole step, no masks to apply where the code can skip them (the AL warp vote), no
    division paths (pages of 2^k keys), no OT_DEBUG flag. Predicated-off instructions
    count (they issue). An estimate of issue slots, not a measurement;
  - the path by category (mma, copy = LDGSTS / LDGDEPBAR / DEPBAR / SYNCS, lds, ldg, shfl/vote,
    mufu, fp, int = integer and address arithmetic, uniform, control, other) and by
    region: `issue` (from the loop head to the cp.async or mbarrier wait: the next step's copies and
    the page-id load) and `step` (the wait, the mask vote and pa_step).

--blocks also prints the loop's basic blocks (address, size, on the path, categories).
Instances of one build can be compared side by side (round 9's builds also had opt-in
variant instances, `var1` / `var3`); decode rounds 9 and 10 (docs/PERFORMANCE.md) quote this
script's counts: since 5c74ca7 every aligned instance, the early-start one included, 331.
"""
import json
import os
import re
import shutil
import subprocess
import sys

CATS = ("mma", "copy", "lds", "ldg", "shfl", "mufu", "fp", "int", "uniform", "control", "nop", "other")


def category(op, text=""):
    if text.startswith("@!PT "):
        return "nop"  # never executed (the compiler's padding before LDGSTS groups)
    base = op.split(".")[0]
    if base == "HMMA":
        return "mma"
    if base in ("LDGSTS", "LDGDEPBAR", "DEPBAR", "SYNCS"):
        return "copy"  # (SYNCS: an mbarrier ring's expect_tx and wait, the TMA ring's)
    if base in ("LDS", "LDSM"):
        return "lds"
    if base in ("LDG", "LDC", "LD"):
        return "ldg"
    if base in ("SHFL", "VOTE", "VOTEU", "MATCH", "REDUX"):
        return "shfl"
    if base == "MUFU":
        return "mufu"
    if base in ("FMUL", "FADD", "FFMA", "FMNMX", "FSEL", "FSETP", "F2FP", "FSET", "FCHK", "HADD2",
                "HMUL2", "HFMA2", "FMUL2", "FADD2", "FFMA2"):
        return "fp"
    if base in ("IMAD", "IADD3", "LEA", "SHF", "LOP3", "ISETP", "SEL", "MOV", "IABS", "I2F", "F2I",
                "VIADD", "IMNMX", "PRMT", "S2R", "CS2R", "POPC", "FLO", "BREV", "P2R", "R2P",
                "PLOP3", "IADD", "I2FP", "VIMNMX", "SGXT", "BMSK", "IDP", "BFE"):
        return "int"
    if base.startswith("U") or base in ("R2UR", "S2UR"):
        return "uniform"
    if base in ("BRA", "BSSY", "BSYNC", "WARPSYNC", "YIELD", "NOP", "EXIT", "BAR", "CALL", "RET",
                "JMP", "BPT", "ACQBULK", "WARPGROUP", "ELECT"):
        return "control"
    return "other"


def read_sass(path):
    if not path.endswith(".o"):
        return open(path).read()
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        here = os.path.dirname(os.path.abspath(__file__))
        tool = os.path.join(here, "..", ".venv-test", "lib", "python3.11", "site-packages", "triton",
                            "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        sys.exit("no cuobjdump: set CUOBJDUMP (e.g. from `pip download --no-deps nvidia-cuda-cuobjdump "
                 "nvidia-cuda-nvdisasm`, the wheels unpacked; NVDISASM_PATH to the nvdisasm folder)")
    r = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{tool} -sass {path}: {r.stderr.strip()}")
    return r.stdout


def functions(text, with_arch=False):
    """(name, [(addr, text)]) per function, in file order; with_arch: (arch, name, [...]),
    arch the listing's current `arch = sm_XX` (objects of several archs list each)."""
    out, arch, name, ins = [], "", None, []
    for line in text.split("\n"):
        m = re.search(r"arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                out.append((name_arch, name, ins) if with_arch else (name, ins))
            name, name_arch, ins = m.group(1), arch, []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and name:
            ins.append((int(m.group(1), 16), m.group(2)))
    if name:
        out.append((name_arch, name, ins) if with_arch else (name, ins))
    return out


def pretty(name):
    """ot::pa_mma_kernel<bf16,128,S3,XT0,pa_params,AL1,NW4>-style short names."""
    m = re.match(r"_ZN2ot13pa_mma_kernelI(.*?)Li(\d+)ELi(\d+)ELb(\d)E(.*?)ELb(\d)ELi(\d+)EEEvT3_$", name)
    t = lambda s: "bf16" if "bfloat16" in s else "f16" if "half" in s else "f32"
    if m:
        return "pa_mma_kernel<%s,D%s,S%s,XT%s,%s,AL%s,NW%s>" % (
            t(m.group(1)), m.group(2), m.group(3), m.group(4), params(m.group(5)), m.group(6),
            m.group(7))
    m = re.match(r"_ZN2ot9ps_kernelI(.*?)Li(\d+)ELi(\d+)E(.*?)ELb(\d)EEEvT2_$", name)
    if m:
        return "ps_kernel<%s,D%s,S%s,%s,AL%s>" % (t(m.group(1)), m.group(2), m.group(3),
                                                  params(m.group(4)), m.group(5))
    return None


def params(s):
    if "pa_params_tm" in s:
        return "tm"
    m = re.search(r"pa_params_vILi(\d+)E", s)
    if m:
        return "var%s" % m.group(1)
    return "pa_params"


def branch_of(t):
    """(target, conditional, div) of a BRA, else None."""
    m = re.match(r"(@!?U?P\w+\s+)?BRA(\.\w+)*\s+(.*)$", t)
    if not m:
        return None
    ops = m.group(3)
    tm = re.search(r"(0x[0-9a-f]+)\s*$", ops)
    if not tm:
        return None
    pred = m.group(1) or ""
    cond = (pred.strip() not in ("", "@PT")) or "," in ops
    div = ".DIV" in (m.group(2) or "") or "BRA.DIV" in t
    return int(tm.group(1), 16), cond, div


def opcode(t):
    t = re.sub(r"^@!?U?P\w+\s+", "", t)
    return t.split()[0] if t.split() else ""


def key_loop(ins):
    best = None
    addrs = [a for a, _ in ins]
    for i, (a, t) in enumerate(ins):
        b = branch_of(t)
        if not b or b[0] >= a or b[2] or not b[1]:
            continue  # a loop's back edge is conditional (the BRA.DIV stubs jump back unconditionally)
        lo, hi = b[0], a
        body = [x for x in ins if lo <= x[0] <= hi]
        nh = sum(opcode(x[1]).startswith("HMMA") for x in body)
        if nh == 0:
            continue
        if best is None or nh > best[0] or (nh == best[0] and len(body) < len(best[1])):
            best = (nh, body)
    return best[1] if best else None


def blocks_of(body):
    lo, hi = body[0][0], body[-1][0]
    starts = {lo}
    for i, (a, t) in enumerate(body):
        b = branch_of(t)
        if b and not b[2]:
            if lo <= b[0] <= hi:
                starts.add(b[0])
            if i + 1 < len(body):
                starts.add(body[i + 1][0])
        elif opcode(t) == "EXIT" and i + 1 < len(body):
            starts.add(body[i + 1][0])
    blocks, cur = [], []
    for a, t in body:
        if a in starts and cur:
            blocks.append(cur)
            cur = []
        cur.append((a, t))
    if cur:
        blocks.append(cur)
    return blocks


def analyse(name, ins):
    body = key_loop(ins)
    if not body:
        return None
    blocks = blocks_of(body)
    idx = {b[0][0]: i for i, b in enumerate(blocks)}
    n = len(blocks)
    succ = [[] for _ in range(n)]
    for i, b in enumerate(blocks):
        a, t = b[-1]
        br = branch_of(t)
        op = opcode(t)
        fall = i + 1 < n
        if br and not br[2]:
            tgt, cond, _ = br
            if tgt in idx and idx[tgt] > i:
                succ[i].append(idx[tgt])
            if cond and fall:
                succ[i].append(i + 1)
        elif op != "EXIT" and fall:
            succ[i].append(i + 1)

    def has(b, pred):
        return any(pred(opcode(t), t) for _, t in b)

    fast = [i for i, b in enumerate(blocks)
            if sum(opcode(t).startswith("LDGSTS") and "ZFILL" not in opcode(t) for _, t in b) >= 8]
    way = set()
    for i, b in enumerate(blocks):
        if has(b, lambda o, t: o.startswith("HMMA")) or has(b, lambda o, t: o == "LDG.E.CONSTANT"):
            way.add(i)
        if not fast and has(b, lambda o, t: o.startswith("LDGSTS")):
            way.add(i)
    way.update(fast)
    way.add(n - 1)
    size = [len(b) for b in blocks]
    INF = float("inf")

    def shortest(src, dst):
        dist = [INF] * n
        prev = [-1] * n
        dist[src] = size[src]
        for i in range(src, dst + 1):
            if dist[i] == INF:
                continue
            for j in succ[i]:
                if j <= dst and dist[i] + size[j] < dist[j]:
                    dist[j] = dist[i] + size[j]
                    prev[j] = i
        if dist[dst] == INF:
            return None
        path, j = [], dst
        while j != -1:
            path.append(j)
            if j == src:
                break
            j = prev[j]
        return path[::-1]

    # waypoints in address order; one that the path so far cannot reach (an alternative of
    # another, e.g. the early start's first-stage copies) is left out
    path = [0]
    skipped = []
    for b in sorted(way):
        if b == path[-1]:
            continue
        seg = shortest(path[-1], b)
        if seg is None:
            skipped.append("%05x" % blocks[b][0][0])
            continue
        path += seg[1:]
    if path[-1] != n - 1:
        return {"name": name, "error": "no path to the back edge"}
    on = set(path)
    cats = {c: 0 for c in CATS}
    region = {"issue": 0, "step": 0}
    rcat = {"issue": {c: 0 for c in CATS}, "step": {c: 0 for c in CATS}}
    reg = "issue"
    for i in path:
        for _, t in blocks[i]:
            o = opcode(t)
            if o.startswith("DEPBAR") or o.startswith("SYNCS.PHASECHK"):
                reg = "step"
            cats[category(o, t)] += 1
            rcat[reg][category(o, t)] += 1
            region[reg] += 1
    static = {c: 0 for c in CATS}
    for _, t in body:
        static[category(opcode(t), t)] += 1
    return {
        "name": name,
        "short": pretty(name) or name,
        "static": len(body),
        "static_by_category": static,
        "path": sum(size[i] for i in path),
        "path_by_category": cats,
        "path_by_region": region,
        "path_by_region_category": rcat,
        "waypoints_skipped": skipped,
        "path_ldgsts": sum(opcode(t).startswith("LDGSTS") for i in path for _, t in blocks[i]),
        "blocks": [
            {"addr": "%05x" % b[0][0], "n": len(b), "on_path": i in on,
             "cats": {c: v for c, v in
                      ((c, sum(category(opcode(t), t) == c for _, t in b)) for c in CATS) if v}}
            for i, b in enumerate(blocks)
        ],
    }


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    flt, show_blocks, jout = None, False, None
    args = argv[2:]
    while args:
        a = args.pop(0)
        if a == "--filter":
            flt = args.pop(0)
        elif a == "--blocks":
            show_blocks = True
        elif a == "--json":
            jout = args.pop(0)
    res = []
    for name, ins in functions(read_sass(argv[1])):
        short = pretty(name)
        if not short or (flt and flt not in short and flt not in name):
            continue
        r = analyse(name, ins)
        if r:
            res.append(r)
    hdr = "%-58s %6s %5s | %s | %s" % ("kernel", "static", "path", " ".join("%5s" % c[:5] for c in CATS),
                                        "issue  step")
    print(hdr)
    for r in res:
        if "error" in r:
            print("%-58s %s" % (r.get("short", r["name"]), r["error"]))
            continue
        print("%-58s %6d %5d | %s | %5d %5d" % (
            r["short"], r["static"], r["path"],
            " ".join("%5d" % r["path_by_category"][c] for c in CATS),
            r["path_by_region"]["issue"], r["path_by_region"]["step"]))
        for reg in ("issue", "step"):
            print("%-58s %6s %5d | %s |" % ("  " + reg, "", r["path_by_region"][reg],
                  " ".join("%5d" % r["path_by_region_category"][reg][c] for c in CATS)))
        if r["waypoints_skipped"]:
            print("  (waypoint blocks left out: %s)" % " ".join(r["waypoints_skipped"]))
        if show_blocks:
            for b in r["blocks"]:
                print("    %s %4d %s %s" % (b["addr"], b["n"], "*" if b["on_path"] else " ",
                                            " ".join("%s:%d" % kv for kv in b["cats"].items())))
    if jout:
        with open(jout, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "blocks"} for r in res], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
