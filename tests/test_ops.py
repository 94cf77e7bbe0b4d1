"""horotopo.ops: op names, dtypes, Horovod's scale folding."""
import numpy as np
import pytest

from horotopo import ops


def test_normalize_op_accepts_every_op_case_insensitively():
    for name in ops.OPS:
        assert ops.normalize_op(name.upper()) == name


@pytest.mark.parametrize("bad", ["mean", "", None, 3, "summ"])
def test_normalize_op_rejects_unknown(bad):
    with pytest.raises(ValueError, match="op must be one of"):
        ops.normalize_op(bad)


def test_average_reduces_with_sum_and_folds_size_into_postscale():
    assert ops.reduction_of("average") == "sum"
    assert ops.reduction_of("max") == "max"
    assert ops.effective_scales("average", 2.0, 3.0, 4) == (2.0, 0.75)
    assert ops.effective_scales("sum", 2.0, 3.0, 4) == (2.0, 3.0)


def _have(name):
    """bfloat16 is listed always but needs ml_dtypes (tests/test_bfloat16.py covers it)."""
    return name != "bfloat16" or ops.dtype_code(name) > 0


def test_dtypes():
    for name in filter(_have, ops.ALLREDUCE_DTYPES):
        assert ops.check_dtype(name) == np.dtype(name)
    assert ops.check_dtype("uint8", broadcast=True) == np.uint8
    with pytest.raises(ValueError, match="allreduce supports"):
        ops.check_dtype("uint8")
    with pytest.raises(ValueError, match="broadcast supports"):
        ops.check_dtype("complex64", broadcast=True)


def test_codes_are_distinct_and_positive():
    codes = [ops.dtype_code(d) for d in ops.BROADCAST_DTYPES if _have(d)]
    assert len(set(codes)) == len(codes) and min(codes) > 0
    assert ops.dtype_code("complex128") == 0
    assert len({ops.op_code(o) for o in ops.OPS}) == len(ops.OPS)
