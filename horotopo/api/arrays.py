"""Collectives on NumPy and CuPy arrays: the ``horotopo`` top-level front end.

Same names, signatures and defaults as ``horovod.torch``; arrays instead of tensors. CuPy
arrays go to the runtime as they are: the engine reduces them on their device, and MPI reads
device memory directly where it is CUDA-aware (else through pinned host slots, chunk by chunk);
results are CuPy arrays on the same device. Nothing is copied to the host here.
"""
from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..buffers import array_module, is_device_array
from .process_sets import check_process_set, global_process_set
from .state import runtime, unnamed
from .handles import HandleTable
from .errors import HorovodInternalError
from .ops import Adasum, check_adasum, check_op, handle_average_backwards_compatibility
from .runtime import ALLGATHER, ALLREDUCE, BARRIER, BROADCAST, SUPPORTED_DTYPES, dtype_name
from .records import ALLTOALL, BARRIER_NAME, JOIN, JOIN_NAME, REDUCESCATTER

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast",
           "broadcast_", "broadcast_async", "broadcast_async_", "barrier", "poll", "synchronize",
           "join", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
           "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
           "grouped_reducescatter_async", "group_names", "set_root",
           "handles"]

handles = HandleTable()
poll = handles.poll
synchronize = handles.synchronize



def require_supported_dtype(arr: np.ndarray, what: Optional[str] = None) -> None:
    if dtype_name(arr.dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"Tensor type {what or arr.dtype} is not supported.")


class _Staged(NamedTuple):
    """One array as the runtime takes it: the input it reads, the output it writes (the input
    itself in place) and the device (-1: host)."""
    array: Any
    output: Any
    device: int


def _stage(x: Any, inplace: bool) -> _Staged:
    """The runtime's view of ``x``: a NumPy or CuPy array (never a host copy of a device one)."""
    if is_device_array(x):
        if inplace and not x.flags.c_contiguous:
            raise ValueError("Tensor is required to be contiguous.")
        require_supported_dtype(x, str(x.dtype))
        with x.device:
            arr = x if x.flags.c_contiguous else x.copy()  # copy(): C order, on the device
            out = arr if inplace else array_module(arr).empty_like(arr)
        return _Staged(arr, out, int(x.device.id))
    if inplace:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"in-place collectives need a NumPy or CuPy array, got "
                            f"{type(x).__name__}")
        if not x.flags.c_contiguous:
            raise ValueError("Tensor is required to be contiguous.")
    arr = x if (isinstance(x, np.ndarray) and x.flags.c_contiguous) else np.ascontiguousarray(x)
    require_supported_dtype(arr)
    return _Staged(arr, arr if inplace else np.empty_like(arr), -1)


def call_device(devices: Sequence[int]) -> int:
    """The one device of a call's tensors (-1: host); ValueError when they are on several."""
    devices = set(devices)
    if len(devices) > 1:
        raise ValueError(f"the tensors of one call are on different devices "
                         f"{sorted(devices)} (-1: CPU): a grouped call needs all on one")
    return devices.pop() if devices else -1


def ready_hook(device: int, last: Any) -> Optional[Callable[[], None]]:
    """For device tensors, an event recorded now on the caller's stream (after the work that
    writes them), which the runtime's thread waits on; None on the host."""
    if device < 0:
        return None
    from .. import gpu

    return gpu.record_ready(last)


def _reduce(tensors: Sequence[Any], inplace: bool, name: Optional[str], op: int,
            prescale_factor: float, postscale_factor: float, grouped: bool,
            process_set: Any) -> int:
    rt = runtime()
    pset, _ = check_process_set(process_set, "Allreduce")
    staged = [_stage(t, inplace) for t in tensors]
    dev = call_device([s.device for s in staged])
    if op == Adasum and pset:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    check_adasum(op, rt.size, dev, [s.array.dtype.name for s in staged])
    call = None
    if grouped:
        base = name or unnamed("grouped_allreduce", pset)
        names, call = group_names(base, len(tensors)), (base, len(tensors))
    else:
        names = [name or unnamed("allreduce", pset)]
    items = [(n, s.array, s.output) for n, s in zip(names, staged)]
    hid = rt.enqueue(ALLREDUCE, items, op=op, prescale=prescale_factor,
                     postscale=postscale_factor, device=dev,
                     ready=ready_hook(dev, staged[-1].array if staged else None), pset=pset,
                     call=call)
    if grouped:
        return handles.add(hid, lambda res: list(res))
    return handles.add(hid, lambda res: res[0])


def allreduce_async(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: Any = global_process_set) -> int:
    """Start an allreduce of ``tensor`` (not modified); return a handle.

    The reduction is keyed by ``name`` (auto-generated if None); dtype and shape must agree on
    all ranks for a name. ``op`` defaults to Average; ``average`` is Horovod's deprecated flag.
    """
    op = check_op(handle_average_backwards_compatibility(op, average), adasum=True)
    return _reduce([tensor], False, name, op, prescale_factor, postscale_factor, False,
                   process_set)


def allreduce(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = None, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: Any = global_process_set) -> Any:
    """Allreduce ``tensor`` and return the result as a new array (``compression`` is applied
    only by the torch front end; it is accepted here for signature compatibility)."""
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                       postscale_factor, process_set))


def allreduce_async_(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: Any = global_process_set) -> int:
    """In-place allreduce of ``tensor``; return a handle."""
    op = check_op(handle_average_backwards_compatibility(op, average), adasum=True)
    return _reduce([tensor], True, name, op, prescale_factor, postscale_factor, False,
                   process_set)


def allreduce_(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: Any = global_process_set) -> Any:
    """In-place allreduce of ``tensor``; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors: Sequence[Any], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = global_process_set) -> int:
    """Start allreduces of a list of arrays as one unit (fused together); return a handle."""
    op = check_op(handle_average_backwards_compatibility(op, average), adasum=True)
    return _reduce(list(tensors), False, name, op, prescale_factor, postscale_factor, True,
                   process_set)


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: Any = None,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: Any = global_process_set) -> List[Any]:
    """Allreduce each array of ``tensors``; return the list of results."""
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set))


def grouped_allreduce_async_(tensors: Sequence[Any], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = global_process_set) -> int:
    """In-place grouped allreduce; return a handle."""
    op = check_op(handle_average_backwards_compatibility(op, average), adasum=True)
    return _reduce(list(tensors), True, name, op, prescale_factor, postscale_factor, True,
                   process_set)


def grouped_allreduce_(tensors: Sequence[Any], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> List[Any]:
    """In-place grouped allreduce; returns the arrays."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def group_names(base: str, count: int) -> List[str]:
    """The names of a grouped call's tensors: each is negotiated under its own name."""
    return [f"{base}.{i}of{count}" for i in range(count)]


def allgather_async(tensor: Any, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (which may differ)."""
    pset, _ = check_process_set(process_set, "Allgather")
    s = _stage(tensor, False)
    hid = runtime().enqueue(ALLGATHER, [(name or unnamed("allgather", pset), s.array, None)],
                            device=s.device, ready=ready_hook(s.device, s.array), pset=pset)
    return handles.add(hid, lambda res: res[0])


def grouped_allgather_async(tensors: Sequence[Any], name: Optional[str] = None,
                            process_set: Any = global_process_set) -> int:
    """Start an allgather of each of ``tensors`` as one call; the result is the list of
    concatenations."""
    pset, _ = check_process_set(process_set, "Allgather")
    staged = [_stage(t, False) for t in tensors]
    dev = call_device([s.device for s in staged])
    base = name or unnamed("grouped_allgather", pset)
    names = group_names(base, len(staged))
    last = staged[-1].array if staged else None
    hid = runtime().enqueue(ALLGATHER, [(n, s.array, None) for n, s in zip(names, staged)],
                            device=dev, ready=ready_hook(dev, last), pset=pset,
                            call=(base, len(staged)))
    return handles.add(hid, lambda res: list(res))


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: Any = global_process_set) -> List[Any]:
    """The allgather of each of ``tensors`` (see :func:`grouped_allgather_async`)."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def allgather(tensor: Any, name: Optional[str] = None,
              process_set: Any = global_process_set) -> Any:
    """Concatenation of every rank's ``tensor`` along dimension 0, in rank order."""
    return synchronize(allgather_async(tensor, name, process_set))


def set_root(process_set: Any, root_rank: int) -> Tuple[int, int]:
    """``(set id, root)`` of a broadcast: the root is a global rank (Horovod's API), which
    the set's engine and the negotiation count from the set's first rank (as Horovod's root
    rank within the set)."""
    pset, ranks = check_process_set(process_set, "Broadcast")
    root = int(root_rank)
    if pset:
        if root not in ranks:
            raise ValueError(f"broadcast received invalid root rank {root} for provided "
                             f"process set")
        root = ranks.index(root)
    return pset, root


def _bcast(tensor: Any, root_rank: int, name: Optional[str], inplace: bool,
           process_set: Any) -> int:
    pset, root = set_root(process_set, root_rank)
    s = _stage(tensor, inplace)
    hid = runtime().enqueue(BROADCAST, [(name or unnamed("broadcast", pset), s.array, s.output)],
                            root=root, device=s.device,
                            ready=ready_hook(s.device, s.array), pset=pset)
    return handles.add(hid, lambda res: res[0])


def broadcast_async(tensor: Any, root_rank: int, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> int:
    """Start broadcasting ``root_rank``'s ``tensor`` into a new array on every rank."""
    return _bcast(tensor, root_rank, name, False, process_set)


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: Any = global_process_set) -> Any:
    """``root_rank``'s ``tensor``, as a new array on every rank."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_async_(tensor: Any, root_rank: int, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> int:
    """Start broadcasting ``root_rank``'s ``tensor`` into ``tensor`` on every rank."""
    return _bcast(tensor, root_rank, name, True, process_set)


def broadcast_(tensor: Any, root_rank: int, name: Optional[str] = None,
               process_set: Any = global_process_set) -> Any:
    """Broadcast in place; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def barrier(process_set: Any = global_process_set) -> None:
    """Block until every rank has called barrier()."""
    pset, _ = check_process_set(process_set, "Barrier")
    rt = runtime()
    rt.wait(rt.enqueue(BARRIER, [(BARRIER_NAME, None, None)], pset=pset))


def join(device: int = -1) -> int:
    """Say that this rank has no more data; block until every rank has joined and return the
    last rank to join (Horovod's join).

    Until then this rank takes part in the others' allreduces with zeros (Average still
    divides by the number of ranks) and in their barriers, and their allgathers, broadcasts
    and reducescatters fail on every rank with Horovod's "not supported with Join" errors.
    ``device`` is accepted for Horovod's signature: the zeros go where the others' tensors
    are.
    """
    rt = runtime()
    return int(rt.wait(rt.enqueue(JOIN, [(JOIN_NAME, None, None)], device=int(device)))[0])


def _alltoall_splits(world: int, first: int, splits: Any) -> List[int]:
    if splits is None:
        if first % world:
            raise ValueError(f"alltoall: dimension 0 ({first}) is not divisible by the number "
                             f"of ranks ({world}); pass splits")
        return [first // world] * world
    out = [int(s) for s in np.asarray(splits).reshape(-1).tolist()]
    if len(out) != world or any(s < 0 for s in out) or sum(out) != first:
        raise ValueError(f"alltoall: splits must be {world} non-negative integers summing to "
                         f"dimension 0 ({first}); got {out}")
    return out


def alltoall_async(tensor: Any, splits: Any = None, name: Optional[str] = None,
                   process_set: Any = global_process_set) -> int:
    """Start an alltoall: slice ``splits[r]`` rows of ``tensor`` go to rank ``r``.

    Implemented over two allgathers (of the splits, then of the data), so it moves ``size``
    times the bytes a native MPI_Alltoallv would; correct, not fast.
    """
    pset, ranks = check_process_set(process_set, "Alltoall")
    rt = runtime()
    me, world = ranks.index(rt.rank), len(ranks)
    s = _stage(tensor, False)
    if s.array.ndim == 0:
        raise ValueError("alltoall needs a tensor of rank >= 1")
    mine = _alltoall_splits(world, s.array.shape[0], splits)
    base = name or unnamed("alltoall", pset)
    # One call of two names: rank 0 compares it as a whole with what the others submitted.
    h_splits = rt.enqueue(ALLTOALL, [(f"{base}.splits", np.array(mine, np.int64), None)],
                          pset=pset, call=(base, 2))
    h_data = rt.enqueue(ALLTOALL, [(f"{base}.data", s.array, None)], device=s.device,
                        ready=ready_hook(s.device, s.array), pset=pset, call=(base, 2))

    def finish(got_splits: List[Any], got_data: List[Any]) -> Any:
        every = got_splits[0].reshape(world, world)
        data = got_data[0]
        parts, start = [], 0
        for r in range(world):
            offset = start + int(every[r, :me].sum())
            parts.append(data[offset:offset + int(every[r, me])])
            start += int(every[r].sum())
        received = every[:, me].astype(np.int32)
        return array_module(data).concatenate(parts, axis=0), received

    return handles.add(rt.next_id(), finish, waits=(h_splits, h_data))


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None,
             process_set: Any = global_process_set) -> Any:
    """Alltoall; returns ``(output, received_splits)`` when ``splits`` is given, else output."""
    out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


def _reducescatter(tensors: Sequence[Any], name: str, op: int, process_set: Any,
                   prescale_factor: float, postscale_factor: float,
                   names: Sequence[str]) -> Tuple[int, Callable[[List[Any]], List[Any]]]:
    """Enqueue the allreduces of a (grouped) reduce-scatter as one call; return its handle and
    the function that cuts this rank's block from each result."""
    pset, ranks = check_process_set(process_set, "Reducescatter")
    if op == Adasum:
        # Horovod's words (its reducescatter takes Average and Sum; Min, Max and Product run
        # here as an extension, since the allreduce beneath takes them).
        raise HorovodInternalError("Reducescatter currently only supports AVERAGE and SUM.")
    op = check_op(op)
    staged = [_stage(t, False) for t in tensors]
    if any(s.array.ndim == 0 for s in staged):
        raise ValueError(f"{name} needs tensors of rank >= 1")
    dev = call_device([s.device for s in staged])
    rt = runtime()
    world, me = len(ranks), ranks.index(rt.rank)
    blocks = []
    for s in staged:
        rows = s.array.shape[0]
        counts = [rows // world + (1 if r < rows % world else 0) for r in range(world)]
        blocks.append((sum(counts[:me]), counts[me]))
    last = staged[-1].array if staged else None
    hid = rt.enqueue(REDUCESCATTER, [(n, s.array, s.output) for n, s in zip(names, staged)],
                     op=op, prescale=prescale_factor, postscale=postscale_factor, device=dev,
                     ready=ready_hook(dev, last), pset=pset,
                     # a grouped call's names are group_names(base): its key is the base
                     call=(names[0].rsplit(".", 1)[0], len(names)) if len(names) > 1 else None)
    # Rows [start, start + count) of a C-contiguous result are already contiguous.
    return hid, lambda res: [out[start:start + count] for out, (start, count) in zip(res, blocks)]


def reducescatter_async(tensor: Any, name: Optional[str] = None, op: int = 0,
                        process_set: Any = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reduce-scatter along dimension 0 (rank r keeps rows of block r).

    Implemented as a tree allreduce followed by a local slice: the same result as Horovod's,
    at the cost of a full allreduce. Blocks follow Horovod: the first ``rows % size`` ranks get
    one extra row.
    """
    hid, cut = _reducescatter([tensor], "reducescatter", op, process_set, prescale_factor,
                              postscale_factor, [name or unnamed("reducescatter", process_set)])
    return handles.add(hid, lambda res: cut(res)[0])


def grouped_reducescatter_async(tensors: Sequence[Any], name: Optional[str] = None, op: int = 0,
                                process_set: Any = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reduce-scatter of each of ``tensors`` as one call (their allreduces fuse); the
    result is the list of this rank's blocks."""
    names = group_names(name or unnamed("grouped_reducescatter", process_set), len(tensors))
    hid, cut = _reducescatter(tensors, "grouped_reducescatter", op, process_set,
                              prescale_factor, postscale_factor, names)
    return handles.add(hid, cut)


def grouped_reducescatter(tensors: Sequence[Any], name: Optional[str] = None,
                          compression: Any = None, op: int = 0,
                          process_set: Any = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[Any]:
    """This rank's block of each of ``tensors`` reduced across ranks."""
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set,
                                                   prescale_factor, postscale_factor))


def reducescatter(tensor: Any, name: Optional[str] = None, compression: Any = None,
                  op: int = 0, process_set: Any = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """Reduce across ranks and return this rank's block of dimension 0."""
    return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                           postscale_factor))
