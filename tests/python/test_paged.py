"""The paged KV cache from Python: KVCache, kv_append / rope_kv_append and
paged_attention against a float64 reference written here (dense attention over the keys
and values gathered per sequence), copy-on-write after fork, the pages' lifetime, pool
exhaustion and bad arguments."""

import gc
import math

import numpy as np
import pytest
import torch

import ops_transformer as ot
from ops_transformer import _C
from conftest import assert_close

D = 32
THETA = 10000.0
HAS_CUDA = ot.has_cuda() and torch.cuda.is_available()


def kv_bytes():
    """Bytes of KV pools alive (the C memory tracker)."""
    gc.collect()
    return _C.memory_counters()["tags"]["kv_cache"][0]


def poison(t):
    return t.fill_(float("nan"))


def gather(cache, layer, seq):
    """(K, V) of a sequence, [length, heads_kv, D], read through its page table."""
    indptr, indices, last = cache.page_table([seq])
    kp, vp = cache.layer(layer)
    pages = indices[int(indptr[0]):int(indptr[1])].long()
    n = cache.length(seq)

    def one(p):   # [pages, H, bs, D] -> [pages * bs, H, D]
        return p[pages].permute(0, 2, 1, 3).reshape(-1, p.shape[1], p.shape[3])[:n]
    return one(kp), one(vp)


def ref_attention(q, k, v, causal=True):
    """float64 attention of the last q.shape[0] tokens of a sequence over its k, v
    (GQA: query head h reads kv head h // group); returns (out, lse [Hq, n])."""
    n, Hq, _ = q.shape
    L, Hkv, _ = k.shape
    g = Hq // Hkv
    qd = q.double()
    kd = k.double().repeat_interleave(g, dim=1)
    vd = v.double().repeat_interleave(g, dim=1)
    s = torch.einsum("ihd,jhd->hij", qd, kd) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(n)[:, None]
        j = torch.arange(L)[None, :]
        s = s.masked_fill(j > i + L - n, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                      # [Hq, n]
    out = torch.einsum("hij,jhd->ihd", torch.exp(s - lse[..., None]), vd)
    return out, lse


class Shadow:
    """What each sequence's cached K and V must hold, per layer: lists of rows."""

    def __init__(self, layers):
        self.k = [dict() for _ in range(layers)]
        self.v = [dict() for _ in range(layers)]

    def add(self, layer, seq, k, v):
        self.k[layer].setdefault(seq, []).append(k.clone())
        self.v[layer].setdefault(seq, []).append(v.clone())

    def get(self, layer, seq):
        return torch.cat(self.k[layer][seq]), torch.cat(self.v[layer][seq])


def append_step(cache, shadow, ids, counts, dtype, Hq, mode, positions_offset=None):
    """Reserve `counts` new tokens per sequence and append random k, v for each layer
    (mode: "plain" kv_append, "rope" kv_append with RoPE and q, "rope_kv" rope_kv_append);
    checks q_out / k_out bit for bit against ot.rope. Returns the table and cu."""
    cache.reserve(ids, counts)
    table = cache.page_table(ids)
    dev = cache.device
    cu = torch.tensor([0] + list(np.cumsum(counts)), dtype=torch.int32, device=dev)
    T = int(cu[-1])
    Hkv = cache.layer(0)[0].shape[1]
    # positions: default (the index in the sequence) or explicit, offset
    pos = torch.cat([torch.arange(cache.length(s) - c, cache.length(s), device=dev)
                     for s, c in zip(ids, counts)])
    positions = None
    if positions_offset is not None:
        pos = pos + positions_offset
        positions = pos.to(torch.int32)
    for layer in range(cache.num_layers):
        kp, vp = cache.layer(layer)
        k = torch.randn(T, Hkv, D, device=dev).to(dtype)
        v = torch.randn(T, Hkv, D, device=dev).to(dtype)
        k_keep, v_keep = k.clone(), v.clone()
        if mode == "plain":
            assert ot.kv_append(k, v, kp, vp, *table, cu) is None   # (positions need rope)
            k_stored = k
        else:
            q = torch.randn(T, Hq, D, device=dev).to(dtype)
            q_rot_ref = ot.rope(q, None, pos, theta=THETA)
            k_stored = ot.rope(k, None, pos, theta=THETA)
            q_out = poison(torch.empty_like(q))
            if mode == "rope":
                r = ot.kv_append(k, v, kp, vp, *table, cu, positions=positions, rope=True,
                                 q=q, q_out=q_out, theta=THETA)
                assert r is q_out
            else:
                k_out = poison(torch.empty_like(k))
                qo, ko = ot.rope_kv_append(q, k, v, kp, vp, *table, cu, positions=positions,
                                           theta=THETA, q_out=q_out, k_out=k_out)
                assert qo is q_out and ko is k_out
                assert torch.equal(ko, k_stored)
            assert torch.equal(q_out, q_rot_ref)
        assert torch.equal(k, k_keep) and torch.equal(v, v_keep)   # inputs not modified
        for b, s in enumerate(ids):
            lo, hi = int(cu[b]), int(cu[b + 1])
            shadow.add(layer, s, k_stored[lo:hi], v[lo:hi])
    return table, cu


def check_pages(cache, shadow, ids):
    """Every sequence's tokens hold exactly the shadow's rows; every slot no sequence
    holds is still NaN (poisoned before the appends)."""
    used = 0
    for layer in range(cache.num_layers):
        for s in ids:
            k, v = gather(cache, layer, s)
            ks, vs = shadow.get(layer, s)
            assert torch.equal(k, ks), (layer, s)
            assert torch.equal(v, vs), (layer, s)
            used += k.numel()
        kp, vp = cache.layer(layer)
        assert int((~kp.isnan()).sum()) == used and int((~vp.isnan()).sum()) == used
        used = 0


def check_attention(cache, shadow, ids, n_q, dtype, Hq):
    """paged_attention of n_q (<= every length) query tokens per sequence, causal, for
    every layer, against ref_attention over the shadow's K and V."""
    table = cache.page_table(ids)
    dev = cache.device
    cu = torch.arange(len(ids) + 1, dtype=torch.int32, device=dev) * n_q
    for layer in range(cache.num_layers):
        kp, vp = cache.layer(layer)
        q = torch.randn(len(ids) * n_q, Hq, D, device=dev).to(dtype)
        out = poison(torch.empty_like(q))
        o, lse = ot.paged_attention(q, kp, vp, *table, cu, causal=True, out=out,
                                    return_lse=True)
        assert o is out and lse.shape == (Hq, len(ids) * n_q) and lse.dtype == torch.float32
        for b, s in enumerate(ids):
            k, v = shadow.get(layer, s)
            ro, rl = ref_attention(q[b * n_q:(b + 1) * n_q].cpu(), k.cpu(), v.cpu())
            assert_close(o[b * n_q:(b + 1) * n_q].cpu(), ro, dtype, scale=2,
                         msg=f"layer {layer} seq {s} n_q {n_q}")
            torch.testing.assert_close(lse[:, b * n_q:(b + 1) * n_q].double().cpu(), rl,
                                       atol=1e-4, rtol=1e-4)
        # the plain call (allocated output, no lse) gives the same
        assert torch.equal(ot.paged_attention(q, kp, vp, *table, cu, causal=True), o)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA build or device")
def test_page_table_cuda_one_copy():
    """A CUDA table is one pinned, asynchronous copy: the three tensors are views of one
    device buffer at 16-byte-aligned offsets, equal to the CPU table, and a snapshot even
    though reserve rewrites the host table right after the (asynchronous) copy."""
    cache = ot.KVCache(1, 64, 4, 1, 8, torch.float16, device="cuda")
    ids = [cache.add_sequence() for _ in range(5)]
    cache.reserve(ids, [9, 1, 0, 13, 4])
    ref = [t.tolist() for t in cache.page_table(ids, device="cpu")]
    torch.cuda._sleep(50_000_000)       # the copy queues behind ~tens of ms of GPU work
    table = cache.page_table(ids)
    cache.reserve(ids, [7, 7, 7, 7, 7])  # host bookkeeping changes while the copy waits
    assert all(t.device.type == "cuda" and t.dtype == torch.int32 for t in table)
    base = table[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in table)
    assert all(t.data_ptr() % 16 == 0 for t in table)
    assert [t.tolist() for t in table] == ref
    assert [t.numel() for t in table] == [len(r) for r in ref] and len(ref[0]) == 6
    empty = cache.page_table([])
    assert empty[0].tolist() == [0] and empty[1].numel() == 0 and empty[2].numel() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("mode", ["plain", "rope", "rope_kv"])
@pytest.mark.parametrize("device", ["cpu", pytest.param(
    "cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA build or device"))])
def test_append_and_attention(dtype, block_size, group, mode, device):
    Hkv, layers = 2, 2
    Hq = Hkv * group
    lens = [1, 17, int(torch.randint(2, 40, ())), 16, int(torch.randint(2, 40, ()))]
    pages = sum(-(-(n + 3) // block_size) for n in lens) + 3
    cache = ot.KVCache(layers, pages, block_size, Hkv, D, dtype, device=device)
    assert cache.info()["free_pages"] == pages
    assert all(t.device == torch.device(cache.device) for t in cache.page_table([]))
    for layer in range(layers):
        for p in cache.layer(layer):
            assert p.shape == (pages, Hkv, block_size, D) and p.dtype == dtype
            assert p.device == torch.device(cache.device)
            assert p.is_contiguous()
            poison(p)
    ids = [cache.add_sequence() for _ in lens]
    shadow = Shadow(layers)
    # a prefill of each sequence's tokens, then two decode steps (the second with
    # explicit positions far from the default)
    append_step(cache, shadow, ids, lens, dtype, Hq, mode)
    check_pages(cache, shadow, ids)
    check_attention(cache, shadow, ids, 1, dtype, Hq)
    append_step(cache, shadow, ids, [1] * len(ids), dtype, Hq, mode)
    append_step(cache, shadow, ids, [2] * len(ids), dtype, Hq, mode, positions_offset=1000)
    assert [cache.length(s) for s in ids] == [n + 3 for n in lens]
    assert [cache.num_pages(s) for s in ids] == [-(-(n + 3) // block_size) for n in lens]
    check_pages(cache, shadow, ids)
    check_attention(cache, shadow, ids, 1, dtype, Hq)
    check_attention(cache, shadow, ids, 3, dtype, Hq)     # speculative: 3 tokens each
    info = cache.info()
    assert info["num_sequences"] == len(ids) and info["shared_pages"] == 0
    assert info["free_pages"] == pages - sum(cache.num_pages(s) for s in ids)


def test_page_table_layout():
    cache = ot.KVCache(1, 10, 4, 1, 8, torch.float16)
    a, b, c = cache.add_sequence(), cache.add_sequence(), cache.add_sequence()
    cache.reserve([a, b], [9, 4])      # c stays empty
    indptr, indices, last = cache.page_table([a, c, b])
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr.device.type == "cpu"
    assert indptr.tolist() == [0, 3, 3, 4]
    assert last.tolist() == [1, 0, 4]
    assert len(set(indices.tolist())) == 4 and all(0 <= i < 10 for i in indices.tolist())
    # a snapshot: later reserves do not change it
    cache.reserve(c, 2)
    assert indptr.tolist() == [0, 3, 3, 4]
    assert cache.page_table(c)[2].tolist() == [2]
    assert cache.page_table([], device="cpu")[0].tolist() == [0]
    assert "KVCache(layers=1" in repr(cache)


def test_fork_copy_on_write():
    dtype, bs, Hkv, Hq = torch.float32, 4, 2, 4
    cache = ot.KVCache(2, 12, bs, Hkv, D, dtype)
    for layer in range(2):
        for p in cache.layer(layer):
            poison(p)
    shadow = Shadow(2)
    a = cache.add_sequence()
    append_step(cache, shadow, [a], [6], dtype, Hq, "rope")      # last page half full
    b = cache.fork(a)
    assert cache.length(b) == 6
    info = cache.info()
    assert info["shared_pages"] == 2 and info["num_sequences"] == 2
    assert cache.page_table(b)[1].tolist() == cache.page_table(a)[1].tolist()
    before = [gather(cache, layer, a) for layer in range(2)]
    before = [(k.clone(), v.clone()) for k, v in before]
    for layer in range(2):     # b's shadow starts as a's
        shadow.k[layer][b] = list(shadow.k[layer][a])
        shadow.v[layer][b] = list(shadow.v[layer][a])
    # b grows: its shared partial page is copied first; then a grows on its own page
    append_step(cache, shadow, [b], [3], dtype, Hq, "plain")
    ta, tb = cache.page_table(a)[1].tolist(), cache.page_table(b)[1].tolist()
    assert ta[0] == tb[0] and ta[1] != tb[1]      # the full page stays shared
    assert cache.info()["shared_pages"] == 1
    for layer in range(2):
        k, v = gather(cache, layer, a)
        assert torch.equal(k, before[layer][0]) and torch.equal(v, before[layer][1])
    append_step(cache, shadow, [a], [1], dtype, Hq, "plain")
    for s in (a, b):
        for layer in range(2):
            k, v = gather(cache, layer, s)
            ks, vs = shadow.get(layer, s)
            assert torch.equal(k, ks) and torch.equal(v, vs)
    check_attention(cache, shadow, [a, b], 2, dtype, Hq)
    cache.free(a)
    assert cache.info()["shared_pages"] == 0 and cache.info()["num_sequences"] == 1
    with pytest.raises(ot.Error, match="is not a live sequence"):
        cache.length(a)


def test_pages_outlive_cache():
    base = kv_bytes()
    cache = ot.KVCache(2, 4, 2, 1, 8, torch.float32)
    assert kv_bytes() > base
    a = cache.add_sequence()
    cache.reserve(a, 3)
    kp, vp = cache.layer(1)
    k, v = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    ot.kv_append(k, v, kp, vp, *cache.page_table(a), torch.tensor([0, 3], dtype=torch.int32))
    expected = gather(cache, 1, a)
    pages = cache.page_table(a)[1].long()
    arr = np.from_dlpack(kp)           # a NumPy view of the same memory
    del cache
    gc.collect()
    assert kv_bytes() > base           # the views keep the pool alive
    got = kp[pages].permute(0, 2, 1, 3).reshape(-1, 1, 8)[:3]
    assert torch.equal(got, expected[0]) and torch.equal(got, k)
    kp.add_(1.0)                       # still writable memory
    assert np.array_equal(arr[pages.numpy(), 0, :, :].reshape(-1, 8)[:3],
                          (k + 1.0).reshape(3, 8).numpy())
    del kp, vp, arr, got
    gc.collect()
    assert kv_bytes() == base          # the last view gone: the pool is freed


def test_pool_exhaustion():
    cache = ot.KVCache(1, 4, 4, 1, 8, torch.float32)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.reserve([a, b], [8, 3])
    info = cache.info()
    table = [t.tolist() for t in cache.page_table([a, b])]
    with pytest.raises(ot.Error, match=r"needs 2 pages .* but 1 of 4 are free; no sequence "
                                       r"was changed") as e:
        cache.reserve([a, b], [4, 2])
    assert e.value.status == "out of memory"
    assert cache.length(a) == 8 and cache.length(b) == 3
    assert cache.info() == info
    assert [t.tolist() for t in cache.page_table([a, b])] == table
    cache.reserve([b], [5])            # what fits still works: 3 + 5 = 8, one new page
    assert cache.length(b) == 8 and cache.info()["free_pages"] == 0


def test_numpy_cache():
    base = kv_bytes()
    cache = ot.KVCache(1, 8, 4, 2, 8, np.float32)
    kp, vp = cache.layer(0)
    assert isinstance(kp, np.ndarray) and kp.shape == (8, 2, 4, 8) and kp.dtype == np.float32
    kp[:] = np.nan
    vp[:] = np.nan
    ids = [cache.add_sequence(), cache.add_sequence()]
    cache.reserve(ids, [5, 2])
    table = cache.page_table(ids)
    assert all(isinstance(t, np.ndarray) and t.dtype == np.int32 for t in table)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((7, 2, 8), dtype=np.float32)
    v = rng.standard_normal((7, 2, 8), dtype=np.float32)
    cu = np.array([0, 5, 7], dtype=np.int32)
    ot.kv_append(k, v, kp, vp, *table, cu)
    q = rng.standard_normal((2, 4, 8), dtype=np.float32)
    out = ot.paged_attention(q, kp, vp, *table, np.array([0, 1, 2], dtype=np.int32),
                             causal=True)
    assert isinstance(out, np.ndarray)
    for b, (lo, hi) in enumerate([(0, 5), (5, 7)]):
        ro, _ = ref_attention(torch.from_numpy(q[b:b + 1]), torch.from_numpy(k[lo:hi]),
                              torch.from_numpy(v[lo:hi]))
        np.testing.assert_allclose(out[b:b + 1], ro.numpy(), atol=2e-5, rtol=2e-5)
    table[0][0] = 0                    # new, writable arrays
    del cache, kp, vp
    gc.collect()
    assert kv_bytes() == base


def _small():
    cache = ot.KVCache(1, 6, 4, 2, 8, torch.float32)
    ids = [cache.add_sequence(), cache.add_sequence()]
    cache.reserve(ids, [5, 3])
    kp, vp = cache.layer(0)
    poison(kp)
    poison(vp)
    return cache, ids, cache.page_table(ids), kp, vp


def _unchanged(t, snapshot):
    return torch.equal(t.view(torch.int32), snapshot.view(torch.int32))   # NaN bits too


CU = torch.tensor([0, 5, 8], dtype=torch.int32)


@pytest.mark.parametrize("what, call", [
    ("k_new", lambda kp, vp, tab, k, v, q: ot.kv_append(k.half(), v, kp, vp, *tab, CU)),
    ("k_new", lambda kp, vp, tab, k, v, q: ot.kv_append(k[:, :1], v, kp, vp, *tab, CU)),
    ("v_new", lambda kp, vp, tab, k, v, q: ot.kv_append(k, v[..., :4], kp, vp, *tab, CU)),
    ("cu_seqlens_new", lambda kp, vp, tab, k, v, q: ot.kv_append(k, v, kp, vp, *tab,
                                                                 CU.long())),
    ("indptr", lambda kp, vp, tab, k, v, q: ot.kv_append(k, v, kp, vp, tab[0].float(),
                                                         tab[1], tab[2], CU)),
    ("k_out", lambda kp, vp, tab, k, v, q: ot.rope_kv_append(
        q, k, v, kp, vp, *tab, CU, k_out=torch.empty(8, 2, 4))),
    ("q_out", lambda kp, vp, tab, k, v, q: ot.kv_append(
        k, v, kp, vp, *tab, CU, rope=True, q=q, q_out=torch.empty(8, 4, 8).half())),
    ("positions", lambda kp, vp, tab, k, v, q: ot.rope_kv_append(
        q, k, v, kp, vp, *tab, CU, positions=torch.zeros(8))),
])
def test_append_bad_arguments(what, call):
    cache, ids, tab, kp, vp = _small()
    k, v, q = torch.randn(8, 2, 8), torch.randn(8, 2, 8), torch.randn(8, 4, 8)
    snap = [kp.clone(), vp.clone()]
    with pytest.raises(ot.Error, match=what) as e:
        call(kp, vp, tab, k, v, q)
    assert str(e.value).startswith(("ot_kv_append", "ot_rope_kv_append", "ot_rope_forward"))
    assert e.value.status == "invalid argument"
    assert _unchanged(kp, snap[0]) and _unchanged(vp, snap[1])


@pytest.mark.parametrize("what, q, cu", [
    ("q", torch.randn(2, 4, 4), [0, 1, 2]),            # head_dim
    ("q", torch.randn(2, 3, 8), [0, 1, 2]),            # 3 heads over 2 kv heads
    ("q", torch.randn(2, 4, 8).half(), [0, 1, 2]),     # dtype
    ("cu_seqlens_q", torch.randn(2, 4, 8), None),      # int64
])
def test_paged_attention_bad_arguments(what, q, cu):
    cache, ids, tab, kp, vp = _small()
    cu = torch.tensor([0, 1, 2]) if cu is None else torch.tensor(cu, dtype=torch.int32)
    out = poison(torch.empty_like(q))
    lse = poison(torch.empty(q.shape[1], q.shape[0]))
    with pytest.raises(ot.Error, match=f"ot_paged_attention: {what}"):
        ot.paged_attention(q, kp, vp, *tab, cu, out=out)
    assert out.isnan().all() and lse.isnan().all()


def test_cache_bad_arguments():
    with pytest.raises(ot.Error, match="block_size: 300"):
        ot.KVCache(1, 4, 300, 2, 8, torch.float32)
    with pytest.raises(ot.Error, match="dtype"):
        ot.KVCache(1, 4, 4, 2, 8, torch.int32)
    with pytest.raises(ot.Error, match="device"):
        ot.KVCache(1, 4, 4, 2, 8, torch.float32, device="meta")
    cache = ot.KVCache(1, 4, 4, 2, 8, torch.float32)
    a = cache.add_sequence()
    with pytest.raises(ot.Error, match="layer: 1, expected 0 .. 0"):
        cache.layer(1)
    with pytest.raises(ot.Error, match="77 is not a live sequence"):
        cache.page_table([a, 77])
    with pytest.raises(ot.Error, match="num_tokens"):
        cache.reserve([a], [1, 2])
    with pytest.raises(ot.Error, match="77 is not a live sequence"):
        cache.fork(77)
    cache.reserve(a, 2)
    with pytest.raises(ot.Error):
        cache.reserve([a, a], [1, 1])      # ids must be distinct
    assert cache.length(a) == 2


# ---------------------------------------------------------------------------------
# torch.compile: the ops go through torch.ops.ops_transformer while dynamo traces
# ---------------------------------------------------------------------------------

def _decode_setup(fill=float("nan")):
    """A cache of 2 sequences with a prefill appended (eager), one more slot reserved per
    sequence, and a decode step's q, k, v. The same every call (seeded); the pages' other
    slots hold `fill`."""
    gen = torch.Generator().manual_seed(0)
    Hkv, Hq, layers = 2, 4, 2
    cache = ot.KVCache(layers, 8, 4, Hkv, D, torch.float32)
    for layer in range(layers):
        for p in cache.layer(layer):
            p.fill_(fill)
    ids = [cache.add_sequence(), cache.add_sequence()]
    lens = [5, 3]
    cache.reserve(ids, lens)
    table = cache.page_table(ids)
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    for layer in range(layers):
        k, v = (torch.randn(8, Hkv, D, generator=gen) for _ in range(2))
        ot.kv_append(k, v, *cache.layer(layer), *table, cu)
    cache.reserve(ids, 1)
    step = [torch.randn(2, h, D, generator=gen) for h in (Hq, Hkv, Hkv)]
    return cache, ids, step


def decode_step(q, k, v, k_pages, v_pages, indptr, indices, last_page_len, cu, mode):
    if mode == "rope_kv":
        q, k = ot.rope_kv_append(q, k, v, k_pages, v_pages, indptr, indices, last_page_len,
                                 cu, theta=THETA)
    elif mode == "rope_kv_inplace":
        ot.rope_kv_append(q, k, v, k_pages, v_pages, indptr, indices, last_page_len, cu,
                          theta=THETA, inplace=True)
    elif mode == "rope_inplace":     # kv_append rotating q in place (docs/PYTHON.md)
        ot.kv_append(k, v, k_pages, v_pages, indptr, indices, last_page_len, cu, rope=True,
                     q=q, q_out=q, theta=THETA)
    elif mode == "rope":
        q = ot.kv_append(k, v, k_pages, v_pages, indptr, indices, last_page_len, cu,
                         rope=True, q=q, theta=THETA)
    else:
        assert ot.kv_append(k, v, k_pages, v_pages, indptr, indices, last_page_len,
                            cu) is None
    out, lse = ot.paged_attention(q, k_pages, v_pages, indptr, indices, last_page_len, cu,
                                  causal=True, return_lse=True)
    return q, k, out, lse


@pytest.mark.parametrize("mode", ["plain", "rope", "rope_inplace", "rope_kv",
                                  "rope_kv_inplace"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_decode_step_matches_eager(mode, backend):
    torch._dynamo.reset()
    results = []
    for fn in (decode_step, torch.compile(decode_step, fullgraph=True, backend=backend)):
        cache, ids, (q, k, v) = _decode_setup()
        table = cache.page_table(ids)
        cu = torch.tensor([0, 1, 2], dtype=torch.int32)
        r = [fn(q, k, v, *cache.layer(layer), *table, cu, mode) + (q, k)
             for layer in range(cache.num_layers)]
        results.append((r, [p.clone() for layer in range(cache.num_layers)
                            for p in cache.layer(layer)]))
    (eager, eager_pages), (comp, comp_pages) = results
    for a, b in zip(eager, comp):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    for x, y in zip(eager_pages, comp_pages):
        assert _unchanged(x, y)     # the appended slots, and the NaN of the others
    # the step wrote the new slots: every page slot of the batch holds a number
    assert not eager[0][2].isnan().any()


def test_compiled_graph_holds_the_paged_ops():
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    cache, ids, (q, k, v) = _decode_setup()
    table = cache.page_table(ids)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    torch.compile(decode_step, fullgraph=True, backend=backend)(
        q, k, v, *cache.layer(0), *table, cu, "rope_kv")
    targets = " ".join(str(n.target) for n in graphs[0].graph.nodes
                       if n.op == "call_function")
    assert "ops_transformer.rope_kv_append" in targets
    assert "ops_transformer.paged_attention" in targets


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="no torch.library.opcheck")
def test_paged_custom_ops_opcheck():
    ops = torch.ops.ops_transformer
    cache, ids, (q, k, v) = _decode_setup(0.0)    # (opcheck compares the pages: no NaN)
    table = cache.page_table(ids)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    kp, vp = cache.layer(0)
    rope = (0, 0, THETA, 0.0, 0.0, 0.0, 0)
    torch.library.opcheck(ops.kv_append.default,
                          (kp, vp, k, v, *table, cu, None, None, False) + rope)
    torch.library.opcheck(ops.kv_append.default,
                          (kp, vp, k, v, *table, cu, None, q.clone(), True) + rope)
    torch.library.opcheck(ops.rope_kv_append.default,
                          (kp, vp, q.clone(), k.clone(), v, *table, cu,
                           torch.tensor([7, 9], dtype=torch.int32)) + rope)
    for return_lse in (False, True):
        torch.library.opcheck(ops.paged_attention.default,
                              (q, kp, vp, *table, cu, 0.0, 1, -1, -1, 0.0, return_lse))
