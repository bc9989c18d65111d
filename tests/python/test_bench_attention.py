"""bench/bench_attention.py's balanced rounds (no GPU needed: time_ms is replaced)."""
import contextlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_attention as ba  # noqa: E402


def test_timed_rounds_rotates_the_order_and_enters_each_context_once_per_block(monkeypatch):
    order, entered = [], []

    def fake_time_ms(fn, iters, warmup):
        fn()
        return float(len(order))

    @contextlib.contextmanager
    def ctx():
        entered.append(order[-1] if order else None)
        yield

    monkeypatch.setattr(ba, "time_ms", fake_time_ms)
    entries = [("ours", lambda: order.append("ours"), None),
               ("cudnn", lambda: order.append("cudnn"), ctx),
               ("flash", lambda: order.append("flash"), None)]
    got = ba.timed_rounds(entries, rounds=3, iters=7)
    # round r starts at entry r: every entry takes every position once in 3 rounds
    assert order == ["ours", "cudnn", "flash", "cudnn", "flash", "ours",
                     "flash", "ours", "cudnn"]
    assert {k: len(v) for k, v in got.items()} == {"ours": 3, "cudnn": 3, "flash": 3}
    # each entry's per-round figure is its own call's (the fake returns the calls so far)
    assert got["ours"] == [1.0, 6.0, 8.0] and got["cudnn"] == [2.0, 4.0, 9.0]
    assert len(entered) == 3            # cuDNN's context: once per round, around its block


def test_bench_cases_parses_shapes_and_rejects_bad_ones():
    import argparse
    import pytest
    ns = argparse.Namespace(shapes="1:32:8:2048:128,8:16:16:4096:64", dims="128", seqs="1024")
    assert ba.bench_cases(ns) == [(1, 32, 8, 2048, 128), (8, 16, 16, 4096, 64)]
    # without --shapes: the grid (batch * seq = 32k tokens, heads * D = 2048, no GQA)
    ns = argparse.Namespace(shapes=None, dims="64,128", seqs="1024,4096")
    assert ba.bench_cases(ns) == [(32, 32, 32, 1024, 64), (8, 32, 32, 4096, 64),
                                  (32, 16, 16, 1024, 128), (8, 16, 16, 4096, 128)]
    for bad in ("1:32:8:2048", "1:32:5:2048:128", "0:32:8:2048:128"):
        with pytest.raises(SystemExit, match="--shapes"):
            ba.bench_cases(argparse.Namespace(shapes=bad, dims="128", seqs="1024"))


def test_ab_envs_parses_variants():
    import argparse
    import pytest
    ns = argparse.Namespace(ab="static=OT_ATTN_SM90_DYN:0,_causal_only:1;long=OT_ATTN_SM90_DYN:long")
    assert ba.ab_envs(ns) == [("static", {"OT_ATTN_SM90_DYN": "0", "_causal_only": "1"}),
                              ("long", {"OT_ATTN_SM90_DYN": "long"})]
    assert ba.ab_envs(argparse.Namespace(ab="")) == []
    for bad in ("static", "static=OT_ATTN_SM90_DYN", "=OT_ATTN_SM90_DYN:0"):
        with pytest.raises(SystemExit, match="--ab"):
            ba.ab_envs(argparse.Namespace(ab=bad))
