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


def test_one_op_vocabulary_every_layer_maps_onto():
    from typing import Literal, get_args

    from horotopo.api import ops as api_ops
    from horotopo.gpu import elementwise, env, kernels
    from horotopo.transport import base, p2p

    assert ops.REDUCTIONS == ("sum", "min", "max", "product")
    assert ops.OPS == tuple(o.value for o in ops.ReduceOp)
    assert get_args(ops.Reduction) == ops.REDUCTIONS  # the type spells the same names
    assert base.ReduceOp is ops.Reduction
    assert get_args(base.ControlOp) == (ops.Reduction, Literal["band"])
    assert env.OPS == ops.REDUCTIONS
    assert set(kernels.OP_SUFFIX) == set(elementwise._UFUNC) == set(ops.UFUNCS) \
        == set(ops.REDUCTIONS)
    assert set(p2p._UFUNCS) == set(ops.REDUCTIONS) | {"band"}
    # Horovod's constants land on canonical names; Average on its reduction, sum.
    assert set(api_ops.OP_NAMES.values()) <= set(ops.REDUCTIONS)
    assert api_ops.OP_NAMES[api_ops.Average] == ops.ReduceOp.AVERAGE.reduction == "sum"


def test_reduce_op_members_are_their_names():
    assert ops.ReduceOp.PRODUCT == "product" and {"product": 1}[ops.ReduceOp.PRODUCT] == 1
    assert f"{ops.ReduceOp.MIN}" == str(ops.ReduceOp.MIN) == "min"
    assert ops.normalize_op(ops.ReduceOp.MAX) == "max" and type(ops.normalize_op(
        ops.ReduceOp.MAX)) is str
    assert ops.reduction_of(ops.ReduceOp.AVERAGE) == "sum"
    assert [o for o in ops.ReduceOp if o.reduction is o] == [
        ops.ReduceOp.SUM, ops.ReduceOp.MIN, ops.ReduceOp.MAX, ops.ReduceOp.PRODUCT]
