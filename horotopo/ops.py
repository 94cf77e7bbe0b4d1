"""Reduction operations and data types the engine accepts, with Horovod's scaling rules.

This module holds the package's one vocabulary of reduction ops, :class:`ReduceOp`: the engine,
the transport (:data:`Reduction`, the library's op table), the GPU kernels and the NumPy paths
(:data:`UFUNCS`) all name ops by its members, and Horovod's integer constants (``hvd.Sum``,
``hvd.Average``, ...) map onto it at the API edge (:mod:`horotopo.api.ops`). A member is a
``str`` (``ReduceOp.SUM == "sum"``, with the same hash), so callers may pass the plain names:
``"sum"``, ``"average"``, ``"min"``, ``"max"``, ``"product"`` (case-insensitive).
``"average"`` reduces with ``"sum"`` and folds ``1 / size`` into the postscale factor, exactly
as Horovod does (``postscale_factor /= size``).

Scaling follows Horovod's ``ScaleBuffer``: floating-point buffers are multiplied in their own
precision (float16 through float32, rounded back once); integer buffers are multiplied in float64
and cast back, which truncates toward zero (so an int32 ``"average"`` of 3 and 4 over 2 ranks is
3). Scaling is skipped entirely when the factor is exactly 1.

``"min"`` and ``"max"`` on floating-point data are IEEE 754-2019's ``minimum`` and ``maximum``,
whatever the path (tree, ring, double binary tree, the library's allreduce, the GPU kernels):
an element is NaN when any rank's element is NaN, and then it is the dtype's one canonical quiet
NaN (:data:`CANONICAL_NAN_BITS`, sign clear, payload zero); -0.0 orders below +0.0; infinities
are ordinary values. Both are exact, so every path gives the same bits. :func:`reduce_pair` is
the one elementwise step every host and CuPy path takes; docs/reductions.md states the
semantics of every op.

bfloat16 is the NumPy dtype of the ml-dtypes package (``ml_dtypes.bfloat16``; CuPy arrays of it
too). ml_dtypes is imported only when a bfloat16 request first comes (it takes a large part of a
second to import), and a bfloat16 request without it raises ValueError saying to install it.
"""
from __future__ import annotations

import enum
from typing import Any, Callable, Dict, Literal, Optional, Set, Tuple

import numpy as np

__all__ = ["ReduceOp", "Reduction", "OPS", "REDUCTIONS", "UFUNCS", "ALLREDUCE_DTYPES",
           "BROADCAST_DTYPES", "BFLOAT16_MISSING", "bfloat16_dtype", "normalize_op",
           "reduction_of", "op_code", "dtype_code", "check_dtype", "is_allreduce_dtype",
           "effective_scales", "reduce_pair", "is_float_dtype", "CANONICAL_NAN_BITS",
           "EXTREMES"]


class ReduceOp(str, enum.Enum):
    """The reduction ops, by their canonical (engine) names.

    A ``str`` subclass whose ``str()`` is the name, so a member goes wherever a name went
    (dict keys, messages, the transport's ``op`` argument) and a name finds a member's entry.
    """

    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        # Python 3.11 formats mixed-in enums as "ReduceOp.SUM"; messages want the name.
        return format(self.value, spec)

    @property
    def reduction(self) -> "ReduceOp":
        """The elementwise reduction that implements this op (``AVERAGE`` -> ``SUM``)."""
        return ReduceOp.SUM if self is ReduceOp.AVERAGE else self


#: The elementwise reductions (every op but ``"average"``), as a type for the layers that
#: move data (the transport's ``allreduce``, the GPU kernels): a Literal of
#: :class:`ReduceOp`'s values, kept equal to :data:`REDUCTIONS` by tests/test_ops.py.
Reduction = Literal["sum", "min", "max", "product"]

OPS: Tuple[str, ...] = tuple(op.value for op in ReduceOp)
REDUCTIONS: Tuple[str, ...] = tuple(op.value for op in ReduceOp if op.reduction is op)
#: NumPy's in-place loop for each elementwise reduction (for host bfloat16, ml_dtypes' own:
#: each element computed in float32 and rounded to nearest even once). Tables are keyed by the
#: members' plain values: a lookup with a name then hits by identity, not by a str compare.
UFUNCS: Dict[str, Callable[..., object]] = {ReduceOp.SUM.value: np.add,
                                             ReduceOp.MIN.value: np.minimum,
                                             ReduceOp.MAX.value: np.maximum,
                                             ReduceOp.PRODUCT.value: np.multiply}
#: The reductions whose float result follows IEEE 754-2019 minimum/maximum (see above).
EXTREMES = frozenset({ReduceOp.MIN.value, ReduceOp.MAX.value})
#: The bits of each float dtype's canonical quiet NaN, by item size (float16 and bfloat16 alike
#: set the top mantissa bit: 0x7e00 is float16's, 0x7fc0 bfloat16's).
CANONICAL_NAN_BITS: Dict[str, int] = {"float16": 0x7E00, "bfloat16": 0x7FC0,
                                      "float32": 0x7FC00000, "float64": 0x7FF8000000000000}
_UFUNC_NAMES: Dict[str, str] = {op: ufunc.__name__ for op, ufunc in UFUNCS.items()}
ALLREDUCE_DTYPES: Tuple[str, ...] = ("float16", "bfloat16", "float32", "float64", "int32",
                                     "int64")
BROADCAST_DTYPES: Tuple[str, ...] = ALLREDUCE_DTYPES + ("uint8",)
BFLOAT16_MISSING = ("bfloat16 needs the ml-dtypes package for its NumPy dtype: "
                    "pip install ml-dtypes")


def bfloat16_dtype() -> Optional[np.dtype]:
    """NumPy's bfloat16 dtype from ml_dtypes, or None when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


# Codes for the metadata exchange; stable, distinct and positive. Keyed by np.dtype objects
# (hashable and cheap to look up; dtype.name is slow enough to show up per call). NumPy's own
# dtypes are known at import; bfloat16 gets its fixed code when ml_dtypes is first needed.
_NUMPY_DTYPES = tuple(name for name in BROADCAST_DTYPES if name != "bfloat16")
_DTYPE_CODES: Dict[np.dtype, int] = {np.dtype(name): k + 1
                                     for k, name in enumerate(_NUMPY_DTYPES)}
_BFLOAT16_CODE = len(_NUMPY_DTYPES) + 1
_ALLREDUCE_SET: Set[np.dtype] = {np.dtype(name) for name in ALLREDUCE_DTYPES
                                 if name != "bfloat16"}
_OP_CODES: Dict[str, int] = {name: k + 1 for k, name in enumerate(OPS)}
# Plain dicts for the per-call lookups (an Enum call costs about a microsecond, an isinstance
# against the Enum class a tenth of one).
_CANONICAL: Dict[str, str] = {op.value: op.value for op in ReduceOp}
_REDUCTION_OF: Dict[str, str] = {op.value: op.reduction.value for op in ReduceOp}
_bf16: Optional[np.dtype] = None  # ml_dtypes' bfloat16 once registered by _bfloat16()


def _is_bfloat16(dtype: object) -> bool:
    """Whether ``dtype`` names bfloat16 (a string, a dtype, or ml_dtypes' scalar type), without
    needing ml_dtypes to tell."""
    if isinstance(dtype, str):
        return dtype.strip().lower() == "bfloat16"
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None)
    return name == "bfloat16"


def _bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, registered in the dtype tables on first use (so later calls take
    the fast set lookup); ValueError (which the engine shares with every rank) without it."""
    global _bf16
    if _bf16 is None:
        dt = bfloat16_dtype()
        if dt is None:
            raise ValueError(BFLOAT16_MISSING)
        _DTYPE_CODES[dt] = _BFLOAT16_CODE
        _ALLREDUCE_SET.add(dt)
        _bf16 = dt
    return _bf16


def normalize_op(op: str) -> str:
    """Return the canonical name of ``op`` (a :class:`ReduceOp` value, as a plain str).

    Raises
    ------
    ValueError
        If ``op`` is not one of :data:`OPS`.
    """
    hit = _CANONICAL.get(op)  # a name or a member: its plain name, one dict lookup
    if hit is not None:
        return hit
    name = op.strip().lower() if isinstance(op, str) else None
    if name not in _OP_CODES:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    return name


def reduction_of(op: str) -> str:
    """The elementwise reduction that implements ``op`` (``"average"`` -> ``"sum"``)."""
    return _REDUCTION_OF[normalize_op(op)]


def op_code(op: str) -> int:
    return _OP_CODES[normalize_op(op)]


def dtype_code(dtype: object) -> int:
    """Positive code of a supported dtype, 0 for anything else (bfloat16 without ml_dtypes)."""
    try:
        code = _DTYPE_CODES.get(np.dtype(dtype), 0)
    except TypeError:
        code = 0
    if code == 0 and _is_bfloat16(dtype):
        try:
            return _DTYPE_CODES[_bfloat16()]
        except ValueError:
            return 0
    return code


def check_dtype(dtype: object, broadcast: bool = False) -> np.dtype:
    """Return ``np.dtype(dtype)`` or raise ValueError naming the supported types.

    ``"bfloat16"`` (or ml_dtypes' bfloat16 dtype) gives ml_dtypes' dtype; without ml_dtypes
    installed it raises ValueError saying to install ml-dtypes.
    """
    allowed = _DTYPE_CODES if broadcast else _ALLREDUCE_SET
    if isinstance(dtype, np.dtype) and dtype in allowed:
        return dtype  # the engine's per-call case: one set lookup
    if _is_bfloat16(dtype):
        return _bfloat16()
    dt = np.dtype(dtype)
    if dt in allowed:
        return dt
    allowed = BROADCAST_DTYPES if broadcast else ALLREDUCE_DTYPES
    what = "broadcast" if broadcast else "allreduce"
    raise ValueError(f"{what} supports dtypes {', '.join(allowed)}; got {dt.name}")


def is_allreduce_dtype(dtype: np.dtype) -> bool:
    """Whether the allreduce algorithms take ``dtype`` (one set lookup for the known ones;
    bfloat16 is registered on its first sight, and is False without ml_dtypes)."""
    return dtype in _ALLREDUCE_SET or (_is_bfloat16(dtype) and dtype_code(dtype) > 0)


def effective_scales(op: str, prescale: float, postscale: float, size: int) -> Tuple[float, float]:
    """``(prescale, postscale)`` as applied, with ``"average"``'s ``1/size`` folded in."""
    pre = float(prescale)
    post = float(postscale)
    if normalize_op(op) == "average":
        post /= size
    return pre, post


def is_float_dtype(dtype: object) -> bool:
    """Whether ``dtype`` is one of the float dtypes (bfloat16 included, which NumPy calls kind
    ``"V"``)."""
    return _is_bfloat16(dtype) or np.dtype(dtype).kind == "f"


def reduce_pair(xp: Any, x: Any, y: Any, op: str, out: Any) -> Any:
    """``out = x (op) y`` elementwise with the package's semantics; returns ``out``.

    ``xp`` is numpy or cupy and ``x``, ``y``, ``out`` its arrays of one dtype (``out`` may be
    ``x``). Sum and product are the ufuncs. Min and max of floats are IEEE 754-2019's: the
    ufuncs already propagate NaN, but on -0.0 against +0.0 they return whichever operand their
    loop happens to (NumPy's float16, float32 and bfloat16 loops differ), so where both operands
    are zero the sign comes from arithmetic instead: ``x + y`` is -0.0 only when both are -0.0
    (max), ``-((-x) + (-y))`` is -0.0 when either is (min). The NaN result keeps an operand's
    payload here; the engine makes it canonical once the whole reduction is done.
    """
    ufunc = getattr(xp, _UFUNC_NAMES[op])
    if op not in EXTREMES or not is_float_dtype(x.dtype):
        return ufunc(x, y, out=out)
    zeros = x == 0
    zeros &= y == 0
    if not zeros.any():
        return ufunc(x, y, out=out)
    signed = x + y if op == ReduceOp.MAX.value else -((-x) + (-y))
    ufunc(x, y, out=out)
    xp.copyto(out, signed, where=zeros)
    return out
