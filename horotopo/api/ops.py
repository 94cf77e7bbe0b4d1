"""Reduction-op constants and request types, numbered as in Horovod 0.28."""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import numpy as np

from ..ops import ReduceOp

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "OP_NAMES",
           "handle_average_backwards_compatibility", "check_op", "check_adasum",
           "horovod_dtype_name",
           "shape_string"]

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

#: Horovod's constants mapped onto the package's one op vocabulary (:class:`horotopo.ops.
#: ReduceOp`), as plain names. Average maps to its reduction, "sum": the runtime folds 1/size
#: into the postscale factor, as Horovod does, so that averages fuse with other sums of equal
#: scale.
OP_NAMES = {Average: ReduceOp.AVERAGE.reduction.value, Sum: ReduceOp.SUM.value,
            Min: ReduceOp.MIN.value, Max: ReduceOp.MAX.value, Product: ReduceOp.PRODUCT.value}

ADASUM_UNSUPPORTED = ("Adasum is implemented in horotopo for the allreduces of CPU tensors "
                      "only (allreduce, grouped_allreduce, DistributedOptimizer), not yet for "
                      "GPU tensors. Use op=hvd.Average or op=hvd.Sum.")
#: Horovod's own words for the rank counts its CPU Adasum refuses.
ADASUM_POWER_OF_TWO = "Running Adasum with non-power of 2 ranks is not supported yet."


def handle_average_backwards_compatibility(op: Optional[int], average: Optional[bool]) -> int:
    """Resolve Horovod's deprecated ``average`` flag against ``op`` (default Average)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def check_op(op: int, adasum: bool = False) -> int:
    """Validate an op constant; Adasum raises NotImplementedError unless ``adasum`` (the
    allreduce paths, which then call :func:`check_adasum`)."""
    if op == Adasum and not adasum:
        raise NotImplementedError(ADASUM_UNSUPPORTED)
    if op not in OP_NAMES and op != Adasum:
        raise ValueError(f"unknown reduction op {op!r}; use one of hvd.Average, hvd.Sum, "
                         f"hvd.Min, hvd.Max, hvd.Product")
    return int(op)


def check_adasum(op: int, size: int, device: int, dtype_names: Sequence[str]) -> None:
    """Horovod's conditions for an Adasum allreduce, checked at the call (so that every rank
    raises at once): CPU tensors, a power-of-two number of ranks, floating-point data."""
    if op != Adasum:
        return
    if device >= 0:
        raise NotImplementedError(ADASUM_UNSUPPORTED)
    if size & (size - 1):
        raise NotImplementedError(ADASUM_POWER_OF_TWO)
    for name in dtype_names:
        if name not in ("float16", "float32", "float64"):
            raise ValueError(f"Adasum needs float16, float32 or float64 tensors, got {name}")


_HVD_DTYPES = {"uint8": "HOROVOD_UINT8", "int8": "HOROVOD_INT8", "uint16": "HOROVOD_UINT16",
               "int16": "HOROVOD_INT16", "int32": "HOROVOD_INT32", "int64": "HOROVOD_INT64",
               "float16": "HOROVOD_FLOAT16", "float32": "HOROVOD_FLOAT32",
               "float64": "HOROVOD_FLOAT64", "bool": "HOROVOD_BOOL",
               "bfloat16": "HOROVOD_BFLOAT16"}


def horovod_dtype_name(dtype: str) -> str:
    """Horovod's DataType_Name for a NumPy/torch dtype name (``float32`` -> ``HOROVOD_FLOAT32``)."""
    return _HVD_DTYPES.get(dtype, dtype.upper())


def shape_string(shape) -> str:
    """TensorShape::DebugString: ``[2, 3]``, and ``[]`` for a scalar."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


