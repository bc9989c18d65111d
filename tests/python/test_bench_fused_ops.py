"""bench/bench_fused_ops.py's timing helper (no GPU needed: the events and the clock are
replaced)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_fused_ops as bf  # noqa: E402


def fake_event(log):
    """A torch.cuda.Event stand-in whose clock is the number of entries in `log`."""
    class Ev:
        def __init__(self, **kw):
            self.t = 0.0

        def record(self):
            self.t = len(log)

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return float(other.t - self.t)
    return Ev


def test_time_ms_warm_up_runs_the_calls_for_warm_ms_before_timing(monkeypatch):
    class Clock:
        now = 0.0

    calls = []

    def fn():
        calls.append(Clock.now)
        Clock.now += 0.001   # each call 1 ms of wall time

    monkeypatch.setattr(bf.torch.cuda, "Event", fake_event(calls))
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


def test_peer_rounds_retime_ours_and_peers_in_balanced_rounds(monkeypatch):
    # what time_ms recorded in a row: ours and one peer (another peer failed: None)
    ours_calls, peer_calls = ["ours"], ["peer"]
    ours_ms, peer_ms = float("1.5"), float("3.0")
    monkeypatch.setattr(bf, "PEER_ROUNDS", [4])
    monkeypatch.setattr(bf, "_TIMED", [(ours_calls, ours_ms), (peer_calls, peer_ms)])
    order, times = [], {"ours": iter([1.0, 1.2, 1.1, 5.0]), "peer": iter([2.0, 2.2, 2.4, 2.6])}

    def fake_time_ms(fns, record=True):
        assert record is False   # the rounds are not recorded again
        order.append(fns[0])
        return next(times[fns[0]])

    monkeypatch.setattr(bf, "time_ms", fake_time_ms)
    o, peers, single = bf.rounds_retime(ours_ms, {"peer": peer_ms, "broken": None})
    assert order == ["ours", "peer", "peer", "ours", "ours", "peer", "peer", "ours"]   # ABBA
    assert o == 1.15 and peers == {"peer": 2.3, "broken": None}   # the medians of 4 rounds
    assert single == {"ours": 1.5, "peer": 3.0}
    assert bf._TIMED == []   # cleared for the next row
    # one round (the default): nothing timed again, the row's values unchanged
    monkeypatch.setattr(bf, "PEER_ROUNDS", [1])
    bf._TIMED.append((ours_calls, ours_ms))
    assert bf.rounds_retime(ours_ms, {"peer": peer_ms}) == (ours_ms, {"peer": peer_ms}, None)
    # ours not timed by time_ms (e.g. a sum of two timings): nothing timed again
    monkeypatch.setattr(bf, "PEER_ROUNDS", [4])
    bf._TIMED.append((peer_calls, peer_ms))
    assert bf.rounds_retime(2.5, {"peer": peer_ms}) == (2.5, {"peer": peer_ms}, None)


def test_l2_scrub_runs_after_the_warm_up_and_before_the_timed_batches(monkeypatch):
    log = []
    monkeypatch.setattr(bf.torch.cuda, "Event", fake_event(log))
    monkeypatch.setattr(bf.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bf, "SLEEP_CYCLES", 0)
    monkeypatch.setattr(bf, "l2_scrub", lambda: log.append("scrub"))
    bf.time_ms([lambda: log.append("call")], iters=2, inner=3, warmup=2, warm_ms=0.0)
    assert log == ["call"] * 2 + ["scrub"] + ["call"] * 6
