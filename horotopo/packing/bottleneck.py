"""Seed tree pairs built for their own bottleneck rate, not for a price.

Edmonds prices one arc per node at given lengths, blind to how many children a node takes: a
node's NIC-in length does not grow as its children arrive. On racks of hosts with a few slow
NICs the optimum needs every slow host to be a leaf of every tree (it sends once and receives
once per tree pair, so its NIC is crossed exactly once each way), with the fast hosts as the
backbone, each taking no more children than its NIC carries at that rate. Column generation
gets there one tree per round and stalls on hundreds of machines.

:func:`bottleneck_pair` builds such a pair directly: a Prim-style greedy that grows one tree
from the root, each step adding the arc whose resources end up least utilised when its reduce
arc (child to parent) and its broadcast arc (parent to child, the reversed tree) are both
counted, ties broken by the arc's cost at lengths ``1/c`` and then by the parent's depth
(shallower trees). Fast arcs come first, so the fast hosts form the backbone; a slow host's
own NIC then sets its arc's utilisation, so it joins last, under a parent with room, as a leaf.
The pair is only a seed: the LP decides its rate and the certificate is unchanged.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from ..params import PLANNER
from ..topology import run_positions

__all__ = ["bottleneck_pair", "seed_pairs"]

_DIGITS = 9  # utilisations and costs that agree to this many digits tie


def _gather(matrix, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(owner, resource, weight)`` of every entry of the CSR ``matrix``'s ``rows``, with
    ``owner`` the position in ``rows`` (numpy only: scipy's row indexing costs more per call
    than the greedy's whole step)."""
    lo, hi = matrix.indptr[rows], matrix.indptr[rows + 1]
    count = hi - lo
    owner = np.repeat(np.arange(len(rows)), count)
    pos = run_positions(lo, count)
    return owner, matrix.indices[pos], matrix.data[pos]


class _PairTable:
    """Entries of every pair ``(child, parent)``, row ``child * n + parent``: its reduce arc
    child -> parent and its broadcast arc parent -> child. A resource on both arcs is counted
    per arc (they run opposite ways on links).

    Rows are padded to one width with weight 0 on an extra resource that never binds (no load,
    infinite capacity), so that a step of the greedy reads its pairs as one dense block: the
    pairs of a model carry a dozen entries each, all about alike, and a ragged gather cost
    more per step than the arithmetic."""

    def __init__(self, model) -> None:
        n = model.n
        self.n, self.spare = n, len(model.capacity)
        child, parent = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
        parts = [_gather(m, np.asarray(r, dtype=np.int64))
                 for m, r in model.arc_parts(child, parent) + model.arc_parts(parent, child)]
        owner, res, weight = (np.concatenate(x) for x in zip(*parts))
        order = np.argsort(owner, kind="stable")  # each row's entries in the order given
        owner, res, weight = owner[order], res[order], weight[order]
        count = np.bincount(owner, minlength=n * n)
        width = max(1, int(count.max())) if len(count) else 1
        slot = np.arange(len(owner)) - np.repeat(np.cumsum(count) - count, count)
        self.resource = np.full((n * n, width), self.spare, dtype=np.int64)
        self.weight = np.zeros((n * n, width))
        self.resource[owner, slot], self.weight[owner, slot] = res, weight

    def rows(self, v: int, others: np.ndarray, child_is_v: bool) -> np.ndarray:
        """Rows of the pairs of ``v`` with each node of ``others``, ``v`` the child
        (``child_is_v``) or the parent."""
        others = np.asarray(others, dtype=np.int64)
        return v * self.n + others if child_is_v else others * self.n + v

    def utilisation(self, rows: np.ndarray, load: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """Per row: the highest ``(load + weight) / c`` over its entries (0 with none);
        ``load`` and ``cap`` carry the spare resource last."""
        res = self.resource[rows]
        return ((load[res] + self.weight[rows]) / cap[res]).max(axis=1, initial=0.0)


def bottleneck_pair(model, root: int, target: float = np.inf,
                    table: Optional[_PairTable] = None) -> Tuple[int, ...]:
    """Parent array of a tree over ``model``'s nodes, rooted at ``root``, that serves as both
    the reduce tree (arcs to the parent) and the broadcast tree (arcs from it) of a seed pair.

    Parameters
    ----------
    model : ArcModel or HostModel
        Needs ``n``, ``capacity``, ``arc_parts``, ``arc_costs`` and ``half_load``.
    root : int
    target : float
        A rate the tree need not beat (a known upper bound): arcs that keep every resource
        within it count as free, so depth and cost choose among them (else the greedy fills
        the least loaded nodes first, which are the newest, and grows chains).
    table : optional
        :class:`_PairTable` of ``model``, where the caller grows several trees on it.

    Returns
    -------
    tuple of int
        ``parent[v]`` (``-1`` at the root).
    """
    n = model.n
    cap = np.asarray(model.capacity, dtype=float)
    lengths = 1.0 / cap
    unit = float(lengths.max())  # utilisations are compared in units of the slowest resource
    load = model.half_load([-1] * n, True) + model.half_load([-1] * n, False)  # fixed stage
    table = _PairTable(model) if table is None else table
    # the table's spare resource last: no load, never binding
    load, cap = np.append(load, 0.0), np.append(cap, np.inf)
    w = model.arc_costs(lengths)
    # [child, parent]: its reduce arc and its broadcast arc, in units of the slowest resource
    pair_cost = np.round((w + w.T) / unit, _DIGITS)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    inside = np.zeros(n, dtype=bool)
    inside[root] = True
    # Every outside node's best known parent, with that arc's (utilisation, cost); the
    # utilisation may be stale (loads only grow) and is checked again before the arc is used.
    util = np.full(n, np.inf)
    cost = np.full(n, np.inf)
    best = np.full(n, root, dtype=np.int64)
    # The tree's bottleneck so far (utilisation: load per unit rate over capacity), at least
    # that of the target rate: an arc that stays below it costs no rate.
    top = [1.0 / target]

    def rank(u_util: np.ndarray) -> np.ndarray:
        """The sort key's first part: how far an arc raises the bottleneck."""
        return np.round(np.maximum(u_util, top[0]) / unit, _DIGITS)

    def first(u_util: np.ndarray, u_cost: np.ndarray, parents: np.ndarray) -> int:
        """Position of the best arc: raising the bottleneck least, then cost, then the
        parent's depth, which keeps the trees shallow where the rate does not care."""
        return int(np.lexsort((depth[parents], u_cost, rank(u_util)))[0])

    def offer(u: int) -> None:
        """Arcs from every outside node to the new inside node ``u``."""
        out = np.flatnonzero(~inside)
        if not len(out):
            return
        u_util = table.utilisation(table.rows(u, out, False), load, cap)
        u_cost = pair_cost[out, u]
        new_key = (rank(u_util), u_cost, np.full(len(out), depth[u]))
        old_key = (rank(util[out]), cost[out], depth[best[out]])
        # new before old in lexicographic order
        better = np.zeros(len(out), dtype=bool)
        decided = np.zeros(len(out), dtype=bool)
        for new, old in zip(new_key, old_key):
            better |= ~decided & (new < old)
            decided |= new != old
        take = out[better]
        util[take], cost[take], best[take] = u_util[better], u_cost[better], u

    def refresh(v: int) -> None:
        """``v``'s best parent among all inside nodes at the current loads."""
        ins = np.flatnonzero(inside)
        v_util = table.utilisation(table.rows(v, ins, True), load, cap)
        v_cost = pair_cost[v, ins]
        i = first(v_util, v_cost, ins)
        util[v], cost[v], best[v] = v_util[i], v_cost[i], ins[i]

    offer(root)
    while not inside.all():
        out = np.flatnonzero(~inside)
        pick = int(out[first(util[out], cost[out], best[out])])
        row = table.rows(pick, np.array([best[pick]]), True)
        now = table.utilisation(row, load, cap)
        if rank(now)[0] > rank(util[[pick]])[0]:
            refresh(pick)  # loads grew since this key was computed
            continue
        u = int(best[pick])
        parent[pick], depth[pick], inside[pick] = u, depth[u] + 1, True
        np.add.at(load, table.resource[row[0]], table.weight[row[0]])
        top[0] = max(top[0], float(now[0]))
        util[pick] = np.inf
        offer(pick)
    return tuple(int(p) for p in parent)


def seed_pairs(model, roots: int = PLANNER.seed_roots, target: float = np.inf
               ) -> List[Tuple[bool, int, Tuple[int, ...]]]:
    """Reduce and broadcast halves of :func:`bottleneck_pair` at the ``roots`` nodes whose arcs
    cost least in all at lengths ``1/c`` (central, fast ones), for
    :func:`horotopo.packing.gk.pack`'s ``seeds``."""
    w = model.arc_costs(1.0 / np.asarray(model.capacity, dtype=float))
    central = np.argsort(w.sum(axis=0) + w.sum(axis=1), kind="stable")[:roots]
    halves = []
    table = _PairTable(model)
    for r in central:
        parent = bottleneck_pair(model, int(r), target, table)
        halves += [(True, int(r), parent), (False, int(r), parent)]
    return halves
