"""bench/bench_attention.py's balanced rounds (no GPU needed: time_ms is replaced)."""
import contextlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_attention as ba  # noqa: E402


def _three_entries(order, entered):
    @contextlib.contextmanager
    def ctx():
        entered.append(order[-1] if order else None)
        yield
    return [("ours", lambda: order.append("ours"), None),
            ("cudnn", lambda: order.append("cudnn"), ctx),
            ("flash", lambda: order.append("flash"), None)]


def test_timed_rounds_rotates_the_order_and_enters_each_context_once_per_block(monkeypatch):
    order, entered = [], []

    def fake_time_ms(fn, iters, warmup, warm_ms):
        fn()
        return float(len(order))

    monkeypatch.setattr(ba, "time_ms", fake_time_ms)
    got = ba.timed_rounds(_three_entries(order, entered), rounds=3, iters=7, order="rotate")
    # round r starts at entry r: every entry takes every position once in 3 rounds
    assert order == ["ours", "cudnn", "flash", "cudnn", "flash", "ours",
                     "flash", "ours", "cudnn"]
    assert {k: len(v) for k, v in got.items()} == {"ours": 3, "cudnn": 3, "flash": 3}
    # each entry's per-round figure is its own call's (the fake returns the calls so far)
    assert got["ours"] == [1.0, 6.0, 8.0] and got["cudnn"] == [2.0, 4.0, 9.0]
    assert len(entered) == 3            # cuDNN's context: once per round, around its block


def test_timed_rounds_balanced_order_varies_each_entrys_predecessor(monkeypatch):
    """The default order: over 2n rounds (n = 3, odd) every entry takes every position
    equally often and follows every other entry equally often (the rotation kept ours right
    after flash in every round); warm_ms reaches time_ms."""
    order, entered, warms = [], [], []

    def fake_time_ms(fn, iters, warmup, warm_ms):
        warms.append(warm_ms)
        fn()
        return 1.0

    monkeypatch.setattr(ba, "time_ms", fake_time_ms)
    ba.timed_rounds(_three_entries(order, entered), rounds=6, iters=7, warm_ms=25.0)
    assert warms == [25.0] * 18
    rounds = [order[3 * r:3 * r + 3] for r in range(6)]
    assert all(sorted(r) == ["cudnn", "flash", "ours"] for r in rounds)
    for name in ("ours", "cudnn", "flash"):
        assert sorted(r.index(name) for r in rounds) == [0, 0, 1, 1, 2, 2]
    pred = {}
    for r in rounds:
        for a, b in zip(r, r[1:]):
            pred[(a, b)] = pred.get((a, b), 0) + 1
    assert len(pred) == 6 and set(pred.values()) == {2}   # every ordered pair twice
    import pytest
    with pytest.raises(ValueError, match="order"):
        ba.timed_rounds(_three_entries([], []), rounds=1, iters=1, order="random")


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


def test_timed_rounds_wraps_each_block_in_a_sampler_span(monkeypatch):
    spans = []

    class FakeSampler:
        @contextlib.contextmanager
        def span(self, name):
            spans.append(("begin", name))
            yield
            spans.append(("end", name))

    monkeypatch.setattr(ba, "time_ms", lambda fn, iters, warmup, warm_ms: 1.0)
    entries = [("ours", lambda: None, None), ("cudnn", lambda: None, contextlib.nullcontext)]
    ba.timed_rounds(entries, rounds=2, iters=3, sampler=FakeSampler(), order="rotate")
    assert spans == [("begin", "ours"), ("end", "ours"), ("begin", "cudnn"), ("end", "cudnn"),
                     ("begin", "cudnn"), ("end", "cudnn"), ("begin", "ours"), ("end", "ours")]


def test_gpu_sampler_parses_samples_and_skips_bad_lines():
    import benchutil
    code = "print('1980, 650.5'); print('[N/A], 3'); print('oops'); print('1755, 700')"
    s = benchutil.GpuSampler(cmd=[sys.executable, "-c", code])
    s._thread.join(timeout=60)
    s.close()
    assert [x[1:] for x in s.samples] == [(1980.0, 650.5), (1755.0, 700.0)]


def test_gpu_sampler_summary_attributes_samples_to_their_spans():
    import benchutil
    s = benchutil.GpuSampler(cmd=[sys.executable, "-c", "pass"])
    s._thread.join(timeout=60)
    s.close()
    s.samples = [(1.0, 1000.0, 500.0), (2.0, 1100.0, 600.0), (3.0, 1200.0, 700.0),
                 (5.0, 900.0, 300.0), (8.0, 1.0, 1.0)]
    s.spans = [("a", 0.5, 2.5), ("b", 2.5, 3.5), ("a", 4.5, 5.5), ("c", 6.0, 7.0)]
    # a: the samples at 1, 2 and 5 (both of its spans); c: none, so left out
    assert s.summary() == {"a": {"sm_mhz": 1000.0, "power_w": 466.7, "samples": 3},
                           "b": {"sm_mhz": 1200.0, "power_w": 700.0, "samples": 1}}
    assert s.summary(names={"b"}) == {"b": {"sm_mhz": 1200.0, "power_w": 700.0, "samples": 1}}
    s.reset()
    assert s.summary() == {}


def test_gpu_sampler_without_nvidia_smi_reports_nothing():
    import benchutil
    s = benchutil.GpuSampler(cmd=["/nonexistent/nvidia-smi"])
    with s.span("ours"):
        pass
    s.close()
    assert s.summary() == {}


def test_ab_attention_bwd_args_carry_what_write_json_records(monkeypatch, tmp_path):
    # ab_attention_bwd.py passes its own options to bench_attention.write_json, which reads
    # the timing fields of bench_attention's parser too (a missing one failed the device run
    # of 2026-12-03 21:30 after its first case)
    import json
    import ab_attention_bwd as ab
    out = tmp_path / "ab.json"
    args = ab.parse_args(["--shim", "a=x.so", "--json", str(out), "--rounds", "4"])
    monkeypatch.setattr(ba.torch.cuda, "get_device_name", lambda *a: "test device")
    ba.write_json(args, 700.0, [{"op": "attention_fwd_bwd"}])
    doc = json.loads(out.read_text())
    assert doc["timing"]["order"] == "balanced" and doc["timing"]["rounds"] == 4
    assert doc["timing"]["warm_ms"] == ba.WARM_MS_DEFAULT and doc["rows"]
