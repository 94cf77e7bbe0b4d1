"""Collectives on torch tensors, with the names, signatures and autograd of ``horovod.torch``.

Tensors are handed to the runtime as views of their own memory, NumPy arrays for CPU tensors
and CuPy arrays for CUDA ones (zero-copy, through ``__cuda_array_interface__``), so in-place ops
write straight into the tensor and out-of-place ops into a fresh tensor; a CUDA tensor never
passes through host memory here (the engine stages chunks through pinned memory only when MPI
is not CUDA-aware). bfloat16 moves bit-exactly (as int16) for broadcast and allgather; it is
reduced in bfloat16 on the device where CuPy has the dtype, and through a float32 copy (on the
tensor's device) elsewhere.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..api import arrays as _arrays
from ..api.basics import check_process_set, global_process_set, rank, runtime, size, unnamed
from ..api.handles import HandleTable
from ..api.ops import Average, check_op, handle_average_backwards_compatibility
from ..api.runtime import ALLGATHER, ALLREDUCE, BROADCAST
from .compression import Compression

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
           "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join", "poll",
           "synchronize", "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
           "HorovodBroadcast", "HorovodAlltoall", "HorovodReducescatter"]

_handles = HandleTable()

_SUPPORTED = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.float32, torch.float64, torch.bool, torch.bfloat16}


def _device(t: torch.Tensor) -> int:
    return -1 if t.device.type == "cpu" else int(t.device.index or 0)


def _check(t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _SUPPORTED:
        raise ValueError(f"Tensor type {t.type()} is not supported.")
    return t


def _shares_memory(t: torch.Tensor, reduced: bool) -> bool:
    """True when the runtime's array for ``t`` (:func:`_array_of`) is a view of ``t`` itself."""
    if t.dtype != torch.bfloat16:
        return True
    return t.is_cuda and reduced and _gpu().cupy_bfloat16() is not None


def _gpu() -> Any:
    from .. import gpu

    return gpu


def _array_of(t: torch.Tensor, reduced: bool) -> Any:
    """The array the runtime works on for ``t``: a NumPy (CPU) or CuPy (CUDA) view of its
    data, or, for bfloat16 reductions without bfloat16 arrays, a float32 copy on its device.

    Not a view only where :func:`_shares_memory` says so; such a copy is never the caller's
    memory, since the runtime may write into its input.
    """
    src = t.detach()
    if t.is_cuda:
        if src.dtype == torch.bfloat16 and not _shares_memory(t, reduced):
            src = src.to(torch.float32) if reduced else src.view(torch.int16)
        return _gpu().as_cupy_array(src.contiguous())
    if _shares_memory(t, reduced):
        return src.contiguous().numpy()
    src = src.contiguous()
    src = src.to(torch.float32) if reduced else src.view(torch.int16).clone()
    return src.numpy()


def _back(arr: Any, like: torch.Tensor, reduced: bool) -> torch.Tensor:
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


def _stage(t: torch.Tensor, inplace: bool, reduced: bool) \
        -> Tuple[Any, Any, Callable[[Any], torch.Tensor]]:
    """Input, output and result-builder for an allreduce or broadcast of ``t``."""
    _check(t)
    if inplace and not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    inp = _array_of(t, reduced)
    if _shares_memory(t, reduced):
        if inplace:
            return inp, inp, lambda _res: t
        result = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return inp, _array_of(result, reduced), lambda _res: result
    if inplace:
        def put_back(res: Any) -> torch.Tensor:
            with torch.no_grad():
                t.copy_(_back(res, t, reduced))
            return t
        return inp, inp, put_back
    return inp, inp, lambda res: _back(res, t, reduced)


def _settled(arr: Any, t: torch.Tensor) -> Any:
    """``arr`` once torch's stream has written it: the array front end that takes it records
    its ready event on CuPy's stream, which need not be torch's."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return arr


def _ready(tensors: Sequence[torch.Tensor]) -> Tuple[int, Any]:
    """The call's device and, for CUDA tensors, the event the runtime waits on (recorded on
    torch's current stream after the staging copies above)."""
    dev = _arrays.call_device([_device(t) for t in tensors])
    return dev, _arrays.ready_hook(dev, tensors[-1] if tensors else None)


def _allreduce_async(tensors: Sequence[torch.Tensor], inplace: bool, name: Optional[str],
                     op: int, prescale_factor: float, postscale_factor: float,
                     grouped: bool) -> int:
    op = check_op(op)
    staged = [_stage(t, inplace, True) for t in tensors]
    if grouped:
        base = name or unnamed("grouped_allreduce")
        names = [f"{base}.{i}of{len(tensors)}" for i in range(len(tensors))]
    else:
        names = [name or unnamed("allreduce")]
    items = [(n, inp, out) for n, (inp, out, _) in zip(names, staged)]
    dev, ready = _ready(tensors)
    hid = runtime().enqueue(ALLREDUCE, items, op=op, prescale=prescale_factor,
                            postscale=postscale_factor, device=dev, ready=ready)
    finish = [f for _, _, f in staged]
    if grouped:
        return _handles.add(hid, lambda res: [f(r) for f, r in zip(finish, res)])
    return _handles.add(hid, lambda res: finish[0](res[0]))


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = global_process_set) -> int:
    """Start averaging (or reducing with ``op``) ``tensor`` over all ranks; return a handle.

    The input is not modified. The reduction is keyed by ``name`` (auto-generated when None);
    dtype and shape must match on all ranks for a given name. ``op`` defaults to Average;
    ``average`` is Horovod's deprecated flag and may not be combined with ``op``.
    """
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async([tensor], False, name, op, prescale_factor, postscale_factor, False)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = global_process_set) -> int:
    """Start an in-place allreduce of ``tensor``; return a handle."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async([tensor], True, name, op, prescale_factor, postscale_factor, False)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: Any = global_process_set) -> torch.Tensor:
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


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


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = global_process_set) -> int:
    """Start allreduces of ``tensors`` as one unit (submitted together, fused together)."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(list(tensors), False, name, op, prescale_factor, postscale_factor,
                            True)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = global_process_set) -> int:
    """In-place grouped allreduce; returns a handle."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(list(tensors), True, name, op, prescale_factor, postscale_factor,
                            True)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> List[torch.Tensor]:
    """In-place grouped allreduce; returns the tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


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


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: Any = global_process_set) -> int:
    """Allreduce a sparse COO tensor by allgathering its indices and values (Horovod's way)."""
    check_process_set(process_set)
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    h_idx = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices")
    h_val = allgather_async(t._values(), name=f"{name}.values")
    idx_finish = _handles._entries[h_idx][1]
    val_finish = _handles._entries[h_val][1]
    with _handles._lock:
        del _handles._entries[h_idx], _handles._entries[h_val]

    def finish(got_idx: List[Any], got_val: List[Any]) -> torch.Tensor:
        indices, values = idx_finish(got_idx), val_finish(got_val)
        if op == Average:
            values = values / size()
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                       check_invariants=True)

    return _handles.add(runtime().next_id(), finish, waits=(h_idx, h_val))


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (sizes may differ)."""
    check_process_set(process_set)
    _check(tensor)
    inp = _array_of(tensor, False)
    dev, ready = _ready([tensor])
    hid = runtime().enqueue(ALLGATHER, [(name or unnamed("allgather"), inp, None)],
                            device=dev, ready=ready)
    return _handles.add(hid, lambda res: _back(res[0], tensor, False))


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
        offset = int(dims[:rank()].sum().item())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0 in rank order (differentiable)."""
    return HorovodAllgather.apply(tensor, name, process_set)


def _broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str],
                     inplace: bool) -> int:
    inp, out, finish = _stage(tensor, inplace, False)
    dev, ready = _ready([tensor])
    hid = runtime().enqueue(BROADCAST, [(name or unnamed("broadcast"), inp, out)],
                            root=int(root_rank), device=dev, ready=ready)
    return _handles.add(hid, lambda res: finish(res[0]))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> int:
    """Start broadcasting ``root_rank``'s ``tensor`` into a new tensor on every rank."""
    check_process_set(process_set)
    return _broadcast_async(tensor, root_rank, name, False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> int:
    """Start broadcasting ``root_rank``'s ``tensor`` into ``tensor`` on every rank."""
    check_process_set(process_set)
    return _broadcast_async(tensor, root_rank, name, True)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Broadcast in place; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


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


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: Any = global_process_set) -> int:
    """Start an alltoall (see :func:`horotopo.api.arrays.alltoall_async` for how it runs)."""
    _check(tensor)
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    hid = _arrays.alltoall_async(_settled(_array_of(tensor, False), tensor), splits, name,
                                 process_set)
    entry = _arrays.handles._entries.pop(hid)

    def finish(*results: List[Any]) -> Tuple[torch.Tensor, torch.Tensor]:
        out, received = entry[1](*results)
        return _back(out, tensor, False), torch.from_numpy(received)

    return _handles.add(hid, finish, waits=entry[0])


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


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = Average,
                        process_set: Any = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reduce-scatter along dimension 0 (a full allreduce, then this rank's block)."""
    _check(tensor)
    hid = _arrays.reducescatter_async(_settled(_array_of(tensor, True), tensor), name, op,
                                      process_set,
                                      prescale_factor, postscale_factor)
    entry = _arrays.handles._entries.pop(hid)
    return _handles.add(hid, lambda *res: _back(entry[1](*res), tensor, True), waits=entry[0])


class HorovodReducescatter(torch.autograd.Function):
    """Reduce-scatter with a gradient: the gradients are allgathered (divided by size for
    Average)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str], op: int,
                process_set: Any, prescale_factor: float,
                postscale_factor: float) -> torch.Tensor:
        ctx.op = op
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Any, ...]:
        grad = allgather(grad_output.contiguous())
        if ctx.op == Average:
            grad = grad / size()
        return grad, None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression: Any = Compression.none, op: int = Average,
                  process_set: Any = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce across ranks and return this rank's block of dimension 0 (differentiable)."""
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


def barrier(process_set: Any = global_process_set) -> None:
    """Block until every rank has called barrier()."""
    _arrays.barrier(process_set)


def join(device: int = -1) -> int:
    """Not implemented: raises NotImplementedError (see the README)."""
    raise NotImplementedError(_arrays.JOIN_UNSUPPORTED)


def poll(handle: int) -> bool:
    """True once the op behind ``handle`` completed (synchronize() will not block)."""
    return _handles.poll(handle)


def synchronize(handle: int) -> Any:
    """Wait for ``handle`` and return the op's output tensor (or tuple of them).

    Raises
    ------
    HorovodInternalError
        The op failed on every rank (for example a shape mismatch across ranks).
    """
    return _handles.synchronize(handle)


def _reset() -> None:
    _handles.clear()


