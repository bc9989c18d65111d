"""config.memory_allocator = "arena" / memory_arena_bytes: the CUDA contexts' temporaries
from an ot_arena per context (CPU: validation and no effect; CUDA: the ops' temporaries
really come from the arena, are given back, and exhaustion is a clear error)."""
import gc

import pytest
import torch

import ops_transformer as ot
from ops_transformer import _C, profiler
from ops_transformer.profiler import MemoryTracker

CUDA = torch.cuda.is_available() and ot.has_cuda()


@pytest.fixture(autouse=True)
def _restore():
    yield
    ot.config.reset()


def test_values_and_validation():
    assert ot.config.memory_allocator == "torch"
    assert ot.config.memory_arena_bytes == 512 << 20
    ot.config.memory_allocator = "arena"
    assert ot.config.memory_allocator == "arena"
    ot.config.memory_arena_bytes = 64 << 20
    assert ot.config.memory_arena_bytes == 64 << 20
    with pytest.raises(ValueError, match="memory_arena_bytes: 1048576, expected >= 67108864"):
        ot.config.memory_arena_bytes = 1 << 20
    for bad in (True, "1G", 1.5e9):
        with pytest.raises(TypeError, match="memory_arena_bytes: expected an int"):
            ot.config.memory_arena_bytes = bad
    assert ot.config.memory_arena_bytes == 64 << 20  # unchanged by the failures
    with pytest.raises(ValueError, match="memory_allocator"):
        ot.config.memory_allocator = "cuda"
    # set() validates everything before changing anything
    with pytest.raises(ValueError):
        ot.config.set(memory_allocator="torch", memory_arena_bytes=0)
    assert ot.config.memory_allocator == "arena"
    assert "memory_arena_bytes = 67108864  (an int >= 67108864)" in ot.config.describe()
    ot.config.reset()
    assert ot.config.memory_allocator == "torch" and ot.config.memory_arena_bytes == 512 << 20


def test_cpu_ops_unaffected():
    x = torch.randn(4, 64)
    w = torch.randn(64)
    ref = ot.rms_norm(x, w)
    with ot.config.override(memory_allocator="arena", memory_arena_bytes=64 << 20):
        torch.testing.assert_close(ot.rms_norm(x, w), ref, atol=0, rtol=0)
    assert ot.config.memory_allocator == "torch"


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_temporaries_from_the_arena():
    dev = torch.cuda.current_device()
    g = torch.Generator(device="cuda").manual_seed(0)
    # ops that need temporaries: cross-entropy (row losses), attention that splits the
    # keys (1 sequence, 2 heads, 4096 keys, head_dim 80: the portable kernel; the Hopper
    # one takes 64 / 96 / 128 / 256 and does not split), a linear
    logits = torch.randn(4096, 64, device="cuda", generator=g)
    labels = torch.randint(0, 64, (4096,), device="cuda", generator=g)
    q = torch.randn(1, 16, 2, 80, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 4080, 2, 80, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 4080, 2, 80, device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16, generator=g)

    def run():
        return ot.cross_entropy(logits, labels), ot.attention(q, k, v), ot.linear(x, w)

    ref = run()
    assert _C.context_arena(dev) is None
    with ot.config.override(memory_allocator="arena", memory_arena_bytes=96 << 20):
        assert _C.context_arena(dev) is None  # made at the context's next use
        tracker = MemoryTracker()
        with tracker.trace():
            got = run()
        s = profiler.context_arena_stats(dev)
        assert s["reserved"] == 96 << 20
        assert s["in_use"] == 32 << 20 and s["live_blocks"] == 1, s  # the cuBLASLt workspace
        assert s["num_allocs"] >= 3, s  # workspace, row losses, split-KV partials
        r = tracker.report()["library"]
        for op in ("ot_cross_entropy_forward", "ot_attention_forward"):
            assert r["by_op"][op]["allocs"] >= 1 and r["by_op"][op]["end_bytes"] == 0, r["by_op"]
        assert r["by_op"]["ot_cross_entropy_forward"]["peak_bytes"] >= 4096 * 4
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
        # exhaustion: row losses of 40 MiB do not fit next to the 32 MiB workspace in 64 MiB
        big = torch.randn(10 << 20, 2, device="cuda", generator=g)
        big_labels = torch.randint(0, 2, (10 << 20,), device="cuda", generator=g)
        ot.config.memory_arena_bytes = 64 << 20
        with pytest.raises(ot.Error, match=r"ot_cross_entropy_forward: the row losses: cannot "
                           r"allocate 41943040 bytes .*the largest free block is 33554432"):
            ot.cross_entropy(big, big_labels)
        assert profiler.context_arena_stats(dev)["num_failed"] == 1
        # the context still works, and a larger arena serves it
        torch.testing.assert_close(ot.cross_entropy(logits, labels), ref[0], atol=0, rtol=0)
        ot.config.memory_arena_bytes = 128 << 20
        torch.testing.assert_close(ot.cross_entropy(big, big_labels),
                                   torch.nn.functional.cross_entropy(big, big_labels),
                                   atol=1e-5, rtol=1e-5)
    assert _C.context_arena(dev) is None  # back to the context's own buffers
    torch.testing.assert_close(run()[2], ref[2], atol=0, rtol=0)
    del big, big_labels
    gc.collect()


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_arena_across_streams():
    """Ops on two torch streams share the context's arena: each op's temporaries are
    taken on its stream (the second stream waits for the first where it reuses them)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    logits = torch.randn(8192, 128, device="cuda", generator=g)
    labels = torch.randint(0, 128, (8192,), device="cuda", generator=g)
    ref = torch.nn.functional.cross_entropy(logits, labels)
    with ot.config.override(memory_allocator="arena", memory_arena_bytes=64 << 20):
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        outs = []
        for i in range(6):
            s = s1 if i % 2 else s2
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs.append(ot.cross_entropy(logits, labels))
        torch.cuda.synchronize()
        for o in outs:
            torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
        st = profiler.context_arena_stats(torch.cuda.current_device())
        assert st["in_use"] == 32 << 20 and st["num_failed"] == 0


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_graph_capture_in_arena_mode():
    """torch.cuda.graph over a library op that takes a temporary: the capture takes it from
    never-used arena memory and keeps it for the graph; replays recompute the op."""
    g = torch.Generator(device="cuda").manual_seed(2)
    logits = torch.randn(4096, 64, device="cuda", generator=g)
    labels = torch.randint(0, 64, (4096,), device="cuda", generator=g)
    dev = torch.cuda.current_device()
    with ot.config.override(memory_allocator="arena", memory_arena_bytes=64 << 20):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ot.cross_entropy(logits, labels)  # warm-up: makes the context's arena
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        before = profiler.context_arena_stats(dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = ot.cross_entropy(logits, labels)
        kept = profiler.context_arena_stats(dev)
        assert kept["in_use"] == before["in_use"] + 4096 * 4, (before, kept)
        for _ in range(2):
            logits.copy_(torch.randn(4096, 64, device="cuda", generator=g))
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, labels),
                                       atol=1e-5, rtol=1e-5)
        # an op outside the graph does not take the graph's block
        other = ot.cross_entropy(logits * 2, labels)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(other, torch.nn.functional.cross_entropy(logits * 2, labels),
                                   atol=1e-5, rtol=1e-5)
        del graph


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_arena_kept_when_the_policy_is_unchanged():
    """Leaving an override of other options stores every option again: the contexts' arenas
    stay attached (a detach would free the blocks a captured graph keeps), as they do when
    an option is set to its current value."""
    g = torch.Generator(device="cuda").manual_seed(3)
    logits = torch.randn(256, 64, device="cuda", generator=g)
    labels = torch.randint(0, 64, (256,), device="cuda", generator=g)
    dev = torch.cuda.current_device()
    with ot.config.override(memory_allocator="arena", memory_arena_bytes=64 << 20):
        ot.cross_entropy(logits, labels)  # makes the context's arena
        arena = _C.context_arena(dev)
        assert arena is not None
        with ot.config.override(matmul_precision="high"):
            pass
        ot.config.memory_arena_bytes = 64 << 20
        assert _C.context_arena(dev) is arena
    assert _C.context_arena(dev) is None
