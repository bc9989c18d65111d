"""bench/bench_fused_ops.py's timing helper (no GPU needed: the events and the clock are
replaced)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_fused_ops as bf  # noqa: E402


def test_time_ms_warm_up_runs_the_calls_for_warm_ms_before_timing(monkeypatch):
    class Ev:
        def __init__(self, **kw):
            self.t = 0.0

        def record(self):
            self.t = len(calls)

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return float(other.t - self.t)

    class Clock:
        now = 0.0

    calls = []

    def fn():
        calls.append(Clock.now)
        Clock.now += 0.001   # each call 1 ms of wall time

    monkeypatch.setattr(bf.torch.cuda, "Event", Ev)
    monkeypatch.setattr(bf.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bf.time, "perf_counter", lambda: Clock.now)
    monkeypatch.setattr(bf, "SLEEP_CYCLES", 0)
    ms = bf.time_ms([fn], iters=4, inner=5, warmup=3, warm_ms=20.0)
    # 3 warm-up calls, then 20 more (20 ms at 1 ms a call), then 4 x 5 timed calls
    assert len(calls) == 3 + 20 + 20 and ms == 1.0
    calls.clear()
    bf.time_ms([fn], iters=4, inner=5, warmup=3)
    assert len(calls) == 3 + 20   # no warm-up by default
    calls.clear()
    monkeypatch.setattr(bf, "WARM_MS", [20.0])   # bench_fused_ops.py --warm-ms 20
    bf.time_ms([fn], iters=4, inner=5, warmup=3)
    assert len(calls) == 3 + 20 + 20
    calls.clear()
    bf.time_ms([fn], iters=4, inner=5, warmup=3, warm_ms=0.0)   # an explicit 0 wins
    assert len(calls) == 3 + 20
