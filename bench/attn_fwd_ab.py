"""Interleaved A/B timing of the Hopper forward's switches (alternating rounds, so that clock
drift hits both sides alike): python3 bench/attn_fwd_ab.py SHIM KEY=VAL[,KEY=VAL] [ROUNDS]"""
import math, os, statistics, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba

S = ba.Shim(sys.argv[1])
env = dict(kv.split("=") for kv in sys.argv[2].split(","))
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
for d, s, causal in ((128, 4096, 0), (128, 4096, 1), (128, 16384, 0), (64, 4096, 1), (256, 4096, 0), (256, 4096, 1)):
    B, H = 32768 // s, 2048 // d
    q, k, v = ba.make_qkv(B, s, s, H, H, d, torch.bfloat16, "bshd")
    out = torch.empty_like(q)
    lse = torch.empty(B, H, s, device="cuda")
    fl = 4 * B * H * s * s * d / (2 if causal else 1)
    f = ba.sm90_call(S, q, k, v, out, lse, 1 / math.sqrt(d), -1, 0 if causal else -1)
    with ba.env_set(env):
        took = f()
    if not (f() and took):   # a declined call returns at once: its "timing" would mean nothing
        sys.exit(f"D{d} S{s}: the Hopper forward did not take the call")
    a, b = [], []
    for r in range(rounds):
        a.append(fl / ba.time_ms(f, iters=10, warmup=2) / 1e9)
        with ba.env_set(env):
            b.append(fl / ba.time_ms(f, iters=10, warmup=2) / 1e9)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"AB D{d} S{s} {'causal' if causal else 'full'}: default {ma:.1f} {sys.argv[2]} {mb:.1f} "
          f"ratio {mb / ma:.3f} (rounds a {' '.join(f'{x:.0f}' for x in a)} | b {' '.join(f'{x:.0f}' for x in b)})", flush=True)
