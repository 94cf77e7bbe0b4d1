"""NCCL's double binary tree allreduce, in rank order, over the transport: a peer to compare
horotopo's planned trees with.

Two complementary binary trees over the ranks (Sanders, Speck and Träff, "Two-tree algorithms
for full bandwidth broadcast, reduction and scan", Parallel Computing 35(12), 2009): every rank
is a leaf in one tree and an inner node in the other (for even ``n``), so the two trees
together use each rank's links in both directions about evenly. Each tree reduces half of the
buffer up to its root and broadcasts it back down, chunked and pipelined, reduce and broadcast
overlapped: NCCL's tree allreduce (NCCL 2.4, ``ncclGetBtree`` and ``ncclGetDtree`` in
``src/graph/trees.cc``).

The trees are built exactly as NCCL builds them, over the ranks in rank order (NCCL builds them
over nodes, with a chain inside each node; here every rank is its own node, as NCCL has it with
one GPU per node). The first tree (:func:`btree`) is rooted at rank 0, whose only child is the
largest power of two below ``n``; the second is its mirror (rank ``r`` plays ``n - 1 - r``)
for even ``n``, or its shift by one rank for odd ``n``. The schedule is data: the two trees
become a two-tree :class:`~horotopo.plan.Plan` with equal shares, which the engine's tree
runner (:class:`~horotopo.algorithms.tree.TreeAllreduce`) interprets like any other plan, and
that the one time model of pipelined trees predicts (:func:`predict_time`).
"""
from __future__ import annotations

import functools
from typing import Any, List, Optional, Tuple

from ..buffers import ScratchPool
from ..packing.alphabeta import ENGINE_COSTS, IDEAL_NETWORK, NetworkModel, SoftwareCosts
from ..params import ENGINE
from ..plan import Plan, modelled_rate_on, plan_from_trees
from ..topology import Topology
from ..transport.base import Transport
from .flows import plan_time
from .tree import TreeAllreduce, Window

__all__ = ["btree", "double_binary_tree", "double_tree_plan", "double_tree_plan_on",
           "predict_time", "DoubleBinaryTreeAllreduce"]

#: The chunk size the two-tree plan carries (the engine passes its own per call).
DEFAULT_CHUNK_BYTES = 1 << 20


def btree(n: int, rank: int) -> Tuple[int, List[int]]:
    """``(parent, children)`` of ``rank`` in NCCL's binary tree over ``n`` ranks rooted at 0.

    NCCL's ``ncclGetBtree``: with ``bit`` the lowest set bit of ``rank``, the parent is
    ``(rank ^ bit) | (bit << 1)``, or ``rank ^ bit`` when that is out of range; the children
    are ``rank -/+ bit / 2`` (the second one halving its step until it is in range). The root
    has one child, the largest power of two below ``n``. ``parent`` is -1 for the root.
    """
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} is not in 0..{n - 1}")
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    children: List[int] = []
    if low:
        children.append(rank - low)
        down1 = rank + low
        while down1 >= n and low:
            low >>= 1
            down1 = rank + low if low else -1
        if down1 >= 0 and low:
            children.append(down1)
    return up, children


def double_binary_tree(n: int) -> Tuple[Tuple[int, Tuple[int, ...]], Tuple[int, Tuple[int, ...]]]:
    """NCCL's two trees over ``n`` ranks: ``((root, parent), (root, parent))``, ``parent[v]``
    being ``v``'s parent (-1 at the root). The second tree mirrors the first for even ``n``
    and shifts it by one rank for odd ``n`` (``ncclGetDtree``)."""
    if n < 1:
        raise ValueError(f"a tree needs at least one rank, got {n}")
    first = tuple(btree(n, v)[0] for v in range(n))
    if n % 2 == 0:
        def image(v: int) -> int:
            return n - 1 - v
        preimage = image
    else:
        def image(v: int) -> int:
            return (v + 1) % n

        def preimage(v: int) -> int:
            return (v - 1) % n
    second = []
    for v in range(n):
        up = first[preimage(v)]
        second.append(-1 if up == -1 else image(up))
    return (first.index(-1), first), (second.index(-1), tuple(second))


@functools.lru_cache(maxsize=4)
def double_tree_plan(n: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Plan:
    """The two trees as a Plan: each reduces up and broadcasts down the same tree, and each
    carries half of the buffer (equal rates). Kept per ``(n, chunk_bytes)``: a Plan is
    immutable, and the ranks of one process (a simulation's thousands) share it."""
    trees = [(root, parent, parent, 1.0) for root, parent in double_binary_tree(n)]
    return plan_from_trees(n, trees, chunk_bytes=chunk_bytes)


def double_tree_plan_on(topology: Topology, chunk_bytes: int) -> Plan:
    """The two trees as a Plan on ``topology``: equal shares (as the runner splits buffers),
    each with half the rate that the topology's most loaded link allows the pair and its
    critical-path profile there at ``chunk_bytes``, crowded by the other tree's first chunks
    and its own that cross a link or reach a rank at the same step, as a planned plan's are
    (:meth:`~horotopo.plan.Plan.profiled_on`), so that it is timed as any plan is."""
    shape = double_tree_plan(topology.n, int(chunk_bytes))
    if len(topology.capacity_Bps) == 0:
        return shape  # one rank: no link to bound the pair's rate
    per_tree = modelled_rate_on(shape, topology) / 2
    trees = [(t.root, t.reduce_parent, t.bcast_parent, per_tree) for t in shape.trees]
    return plan_from_trees(topology.n, trees, chunk_bytes=int(chunk_bytes)).profiled_on(
        topology, int(chunk_bytes))


def predict_time(topology: Topology, nbytes: int, chunk_bytes: int,
                 costs: SoftwareCosts = ENGINE_COSTS,
                 network: NetworkModel = IDEAL_NETWORK) -> float:
    """Modelled seconds of :class:`DoubleBinaryTreeAllreduce` of ``nbytes`` on ``topology``
    in chunks of ``chunk_bytes``: :func:`double_tree_plan_on`'s two trees in the one time
    model of pipelined trees (:func:`horotopo.algorithms.flows.plan_time`)."""
    return plan_time(topology, double_tree_plan_on(topology, chunk_bytes), nbytes, chunk_bytes,
                     costs, network)


class DoubleBinaryTreeAllreduce:
    """Allreduce along NCCL's double binary tree (see the module docstring).

    Parameters
    ----------
    transport : Transport
        The message layer.
    pool : ScratchPool, optional
        Where receive scratch comes from (the engine shares one across calls).
    window : int or callable, optional
        Chunks in flight per tree and child (the tree runner's window; a callable is given
        the double binary tree's plan).
    """

    def __init__(self, transport: Transport, pool: Optional[ScratchPool] = None,
                 window: Window = None, in_flight_extra: int = ENGINE.in_flight_extra) -> None:
        self.transport = transport
        self.plan = double_tree_plan(transport.size) if transport.size > 1 else None
        self._trees = None if self.plan is None else \
            TreeAllreduce(transport, self.plan, window=window, pool=pool,
                          in_flight_extra=in_flight_extra)
        self.last_messages = 0

    def run(self, src: Any, out: Any, op: str, chunk_elems: int) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place) with ``op``."""
        if self._trees is None:  # one rank: nothing to exchange
            if src is not out:
                out[...] = src
            return
        self._trees.run(src, out, op, chunk_elems)
        self.last_messages = self._trees.last_messages
