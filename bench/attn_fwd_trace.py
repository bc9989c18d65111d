#!/usr/bin/env python3
"""Where a Hopper forward tile's time goes: the per-CTA, per-tile %globaltimer stamps of a
library built with -DOT_FWD_TRACE (src/cuda/sm90/attention_fwd_sm90.cu, "OT_FWD_TRACE"),
read through the attention shim (bench/attention_shim.c, shim_attn_fwd_trace).

For each shape (B:H:HKV:S:D, bf16, through the public API as bench_attention.py calls it)
and each variant (NAME=VAR:VAL,VAR:VAL; "default" = no change), after --warm calls it
clears the stamps and runs --calls more back to back; the stamps are the last call's.
Per tile of consumer 0 (medians over CTAs, the CTA's first tile left out):
  land   Q and the first K tile landed, from the tile's top (the wait at a tile's start)
  body   the key loop, from there to the last P V's completion
  epi    the epilogue (O / l, the stores issued)
  gap    from the epilogue's end to the next tile's top
  q_lead how long before that top the producer issued the next tile's Q load
and per launch: its span (first top to last epilogue end) and the CTAs' end times (min /
median / max, us from the first top): the last round's spread.

  python3 bench/attn_fwd_trace.py --shim SHIM --shapes 32:8:8:1024:256,8:8:8:4096:256 \\
      [--variants "sp=OT_ATTN_SM90_SPLIT:1"] [--json out.json]
"""
import argparse
import ctypes as C
import json
import os
import statistics as st
import sys

import torch

CTAS, ITEMS = 1024, 64   # kFwdTrCtas, kFwdTrItems


def parse_variants(text):
    out = [("default", {})]
    for part in filter(None, (text or "").split(";")):
        name, _, kv = part.partition("=")
        env = {}
        for item in filter(None, kv.split(",")):
            k, _, v = item.partition(":")
            env[k] = v
        out.append((name, env))
    return out


def med(xs):
    return st.median(xs) if xs else float("nan")


def analyse(buf, key_tiles):
    """buf: [CTAS][ITEMS][4][4] ns (0: not reached)"""
    land, body, epi, gap, lead, ends, tops = [], [], [], [], [], [], []
    for b in range(CTAS):
        tiles = [buf[b][i] for i in range(ITEMS) if buf[b][i][1][0]]
        if not tiles:
            continue
        tops.append(tiles[0][1][0])
        last_end = max(t[1][3] for t in tiles)
        if last_end:
            ends.append(last_end)
        for i, t in enumerate(tiles):
            c0 = t[1]
            if i == 0 or not (c0[1] and c0[2] and c0[3]):
                continue
            land.append(c0[1] - c0[0])
            body.append(c0[2] - c0[1])
            epi.append(c0[3] - c0[2])
            prev = tiles[i - 1][1]
            if prev[3]:
                gap.append(c0[0] - prev[3])
            if t[0][0]:
                lead.append(c0[0] - t[0][0])
    if not tops:
        return None
    t0 = min(tops)
    ends_us = sorted((e - t0) / 1e3 for e in ends)
    r = {
        "ctas": len(tops),
        "span_us": round(ends_us[-1], 2) if ends_us else None,
        "cta_end_us": [round(ends_us[0], 2), round(med(ends_us), 2), round(ends_us[-1], 2)]
        if ends_us else None,
        "tile_us": {k: round(med(v) / 1e3, 3) for k, v in
                    (("land", land), ("body", body), ("epi", epi), ("gap", gap),
                     ("q_lead", lead))},
        "tiles_timed": len(body),
    }
    if key_tiles and body:
        per = med(body) / 1e3 / key_tiles
        r["key_tile_us"] = round(per, 3)
        over = (med(land) + med(epi) + (med(gap) if gap else 0)) / 1e3
        r["tile_overhead_in_key_tiles"] = round(over / per, 2)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--shapes", default="32:8:8:1024:256,8:8:8:4096:256")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--variants", default="")
    ap.add_argument("--warm", type=int, default=30)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--bc", type=int, default=0,
                    help="key-tile width, for the per-key-tile figures (0: 80 at D256, "
                         "128 otherwise)")
    ap.add_argument("--json")
    args = ap.parse_args()

    L = C.CDLL(args.shim)
    L.shim_init.argtypes = [C.c_int]
    L.shim_last_error.restype = C.c_char_p
    i64, vp = C.c_int64, C.c_void_p
    L.shim_attn_fwd.argtypes = [vp, C.c_int, i64, i64, i64, i64, i64, i64, C.c_int, vp, vp,
                                vp, vp, vp]
    L.shim_attn_fwd_trace.argtypes = [vp, C.c_int]
    if L.shim_init(torch.cuda.current_device()) != 0:
        sys.exit("shim_init: " + L.shim_last_error().decode())
    if L.shim_attn_fwd_trace(None, 1) != 0:
        sys.exit("no trace: build the library with -DCMAKE_CUDA_FLAGS=-DOT_FWD_TRACE")
    raw = (C.c_ulonglong * (CTAS * ITEMS * 16))()
    rows = []
    for shape in args.shapes.split(","):
        B, H, HKV, S, D = (int(x) for x in shape.split(":"))
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, S, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, S, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
        bc = args.bc or (80 if D == 256 else 128)
        for name, env in parse_variants(args.variants):
            saved = {k_: os.environ.get(k_) for k_ in env}
            os.environ.update(env)
            s = torch.cuda.current_stream().cuda_stream

            def call():
                rc = L.shim_attn_fwd(s, 3, B, H, HKV, D, S, S, int(args.causal), q.data_ptr(),
                                     k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr())
                if rc != 0:
                    sys.exit(f"{shape} {name}: {L.shim_last_error().decode()}")
            for _ in range(args.warm):
                call()
            L.shim_attn_fwd_trace(None, 1)     # synchronizes, then clears
            for _ in range(args.calls):
                call()
            if L.shim_attn_fwd_trace(raw, 0) != 0:
                sys.exit("ot_cuda_attn_fwd_trace failed")
            for k_, v_ in saved.items():
                if v_ is None:
                    os.environ.pop(k_, None)
                else:
                    os.environ[k_] = v_
            flat = list(raw)
            buf = [[[flat[((b * ITEMS + i) * 4 + w) * 4:((b * ITEMS + i) * 4 + w) * 4 + 4]
                     for w in range(4)] for i in range(ITEMS)] for b in range(CTAS)]
            r = analyse(buf, (S + bc - 1) // bc)
            if r is None:
                print(f"{shape} {name}: no stamps")
                continue
            r.update({"shape": shape, "variant": name, "causal": args.causal})
            rows.append(r)
            t = r["tile_us"]
            print(f"{shape:>22s} {name:>8s}  span {r['span_us']:8.1f} us  CTA ends "
                  f"{r['cta_end_us']}  land {t['land']:.3f} body {t['body']:.3f} "
                  f"epi {t['epi']:.3f} gap {t['gap']:.3f} q_lead {t['q_lead']:.3f} us; "
                  f"key tile {r.get('key_tile_us')} us, overhead "
                  f"{r.get('tile_overhead_in_key_tiles')} key tiles")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "attn_fwd_trace", "device": torch.cuda.get_device_name(),
                       "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
