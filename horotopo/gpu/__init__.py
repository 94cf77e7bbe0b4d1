"""GPU buffers: device reduce steps, stream synchronisation, CUDA-awareness and host staging.

The engine's buffer layer calls into this package only for device arrays (CuPy arrays, CUDA
torch tensors). Importing it never imports cupy: a CPU-only machine without CuPy imports it
fine, and only the calls that touch a device need CuPy.

Public API
----------
reduce_into(dst, src, op, prescale, postscale)
    ``dst = postscale * ((prescale * dst) OP src)`` in place on the device, with the native
    kernels (native/reduce.cu) or the CuPy fallback.
scale(dst, factor)
    ``dst *= factor`` with the same rounding (a leaf applies its prescale before it sends).
synchronize(array)
    Finish the pending stream work on an array before MPI reads or writes it.
cuda_aware(comm)
    Whether MPI takes device pointers (override, library query, self-test; cached).
Stager
    Double-buffered pinned host slots for MPI libraries that are not CUDA-aware.
StagingTransport
    A Transport wrapper that stages device buffers through pinned slots (imported lazily: it
    pulls in horotopo.transport, hence mpi4py).
host_reduce_into(dst, src, op, ...)
    The same step for NumPy arrays, bfloat16 (ml_dtypes) included, bit-equal to the device.
wire_view(array)
    The array as MPI can carry it (bfloat16 as uint16).
as_cupy_array(x)
    A CuPy array sharing a CUDA torch tensor's memory (what the engine and runtime work on).
record_ready(x)
    Mark the point on the producing stream after which ``x`` is complete; another thread
    waits on the returned callable before MPI reads ``x`` (Horovod's ready event).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import numpy as np

from ._env import (OPS, check_op, cupy_module, device_status, dtype_name, is_cupy_array,
                   is_device_array, is_torch_cuda, torch_bfloat16_as_int16)
from .awareness import ENV as CUDA_AWARE_ENV
from .awareness import cuda_aware, parse_override, query_mpi_library
from .elementwise import bfloat16_dtype, reduce_arrays, scale_array, wire_view
from .kernels import backend_for, kernel_name, launch_reduce, launch_scale
from .staging import Stager

__all__ = ["OPS", "CUDA_AWARE_ENV", "Stager", "as_cupy_array", "backend", "bfloat16_dtype",
           "cuda_aware", "cupy_bfloat16", "record_ready",
           "device_status", "host_reduce_into", "is_device_array", "kernel_name",
           "parse_override", "query_mpi_library", "reduce_into", "scale", "synchronize",
           "wire_view", "StagingTransport"]


def __getattr__(name: str) -> Any:
    if name == "StagingTransport":
        from .transport import StagingTransport

        return StagingTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _as_cupy(x: Any, dtype: Optional[str]) -> Any:
    """(cupy array, dtype name) for a CuPy array or CUDA torch tensor, without copying."""
    as_int16 = torch_bfloat16_as_int16(x)
    if as_int16 is not None:  # the kernels take bfloat16 as 16-bit words, CuPy bf16 or not
        return cupy_module().asarray(as_int16), "bfloat16"
    if not is_device_array(x):
        raise TypeError(f"expected a CuPy array or a CUDA torch tensor, got {type(x).__name__} "
                        "(host arrays go through host_reduce_into)")
    arr = as_cupy_array(x)
    return arr, dtype or dtype_name(arr.dtype)


@functools.lru_cache(maxsize=1)
def cupy_bfloat16() -> Optional[np.dtype]:
    """ml_dtypes' bfloat16 when this CuPy can hold arrays of it (CuPy 14 with ml-dtypes), else
    None: older CuPy raises on the dtype, and bfloat16 then travels as 16-bit words."""
    bf16 = bfloat16_dtype()
    if bf16 is None:
        return None
    try:
        cupy_module().empty(0, dtype=bf16).view(np.uint16).view(bf16)
    except Exception:  # TypeError or NotImplementedError, depending on the CuPy version
        return None
    return bf16


def as_cupy_array(x: Any) -> Any:
    """A CuPy array over the memory of a CuPy array or CUDA torch tensor, never a copy.

    bfloat16 torch tensors become CuPy bfloat16 arrays where CuPy has the dtype
    (:func:`cupy_bfloat16`).

    Raises
    ------
    TypeError
        For anything else, and for a bfloat16 tensor when CuPy lacks bfloat16 (the message
        says what to install).
    """
    if is_cupy_array(x):
        return x
    if is_torch_cuda(x):
        x = x.detach()  # a tensor that requires grad refuses __cuda_array_interface__
    as_int16 = torch_bfloat16_as_int16(x)
    if as_int16 is not None:
        bf16 = cupy_bfloat16()
        if bf16 is None:
            raise TypeError("bfloat16 CUDA tensors need CuPy with bfloat16 (CuPy >= 14 and "
                            "ml-dtypes: pip install 'cupy-cuda12x>=14' ml-dtypes)")
        return cupy_module().asarray(as_int16).view(bf16)
    if is_torch_cuda(x):
        return cupy_module().asarray(x)  # zero-copy through __cuda_array_interface__
    raise TypeError(f"expected a CuPy array or a CUDA torch tensor, got {type(x).__name__}")


def record_ready(x: Any) -> Optional[Callable[[], None]]:
    """Record an event on the stream that produces ``x`` now (torch's current stream for a
    tensor, CuPy's for a CuPy array) and return its ``synchronize``; None for host arrays.

    The runtime's thread calls it before the engine touches ``x``: the caller's stream is not
    the runtime thread's, and CUDA-aware MPI reads memory outside any stream.
    """
    if is_torch_cuda(x):
        import torch  # present: x is a torch tensor

        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(x.device))
        return event.synchronize
    if is_cupy_array(x):
        cp = cupy_module()
        with x.device:
            event = cp.cuda.Event(disable_timing=True)
            event.record(cp.cuda.get_current_stream())
        return event.synchronize
    return None


def _checked_pair(dst: Any, src: Any, dtype: Optional[str]):
    a, name = _as_cupy(dst, dtype)
    b, src_name = _as_cupy(src, dtype)
    if name != src_name or a.dtype != b.dtype:
        raise ValueError(f"reduce needs equal dtypes, got {name} and {src_name}")
    if a.size != b.size:
        raise ValueError(f"reduce needs equal sizes, got {a.size} and {b.size}")
    if a.device.id != b.device.id:
        raise ValueError(f"reduce needs both arrays on one device, got devices {a.device.id} "
                         f"and {b.device.id}")
    return a, b, name


def backend(dst: Any, dtype: Optional[str] = None) -> str:
    """Which path :func:`reduce_into` takes for this array: "native" or "fallback"."""
    a, name = _as_cupy(dst, dtype)
    return backend_for(name, bool(a.flags.c_contiguous))


def reduce_into(dst: Any, src: Any, op: str, prescale: float = 1.0, postscale: float = 1.0,
                *, src_scale: float = 1.0, dtype: Optional[str] = None) -> Any:
    """One reduce step on the device: ``dst = postscale * ((prescale * dst) OP (src_scale * src))``.

    Parameters
    ----------
    dst, src : cupy.ndarray or CUDA torch.Tensor
        Same size, dtype and device. ``dst`` is overwritten; ``src`` is only read.
    op : str
        "sum", "min", "max" or "product" (average: sum, then postscale 1/size at the root).
    prescale : float
        Multiplies ``dst``, the local contribution: pass Horovod's prescale_factor on the step
        that first combines a rank's own data, and 1.0 on later steps (the children's partial
        results were prescaled where they started). A leaf uses :func:`scale` instead.
    postscale : float
        Multiplies the result: Horovod's postscale_factor (or 1/size for average) on the last
        step at the root, 1.0 elsewhere.
    src_scale : float
        Multiplies ``src``; 1.0 for the engine's use.
    dtype : str, optional
        "bfloat16" when bfloat16 data sits in a 2-byte integer array (CuPy has no bfloat16);
        bfloat16 torch tensors are recognised without it.

    Returns
    -------
    same as ``dst``
        ``dst``. The work is queued on the current stream: call :func:`synchronize` before MPI
        reads ``dst``.

    Raises
    ------
    ValueError
        Unknown op, mismatched arrays, or scale factors on an integer dtype.
    """
    check_op(op)
    a, b, name = _checked_pair(dst, src, dtype)
    if name == "bfloat16" and a.dtype.itemsize != 2:
        raise ValueError(f"bfloat16 data must be in a 2-byte dtype, got {a.dtype}")
    contiguous = bool(a.flags.c_contiguous and b.flags.c_contiguous)
    if backend_for(name, contiguous) == "native":
        with a.device:
            launch_reduce(a, a, b, op, name, prescale, src_scale, postscale)
    else:
        with a.device:
            reduce_arrays(cupy_module(), a, b, op, prescale, postscale, src_scale, name)
    return dst


def scale(dst: Any, factor: float, *, dtype: Optional[str] = None) -> Any:
    """``dst *= factor`` on the device, rounded like :func:`reduce_into`'s scale factors."""
    a, name = _as_cupy(dst, dtype)
    if factor == 1.0:
        return dst
    if backend_for(name, bool(a.flags.c_contiguous)) == "native":
        with a.device:
            launch_scale(a, a, name, factor)
    else:
        with a.device:
            scale_array(cupy_module(), a, factor, name)
    return dst


def host_reduce_into(dst: np.ndarray, src: np.ndarray, op: str, prescale: float = 1.0,
                     postscale: float = 1.0, *, src_scale: float = 1.0,
                     dtype: Optional[str] = None) -> np.ndarray:
    """:func:`reduce_into` for NumPy arrays, bit-equal to the device kernels.

    bfloat16 works with an ml_dtypes.bfloat16 array, or with uint16 bits and
    ``dtype="bfloat16"``; it is computed in float32 and rounded to nearest even once per step.
    """
    return reduce_arrays(np, dst, src, op, prescale, postscale, src_scale, dtype)


def synchronize(array: Any) -> None:
    """Complete the queued stream work that produces ``array`` (no-op for host arrays).

    MPI reads device memory from outside any stream, so a buffer written by a kernel must be
    finished before it is handed to a send.
    """
    if is_torch_cuda(array):
        import torch  # present: array is a torch tensor

        torch.cuda.current_stream(array.device).synchronize()
    elif is_cupy_array(array):
        with array.device:
            cupy_module().cuda.get_current_stream().synchronize()
    elif hasattr(type(array), "__cuda_array_interface__"):
        # Another producer: its stream is unknown to us, so finish everything on the device.
        cupy_module().cuda.Device().synchronize()
