"""The reduce step that the CuPy fallback shares with the host (horotopo/gpu/elementwise.py),
run here with NumPy: scale-factor semantics, rounding of float16 and bfloat16, errors."""
import numpy as np
import pytest

from horotopo import gpu
from horotopo.gpu import elementwise as ew

OPS = ["sum", "min", "max", "product"]
NP_OP = {"sum": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}


def _ml_dtypes():
    try:
        import ml_dtypes
    except ImportError:
        pytest.skip("ml_dtypes not installed (bfloat16 on CPU needs it)")
    return ml_dtypes


@pytest.mark.parametrize("op", OPS)
def test_scale_factors_apply_to_dst_then_result(op):
    # Powers of two keep every product exact, so the expected values are exact.
    dst = np.array([1.0, -2.0, 4.0, 0.5])
    src = np.array([3.0, 8.0, -1.0, 0.25])
    exp = 0.25 * NP_OP[op](-2.0 * dst, 4.0 * src)
    out = gpu.host_reduce_into(dst.copy(), src, op, prescale=-2.0, postscale=0.25, src_scale=4.0)
    np.testing.assert_array_equal(out, exp)
    # Without scale factors the step is the plain op.
    np.testing.assert_array_equal(gpu.host_reduce_into(dst.copy(), src, op), NP_OP[op](dst, src))


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_propagate_nan(op):
    dst = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
    src = np.array([0.0, np.nan, 1.0], dtype=np.float32)
    out = gpu.host_reduce_into(dst, src, op)
    assert np.isnan(out[0]) and np.isnan(out[1]) and out[2] == (1.0 if op == "min" else 2.0)


def test_float16_computes_in_float32_and_rounds_once():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4096).astype(np.float16)
    b = rng.standard_normal(4096).astype(np.float16)
    out = gpu.host_reduce_into(a.copy(), b, "sum", prescale=0.1, postscale=3.0)
    f32 = np.float32
    exp = ((a.astype(f32) * f32(0.1) + b.astype(f32)) * f32(3.0)).astype(np.float16)
    np.testing.assert_array_equal(out, exp)
    # Rounding to float16 at every intermediate (what a naive float16 path does) differs.
    naive = ((a * np.float16(0.1) + b) * np.float16(3.0))
    assert (naive != exp).any()


def test_bf16_bits_roundtrip_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    back = ew.float32_to_bf16_bits(np, ew.bf16_bits_to_float32(np, bits))
    f = ew.bf16_bits_to_float32(np, bits)
    finite = ~np.isnan(f)
    np.testing.assert_array_equal(back[finite], bits[finite])
    assert np.isnan(ew.bf16_bits_to_float32(np, back[~finite])).all()


def test_bf16_rounding_matches_ml_dtypes():
    ml = _ml_dtypes()
    rng = np.random.default_rng(1)
    vals = np.concatenate([
        rng.standard_normal(20000).astype(np.float32) * np.float32(1e3),
        rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, 3.3895314e38, -3.3895314e38, 1e-45, np.nan],
                 dtype=np.float32),
        # Exact ties between two bfloat16 values: round half to even.
        (np.uint32(0x3F808000) + (np.arange(64, dtype=np.uint32) << 16)).view(np.float32),
    ])
    ours = ew.float32_to_bf16_bits(np, vals)
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN input
        theirs = vals.astype(ml.bfloat16).view(np.uint16)
    nan = np.isnan(vals)
    np.testing.assert_array_equal(ours[~nan], theirs[~nan])
    assert np.isnan(ew.bf16_bits_to_float32(np, ours[nan])).all()


@pytest.mark.parametrize("op", OPS)
def test_bfloat16_host_reduce_with_ml_dtypes(op):
    ml = _ml_dtypes()
    rng = np.random.default_rng(2)
    a = rng.standard_normal(1000).astype(ml.bfloat16)
    b = rng.standard_normal(1000).astype(ml.bfloat16)
    f32 = np.float32
    exp = (NP_OP[op](a.astype(f32) * f32(0.5), b.astype(f32)) * f32(1.5)).astype(ml.bfloat16)
    out = gpu.host_reduce_into(a.copy(), b, op, prescale=0.5, postscale=1.5)
    assert out.dtype == ml.bfloat16
    np.testing.assert_array_equal(out.view(np.uint16), exp.view(np.uint16))
    # The same bits held as uint16 with dtype="bfloat16" give the same answer.
    bits = a.view(np.uint16).copy()
    gpu.host_reduce_into(bits, b.view(np.uint16), op, 0.5, 1.5, dtype="bfloat16")
    np.testing.assert_array_equal(bits, exp.view(np.uint16))


def test_wire_view_of_bfloat16_is_uint16_sharing_memory():
    ml = _ml_dtypes()
    a = np.arange(8, dtype=np.float32).astype(ml.bfloat16)
    w = gpu.wire_view(a)
    assert w.dtype == np.uint16 and np.shares_memory(w, a)
    memoryview(w)  # MPI can take it; the bfloat16 array itself raises here
    f = np.zeros(3, np.float32)
    assert gpu.wire_view(f) is f
    assert gpu.bfloat16_dtype() == np.dtype(ml.bfloat16)


@pytest.mark.parametrize("op", OPS)
def test_integer_ops_without_scale(op):
    a = np.array([5, -3, 7], dtype=np.int64)
    b = np.array([2, 4, -9], dtype=np.int64)
    np.testing.assert_array_equal(gpu.host_reduce_into(a.copy(), b, op), NP_OP[op](a, b))


def test_scale_array_rounds_like_the_kernel():
    a = np.array([1.0, 3.0, -7.5], dtype=np.float16)
    ew.scale_array(np, a, 0.1)
    exp = (np.array([1.0, 3.0, -7.5], np.float16).astype(np.float32) * np.float32(0.1))
    np.testing.assert_array_equal(a, exp.astype(np.float16))
    with pytest.raises(ValueError, match="floating-point"):
        ew.scale_array(np, np.ones(2, np.int32), 2.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(op="mean"), "unsupported reduction op"),
    (dict(src=np.ones(3, np.float64)), "equal dtypes"),
    (dict(src=np.ones(4, np.float32)), "equal sizes"),
])
def test_bad_input_is_a_clear_error(kwargs, match):
    args = dict(dst=np.ones(3, np.float32), src=np.ones(3, np.float32), op="sum")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gpu.host_reduce_into(**args)


def test_integer_scale_is_rejected():
    with pytest.raises(ValueError, match="floating-point"):
        gpu.host_reduce_into(np.ones(3, np.int32), np.ones(3, np.int32), "sum", postscale=0.5)
