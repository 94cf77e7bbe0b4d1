"""Pipelined tree allreduce and tree broadcast along the Plan's trees.

Each tree ``t`` carries the segment ``[lo_t, hi_t)`` of the buffer (``share_t`` of it), cut into
chunks. At rank ``v``, chunk ``k`` of a tree goes through these steps:

1. receive chunk ``k`` from every reduce child (into scratch) and reduce them, in the fixed
   child order so results do not depend on arrival order;
2. a non-root sends the partial result to its reduce parent; the root has the final value;
3. a non-root receives the final chunk from its broadcast parent into the output;
4. every rank forwards the final chunk to its broadcast children.

The root broadcasts chunk ``k`` as soon as it is reduced, so the reduce and broadcast stages of
one tree overlap, and every tree of the plan runs in the same nonblocking progress loop. Only
``window`` chunks per tree and reduce child may hold scratch at once (that bounds memory;
by default 2 MiB, see :func:`window_for`), and at most
``window + 2 * depth + 2`` chunks per tree are in flight (that bounds outstanding messages).
Every rank ends with the root's bits, so results are bitwise identical across ranks.

MPI matches the messages of one (peer, tag) stream in the order they are posted but may report
completions in any order, so each stream (receives from a child, the send up, the receive down,
the sends down) is posted strictly in chunk order, whatever order the completions arrive in.
"""
from __future__ import annotations

from functools import partial
from typing import Any, List, Optional, Sequence, Tuple

from ..buffers import (ScratchPool, chunk_bounds, combine_into, reduce_into, segment_bounds,
                       synchronize)
from ..plan import Plan
from ..transport.base import Transport
from .progress import Progress

__all__ = ["TreeAllreduce", "TreeBroadcast", "window_for", "WINDOW_BYTES", "DEFAULT_WINDOW"]

# Scratch per reduce child and tree when the window is automatic: 2 MiB, between 4 and 32
# chunks. Small chunks need many in flight to ride out a peer that is slow to be scheduled
# (on racks-2x3, emulated, 64 KiB chunks: 16 chunks ran 1.2-1.5x faster than 4); big chunks
# need few (4 x 1 MiB is as fast as MPI allows over shared memory).
WINDOW_BYTES = 2 << 20


# The smallest automatic window (what 1 MiB and larger chunks get); the actual window for a
# chunk size is window_for(chunk_bytes).
DEFAULT_WINDOW = 4


def window_for(chunk_bytes: int) -> int:
    """The automatic window (chunks of scratch per reduce child) for ``chunk_bytes``."""
    return max(DEFAULT_WINDOW, min(32, WINDOW_BYTES // max(1, chunk_bytes)))


def _children(parent: Sequence[int]) -> List[Tuple[int, ...]]:
    kids: List[List[int]] = [[] for _ in parent]
    for v, p in enumerate(parent):
        if p >= 0:
            kids[p].append(v)
    return [tuple(k) for k in kids]


def _depth(parent: Sequence[int]) -> int:
    best = 0
    for v in range(len(parent)):
        d, u = 0, v
        while parent[u] >= 0:
            u = parent[u]
            d += 1
        best = max(best, d)
    return best


class _TreeRun:
    """One tree's segment at this rank: per-chunk state and the step callbacks."""

    def __init__(self, prog: Progress, chunks: List[Tuple[int, int]], out: Any, src: Any,
                 op: str, reduce_children: Tuple[int, ...], reduce_parent: int,
                 bcast_children: Tuple[int, ...], bcast_parent: int, tag_up: int,
                 tag_down: int, scratch: Optional[Any], window: int, in_flight: int,
                 allreduce: bool) -> None:
        self.prog = prog
        self.chunks = chunks
        self.out = out
        self.src = src
        self.op = op
        self.rc = reduce_children if allreduce else ()
        self.rp = reduce_parent
        self.bc = bcast_children
        self.bp = bcast_parent
        self.tag_up = tag_up
        self.tag_down = tag_down
        self.scratch = scratch
        self.window = window
        self.in_flight = in_flight
        self.allreduce = allreduce
        self.is_root = bcast_parent < 0
        # A leaf that reads its own data from a separate send buffer can receive the result
        # into the output while its own send is in flight; otherwise the output is the send
        # buffer and the receive must wait for the send to complete.
        self.prepost = allreduce and not self.is_root and not self.rc and src is not out
        n = len(chunks)
        self.left = [0] * n
        self.arrived = [0] * n
        self.nred = [0] * n
        self.rdone = [False] * n
        self.fin = [False] * n
        self.final = [False] * n
        self.down_low = 0
        self.sent = [False] * n
        self.up_low = 0
        self.next = 0
        self.red_low = 0
        self.fin_low = 0
        self._filling = False
        steps = len(self.bc)
        if allreduce:
            steps += 1 if self.is_root else 3  # ready (+ up-send, down-receive)
        else:
            steps += 1  # ready at the root, down-receive elsewhere
        self.steps = steps

    @property
    def done(self) -> bool:
        return self.fin_low == len(self.chunks)

    def fill(self) -> None:
        """Start chunks while the windows allow."""
        if self._filling:
            return  # an outer fill() re-checks the windows after this step returns
        self._filling = True
        try:
            n = len(self.chunks)
            # The scratch window only binds ranks that receive from reduce children.
            while (self.next < n and self.next < self.fin_low + self.in_flight
                   and (not self.rc or self.next < self.red_low + self.window)):
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
                self.prog.irecv(self.out[a:b], self.bp, self.tag_down, partial(self._arrived, k))
            return
        if self.prepost:
            self.prog.irecv(self.out[a:b], self.bp, self.tag_down, partial(self._arrived, k))
        if self.rc:
            slot = (k % self.window) * len(self.rc)
            for i, c in enumerate(self.rc):
                buf = self.scratch[slot + i, : b - a]
                self.prog.irecv(buf, c, self.tag_up, partial(self._child, k, i))
        else:
            self._ready(k)

    def _child(self, k: int, i: int) -> None:
        self.arrived[k] |= 1 << i
        a, b = self.chunks[k]
        slot = (k % self.window) * len(self.rc)
        while self.nred[k] < len(self.rc) and (self.arrived[k] >> self.nred[k]) & 1:
            j = self.nred[k]
            part = self.scratch[slot + j, : b - a]
            if j == 0 and self.src is not self.out:
                combine_into(self.out[a:b], self.src[a:b], part, self.op)
            else:
                reduce_into(self.out[a:b], part, self.op)
            self.nred[k] = j + 1
        if self.nred[k] == len(self.rc):
            synchronize(self.out)
            self._ready(k)

    def _ready(self, k: int) -> None:
        """Chunk ``k`` holds this rank's contribution (allreduce) or the data (broadcast root)."""
        self.rdone[k] = True
        # MPI matches messages of one stream in posting order but may report completions out
        # of order, so every send stream is released strictly in chunk order.
        while self.red_low < len(self.chunks) and self.rdone[self.red_low]:
            j = self.red_low
            self.red_low += 1
            if self.is_root:
                self._final(j)
            else:
                a, b = self.chunks[j]
                buf = self.out[a:b] if (self.rc or self.src is self.out) else self.src[a:b]
                self.prog.isend(buf, self.rp, self.tag_up, partial(self._up_sent, j))
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
                self.prog.irecv(self.out[a:b], self.bp, self.tag_down, partial(self._arrived, j))
        self._step(k)

    def _arrived(self, k: int) -> None:
        self._final(k)
        self._step(k)

    def _final(self, k: int) -> None:
        """Chunk ``k`` is final here; forward final chunks down in chunk order."""
        self.final[k] = True
        while self.down_low < len(self.chunks) and self.final[self.down_low]:
            j = self.down_low
            self.down_low += 1
            a, b = self.chunks[j]
            for c in self.bc:
                self.prog.isend(self.out[a:b], c, self.tag_down, partial(self._step, j))

    def _step(self, k: int) -> None:
        self.left[k] -= 1
        if self.left[k] == 0:
            self.fin[k] = True
            while self.fin_low < len(self.chunks) and self.fin[self.fin_low]:
                self.fin_low += 1
        self.fill()


class _TreeAlgorithm:
    """Shared set-up: the plan's trees as child lists at this rank."""

    def __init__(self, transport: Transport, plan: Plan, window: Optional[int] = None,
                 pool: Optional[ScratchPool] = None) -> None:
        if plan.n != transport.size:
            raise ValueError(f"the plan is for {plan.n} ranks but the transport has "
                             f"{transport.size}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 chunk, got {window}")
        self.transport = transport
        self.plan = plan
        self.window = window
        self.pool = pool or ScratchPool()
        self.shares = [t.share for t in plan.trees]
        v = transport.rank
        self._trees = []
        for t in plan.trees:
            self._trees.append((_children(t.reduce_parent)[v], t.reduce_parent[v],
                                _children(t.bcast_parent)[v], t.bcast_parent[v],
                                _depth(t.reduce_parent) + _depth(t.bcast_parent)))
        self.last_messages = 0

    def _window(self, chunk_elems: int, itemsize: int) -> int:
        return self.window or window_for(chunk_elems * itemsize)

    @staticmethod
    def _in_flight(window: int, depth: int) -> int:
        return window + 2 * depth + 2

    def _run(self, runs: List[_TreeRun], prog: Progress) -> None:
        for run in runs:
            run.fill()
        prog.run()
        self.last_messages = prog.messages
        if not all(run.done for run in runs):
            raise RuntimeError("tree schedule ended with chunks unfinished (an engine bug)")


class TreeAllreduce(_TreeAlgorithm):
    """Allreduce along the Plan's trees, chunked and pipelined (see the module docstring).

    Parameters
    ----------
    transport : Transport
        The message layer; ``transport.size`` must equal ``plan.n``.
    plan : Plan
        The trees, their shares and the default chunk size.
    window : int, optional
        Chunks per tree and reduce child that may hold receive scratch at once; None picks
        :func:`window_for` the chunk size.
    pool : ScratchPool, optional
        Where the scratch comes from (the engine shares one across calls).
    """

    def run(self, src: Any, out: Any, op: str, chunk_elems: int) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place) with ``op``.

        ``op`` is one of sum, min, max, product; ``chunk_elems`` is the elements per message.
        """
        count = out.size
        window = self._window(chunk_elems, out.itemsize)
        prog = Progress(self.transport)
        base = self.transport.alloc_tags(2 * len(self._trees))
        segs = segment_bounds(count, self.shares)
        sizes = []
        for (rc, _, _, _, _), (lo, hi) in zip(self._trees, segs):
            width = min(chunk_elems, hi - lo)
            sizes.append((len(rc) * window, width))
        total = sum(r * w for r, w in sizes)
        block = self.pool.get(total, out) if total else None
        runs = []
        at = 0
        for k, ((rc, rp, bc, bp, depth), (lo, hi), (rows, width)) in enumerate(
                zip(self._trees, segs, sizes)):
            if hi <= lo:
                continue
            scratch = None
            if rows and width:
                scratch = block[at:at + rows * width].reshape(rows, width)
                at += rows * width
            runs.append(_TreeRun(prog, chunk_bounds(lo, hi, chunk_elems), out, src, op, rc, rp,
                                 bc, bp, base + 2 * k, base + 2 * k + 1, scratch, window,
                                 self._in_flight(window, depth), allreduce=True))
        self._run(runs, prog)


class TreeBroadcast(_TreeAlgorithm):
    """Broadcast from any root along the Plan's broadcast trees.

    Tree ``t`` carries ``share_t`` of the buffer. When the broadcast root ``q`` is not the
    tree's root ``r``, ``q`` first sends the segment to ``r`` (one extra hop), ``r`` sends it
    down ``bcast_parent`` as usual, and nobody sends it back to ``q``: ``q``'s own children
    in the tree get it from ``q`` directly. Buffers no bigger than one chunk go down a single
    tree (the one with the largest share), since splitting them only adds messages.
    """

    def run(self, buf: Any, root: int, chunk_elems: int) -> None:
        """Broadcast flat ``buf`` from ``root`` in place; ``chunk_elems`` per message."""
        count = buf.size
        window = self._window(chunk_elems, buf.itemsize)
        prog = Progress(self.transport)
        base = self.transport.alloc_tags(len(self.plan.trees))
        if count <= chunk_elems:
            best = max(range(len(self.shares)), key=lambda k: (self.shares[k], -k))
            shares = [1.0 if k == best else 0.0 for k in range(len(self.shares))]
        else:
            shares = self.shares
        segs = segment_bounds(count, shares)
        v = self.transport.rank
        runs = []
        for k, (t, (lo, hi)) in enumerate(zip(self.plan.trees, segs)):
            if hi <= lo:
                continue
            parent = list(t.bcast_parent)
            parent[root] = -1
            if t.root != root:
                parent[t.root] = root
            kids = _children(parent)
            runs.append(_TreeRun(prog, chunk_bounds(lo, hi, chunk_elems), buf, buf, "sum", (),
                                 -1, kids[v], parent[v], base + k, base + k, None, window,
                                 self._in_flight(window, _depth(parent)), allreduce=False))
        self._run(runs, prog)
