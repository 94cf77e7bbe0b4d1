"""The buffer layer: array-module lookup, flat views, segment/chunk splitting, reductions.

Everything here dispatches on the array's module so that CuPy arrays plug in: for a CuPy array
the reduction and synchronization go to :mod:`horotopo.gpu` (``reduce_into``, ``synchronize``);
for NumPy arrays, NumPy ufuncs write into the destination in place. CuPy is detected from the
array's type without importing it, so CPU-only installs never import cupy.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["is_device_array", "array_module", "flat_view", "contiguous_flat", "segment_bounds",
           "chunk_bounds", "reduce_into", "combine_into", "scale_into", "copy_into",
           "synchronize", "ScratchPool"]

_UFUNCS = {"sum": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}


def is_device_array(arr: Any) -> bool:
    """True for a CuPy array (checked by type, so cupy is never imported for NumPy arrays)."""
    return type(arr).__module__.split(".", 1)[0] == "cupy"


def _gpu() -> Any:
    from . import gpu  # only reached for CuPy arrays

    return gpu


def array_module(arr: Any) -> Any:
    """``numpy`` or ``cupy``, whichever owns ``arr``."""
    if is_device_array(arr):
        import cupy

        return cupy
    return np


def flat_view(arr: Any) -> Any:
    """A one-dimensional view of ``arr`` sharing its memory.

    Raises
    ------
    ValueError
        If ``arr`` is not C-contiguous (a flat view would have to be a copy).
    """
    if not arr.flags.c_contiguous:
        raise ValueError("buffer must be C-contiguous to be reduced or received in place")
    return arr.reshape(-1)


def contiguous_flat(arr: Any) -> Any:
    """A one-dimensional C-contiguous array with ``arr``'s elements (a view when possible)."""
    if arr.flags.c_contiguous:
        return arr.reshape(-1)
    return array_module(arr).ascontiguousarray(arr).reshape(-1)


def segment_bounds(count: int, shares: Sequence[float]) -> List[Tuple[int, int]]:
    """Split ``count`` elements into consecutive segments in proportion to ``shares``.

    The cut after segment ``t`` is ``floor(count * (share_0 + ... + share_t))`` and the last
    segment ends at ``count``. The arithmetic is the same sequence of float operations on every
    rank, so every rank cuts identically. Segments may be empty.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not shares:
        raise ValueError("need at least one share")
    bounds = []
    cum = 0.0
    start = 0
    for k, s in enumerate(shares):
        if s < 0 or not math.isfinite(s):
            raise ValueError(f"share {k} is {s}; shares must be finite and >= 0")
        cum += s
        stop = count if k == len(shares) - 1 else min(count, max(start, int(count * cum)))
        bounds.append((start, stop))
        start = stop
    return bounds


def chunk_bounds(start: int, stop: int, chunk_elems: int) -> List[Tuple[int, int]]:
    """Consecutive ``[a, b)`` pieces of ``[start, stop)``, each at most ``chunk_elems`` long."""
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    return [(a, min(a + chunk_elems, stop)) for a in range(start, stop, chunk_elems)]


def reduce_into(dst: Any, src: Any, op: str) -> None:
    """``dst = dst (op) src`` elementwise, in place; ``op`` in sum, min, max, product."""
    if is_device_array(dst):
        _gpu().reduce_into(dst, src, op)
        return
    _UFUNCS[op](dst, src, out=dst)


def combine_into(out: Any, a: Any, b: Any, op: str) -> None:
    """``out = a (op) b`` elementwise; saves the copy of ``a`` when ``out`` is another buffer."""
    if is_device_array(out):
        if out is not a:
            out[...] = a
        _gpu().reduce_into(out, b, op)
        return
    _UFUNCS[op](a, b, out=out)


def copy_into(dst: Any, src: Any) -> None:
    """``dst[...] = src`` for same-shaped flat buffers."""
    dst[...] = src


def scale_into(dst: Any, src: Any, factor: float) -> None:
    """``dst = src * factor`` with Horovod's rules (see :mod:`horotopo.ops`)."""
    xp = array_module(dst)
    kind = np.dtype(dst.dtype).kind
    if kind == "f":
        if dst.dtype == np.float16:
            dst[...] = (src.astype(np.float32) * np.float32(factor)).astype(np.float16)
        else:
            xp.multiply(src, dst.dtype.type(factor), out=dst)
    else:
        # float64 product, then C-style cast (truncation toward zero), as Horovod's ScaleBuffer.
        dst[...] = (src.astype(np.float64) * factor).astype(dst.dtype)


def synchronize(arr: Any) -> None:
    """Wait for device work on ``arr`` to finish before MPI reads it (no-op for NumPy)."""
    if is_device_array(arr):
        _gpu().synchronize(arr)


class ScratchPool:
    """Reusable receive scratch, so that repeated collectives do not page-fault fresh memory.

    ``get(nbytes, like)`` returns a flat array of ``like``'s dtype and module covering at least
    ``nbytes``; the pool keeps the largest block per (module, dtype) it has handed out.
    """

    def __init__(self) -> None:
        self._blocks: Dict[Tuple[str, str], Any] = {}

    def get(self, count: int, like: Any) -> Any:
        key = (type(like).__module__, np.dtype(like.dtype).str)
        block = self._blocks.get(key)
        if block is None or block.size < count:
            block = array_module(like).empty(max(count, 1), dtype=like.dtype)
            self._blocks[key] = block
        return block[:count]

    def clear(self) -> None:
        self._blocks.clear()
