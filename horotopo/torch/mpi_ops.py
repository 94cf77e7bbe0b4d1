"""Collectives on torch tensors, with the names, signatures and autograd of ``horovod.torch``.

This module is Horovod's ``mpi_ops`` surface: every op of :data:`__all__` is importable from
here. It holds the differentiable ops (``allreduce``, ``grouped_allreduce``, ``allgather``,
``broadcast``, ``alltoall``, ``reducescatter``) and their autograd Functions, whose backward
passes are collectives too; the handle-based ops they are built on (``*_async``,
:func:`synchronize`...) live in :mod:`horotopo.torch.collectives`, and how a tensor becomes
the runtime's array (zero-copy views, bfloat16) in :mod:`horotopo.torch.tensors`.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from ..api.basics import global_process_set, rank
from ..api.ops import Average, Sum
from .collectives import (allgather_async, allreduce_, allreduce_async, allreduce_async_,
                          alltoall_async, barrier, broadcast_, broadcast_async, broadcast_async_,
                          grouped_allgather_async, grouped_allreduce_, grouped_allreduce_async,
                          grouped_allreduce_async_, grouped_reducescatter_async, join, poll,
                          reducescatter_async, sparse_allreduce_async, synchronize)
from .compression import Compression

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
           "alltoall_async", "reducescatter", "reducescatter_async", "grouped_allgather",
           "grouped_allgather_async", "grouped_reducescatter", "grouped_reducescatter_async",
           "barrier", "join", "poll", "synchronize", "HorovodAllreduce",
           "HorovodGroupedAllreduce", "HorovodAllgather", "HorovodGroupedAllgather",
           "HorovodBroadcast", "HorovodAlltoall", "HorovodReducescatter",
           "HorovodGroupedReducescatter"]


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce with a gradient: the backward pass allreduces the gradient with the same op."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, average: Optional[bool], name: Optional[str],
                op: Optional[int], prescale_factor: float, postscale_factor: float,
                process_set: Any) -> torch.Tensor:
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Any, ...]:
        grad = allreduce(grad_output, average=ctx.average, op=ctx.op,
                         prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return (grad, None, None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Average (or reduce with ``op``) ``tensor`` over all ranks; returns a new tensor.

    Differentiable: the gradient is allreduced the same way. ``compression`` is applied before
    and undone after the reduction.
    """
    compressed, cctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor,
                                     postscale_factor, process_set)
    return compression.decompress(reduced, cctx)


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Grouped allreduce with a gradient (a grouped allreduce of the gradients)."""

    @staticmethod
    def forward(ctx: Any, average: Optional[bool], name: Optional[str], op: Optional[int],
                prescale_factor: float, postscale_factor: float, process_set: Any,
                *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Any, ...]:
        reduced = grouped_allreduce(list(grads), average=ctx.average, op=ctx.op,
                                    prescale_factor=ctx.prescale_factor,
                                    postscale_factor=ctx.postscale_factor,
                                    process_set=ctx.process_set)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: Any = Compression.none,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: Any = global_process_set) -> List[torch.Tensor]:
    """Allreduce each of ``tensors``; returns a list of new tensors (differentiable)."""
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor,
                                            postscale_factor, process_set,
                                            *[p[0] for p in pairs])
    return [compression.decompress(t, c) for t, (_, c) in zip(reduced, pairs)]


class HorovodAllgather(torch.autograd.Function):
    """Allgather with a gradient: the gradient is averaged over ranks, then each rank keeps
    the rows it contributed (Horovod's definition)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str],
                process_set: Any) -> torch.Tensor:
        ctx.dim = tensor.shape[0] if tensor.dim() else 0
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Any, ...]:
        reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int32),
                         process_set=ctx.process_set)
        # This rank's rows start after those of the set's ranks before it.
        offset = int(dims[:ctx.process_set.rank()].sum().item())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0 in rank order (differentiable)."""
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather with Horovod's gradient: each gradient averaged over ranks, then the
    rows this rank contributed."""

    @staticmethod
    def forward(ctx: Any, name: Optional[str], process_set: Any,
                *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.dims = [t.shape[0] if t.dim() else 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Any, ...]:
        reduced = grouped_allreduce(list(grads), op=Average, process_set=ctx.process_set)
        every = grouped_allgather([torch.tensor([d], dtype=torch.int32) for d in ctx.dims],
                                  process_set=ctx.process_set)
        me = ctx.process_set.rank()
        offsets = [int(d[:me].sum().item()) for d in every]
        return (None, None, *[g.narrow(0, offset, dim)
                              for g, offset, dim in zip(reduced, offsets, ctx.dims)])


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: Any = global_process_set) -> List[torch.Tensor]:
    """Every rank's tensors concatenated along dimension 0, one result per input
    (differentiable)."""
    if not tensors:
        return []
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast with a gradient: the averaged gradient on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: Optional[str],
                process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Any, ...]:
        reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """``root_rank``'s ``tensor`` as a new tensor on every rank (differentiable)."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall with a gradient: the gradient goes back with the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Optional[str],
                process_set: Any) -> Any:
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, *unused: Any) -> Tuple[Any, ...]:
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
             process_set: Any = global_process_set) -> Any:
    """Scatter row blocks of ``tensor`` to the ranks and gather theirs; returns the output, and
    the received splits when ``splits`` is given."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


class HorovodReducescatter(torch.autograd.Function):
    """Reduce-scatter with Horovod's gradient: the allgather of the output's gradient,
    multiplied by the number of ranks for Sum (not divided for Average) and by the pre- and
    postscale factors."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str], op: int,
                process_set: Any, prescale_factor: float,
                postscale_factor: float) -> torch.Tensor:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Any, ...]:
        # Horovod scales the gradient in place; a new tensor leaves autograd's buffer alone.
        grad = grad_output
        if ctx.op == Sum:
            grad = grad * ctx.process_set.size()
        if ctx.prescale_factor != 1.0:
            grad = grad * ctx.prescale_factor
        if ctx.postscale_factor != 1.0:
            grad = grad * ctx.postscale_factor
        return (allgather(grad.contiguous(), process_set=ctx.process_set),
                None, None, None, None, None)


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression: Any = Compression.none, op: int = Average,
                  process_set: Any = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce across ranks and return this rank's block of dimension 0 (differentiable)."""
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Grouped reduce-scatter with Horovod's gradient (as :class:`HorovodReducescatter`'s, per
    tensor, through one grouped allgather)."""

    @staticmethod
    def forward(ctx: Any, name: Optional[str], op: int, process_set: Any,
                prescale_factor: float, postscale_factor: float,
                *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op,
                                                             process_set, prescale_factor,
                                                             postscale_factor)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Any, ...]:
        factor = 1.0
        if ctx.op == Sum:
            factor *= ctx.process_set.size()
        factor *= ctx.prescale_factor * ctx.postscale_factor
        scaled = [(g * factor if factor != 1.0 else g).contiguous() for g in grads]
        return (None, None, None, None, None,
                *grouped_allgather(scaled, process_set=ctx.process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression: Any = Compression.none, op: int = Average,
                          process_set: Any = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reduce each of ``tensors`` across ranks and return this rank's block of each
    (differentiable; ``compression`` per tensor, as Horovod's)."""
    if not tensors:
        return []
    pairs = [compression.compress(t) for t in tensors]
    out = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                            postscale_factor, *[c for c, _ in pairs])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(out, pairs)]
