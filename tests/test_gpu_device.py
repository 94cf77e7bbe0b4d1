"""Device reduce steps on a real GPU: native kernels and the CuPy fallback against the host path,
bit for bit. Skipped with "no CUDA device" on CPU-only machines (HOROTOPO_TEST_GPU=1 fails
instead)."""
import numpy as np
import pytest

from horotopo import gpu
from horotopo.gpu import elementwise as ew
from horotopo.gpu import kernels
from gpu_support import require_device

OPS = ["sum", "min", "max", "product"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]


@pytest.fixture
def cp():
    return require_device()


@pytest.fixture(params=["native", "fallback"])
def path(request, monkeypatch):
    monkeypatch.setenv(kernels.KERNELS_ENV, request.param)
    return request.param


def _host_data(dtype, n, seed):
    rng = np.random.default_rng(seed)
    vals = (rng.standard_normal(n) * 4).astype(np.float32)
    if dtype == "bfloat16":
        return ew.float32_to_bf16_bits(np, vals)  # bits in uint16
    return vals.astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,offset", [(1, 0), (7, 0), (4099, 0), (4099, 1), (1 << 20, 3)])
def test_device_step_equals_host_bit_for_bit(cp, path, dtype, op, n, offset):
    name = dtype if dtype != "bfloat16" else None
    bf = "bfloat16" if dtype == "bfloat16" else None
    a = _host_data(dtype, n + offset, 1)
    b = _host_data(dtype, n + offset, 2)
    da, db = cp.asarray(a)[offset:], cp.asarray(b)[offset:]  # offset 1: unaligned, scalar path
    assert gpu.backend(da, dtype=bf) == path, kernels.native_error()
    gpu.reduce_into(da, db, op, prescale=0.3, postscale=1.7, dtype=bf)
    exp = gpu.host_reduce_into(a[offset:].copy(), b[offset:], op, 0.3, 1.7, dtype=bf)
    got = cp.asnumpy(da)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    np.testing.assert_array_equal(got.view(width), exp.view(width), err_msg=f"{name} {op}")


@pytest.mark.parametrize("dtype", FLOATS)
def test_device_scale_equals_host(cp, path, dtype):
    bf = "bfloat16" if dtype == "bfloat16" else None
    a = _host_data(dtype, 1001, 3)
    da = cp.asarray(a)
    gpu.scale(da, 0.1, dtype=bf)
    exp = ew.scale_array(np, a.copy(), 0.1, bf)
    assert cp.asnumpy(da).tobytes() == exp.tobytes()


@pytest.mark.parametrize("op", ["min", "max"])
def test_device_min_max_propagate_nan(cp, path, op):
    a = cp.asarray(np.array([np.nan, 1.0, 2.0], np.float32))
    b = cp.asarray(np.array([0.0, np.nan, 1.0], np.float32))
    got = cp.asnumpy(gpu.reduce_into(a, b, op))
    assert np.isnan(got[0]) and np.isnan(got[1])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["min", "max"])
def test_device_min_max_are_ieee_2019_either_operand_order(cp, path, dtype, op):
    # NaN wins, -0.0 < +0.0 whichever operand holds it; NaN payloads may differ from the
    # host's until the engine makes them canonical, so the comparison is after that
    from horotopo.buffers import canonical_nan_into

    specials = np.array([-0.0, 0.0, -0.0, 0.0, np.nan, 1.0, -np.nan, np.inf, -np.inf, 2.5],
                        np.float32)
    others = np.array([0.0, -0.0, -0.0, 0.0, 1.0, np.nan, 3.0, np.nan, 5.0, -np.inf],
                      np.float32)
    bf = "bfloat16" if dtype == "bfloat16" else None
    for x, y in ((specials, others), (others, specials)):
        a = ew.float32_to_bf16_bits(np, x) if bf else x.astype(dtype)
        b = ew.float32_to_bf16_bits(np, y) if bf else y.astype(dtype)
        da, db = cp.asarray(a), cp.asarray(b)
        gpu.reduce_into(da, db, op, dtype=bf)
        exp = gpu.host_reduce_into(a.copy(), b, op, dtype=bf)
        got = cp.asnumpy(da)
        if bf:
            import ml_dtypes

            got, exp = got.view(ml_dtypes.bfloat16), exp.view(ml_dtypes.bfloat16)
        canonical_nan_into(got)
        canonical_nan_into(exp)
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
        np.testing.assert_array_equal(got.view(width), exp.view(width), err_msg=f"{dtype} {op}")
        zeros = np.signbit(got[:4].astype(np.float32)).tolist()
        assert zeros == ([False, False, True, False] if op == "max" else [True, True, True, False])


def test_integers_take_the_fallback(cp):
    a = cp.arange(10, dtype=cp.int32)
    gpu.reduce_into(a, cp.full(10, 5, dtype=cp.int32), "max")
    assert cp.asnumpy(a).tolist() == [5, 5, 5, 5, 5, 5, 6, 7, 8, 9]
    assert gpu.backend(a) == "fallback"
    with pytest.raises(ValueError, match="floating-point"):
        gpu.reduce_into(a, a, "sum", postscale=0.5)


def test_mismatched_device_arrays_are_refused(cp):
    with pytest.raises(ValueError, match="equal sizes"):
        gpu.reduce_into(cp.zeros(3, cp.float32), cp.zeros(4, cp.float32), "sum")
    with pytest.raises(ValueError, match="equal dtypes"):
        gpu.reduce_into(cp.zeros(3, cp.float32), cp.zeros(3, cp.float64), "sum")


def test_torch_cuda_tensors_bfloat16(cp):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA build here (the CPU wheel): torch tensors not testable")
    a = torch.randn(5000, device="cuda").to(torch.bfloat16)
    b = torch.randn(5000, device="cuda").to(torch.bfloat16)
    exp = gpu.host_reduce_into(a.view(torch.int16).cpu().numpy().view(np.uint16),
                               b.view(torch.int16).cpu().numpy().view(np.uint16), "sum",
                               dtype="bfloat16")
    gpu.reduce_into(a, b, "sum")
    gpu.synchronize(a)
    assert (a.view(torch.int16).cpu().numpy().view(np.uint16) == exp).all()


def test_synchronize_finishes_the_stream(cp):
    a = cp.ones(1 << 24, cp.float32)
    for _ in range(20):
        gpu.reduce_into(a, a, "sum", postscale=0.5)
    gpu.synchronize(a)
    assert cp.cuda.get_current_stream().done


def test_stager_round_trip_with_cupy(cp):
    dev = cp.arange(1 << 18, dtype=cp.float32)
    st = gpu.Stager(dev.nbytes // 4)
    chunks = [dev[k * (1 << 16):(k + 1) * (1 << 16)] for k in range(4)]
    hosts = []
    for c in chunks:
        staged = st.to_host(c)
        hosts.append(st.host(staged).copy())
    np.testing.assert_array_equal(np.concatenate(hosts), cp.asnumpy(dev))
    out = cp.zeros_like(chunks[0])
    staged = st.recv_slot(out)
    staged.view[...] = 7.0
    st.to_device(staged, out)
    st.drain()
    assert float(out.sum()) == 7.0 * out.size
