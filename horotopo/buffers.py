"""The buffer layer: array-module lookup, flat views, segment/chunk splitting, reductions.

Everything here dispatches on the array's module so that CuPy arrays plug in: for a CuPy array
the reduction and synchronization go to the GPU package's low modules
(:mod:`horotopo.gpu.kernels`: ``reduce_into``, ``scale``, ``synchronize``); for NumPy arrays,
NumPy ufuncs write into the destination in place. CuPy is detected from the array's type
without importing it, so CPU-only installs never import cupy.

Other frameworks' buffers (a front end's tensors) enter through :func:`as_array`, by a
:class:`BufferAdapter` that the front end registers when it is imported
(:func:`register_adapter`; ``horotopo.torch`` registers torch's): it gives the NumPy or CuPy
array over the buffer's memory (never a copy), so everything past that sees only NumPy and CuPy
arrays and this layer knows no framework.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from .ops import CANONICAL_NAN_BITS, EXTREMES, UFUNCS, is_float_dtype, reduce_pair

__all__ = ["BufferAdapter", "register_adapter", "unregister_adapter", "adapter_for",
           "is_device_array", "is_foreign", "as_array", "empty_like", "device_scope",
           "array_module", "flat_view", "contiguous_flat", "segment_bounds", "chunk_bounds",
           "reduce_into", "combine_into", "scale_into", "copy_into", "synchronize",
           "canonical_nan_into", "has_nan_or_negative_zero", "order_keys", "from_order_keys",
           "ScratchPool"]

# For host bfloat16 (ml_dtypes) these are ml_dtypes' own loops: each element is computed in
# float32 and rounded to nearest even once: the bits of horotopo.gpu.host_reduce_into (a NaN's
# payload aside), which works on bit patterns and is several times slower.
_UFUNCS = UFUNCS


class BufferAdapter(Protocol):
    """How one framework's buffers (say, a front end's tensors) become the engine's arrays.

    A front end registers one with :func:`register_adapter` when it is imported; the engine
    then takes that framework's buffers and hands its results back as such buffers.
    """

    def as_array(self, buf: Any) -> Any:
        """The NumPy or CuPy array over ``buf``'s memory (a view, never a copy), once the
        framework's own pending work that writes ``buf`` is done (MPI reads it outside any
        stream). Raises TypeError for a buffer it cannot view."""
        ...

    def empty_like(self, buf: Any) -> Any:
        """A new, uninitialised buffer of ``buf``'s framework, shape, dtype and device."""
        ...


_ADAPTERS: Dict[str, BufferAdapter] = {}
# type -> its adapter or None, so that the per-call lookup is one dict hit after the first.
_BY_TYPE: Dict[type, Optional[BufferAdapter]] = {}


def register_adapter(module: str, adapter: BufferAdapter) -> None:
    """Take buffers whose type comes from the top-level package ``module`` through ``adapter``.

    Parameters
    ----------
    module : str
        The top-level package that defines the buffer types (``type(buf).__module__`` up to
        its first dot).
    adapter : BufferAdapter
        Replaces an adapter registered earlier for ``module``.
    """
    if module in ("numpy", "cupy"):
        raise ValueError(f"{module} arrays are the engine's own; they need no adapter")
    _ADAPTERS[module] = adapter
    _BY_TYPE.clear()


def unregister_adapter(module: str) -> None:
    """Forget ``module``'s adapter (its buffers are rejected again)."""
    _ADAPTERS.pop(module, None)
    _BY_TYPE.clear()


def adapter_for(buf: Any) -> Optional[BufferAdapter]:
    """The adapter registered for ``buf``'s framework, or None (NumPy, CuPy, anything else)."""
    kind = type(buf)
    if kind is np.ndarray or not _ADAPTERS:  # the engine's usual case, first
        return None
    try:
        return _BY_TYPE[kind]
    except KeyError:
        found = _ADAPTERS.get(kind.__module__.split(".", 1)[0])
        _BY_TYPE[kind] = found
        return found


def is_device_array(arr: Any) -> bool:
    """True for a CuPy array (checked by type, so cupy is never imported for NumPy arrays)."""
    return type(arr).__module__.split(".", 1)[0] == "cupy"


def is_foreign(buf: Any) -> bool:
    """True for a buffer that enters through a registered adapter (not NumPy or CuPy)."""
    return adapter_for(buf) is not None


def as_array(buf: Any) -> Any:
    """The NumPy or CuPy array over ``buf``'s memory, for the engine to work on.

    NumPy and CuPy arrays come back unchanged; a buffer of a framework with a registered
    adapter becomes its adapter's view. Anything else is returned as is, for the caller's
    dtype checks to reject, except objects that export their memory (``__dlpack__``) from a
    framework with no adapter: that TypeError says an adapter is missing.

    Raises
    ------
    TypeError
        From the adapter (a buffer it cannot view), or for an unadapted framework's buffer.
    """
    if type(buf) is np.ndarray:  # the engine's usual case, first
        return buf
    adapter = adapter_for(buf)
    if adapter is not None:
        return adapter.as_array(buf)
    if hasattr(buf, "__dlpack__") and not isinstance(buf, np.ndarray) \
            and not is_device_array(buf):
        kind = type(buf)
        raise TypeError(f"{kind.__module__}.{kind.__qualname__} is not a NumPy or CuPy array "
                        f"and no buffer adapter is registered for "
                        f"{kind.__module__.split('.', 1)[0]!r} buffers (a front end registers "
                        "its own when it is imported)")
    return buf


def empty_like(buf: Any) -> Any:
    """A new, uninitialised buffer like ``buf``: of its framework (through its adapter) for a
    foreign buffer, else a NumPy or CuPy array of its shape and dtype on its device."""
    adapter = adapter_for(buf)
    if adapter is not None:
        return adapter.empty_like(buf)
    with device_scope(buf):
        return array_module(buf).empty(buf.shape, dtype=buf.dtype)


def device_scope(arr: Any) -> Any:
    """A context in which new CuPy arrays and kernels go to ``arr``'s device (a no-op context
    for host arrays): a thread that did not pick the device itself starts on device 0."""
    if is_device_array(arr):
        return arr.device
    return contextlib.nullcontext()


def _gpu() -> Any:
    # The GPU package's low module, only reached for CuPy arrays (its import needs no cupy).
    from .gpu import kernels

    return kernels


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
    if op in EXTREMES:
        reduce_pair(np, dst, src, op, dst)
        return
    _UFUNCS[op](dst, src, out=dst)


def combine_into(out: Any, a: Any, b: Any, op: str) -> None:
    """``out = a (op) b`` elementwise; saves the copy of ``a`` when ``out`` is another buffer."""
    if is_device_array(out):
        if out is not a:
            out[...] = a
        _gpu().reduce_into(out, b, op)
        return
    if op in EXTREMES:
        reduce_pair(np, a, b, op, out)
        return
    _UFUNCS[op](a, b, out=out)


def copy_into(dst: Any, src: Any) -> None:
    """``dst[...] = src`` for same-shaped flat buffers."""
    dst[...] = src


def scale_into(dst: Any, src: Any, factor: float) -> None:
    """``dst = src * factor`` with Horovod's rules (see :mod:`horotopo.ops`)."""
    xp = array_module(dst)
    kind = np.dtype(dst.dtype).kind
    if kind == "V":
        # bfloat16 (ml_dtypes; the only 'V' dtype the engine admits) is not kind "f": scale it
        # in float32 and round once, bit-equal to the device kernels (horotopo.gpu).
        if dst is not src:
            dst[...] = src
        if is_device_array(dst):
            _gpu().scale(dst, factor)
        else:
            from .gpu.elementwise import scale_array

            scale_array(np, dst, factor)
        return
    if kind == "f":
        if dst.dtype == np.float16:
            dst[...] = (src.astype(np.float32) * np.float32(factor)).astype(np.float16)
        else:
            xp.multiply(src, dst.dtype.type(factor), out=dst)
    else:
        # float64 product, then C-style cast (truncation toward zero), as Horovod's ScaleBuffer.
        dst[...] = (src.astype(np.float64) * factor).astype(dst.dtype)


def _float_layout(dtype: Any) -> Tuple[str, Any, int]:
    """``(name, unsigned int dtype of its width, bits)`` of a float dtype (bfloat16 included)."""
    dt = np.dtype(dtype)
    name = "bfloat16" if dt.kind == "V" else dt.name
    return name, np.dtype(f"u{dt.itemsize}"), 8 * dt.itemsize


def canonical_nan_into(arr: Any) -> None:
    """Replace every NaN of the flat float array ``arr`` (NumPy or CuPy) by the dtype's
    canonical quiet NaN (:data:`horotopo.ops.CANONICAL_NAN_BITS`), in place.

    Min and max results go through it, so that a NaN has the same bits whichever operand's
    payload (or sign: x86 makes 0/0 a negative NaN) the path happened to keep. One pass when
    there is no NaN.
    """
    name, utype, _ = _float_layout(arr.dtype)
    nan = _isnan(arr)
    if nan.any():
        arr.view(utype)[nan] = utype.type(CANONICAL_NAN_BITS[name])


def _isnan(arr: Any) -> Any:
    """``isnan`` for every float dtype, bfloat16 on the device too (CuPy's isnan may not know
    ml_dtypes' type, so there it reads the bits)."""
    if not is_device_array(arr) or np.dtype(arr.dtype).kind == "f":
        return array_module(arr).isnan(arr)
    name, utype, width = _float_layout(arr.dtype)
    return (arr.view(utype) & utype.type((1 << (width - 1)) - 1)) > utype.type(
        _INFINITY_BITS[name])


def has_nan_or_negative_zero(arr: Any) -> bool:
    """Whether float ``arr`` holds a NaN or a -0.0: the values on which a library's float
    min and max answer depend on the operand order."""
    _, _, width = _float_layout(arr.dtype)
    signed = np.dtype(f"i{width // 8}")
    if bool(_isnan(arr).any()):
        return True
    return bool((arr.view(signed) == signed.type(np.iinfo(signed).min)).any())


#: Bits of +infinity per float dtype: a magnitude above it is a NaN.
_INFINITY_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
                  "float64": 0x7FF0000000000000}


def order_keys(arr: Any, op: str, pool: Optional["ScratchPool"] = None) -> Any:
    """Signed integers that order as ``arr``'s floats do under ``op`` (``"min"``, ``"max"``),
    for a library that reduces integers exactly but floats its own way.

    A float's bits as a signed integer order non-negative floats already; flipping the
    magnitude bits of negative ones orders them too (-0.0 becomes -1, just below +0.0, as IEEE
    754-2019's minimum and maximum order them). Every NaN becomes the largest key of its width
    for max and the smallest for min, so it wins against anything. 2-byte floats get int32 keys
    (the transport has no 16-bit integer type), 4-byte ones int32, 8-byte ones int64; with
    ``pool`` the keys are its scratch (valid until the pool's next use).
    """
    _, _, width = _float_layout(arr.dtype)
    signed = np.dtype(f"i{width // 8}")
    v = arr.view(signed)
    if width == 16 or pool is None:
        keys = v >> (width - 1)  # 0 for a clear sign bit, -1 for a set one
    else:
        keys = pool.get(v.size, v)
        array_module(v).right_shift(v, width - 1, out=keys)
    keys &= signed.type((1 << (width - 1)) - 1)
    keys ^= v
    nan = _isnan(arr)
    if nan.any():
        keys[nan] = _key_sentinel(signed, op)
    if width == 16:
        keys = keys.astype(np.int32)
    return keys


def from_order_keys(keys: Any, out: Any, op: str) -> None:
    """Write into float ``out`` the values whose :func:`order_keys` are ``keys``. A NaN's key
    comes back as a NaN with some payload: :func:`canonical_nan_into` makes it the canonical
    one."""
    _, _, width = _float_layout(out.dtype)
    signed = np.dtype(f"i{width // 8}")
    k = keys.astype(signed) if keys.dtype != signed else keys
    v = out.view(signed)
    array_module(k).right_shift(k, width - 1, out=v)
    v &= signed.type((1 << (width - 1)) - 1)
    v ^= k


def _key_sentinel(dtype: Any, op: str) -> int:
    # The extreme keys of the float's own width are NaN bit patterns (0x7fff... and, flipped
    # back, 0xffff...), so no number has them and they read back as NaN.
    info = np.iinfo(dtype)
    return int(info.max) if op == "max" else int(info.min)


def synchronize(arr: Any) -> None:
    """Wait for device work on ``arr`` to finish before MPI reads it (no-op for NumPy)."""
    if is_device_array(arr):
        _gpu().synchronize(arr)


class ScratchPool:
    """Reusable receive scratch, so that repeated collectives do not page-fault fresh memory.

    ``get(count, like)`` returns a flat array of ``count`` elements of ``like``'s dtype and
    module, valid until the pool's next use. The pool keeps one block of bytes per array module,
    the largest handed out, whatever the dtypes: a job that reduces several dtypes would
    otherwise keep a scratch window per dtype (five dtypes held five 2 MiB windows per pool).
    """

    def __init__(self) -> None:
        self._blocks: Dict[str, Any] = {}

    def get(self, count: int, like: Any) -> Any:
        key = type(like).__module__
        itemsize = np.dtype(like.dtype).itemsize
        block = self._blocks.get(key)
        if block is None or block.size < max(count, 1) * itemsize:
            block = array_module(like).empty(max(count, 1) * itemsize, dtype=np.uint8)
            self._blocks[key] = block
        return block[:count * itemsize].view(like.dtype)

    @property
    def held_bytes(self) -> int:
        """The bytes the pool holds (one block per array module used)."""
        return sum(int(b.nbytes) for b in self._blocks.values())

    def clear(self) -> None:
        self._blocks.clear()
