"""Reduction operations and data types the engine accepts, with Horovod's scaling rules.

Ops are named by strings: ``"sum"``, ``"average"``, ``"min"``, ``"max"``, ``"product"``
(case-insensitive). ``"average"`` reduces with ``"sum"`` and folds ``1 / size`` into the
postscale factor, exactly as Horovod does (``postscale_factor /= size``).

Scaling follows Horovod's ``ScaleBuffer``: floating-point buffers are multiplied in their own
precision (float16 through float32, rounded back once); integer buffers are multiplied in float64
and cast back, which truncates toward zero (so an int32 ``"average"`` of 3 and 4 over 2 ranks is
3). Scaling is skipped entirely when the factor is exactly 1.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

__all__ = ["OPS", "REDUCTIONS", "ALLREDUCE_DTYPES", "BROADCAST_DTYPES", "normalize_op",
           "reduction_of", "op_code", "dtype_code", "check_dtype", "effective_scales"]

OPS: Tuple[str, ...] = ("sum", "average", "min", "max", "product")
REDUCTIONS: Tuple[str, ...] = ("sum", "min", "max", "product")
ALLREDUCE_DTYPES: Tuple[str, ...] = ("float16", "float32", "float64", "int32", "int64")
BROADCAST_DTYPES: Tuple[str, ...] = ALLREDUCE_DTYPES + ("uint8",)

# Codes for the metadata exchange; stable, distinct and positive. Keyed by np.dtype objects
# (hashable and cheap to look up; dtype.name is slow enough to show up per call).
_DTYPE_CODES: Dict[np.dtype, int] = {np.dtype(name): k + 1
                                     for k, name in enumerate(BROADCAST_DTYPES)}
_ALLREDUCE_SET = frozenset(np.dtype(name) for name in ALLREDUCE_DTYPES)
_OP_CODES: Dict[str, int] = {name: k + 1 for k, name in enumerate(OPS)}


def normalize_op(op: str) -> str:
    """Return the canonical name of ``op``.

    Raises
    ------
    ValueError
        If ``op`` is not one of :data:`OPS`.
    """
    if op in _OP_CODES:
        return op
    name = op.strip().lower() if isinstance(op, str) else None
    if name not in _OP_CODES:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    return name


def reduction_of(op: str) -> str:
    """The elementwise reduction that implements ``op`` (``"average"`` -> ``"sum"``)."""
    name = normalize_op(op)
    return "sum" if name == "average" else name


def op_code(op: str) -> int:
    return _OP_CODES[normalize_op(op)]


def dtype_code(dtype: object) -> int:
    """Positive code of a supported dtype, 0 for anything else."""
    try:
        return _DTYPE_CODES.get(np.dtype(dtype), 0)
    except TypeError:
        return 0


def check_dtype(dtype: object, broadcast: bool = False) -> np.dtype:
    """Return ``np.dtype(dtype)`` or raise ValueError naming the supported types."""
    dt = np.dtype(dtype)
    if dt in (_DTYPE_CODES if broadcast else _ALLREDUCE_SET):
        return dt
    allowed = BROADCAST_DTYPES if broadcast else ALLREDUCE_DTYPES
    what = "broadcast" if broadcast else "allreduce"
    raise ValueError(f"{what} supports dtypes {', '.join(allowed)}; got {dt.name}")


def effective_scales(op: str, prescale: float, postscale: float, size: int) -> Tuple[float, float]:
    """``(prescale, postscale)`` as applied, with ``"average"``'s ``1/size`` folded in."""
    pre = float(prescale)
    post = float(postscale)
    if normalize_op(op) == "average":
        post /= size
    return pre, post
