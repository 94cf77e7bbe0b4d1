"""Ring allreduce over the transport: the in-project baseline.

The buffer is cut into ``n`` segments. In ``n - 1`` reduce-scatter steps, rank ``r`` sends
segment ``r - s`` to ``r + 1`` and reduces segment ``r - s - 1`` arriving from ``r - 1``; it
then owns the finished segment ``r + 1``. In ``n - 1`` allgather steps the finished segments go
round unchanged, so every rank holds the owner's bits and results are identical everywhere.
Each step's segment moves as chunks of ``chunk_elems``, all posted at once, each reduced as it
arrives; steps run one after another. :func:`predict_time` is its modelled time on a topology.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Optional

from ..buffers import (ScratchPool, chunk_bounds, combine_into, reduce_into, segment_bounds,
                       synchronize)
from ..packing.alphabeta import ENGINE_COSTS, IDEAL_NETWORK, NetworkModel, SoftwareCosts
from ..topology import Topology
from ..transport.base import Transport
from .flows import stage_time
from .progress import Progress

__all__ = ["RingAllreduce", "predict_time"]


class RingAllreduce:
    """Reduce-scatter plus allgather around the ranks in rank order (see module docstring)."""

    def __init__(self, transport: Transport, pool: Optional[ScratchPool] = None) -> None:
        self.transport = transport
        self.pool = pool or ScratchPool()
        self.last_messages = 0

    def run(self, src: Any, out: Any, op: str, chunk_elems: int) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place) with ``op``."""
        n, r = self.transport.size, self.transport.rank
        count = out.size
        if n == 1:
            if src is not out:
                out[...] = src
            return
        segs = segment_bounds(count, [1.0 / n] * n)
        widest = max(hi - lo for lo, hi in segs)
        scratch = self.pool.get(widest, out)
        right, left = (r + 1) % n, (r - 1) % n
        tag = self.transport.alloc_tags(2)
        prog = Progress(self.transport)
        messages = 0
        for s in range(n - 1):
            lo, hi = segs[(r - s) % n]
            # Step 0 sends this rank's own data; later steps forward what the last step reduced.
            send = src if s == 0 else out
            for a, b in chunk_bounds(lo, hi, chunk_elems):
                prog.isend(send[a:b], right, tag, _nothing)
            lo, hi = segs[(r - s - 1) % n]
            for a, b in chunk_bounds(lo, hi, chunk_elems):
                part = scratch[a - lo:b - lo]
                prog.irecv(part, left, tag, partial(self._reduce, src, out, part, a, b, op))
            prog.run()
            messages += prog.messages
            prog.messages = 0
            synchronize(out)
        for s in range(n - 1):
            lo, hi = segs[(r + 1 - s) % n]
            for a, b in chunk_bounds(lo, hi, chunk_elems):
                prog.isend(out[a:b], right, tag + 1, _nothing)
            lo, hi = segs[(r - s) % n]
            for a, b in chunk_bounds(lo, hi, chunk_elems):
                prog.irecv(out[a:b], left, tag + 1, _nothing)
            prog.run()
            messages += prog.messages
            prog.messages = 0
        self.last_messages = messages

    @staticmethod
    def _reduce(src: Any, out: Any, part: Any, a: int, b: int, op: str) -> None:
        if src is out:
            reduce_into(out[a:b], part, op)
        else:
            combine_into(out[a:b], src[a:b], part, op)


def _nothing() -> None:
    pass


def predict_time(topology: Topology, nbytes: int, chunk_bytes: int,
                 costs: SoftwareCosts = ENGINE_COSTS,
                 network: NetworkModel = IDEAL_NETWORK) -> float:
    """Modelled seconds of :class:`RingAllreduce` of ``nbytes`` on ``topology`` in chunks of
    ``chunk_bytes``: ``2 (n - 1)`` steps one after another, each every rank sending a segment
    of ``nbytes / n`` to the next rank at once, timed by
    :func:`~horotopo.algorithms.flows.stage_time` (the ring's arcs sharing the links they
    cross, the busiest rank's software costs)."""
    n = topology.n
    if nbytes <= 0 or n == 1:
        return 0.0
    step = [(r, (r + 1) % n, nbytes / n) for r in range(n)]
    return 2 * (n - 1) * stage_time(topology, step, chunk_bytes, costs, network)
