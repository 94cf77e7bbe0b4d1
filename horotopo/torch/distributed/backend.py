"""The "horotopo" process group: torch.distributed's collectives on horotopo's runtime.

Every operation starts one or more of :mod:`horotopo.torch`'s asynchronous ops (so it shares
the job's one probe and plan, background thread, fusion, response cache and watchdog with
``hvd.*`` calls) and returns a :class:`~.completion.HorotopoWork` whose future the completer
thread fills. The runtime matches ops across ranks by name; torch.distributed's ranks issue
a group's collectives in the same order, so an op is named after its group and its place in
that order (``torch.pg<k>.<seq>``). The name does not say which collective it is, so ranks
that disagree on the dtype or shape, or run different collectives, at one place fail together
with the runtime's mismatch errors instead of waiting for each other under different names.

``send``/``recv`` (and ``recv(src=None)``) are point-to-point messages over the engine's
transport, on tags that no collective uses (:mod:`.p2p`).

Reduce-scatter runs as horotopo's reduce-scatter (a tree allreduce, then this rank's block),
all-to-all as horotopo's (two allgathers): correct, not fast.
"""
from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from typing import Any, Callable, List, Sequence

import torch
import torch.distributed as dist

from ...api.basics import rank as hvd_rank, runtime, size as hvd_size
from ...api.ops import Average, Max, Min, Product, Sum
from ...api.runtime import BARRIER
from .. import collectives as hvd_ops
from .completion import HorotopoWork, submit
from .launch import check_ranks, mpi_size_before_init, refuse_torchrun
from .p2p import PointToPoint

__all__ = ["BACKEND_NAME", "ProcessGroupHorotopo", "create_process_group", "hvd_op",
           "UNSUPPORTED_OPS"]

BACKEND_NAME = "horotopo"

_RedOp = dist.ReduceOp.RedOpType
_OPS = {_RedOp.SUM: Sum, _RedOp.AVG: Average, _RedOp.MIN: Min, _RedOp.MAX: Max,
        _RedOp.PRODUCT: Product}

#: The torch.distributed operations this backend does not run, and why (each raises).
UNSUPPORTED_OPS = {
    "gather": "not a horotopo collective (all_gather gives every rank the result)",
    "scatter": "not a horotopo collective (broadcast, or all_to_all_single, can replace it)",
    "reduce": "not a horotopo collective (all_reduce gives every rank the result)",
    "alltoall": "only the single-tensor form (all_to_all_single) is a horotopo collective",
    "allgather_coalesced": "only all_gather and all_gather_into_tensor are horotopo "
                           "collectives",
}

_group_ids = itertools.count()
#: send/recv's wait for the peer in a group made without torch's timeout (torch's default).
_P2P_TIMEOUT = timedelta(minutes=30)


def hvd_op(op: Any) -> int:
    """horotopo's op for a torch ``ReduceOp`` (SUM, AVG, MIN, MAX, PRODUCT).

    Raises
    ------
    ValueError
        For BAND, BOR, BXOR and PREMUL_SUM, naming the op.
    """
    kind = op if isinstance(op, _RedOp) else op.op  # a RedOpType, or a ReduceOp holding one
    try:
        return _OPS[kind]
    except KeyError:
        what = getattr(kind, "name", kind)
        raise ValueError(f"the horotopo backend has no reduction {what}: it reduces with SUM, "
                         f"AVG, MIN, MAX and PRODUCT") from None


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"the horotopo backend does not implement {what}: "
                               f"{UNSUPPORTED_OPS[what]}. Run it on a gloo group "
                               f"(dist.new_group(backend='gloo')) next to this one.")


def _one(tensors: Sequence[Any], what: str) -> Any:
    # torch's multi-tensor-per-process forms are from the single-process multi-device days.
    if len(tensors) != 1:
        raise ValueError(f"the horotopo backend's {what} takes one tensor per process, got "
                         f"{len(tensors)}")
    return tensors[0]


def _after(works: Sequence[HorotopoWork], value: Any) -> Any:
    """``value`` once every one of ``works`` is done (raising the first one's error).

    Runs on the completer, which takes futures in submission order: ``works`` were submitted
    before the work that waits for them, so their futures are complete by then.
    """
    for w in works:
        w.wait()
    return value


class ProcessGroupHorotopo(dist.ProcessGroup):
    """torch.distributed's process group over all of horotopo's ranks.

    Created by ``dist.init_process_group("horotopo")`` (or ``dist.new_group(backend=
    "horotopo")`` over every rank) once :mod:`horotopo.torch.distributed` is imported.
    """

    def __init__(self, rank: int, size: int, timeout: timedelta = _P2P_TIMEOUT) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._group_name = self._group_desc = ""
        index = next(_group_ids)
        self._tag = f"torch.pg{index}"
        self._p2p = PointToPoint(index, rank, size, timeout.total_seconds())
        self._seq = itertools.count()
        self._seq_lock = threading.Lock()  # DDP may start collectives from autograd threads

    # ------------------------------------------------------------------ identity

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def getRank(self) -> int:  # noqa: N802
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        return self._size

    # torch names every group (DeviceMesh looks groups up by name); a Python group keeps
    # its own, since the base class stores them in backends this group does not have.
    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def abort(self) -> None:
        """Nothing to release: horotopo's runtime outlives its process groups."""

    def shutdown(self) -> None:
        """Nothing to release: ``hvd.shutdown()`` (or exit) stops horotopo's runtime."""

    def _name(self) -> str:
        with self._seq_lock:
            return f"{self._tag}.{next(self._seq)}"

    @staticmethod
    def _work(wait: Callable[[], Any]) -> HorotopoWork:
        return HorotopoWork(submit(wait))

    # ------------------------------------------------------------------ allreduce

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> HorotopoWork:
        op = hvd_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return self._allreduce(list(tensors), op)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> HorotopoWork:
        op = hvd_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return self._allreduce(list(tensors), op)

    def _allreduce(self, tensors: List[torch.Tensor], op: int) -> HorotopoWork:
        name = self._name()
        if len(tensors) == 1:
            handle = hvd_ops.allreduce_async_(tensors[0], name=name, op=op)
        else:  # one unit: submitted and fused together
            handle = hvd_ops.grouped_allreduce_async_(tensors, name=name, op=op)

        def wait() -> List[torch.Tensor]:
            hvd_ops.synchronize(handle)
            return tensors
        return self._work(wait)

    # ------------------------------------------------------------------ broadcast

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> HorotopoWork:
        root = int(opts.rootRank) if opts is not None else 0
        name = self._name()
        # One tensor (torch's only form today) under the place's own name, so that a rank
        # running another collective at this place meets it under the same name (the runtime's
        # mismatch check) instead of waiting for a name no other rank submits.
        names = [name] if len(tensors) == 1 else [f"{name}.{i}" for i in range(len(tensors))]
        handles = [hvd_ops.broadcast_async_(t, root, name=n) for n, t in zip(names, tensors)]

        def wait() -> List[torch.Tensor]:
            for h in handles:
                hvd_ops.synchronize(h)
            return list(tensors)
        return self._work(wait)

    # ------------------------------------------------------------------ allgather

    def _gather_rows(self, inp: torch.Tensor, name: str) -> int:
        # horotopo concatenates along dimension 0: one row per rank, in rank order. A rank
        # whose tensor has another number of elements fails the shape check on every rank.
        return hvd_ops.allgather_async(inp.reshape(1, -1), name=name)

    def allgather(self, output_tensors: List[List[torch.Tensor]],
                  input_tensors: List[torch.Tensor], opts: Any = None) -> HorotopoWork:
        inp = _one(input_tensors, "all_gather")
        outs = _one(output_tensors, "all_gather")
        if len(outs) != self._size or any(o.numel() != inp.numel() for o in outs):
            raise ValueError(f"all_gather needs {self._size} output tensors of "
                             f"{inp.numel()} elements each (the input's)")
        handle = self._gather_rows(inp, self._name())

        def wait() -> List[List[torch.Tensor]]:
            rows = hvd_ops.synchronize(handle)
            with torch.no_grad():
                for out, row in zip(outs, rows):
                    out.copy_(row.view(out.shape))
            return output_tensors
        return self._work(wait)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor,
                          opts: Any = None) -> HorotopoWork:
        if output.numel() != self._size * inp.numel():
            raise ValueError(f"all_gather_into_tensor needs an output of {self._size} x "
                             f"{inp.numel()} elements, got {output.numel()}")
        handle = self._gather_rows(inp, self._name())

        def wait() -> torch.Tensor:
            rows = hvd_ops.synchronize(handle)
            with torch.no_grad():
                output.copy_(rows.view(output.shape))
            return output
        return self._work(wait)

    _allgather_base = all_gather_single  # torch < 2.10's name

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor],
                                    inputs: List[torch.Tensor],
                                    opts: Any = None) -> HorotopoWork:
        works = [self.all_gather_single(o, i) for o, i in zip(outputs, inputs)]
        return self._work(lambda: _after(works, outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ------------------------------------------------------------------ reduce-scatter

    def _reduce_rows(self, rows: torch.Tensor, output: torch.Tensor, op: int) -> HorotopoWork:
        # rows: (size, k); horotopo's reduce-scatter leaves row `rank` of the reduction here.
        handle = hvd_ops.reducescatter_async(rows, name=self._name(), op=op)

        def wait() -> torch.Tensor:
            mine = hvd_ops.synchronize(handle)
            with torch.no_grad():
                output.copy_(mine.view(output.shape))
            return output
        return self._work(wait)

    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]],
                       opts: Any = None) -> HorotopoWork:
        output = _one(output_tensors, "reduce_scatter")
        inputs = _one(input_tensors, "reduce_scatter")
        if len(inputs) != self._size or any(t.numel() != output.numel() for t in inputs):
            raise ValueError(f"reduce_scatter needs {self._size} input tensors of "
                             f"{output.numel()} elements each (the output's)")
        rows = torch.stack([t.reshape(-1) for t in inputs])
        work = self._reduce_rows(rows, output, hvd_op(opts.reduceOp))

        def wait() -> List[torch.Tensor]:
            work.wait()
            return output_tensors
        return self._work(wait)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor,
                              opts: Any = None) -> HorotopoWork:
        if inp.numel() != self._size * output.numel():
            raise ValueError(f"reduce_scatter_tensor needs an input of {self._size} x "
                             f"{output.numel()} elements, got {inp.numel()}")
        op = hvd_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return self._reduce_rows(inp.reshape(self._size, -1), output, op)

    _reduce_scatter_base = reduce_scatter_single  # torch < 2.10's name

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor],
                                        inputs: List[torch.Tensor],
                                        opts: Any = None) -> HorotopoWork:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._work(lambda: _after(works, outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ------------------------------------------------------------------ all-to-all, barrier

    def all_to_all_single(self, output: torch.Tensor, inp: torch.Tensor,
                          output_split_sizes: List[int], input_split_sizes: List[int],
                          opts: Any = None) -> HorotopoWork:
        splits = list(input_split_sizes) or None
        handle = hvd_ops.alltoall_async(inp, splits=splits, name=self._name())
        expected = list(output_split_sizes)

        def wait() -> torch.Tensor:
            got, received = hvd_ops.synchronize(handle)
            if expected and [int(r) for r in received] != expected:
                raise ValueError(f"all_to_all_single: the ranks send {received.tolist()} rows "
                                 f"here, output_split_sizes says {expected}")
            if got.shape != output.shape:
                raise ValueError(f"all_to_all_single: the output has shape "
                                 f"{list(output.shape)}, the received rows {list(got.shape)}")
            with torch.no_grad():
                output.copy_(got)
            return output
        return self._work(wait)

    alltoall_base = all_to_all_single  # torch < 2.10's name

    def barrier(self, opts: Any = None) -> HorotopoWork:
        rt = runtime()
        hid = rt.enqueue(BARRIER, [(self._name(), None, None)])

        def wait() -> None:
            rt.wait(hid)
        return self._work(wait)

    # ------------------------------------------------------------------ point to point

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> HorotopoWork:
        return self._p2p.send(tensors, dst, tag)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> HorotopoWork:
        return self._p2p.recv(tensors, src, tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> HorotopoWork:
        return self._p2p.recv(tensors, None, tag)

    # ------------------------------------------------------------------ not horotopo's

    def gather(self, *args: Any, **kwargs: Any) -> HorotopoWork:
        raise _unsupported("gather")

    def scatter(self, *args: Any, **kwargs: Any) -> HorotopoWork:
        raise _unsupported("scatter")

    def reduce(self, *args: Any, **kwargs: Any) -> HorotopoWork:
        raise _unsupported("reduce")

    def alltoall(self, *args: Any, **kwargs: Any) -> HorotopoWork:
        raise _unsupported("alltoall")

    def allgather_coalesced(self, *args: Any, **kwargs: Any) -> HorotopoWork:
        raise _unsupported("allgather_coalesced")


def create_process_group(store: dist.Store, rank: int, world_size: int,
                         timeout: timedelta) -> ProcessGroupHorotopo:
    """torch's backend constructor (``Backend.register_backend``'s ``func``).

    Refuses a torchrun launch at once, starts horotopo (a no-op if it runs), and checks
    torch's rank and size against MPI's.

    Raises
    ------
    RuntimeError
        Under torchrun, or on a rank or size that is not MPI's (a group of fewer ranks than
        the job's is one: horotopo has no process sets).
    """
    from ... import torch as hvd

    refuse_torchrun(world_size, mpi_size_before_init())
    hvd.init()
    check_ranks(rank, world_size, hvd_rank(), hvd_size())
    return ProcessGroupHorotopo(rank, world_size, timeout)
