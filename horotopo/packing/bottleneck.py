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

__all__ = ["bottleneck_pair", "seed_pairs"]

_DIGITS = 9  # utilisations and costs that agree to this many digits tie


def _gather(matrix, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(owner, resource, weight)`` of every entry of the CSR ``matrix``'s ``rows``, with
    ``owner`` the position in ``rows`` (numpy only: scipy's row indexing costs more per call
    than the greedy's whole step)."""
    lo, hi = matrix.indptr[rows], matrix.indptr[rows + 1]
    count = hi - lo
    owner = np.repeat(np.arange(len(rows)), count)
    pos = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) \
        + np.repeat(lo, count)
    return owner, matrix.indices[pos], matrix.data[pos]


class _Rows:
    """Entries grouped by row, as the parts of a CSR matrix that :func:`_gather` reads."""

    def __init__(self, owner: np.ndarray, indices: np.ndarray, data: np.ndarray, rows: int):
        order = np.argsort(owner, kind="stable")  # each row's entries in the order given
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=rows))])
        self.indices, self.data = indices[order], data[order]


def _pair_table(model) -> _Rows:
    """Entries of every pair ``(child, parent)``, row ``child * n + parent``: its reduce arc
    child -> parent and its broadcast arc parent -> child. A resource on both arcs is counted
    per arc (they run opposite ways on links). Built once, so that each step of the greedy
    reads one row per pair instead of gathering every arc part again."""
    n = model.n
    child, parent = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
    parts = [_gather(m, np.asarray(r, dtype=np.int64))
             for m, r in model.arc_parts(child, parent) + model.arc_parts(parent, child)]
    owner, res, weight = (np.concatenate(x) for x in zip(*parts))
    return _Rows(owner, res, weight, n * n)


def _pair_entries(table: _Rows, n: int, v: int, others: np.ndarray, child_is_v: bool):
    """Entries (as :func:`_gather`) of the pairs of ``v`` with each node of ``others``, ``v``
    the child (``child_is_v``) or the parent."""
    others = np.asarray(others, dtype=np.int64)
    return _gather(table, v * n + others if child_is_v else others * n + v)


def _utilisation(entries, count: int, load: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Per pair: the highest ``(load + weight) / c`` over its entries (0 with none)."""
    owner, res, weight = entries
    util = np.zeros(count)
    np.maximum.at(util, owner, (load[res] + weight) / cap[res])
    return util


def bottleneck_pair(model, root: int, target: float = np.inf,
                    table: Optional[_Rows] = None) -> Tuple[int, ...]:
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
        :func:`_pair_table` of ``model``, where the caller grows several trees on it.

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
    table = _pair_table(model) if table is None else table
    w = model.arc_costs(lengths)
    pair_cost = w + w.T  # [child, parent]: its reduce arc and its broadcast arc
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

    def key(u_util: np.ndarray, u_cost: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """Sort key (last is first): raising the bottleneck, then cost, then the parent's
        depth, which keeps the trees shallow where the rate does not care."""
        return np.stack([depth[parents], np.round(u_cost / unit, _DIGITS),
                         np.round(np.maximum(u_util, top[0]) / unit, _DIGITS)])

    def first(keys: np.ndarray) -> np.ndarray:
        return np.lexsort(keys)

    def offer(u: int) -> None:
        """Arcs from every outside node to the new inside node ``u``."""
        out = np.flatnonzero(~inside)
        if not len(out):
            return
        u_util = _utilisation(_pair_entries(table, n, u, out, False), len(out), load, cap)
        u_cost = pair_cost[out, u]
        new_key = key(u_util, u_cost, np.full(len(out), u))
        old_key = key(util[out], cost[out], best[out])
        # new before old in lexicographic order (last row most significant)
        better = np.zeros(len(out), dtype=bool)
        decided = np.zeros(len(out), dtype=bool)
        for row in (2, 1, 0):
            better |= ~decided & (new_key[row] < old_key[row])
            decided |= new_key[row] != old_key[row]
        take = out[better]
        util[take], cost[take], best[take] = u_util[better], u_cost[better], u

    def refresh(v: int) -> None:
        """``v``'s best parent among all inside nodes at the current loads."""
        ins = np.flatnonzero(inside)
        v_util = _utilisation(_pair_entries(table, n, v, ins, True), len(ins), load, cap)
        v_cost = pair_cost[v, ins]
        i = first(key(v_util, v_cost, ins))[0]
        util[v], cost[v], best[v] = v_util[i], v_cost[i], ins[i]

    offer(root)
    while not inside.all():
        out = np.flatnonzero(~inside)
        pick = out[first(key(util[out], cost[out], best[out]))[0]]
        entries = _pair_entries(table, n, int(pick), np.array([best[pick]]), True)
        now = _utilisation(entries, 1, load, cap)
        if key(now, cost[[pick]], best[[pick]])[2, 0] > key(util[[pick]], cost[[pick]],
                                                            best[[pick]])[2, 0]:
            refresh(int(pick))  # loads grew since this key was computed
            continue
        u = int(best[pick])
        parent[pick], depth[pick], inside[pick] = u, depth[u] + 1, True
        np.add.at(load, entries[1], entries[2])
        top[0] = max(top[0], float(now[0]))
        util[pick] = np.inf
        offer(int(pick))
    return tuple(int(p) for p in parent)


def seed_pairs(model, roots: int = PLANNER.seed_roots, target: float = np.inf
               ) -> List[Tuple[bool, int, Tuple[int, ...]]]:
    """Reduce and broadcast halves of :func:`bottleneck_pair` at the ``roots`` nodes whose arcs
    cost least in all at lengths ``1/c`` (central, fast ones), for
    :func:`horotopo.packing.gk.pack`'s ``seeds``."""
    w = model.arc_costs(1.0 / np.asarray(model.capacity, dtype=float))
    central = np.argsort(w.sum(axis=0) + w.sum(axis=1), kind="stable")[:roots]
    halves = []
    table = _pair_table(model)
    for r in central:
        parent = bottleneck_pair(model, int(r), target, table)
        halves += [(True, int(r), parent), (False, int(r), parent)]
    return halves
