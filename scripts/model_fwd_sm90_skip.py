#!/usr/bin/env python3
"""scripts/model_fwd_sm90_skip.py [N] -- a hand model (Python, no GPU) of the barrier protocol of
src/cuda/sm90/attention_fwd_sm90.cu's persistent CTA with and without kFlSkip
(OT_ATTN_SM90_SKIP=1), written with the kernel of 2026-11-30 (7f7f657): the producer's K / V
rings (2 stages, FULL / EMPTY mbarriers waited on by phase parity, EMPTY counting one arrival
per consumer warpgroup here for the kernel's one per warp), the Q stage, the consumers'
pingpong turns (named barriers of 2 warpgroups, the turn passed 0 -> 1 (-> 2) -> 0), the
prologue / steps / last P V of each query tile, and the skip's loop. N random CTAs (2 or 3
consumers, key tiles of 128 / 80 / 192 / 176, Sq, Sk in 1..1300, causal / right window /
left window / none, 1-6 query tiles of any index) in random interleavings, each with the skip
off and on. It stops on a deadlock, a warpgroup arriving twice in one generation of a named
barrier, or a ring stage (K, V, Q) read or released while it holds another position than the
one the consumer waited for. A model, not the kernel: it does not replace the device's
racecheck / synccheck. BUG=noturn | nolast | earlyrel (mutations: the skip loop without its
turns, an all-skipping warpgroup without the last P V's turn, a V stage released before its
use) must fail -- they do (deadlock, deadlock, stage hazard); BUG=noqwait (the skip loop
without its Q wait) passes, and BUG=nowait (without its FULL waits) passes without the shift:
the pingpong order alone keeps those arrivals in their phases there.
Since 2026-12-02 (eighteenth session) also kFlShift (the query tiles aligned to the rows' end:
tile m's first row m BR - pad, rows before 0 skipped whole): each random CTA also runs with
the shift -- and under it BUG=nowait fails (a stage hazard: a warpgroup that skips a whole
tile would release a V stage before the producer filled it), so the kernel's FULL waits in
the skip loop are needed since the shift. (kFlWgSplit -- a partial tile's keys split over the consumers, its tail skips and
merge barrier, BUG=notail -- was modelled here too until it was removed from the kernel on
2026-12-02 after its A/B lost; git history.)
Since 2026-12-02 (twentieth session) also kFlStag (stag=True, without the skip: the kernel
compiles it only there): a second turn round the consumers around each softmax's
exponentials (named barriers kExpBar + c, here NC + c), taken in the prologue and in every
pipelined step, consumer 0 clearing the extra arrival at the end. BUG=stagskip (one consumer
takes no exponential turn in its tile prologue) must fail, and does (deadlock).
Since 2026-12-02 (twenty-first session) also kFlDiag (diag=True: 2 consumers, 128-key tiles, the
narrow step of 64 keys per consumer warpgroup whose own rows see at most 64 keys of the
first-visited tile -- its Q K^T turn, softmax, P V turn -- and the empty turn of a consumer that
took none while the other did, after its prologue), with and without kFlStag: kFlStag's
default since then is on kFlDiag's tile. BUG=diagnoempty (no empty turn) must fail, and does
(deadlock); BUG=diagstagskip (no exponential turn in the narrow step) too. Also kFlStag with
kFlSkip (and kFlShift; experiment builds): each skipped tile takes an empty exponential turn
after its pingpong turn; BUG=stagskiploop (without it) must fail, and does (deadlock)."""
import os
import random
import sys

BUG = os.environ.get("BUG", "")

def fd(a, b): return a // b

class MB:
    def __init__(s, cnt): s.cnt, s.pend, s.done = cnt, 0, 0
    def arrive(s):
        s.pend += 1
        if s.pend == s.cnt: s.pend, s.done = 0, s.done + 1
    def ready(s, par): return (s.done & 1) != par

class NB:
    def __init__(s): s.arr = []; s.gen = 0
    def arrive(s, who):
        if who in s.arr: raise AssertionError(f"named barrier: wg {who} twice in one generation")
        s.arr.append(who)
        if len(s.arr) == 2: s.arr = []; s.gen += 1

def run(tiles, NC, BC, BR, sq, sk, wr, wl, skip, seed, shift=False, stag=False, diag=False):
    assert not diag or (NC == 2 and BC == 128 and not skip and not shift), \
        "kFlDiag: 2 consumers, the 128-key tile, no kFlSkip / kFlShift"
    NW = 64   # kFlDiag's narrow step: 64 keys
    rnd = random.Random(seed)
    pad = (-(-sq // BR)) * BR - sq if shift else 0
    FQ, EQ = MB(1), MB(NC)
    FK, EK, FV, EV = [MB(1), MB(1)], [MB(NC), MB(NC)], [MB(1), MB(1)], [MB(NC), MB(NC)]
    NBs = {c: NB() for c in range(2 * NC)}   # NC .. 2 NC - 1: kFlStag's exponential turns
    kst, vst, qst = [None, None], [None, None], [None]
    off = sk - sq
    def tinfo(m):
        first = m * BR - pad
        row_last = min(first + BR - 1, sq - 1)
        n_max = -(-sk // BC)
        if wr >= 0: n_max = min(n_max, fd(row_last + off + wr, BC) + 1)
        n_min = max(0, fd(first + off - wl, BC)) if wl >= 0 else 0
        return n_min, n_max
    def producer():
        kv = qn = 0
        for m in tiles:
            n_min, n_max = tinfo(m); n = n_max - n_min
            if n <= 0: continue
            if qn > 0:
                while not EQ.ready((qn - 1) & 1): yield
            qst[0] = qn; FQ.arrive(); qn += 1
            for it in range(n + 1):
                if it < n:
                    g = kv + it; s_ = g % 2
                    while not EK[s_].ready(((g // 2) & 1) ^ 1): yield
                    kst[s_] = g; FK[s_].arrive()
                    yield
                if it > 0:
                    g = kv + it - 1; s_ = g % 2
                    while not EV[s_].ready(((g // 2) & 1) ^ 1): yield
                    vst[s_] = g; FV[s_].arrive()
                    yield
            kv += n
    def consumer(c):
        my, other = c, (c + 1) % NC
        def wait_full(mb, par):
            while not mb.ready(par): yield
        def named_sync(b):
            nb = NBs[b]; nb.arrive(c)
            g0 = nb.gen if c in nb.arr else nb.gen - 1   # generation joined
            while nb.gen <= g0: yield
        def use(st, g, what):
            if st[g % 2] != g: raise AssertionError(f"wg {c}: {what} stage holds {st[g % 2]}, wanted {g}")
        def exp_turn(step):
            # kFlStag: the softmax's exponentials inside a turn of their own
            if not stag or (BUG == "stagskip" and c == 1 and step == 0): return
            yield from named_sync(NC + my)
            for _ in range(rnd.randint(0, 4)): yield   # the exponentials
            NBs[NC + other].arrive(c)
        def first_qk(g):
            # a tile's first Q K^T (the prologue's, or kFlDiag's narrow step's): Q and K of
            # ring position g waited for, issued in a pingpong turn, K released after it
            yield from wait_full(FQ, qn & 1)
            yield from wait_full(FK[g % 2], (g // 2) & 1)
            yield from named_sync(my)
            if qst[0] != qn: raise AssertionError("Q")
            use(kst, g, "K"); NBs[other].arrive(c)
            yield
            use(kst, g, "K at release"); EK[g % 2].arrive()
        if c == NC - 1: NBs[0].arrive(c)
        if stag and c == NC - 1: NBs[NC].arrive(c)
        kv = qn = 0
        for m in tiles:
            n_min, n_max = tinfo(m); n_iters = n_max - n_min
            if n_iters <= 0: continue
            n_max_s, n_it_s, kv_s = n_max, n_iters, kv
            first = m * BR - pad
            narrow = other_narrow = False
            if diag:   # per warpgroup: the keys of tile n_max - 1 that its own rows see
                for w in range(NC):
                    wf = m * BR + w * 64; wl_ = min(wf + 63, sq - 1)
                    end = min(sk, wl_ + off + wr + 1) if wr >= 0 else sk
                    nw = wf >= sq or end - (n_max - 1) * BC <= NW
                    if w == c: narrow = nw
                    else: other_narrow |= nw
            if narrow:   # the narrow step: Q K^T turn, softmax, P V turn, each waited for
                g = kv_s
                yield from first_qk(g)
                if BUG != "diagstagskip": yield from exp_turn(0)
                yield from wait_full(FV[g % 2], (g // 2) & 1)
                yield from named_sync(my); use(vst, g, "V"); NBs[other].arrive(c)
                yield
                use(vst, g, "V at release"); EV[g % 2].arrive()
                n_max_s -= 1; n_it_s -= 1; kv_s += 1
            if skip:
                wg_first = first + c * 64
                wg_last = min(wg_first + 63, sq - 1)
                vis = min(sk - 1, wg_last + off + wr) if wr >= 0 else sk - 1
                n_skip = n_it_s if wg_first >= sq or (shift and wg_last < 0) else \
                    min(n_it_s, max(0, n_max_s - (fd(vis, BC) + 1)))
                for i in range(n_skip):
                    g = kv_s + i
                    if BUG != "nowait": yield from wait_full(FK[g % 2], (g // 2) & 1)
                    if BUG != "noturn":
                        yield from named_sync(my); NBs[other].arrive(c)
                    EK[g % 2].arrive(); yield
                    # kFlStag with the skip: the skipped tile's softmax turn, empty
                    if BUG != "stagskiploop": yield from exp_turn(-1)
                    if BUG != "nowait": yield from wait_full(FV[g % 2], (g // 2) & 1)
                    EV[g % 2].arrive(); yield
                n_max_s -= n_skip; n_it_s -= n_skip; kv_s += n_skip
                if n_it_s == 0 and BUG != "nolast":
                    if BUG != "noqwait": yield from wait_full(FQ, qn & 1)
                    yield from named_sync(my); NBs[other].arrive(c)
            if n_it_s > 0:   # the prologue: S_0 = Q K^T, its softmax
                yield from first_qk(kv_s)
                yield from exp_turn(0)
                if diag and not narrow and other_narrow and n_iters >= 2 and \
                        BUG != "diagnoempty":
                    yield from named_sync(my); NBs[other].arrive(c)   # the empty turn
            for it in range(1, n_it_s):
                gk = kv_s + it; gv = gk - 1
                yield from wait_full(FK[gk % 2], (gk // 2) & 1)
                yield from named_sync(my)
                use(kst, gk, "K")
                if qst[0] != qn: raise AssertionError("Q")
                yield from wait_full(FV[gv % 2], (gv // 2) & 1)
                if BUG == "earlyrel": EV[gv % 2].arrive()
                use(vst, gv, "V"); NBs[other].arrive(c)
                yield
                use(kst, gk, "K at release"); EK[gk % 2].arrive()
                for _ in range(rnd.randint(0, 8)): yield   # the softmax
                yield from exp_turn(it)
                use(vst, gv, "V at release")
                if BUG != "earlyrel": EV[gv % 2].arrive()
            if n_it_s > 0 and qst[0] != qn: raise AssertionError("Q at release")
            EQ.arrive()
            if n_it_s > 0:
                gv = kv_s + n_it_s - 1
                yield from wait_full(FV[gv % 2], (gv // 2) & 1)
                yield from named_sync(my); use(vst, gv, "V"); NBs[other].arrive(c)
                yield
                use(vst, gv, "V at release"); EV[gv % 2].arrive()
            kv += n_iters; qn += 1
        if c == 0:
            yield from named_sync(0)
            if stag: yield from named_sync(NC)
    ths = [producer()] + [consumer(c) for c in range(NC)]
    alive = list(range(len(ths)))
    stuck = 0
    while alive:
        i = rnd.choice(alive)
        try:
            next(ths[i]); stuck += 1
        except StopIteration:
            alive.remove(i); stuck = 0
        if stuck > 200000: raise AssertionError(f"deadlock (alive {alive})")
    return True

def main():
    rng = random.Random(1)
    n = 0
    for trial in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3000):
        NC, BC = rng.choice([(2, 128), (3, 128), (2, 80), (2, 192), (2, 176)])
        BR = 64 * NC
        sq, sk = rng.choice([1, 17, 100, 300, 700, 1000, 1024, 1300]), rng.choice([1, 17, 100, 300, 700, 1000, 1024, 1100])
        wr = rng.choice([-1, 0, 0, 0, 5])
        wl = rng.choice([-1, -1, 200])
        num_m = -(-sq // BR)
        tiles = [rng.randrange(num_m) for _ in range(rng.randint(1, 6))]
        for skip in (False, True):
            run(tiles, NC, BC, BR, sq, sk, wr, wl, skip, trial)
        num_m = -(-sq // BR)
        run([rng.randrange(num_m) for _ in range(rng.randint(1, 6))], NC, BC, BR, sq, sk, wr, wl,
            True, trial, shift=True)
        run(tiles, NC, BC, BR, sq, sk, wr, wl, False, trial, stag=True)
        run(tiles, NC, BC, BR, sq, sk, wr, wl, True, trial, stag=True)
        run(tiles, NC, BC, BR, sq, sk, wr, wl, True, trial, shift=True, stag=True)
        if NC == 2 and BC == 128:
            for stag in (False, True):
                run(tiles, NC, BC, BR, sq, sk, wr, wl, False, trial, stag=stag, diag=True)
        n += 1
    print(f"{n} random CTAs x 6 (default, skip, shift with skip, stag, stag with skip, stag with "
          "skip and shift; on the 2-consumer "
          "128-key tile also diag, diag with stag): no deadlock, no double arrival, no stage "
          "hazard")

if __name__ == "__main__":
    main()
