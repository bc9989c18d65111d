"""ops_transformer.profiler: MemoryTracker windows over the C tracker (CPU arenas)."""
import pytest

from ops_transformer import profiler
from ops_transformer.profiler import Arena, MemoryTracker


def test_window_by_tag_and_op():
    a = Arena(1 << 20)
    keep = a.alloc(1000, "weights", "prof test: embed")  # before the window: 1024 B
    t = MemoryTracker()
    with t.trace():
        x = a.alloc(300, "activations", "prof test: mlp")  # 512 B, freed
        w = a.alloc(5000, "workspace", "prof test: attn")  # 5120 B, freed
        a.free(w)
        y = a.alloc(256, "kv_cache", "prof test: cache")  # 256 B, kept
        a.free(x)
    r = t.report()
    lib = r["library"]
    tags = lib["by_tag"]
    assert tags["activations"]["allocs"] == 1 and tags["activations"]["frees"] == 1
    assert tags["activations"]["peak_bytes"] - tags["activations"]["start_bytes"] == 512
    assert tags["workspace"]["peak_bytes"] - tags["workspace"]["start_bytes"] == 5120
    assert tags["kv_cache"]["end_bytes"] - tags["kv_cache"]["start_bytes"] == 256
    assert tags["weights"]["allocs"] == 0 and tags["weights"]["end_bytes"] >= 1024
    # the total's peak: 512 + 5120 live together, on top of the start
    assert lib["peak_bytes"] - lib["start_bytes"] == 512 + 5120
    assert lib["end_bytes"] - lib["start_bytes"] == 256
    assert lib["allocs"] == 3 and lib["frees"] == 2
    ops = lib["by_op"]
    assert ops["prof test: attn"]["peak_bytes"] == 5120 and ops["prof test: attn"]["end_bytes"] == 0
    assert ops["prof test: mlp"]["allocs"] == 1 and ops["prof test: mlp"]["frees"] == 1
    assert ops["prof test: cache"]["end_bytes"] == 256
    assert ops["prof test: embed"]["allocs"] == 0  # live, listed with its bytes
    assert r["torch"] is None or "peak_allocated_bytes" in r["torch"]
    assert r["combined_peak_upper_bound_bytes"] >= lib["peak_bytes"]
    text = t.format_report()
    for word in ("weights", "kv_cache", "activations", "workspace", "prof test: attn", "peak"):
        assert word in text
    a.free(y)
    a.free(keep)


def test_second_window_resets_peaks():
    a = Arena(1 << 20)
    t = MemoryTracker()
    with t.trace():
        p = a.alloc(65536, "workspace", "prof test: big")
        a.free(p)
    assert t.report()["library"]["by_op"]["prof test: big"]["peak_bytes"] == 65536
    with t.trace():
        p = a.alloc(256, "workspace", "prof test: big")
        a.free(p)
    r = t.report()["library"]
    assert r["by_op"]["prof test: big"]["peak_bytes"] == 256
    assert r["by_tag"]["workspace"]["peak_bytes"] - r["by_tag"]["workspace"]["start_bytes"] == 256


def test_errors():
    t = MemoryTracker()
    with pytest.raises(RuntimeError, match="no finished trace"):
        t.report()
    with t.trace():
        with pytest.raises(RuntimeError, match="must not nest"):
            with t.trace():
                pass
    a = Arena(4096)
    with pytest.raises(ValueError, match="tag"):
        a.alloc(10, "bogus")
    with pytest.raises(RuntimeError, match="largest free block"):
        a.alloc(1 << 20, "other")
    p = a.alloc(10)
    a.free(p)
    with pytest.raises(RuntimeError, match="freed twice"):
        a.free(p)
    s = a.stats()
    assert s["reserved"] == 4096 and s["in_use"] == 0 and s["num_failed"] == 1


def test_counters_shape():
    c = profiler.counters()
    assert set(c["tags"]) == set(profiler.TAGS)
    for v in list(c["tags"].values()) + [c["total"]]:
        assert set(v) == {"current", "peak", "allocs", "frees"}
        assert v["peak"] >= v["current"] >= 0
