"""bench/bench_decode.py --ab's records in shared/BENCH.md's shape (no GPU needed)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_decode as bd  # noqa: E402


def test_ab_fields_first_build_is_ours_the_rest_variants():
    tbps = {"default": 3.6, "split": 3.7, "stream": 3.5, "cudnn": 4.0, "flash": 2.5}
    pct = {"default": 0.84, "split": 0.86, "stream": 0.81, "cudnn": 0.93, "flash": 0.58}
    f = bd.ab_bench_fields(["default", "split", "stream"], tbps, pct)
    assert f["op"] == "paged_attention_decode" and f["metric"] == "TB/s"
    assert f["ours"] == 3.6 and f["fraction_of_ceiling"] == 0.84
    assert f["peers"] == {"torch SDPA cuDNN (contiguous)": 4.0,
                          "torch SDPA flash (contiguous)": 2.5}
    assert f["ratio_best_peer"] == round(3.6 / 4.0, 4)
    assert f["variants"] == {"split": 3.7, "stream": 3.5}


def test_ab_fields_without_peers():
    f = bd.ab_bench_fields(["a", "b"], {"a": 1.0, "b": 2.0}, {"a": 0.2, "b": 0.4})
    assert f["peers"] == {} and f["ratio_best_peer"] is None and f["variants"] == {"b": 2.0}


def test_ab_round_balanced_gives_every_entry_every_predecessor():
    entries = ["default", "new", "cudnn", "flash"]
    pairs = {}
    for r in range(len(entries)):
        row = bd.ab_round(entries, r, "balanced")
        assert sorted(row) == sorted(entries)
        for a, b in zip(row, row[1:]):
            pairs[(a, b)] = pairs.get((a, b), 0) + 1
    # 4 rounds x 3 adjacent pairs = 12 = every ordered pair of distinct entries once
    assert len(pairs) == 12 and set(pairs.values()) == {1}


def test_ab_round_legacy_keeps_the_old_order():
    entries = ["a", "b", "cudnn", "flash"]
    assert bd.ab_round(entries, 0, "legacy") == ["a", "b", "cudnn", "flash"]
    assert bd.ab_round(entries, 1, "legacy") == ["b", "a", "cudnn", "flash"]


def test_parse_ab_shapes_page_and_order():
    assert bd.parse_ab_shapes("16x4096") == [(16, 4096, 16, False)]
    assert bd.parse_ab_shapes("16x4096p64, 64x1024p256o,1x8o") == [
        (16, 4096, 64, False), (64, 1024, 256, True), (1, 8, 16, True)]


def test_parse_ab_shapes_rejects_bad_text():
    for bad in ("16x", "16x4096p", "16x4096q", "0x4096", "16x4096p0", "x4096"):
        with pytest.raises(SystemExit) as e:
            bd.parse_ab_shapes(bad)
        assert "--ab-shapes" in str(e.value)
