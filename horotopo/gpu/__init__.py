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

from typing import Any, Callable, Optional

import numpy as np

from .env import (OPS, cupy_module, device_status, is_cupy_array, is_gpu_buffer,
                   is_torch_cuda, synchronize)
from .awareness import ENV as CUDA_AWARE_ENV
from .awareness import cuda_aware, parse_override, query_mpi_library
from .elementwise import bfloat16_dtype, reduce_arrays, wire_view
# The device steps live in the low modules (the buffer layer calls them without importing this
# package's upper modules); this package re-exports them as its public API.
from .kernels import (as_cupy_array, backend, cupy_bfloat16, kernel_name, reduce_into,
                      scale)
from .staging import Stager

__all__ = ["OPS", "CUDA_AWARE_ENV", "Stager", "as_cupy_array", "backend", "bfloat16_dtype",
           "cuda_aware", "cupy_bfloat16", "record_ready",
           "device_status", "host_reduce_into", "is_gpu_buffer", "kernel_name",
           "parse_override", "query_mpi_library", "reduce_into", "scale", "synchronize",
           "wire_view", "StagingTransport"]


def __getattr__(name: str) -> Any:
    if name == "StagingTransport":
        from .transport import StagingTransport

        return StagingTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def host_reduce_into(dst: np.ndarray, src: np.ndarray, op: str, prescale: float = 1.0,
                     postscale: float = 1.0, *, src_scale: float = 1.0,
                     dtype: Optional[str] = None) -> np.ndarray:
    """:func:`reduce_into` for NumPy arrays, bit-equal to the device kernels.

    bfloat16 works with an ml_dtypes.bfloat16 array, or with uint16 bits and
    ``dtype="bfloat16"``; it is computed in float32 and rounded to nearest even once per step.
    """
    return reduce_arrays(np, dst, src, op, prescale, postscale, src_scale, dtype)
