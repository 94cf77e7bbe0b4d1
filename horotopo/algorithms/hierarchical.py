"""Hierarchical allreduce over the transport: what Horovod runs with
``HOROVOD_HIERARCHICAL_ALLREDUCE`` on multi-GPU hosts, as a peer to compare horotopo's plans with.

The hosts are the ranks' processor names, grouped as ``local_rank`` groups them
(:func:`horotopo.probe.hostinfer.host_layout`). With ``K`` the most ranks on one host, the
buffer is cut into ``K`` shards; on a host of ``k`` ranks shard ``c`` belongs to its local rank
``c mod k`` (with equal hosts, local rank ``c`` owns shard ``c`` alone). Three stages, each
finished before the next starts:

1. reduce-scatter inside each host: every rank sends each shard it does not own to the shard's
   owner, which reduces its own part and the others' in local-rank order;
2. across hosts, the owners of shard ``c`` (one per host) allreduce it with ring allreduce
   (:class:`~horotopo.algorithms.ring.RingAllreduce` over those ranks alone; Horovod calls
   MPI_Allreduce on its cross communicator here);
3. allgather inside each host: each owner sends its finished shards to the other ranks of its
   host.

Every shard's final bits are made once, by the cross-host ring, and only copied afterwards, so
every rank ends with identical results. Hosts of unequal sizes work: a rank that owns several
shards runs their rings one after another, in shard order, as every other rank does, so no
ring waits on one that waits on it. The schedule is data (:func:`hierarchical_schedule`); the
runner only moves the messages it lists. :func:`predict_time` is its modelled time on a
topology, with the software costs the plans' predictions charge.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from .. import config
from ..buffers import (ScratchPool, chunk_bounds, combine_into, reduce_into, segment_bounds,
                       synchronize)
from ..packing.alphabeta import ENGINE_COSTS, IDEAL_NETWORK, NetworkModel, SoftwareCosts
from ..probe.group import GroupTransport
from ..probe.hostinfer import HostLayout, generated_hosts, host_layout
from ..topology import Topology
from ..transport.base import Transport
from .flows import Flow, stage_time
from .progress import Progress
from .ring import RingAllreduce

__all__ = ["HierarchicalAllreduce", "HostSchedule", "hierarchical_schedule", "predict_time",
           "topology_hosts"]

#: Tags of one call's cross-host rings (a group transport's smallest block); the rings of
#: different shards share them, since a rank runs its rings one after another.
RING_TAGS = 65


@dataclass(frozen=True)
class HostSchedule:
    """One rank's part of a hierarchical allreduce of ``count`` elements.

    Attributes
    ----------
    shards : tuple of (int, int)
        ``[lo, hi)`` of every shard, the same on every rank (some may be empty).
    local : tuple of int
        The world ranks of this rank's host, ascending (local rank order).
    owner : tuple of int
        ``owner[c]``: the world rank of this host that owns shard ``c``.
    rings : tuple of (int, tuple of int)
        ``(c, ranks)`` for every non-empty shard ``c`` this rank owns, in shard order:
        the world ranks, one per host in host order, that allreduce shard ``c``.
    """

    shards: Tuple[Tuple[int, int], ...]
    local: Tuple[int, ...]
    owner: Tuple[int, ...]
    rings: Tuple[Tuple[int, Tuple[int, ...]], ...]


@functools.lru_cache(maxsize=64)
def hierarchical_schedule(layout: HostLayout, rank: int, count: int) -> HostSchedule:
    """Rank ``rank``'s :class:`HostSchedule` for ``count`` elements on the hosts ``layout``
    (pure, and kept per input: a training loop repeats a few sizes)."""
    widest = max(len(m) for m in layout.members)
    shards = tuple(segment_bounds(count, [1.0 / widest] * widest))
    local = layout.members[layout.host_of[rank]]
    owner = tuple(local[c % len(local)] for c in range(widest))
    rings = tuple((c, tuple(m[c % len(m)] for m in layout.members))
                  for c, (lo, hi) in enumerate(shards) if owner[c] == rank and hi > lo)
    return HostSchedule(shards, tuple(local), owner, rings)


class HierarchicalAllreduce:
    """Reduce-scatter in each host, ring allreduce of each shard across hosts, allgather in
    each host (see the module docstring).

    Parameters
    ----------
    transport : Transport
        The message layer.
    pool : ScratchPool, optional
        Where receive scratch comes from (the engine shares one across calls).
    hosts : sequence of str, optional
        Every rank's host name, in rank order. None: the ranks exchange their transport's
        ``processor_name`` at the first call (or at :meth:`layout`), a collective step.
    """

    def __init__(self, transport: Transport, pool: Optional[ScratchPool] = None,
                 hosts: Optional[Sequence[str]] = None) -> None:
        self.transport = transport
        self.pool = pool or ScratchPool()
        self.last_messages = 0
        self._layout: Optional[HostLayout] = None
        if hosts is not None:
            if len(hosts) != transport.size:
                raise ValueError(f"hosts names {len(hosts)} ranks; the transport has "
                                 f"{transport.size}")
            self._layout = host_layout(hosts)

    def layout(self) -> HostLayout:
        """The hosts of the ranks. The first call without ``hosts`` given is collective:
        every rank must make it (the first allreduce does)."""
        if self._layout is None:
            t = self.transport
            names = t.allgather_object(t.processor_name, float(config.get("HOROTOPO_TIMEOUT_S")),
                                       what="hierarchical allreduce: host names")
            self._layout = host_layout([str(name) for name in names])
        return self._layout

    def run(self, src: Any, out: Any, op: str, chunk_elems: int) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place) with ``op``."""
        t = self.transport
        if t.size == 1:
            if src is not out:
                out[...] = src
            return
        plan = hierarchical_schedule(self.layout(), t.rank, int(out.size))
        tag = t.alloc_tags(2 + RING_TAGS)
        messages = self._reduce_scatter(plan, src, out, op, chunk_elems, tag)
        for c, ranks in plan.rings:
            lo, hi = plan.shards[c]
            shard = out[lo:hi]
            ring = RingAllreduce(GroupTransport(t, ranks, tag + 2, RING_TAGS), pool=self.pool)
            ring.run(shard, shard, op, chunk_elems)
            messages += ring.last_messages
        self.last_messages = messages + self._allgather(plan, out, chunk_elems, tag + 1)

    def _reduce_scatter(self, plan: HostSchedule, src: Any, out: Any, op: str,
                        chunk_elems: int, tag: int) -> int:
        me = self.transport.rank
        others = [m for m in plan.local if m != me]
        mine = [c for c, _ in plan.rings]
        if not others:
            if src is not out:
                out[...] = src
                synchronize(out)
            return 0
        widths = [plan.shards[c][1] - plan.shards[c][0] for c in mine]
        scratch = self.pool.get(sum(widths) * len(others), out)
        prog = Progress(self.transport)
        for c, (lo, hi) in enumerate(plan.shards):
            if plan.owner[c] != me:
                for a, b in chunk_bounds(lo, hi, chunk_elems):
                    prog.isend(src[a:b], plan.owner[c], tag, _nothing)
        parts: List[Tuple[int, List[Any]]] = []
        at = 0
        for c, width in zip(mine, widths):
            lo = plan.shards[c][0]
            rows = []
            for m in others:
                row = scratch[at:at + width]
                at += width
                rows.append(row)
                for a, b in chunk_bounds(lo, lo + width, chunk_elems):
                    prog.irecv(row[a - lo:b - lo], m, tag, _nothing)
            parts.append((c, rows))
        prog.run()
        # This rank's own part first, then the others' in local-rank order, whatever order
        # the messages arrived in: the same operands in the same order on every run.
        for c, rows in parts:
            lo, hi = plan.shards[c]
            if src is out:
                reduce_into(out[lo:hi], rows[0], op)
            else:
                combine_into(out[lo:hi], src[lo:hi], rows[0], op)
            for row in rows[1:]:
                reduce_into(out[lo:hi], row, op)
        # The rings send what these reductions wrote: device kernels must be done first.
        synchronize(out)
        return prog.messages

    def _allgather(self, plan: HostSchedule, out: Any, chunk_elems: int, tag: int) -> int:
        me = self.transport.rank
        others = [m for m in plan.local if m != me]
        if not others:
            return 0
        prog = Progress(self.transport)
        for c, (lo, hi) in enumerate(plan.shards):
            for a, b in chunk_bounds(lo, hi, chunk_elems):
                if plan.owner[c] == me:
                    for m in others:
                        prog.isend(out[a:b], m, tag, _nothing)
                else:
                    prog.irecv(out[a:b], plan.owner[c], tag, _nothing)
        prog.run()
        return prog.messages


def _nothing() -> None:
    pass


# -- the model ---------------------------------------------------------------------------------
def topology_hosts(topology: Topology) -> List[str]:
    """Each rank's host on ``topology``, as its processor name would group it: a declared
    multi-GPU host's ranks (``<host>g<k>`` under the switch ``<host>``,
    :func:`~horotopo.probe.hostinfer.generated_hosts`) by that host, any other rank, and
    every rank of a measured topology, by its own node."""
    if topology.kind != "declared":
        return list(topology.hosts)
    return generated_hosts(topology.to_json())


def predict_time(topology: Topology, hosts: Sequence[str], nbytes: int, chunk_bytes: int,
                 costs: SoftwareCosts = ENGINE_COSTS,
                 network: NetworkModel = IDEAL_NETWORK) -> float:
    """Modelled seconds of a hierarchical allreduce of ``nbytes`` on ``topology``, its ranks
    on the hosts named by ``hosts`` (each rank's processor name), in chunks of ``chunk_bytes``.

    The three stages one after another, each timed by
    :func:`~horotopo.algorithms.flows.stage_time` on ``network``: the reduce-scatter
    in each host, ``2 (H - 1)`` steps of the cross-host rings (all shards' rings at once, a
    ``1 / H`` of a shard per step; a rank that owns several shards runs its rings one after
    another), the allgather in each host. The software costs are the plans' own
    (:data:`~horotopo.packing.alphabeta.ENGINE_COSTS` by default).
    """
    if nbytes <= 0 or topology.n == 1:
        return 0.0
    if len(hosts) != topology.n:
        raise ValueError(f"hosts names {len(hosts)} ranks; the topology has {topology.n}")
    layout = host_layout(hosts)
    widest = max(len(m) for m in layout.members)
    shard = nbytes / widest
    chunk = max(1, int(chunk_bytes))
    inside: List[Flow] = []
    gather: List[Flow] = []
    for members in layout.members:
        for c in range(widest):
            owner = members[c % len(members)]
            inside += [(m, owner, shard) for m in members if m != owner]
            gather += [(owner, m, shard) for m in members if m != owner]
    hosts_n = len(layout.members)
    total = stage_time(topology, inside, chunk, costs, network) + \
        stage_time(topology, gather, chunk, costs, network)
    if hosts_n > 1:
        step = [(m[c % len(m)], layout.members[(h + 1) % hosts_n][
                    c % len(layout.members[(h + 1) % hosts_n])], shard / hosts_n)
                for c in range(widest) for h, m in enumerate(layout.members)]
        rounds = max(math.ceil(widest / len(m)) for m in layout.members)
        total += rounds * 2 * (hosts_n - 1) * stage_time(topology, step, chunk, costs, network)
    return total
