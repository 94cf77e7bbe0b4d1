"""Torch tensors as the runtime's arrays, and the runtime's arrays back as tensors.

Tensors are handed to the runtime as views of their own memory, NumPy arrays for CPU tensors
and CuPy arrays for CUDA ones (zero-copy, through ``__cuda_array_interface__``), so in-place ops
write straight into the tensor and out-of-place ops into a fresh tensor; a CUDA tensor never
passes through host memory here (the engine stages chunks through pinned memory only when MPI
is not CUDA-aware). bfloat16 moves bit-exactly (as int16) for broadcast and allgather; it is
reduced in bfloat16 on the device where CuPy has the dtype, and through a float32 copy (on the
tensor's device) elsewhere.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np
import torch

from ..api import arrays

__all__ = ["device_of", "check_tensor", "shares_memory", "array_of", "tensor_of", "stage",
           "settled", "call_ready"]

_SUPPORTED = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.float32, torch.float64, torch.bool, torch.bfloat16}


def device_of(t: torch.Tensor) -> int:
    """The runtime's device number of ``t``: -1 for the CPU, else the CUDA device index."""
    return -1 if t.device.type == "cpu" else int(t.device.index or 0)


def check_tensor(t: Any) -> torch.Tensor:
    """``t``, once it is a tensor of a dtype the runtime moves (TypeError, ValueError if not)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _SUPPORTED:
        raise ValueError(f"Tensor type {t.type()} is not supported.")
    return t


def shares_memory(t: torch.Tensor, reduced: bool) -> bool:
    """True when the runtime's array for ``t`` (:func:`array_of`) is a view of ``t`` itself."""
    if t.dtype != torch.bfloat16:
        return True
    return t.is_cuda and reduced and _gpu().cupy_bfloat16() is not None


def _gpu() -> Any:
    # imported on first use: the GPU package loads CuPy, which CPU-only jobs never need
    from .. import gpu

    return gpu


def array_of(t: torch.Tensor, reduced: bool) -> Any:
    """The array the runtime works on for ``t``: a NumPy (CPU) or CuPy (CUDA) view of its
    data, or, for bfloat16 reductions without bfloat16 arrays, a float32 copy on its device.

    Not a view only where :func:`shares_memory` says so; such a copy is never the caller's
    memory, since the runtime may write into its input.
    """
    src = t.detach()
    if t.is_cuda:
        if src.dtype == torch.bfloat16 and not shares_memory(t, reduced):
            src = src.to(torch.float32) if reduced else src.view(torch.int16)
        return _gpu().as_cupy_array(src.contiguous())
    if shares_memory(t, reduced):
        return src.contiguous().numpy()
    src = src.contiguous()
    src = src.to(torch.float32) if reduced else src.view(torch.int16).clone()
    return src.numpy()


def tensor_of(arr: Any, like: torch.Tensor, reduced: bool) -> torch.Tensor:
    """A tensor of ``like``'s dtype and device holding ``arr`` (NumPy or CuPy)."""
    if arr.dtype.name == "bfloat16":  # neither torch.from_numpy nor CAI knows ml_dtypes' type
        arr = arr.view(np.int16)
    if isinstance(arr, np.ndarray):
        out = torch.from_numpy(arr)
    else:
        out = torch.as_tensor(arr, device=like.device)  # zero-copy from CuPy
    if like.dtype == torch.bfloat16 and out.dtype != torch.bfloat16:
        out = out.view(torch.bfloat16) if out.dtype == torch.int16 else out.to(torch.bfloat16)
    return out if out.device == like.device else out.to(like.device)


def stage(t: torch.Tensor, inplace: bool, reduced: bool) \
        -> Tuple[Any, Any, Callable[[Any], torch.Tensor]]:
    """Input, output and result-builder for an allreduce or broadcast of ``t``."""
    check_tensor(t)
    if inplace and not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    inp = array_of(t, reduced)
    if shares_memory(t, reduced):
        if inplace:
            return inp, inp, lambda _res: t
        result = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return inp, array_of(result, reduced), lambda _res: result
    if inplace:
        def put_back(res: Any) -> torch.Tensor:
            with torch.no_grad():
                t.copy_(tensor_of(res, t, reduced))
            return t
        return inp, inp, put_back
    return inp, inp, lambda res: tensor_of(res, t, reduced)


def settled(arr: Any, t: torch.Tensor) -> Any:
    """``arr`` once torch's stream has written it: the array front end that takes it records
    its ready event on CuPy's stream, which need not be torch's."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return arr


def call_ready(tensors: Sequence[torch.Tensor]) -> Tuple[int, Any]:
    """The call's device and, for CUDA tensors, the event the runtime waits on (recorded on
    torch's current stream after the staging copies above)."""
    dev = arrays.call_device([device_of(t) for t in tensors])
    return dev, arrays.ready_hook(dev, tensors[-1] if tensors else None)

