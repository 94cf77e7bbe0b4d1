"""The reduce step written once against the array API that NumPy and CuPy share.

``reduce_arrays(xp, dst, src, op, ...)`` is the CuPy fallback when the native kernels cannot be
loaded (xp = cupy) and the host path for bfloat16 and the other float types (xp = numpy). It
computes exactly what native/reduce.cu computes, bit for bit:

    dst = postscale * ((prescale * dst) OP (src_scale * src))

with float16 and bfloat16 widened to float32 for the step and rounded (to nearest even) once at
the end, and the scale factors rounded to the compute type first.

bfloat16 needs no dtype support from xp: it is handled as uint16 bit patterns. On the host a
NumPy array of ml_dtypes.bfloat16 is accepted as well (it is viewed as uint16).

``wire_view`` (bfloat16 bits as uint16 for MPI) lives in the transport, the layer below, and
is re-exported here.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..ops import UFUNCS, bfloat16_dtype, reduce_pair
from ..transport.wire import wire_view
from .env import canonical_dtype_name, check_op

#: Float dtypes and the type their step is computed in.
COMPUTE = {"float16": "float32", "bfloat16": "float32", "float32": "float32",
           "float64": "float64"}

__all__ = ["COMPUTE", "bfloat16_dtype", "bf16_bits_to_float32", "float32_to_bf16_bits",
           "wire_view", "reduce_arrays", "scale_array"]

# The ufunc's name per reduction, from horotopo.ops' one table (looked up on xp, NumPy or CuPy).
_UFUNC = {op: ufunc.__name__ for op, ufunc in UFUNCS.items()}


def bf16_bits_to_float32(xp: Any, bits: Any) -> Any:
    """Widen bfloat16 bit patterns (a uint16 array) to float32 values, exactly."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def float32_to_bf16_bits(xp: Any, values: Any) -> Any:
    """Round float32 values to bfloat16 bit patterns (uint16), to nearest even.

    NaN becomes the quiet NaN of its sign, as in native/reduce.cu and ml_dtypes.
    """
    u = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    # Non-NaN inputs stay below 2**32 after the rounding bias (the largest is -inf, 0xff800000).
    rounded = (u + (xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1)))) >> 16
    is_nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    quiet = xp.where((u >> 31) == 1, xp.uint32(0xFFC0), xp.uint32(0x7FC0))
    return xp.where(is_nan, quiet, rounded).astype(xp.uint16)


def _load(xp: Any, x: Any, name: str) -> Any:
    if name == "bfloat16":
        return bf16_bits_to_float32(xp, x)
    if name == "float16":
        return x.astype(xp.float32)
    return x


def reduce_arrays(xp: Any, dst: Any, src: Any, op: str, prescale: float = 1.0,
                  postscale: float = 1.0, src_scale: float = 1.0,
                  dtype: Optional[str] = None) -> Any:
    """``dst = postscale * ((prescale * dst) OP (src_scale * src))`` in place.

    Parameters
    ----------
    xp : module
        numpy or cupy; ``dst`` and ``src`` are arrays of that module.
    dst, src : array
        Same size and dtype. ``dst`` is overwritten.
    op : str
        "sum", "min", "max" or "product". min and max are IEEE 754-2019's (NaN propagates,
        -0.0 < +0.0), as :func:`horotopo.ops.reduce_pair` computes them.
    prescale, postscale, src_scale : float
        Factors fused into the step; anything but 1.0 needs a floating-point dtype.
    dtype : str, optional
        "bfloat16" when the arrays hold bfloat16 bits in a 2-byte integer dtype.

    Returns
    -------
    array
        ``dst``.

    Raises
    ------
    ValueError
        For an unknown op, mismatched sizes or dtypes, or scale factors on a non-float dtype.
    """
    check_op(op)
    name = dtype or canonical_dtype_name(dst.dtype)
    if dst.dtype != src.dtype:
        raise ValueError(f"reduce needs equal dtypes, got {dst.dtype} and {src.dtype}")
    if dst.size != src.size:
        raise ValueError(f"reduce needs equal sizes, got {dst.size} and {src.size}")
    if name == "bfloat16" and dst.dtype.itemsize != 2:
        raise ValueError(f"bfloat16 data must be in a 2-byte dtype, got {dst.dtype}")
    ufunc = getattr(xp, _UFUNC[op])
    if name not in COMPUTE:
        if (prescale, postscale, src_scale) != (1.0, 1.0, 1.0):
            raise ValueError(f"prescale/postscale need a floating-point dtype, got {name}")
        ufunc(dst, src, out=dst)
        return dst
    compute = xp.dtype(COMPUTE[name]).type
    if name == "bfloat16":
        dst_bits, src_bits = dst.view(xp.uint16), src.view(xp.uint16)
        x, y = _load(xp, dst_bits, name), _load(xp, src_bits, name)
    else:
        x, y = _load(xp, dst, name), _load(xp, src, name)
    # Always multiplying (by 1.0 too) would also be exact; skipping saves passes over memory.
    if prescale != 1.0:
        x = x * compute(prescale)
    if src_scale != 1.0:
        y = y * compute(src_scale)
    if x is dst:
        r = reduce_pair(xp, dst, y, op, dst)
    else:
        r = reduce_pair(xp, x, y, op, x)
    if postscale != 1.0:
        xp.multiply(r, compute(postscale), out=r)
    if name == "bfloat16":
        dst_bits[...] = float32_to_bf16_bits(xp, r)
    elif r is not dst:
        dst[...] = r.astype(dst.dtype)
    return dst


def scale_array(xp: Any, dst: Any, factor: float, dtype: Optional[str] = None) -> Any:
    """``dst *= factor`` in place, rounded as native/reduce.cu's horotopo_scale_* kernels do."""
    name = dtype or canonical_dtype_name(dst.dtype)
    if name not in COMPUTE:
        raise ValueError(f"scaling needs a floating-point dtype, got {name}")
    if factor == 1.0:
        return dst
    compute = xp.dtype(COMPUTE[name]).type
    bits = dst.view(xp.uint16) if name == "bfloat16" else dst
    r = _load(xp, bits, name)
    if r is dst:
        xp.multiply(dst, compute(factor), out=dst)
        return dst
    r = r * compute(factor)
    if name == "bfloat16":
        bits[...] = float32_to_bf16_bits(xp, r)
    else:
        dst[...] = r.astype(dst.dtype)
    return dst
