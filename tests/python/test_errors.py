"""Bad inputs raise ops_transformer.Error carrying the C library's message; nothing
crashes. Also the config's validation and the NumPy / DLPack entry points."""

import numpy as np
import pytest
import torch

import ops_transformer as ot


def test_error_is_runtime_error():
    assert issubclass(ot.Error, RuntimeError)


def test_dtype_mismatch_message():
    with pytest.raises(ot.Error, match=r"ot_rmsnorm_forward: weight: dtype float16") as e:
        ot.rms_norm(torch.randn(2, 8), torch.randn(8).half())
    assert e.value.status == "invalid argument"
    assert ot.last_error() == str(e.value)


@pytest.mark.parametrize("call", [
    lambda: ot.rms_norm(torch.randn(2, 8), torch.randn(9)),
    lambda: ot.layer_norm(torch.randn(2, 8), torch.randn(8), torch.randn(8).bfloat16()),
    lambda: ot.rope(torch.randn(4, 2, 7), None, torch.arange(4)),        # odd head_dim
    lambda: ot.rope(torch.randn(4, 2, 8), None, torch.arange(4).float()),  # float positions
    lambda: ot.swiglu(torch.randn(3, 4), torch.randn(3, 5)),
    lambda: ot.softmax(torch.randn(3, 4).double()),
    lambda: ot.cross_entropy(torch.randn(3, 4), torch.tensor([0, 1, 9])),  # label out of range
    lambda: ot.cross_entropy(torch.randn(3, 4), torch.zeros(3)),           # float labels
    lambda: ot.attention(torch.randn(1, 4, 3, 8), torch.randn(1, 4, 2, 8),
                         torch.randn(1, 4, 2, 8)),                         # 3 % 2 heads
    lambda: ot.attention(torch.randn(6, 2, 8), torch.randn(6, 2, 8), torch.randn(6, 2, 8),
                         cu_seqlens_q=torch.tensor([0, 7], dtype=torch.int32),
                         cu_seqlens_k=torch.tensor([0, 6], dtype=torch.int32)),
    lambda: ot.linear(torch.randn(3, 4), torch.randn(5, 6)),
    lambda: ot.linear(torch.randn(3, 4), torch.randn(6, 5).t()),          # weight not contiguous
    lambda: ot.rms_norm(torch.randn(4, 6)[:, ::2]),                       # last dim strided
    lambda: ot.rms_norm(torch.randn(2, 8), out=torch.empty(2, 9)),
])
def test_bad_inputs_raise_error(call):
    with pytest.raises(ot.Error) as e:
        call()
    assert str(e.value).startswith("ot_")
    assert e.value.status in ("invalid argument", "unsupported")


def test_binding_level_errors():
    with pytest.raises(ot.Error, match="expected a torch.Tensor"):
        ot.rms_norm([1.0, 2.0])
    with pytest.raises(ot.Error, match="device meta is not supported"):
        ot.softmax(torch.empty(2, 3, device="meta"))
    with pytest.raises(ot.Error, match="complex64 is not supported"):
        ot.softmax(torch.zeros(2, 2, dtype=torch.complex64))
    with pytest.raises(ot.Error, match="reduction"):
        ot.cross_entropy(torch.randn(2, 3), torch.tensor([0, 1]), reduction="avg")
    with pytest.raises(ot.Error, match="approximate"):
        ot.geglu(torch.randn(2, 4), approximate="fast")
    with pytest.raises(ot.Error, match="out= is not supported"):
        ot.softmax(torch.randn(2, 3, requires_grad=True), out=torch.empty(2, 3))


def test_error_then_success_and_autograd_error():
    with pytest.raises(ot.Error):
        ot.softmax(torch.randn(3, 4).double())
    assert torch.isfinite(ot.softmax(torch.randn(3, 4))).all()
    with pytest.raises(ot.Error, match="ot_rmsnorm_forward"):
        ot.rms_norm(torch.randn(2, 8, requires_grad=True), torch.randn(9))


def test_cuda_tensors_without_cuda_build():
    if ot.has_cuda() or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device and a CPU-only build")
    with pytest.raises(ot.Error):
        ot.softmax(torch.randn(2, 3, device="cuda"))


def test_numpy_and_dlpack_producers():
    x = np.random.default_rng(1).standard_normal((4, 10)).astype(np.float32)
    y = ot.softmax(x)
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=1e-5,
                               atol=1e-6)

    class Producer:  # any object with __dlpack__ / __dlpack_device__
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    y2 = ot.softmax(Producer(x))
    np.testing.assert_allclose(np.asarray(y2), y, rtol=0, atol=0)
    # the extension's generic DLPack path (not via torch): a NumPy output
    out = np.empty_like(x)
    ot.softmax(x, out=out)
    np.testing.assert_array_equal(out, y)
    with pytest.raises(ot.Error, match="ot_softmax_forward"):
        ot.softmax(x, out=np.empty((4, 11), np.float32))


def test_config():
    c = ot.config
    assert c.as_dict() == {"memory_allocator": "torch", "memory_arena_bytes": 512 << 20,
                           "matmul_precision": "highest", "fused_attention": "auto",
                           "persistent_kv_cache": False}
    c.matmul_precision = "highest"
    with pytest.raises(ValueError, match="expected one of"):
        c.matmul_precision = "fastest"
    with pytest.raises(TypeError):
        c.fused_attention = "yes"
    with pytest.raises(AttributeError, match="no option"):
        c.memory_allocater = "torch"
    # (the effects of the other values: tests/python/test_config.py)
    with pytest.raises(ValueError, match="memory_arena_bytes: 0, expected >= "):
        c.memory_arena_bytes = 0
    with pytest.raises(TypeError, match="expected a bool or 'auto', got str 'always'"):
        c.fused_attention = "always"
    with c.override(fused_attention=True):
        assert c.fused_attention is True
    assert c.fused_attention == "auto"
    assert "matmul_precision" in c.describe()
    assert c.as_dict()["memory_allocator"] == "torch"


def test_threads_share_the_cpu_context():
    # CPU calls release the GIL: several Python threads run ops at once, and an error
    # in one thread does not leak into another (ot_last_error is thread-local).
    import threading

    x = torch.randn(64, 256)
    expected = torch.softmax(x, -1)
    failures = []

    def work(i):
        try:
            for _ in range(50):
                if i % 2:
                    torch.testing.assert_close(ot.softmax(x), expected)
                else:
                    with pytest.raises(ot.Error, match="ot_softmax_forward"):
                        ot.softmax(x.double())
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
