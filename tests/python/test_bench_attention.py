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
