"""torch tensors as the engine's buffers: the adapter ``horotopo.torch`` registers at import.

With it, :class:`horotopo.engine.Engine` takes torch tensors (CPU or CUDA) as it takes NumPy
and CuPy arrays, works on the tensors' own memory and returns a tensor for a tensor; the engine
and the buffer layer know no torch (:func:`horotopo.buffers.register_adapter`). The runtime's
own path converts tensors itself (:mod:`horotopo.torch.tensors`) before the engine sees them.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import buffers
from ..ops import BFLOAT16_MISSING, bfloat16_dtype

__all__ = ["TorchAdapter", "register"]


class TorchAdapter:
    """A :class:`horotopo.buffers.BufferAdapter` for torch tensors."""

    def as_array(self, buf: torch.Tensor) -> Any:
        """The NumPy (CPU) or CuPy (CUDA) view of ``buf``'s memory, never a copy.

        A CUDA tensor is viewed once torch's current stream has finished the work that writes
        it, since MPI and the engine's stream know nothing of torch's. A CPU bfloat16 tensor
        becomes an array of ml_dtypes' bfloat16.

        Raises
        ------
        TypeError
            A bfloat16 tensor where the matching array type is missing (ml-dtypes on the host,
            bfloat16 support in CuPy on the device); the message names what to install.
        """
        if buf.is_cuda:
            from .. import gpu  # only for CUDA tensors: the GPU package loads CuPy

            gpu.synchronize(buf)
            return gpu.as_cupy_array(buf)
        t = buf.detach()
        if t.dtype == torch.bfloat16:
            bf16 = bfloat16_dtype()
            if bf16 is None:
                raise TypeError(BFLOAT16_MISSING)
            return t.view(torch.int16).numpy().view(bf16)
        return t.numpy()

    def empty_like(self, buf: torch.Tensor) -> torch.Tensor:
        """A new tensor of ``buf``'s shape, dtype and device."""
        return buf.new_empty(tuple(buf.shape))


def register() -> None:
    """Make the engine take torch tensors (idempotent; ``import horotopo.torch`` calls it)."""
    buffers.register_adapter("torch", TorchAdapter())
