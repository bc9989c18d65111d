#!/usr/bin/env python3
"""attn_fwd_variants.py -- one process that (1) checks the Hopper forward's compiled variants
(template bits of src/cuda/sm90/attention_fwd_sm90.cu, selected by OT_ATTN_SM90_* switches; a
build with -DOT_ATTN_SM90_EXPERIMENTS carries the bf16 ones) against float64 references, (2)
times every variant against the default and torch SDPA cuDNN / flash on the same inputs in
interleaved rounds in a balanced order (round_order: clock drift, the position in a round and
the side run just before hit every side alike; until 2026-11-30 ~11:45 the order was fixed,
default first; then a cyclic rotation, which kept the default right after flash whenever flash
was not last; since 2026-12-03 each block after --warm-ms, 100, of untimed calls of the same
side, so that it runs at its own steady clock under the power cap), over the benchmark grid of
bench_attention.py (bf16, batch*seq = 32k tokens, heads*D = 2048), (3) measures the host time
of one call at a small shape.

  python3 bench/attn_fwd_variants.py SHIM [--rounds 3] [--dims 128,64,256]
      [--seqs 1024,4096,16384] [--json OUT] [--no-check] [--no-host] [--only a,b]
      [--causal both|full|causal] [--no-flash] [--host-only] [--checks a,b]

The JSON (shared/BENCH.md rows, op attention_fwd) carries for each case the default's median,
the peers', and a "variants" dict {name: median TFLOP/s}. A variant that is not compiled for a
shape runs the default (the kernel drops unknown bits), so variants are timed only where
variant_list() says that they exist.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402
from benchutil import round_order  # noqa: E402

RESC = {"OT_ATTN_SM90_RESC": "1"}
NORESC = {"OT_ATTN_SM90_RESC": "0"}
WIDE = {"OT_ATTN_SM90_TILE": "wide"}
SPLIT = {"OT_ATTN_SM90_SPLIT": "1"}
NONPERS = {"OT_ATTN_SM90_NONPERSISTENT": "1"}
NARROW = {"OT_ATTN_SM90_NARROW": "1"}
GRID128 = {"OT_ATTN_SM90_GRID": "128"}
WG2 = {"OT_ATTN_SM90_WG": "2"}
WG3 = {"OT_ATTN_SM90_WG": "3"}
SKIP = {"OT_ATTN_SM90_SKIP": "1"}
NOSKIP = {"OT_ATTN_SM90_SKIP": "0"}  # where kFlSkip is the default (D64 causal, 3 consumers)
SHIFT = {"OT_ATTN_SM90_ALIGN": "end"}  # kFlShift: query tiles aligned to the rows' end
NOSHIFT = {"OT_ATTN_SM90_ALIGN": "start"}  # the tiles aligned to the rows' start
DIAG = {"OT_ATTN_SM90_DIAG": "1"}
NODIAG = {"OT_ATTN_SM90_DIAG": "0"}
PIN = {"OT_ATTN_SM90_PIN": "1"}
NOPIN = {"OT_ATTN_SM90_PIN": "0"}  # the plain order where kFlPin is the default
ST16 = {"OT_ATTN_SM90_ST16": "1"}  # kFlSt16: O stored 16 bytes a lane
NOST16 = {"OT_ATTN_SM90_ST16": "0"}  # the 4-byte stores where kFlSt16 is the default
STAG = {"OT_ATTN_SM90_STAG": "1"}  # kFlStag: a turn round the consumers at each softmax
NOSTAG = {"OT_ATTN_SM90_STAG": "0"}  # without it where it is the default (D64 causal)
WIDERESC = {**WIDE, **RESC}


ONLY = None   # --only: the variant names to run (checks and timings)
CHECK_ONLY = None   # --checks: the checks' names where they differ from --only


def variant_list(d, s, causal):
    """The experiment build's bf16 variants that apply to the tile the default picks."""
    return [(n, e) for n, e in _variant_list(d, s, causal) if ONLY is None or n in ONLY]


def _variant_list(d, s, causal):
    # since the narrow step (c463491) the experiment build carries kFlNarrow (D128 176-key
    # tile at 48 keys, S 4k's last tile; D256 at 16 / 64), the split (D128 176) and the
    # rescale threshold; the polynomial exponentials (measured slower, docs/ATTENTION.md) are
    # gone (no instances since c463491, the switch and code since 2026-12-02). (The build
    # measured on 2026-11-30 ~13:27 / ~13:29 UTC also had a D128 16-key instance, which ran
    # S 16k's narrow column.)
    v = []
    # kFlStag (prepared 2026-12-02, twentieth session): on each default's bits where no kFlSkip
    # is among them (D64 2 consumers, D64 full on 3, D128 both tiles); "stagnoskip" for D64
    # causal on 3 consumers (S > 1024, whose default has the skip), against "noskip"
    # (since 2026-12-02, twenty-first session, also with kFlSkip: D64 causal on 3 consumers,
    # the skipped tiles taking an empty turn)
    if d in (64, 128):
        v.append(("stag", STAG))
    if d == 64 and causal and s > 1024:
        v.append(("stagnoskip", {**STAG, **NOSKIP}))
    # since 2026-12-02 (twenty-first session) the default of bf16 D64 kFlDiag calls (masked,
    # at most 8 query tiles) and of D64 causal 3-consumer calls with kFlShift (S > 1024 not a
    # multiple of 192; where it is one, "nostag" runs the default twice): "nostag" without it
    if d == 64 and causal:
        v.append(("nostag", NOSTAG))
    # since the twenty-seventh session (2026-12-03) D128 runs the 128-key tile for every call
    # (the steady state: 1.04x / 1.06x / 1.01x the 176-key tile at Sk 4k / 8k / 16k); the
    # 176-key tile's variants ("wide" is that tile with its defaults: kFlPin, and kFlNarrow
    # where the last tile has at most 48 keys and Sk <= 6400) on top of OT_ATTN_SM90_TILE=wide
    if d == 128 and not causal and s > 2048:
        v += [("wide", WIDE), ("widenarrow", {**WIDE, **NARROW}), ("widesplit", {**WIDE, **SPLIT}),
              ("wideresc", WIDERESC), ("nonpers", NONPERS)]
    if d == 128 and not causal and s > 6400:          # narrow off by default (S 16k): resc is
        v.append(("widerescnarrow", {**WIDERESC, **NARROW}))  # the threshold alone, this both
    # 4096 (D128) / 2048 (D256) equal tiles: 32 / 16 rounds of 128 CTAs instead of 31 / 15
    # full rounds of 132 and a last one of 4 / 68 (the same number of rounds)
    if d in (128, 256) and not causal:
        v.append(("grid128", GRID128))
    if causal and s <= 8192:                          # persistent, sectioned, falling lengths
        v.append(("nonpers", NONPERS))                # (kFlSnake, "snake": lost, removed)
    if d == 64 and causal and s <= 8192:              # 2 consumers, 128-key tile
        v += [("wide", WIDE), ("wg3", WG3)]           # wide: the 192-key tile
        v.append(("wg3pin", {**WG3, **PIN}))          # 3 consumers with kFlPin (2026-12-02)
    # kFlSkip (prepared 2026-11-30, not measured): a consumer warpgroup skips the key tiles
    # in which all of its rows are masked or past Sq. Warpgroup-tiles dropped at S 1k causal:
    # D256 7 of 122, D64 with 3 consumers 24 of 96 (wg3skip, against wg3); D64 / D128 with 2
    # consumers none (an A/A control: the same work, the skip's extra code); D64 full (3
    # consumers) 16 of 144 (the last tile's padding warpgroups)
    if causal and d in (64, 128, 256):
        v.append(("skip", SKIP))
    if d == 64 and causal:
        v += [("wg3", WG3), ("wg3skip", {**WG3, **SKIP})]
    # since 2026-12-02 (eighteenth session) the default of bf16 D64 causal calls on 3
    # consumers (16 query tiles of 128 or more; bf16 from 9 since the nineteenth session):
    # "noskip" the 3-consumer kernel without it
    if d == 64 and causal and s >= 1025:
        v.append(("noskip", NOSKIP))
    # kFlShift: the 192-row tiles of D64 causal calls aligned to the rows' end (the partial
    # tile first: the fewest keys); since 2026-12-02 (nineteenth session) the default of bf16
    # D64 causal calls on 3 consumers, which take 9 query tiles on (S > 1024): "noshift" the
    # start-aligned tiles there, "wg3shift" 3 consumers where 2 are the default (S <= 1024),
    # "shiftnoskip" without kFlSkip (against "noskip")
    if d == 64 and causal and s % 192:
        if s <= 1024:
            v.append(("wg3shift", {**WG3, **SHIFT}))
        else:
            v += [("noshift", NOSHIFT), ("shiftnoskip", {**SHIFT, **NOSKIP})]
    # kFlDiag (2026-11-30 evening): the narrow step per consumer warpgroup at 64 keys on the
    # 2-consumer 128-key tile: causal Sq = Sk, the first warpgroup of each 128-row tile runs
    # its half-visible diagonal tile over 64 keys (4 of 72 warpgroup-tiles at S 1k, 16 of
    # 1056 at 4k); D64 causal up to 64 query tiles (S 8k), D128 causal
    if causal and (d == 128 or (d == 64 and s <= 8192)):
        v.append(("diag", DIAG))
    if causal and d == 64 and s <= 1024:      # the default there since this session (bf16)
        v.append(("nodiag", NODIAG))
    if d == 64 and not causal and s <= 4096:
        v.append(("skip", SKIP))
    if d == 64 and not causal and s <= 2048:          # 3 consumers: 192-row tiles, S 1k 6 of
        v += [("wg2", WG2), ("nonpers", NONPERS)]     # them (1152 rows); wg2: 8 of 128
    if d == 128 and not causal and s <= 2048:         # 128-key tile, rescale threshold on by
        v += [("wide", WIDE), ("nonpers", NONPERS), ("noresc", NORESC)]  # default (a60aa63)
    if d in (128, 256) and causal:                    # rescale threshold on by default
        v.append(("noresc", NORESC))
    if d == 256 and not causal and s % 80:            # 80-key tile, rescale threshold on
        v.append(("narrow", NARROW))
    # (kFlXT on kFlQ2's Q ring, "xt": D64 causal 0.90x / 0.95x at S 1k / 4k on 2026-11-30
    # night, removed 2026-12-02; bench/results/attention_fwd_q2xt.json)
    # (kFlLate, "late" / "latenodiag": measured 0.88-0.98x the default on 2026-12-02 and
    # removed; bench/results/attention_fwd_late.json)
    # kFlPin (prepared 2026-11-30 night, not measured): the pipelined step's softmax before its
    # P V's wait (in every default kernel ptxas puts all of the step's exponentials after it);
    # compiled for every default bf16 tile (D64 2 consumers with and without kFlDiag, 3; D128
    # 128-key with the threshold, 176-key with and without the 48-key narrow step; D256): all
    # of the grid
    v.append(("pin", PIN))
    # kFlPin the default (2026-11-30) for bf16 unmasked calls on D128's 176-key tile (S > 2048)
    # and D64's 3-consumer tile: there "pin" is the default and "nopin" the plain order
    if not causal and (d == 64 or (d == 128 and s > 2048)):
        v.append(("nopin", NOPIN))
    # since 2026-12-02 also for bf16 D64 causal calls on 2 consumers past kFlDiag's 8 query
    # tiles (up to 15 since the balance gate and kFlSkip, 2026-12-02: 3 consumers from 16 on)
    if causal and d == 64 and 1024 < s <= 1920:
        v.append(("nopin", NOPIN))
    if causal and d == 64 and s <= 1024:
        v.append(("pinnodiag", {**PIN, **NODIAG}))
    # kFlSt16 (2026-12-01; the default for bf16 D128 128-key, D256 masked and D64 kFlDiag
    # tiles since): O stored 16 bytes a lane after a transpose within each row quad; compiled
    # in experiment builds on every default bf16 tile: D256, D128 128-key (causal, Sk <= 2048),
    # D128 176-key with and without the narrow step (the pin), D64 2 consumers with and without
    # kFlDiag (causal S <= 8k), D64 3 consumers (the pin; unmasked). Where it is the default,
    # "nost16" (=0) is the other side
    if d in (64, 128, 256):
        v.append(("st16", ST16))
    if d == 256 and causal or (d == 128 and (causal or s <= 2048)) or \
            (d == 64 and causal and s <= 1024):
        v.append(("nost16", NOST16))
    # (NC = 1, "wg1" / "wg1nonpers" / "wg1nodiag": lost on 2026-12-01 -- D64 S 1k causal
    # 0.986x, full 0.961x, S 4k full 0.903x -- and removed; bench/results/attention_fwd_wg1.json)
    # D128 masked calls of > 64 query tiles (S 16k causal: one CTA per tile) on the 176-key
    # tile of the unmasked calls, without / with the rescale threshold
    if d == 128 and causal and s > 8192:
        v += [("wide", WIDE), ("wideresc", WIDERESC)]
    seen = set()
    return [(n, e) for n, e in v if not (n in seen or seen.add(n))]


def checks(S):
    """float64 checks of each variant on shapes whose last key tile is partial, causal with
    Sq != Sk, GQA, lse; the wide D128 tile forced on short sequences."""
    ck = ba.Checker()
    ONLY = CHECK_ONLY
    wide = {"OT_ATTN_SM90_TILE": "wide"}
    envs = [("default", {}), ("resc", RESC), ("wide", WIDE)]
    envs = [e for n, e in envs if ONLY is None or n in ONLY]
    for env in envs:
        for d, sq, sk, wr, extra in ((128, 300, 200, -1, wide), (128, 1000, 1000, -1, wide),
                                     (128, 600, 4097, -1, wide), (128, 333, 1000, 0, wide),
                                     (128, 1000, 700, 0, wide), (64, 1000, 1100, -1, {}),
                                     (64, 700, 1000, 0, {}), (256, 1000, 1000, -1, {}),
                                     (256, 500, 700, 0, {}), (256, 300, 1030, -1, {})):
            ba.check_case(S, ck, 2, sq, sk, 4, 2, d, wr=wr, env={**extra, **env})
    # fp16 keeps the default instances (the variants are bf16 only): still right with the switches
    ba.check_case(S, ck, 2, 1000, 1000, 4, 2, 128, dtype=torch.float16,
                  env={**wide, **RESC, **NARROW})
    # the multi-tile persistent path (ring phases across tiles) with the variants
    ba.check_case(S, ck, 2, 1000, 1000, 4, 4, 128, env={**wide, **RESC, "OT_ATTN_SM90_GRID": "3"})
    ba.check_case(S, ck, 2, 1000, 1000, 4, 4, 256, env={"OT_ATTN_SM90_GRID": "3"})
    if ONLY is None or "narrow" in ONLY:
        # kFlNarrow: the partial last key tile as a step of its own at the compiled widths
        # (D128 176-key tile: Sk mod 176 = 1, 8, 16, 33, 47, 48, and Sk = 40, the step alone;
        # D256: Sk mod 80 = 1, 16, 49, 64; the D128 ones on the 176-key tile, which only
        # OT_ATTN_SM90_TILE=wide reaches since 2026-12-03), Sq != Sk both ways, GQA, lse, B 2, the multi-tile
        # path (GRID 3); widths without an instance (Sk mod 176 = 175, 64), causal calls
        # (declined: the default runs) and fp16 still right
        for d, sq, sk, hq, hkv, grid, extra in (
                (128, 300, 40, 4, 2, 0, wide), (128, 300, 177, 4, 2, 0, wide),
                (128, 1000, 360, 4, 1, 0, wide),
                (128, 200, 2128, 4, 2, 0, wide), (128, 1000, 1089, 4, 4, 3, wide),
                (128, 500, 2159, 2, 1, 0, wide), (128, 2160, 2160, 2, 1, 3, wide),
                (128, 300, 2287, 4, 2, 0, wide), (128, 300, 2176, 4, 2, 0, wide),
                (256, 300, 1041, 4, 2, 0, {}), (256, 1000, 1056, 2, 2, 3, {}),
                (256, 700, 289, 4, 1, 0, {}), (256, 150, 1024, 4, 2, 0, {})):
            env = {**NARROW, **extra}
            if grid:
                env["OT_ATTN_SM90_GRID"] = str(grid)
            ba.check_case(S, ck, 2, sq, sk, hq, hkv, d, env=env)
        ba.check_case(S, ck, 2, 700, 2159, 4, 2, 128, wr=0, env={**NARROW, **wide})
    if ONLY is None or "resc" in ONLY:
        # the rescale threshold with the narrow step (experiment builds: R | narrow at D128
        # 176-key, 48 keys): a last tile of 1 / 47 / 48 keys, GQA, the multi-tile path, scale 1
        # (row maxima that grow by more than 2^8)
        for sq, sk, hq, hkv, grid, scale in ((300, 2113, 4, 2, 0, None), (500, 2159, 2, 1, 3, None),
                                             (2160, 2160, 2, 1, 0, 1.0)):
            env = {**NARROW, **RESC, **wide}   # the 176-key tile: =wide since 2026-12-03
            if grid:
                env["OT_ATTN_SM90_GRID"] = str(grid)
            ba.check_case(S, ck, 2, sq, sk, hq, hkv, 128, scale=scale, env=env)
        ba.check_case(S, ck, 2, 300, 2159, 4, 2, 128, dtype=torch.float16, env={**NARROW, **wide})
    if ONLY is None or "split" in ONLY:
        # kFlSplit: the last round's tiles in pieces (GRID n: n_tiles % n tail tiles), every
        # head dim and tile, partial last key tile, GQA, lse; fp16 (not compiled: default)
        for d, sq, sk, hq, hkv, grid, extra in (
                (128, 1000, 1000, 4, 2, 3, {}), (128, 1000, 1000, 4, 4, 7, wide),
                (128, 700, 4097, 4, 1, 11, {}), (64, 1000, 1100, 4, 2, 9, {}),
                (64, 2000, 2000, 2, 2, 7, {}), (256, 300, 1030, 4, 2, 7, {}),
                (256, 1000, 1000, 2, 2, 10, {})):
            ba.check_case(S, ck, 2, sq, sk, hq, hkv, d,
                          env={**SPLIT, **extra, "OT_ATTN_SM90_GRID": str(grid)})
        ba.check_case(S, ck, 2, 1000, 1000, 4, 2, 128, dtype=torch.float16,
                      env={**SPLIT, "OT_ATTN_SM90_GRID": "3"})
    for name, checks in (("skip", skip_checks), ("shift", shift_checks), ("diag", diag_checks),
                         ("pin", pin_checks), ("st16", st16_checks), ("nopin", nopin_checks),
                         ("wg3pin", wg3pin_checks), ("stag", stag_checks),
                         ("nostag", nostag_checks)):
        if ONLY is None or name in ONLY:
            checks(S, ck)
    if ONLY is None or "wideresc" in ONLY:
        for sq, sk, hq, hkv, wl in ((1000, 1000, 4, 2, -1), (1300, 1100, 4, 1, -1),
                                    (700, 1000, 8, 2, 200)):
            ba.check_case(S, ck, 2, sq, sk, hq, hkv, 128, wl=wl, wr=0, env=WIDERESC)
    print(f"check: {ck.n - ck.fails}/{ck.n} passed", flush=True)
    return ck.fails == 0


def skip_checks(S, ck):
    """kFlSkip (OT_ATTN_SM90_SKIP=1, experiment builds: bf16 D64 128-key tile with 2 or 3
    consumers, D128 128-key tile, D256): float64 checks, then the same inputs with and without
    the switch, which must agree to the bit (a skipped tile would have left m = -inf, l = 0,
    O = 0: the state the warpgroup starts from). Causal Sq == Sk (S 1, 17, 1000, 1024) and
    Sq != Sk both ways (Sq > Sk: rows and whole warpgroups that see no key), GQA / MQA, a
    causal window, the multi-tile persistent path (GRID), non-causal D64 with 3 consumers (the
    last tile's padding warpgroups), fp16 (not compiled: the default runs)."""
    cases = []
    for d, wg in ((64, {}), (64, WG3), (128, {}), (256, {})):
        for sq, sk, hq, hkv in ((1, 1, 4, 2), (17, 17, 4, 1), (1000, 1000, 4, 2),
                                (1024, 1024, 4, 4), (1000, 1024, 8, 2), (1024, 1000, 4, 2),
                                (17, 300, 4, 1), (700, 130, 4, 2), (333, 1000, 8, 1)):
            cases.append((d, sq, sk, hq, hkv, -1, 0, wg))
        cases.append((d, 1000, 1000, 4, 2, 200, 0, {**wg, "OT_ATTN_SM90_GRID": "5"}))
        cases.append((d, 1300, 1100, 4, 4, -1, 0, {**wg, "OT_ATTN_SM90_GRID": "3"}))
    for sq, sk in ((1000, 1000), (1024, 1024), (17, 17), (300, 1000)):
        cases.append((64, sq, sk, 4, 2, -1, -1, {}))      # 3 consumers: padding warpgroups
    for d, sq, sk, hq, hkv, wl, wr, extra in cases:
        ba.check_case(S, ck, 2, sq, sk, hq, hkv, d, wl=wl, wr=wr, env={**extra, **SKIP})
        _same_as_default(S, ck, 2, sq, sk, hq, hkv, d, wl, wr, extra)
    ba.check_case(S, ck, 2, 1000, 1000, 4, 2, 128, wr=0, dtype=torch.float16, env=SKIP)


def shift_checks(S, ck):
    """kFlShift (OT_ATTN_SM90_ALIGN=end, experiment builds: bf16 D64 on 3 consumers, with and
    without kFlSkip): float64 checks, then bit-equality with the default tiling on the same
    inputs (a row runs the same visible key tiles in the same order either way; tiles it
    cannot see leave its state as it was, as kFlSkip's argument has it). Causal Sq == Sk (S 1,
    17, 191, 193, 1000, 1024, 2100, 4097: first tiles of 1..191 rows), Sq != Sk both ways (Sq >
    Sk: rows that see no key), GQA / MQA, B 2, a causal window 200 / 0, the multi-tile
    persistent path (GRID 3 / 5) and the dynamic schedule (DYN 1), without the skip; a right
    window alone (wl -1, wr 64); non-causal and fp16 (not taken / not compiled: the
    default)."""
    cases = []
    for sq, sk, hq, hkv in ((1, 1, 4, 2), (17, 17, 4, 1), (191, 191, 4, 2), (193, 193, 4, 4),
                            (1000, 1000, 4, 2), (1024, 1024, 8, 2), (2100, 2100, 4, 1),
                            (4097, 4097, 2, 2), (1000, 1500, 4, 2), (1500, 1000, 4, 2),
                            (333, 1000, 8, 1), (700, 130, 4, 2)):
        cases.append((sq, sk, hq, hkv, -1, 0, WG3))
    cases += [(1000, 1000, 4, 2, 200, 0, {**WG3, "OT_ATTN_SM90_GRID": "5"}),
              (1300, 1100, 4, 4, -1, 0, {**WG3, "OT_ATTN_SM90_GRID": "3"}),
              (2100, 2100, 4, 2, -1, 0, {**WG3, "OT_ATTN_SM90_DYN": "1"}),
              (1000, 1000, 4, 2, -1, 0, {**WG3, **NOSKIP, "OT_ATTN_SM90_GRID": "3"}),
              (1000, 1000, 4, 2, -1, 64, WG3), (1000, 1000, 4, 2, -1, -1, WG3)]
    for sq, sk, hq, hkv, wl, wr, extra in cases:
        ba.check_case(S, ck, 2, sq, sk, hq, hkv, 64, wl=wl, wr=wr, env={**extra, **SHIFT})
        # with a left window the tile's first key tile moves with its first row: O is still
        # the default's to the bit, lse may differ in its last bit (2026-12-02: 4.77e-07 at
        # window 200 / 0, lse ~ 5); without one both are bit-equal
        _same_as_default(S, ck, 2, sq, sk, hq, hkv, 64, wl, wr, extra, var=SHIFT, name="shift",
                         lse_ulps=2 if wl >= 0 else 0)
    ba.check_case(S, ck, 2, 1000, 1000, 4, 2, 64, wr=0, dtype=torch.float16,
                  env={**WG3, **SHIFT})


def diag_checks(S, ck):
    """kFlDiag (OT_ATTN_SM90_DIAG=1, experiment builds: bf16 D64 / D128 on the 2-consumer
    128-key tile): float64 checks, and the largest difference from the plain kernel
    (OT_ATTN_SM90_DIAG=0) on the same inputs (reported, not required to be 0: the narrow
    step's P V runs over 64 keys instead of 128 with zeros). Causal Sq == Sk (S 1, 17, 64,
    65, 100, 1000, 1024, 4097: the first warpgroup narrow, the second not; S <= 64 and 65:
    one key tile), Sq != Sk both ways
    (1000 / 1024: both narrow, 1024 / 1000, 700 / 1000, 17 / 300, 333 / 1000, Sq > Sk 700 /
    130, 1300 / 1100: rows with no key), GQA / MQA, B 2, a causal window 200 / 0 and the
    multi-tile persistent path (GRID 3 / 5), non-causal with Sk <= 2048 at D128 (the 128-key
    tile: Sk 1050, last tile 26 keys, both narrow; 1000, 104 keys, neither; 40), fp16 (not
    compiled: the default)."""
    cases = []
    for d in (64, 128):
        for sq, sk, hq, hkv in ((1, 1, 4, 2), (17, 17, 4, 1), (64, 64, 4, 2), (65, 65, 4, 2),
                                (100, 100, 2, 1), (1000, 1000, 4, 2), (1024, 1024, 4, 4),
                                (1000, 1024, 8, 2), (1024, 1000, 4, 2), (700, 1000, 4, 2),
                                (17, 300, 4, 1), (700, 130, 4, 2), (333, 1000, 8, 1)):
            cases.append((d, sq, sk, hq, hkv, -1, 0, {}))
        cases.append((d, 1000, 1000, 4, 2, 200, 0, {"OT_ATTN_SM90_GRID": "5"}))
        cases.append((d, 1300, 1100, 4, 4, -1, 0, {"OT_ATTN_SM90_GRID": "3"}))
        cases.append((d, 1000, 1000, 8, 2, -1, 0, {"OT_ATTN_SM90_GRID": "3"}))
    cases.append((128, 4097, 4097, 2, 1, -1, 0, {}))
    for sq, sk in ((1050, 1050), (1000, 1000), (300, 40), (900, 1050)):
        cases.append((128, sq, sk, 4, 2, -1, -1, {}))
    for d, sq, sk, hq, hkv, wl, wr, extra in cases:
        ba.check_case(S, ck, 2, sq, sk, hq, hkv, d, wl=wl, wr=wr, env={**extra, **DIAG})
        # against OT_ATTN_SM90_DIAG=0, not the default: that is kFlDiag itself at bf16 D64
        # masked Sq <= 1024 since 5f0f0a1
        _diff_from_default(S, 2, sq, sk, hq, hkv, d, wl, wr, {**extra, **NODIAG}, DIAG)
    ba.check_case(S, ck, 2, 1000, 1000, 4, 2, 128, wr=0, dtype=torch.float16, env=DIAG)


def _pipeline_cases():
    """pin_checks' and st16_checks' D64 / D128 shapes (once kFlXT's): (d, sq, sk, hq, hkv, wl,
    wr, env) -- the persistent multi-tile path (GRID 1 / 3 / 5 / 7), tiles with no visible key
    between live ones, one key tile per query tile, windows, unmasked D64 and D128 (Sk <= 2048)"""
    cases = []
    for d in (64, 128):
        for sq, sk, hq, hkv, wl, wr, grid in (
                (1000, 1000, 4, 2, -1, 0, 3), (1024, 1024, 8, 2, -1, 0, 0),
                (1300, 300, 4, 4, -1, 0, 3), (2000, 700, 4, 1, -1, 0, 5),
                (1000, 1000, 4, 2, 200, 0, 5), (900, 1200, 4, 1, -1, 0, 1),
                (128, 128, 8, 2, -1, 0, 3), (1000, 1100, 4, 2, -1, -1, 3),
                (333, 1000, 8, 1, -1, -1, 0), (700, 2000, 4, 2, -1, -1, 5)):
            env = {"OT_ATTN_SM90_GRID": str(grid)} if grid else {}
            cases.append((d, sq, sk, hq, hkv, wl, wr, env))
    cases.append((64, 4100, 4100, 2, 2, -1, -1, {"OT_ATTN_SM90_GRID": "7"}))
    cases.append((64, 1000, 1000, 4, 2, -1, 0, {"OT_ATTN_SM90_WG": "3", "OT_ATTN_SM90_GRID": "3"}))
    return cases


def pin_checks(S, ck):
    """kFlPin (OT_ATTN_SM90_PIN=1, experiment builds: bf16 D64 128-key tile with 2 consumers, with
    and without kFlDiag, and 3; D128 128-key tile with the threshold, 176-key tile with and without
    the 48-key narrow step; D256 with the threshold): float64 checks and bit-equality with the
    switch off (only the order of the step's instructions changes) on _pipeline_cases' shapes (D64
    causal: 2 consumers, unmasked: 3; D128 causal and Sk <= 2048: the 128-key tile), kFlDiag off,
    unmasked D64 forced onto 2 consumers (OT_ATTN_SM90_WG=2: Sk <= 2048 takes the 128-key tile; S
    1000 / 2000, a last key tile of 104 / 80 keys); D128 unmasked Sk > 2048 on the 176-key tile (Sk
    4096: a 48-key last tile, the narrow step; 4097: 49 keys, 2200: 88, 6528: 16 but Sk > 6400 -- no
    narrow step; GRID 3 / 7, GQA / MQA, Sq != Sk); D256 causal / unmasked / a window (80-key tiles,
    a partial last one, GRID 3); the scale 1 at D128 (row maxima that move by more than 2^8: the
    threshold's rescale under the pin); no lse; fp16 (not compiled: the default runs)."""
    cases = _pipeline_cases() + _nodiag_cases()
    for sq, sk, grid in ((1000, 1000, 3), (2000, 2000, 0), (300, 1000, 5)):
        cases.append((64, sq, sk, 4, 2, -1, -1, {**WG2, "OT_ATTN_SM90_GRID": str(grid)}
                      if grid else WG2))
    for sq, sk, hq, hkv, grid in ((4096, 4096, 2, 1, 0), (1000, 4096, 4, 2, 3),
                                  (700, 4097, 4, 1, 0), (2200, 2200, 4, 4, 7),
                                  (300, 4096, 8, 1, 0), (300, 6528, 4, 2, 0)):
        cases.append((128, sq, sk, hq, hkv, -1, -1,
                      {"OT_ATTN_SM90_GRID": str(grid)} if grid else {}))
    for sq, sk, wl, wr, grid in ((1000, 1000, -1, 0, 3), (1000, 1030, -1, -1, 0),
                                 (700, 1000, 200, 0, 0), (300, 1041, -1, -1, 3)):
        cases.append((256, sq, sk, 4, 2, wl, wr, {"OT_ATTN_SM90_GRID": str(grid)}
                      if grid else {}))
    _bit_equal_checks(S, ck, cases, PIN, "pin")
    for d in (64, 128):
        ba.check_case(S, ck, 2, 1300, 1100, 4, 2, d, wr=0, with_lse=False,
                      env={**PIN, "OT_ATTN_SM90_GRID": "3"})
    for sq, sk, wr in ((2160, 2160, -1), (1000, 4096, -1), (1000, 1000, 0)):
        ba.check_case(S, ck, 2, sq, sk, 4, 2, 128, wr=wr, scale=1.0, env=PIN)
        _same_as_default(S, ck, 2, sq, sk, 4, 2, 128, -1, wr, {}, var=PIN, name="pin", scale=1.0)
    ba.check_case(S, ck, 2, 1000, 4096, 4, 2, 128, dtype=torch.float16, env=PIN)


def st16_checks(S, ck):
    """kFlSt16 (OT_ATTN_SM90_ST16; the default for bf16 D128 128-key, D256 masked and D64
    kFlDiag tiles; experiment builds compile it on every default bf16 tile): float64 checks
    under =1 and bit-equality between =0 and =1 (the same values, only the stores' shape
    changes) -- _pipeline_cases' D64 / D128 shapes (GRID 1 / 3 / 5, rows past Sq, Sq != Sk,
    windows, GQA / MQA: every quad's shuffles run before the row test), D64 causal S <= 1k
    (kFlDiag) and S 2000 (2 consumers without it), D64 unmasked (3 consumers, the pin), D128
    unmasked Sk 4096 (the narrow step and the pin) and 6528 (the pin alone), D256 causal /
    unmasked / a window with partial tiles; no lse; fp16 (not compiled: the default runs)."""
    cases = [c for c in _pipeline_cases() if c[0] in (64, 128)]
    for sq, sk, hq, hkv, grid in ((4096, 4096, 2, 1, 0), (1000, 4096, 4, 2, 3),
                                  (300, 4096, 8, 1, 0), (300, 6528, 4, 2, 0)):
        cases.append((128, sq, sk, hq, hkv, -1, -1,
                      {"OT_ATTN_SM90_GRID": str(grid)} if grid else {}))
    for sq, sk, wr, grid in ((1000, 1000, 0, 3), (700, 1000, 0, 0), (1000, 1000, 0, 0),
                             (2000, 2000, 0, 5), (1000, 1000, -1, 3), (4100, 4100, -1, 0)):
        cases.append((64, sq, sk, 4, 2, -1, wr, {"OT_ATTN_SM90_GRID": str(grid)} if grid else {}))
    for sq, sk, wl, wr, grid in ((1000, 1000, -1, 0, 3), (1000, 1030, -1, -1, 0),
                                 (700, 1000, 200, 0, 0), (300, 1041, -1, -1, 3),
                                 (1024, 1024, -1, 0, 0)):
        cases.append((256, sq, sk, 4, 2, wl, wr, {"OT_ATTN_SM90_GRID": str(grid)}
                      if grid else {}))
    # the base side with the 4-byte stores forced (where kFlSt16 is the default)
    _bit_equal_checks(S, ck, [c[:7] + ({**c[7], **NOST16},) for c in cases], ST16, "st16")
    for d in (64, 128, 256):
        ba.check_case(S, ck, 2, 1300, 1100, 4, 2, d, wr=0, with_lse=False,
                      env={**ST16, "OT_ATTN_SM90_GRID": "3"})
    ba.check_case(S, ck, 2, 1000, 1000, 4, 2, 256, wr=0, dtype=torch.float16, env=ST16)


def _nodiag_cases():
    """D64 causal shapes with kFlDiag off (its default there, S <= 1024: on)"""
    return [(64, sq, sk, 4, 2, -1, 0, {**NODIAG, "OT_ATTN_SM90_GRID": str(grid)})
            for sq, sk, grid in ((1000, 1000, 3), (1300, 1100, 3), (600, 600, 5), (700, 1000, 1))]


def _d64_masked_cases(extra):
    """D64 masked shapes past kFlDiag's 8 query tiles: causal S 1500, GRID 3 Sq 1300 / Sk 1100
    (query tiles without keys), a window (256, 64), Sq < Sk causal; GQA / MQA"""
    return [(64, 1500, 1500, 4, 2, -1, 0, extra),
            (64, 1300, 1100, 4, 2, -1, 0, {**extra, "OT_ATTN_SM90_GRID": "3"}),
            (64, 2000, 2000, 8, 2, 256, 64, extra), (64, 900, 2100, 4, 1, -1, 0, extra)]


def nopin_checks(S, ck):
    """The plain order (OT_ATTN_SM90_PIN=0) where kFlPin is the default since 2026-12-02 (bf16
    D64 masked calls on 2 consumers, no kFlDiag): float64, and bit-equal to the default"""
    _bit_equal_checks(S, ck, _d64_masked_cases({}), NOPIN, "nopin")


def wg3pin_checks(S, ck):
    """kFlPin on 3 consumers for D64 masked calls (OT_ATTN_SM90_WG=3 OT_ATTN_SM90_PIN=1): float64,
    and bit-equal to 3 consumers without it"""
    _bit_equal_checks(S, ck, _d64_masked_cases(WG3), PIN, "wg3pin")


def stag_checks(S, ck):
    """kFlStag (OT_ATTN_SM90_STAG=1; since 2026-12-02 the default of D64's kFlDiag tile, so its
    cases there compare the default with itself; experiment builds: the default bits of D64 on
    2 consumers -- kFlDiag up to 8 query tiles, kFlPin past them -- and on 3 unmasked, D64 causal on 3
    without the skip, D128 on both tiles): float64, and bit-equal to the default (the turn
    moves no arithmetic). Causal Sq = Sk with the diagonal step (S 17, 1000, 1024), Sq != Sk
    both ways, GQA / MQA, a window, the persistent path (GRID 3) and the dynamic schedule (DYN
    1), D64 full on 3 consumers (padding warpgroups in the last tile), D64 causal S 1300 on 3
    without the skip, D128 full S 4097 (176-key tile with the 48-key narrow step) and Sk 1050
    (128-key tile), D128 causal. D64 causal past 8 query tiles runs 3 consumers with kFlSkip,
    and kFlStag is the default there where kFlShift is: the NOSKIP cases run the kernel without
    the skip; kFlStag with the skip against the kernel without it is nostag_checks'."""
    cases = [(64, 17, 17, 4, 1, -1, 0, {}), (64, 1000, 1000, 4, 2, -1, 0, {}),
             (64, 1024, 1024, 8, 2, -1, 0, {}), (64, 700, 1000, 4, 2, -1, 0, {}),
             (64, 1000, 700, 4, 2, -1, 0, {}), (64, 1500, 1500, 4, 2, -1, 0, NOSKIP),
             (64, 2000, 2000, 8, 2, 256, 64, {}),
             (64, 1000, 1000, 4, 2, -1, 0, {"OT_ATTN_SM90_GRID": "3"}),
             (64, 2100, 2100, 4, 2, -1, 0, {**NOSKIP, "OT_ATTN_SM90_DYN": "1"}),
             (64, 1000, 1000, 4, 2, -1, -1, {}), (64, 1300, 1300, 4, 2, -1, 0, NOSKIP),
             (128, 4097, 4097, 2, 1, -1, -1, {}), (128, 1000, 1050, 4, 4, -1, -1, {}),
             (128, 1000, 1000, 4, 2, -1, 0, {"OT_ATTN_SM90_GRID": "3"})]
    _bit_equal_checks(S, ck, cases, STAG, "stag")


def nostag_checks(S, ck):
    """Without kFlStag (OT_ATTN_SM90_STAG=0) where it is the default since 2026-12-02 (bf16 D64
    kFlDiag calls: masked, at most 8 query tiles; D64 causal on 3 consumers with kFlShift):
    float64, and bit-equal to the default. Causal S 17 / 1000 / 1024, Sq != Sk both ways, a
    left window within 8 query tiles, GQA / MQA, the persistent path (GRID 3), the dynamic
    schedule (DYN 1); 3 consumers with kFlSkip and kFlShift at S 1500 / 4500, MQA at S 2000,
    the dynamic schedule at S 2100 and Sq 1300 > Sk 1100 under GRID 3 (query tiles without
    keys: whole tiles skipped); and fp16 (no kFlStag instance: the bit is dropped) against
    float64."""
    cases = [(64, 17, 17, 4, 1, -1, 0, {}), (64, 1000, 1000, 4, 2, -1, 0, {}),
             (64, 1024, 1024, 8, 2, -1, 0, {}), (64, 700, 1000, 4, 2, -1, 0, {}),
             (64, 1000, 700, 4, 2, -1, 0, {}), (64, 1000, 1000, 8, 1, 300, 0, {}),
             (64, 1000, 1000, 4, 2, -1, 0, {"OT_ATTN_SM90_GRID": "3"}),
             (64, 900, 900, 4, 2, -1, 0, {"OT_ATTN_SM90_DYN": "1"}),
             (64, 1500, 1500, 4, 2, -1, 0, {}), (64, 4500, 4500, 2, 1, -1, 0, {}),
             (64, 2000, 2000, 8, 1, -1, 0, {}),
             (64, 2100, 2100, 4, 2, -1, 0, {"OT_ATTN_SM90_DYN": "1"}),
             (64, 1300, 1100, 4, 2, -1, 0, {"OT_ATTN_SM90_GRID": "3"})]
    _bit_equal_checks(S, ck, cases, NOSTAG, "nostag")
    ba.check_case(S, ck, 2, 1000, 1000, 4, 2, 64, wr=0, dtype=torch.float16)


def _bit_equal_checks(S, ck, cases, var, name):
    """float64 checks of each case under the switches var, then the same inputs with and
    without them, which must agree to the bit"""
    for d, sq, sk, hq, hkv, wl, wr, extra in cases:
        ba.check_case(S, ck, 2, sq, sk, hq, hkv, d, wl=wl, wr=wr, env={**extra, **var})
        _same_as_default(S, ck, 2, sq, sk, hq, hkv, d, wl, wr, extra, var=var, name=name)


def _diff_from_default(S, B, sq, sk, hq, hkv, d, wl, wr, extra, var):
    torch.manual_seed(7 + sq + 3 * sk + d)
    q, k, v = ba.make_qkv(B, sq, sk, hq, hkv, d, torch.bfloat16, "bshd")
    res = []
    for env in (extra, {**extra, **var}):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((B, hq, sq), float("nan"), device="cuda")
        with ba.env_set(env):
            ba.sm90_call(S, q, k, v, out, lse, 1 / math.sqrt(d), wl, wr)()
        torch.cuda.synchronize()
        res.append((out, lse))
    (o0, l0), (o1, l1) = res
    # 9: NaN, a value one of them did not write (both -inf, a row with no key, is equal)
    dl = torch.where(l0 == l1, torch.zeros_like(l0), (l0 - l1).abs())
    print(f"  vs default B{B} sq{sq} sk{sk} h{hq}/{hkv} d{d} wl{wl} wr{wr} {extra}: out max diff "
          f"{(o0.float() - o1.float()).abs().nan_to_num(9.0).max().item():.3g}, lse "
          f"{dl.nan_to_num(9.0).max().item():.3g}", flush=True)


def _same_as_default(S, ck, B, sq, sk, hq, hkv, d, wl, wr, extra, dtype=torch.bfloat16, var=None,
                     name="skip", scale=None, lse_ulps=0):
    """The same inputs with and without the variant's switches: outputs equal to the bit, lse
    to the bit too, or (lse_ulps > 0) within that many units in the last place of float32."""
    torch.manual_seed(7 + sq + 3 * sk + d)
    q, k, v = ba.make_qkv(B, sq, sk, hq, hkv, d, dtype, "bshd")
    res = []
    for env in (extra, {**extra, **(SKIP if var is None else var)}):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((B, hq, sq), float("nan"), device="cuda")
        with ba.env_set(env):
            handled = ba.sm90_call(S, q, k, v, out, lse,
                                   1 / math.sqrt(d) if scale is None else scale, wl, wr)()
        torch.cuda.synchronize()
        res.append((handled, out, lse))
    (h0, o0, l0), (h1, o1, l1) = res
    if lse_ulps:
        ulp = torch.finfo(torch.float32).eps * l0.abs().clamp_min(1.0)
        lse_ok = bool(((l0 - l1).abs() <= lse_ulps * ulp).all())
    else:
        lse_ok = torch.equal(l0, l1)
    same = h0 and h1 and torch.equal(o0, o1) and lse_ok
    sc = "" if scale is None else f" scale {scale}"
    ck.report(f"{name} == default B{B} sq{sq} sk{sk} h{hq}/{hkv} d{d} wl{wl} wr{wr} {extra}{sc}",
              same,
              f"handled {h0}/{h1}, out max diff {(o0.float() - o1.float()).abs().max().item():.3g}"
              f", lse max diff {(l0 - l1).abs().nan_to_num(0.0).max().item():.3g}")


def host_cost(S):
    """Host microseconds per call (no synchronisation between calls) at a small shape, against
    a call that the kernel declines at once (head dim 96: the ctypes and shim overhead)."""
    res = {}
    for name, d in (("handled D64 S128", 64), ("declined D96", 96)):
        q, k, v = ba.make_qkv(1, 128, 128, 2, 2, d, torch.bfloat16, "bshd")
        out = torch.empty_like(q)
        f = ba.sm90_call(S, q, k, v, out, None, 0.125)
        for _ in range(50):
            f()
        torch.cuda.synchronize()
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res[name] = round((t1 - t0) / n * 1e6, 2)
        if d == 64:
            res["gpu us per call D64 S128"] = round(ba.time_ms(f, iters=50) * 1e3, 2)
    print("host cost (us per call):", res, flush=True)
    return res


def bench(S, args):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    gemm = ba.gemm_tflops()
    print(f"cuBLAS bf16 GEMM 8192^3: {gemm:.0f} TFLOP/s", flush=True)
    for d in [int(x) for x in args.dims.split(",")]:
        for s in [int(x) for x in args.seqs.split(",")]:
            for causal in {"both": (False, True), "full": (False,), "causal": (True,)}[args.causal]:
                B, H = 32768 // s, 2048 // d
                q, k, v = ba.make_qkv(B, s, s, H, H, d, torch.bfloat16, "bshd")
                out = torch.empty_like(q)
                lse = torch.empty(B, H, s, device="cuda")
                flops = 4 * B * H * s * s * d / (2 if causal else 1)
                case = f"D{d} S{s} {'causal' if causal else 'full'} bf16 B{B} H{H}"
                f = ba.sm90_call(S, q, k, v, out, lse, 1 / math.sqrt(d), -1, 0 if causal else -1)
                if not f():
                    print(f"{case}: not handled")
                    continue
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                sides = [("default", {}, None)] + [(n, e, None) for n, e in variant_list(d, s, causal)]
                for name, be in (("torch SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                                 ("torch SDPA flash", SDPBackend.FLASH_ATTENTION)):
                    if args.no_flash and be == SDPBackend.FLASH_ATTENTION:
                        continue
                    def pf(be=be):
                        with sdpa_kernel([be]):
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    try:
                        pf()
                        sides.append((name, None, pf))
                    except Exception as e:
                        print(f"{case}: {name} failed: {str(e)[:100]}")
                t = {n: [] for n, _, _ in sides}
                f()
                ref_out, ref_lse = out.clone(), lse.clone()
                diffs = {}
                for n, env, pf in sides[1:]:
                    if pf is None:
                        with ba.env_set(env):
                            f()
                        diffs[n] = ((out.float() - ref_out.float()).abs().max().item(),
                                    (lse - ref_lse).abs().max().item())
                del ref_out, ref_lse
                for r in range(args.rounds):
                    for n, env, pf in (sides[i] for i in round_order(len(sides), r)):
                        if pf is not None:
                            ms = ba.time_ms(pf, iters=args.iters, warmup=2)
                        else:
                            with ba.env_set(env):
                                ms = ba.time_ms(f, iters=args.iters, warmup=2)
                        t[n].append(flops / ms / 1e9)
                med = {n: statistics.median(x) for n, x in t.items()}
                peers = {n: round(med[n], 1) for n, e, pf in sides if pf is not None}
                best = max(peers.values()) if peers else None
                row = {"op": "attention_fwd", "case": case, "metric": "TFLOP/s",
                       "ours": round(med["default"], 1), "peers": peers,
                       "ratio_best_peer": round(med["default"] / best, 3) if best else None,
                       "fraction_of_ceiling": round(med["default"] / gemm, 3),
                       "variants": {n: round(med[n], 1) for n, e, pf in sides
                                    if pf is None and n != "default"},
                       "rounds": {n: [round(x, 1) for x in xs] for n, xs in t.items()},
                       "max_abs_diff_vs_default": {n: [float(f"{x:.3g}") for x in v_]
                                                   for n, v_ in diffs.items()}}
                rows.append(row)
                cud = peers.get("torch SDPA cuDNN")
                print(f"{case:34s} default {row['ours']:6.1f}  " +
                      "  ".join(f"{k_.split()[-1]} {v_:6.1f}" for k_, v_ in peers.items()) +
                      (f"  vs cuDNN {row['ours'] / cud:.3f}" if cud else "") +
                      "".join(f" | {n} {v_:.1f} ({v_ / med['default']:.3f})"
                              for n, v_ in row["variants"].items()) +
                      "".join(f" | {n} diff out {a_:.2e} lse {b_:.2e}" for n, (a_, b_) in diffs.items()),
                      flush=True)
                del q, k, v, out, lse
                torch.cuda.empty_cache()
                if args.json:
                    write(args, gemm, rows)
    return gemm, rows


def write(args, gemm, rows, host=None):
    doc = {"bench": "attention_fwd", "device": torch.cuda.get_device_name(),
           "date": datetime.date.today().isoformat(), "commit": args.commit,
           "command": " ".join(sys.argv), "ceilings": {"gemm_bf16_TFLOPs": round(gemm, 1)},
           "rows": rows}
    if host:
        doc["host_cost_us"] = host
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shim")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warm-ms", type=float, default=ba.WARM_MS_DEFAULT,
                    help="wall ms of untimed calls before each entry's timed calls in each round "
                         "(bench_attention.time_ms; 0: none, as before 2026-12-03)")
    ap.add_argument("--dims", default="128,64,256")
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-host", action="store_true")
    ap.add_argument("--only", help="comma list of variant names (default: all)")
    ap.add_argument("--checks", help="comma list of the checks' variant names (default: --only's)")
    ap.add_argument("--causal", choices=("both", "full", "causal"), default="both")
    ap.add_argument("--no-flash", action="store_true", help="no torch SDPA flash side")
    ap.add_argument("--host-only", action="store_true", help="the host cost only (no checks)")
    args = ap.parse_args()
    ba.WARM_MS_DEFAULT = args.warm_ms
    global ONLY, CHECK_ONLY
    ONLY = set(args.only.split(",")) if args.only else None
    CHECK_ONLY = set(args.checks.split(",")) if args.checks else ONLY
    S = ba.Shim(args.shim)
    if args.host_only:
        host_cost(S)
        return 0
    ok = True
    if not args.no_check:
        # a variant that hangs (a wrong barrier phase) must not eat the device time
        timer = threading.Timer(90, lambda: (print("HUNG in checks", flush=True), os._exit(3)))
        timer.start()
        ok = checks(S)
        timer.cancel()
    host = None if args.no_host else host_cost(S)
    gemm, rows = bench(S, args)
    if args.json:
        write(args, gemm, rows, host)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
