"""Inputs with NaN, infinities and signed zeros, and NumPy's answer to reducing them, for the
tests that hold every allreduce path to one set of bits (docs/reductions.md).

Each rank's input mixes positive and negative NaN (x86 makes 0/0 a negative one), +-Inf, -0.0,
+0.0 and finite values chosen so that a sum or product over up to 8 ranks is exact in every
float dtype, bfloat16 included: then the reduction order cannot change a bit, and any path that
differs from the oracle is wrong, not rounded differently.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from horotopo.ops import CANONICAL_NAN_BITS

OPS = ("max", "min", "sum", "product")


def float_dtypes() -> List[np.dtype]:
    """float16, float32, float64, and bfloat16 when ml_dtypes is installed."""
    found = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
    try:
        import ml_dtypes
    except ImportError:
        return found
    return found + [np.dtype(ml_dtypes.bfloat16)]


def dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype.kind == "V" else dtype.name


def special_input(rank: int, count: int, dtype: np.dtype, op: str, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s input: about a third specials (NaN of either sign, +-Inf, +-0.0), the
    rest finite values whose sums (small integers) and products (+-1, +-2, +-0.5) stay exact."""
    rng = np.random.default_rng([seed, rank, count, len(op)])
    if op == "product":
        finite = rng.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], count)
    elif op == "sum":
        finite = rng.integers(-8, 9, count).astype(np.float64)
    else:
        finite = rng.integers(-100, 101, count) / 4.0
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0])
    kind = rng.integers(0, 18, count)
    values = np.where(kind < len(specials), specials[np.minimum(kind, len(specials) - 1)],
                      finite)
    return values.astype(dtype)


def oracle(inputs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction of the ranks' ``inputs`` as documented: NumPy's in float64 (exact for
    these inputs), with min/max as IEEE 754-2019's (NaN if any operand is, -0.0 below +0.0,
    the NaN canonical)."""
    dtype = inputs[0].dtype
    stack = np.stack([x.astype(np.float64) for x in inputs])
    if op in ("sum", "product"):
        # folded row by row: NumPy's reduce may start from the identity, and 0.0 + -0.0 is 0.0
        got = stack[0].copy()
        for row in stack[1:]:
            got = got + row if op == "sum" else got * row
    else:
        nan = np.isnan(stack).any(axis=0)
        got = (np.max if op == "max" else np.min)(np.where(np.isnan(stack), 0.0, stack), axis=0)
        positive_zero = ((stack == 0) & ~np.signbit(stack)).any(axis=0)
        negative_zero = ((stack == 0) & np.signbit(stack)).any(axis=0)
        zero = got == 0
        # max: -0.0 only when no operand is +0.0; min: -0.0 when any operand is -0.0
        negative = (~positive_zero) if op == "max" else negative_zero
        got = np.where(zero, np.where(negative, -0.0, 0.0), got)
        got = np.where(nan, np.nan, got)
    out = got.astype(dtype)
    if op in ("max", "min"):
        bits = out.view(f"u{dtype.itemsize}")
        bits[np.isnan(got)] = CANONICAL_NAN_BITS[dtype_name(dtype)]
    return out


def mismatches(got: np.ndarray, want: np.ndarray, op: str) -> List[str]:
    """Where ``got`` differs from ``want``: bit for bit, except that a sum's or product's NaN
    need only be a NaN (its sign and payload are the arithmetic's, see docs/reductions.md)."""
    g = np.asarray(got).reshape(-1)
    w = np.asarray(want).reshape(-1)
    gbits, wbits = g.view(f"u{g.dtype.itemsize}"), w.view(f"u{w.dtype.itemsize}")
    gnan = np.isnan(g.astype(np.float64))
    wnan = np.isnan(w.astype(np.float64))
    if op in ("max", "min"):
        bad = np.flatnonzero(gbits != wbits)
    else:
        bad = np.flatnonzero((gnan != wnan) | (~wnan & (gbits != wbits)))
    return [f"[{i}] got {g[i]!r} (0x{int(gbits[i]):x}) want {w[i]!r} (0x{int(wbits[i]):x})"
            for i in bad[:5]]


def reported_case(rank: int, count: int, dtype: np.dtype = np.dtype(np.float32)) -> np.ndarray:
    """The first two elements [NaN, 1] on even ranks and [1, NaN] on odd ones, then ones."""
    x = np.ones(count, dtype=dtype)
    x[rank % 2] = np.nan
    return x
