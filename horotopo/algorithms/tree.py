"""Pipelined tree allreduce and tree broadcast: the engine's walk of a rank's step table.

The tables come from :mod:`horotopo.schedule`, which holds all the tree logic (children in the
fixed reduction order, depths, the broadcast trees re-rooted for a broadcast root, segments,
chunk offsets, scratch layout, tag streams); this module only moves the messages a table lists,
pipelined. At rank ``v``, chunk ``k`` of a tree goes through these steps:

1. ``recv_child``: receive chunk ``k`` from every reduce child (into scratch) and reduce them,
   in the table's child order, so results do not depend on arrival order;
2. ``send_parent``: a non-root sends the partial result up; the root has the final value;
3. ``recv_parent``: a non-root receives the final chunk from its broadcast parent into the
   output;
4. ``send_child``: every rank forwards the final chunk to its broadcast children.

The root broadcasts chunk ``k`` as soon as it is reduced, so the reduce and broadcast stages of
one tree overlap, and every tree of the table runs in the same nonblocking progress loop. The
receives from the broadcast parent are urgent (:meth:`Progress.post
<horotopo.algorithms.progress.Progress.post>`): of the receives complete at once, a rank
forwards the final chunks before it reduces the next ones, which would otherwise hold the
broadcast back at every hop of a chain by the reduce work queued ahead of it. Only
``window`` chunks per tree and reduce child may hold scratch at once (that bounds memory;
by default 2 MiB, see :func:`horotopo.schedule.window_for`), and at most the table's
``in_flight`` chunks per tree are in flight (that bounds outstanding messages). Every rank ends
with the root's bits, so results are bitwise identical across ranks.

With a pace factor ``f > 0`` (:attr:`~horotopo.params.EngineParams.pace_factor`), an
allreduce holds each tree's sends at every rank to ``f`` times the tree's planned rate
(``Tree.rate_Bps``), the sends up and the sends down alike: every arc of a tree carries the
tree's whole segment once each way, so both streams are what its planned share of a shared link
is made of. Chunk ``k`` of a stream goes out no earlier than the stream's first send plus the
time the chunks before it take at that rate (a rank behind that time sends at once, so a stall
is caught up, never carried on); the progress loop's timers release the sends held.

MPI matches the messages of one (peer, tag) stream in the order they are posted but may report
completions in any order, so each stream (receives from a child, the send up, the receive down,
the sends down) is posted strictly in chunk order, whatever order the completions arrive in.
"""
from __future__ import annotations

import math
from collections import deque
from functools import partial
from typing import Any, Callable, Deque, List, Optional, Tuple, Union

from .. import timeline as _timeline
from ..buffers import ScratchPool, combine_into, reduce_into, synchronize
from ..params import ENGINE
from ..plan import Plan
from ..schedule import ScheduleCache, TreeTable, window_for
from ..transport.base import Transport
from .progress import Progress

__all__ = ["TreeAllreduce", "TreeBroadcast", "Window", "window_for"]


class _Pacer:
    """One send stream of a tree at this rank, held to a rate: the send of the chunk that
    starts at element ``first`` goes out no earlier than the stream's first send plus
    ``(first - origin) * seconds_per_elem``; sends are posted in the order they were asked
    for, whatever their times."""

    __slots__ = ("prog", "seconds_per_elem", "origin", "start", "held")

    def __init__(self, prog: Progress, seconds_per_elem: float, origin: int) -> None:
        self.prog = prog
        self.seconds_per_elem = seconds_per_elem
        self.origin = origin
        self.start: Optional[float] = None
        self.held: Deque[Tuple[float, Callable[[], None]]] = deque()

    def send(self, first: int, post: Callable[[], None]) -> None:
        """Call ``post`` (which posts the send) now, or from a timer once it is due."""
        now = self.prog.now()
        if self.start is None:
            self.start = now
        due = self.start + (first - self.origin) * self.seconds_per_elem
        if self.held:
            self.held.append((due, post))
        elif due <= now:
            post()
        else:
            self.held.append((due, post))
            self.prog.at(due, self._release)

    def _release(self) -> None:
        held = self.held
        held.popleft()[1]()  # its timer fired: due
        if held:
            now = self.prog.now()
            while held and held[0][0] <= now:
                held.popleft()[1]()
            if held:
                self.prog.at(held[0][0], self._release)


class _TreeRun:
    """One tree's segment at this rank: per-chunk state and the step callbacks.

    Parameters
    ----------
    prog : Progress
        The loop every tree of the call shares.
    table : TreeTable
        The tree's peers, chunk offsets, stream offsets and in-flight bound at this rank.
    out, src : array
        Flat output and input (the same object in place, and for a broadcast).
    op : str
        Reduction for ``recv_child`` chunks.
    tag_base : int
        First of the call's tags; the table's stream offsets index from it.
    scratch : array, optional
        ``window * len(recv_children)`` rows of one chunk each (None without reduce children).
    window : int
        Chunks of scratch per reduce child.
    allreduce : bool
        False for a broadcast: chunks start final at the root and are only passed down.
    pace_s_per_elem : float, optional
        Seconds per element of this tree's sends at its paced rate; None sends at once.
    """

    def __init__(self, prog: Progress, table: TreeTable, out: Any, src: Any, op: str,
                 tag_base: int, scratch: Optional[Any], window: int, allreduce: bool,
                 pace_s_per_elem: Optional[float] = None) -> None:
        self.prog = prog
        self.chunks = table.chunks
        self.out = out
        self.src = src
        self.op = op
        # The table's peers, copied onto the run: the progress loop reads them per message.
        self.recv_children = table.recv_children
        self.send_parent = table.send_parent
        self.send_children = table.send_children
        self.recv_parent = table.recv_parent
        self.tag_up = tag_base + table.stream_up
        self.tag_down = tag_base + table.stream_down
        self.scratch = scratch
        self.window = window
        self.in_flight = table.in_flight
        self.allreduce = allreduce
        self.is_root = table.is_root
        self.table = table
        # The timeline's record of this call's tree phases at this rank, set by _run when a
        # timeline is being written (rank 0); None otherwise, and each hook is one check.
        self.phases: Optional[_timeline.TreePhases] = None
        # A leaf that reads its own data from a separate send buffer can receive the result
        # into the output while its own send is in flight; otherwise the output is the send
        # buffer and the receive must wait for the send to complete.
        self.prepost = (allreduce and not self.is_root and not self.recv_children
                        and src is not out)
        # Per chunk: completion events still awaited, the reduce children arrived (a bit
        # each), how many of them are reduced (in the table's order), and whether the chunk is
        # ready to go up, finished, final here, and sent up.
        n = len(self.chunks)
        self.left = [0] * n
        self.arrived = [0] * n
        self.reduced = [0] * n
        self.ready = [False] * n
        self.finished = [False] * n
        self.final = [False] * n
        self.sent = [False] * n
        # The first chunk not yet: sent down, given its receive from above, started, released
        # upwards (or final at the root), finished.
        self.down_low = 0
        self.up_low = 0
        self.next = 0
        self.ready_low = 0
        self.finished_low = 0
        self._filling = False
        # Completion events a chunk waits for before its slot frees: the sends down, plus
        # (allreduce) the reduction ready and, off the root, the send up and the receive down;
        # (broadcast) the chunk ready at the root or its receive elsewhere.
        steps = len(self.send_children)
        if allreduce:
            steps += 1 if self.is_root else 3
        else:
            steps += 1
        self.steps = steps
        self.pace_up: Optional[_Pacer] = None
        self.pace_down: Optional[_Pacer] = None
        if pace_s_per_elem is not None and self.chunks:
            origin = self.chunks[0][0]
            self.pace_up = _Pacer(prog, pace_s_per_elem, origin)
            self.pace_down = _Pacer(prog, pace_s_per_elem, origin)

    @property
    def done(self) -> bool:
        return self.finished_low == len(self.chunks)

    def fill(self) -> None:
        """Start chunks while the windows allow."""
        if self._filling:
            return  # an outer fill() re-checks the windows after this step returns
        self._filling = True
        try:
            n = len(self.chunks)
            # The scratch window only binds ranks that receive from reduce children.
            while (self.next < n and self.next < self.finished_low + self.in_flight
                   and (not self.recv_children or self.next < self.ready_low + self.window)):
                k = self.next
                self.next += 1
                self._start(k)
        finally:
            self._filling = False

    def _start(self, k: int) -> None:
        a, b = self.chunks[k]
        self.left[k] = self.steps
        if not self.allreduce:
            if self.is_root:
                self._ready(k)
            else:
                self.prog.irecv(self.out[a:b], self.recv_parent, self.tag_down,
                                partial(self._arrived, k), urgent=True)
            return
        if self.prepost:
            self.prog.irecv(self.out[a:b], self.recv_parent, self.tag_down,
                            partial(self._arrived, k), urgent=True)
        if self.recv_children:
            slot = (k % self.window) * len(self.recv_children)
            for i, c in enumerate(self.recv_children):
                buf = self.scratch[slot + i, : b - a]
                self.prog.irecv(buf, c, self.tag_up, partial(self._child, k, i))
        else:
            self._ready(k)

    def _child(self, k: int, i: int) -> None:
        self.arrived[k] |= 1 << i
        a, b = self.chunks[k]
        children = len(self.recv_children)
        slot = (k % self.window) * children
        while self.reduced[k] < children and (self.arrived[k] >> self.reduced[k]) & 1:
            j = self.reduced[k]
            part = self.scratch[slot + j, : b - a]
            if j == 0 and self.src is not self.out:
                combine_into(self.out[a:b], self.src[a:b], part, self.op)
            else:
                reduce_into(self.out[a:b], part, self.op)
            self.reduced[k] = j + 1
        if self.reduced[k] == children:
            synchronize(self.out)
            self._ready(k)

    def _ready(self, k: int) -> None:
        """Chunk ``k`` holds this rank's contribution (allreduce) or the data (broadcast root)."""
        self.ready[k] = True
        # MPI matches messages of one stream in posting order but may report completions out
        # of order, so every send stream is released strictly in chunk order.
        while self.ready_low < len(self.chunks) and self.ready[self.ready_low]:
            j = self.ready_low
            self.ready_low += 1
            if self.is_root:
                self._final(j)
            else:
                a, b = self.chunks[j]
                own = self.recv_children or self.src is self.out
                buf = self.out[a:b] if own else self.src[a:b]
                if self.pace_up is None:
                    self.prog.isend(buf, self.send_parent, self.tag_up,
                                    partial(self._up_sent, j))
                else:
                    self.pace_up.send(a, partial(self.prog.isend, buf, self.send_parent,
                                                 self.tag_up, partial(self._up_sent, j)))
        if self.phases is not None and self.ready_low == len(self.chunks):
            self.phases.reduced(self.table.tree)
        self._step(k)

    def _up_sent(self, k: int) -> None:
        if not self.prepost:
            # Sends can complete out of order too; receives of one stream must still be
            # posted in chunk order, or chunk k would match chunk k+1's message.
            self.sent[k] = True
            while self.up_low < len(self.chunks) and self.sent[self.up_low]:
                j = self.up_low
                self.up_low += 1
                a, b = self.chunks[j]
                self.prog.irecv(self.out[a:b], self.recv_parent, self.tag_down,
                                partial(self._arrived, j), urgent=True)
        self._step(k)

    def _arrived(self, k: int) -> None:
        self._final(k)
        self._step(k)

    def _final(self, k: int) -> None:
        """Chunk ``k`` is final here; forward final chunks down in chunk order."""
        if self.phases is not None:
            self.phases.final(self.table.tree)
        self.final[k] = True
        while self.down_low < len(self.chunks) and self.final[self.down_low]:
            j = self.down_low
            self.down_low += 1
            if self.pace_down is None:
                self._send_down(j)
            elif self.send_children:
                self.pace_down.send(self.chunks[j][0], partial(self._send_down, j))

    def _send_down(self, k: int) -> None:
        a, b = self.chunks[k]
        for c in self.send_children:
            self.prog.isend(self.out[a:b], c, self.tag_down, partial(self._step, k))

    def _step(self, k: int) -> None:
        self.left[k] -= 1
        if self.left[k] == 0:
            self.finished[k] = True
            while self.finished_low < len(self.chunks) and self.finished[self.finished_low]:
                self.finished_low += 1
            if self.phases is not None and self.finished_low == len(self.chunks):
                self.phases.done(self.table.tree)
        self.fill()


#: A window: chunks (int), automatic (None), or a function of the plan the runner runs (a
#: simulation whose chunks stand for larger ones gives each plan its full-size window).
Window = Union[None, int, Callable[[Plan], int]]


class _TreeAlgorithm:
    """Shared set-up: this rank's step tables of the plan, compiled once per buffer shape."""

    def __init__(self, transport: Transport, plan: Plan, window: Window = None,
                 pool: Optional[ScratchPool] = None,
                 in_flight_extra: int = ENGINE.in_flight_extra,
                 pace_factor: float = 0.0) -> None:
        if plan.n != transport.size:
            raise ValueError(f"the plan is for {plan.n} ranks but the transport has "
                             f"{transport.size}")
        if callable(window):  # resolved here, on the plan that runs (dbtree's, not the job's)
            window = int(window(plan))
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 chunk, got {window}")
        if not 0 <= pace_factor < math.inf:
            raise ValueError(f"pace_factor must be a finite number >= 0 (0: off), got "
                             f"{pace_factor!r}")
        self.pace_factor = pace_factor
        self.transport = transport
        self.plan = plan
        self.window = window
        self.pool = pool or ScratchPool()
        self.schedules = ScheduleCache(plan, transport.rank, window,
                                       in_flight_extra=in_flight_extra)
        self.last_messages = 0

    def _pace_s_per_elem(self, tree: int, itemsize: int) -> Optional[float]:
        """Seconds per element of plan tree ``tree`` at the pace factor times its planned
        rate, in the network's bytes (the transport's ``scale``); None unpaced (pacing off,
        or a tree without a planned rate)."""
        rate = self.plan.trees[tree].rate_Bps * self.pace_factor
        if not 0 < rate < math.inf:
            return None
        return itemsize * self.transport.scale / rate

    def _run(self, runs: List[_TreeRun], prog: Progress) -> None:
        phases = _timeline.tree_phases(runs[0].allreduce) if runs else None
        if phases is not None:
            for run in runs:
                run.phases = phases
                phases.add(run.table.tree, root=run.table.root, chunks=len(run.chunks),
                           elements=run.chunks[-1][1] - run.chunks[0][0])
        for run in runs:
            run.fill()
        prog.run()
        self.last_messages = prog.messages
        if not all(run.done for run in runs):
            raise RuntimeError("tree schedule ended with chunks unfinished (an engine bug)")
        if phases is not None:
            phases.emit()


class TreeAllreduce(_TreeAlgorithm):
    """Allreduce along the Plan's trees, chunked and pipelined (see the module docstring).

    Parameters
    ----------
    transport : Transport
        The message layer; ``transport.size`` must equal ``plan.n``.
    plan : Plan
        The trees, their shares and the default chunk size.
    window : int or callable, optional
        Chunks per tree and reduce child that may hold receive scratch at once; None picks
        :func:`~horotopo.schedule.window_for` the chunk size; a callable (:data:`Window`) is
        given the plan.
    pool : ScratchPool, optional
        Where the scratch comes from (the engine shares one across calls).
    in_flight_extra : int
        Chunks of a tree in flight beyond the window and a chunk per hop each way (the
        engine's :attr:`~horotopo.params.EngineParams.in_flight_extra`).
    pace_factor : float
        0 sends as soon as the pipeline allows; ``f > 0`` holds every tree's sends to ``f``
        times its planned rate (the engine's :attr:`~horotopo.params.EngineParams.pace_factor`;
        see the module docstring).
    """

    def run(self, src: Any, out: Any, op: str, chunk_elems: int) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place) with ``op``.

        ``op`` is one of sum, min, max, product; ``chunk_elems`` is the elements per message.
        """
        table = self.schedules.allreduce(out.size, out.dtype, chunk_elems)
        prog = Progress(self.transport, timed=self.pace_factor > 0)
        base = self.transport.alloc_tags(table.tags)
        block = self.pool.get(table.scratch_elems, out) if table.scratch_elems else None
        runs = []
        for t in table.trees:
            scratch = None
            if t.scratch_rows and t.scratch_width:
                at = t.scratch_offset
                scratch = block[at:at + t.scratch_rows * t.scratch_width].reshape(
                    t.scratch_rows, t.scratch_width)
            pace = (self._pace_s_per_elem(t.tree, out.dtype.itemsize) if prog.timed
                    else None)
            runs.append(_TreeRun(prog, t, out, src, op, base, scratch, table.window,
                                 allreduce=True, pace_s_per_elem=pace))
        self._run(runs, prog)


class TreeBroadcast(_TreeAlgorithm):
    """Broadcast from any root along the Plan's broadcast trees, re-rooted at the broadcast
    root by the step table (:func:`horotopo.schedule.compile_broadcast`)."""

    def run(self, buf: Any, root: int, chunk_elems: int) -> None:
        """Broadcast flat ``buf`` from ``root`` in place; ``chunk_elems`` per message."""
        table = self.schedules.broadcast(buf.size, buf.dtype, chunk_elems, root)
        prog = Progress(self.transport)
        base = self.transport.alloc_tags(table.tags)
        runs = [_TreeRun(prog, t, buf, buf, "sum", base, None, table.window, allreduce=False)
                for t in table.trees]
        self._run(runs, prog)
