"""Lazy access to CuPy and torch, and array-kind checks that import neither.

Nothing here imports cupy at module import time: a CPU-only box without CuPy must be able to
import horotopo.gpu.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

import numpy as np

from ..ops import REDUCTIONS

#: The elementwise reductions the device steps take: :data:`horotopo.ops.REDUCTIONS` (average
#: is a sum with a postscale of 1/size, applied by the caller).
OPS = REDUCTIONS


def cupy_module() -> Any:
    """Import and return cupy.

    Raises
    ------
    RuntimeError
        If CuPy is not installed, naming the extra that installs it.
    """
    try:
        import cupy  # noqa: WPS433 (lazy on purpose: CPU boxes have no cupy)
    except ImportError as exc:
        raise RuntimeError("GPU buffers need CuPy: pip install 'horotopo[cuda]' "
                           f"(import failed: {exc})") from exc
    return cupy


def _top_module(x: Any) -> str:
    return type(x).__module__.split(".", 1)[0]


def is_cupy_array(x: Any) -> bool:
    """True for a cupy.ndarray, decided without importing cupy."""
    return _top_module(x) == "cupy" and hasattr(x, "data") and hasattr(x, "dtype")


def is_torch_cuda(x: Any) -> bool:
    """True for a torch tensor on a CUDA device, decided without importing torch."""
    return _top_module(x) == "torch" and bool(getattr(x, "is_cuda", False))


def is_gpu_buffer(x: Any) -> bool:
    """True for the device buffers this package handles: CuPy arrays and CUDA torch tensors."""
    return is_cupy_array(x) or is_torch_cuda(x)


@functools.lru_cache(maxsize=1)
def device_status() -> Tuple[bool, str]:
    """Whether a CUDA device can be used here, and why not when it cannot.

    Returns
    -------
    (bool, str)
        ``(True, "")`` when CuPy imports and sees at least one device, else ``(False, reason)``.
        Cached: devices do not come and go within a process.
    """
    try:
        cp = cupy_module()
    except RuntimeError as exc:
        return False, str(exc)
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError has no stable import path across CuPy versions
        return False, f"CUDA runtime unusable: {exc}"
    if count < 1:
        return False, "CUDA runtime reports no device"
    return True, ""


def canonical_dtype_name(dtype: Any) -> str:
    """The canonical name of a dtype ("float16", "bfloat16", "int32", ...).

    ``"bfloat16"`` is accepted as a string even when ml_dtypes is not installed.
    """
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    name = getattr(dtype, "name", None)
    if isinstance(name, str) and name == "bfloat16":
        return name
    return np.dtype(dtype).name


def check_op(op: str) -> str:
    """Validate a reduction op name.

    Raises
    ------
    ValueError
        If ``op`` is not one of :data:`OPS`.
    """
    if op not in OPS:
        raise ValueError(f"unsupported reduction op {op!r}: expected one of {', '.join(OPS)} "
                         "(average is sum with a postscale of 1/size)")
    return op


def torch_bfloat16_as_int16(x: Any) -> Optional[Any]:
    """A bfloat16 CUDA tensor viewed as int16 (torch cannot export bfloat16 through
    __cuda_array_interface__), or None when ``x`` is not such a tensor."""
    if is_torch_cuda(x) and str(x.dtype) == "torch.bfloat16":
        import torch  # already imported: x is a torch tensor

        return x.view(torch.int16)
    return None


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
