"""The collectives on torch tensors as handles: start one (``*_async``), then
:func:`synchronize` it; Horovod's in-place forms (``allreduce_``...) are a start and a wait.

The differentiable forms (``allreduce``, ``allgather``...) are in :mod:`horotopo.torch.mpi_ops`;
how a tensor becomes the runtime's array, in :mod:`horotopo.torch.tensors`.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from ..api import arrays
from ..api.basics import runtime, size, unnamed
from ..api.process_sets import check_process_set, global_process_set
from ..api.handles import HandleTable
from ..api.ops import (Adasum, Average, check_adasum, check_op,
                       handle_average_backwards_compatibility)
from ..api.runtime import ALLGATHER, ALLREDUCE, BROADCAST
from .tensors import array_of, call_ready, check_tensor, device_of, settled, stage, tensor_of

__all__ = ["allreduce_async", "allreduce_async_", "allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "grouped_allreduce_", "sparse_allreduce_async",
           "SparseAllreduceHandle", "allgather_async", "grouped_allgather_async",
           "broadcast_async", "broadcast_async_", "broadcast_", "alltoall_async",
           "reducescatter_async", "grouped_reducescatter_async", "barrier", "join", "poll",
           "synchronize"]

# The handles of the torch ops: their results are tensors, built when synchronize() collects
# the runtime's arrays.
_handles = HandleTable()


def _allreduce_async(tensors: Sequence[torch.Tensor], inplace: bool, name: Optional[str],
                     op: int, prescale_factor: float, postscale_factor: float,
                     grouped: bool, process_set: Any) -> int:
    """Enqueue one allreduce per tensor (as one grouped unit when ``grouped``); the handle's
    result is the reduced tensor, or the list of them when ``grouped``."""
    pset, _ = check_process_set(process_set, "Allreduce")
    op = check_op(op, adasum=True)
    if op == Adasum and pset:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    staged = [stage(t, inplace, True) for t in tensors]
    check_adasum(op, size(), arrays.call_device([device_of(t) for t in tensors]),
                 [inp.dtype.name for inp, _, _ in staged])
    call = None
    if grouped:
        base = name or unnamed("grouped_allreduce", pset)
        names, call = arrays.group_names(base, len(tensors)), (base, len(tensors))
    else:
        names = [name or unnamed("allreduce", pset)]
    items = [(n, inp, out) for n, (inp, out, _) in zip(names, staged)]
    dev, ready = call_ready(tensors)
    hid = runtime().enqueue(ALLREDUCE, items, op=op, prescale=prescale_factor,
                            postscale=postscale_factor, device=dev, ready=ready, pset=pset,
                            call=call)
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
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async([tensor], False, name, op, prescale_factor, postscale_factor, False,
                            process_set)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = global_process_set) -> int:
    """Start an in-place allreduce of ``tensor``; return a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async([tensor], True, name, op, prescale_factor, postscale_factor, False,
                            process_set)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: Any = global_process_set) -> torch.Tensor:
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = global_process_set) -> int:
    """Start allreduces of ``tensors`` as one unit (submitted together, fused together)."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(list(tensors), False, name, op, prescale_factor, postscale_factor,
                            True, process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = global_process_set) -> int:
    """In-place grouped allreduce; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(list(tensors), True, name, op, prescale_factor, postscale_factor,
                            True, process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> List[torch.Tensor]:
    """In-place grouped allreduce; returns the tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class SparseAllreduceHandle:
    """Horovod's handle of :func:`sparse_allreduce_async`: calling it waits for the two
    allgathers and returns the reduced sparse tensor (Horovod's optimizer calls it);
    :func:`synchronize` and :func:`poll` take it too."""

    __slots__ = ("hid",)

    def __init__(self, hid: int) -> None:
        self.hid = hid

    def __call__(self) -> torch.Tensor:
        return _handles.synchronize(self.hid)

    def __repr__(self) -> str:
        return f"SparseAllreduceHandle({self.hid})"


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: Any = global_process_set) -> SparseAllreduceHandle:
    """Allreduce a sparse COO tensor by allgathering its indices and values (Horovod's way).

    Returns a callable handle: ``handle()`` (or ``synchronize(handle)``) waits and returns the
    sparse sum (divided by the number of ranks for Average), with duplicate indices left
    uncoalesced as Horovod leaves them.
    """
    _, ranks = check_process_set(process_set, "Allgather")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    h_idx = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices",
                            process_set=process_set)
    h_val = allgather_async(t._values(), name=f"{name}.values", process_set=process_set)
    _, idx_finish = _handles.take(h_idx)
    _, val_finish = _handles.take(h_val)

    def finish(got_idx: List[Any], got_val: List[Any]) -> torch.Tensor:
        indices, values = idx_finish(got_idx), val_finish(got_val)
        if op == Average:
            values = values / len(ranks)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                       check_invariants=True)

    return SparseAllreduceHandle(_handles.add(runtime().next_id(), finish,
                                              waits=(h_idx, h_val)))


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (sizes may differ)."""
    pset, _ = check_process_set(process_set, "Allgather")
    check_tensor(tensor)
    inp = array_of(tensor, False)
    dev, ready = call_ready([tensor])
    hid = runtime().enqueue(ALLGATHER, [(name or unnamed("allgather", pset), inp, None)],
                            device=dev, ready=ready, pset=pset)
    return _handles.add(hid, lambda res: tensor_of(res[0], tensor, False))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: Any = global_process_set) -> int:
    """Start an allgather of each of ``tensors`` as one call; the handle's result is the list
    of concatenations (Horovod's grouped_allgather_async)."""
    tensors = [check_tensor(t) for t in tensors]
    hid = arrays.grouped_allgather_async([settled(array_of(t, False), t) for t in tensors],
                                          name, process_set)
    entry = arrays.handles.take(hid)
    return _handles.add(hid, lambda *res: [tensor_of(a, t, False)
                                           for a, t in zip(entry[1](*res), tensors)],
                        waits=entry[0])


def _broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str],
                     inplace: bool, process_set: Any) -> int:
    pset, root = arrays.set_root(process_set, root_rank)
    inp, out, finish = stage(tensor, inplace, False)
    dev, ready = call_ready([tensor])
    hid = runtime().enqueue(BROADCAST, [(name or unnamed("broadcast", pset), inp, out)],
                            root=root, device=dev, ready=ready, pset=pset)
    return _handles.add(hid, lambda res: finish(res[0]))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> int:
    """Start broadcasting ``root_rank``'s ``tensor`` into a new tensor on every rank."""
    return _broadcast_async(tensor, root_rank, name, False, process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> int:
    """Start broadcasting ``root_rank``'s ``tensor`` into ``tensor`` on every rank."""
    return _broadcast_async(tensor, root_rank, name, True, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Broadcast in place; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: Any = global_process_set) -> int:
    """Start an alltoall (see :func:`horotopo.api.arrays.alltoall_async` for how it runs)."""
    check_tensor(tensor)
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    hid = arrays.alltoall_async(settled(array_of(tensor, False), tensor), splits, name,
                                 process_set)
    entry = arrays.handles.take(hid)

    def finish(*results: List[Any]) -> Tuple[torch.Tensor, torch.Tensor]:
        out, received = entry[1](*results)
        return tensor_of(out, tensor, False), torch.from_numpy(received)

    return _handles.add(hid, finish, waits=entry[0])


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = Average,
                        process_set: Any = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reduce-scatter along dimension 0 (a full allreduce, then this rank's block)."""
    check_tensor(tensor)
    hid = arrays.reducescatter_async(settled(array_of(tensor, True), tensor), name, op,
                                      process_set,
                                      prescale_factor, postscale_factor)
    entry = arrays.handles.take(hid)
    return _handles.add(hid, lambda *res: tensor_of(entry[1](*res), tensor, True), waits=entry[0])


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                                op: int = Average, process_set: Any = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reduce-scatter of each of ``tensors`` as one call (fused); the handle's result
    is the list of this rank's blocks (Horovod's grouped_reducescatter_async)."""
    tensors = [check_tensor(t) for t in tensors]
    hid = arrays.grouped_reducescatter_async(
        [settled(array_of(t, True), t) for t in tensors], name, op, process_set,
        prescale_factor, postscale_factor)
    entry = arrays.handles.take(hid)
    return _handles.add(hid, lambda *res: [tensor_of(a, t, True)
                                           for a, t in zip(entry[1](*res), tensors)],
                        waits=entry[0])


def barrier(process_set: Any = global_process_set) -> None:
    """Block until every rank has called barrier()."""
    arrays.barrier(process_set)


def join(device: int = -1) -> int:
    """Block until every rank has joined; return the last rank to join (see
    :func:`horotopo.api.arrays.join`: meanwhile this rank sends zeros to the others'
    allreduces, such as a DistributedOptimizer's)."""
    return arrays.join(device)


def poll(handle: Any) -> bool:
    """True once the op behind ``handle`` completed (synchronize() will not block)."""
    if isinstance(handle, SparseAllreduceHandle):
        return _handles.poll(handle.hid)
    return _handles.poll(handle)


def synchronize(handle: Any) -> Any:
    """Wait for ``handle`` and return the op's output tensor (or tuple of them); a callable
    handle (:func:`sparse_allreduce_async`'s) is called.

    Raises
    ------
    HorovodInternalError
        The op failed on every rank (for example a shape mismatch across ranks).
    """
    if callable(handle):
        return handle()
    return _handles.synchronize(handle)


def forget_handles() -> None:
    """Drop every handle of an earlier run: init() and shutdown() start the table afresh."""
    _handles.clear()
