"""MemoryTracker over a real workload: a few Llama layers built from the library's ops,
weights and a KV cache in arenas, prefill then token-by-token decode (issue 6).

The trace must add up:
  - library side (C tracker): the weights and the cache are exactly the blocks made in
    the window (sizes rounded to 256 B); with ``config.memory_allocator = "arena"`` (CUDA)
    every op's temporaries come from the context's arena and are all given back;
  - torch side: the activations (torch tensors) show up in torch's caching allocator;
  - device side (CUDA): what cudaMemGetInfo says the window added equals the arenas'
    reservations plus torch's new segments, within UNACCOUNTED_BOUND.
And the workload is right: the last decode step's logits (through the cache) match a
fresh prefill of the whole sequence.

The CPU case runs in CI (host arenas; the device section is absent there); the CUDA case
runs on the device (scripts/device_memory.sh).
"""
import gc
import math

import pytest
import torch

import ops_transformer as ot
from ops_transformer import _C, profiler
from ops_transformer.profiler import Arena, MemoryTracker

# cudaMemGetInfo counts 2 MiB pages; small cudaMalloc's may share a page with earlier
# ones. Beyond the rounding of each reservation made in the window, allow 4 MiB.
PAGE = 2 << 20
UNACCOUNTED_SLACK = 4 << 20


def _round(n):
    return (n + 255) // 256 * 256


class TinyLlama:
    """A Llama decoder stack (RMSNorm, GQA attention with RoPE, SwiGLU MLP) of library
    ops; weights from one arena (tag weights), the KV cache one block of another (tag
    kv_cache), activations torch tensors."""

    def __init__(self, device, dtype, layers, hidden, heads, kv_heads, ffn, vocab, batch,
                 max_len):
        self.dtype, self.heads, self.kv_heads = dtype, heads, kv_heads
        self.head_dim = hidden // heads
        D = self.head_dim
        shapes = {"embed": (vocab, hidden), "norm_f": (hidden,)}
        for i in range(layers):
            shapes.update({f"l{i}.wq": (heads * D, hidden), f"l{i}.wk": (kv_heads * D, hidden),
                           f"l{i}.wv": (kv_heads * D, hidden), f"l{i}.wo": (hidden, heads * D),
                           f"l{i}.gate": (ffn, hidden), f"l{i}.up": (ffn, hidden),
                           f"l{i}.down": (hidden, ffn), f"l{i}.norm1": (hidden,),
                           f"l{i}.norm2": (hidden,)})
        es = torch.empty((), dtype=dtype).element_size()
        self.weight_bytes = sum(_round(math.prod(s) * es) for s in shapes.values())
        self.cache_shape = (layers, 2, batch, max_len, kv_heads, D)
        self.cache_bytes = _round(math.prod(self.cache_shape) * es)
        dev = None if device == "cpu" else torch.device(device).index or 0
        self.weights_arena = Arena(self.weight_bytes, dev)
        self.kv_arena = Arena(self.cache_bytes, dev)
        self.w = {}
        g = torch.Generator().manual_seed(1)
        for name, s in shapes.items():
            t = self.weights_arena.tensor(s, dtype, "weights", "tiny llama: " + name)
            if name.startswith("norm") or ".norm" in name:
                t.copy_(1.0 + 0.1 * torch.randn(s, generator=g))
            else:
                t.copy_(torch.randn(s, generator=g) / math.sqrt(s[-1]))
            self.w[name] = t
        self.cache = self.kv_arena.tensor(self.cache_shape, dtype, "kv_cache", "tiny llama: kv")
        self.layers = layers

    def forward(self, tokens, start):
        """tokens [B, T] at positions start .. start+T-1 (the cache holds 0 .. start-1);
        writes their k / v into the cache; returns the float32 logits [B, T, vocab]."""
        B, T = tokens.shape
        H, Hk, D, w = self.heads, self.kv_heads, self.head_dim, self.w
        x = w["embed"][tokens]  # [B, T, hidden]
        pos = torch.arange(start, start + T, device=tokens.device).expand(B, T)
        for i in range(self.layers):
            h = ot.rms_norm(x, w[f"l{i}.norm1"])
            q = ot.linear(h, w[f"l{i}.wq"]).view(B, T, H, D)
            k = ot.linear(h, w[f"l{i}.wk"]).view(B, T, Hk, D)
            v = ot.linear(h, w[f"l{i}.wv"]).view(B, T, Hk, D)
            q, k = ot.rope(q, k, pos)
            self.cache[i, 0, :, start:start + T] = k
            self.cache[i, 1, :, start:start + T] = v
            o = ot.attention(q, self.cache[i, 0, :, :start + T], self.cache[i, 1, :, :start + T],
                             causal=True)
            x = x + ot.linear(o.reshape(B, T, H * D), w[f"l{i}.wo"])
            h = ot.rms_norm(x, w[f"l{i}.norm2"])
            x = x + ot.linear(ot.swiglu(ot.linear(h, w[f"l{i}.gate"]), ot.linear(h, w[f"l{i}.up"])),
                              w[f"l{i}.down"])
        h = ot.rms_norm(x, w["norm_f"])
        return ot.linear(h, w["embed"]).float()


CONFIGS = {
    # device: (dtype, layers, hidden, heads, kv_heads, ffn, vocab, batch, prompt, decode)
    "cpu": (torch.float32, 2, 128, 4, 2, 352, 256, 2, 24, 4),
    "cuda": (torch.float16, 4, 1024, 16, 4, 2816, 4096, 2, 200, 8),
}


def _run(device, cfg):
    """Prefill + decode + a loss over the prefill logits; returns (model, last decode
    logits, loss, the full token sequence)."""
    dtype, layers, hidden, heads, kv_heads, ffn, vocab, batch, prompt, decode = cfg
    m = TinyLlama(device, dtype, layers, hidden, heads, kv_heads, ffn, vocab, batch,
                  prompt + decode)
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(0, vocab, (batch, prompt + decode), generator=g).to(device)
    with torch.no_grad():
        logits = m.forward(seq[:, :prompt], 0)
        # the prompt's next-token loss: cross_entropy takes a temporary (its row losses)
        loss = ot.cross_entropy(logits[:, :-1].reshape(-1, vocab).to(dtype),
                                seq[:, 1:prompt].reshape(-1))
        for t in range(prompt, prompt + decode):
            last = m.forward(seq[:, t:t + 1], t)
    return m, last[:, -1], loss, seq


def _devices():
    out = ["cpu"]
    if _C.has_cuda() and torch.cuda.is_available():
        out.append("cuda")
    return out


@pytest.mark.parametrize("device", _devices())
def test_llama_trace_adds_up(device):
    cfg = CONFIGS[device]
    vocab = cfg[6]
    with ot.config.override(memory_allocator="arena" if device == "cuda" else "torch",
                            memory_arena_bytes=256 << 20):
        if device == "cuda":
            _run(device, cfg)  # warm-up: kernels loaded, contexts and their arena made
            gc.collect()
            torch.cuda.synchronize()
        tracker = MemoryTracker()
        with tracker.trace():
            m, last, loss, seq = _run(device, cfg)
        r = tracker.report()
        print()
        print(tracker.format_report())

        # the workload is right: the cached decode equals a fresh prefill of everything
        with torch.no_grad():
            full = m.forward(seq, 0)[:, -1]  # rewrites the whole cache from position 0
        tol = 2e-3 if cfg[0] == torch.float32 else 3e-2
        torch.testing.assert_close(last, full, atol=tol, rtol=tol)
        assert torch.isfinite(loss) and abs(loss.item() - math.log(vocab)) < 2.0

        lib = r["library"]
        tags = lib["by_tag"]
        w, kv = tags["weights"], tags["kv_cache"]
        # exactly the blocks made in the window, still live at its end
        assert w["end_bytes"] - w["start_bytes"] == m.weight_bytes
        assert w["allocs"] == len(m.w) and w["frees"] == 0
        assert kv["end_bytes"] - kv["start_bytes"] == m.cache_bytes
        assert kv["allocs"] == 1 and kv["frees"] == 0
        assert lib["by_op"]["tiny llama: embed"]["end_bytes"] == _round(vocab * cfg[2] * (
            4 if cfg[0] == torch.float32 else 2))
        assert lib["peak_bytes"] >= lib["start_bytes"] + m.weight_bytes + m.cache_bytes
        if device == "cpu":
            if not torch.cuda.is_initialized():  # else a CUDA test ran before in this process
                assert r["torch"] is None and r["device"] is None
            return

        # CUDA, arena mode: every op's temporaries came from the context's arena and went
        # back (the cuBLASLt workspace block was taken in the warm-up, before the window)
        ws = tags["workspace"]
        assert ws["end_bytes"] == ws["start_bytes"], ws
        assert ws["allocs"] >= 1 and ws["allocs"] == ws["frees"], ws
        ce = lib["by_op"]["ot_cross_entropy_forward"]
        assert ce["allocs"] >= 1 and ce["end_bytes"] == ce["start_bytes"] == 0
        ctx_arena = profiler.context_arena_stats(torch.device(device).index or 0)
        assert ctx_arena is not None and ctx_arena["in_use"] == 32 << 20, ctx_arena
        # torch held the activations
        t = r["torch"]
        assert t["peak_above_start_bytes"] > 0
        # the device adds up: used delta = the two arenas made in the window + torch's
        # new segments, within the page rounding of the arenas and a small slack
        d = r["device"]
        assert d["arena_reserved_delta_bytes"] == m.weight_bytes + m.cache_bytes
        bound = 2 * PAGE + UNACCOUNTED_SLACK
        assert abs(d["unaccounted_bytes"]) <= bound, d
        del m
        gc.collect()


def test_arena_tensor_views_free_the_block():
    a = Arena(1 << 16)
    t = a.tensor((16, 16), torch.bfloat16, "activations", "arena tensor test")
    t.fill_(2.0)
    v = t[3:]
    assert a.stats()["live_blocks"] == 1 and a.stats()["in_use"] == 512
    del t
    gc.collect()
    assert a.stats()["live_blocks"] == 1 and float(v.sum()) == 2.0 * 13 * 16
    del v
    gc.collect()
    assert a.stats()["live_blocks"] == 0
    with pytest.raises(ValueError, match="dtype"):
        a.tensor((2,), torch.complex64)
    assert a.stats()["live_blocks"] == 0
