"""horotopo.buffers: splitting, reductions, Horovod scaling, device dispatch."""
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horotopo import buffers as B


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 10 ** 6),
       shares=st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12))
def test_segment_bounds_tile_the_buffer(count, shares):
    total = sum(shares)
    if total == 0:
        shares = [1.0] + shares[1:]
        total = sum(shares)
    shares = [s / total for s in shares]
    segs = B.segment_bounds(count, shares)
    assert len(segs) == len(shares)
    assert segs[0][0] == 0 and segs[-1][1] == count
    for (a, b), (c, _) in zip(segs, segs[1:]):
        assert a <= b == c
    for (a, b), s in zip(segs[:-1], shares[:-1]):
        # every cut is floor(count * cumulative share): off by under one element per cut
        assert abs((b - a) - s * count) <= len(shares) + 1


def test_segment_bounds_rejects_bad_input():
    with pytest.raises(ValueError):
        B.segment_bounds(-1, [1.0])
    with pytest.raises(ValueError):
        B.segment_bounds(3, [])
    with pytest.raises(ValueError):
        B.segment_bounds(3, [0.5, float("nan")])


@given(start=st.integers(0, 1000), length=st.integers(0, 1000), chunk=st.integers(1, 300))
def test_chunk_bounds_cover_exactly(start, length, chunk):
    parts = B.chunk_bounds(start, start + length, chunk)
    covered = [i for a, b in parts for i in range(a, b)]
    assert covered == list(range(start, start + length))
    assert all(0 < b - a <= chunk for a, b in parts)


def test_chunk_bounds_rejects_zero_chunk():
    with pytest.raises(ValueError):
        B.chunk_bounds(0, 5, 0)


@pytest.mark.parametrize("op,fn", [("sum", np.add), ("min", np.minimum), ("max", np.maximum),
                                   ("product", np.multiply)])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
def test_reduce_and_combine(op, fn, dtype):
    rng = np.random.default_rng(1)
    a = rng.integers(-5, 6, 101).astype(dtype)
    b = rng.integers(-5, 6, 101).astype(dtype)
    a_before = a.copy()
    dst = a.copy()
    B.reduce_into(dst, b, op)
    assert np.array_equal(dst, fn(a, b))
    out = np.empty_like(a)
    B.combine_into(out, a, b, op)
    assert np.array_equal(out, fn(a, b))
    assert np.array_equal(a, a_before)  # combine_into leaves its inputs alone
    assert np.array_equal(dst, out)


def test_scale_integers_truncate_like_horovod():
    x = np.array([7, -7, 3, 1], dtype=np.int32)
    out = np.empty_like(x)
    B.scale_into(out, x, 0.5)
    assert out.tolist() == [3, -3, 1, 0]  # float64 product, truncated toward zero
    big = np.array([2 ** 40 + 1], dtype=np.int64)
    B.scale_into(big, big, 1.0 / 3.0)
    assert big[0] == int((2 ** 40 + 1) * (1.0 / 3.0))


def test_scale_floats_in_their_precision():
    x = np.array([1.0, 3.0, 2049.0], dtype=np.float16)
    out = np.empty_like(x)
    B.scale_into(out, x, 0.1)
    assert np.array_equal(out, (x.astype(np.float32) * np.float32(0.1)).astype(np.float16))
    y = np.arange(5, dtype=np.float32)
    B.scale_into(y, y, 0.25)
    assert y.dtype == np.float32 and y.tolist() == [0, 0.25, 0.5, 0.75, 1.0]


def test_flat_view_and_contiguous_flat():
    a = np.arange(12.0).reshape(3, 4)
    v = B.flat_view(a)
    v[0] = 99
    assert a[0, 0] == 99
    with pytest.raises(ValueError, match="C-contiguous"):
        B.flat_view(a.T)
    c = B.contiguous_flat(a.T)
    assert c.flags.c_contiguous and c.tolist() == a.T.reshape(-1).tolist()


def test_scratch_pool_reuses_the_block():
    pool = B.ScratchPool()
    like = np.zeros(1, np.float32)
    a = pool.get(100, like)
    b = pool.get(50, like)
    assert a.size == 100 and b.size == 50 and np.shares_memory(a, b)
    c = pool.get(1000, like)
    assert c.size == 1000 and pool.get(10, np.zeros(1, np.int64)).dtype == np.int64


class _FakeDeviceArray:
    """Stands in for a CuPy array: only its module name matters for dispatch."""

    def __init__(self, name):
        self.name = name


_FakeDeviceArray.__module__ = "cupy._core.core"


def test_device_arrays_dispatch_to_horotopo_gpu(monkeypatch):
    calls = []
    # The buffer layer calls the GPU package's low module (horotopo.gpu.kernels), never the
    # package's upper modules (tests/import_contract.py): that module is the one faked here.
    fake_gpu = types.ModuleType("horotopo.gpu.kernels")
    fake_gpu.reduce_into = lambda dst, src, op: calls.append(("reduce", dst.name, src, op))
    fake_gpu.synchronize = lambda arr: calls.append(("sync", arr.name))
    monkeypatch.setitem(sys.modules, "horotopo.gpu.kernels", fake_gpu)
    import horotopo.gpu

    monkeypatch.setattr(horotopo.gpu, "kernels", fake_gpu, raising=False)
    dev = _FakeDeviceArray("d")
    assert B.is_device_array(dev) and not B.is_device_array(np.zeros(1))
    B.reduce_into(dev, "s", "max")
    B.synchronize(dev)
    B.synchronize(np.zeros(1))  # NumPy: nothing to wait for
    assert calls == [("reduce", "d", "s", "max"), ("sync", "d")]


def test_numpy_paths_never_import_cupy():
    before = "cupy" in sys.modules
    B.reduce_into(np.ones(3), np.ones(3), "sum")
    B.synchronize(np.ones(3))
    assert ("cupy" in sys.modules) == before
