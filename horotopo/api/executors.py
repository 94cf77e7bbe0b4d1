"""The executors: one per op kind, and the loop that runs a cycle's responses through them.

Tensor data only ever goes through the engine, an :class:`horotopo.adapt.AdaptiveEngine`: it
runs every collective under the dead-peer watchdog (``HOROTOPO_TIMEOUT_S``), watches its own
transfers and re-plans when they stay slower than the plan (``HOROTOPO_ADAPT``). Re-plans
happen between two engine calls, and every rank makes the same engine calls in the same order
(the responses are), so every rank switches at the same call. ``retune()`` is a negotiated op
like ``barrier()``: it runs here at the same point of every rank's response stream.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ClassVar, Dict, Iterator, List, MutableMapping, Optional

import numpy as np

from .. import timeline
from ..buffers import array_module, device_scope, synchronize
from .fusion import FusionBuffers, FusionGroup, fuse, plan_fusion
from .ops import OP_NAMES, Adasum, Average
from .records import (ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, JOIN, NATIVE_DTYPES,
                      PROCESS_SET, REDUCESCATTER, RETUNE, RETUNE_MODES, Entry, Handle, Response,
                      Signature)
from .set_table import PROCESS_SET_ADD, ranks_from_name
from .settings import log

__all__ = ["Executor", "OpExecutor", "EXECUTORS", "OnDevice"]

#: Resolves entries with values or an error (the request queue's ``finish``).
Finish = Callable[[List[Entry], Optional[List[Any]], Optional[str]], None]


class OnDevice:
    """Runs a fused group on its tensors' device: waits for the callers' streams first (their
    ``ready`` events), makes the group's device current on this thread, and finishes the
    device work before the handles resolve, so a caller sees complete results.

    A no-op for host tensors. Every tensor of a group must be on one device: a process drives
    one GPU, as with Horovod."""

    def __init__(self, entries: List[Entry]) -> None:
        self.entries = entries
        first = entries[0]
        self.like = first.array if first.array is not None else first.output
        self.scope: Any = None

    def __enter__(self) -> "OnDevice":
        if self.entries[0].sig.on_host:
            return self
        devices = {e.sig.device for e in self.entries}
        if len(devices) > 1:
            raise ValueError(f"tensors fused into one collective are on devices "
                             f"{sorted(devices)}: use one GPU per process")
        waited = set()
        for e in self.entries:
            if e.ready is not None and id(e.ready) not in waited:
                waited.add(id(e.ready))
                e.ready()
        self.scope = device_scope(self.like)
        self.scope.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.scope is not None:
            try:
                if exc[0] is None:
                    synchronize(self.like)
            finally:
                self.scope.__exit__(*exc)


class OpExecutor:
    """Runs the responses of one op kind (several when fused) on this rank's entries."""

    kind: ClassVar[str]
    #: Whether the op moves tensor data, so it runs in :class:`OnDevice`.
    on_device: ClassVar[bool] = True

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        """The results, one per entry (in the order of ``entries``)."""
        raise NotImplementedError


class AllreduceExecutor(OpExecutor):
    """One engine allreduce per fusion group; narrow integers are widened to int64."""

    kind = ALLREDUCE

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        sig = responses[0].sig
        if sig.op == Adasum:
            return adasum(ex, entries, sig.prescale, sig.postscale)
        dtype = entries[0].array.dtype  # not np.dtype(sig.dtype): see Signature.nbytes
        prescale, postscale = sig.prescale, sig.postscale
        if sig.op == Average:
            postscale = postscale / ex.size
        work = dtype if dtype.name in NATIVE_DTYPES else np.dtype(np.int64)
        op = OP_NAMES[sig.op]
        ex.stats["engine_allreduces"] += 1
        ex.stats["fused_tensors"] += len(entries)
        if len(entries) == 1 and work == dtype:
            e = entries[0]
            ex.engine.allreduce(e.array, e.output, op=op, prescale_factor=prescale,
                                postscale_factor=postscale)
            ex.note_replans()
            return [e.output]
        names = ex.row_names(entries)
        buf = ex.buffers.get(work, sum(e.array.size for e in entries), entries[0].array)
        fuse(ex.tl, buf, [e.array for e in entries], names, into_buffer=True)
        ex.engine.allreduce(buf, buf, op=op, prescale_factor=prescale,
                            postscale_factor=postscale)
        fuse(ex.tl, buf, [e.output for e in entries], names, into_buffer=False)
        ex.note_replans()
        return [e.output for e in entries]


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Horovod's Adasum of two vectors: ``(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b``, the
    dot products in float64, a coefficient of 1 for a vector of (almost) zero norm."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dot, anormsq, bnormsq = float(a64 @ b64), float(a64 @ a64), float(b64 @ b64)
    tiny = np.sqrt(np.finfo(np.float64).tiny)
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= tiny else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= tiny else 1.0
    return (acoeff * a + bcoeff * b).astype(a.dtype)


def adasum_tree(vectors: List[np.ndarray]) -> np.ndarray:
    """The ranks' vectors combined as Horovod's vector-halving, distance-doubling Adasum
    combines them: neighbours first (0 with 1, 2 with 3...), then those pairs, and so on."""
    level = list(vectors)
    while len(level) > 1:
        level = [adasum_pair(level[k], level[k + 1]) for k in range(0, len(level), 2)]
    return level[0]


def adasum(ex: "Executor", entries: List[Entry], prescale: float,
           postscale: float) -> List[Any]:
    """Adasum allreduce (CPU, a power-of-two number of ranks, checked at the call): each
    tensor on its own, as Horovod combines each tensor of a fused buffer with its own dot
    products. Every rank gathers every rank's vector (one engine broadcast from each) and
    folds them in Horovod's order, so all ranks hold the same result; this moves ``size``
    times the bytes of Horovod's halving scheme, for correctness first."""
    outputs = []
    for e in entries:
        flat = e.array.reshape(-1)
        every = np.empty((ex.size, flat.size), dtype=flat.dtype)
        every[ex.rank] = flat
        for r in range(ex.size):
            if flat.size:
                ex.engine.broadcast(every[r].view(np.uint8), r)
        if prescale != 1.0:
            every *= prescale
        result = adasum_tree(list(every))
        if postscale != 1.0:
            result = result * postscale
        np.copyto(e.output.reshape(-1), result.astype(e.output.dtype, copy=False))
        outputs.append(e.output)
    return outputs


class ReducescatterExecutor(AllreduceExecutor):
    """A reduce-scatter is an allreduce here (each rank's front end keeps its block); it fuses
    with allreduces of the same dtype, op and factors."""

    kind = REDUCESCATTER


class BroadcastExecutor(OpExecutor):
    """One engine broadcast per fusion group: bytes are bytes, so any dtypes from one root
    share a uint8 buffer."""

    kind = BROADCAST

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        root = responses[0].sig.root
        if ex.rank == root:
            for e in entries:
                if e.output is not e.array:
                    array_module(e.output).copyto(e.output, e.array)
        if len(entries) == 1:
            out = entries[0].output
            if out.nbytes:
                ex.engine.broadcast(out.reshape(-1).view(np.uint8), root)
            return [out]
        names = ex.row_names(entries)
        total = sum(e.output.nbytes for e in entries)
        buf = ex.buffers.get(np.dtype(np.uint8), total, entries[0].output)
        views = [e.output.reshape(-1).view(np.uint8) for e in entries]
        if ex.rank == root:
            fuse(ex.tl, buf, views, names, into_buffer=True)
        if total:
            ex.engine.broadcast(buf, root)
        if ex.rank != root:
            fuse(ex.tl, buf, views, names, into_buffer=False)
        return [e.output for e in entries]


class AllgatherExecutor(OpExecutor):
    """Each rank's rows broadcast from that rank (the first dimensions come with the
    response), into one output of the summed first dimension."""

    kind = ALLGATHER

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        (entry,), (resp,) = entries, responses
        firsts = resp.extra or []
        arr = entry.array
        rest = arr.shape[1:]
        xp = array_module(arr)
        out = xp.empty((sum(firsts),) + rest, dtype=arr.dtype)
        row = int(np.prod(rest, dtype=np.int64)) * arr.dtype.itemsize
        offset = 0
        for r, count in enumerate(firsts):
            part = out[offset:offset + count]
            if r == ex.rank:
                xp.copyto(part, arr)
            if count and row:
                ex.engine.broadcast(part.reshape(-1).view(np.uint8), r)
            offset += count
        return [out]


class AlltoallExecutor(AllgatherExecutor):
    """An alltoall's two allgathers (its splits, then its rows; the front end keeps what is
    addressed to this rank)."""

    kind = ALLTOALL


class BarrierExecutor(OpExecutor):
    """Nothing to move: every rank reaching this response is the barrier."""

    kind = BARRIER
    on_device = False

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        return [None]


class RetuneExecutor(OpExecutor):
    """Re-probe and re-plan now (``hvd.retune``); the result is the engine's event."""

    kind = RETUNE
    on_device = False

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        event = ex.engine.retune(RETUNE_MODES[responses[0].sig.root])
        ex.note_replans()
        return [event]


class ProcessSetExecutor(OpExecutor):
    """Register a process set (every rank; the members build its communicator, plan and
    engine) or remove one; the result is the set's id (None: no such set)."""

    kind = PROCESS_SET
    on_device = False

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        resp = responses[0]
        if ex.sets is None or ex.build_group is None:
            raise RuntimeError("this runtime has no process-set table")
        if resp.sig.op == PROCESS_SET_ADD:
            ranks = ranks_from_name(resp.name)
            found = ex.sets.find(ranks)
            if found is not None:   # added by an earlier call that every rank also made
                return [found]
            group = ex.build_group(ranks) if ex.rank in ranks else None
            return [ex.sets.register(ranks, group)]
        pid = resp.sig.root
        if ex.sets.get(pid) is None:
            return [None]
        group = ex.sets.unregister(pid)
        if group is not None:
            group.engine.close()
        return [pid]


class JoinExecutor(OpExecutor):
    """Every rank has joined (``hvd.join``); the result is the last rank to join."""

    kind = JOIN
    on_device = False

    def run(self, ex: "Executor", entries: List[Entry], responses: List[Response]) -> List[Any]:
        return [int(responses[0].extra[0])]


#: The executor of each op kind.
EXECUTORS: Dict[str, OpExecutor] = {x.kind: x for x in (
    AllreduceExecutor(), ReducescatterExecutor(), BroadcastExecutor(), AllgatherExecutor(),
    AlltoallExecutor(),
    BarrierExecutor(), RetuneExecutor(), JoinExecutor(), ProcessSetExecutor())}


def _zeros(sig: Signature) -> Any:
    """Zeros of ``sig``'s dtype and shape, on its device: a joined rank's contribution."""
    if sig.on_host:
        from ..ops import bfloat16_dtype

        dtype = bfloat16_dtype() if sig.dtype == "bfloat16" else np.dtype(sig.dtype)
        return np.zeros(sig.shape, dtype)
    from ..gpu.env import cupy_module
    from ..gpu.kernels import cupy_bfloat16

    cp = cupy_module()
    dtype = cupy_bfloat16() if sig.dtype == "bfloat16" else np.dtype(sig.dtype)
    with cp.cuda.Device(sig.device):
        return cp.zeros(sig.shape, dtype)


def stand_in(resp: Response) -> Entry:
    """The entry of a rank that has joined (``hvd.join``) for a name that the other ranks
    asked for: zeros for an allreduce (Horovod's join), nothing for an error response; its
    handle belongs to no caller."""
    array = _zeros(resp.sig) if resp.error is None and resp.kind == ALLREDUCE else None
    return Entry(resp.name, resp.sig, array, array, Handle(-1, 1), 0)


class Executor:
    """Runs a cycle's responses in their (rank-identical) order, fusing what can be fused.

    Parameters
    ----------
    engine : AdaptiveEngine
        Runs the collectives (anything with its ``allreduce``/``broadcast``/``retune``).
    rank, size : int
        This rank and the number of ranks.
    fusion_threshold : int
        The largest fusion buffer in bytes.
    stats : dict
        Counters added to: ``engine_allreduces``, ``fused_tensors``.
    finish : callable
        Resolves entries (the request queue's ``finish``).
    plan : Plan, optional
        The plan the engine starts with; :attr:`plan` follows the engine's re-plans.
    """

    def __init__(self, engine: Any, rank: int, size: int, fusion_threshold: int,
                 stats: Dict[str, int], finish: Finish, plan: Any = None) -> None:
        self.engine = engine
        self.rank, self.size = rank, size
        self.fusion_threshold = fusion_threshold
        self.stats = stats
        self.plan = plan
        self.buffers = FusionBuffers()
        self.tl: Optional[timeline.Timeline] = None  # the timeline of the running cycle
        self._finish = finish
        self._events_seen = 0
        self._pset = 0   # the process set whose op runs now (0: the global set)
        #: The process-set table and the function that builds this rank's part of a new set
        #: (the runtime sets both; :mod:`.process_sets`).
        self.sets: Any = None
        self.build_group: Optional[Callable[[Any], Any]] = None

    def execute(self, responses: List[Response], pending: MutableMapping[str, Entry],
                tl: Optional[timeline.Timeline] = None, t_resp: float = 0.0) -> None:
        """Run ``responses``, taking their entries out of ``pending``; ``tl`` is the timeline
        to draw on and ``t_resp`` when the responses became known."""
        self.tl = tl
        for item in plan_fusion(responses, self.fusion_threshold):
            group = item.responses if isinstance(item, FusionGroup) else [item]
            pset = group[0].sig.pset
            if pset and (self.sets is None or pset not in self.sets.groups):
                continue   # a process set this rank is not in: its members run it
            # A name missing here was asked for by the others while this rank has joined.
            entries = [pending.pop(r.name, None) or stand_in(r) for r in group]
            if tl is not None:
                _trace_begin(tl, group[0].kind, entries, t_resp)
            error = group[0].error
            if error is not None:
                self.finish(entries, error=error)
                continue
            runner = EXECUTORS[group[0].kind]
            try:
                with OnDevice(entries) if runner.on_device else contextlib.nullcontext(), \
                        self._in_set(pset):
                    values = runner.run(self, entries, group)
            except Exception as exc:
                self.finish(entries, error=f"{type(exc).__name__}: {exc}")
            else:
                self.finish(entries, values)

    @contextlib.contextmanager
    def _in_set(self, pset: int) -> Iterator[None]:
        """Run the op kinds on process set ``pset``: they read the engine, rank and size from
        the executor, so these are the set's (its engine over the set's communicator, this
        rank's place in it) while the op runs."""
        if not pset:
            yield
            return
        g = self.sets.groups[pset]
        saved = self.engine, self.rank, self.size
        self.engine, self.rank, self.size, self._pset = g.engine, g.rank, g.size, pset
        try:
            yield
        finally:
            (self.engine, self.rank, self.size), self._pset = saved, 0

    def finish(self, entries: List[Entry], values: Optional[List[Any]] = None,
               error: Optional[str] = None) -> None:
        """Close the entries' spans on the timeline, then resolve their handles."""
        if self.tl is not None:
            _trace_end(self.tl, entries, error)
        self._finish(entries, values, error)

    def row_names(self, entries: List[Entry]) -> List[str]:
        """The timeline rows of ``entries`` (none without a timeline: this is per tensor)."""
        return [e.name for e in entries] if self.tl is not None else []

    def note_replans(self) -> None:
        """Take up the plan the adaptive engine switched to, and say so on rank 0."""
        if self._pset:
            return   # a process set's engine does not re-plan (adapt off); the plan is the job's
        events = getattr(self.engine, "events", ())
        for event in events[self._events_seen:]:
            if self.rank == 0:
                log.warning("horotopo: re-planned at engine call %d (%s): plan %s -> %s, "
                            "modelled %.1f -> %.1f MB/s, %.2f s%s", event.step, event.reason,
                            event.old_digest[:8], event.new_digest[:8],
                            event.old_model_Bps / 1e6, event.new_model_Bps / 1e6,
                            event.seconds, f" ({event.note})" if event.note else "")
        self._events_seen = len(events)
        self.plan = getattr(self.engine, "plan", self.plan)


def _trace_begin(tl: timeline.Timeline, kind: str, entries: List[Entry],
                 t_resp: float) -> None:
    """Open the op's span on each tensor's row from the end of its negotiation, show the
    wait behind earlier ops of this cycle as QUEUE, and point the engine's spans (the
    algorithm, the trees' phases) at these rows."""
    names = [e.name for e in entries]
    tl.begin(names, kind, ts=t_resp,
             args={"fused_tensors": len(names)} if len(names) > 1 else None)
    tl.complete(names, "QUEUE", t_resp, time.monotonic())
    tl.set_rows(names)


def _trace_end(tl: timeline.Timeline, entries: List[Entry], error: Optional[str]) -> None:
    for e in entries:
        args: Dict[str, Any] = {"dtype": e.sig.dtype, "shape": list(e.sig.shape)}
        if error is not None:
            args["error"] = error
        tl.end(e.name, args=args)
    tl.set_rows(None)
