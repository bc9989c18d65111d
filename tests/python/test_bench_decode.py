"""bench/bench_decode.py --ab's records in shared/BENCH.md's shape (no GPU needed)."""
import os
import sys

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
