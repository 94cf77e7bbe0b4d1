"""bfloat16 in the engine without mpiexec: dtype checks and codes, the clear error without
ml_dtypes, host reduce and scale bits, the MPI transport's 16-bit wire view and float32
library allreduce, and single-rank engine calls on every algorithm."""
import numpy as np
import pytest
from mpi4py import MPI

from horotopo import buffers, gpu, ops
from horotopo.engine import Engine
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from horotopo.transport import MPITransport
from horotopo.transport.mpi import _wire

REASON = "bfloat16 on the CPU needs ml-dtypes"


@pytest.fixture
def bf16():
    return np.dtype(pytest.importorskip("ml_dtypes", reason=REASON).bfloat16)


def _random_bf16(bf16, n, seed, finite=True):
    """Random bfloat16 bit patterns (NaN excluded when ``finite``: its payload may differ)."""
    raw = np.random.default_rng(seed).integers(0, 1 << 16, n, dtype=np.uint16)
    x = raw.view(bf16)
    if finite:
        x = x[np.isfinite(x.astype(np.float32))]
    return x.copy()


def test_check_dtype_accepts_bfloat16_in_every_spelling(bf16):
    import ml_dtypes

    for spelling in ("bfloat16", " BFloat16", bf16, ml_dtypes.bfloat16):
        assert ops.check_dtype(spelling) == bf16
        assert ops.check_dtype(spelling, broadcast=True) == bf16
    assert "bfloat16" in ops.ALLREDUCE_DTYPES


def test_bfloat16_code_is_distinct_and_leaves_the_others_alone(bf16):
    codes = {name: ops.dtype_code(name) for name in ops.BROADCAST_DTYPES}
    assert ops.dtype_code(bf16) == codes["bfloat16"] > 0
    assert len(set(codes.values())) == len(codes)
    # NumPy's own dtypes keep the codes they had before bfloat16 existed.
    assert [codes[n] for n in ("float16", "float32", "float64", "int32", "int64", "uint8")] \
        == [1, 2, 3, 4, 5, 6]


def test_bfloat16_without_ml_dtypes_says_to_install_it(monkeypatch):
    # Simulate a machine without ml_dtypes: nothing registered yet and the import fails.
    monkeypatch.setattr(ops, "_bf16", None)
    monkeypatch.setattr(ops, "bfloat16_dtype", lambda: None)
    monkeypatch.setattr(ops, "_ALLREDUCE_SET", {d for d in ops._ALLREDUCE_SET
                                                if d.name != "bfloat16"})
    monkeypatch.setattr(ops, "_DTYPE_CODES", {d: c for d, c in ops._DTYPE_CODES.items()
                                              if d.name != "bfloat16"})
    with pytest.raises(ValueError, match="pip install ml-dtypes"):
        ops.check_dtype("bfloat16")
    assert ops.dtype_code("bfloat16") == 0
    assert ops.check_dtype("float32") == np.float32
    try:
        import ml_dtypes
    except ImportError:
        return
    # An engine call raises the same ValueError (agreed with the other ranks, no hang).
    with Engine(MPI.COMM_SELF, _ring1()) as eng:
        with pytest.raises(ValueError, match="ml-dtypes"):
            eng.allreduce(np.ones(4, ml_dtypes.bfloat16))


@pytest.mark.parametrize("op", ["sum", "min", "max", "product"])
def test_host_reduce_steps_match_host_reduce_into(bf16, op):
    a, b = _random_bf16(bf16, 5000, 1), _random_bf16(bf16, 5000, 2)
    n = min(a.size, b.size)
    a, b = a[:n], b[:n]
    want = a.copy()
    with np.errstate(all="ignore"):
        gpu.host_reduce_into(want, b, op)
        got = a.copy()
        buffers.reduce_into(got, b, op)
        out = np.empty_like(a)
        buffers.combine_into(out, a, b, op)
    nan = np.isnan(want.astype(np.float32))  # inf - inf: NaN payloads may differ
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.array_equal(out.view(np.uint16), got.view(np.uint16))


@pytest.mark.parametrize("factor", [0.5, 1.0 / 3, 3.0, 1e-3])
def test_scale_into_rounds_once_from_float32(bf16, factor):
    x = _random_bf16(bf16, 4000, 3)
    out = np.empty_like(x)
    with np.errstate(over="ignore"):
        want = (x.astype(np.float32) * np.float32(factor)).astype(bf16)
        buffers.scale_into(out, x, factor)
        same = x.copy()
        buffers.scale_into(same, same, factor)
    fin = np.isfinite(want.astype(np.float32))
    assert np.array_equal(out.view(np.uint16)[fin], want.view(np.uint16)[fin])
    assert np.array_equal(same.view(np.uint16), out.view(np.uint16))


def test_mpi_transport_moves_bfloat16_as_16_bit_words(bf16):
    x = (np.arange(11) - 5).astype(bf16)
    assert _wire(x).dtype == np.uint16 and np.shares_memory(_wire(x), x)
    f = np.zeros(3, np.float32)
    assert _wire(f) is f
    t = MPITransport(MPI.COMM_SELF)
    try:
        got = np.zeros_like(x)
        reqs = [t.irecv(got, 0, 5), t.isend(x, 0, 5)]
        t.waitall(reqs)
        assert np.array_equal(got.view(np.uint16), x.view(np.uint16))
        out = np.empty_like(x)
        t.allreduce(x, out, "sum")  # float32 inside: MPI has no bfloat16 type
        assert out.dtype == bf16 and np.array_equal(out.view(np.uint16), x.view(np.uint16))
        t.allreduce(out, out, "max")
        assert np.array_equal(out.view(np.uint16), x.view(np.uint16))
    finally:
        t.close()


def _ring1():
    return plan_from_trees(1, [(0, *ring_parents(1, 0), 1.0)], chunk_bytes=64)


@pytest.mark.parametrize("alg", [None, "tree", "ring", "mpi"])
def test_single_rank_engine_scales_bfloat16(bf16, alg):
    x = (np.arange(12) % 5).astype(bf16).reshape(3, 4)
    with Engine(MPI.COMM_SELF, _ring1()) as eng:
        out = eng.allreduce(x, op="average", prescale_factor=3.0, postscale_factor=0.5,
                            algorithm=alg)
        assert out.dtype == bf16 and out.shape == (3, 4) and out is not x
        want = ((x.astype(np.float32) * 3).astype(bf16).astype(np.float32) * 0.5).astype(bf16)
        assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
        y = x.copy().reshape(-1)
        assert eng.allreduce(y, y, op="min", algorithm=alg) is y
        assert np.array_equal(y.view(np.uint16), x.reshape(-1).view(np.uint16))
        assert eng.allreduce(np.zeros(0, bf16), algorithm=alg).size == 0


def test_engine_takes_torch_bfloat16_tensors_through_ml_dtypes(bf16):
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    import horotopo.torch  # noqa: F401 (registers the engine's torch buffer adapter)
    t = torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16)
    with Engine(MPI.COMM_SELF, _ring1()) as eng:
        got = eng.allreduce(t, op="sum", prescale_factor=2.0)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
        assert got.tolist() == [3.0, -4.0, 6.0] and t.tolist() == [1.5, -2.0, 3.0]
        assert eng.allreduce(t, t, op="max") is t
