"""SyncBatchNorm, as ``horovod.torch.SyncBatchNorm``: batch statistics over all ranks' batches.

Each rank sums its inputs and their squares per channel; one differentiable Sum allreduce
(float64, so that E[x^2] - E[x]^2 keeps its precision) gives the global mean and variance. The
backward pass of that allreduce is a Sum allreduce of the gradients, which is exactly the
cross-rank term of the gradient of the total loss, so no custom backward is needed.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..api.basics import size
from ..api.ops import Sum
from .mpi_ops import allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics cover the global batch.

    Same arguments as :class:`torch.nn.BatchNorm1d/2d/3d`; any input of at least 2 dimensions
    (N, C, ...) works. In eval mode, or on one rank, it is ordinary batch normalization.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x64 = input.to(torch.float64)
        count = torch.tensor([input.numel() // channels], dtype=torch.float64)
        local = torch.cat([x64.sum(dims), (x64 * x64).sum(dims), count])
        total = allreduce(local, op=Sum)
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels:2 * channels] / n - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                          else self.momentum)
                unbiased = var * (n / (n - 1)) if n > 1 else var
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype),
                                                         alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype),
                                                        alpha=factor)
        shape = [1, channels] + [1] * (input.dim() - 2)
        inv = torch.rsqrt(var + self.eps)
        out = (x64 - mean.view(shape)) * inv.view(shape)
        out = out.to(input.dtype)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
