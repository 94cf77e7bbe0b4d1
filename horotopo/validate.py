"""Invariant checks on a Plan and on its step tables, each failure naming the invariant.

A Plan is only as good as the promises the engine relies on: its trees reach their roots, its
shares cut every buffer completely, its rates fit the network it was planned for, and the step
tables compiled from it (:mod:`horotopo.schedule`) move every chunk where it must go exactly
once, with every send matched by a receive. :func:`validate` checks all of it and returns a
:class:`Report` of what it checked and what it could not; the first broken invariant raises
:class:`InvariantError`, whose ``invariant`` is one of :data:`INVARIANTS`' keys.

Capacity needs the network: a Plan carries only its topology's name and digest, so
``"capacity"`` is checked when the caller passes the :class:`~horotopo.topology.Topology`
(with ``horotopo.packing.ArcModel``'s loads, the model the packing optimized) and reported as
skipped otherwise.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .packing import ArcModel, validate_arborescence
from .plan import Plan, PlanError
from .schedule import (RECV_CHILD, RECV_PARENT, SEND_CHILD, SEND_PARENT, Schedule,
                       compile_allreduce, compile_broadcast)
from .topology import Topology

__all__ = ["InvariantError", "Report", "INVARIANTS", "check_plan", "check_capacity",
           "check_tables", "validate"]

INVARIANTS: Dict[str, str] = {
    "plan-shape": "at least one rank, at least one tree, a positive chunk size",
    "reduce-arborescence": "every reduce tree spans the ranks and points into its root",
    "broadcast-arborescence": "every broadcast tree spans the ranks and points out of its root",
    "shares-sum-to-one": "shares are finite, >= 0 and sum to 1",
    "rates-positive": "every tree's rate is finite and > 0",
    "capacity": "no resource of the planned topology carries more than its capacity",
    "tables-consistent": "one table per rank, of the same collective, plan and chunk offsets",
    "segments-cover-buffer": "the chunks of all trees tile the buffer exactly once",
    "reduce-sends-once": "in the reduce, every non-root sends each chunk up exactly once and "
                         "the root never",
    "reduce-reaches-root": "the reduce sends of each chunk lead from every rank to the root",
    "broadcast-receives-once": "in the broadcast, every rank but the root receives each chunk "
                               "exactly once and the root never",
    "broadcast-reaches-all": "the broadcast receives of each chunk lead from the root to every "
                             "rank",
    "messages-match": "every send is matched by one receive at its peer, of the same chunk, "
                      "offsets and stream",
}

# Loads are sums of rates the LP solved to its own tolerance; a plan that uses a resource to
# 1 + 1e-6 of its capacity is full, not over.
CAPACITY_RTOL = 1e-6
SHARE_ATOL = 1e-9


class InvariantError(PlanError):
    """A plan or step table that breaks an invariant; ``invariant`` names it."""

    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant = invariant
        super().__init__(f"invariant {invariant!r} ({INVARIANTS[invariant]}) violated: {detail}")


@dataclass(frozen=True)
class Report:
    """What :func:`validate` checked, and what it skipped with the reason."""

    checked: Tuple[str, ...]
    skipped: Tuple[Tuple[str, str], ...] = ()

    def describe(self) -> str:
        lines = [f"plan invariants: {len(self.checked)} checked, {len(self.skipped)} skipped"]
        lines += [f"  ok       {name}: {INVARIANTS[name]}" for name in self.checked]
        lines += [f"  skipped  {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def check_plan(plan: Plan) -> Tuple[str, ...]:
    """Check the plan's own invariants (everything but capacity); return their names."""
    if plan.n < 1 or not plan.trees or plan.chunk_bytes < 1:
        raise InvariantError("plan-shape", f"n {plan.n}, {len(plan.trees)} trees, chunk_bytes "
                                           f"{plan.chunk_bytes}")
    for k, t in enumerate(plan.trees):
        problem = validate_arborescence(t.reduce_parent, t.root, plan.n)
        if problem:
            raise InvariantError("reduce-arborescence", f"trees[{k}].reduce_parent: {problem}")
        problem = validate_arborescence(t.bcast_parent, t.root, plan.n)
        if problem:
            raise InvariantError("broadcast-arborescence", f"trees[{k}].bcast_parent: {problem}")
    shares = [t.share for t in plan.trees]
    bad = [k for k, s in enumerate(shares) if not (math.isfinite(s) and s >= 0)]
    if bad:
        raise InvariantError("shares-sum-to-one", f"trees[{bad[0]}].share is {shares[bad[0]]}")
    if abs(sum(shares) - 1.0) > SHARE_ATOL:
        raise InvariantError("shares-sum-to-one", f"the shares sum to {sum(shares)!r}")
    for k, t in enumerate(plan.trees):
        if not (math.isfinite(t.rate_Bps) and t.rate_Bps > 0):
            raise InvariantError("rates-positive", f"trees[{k}].rate_Bps is {t.rate_Bps}")
    return ("plan-shape", "reduce-arborescence", "broadcast-arborescence", "shares-sum-to-one",
            "rates-positive")


def check_capacity(plan: Plan, topology: Topology) -> None:
    """Raise unless the plan's rates fit ``topology``'s resources on the packing's model.

    Every arc ``v -> reduce_parent[v]`` and ``bcast_parent[v] -> v`` of tree ``t`` loads each
    resource on its route with ``rate_t``; the sum over trees must stay within capacity.
    """
    if topology.n != plan.n:
        raise InvariantError("capacity", f"the topology has {topology.n} ranks, the plan "
                                         f"{plan.n}")
    if plan.topology_digest and plan.topology_digest != topology.digest:
        raise InvariantError("capacity", f"the plan was made for topology digest "
                                         f"{plan.topology_digest}, not {topology.digest} "
                                         f"({topology.name})")
    model = ArcModel(topology)
    load = np.zeros(len(model.capacity))
    for t in plan.trees:
        load += t.rate_Bps * model.load(t.root, t.reduce_parent, t.bcast_parent)
    over = load - model.capacity * (1 + CAPACITY_RTOL)
    worst = int(np.argmax(over)) if len(over) else 0
    if len(over) and over[worst] > 0:
        raise InvariantError("capacity", f"resource {topology.resources[worst]!r} carries "
                                         f"{load[worst]:.6g} B/s, capacity "
                                         f"{model.capacity[worst]:.6g} B/s")


def check_tables(plan: Plan, tables: Sequence[Schedule]) -> Tuple[str, ...]:
    """Check one collective's step tables, ``tables[v]`` being rank ``v``'s; return the
    invariants checked."""
    _consistent(plan, tables)
    _cover(tables[0])
    # sends[(tree, chunk)] and receives, as (sender, receiver, stream, start, length) tuples
    sends: Counter = Counter()
    recvs: Counter = Counter()
    up: Dict[Tuple[int, int], List[int]] = {}
    down: Dict[Tuple[int, int], List[int]] = {}
    roots = {t.tree: t.root for t in tables[0].trees}
    for v, table in enumerate(tables):
        for s in table.rows():
            key = (s.tree, s.chunk)
            if s.direction in (SEND_PARENT, SEND_CHILD):
                sends[key + (v, s.peer, s.stream, s.start, s.length)] += 1
            else:
                recvs[key + (s.peer, v, s.stream, s.start, s.length)] += 1
            if s.direction == SEND_PARENT:
                up.setdefault(key, [-1] * plan.n)
                if up[key][v] != -1:
                    raise InvariantError("reduce-sends-once", f"rank {v} sends chunk {s.chunk} "
                                                              f"of tree {s.tree} up twice")
                up[key][v] = s.peer
            elif s.direction == RECV_PARENT:
                down.setdefault(key, [-1] * plan.n)
                if down[key][v] != -1:
                    raise InvariantError("broadcast-receives-once",
                                         f"rank {v} receives chunk {s.chunk} of tree {s.tree} "
                                         f"twice")
                down[key][v] = s.peer
    allreduce = tables[0].kind == "allreduce"
    for t in tables[0].trees:
        for k in range(len(t.chunks)):
            if allreduce:
                _each_but_root(up.get((t.tree, k), [-1] * plan.n), roots[t.tree], t.tree, k,
                               "reduce-sends-once", "reduce-reaches-root", "send up")
            elif (t.tree, k) in up:
                raise InvariantError("reduce-sends-once", f"a broadcast sends chunk {k} of "
                                                          f"tree {t.tree} up")
            _each_but_root(down.get((t.tree, k), [-1] * plan.n), roots[t.tree], t.tree, k,
                           "broadcast-receives-once", "broadcast-reaches-all", "receive")
    if sends != recvs:
        lonely = (sends - recvs) or (recvs - sends)
        (tree, chunk, src, dst, stream, start, length), _ = next(iter(lonely.items()))
        side = "send" if sends - recvs else "receive"
        raise InvariantError("messages-match", f"a {side} of chunk {chunk} of tree {tree} from "
                                               f"rank {src} to rank {dst} (stream {stream}, "
                                               f"[{start}, +{length})) has no partner")
    return ("tables-consistent", "segments-cover-buffer", "reduce-sends-once",
            "reduce-reaches-root", "broadcast-receives-once", "broadcast-reaches-all",
            "messages-match")


def _consistent(plan: Plan, tables: Sequence[Schedule]) -> None:
    if len(tables) != plan.n:
        raise InvariantError("tables-consistent", f"{len(tables)} tables for {plan.n} ranks")
    first = tables[0]
    shape = (first.kind, first.count, first.chunk_elems, first.root, first.tags)
    layout = [(t.tree, t.root, t.chunks, t.stream_up, t.stream_down) for t in first.trees]
    for v, table in enumerate(tables):
        if table.rank != v or table.n != plan.n or table.plan_digest != plan.digest:
            raise InvariantError("tables-consistent", f"table {v} is rank {table.rank}'s of "
                                                      f"{table.n}, plan {table.plan_digest} "
                                                      f"(want plan {plan.digest})")
        if (table.kind, table.count, table.chunk_elems, table.root, table.tags) != shape:
            raise InvariantError("tables-consistent", f"rank {v}'s table is for another "
                                                      f"collective than rank 0's")
        if [(t.tree, t.root, t.chunks, t.stream_up, t.stream_down)
                for t in table.trees] != layout:
            raise InvariantError("tables-consistent", f"rank {v} cuts the trees' chunks or "
                                                      f"streams differently from rank 0")


def _cover(table: Schedule) -> None:
    pieces = sorted(c for t in table.trees for c in t.chunks)
    at = 0
    for a, b in pieces:
        if a != at or not 0 < b - a <= table.chunk_elems:
            raise InvariantError("segments-cover-buffer", f"chunk [{a}, {b}) follows offset "
                                                          f"{at} (chunks of at most "
                                                          f"{table.chunk_elems})")
        at = b
    if at != table.count:
        raise InvariantError("segments-cover-buffer", f"the chunks end at {at}, the buffer at "
                                                      f"{table.count}")


def _each_but_root(parent: List[int], root: int, tree: int, chunk: int, once: str,
                   reach: str, verb: str) -> None:
    """``parent[v]``: whom rank ``v`` sends chunk ``chunk`` up to / receives it from."""
    for v, p in enumerate(parent):
        if (p < 0) != (v == root):
            what = "the root does" if v == root else f"rank {v} does not"
            raise InvariantError(once, f"{what} {verb} chunk {chunk} of tree {tree}")
    problem = validate_arborescence(parent, root, len(parent))
    if problem:
        raise InvariantError(reach, f"chunk {chunk} of tree {tree}: {problem}")


def validate(plan: Plan, topology: Optional[Topology] = None, *, count: Optional[int] = None,
             chunk_elems: int = 4, dtype: str = "float32",
             roots: Optional[Iterable[int]] = None) -> Report:
    """Check every invariant of ``plan`` and of its step tables; raise the first broken one.

    Parameters
    ----------
    plan : Plan
        The plan to check.
    topology : Topology, optional
        The network it was planned for; without it ``"capacity"`` is skipped (a Plan carries
        only the topology's digest, not its resources).
    count : int, optional
        Elements of the buffer the tables are compiled for; None takes enough for a few chunks
        per tree and a short last chunk.
    chunk_elems : int
        Elements per chunk (small, so that every tree has several chunks).
    dtype : str
        Element type of the tables.
    roots : iterable of int, optional
        Broadcast roots to check (each also as a single-chunk broadcast); None: every rank up
        to 16 ranks, else the first, a middle and the last rank.

    Returns
    -------
    Report
        The invariants checked, and those skipped with the reason.

    Raises
    ------
    InvariantError
        The first broken invariant, by name.
    """
    checked = list(check_plan(plan))
    skipped: List[Tuple[str, str]] = []
    if topology is not None:
        check_capacity(plan, topology)
        checked.append("capacity")
    else:
        skipped.append(("capacity", "no topology given (a Plan carries only its digest)"))
    if count is None:
        count = 3 * chunk_elems * len(plan.trees) + chunk_elems // 2 + 1
    if roots is None:
        roots = range(plan.n) if plan.n <= 16 else sorted({0, plan.n // 2, plan.n - 1})
    ranks = range(plan.n)
    names = check_tables(plan, [compile_allreduce(plan, v, count, dtype, chunk_elems)
                                for v in ranks])
    for root in roots:
        for size in (count, chunk_elems):
            check_tables(plan, [compile_broadcast(plan, v, size, dtype, chunk_elems, root)
                                for v in ranks])
    checked += [name for name in names if name not in checked]
    return Report(checked=tuple(checked), skipped=tuple(skipped))
