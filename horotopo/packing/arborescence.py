"""Minimum-cost arborescences on dense cost matrices (Chu-Liu/Edmonds), vectorized with NumPy.

This is the packing's oracle: under resource lengths ``y`` every logical arc ``u -> v`` costs
``W[u, v] = sum_{l in route(u, v)} y_l`` and the cheapest reduce tree into ``r`` and broadcast
tree out of ``r`` are minimum arborescences. networkx's generic implementation works on Python
dicts and is far too slow to be called ``2n`` times per packing iteration at 64 ranks; here each
contraction level costs a handful of O(n^2) array operations, whatever the number of cycles.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order

__all__ = ["min_out_arborescence", "min_in_arborescence", "arborescence_cost",
           "best_root_arborescence"]

_INF = np.inf


def min_out_arborescence(cost: np.ndarray, root: int) -> Tuple[np.ndarray, float]:
    """Cheapest spanning out-arborescence from ``root``.

    Parameters
    ----------
    cost : (n, n) array
        ``cost[u, v]`` is the cost of arc ``u -> v``; ``inf`` marks a missing arc. The diagonal
        is ignored.
    root : int

    Returns
    -------
    parent : (n,) int array
        ``parent[v]`` is the tail of the arc entering ``v``; ``parent[root] == -1``.
    total : float
        Sum of the chosen arcs' costs.

    Raises
    ------
    ValueError
        When some rank cannot be reached from ``root``.
    """
    w = np.array(cost, dtype=float, copy=True)
    n = w.shape[0]
    if w.shape != (n, n):
        raise ValueError(f"cost must be square, got shape {w.shape}")
    if not 0 <= root < n:
        raise ValueError(f"root {root} out of range 0..{n - 1}")
    if n == 1:
        return np.array([-1]), 0.0
    if not _complete(w):
        _check_reachable(w, root)
    parent = _edmonds(w, root)
    total = float(cost[parent[np.arange(n) != root], np.flatnonzero(np.arange(n) != root)].sum())
    if not np.isfinite(total):
        raise ValueError(f"no spanning arborescence from rank {root}: some rank is unreachable")
    return parent, total


def min_in_arborescence(cost: np.ndarray, root: int) -> Tuple[np.ndarray, float]:
    """Cheapest spanning in-arborescence into ``root``: every ``v`` sends to ``parent[v]``.

    ``cost[u, v]`` is the cost of arc ``u -> v``, as in :func:`min_out_arborescence`; an
    in-arborescence with costs ``cost`` is an out-arborescence with costs ``cost.T``.
    """
    return min_out_arborescence(np.asarray(cost).T, root)


def arborescence_cost(cost: np.ndarray, parent: np.ndarray, inward: bool) -> float:
    """Cost of a parent array, as an in- (``v -> parent[v]``) or out-arborescence."""
    v = np.flatnonzero(np.asarray(parent) >= 0)
    p = np.asarray(parent)[v]
    return float(cost[v, p].sum() if inward else cost[p, v].sum())


def _complete(w: np.ndarray) -> bool:
    """Whether every arc but the diagonal's is present (finite): then every node reaches
    every other, and the breadth-first check (a sparse graph built from the whole matrix,
    a sixth of the packing's Edmonds time on a measured topology) has nothing to find."""
    return int(np.count_nonzero(np.isfinite(w))) + int(np.count_nonzero(
        ~np.isfinite(np.diagonal(w)))) == w.shape[0] * w.shape[1]


def _check_reachable(w: np.ndarray, root: int) -> None:
    finite = np.isfinite(w)
    np.fill_diagonal(finite, False)
    seen = breadth_first_order(sp.csr_matrix(finite), root, directed=True,
                               return_predecessors=False)
    if len(seen) < w.shape[0]:
        missing = sorted(set(range(w.shape[0])) - set(seen.tolist()))
        raise ValueError(f"no spanning arborescence from rank {root}: ranks {missing} are "
                         f"unreachable")


def _find_cycles(parent: np.ndarray, root: int) -> List[np.ndarray]:
    """Cycles of the functional graph ``v -> parent[v]`` (the root points nowhere)."""
    n = len(parent)
    state = np.zeros(n, dtype=np.int8)  # 0 new, 1 on the current walk, 2 done
    state[root] = 2
    cycles: List[np.ndarray] = []
    par = parent.tolist()
    st = state.tolist()
    for start in range(n):
        if st[start]:
            continue
        walk = []
        u = start
        while st[u] == 0:
            st[u] = 1
            walk.append(u)
            u = par[u]
        if st[u] == 1:
            cycle = walk[walk.index(u):]
            cycles.append(np.asarray(cycle, dtype=np.int64))
        for x in walk:
            st[x] = 2
    return cycles


def _edmonds(w: np.ndarray, root: int) -> np.ndarray:
    n = w.shape[0]
    np.fill_diagonal(w, _INF)
    w[:, root] = _INF
    # Ties broken by lowest index chain every rank to rank 0 when costs are uniform, and then
    # each level contracts a single 2-cycle (n levels). One row order shared by all columns
    # does the same (every column picks the same first tied row). A fixed pseudo-random row
    # order rotated by a pseudo-random offset per column breaks ties like a random functional
    # graph, which has many cycles: few levels, same minimum.
    rng = np.random.default_rng(n)
    order = rng.permutation(n)
    key = (order[:, None] + rng.integers(0, n, size=n)[None, :]) % n
    best = w.min(axis=0)
    parent = np.argmin(np.where(w == best[None, :], key, n), axis=0)
    parent[root] = -1
    cycles = _find_cycles(parent, root)
    if not cycles:
        return parent

    # Contract every cycle to one node. Entering a cycle at v breaks the cycle arc into v, so
    # arcs into v are re-priced by the cost of that arc.
    comp = np.arange(n)
    in_cycle = np.zeros(n, dtype=bool)
    for c in cycles:
        in_cycle[c] = True
    keep = np.flatnonzero(~in_cycle)
    comp[keep] = np.arange(len(keep))
    for k, c in enumerate(cycles):
        comp[c] = len(keep) + k
    m = len(keep) + len(cycles)
    entering = np.where(in_cycle, w[np.maximum(parent, 0), np.arange(n)], 0.0)
    entering[root] = 0.0
    reduced = w - entering[None, :]

    order = np.argsort(comp, kind="stable")
    sorted_comp = comp[order]
    starts = np.flatnonzero(np.r_[True, sorted_comp[1:] != sorted_comp[:-1]])
    positions = np.arange(n)

    rows = reduced[order]                                    # group tails
    row_min = np.minimum.reduceat(rows, starts, axis=0)      # (m, n): best tail per comp
    hit = rows == row_min[sorted_comp]
    row_arg = np.minimum.reduceat(np.where(hit, positions[:, None], n), starts, axis=0)
    cols = row_min[:, order]                                 # group heads
    col_min = np.minimum.reduceat(cols, starts, axis=1)      # (m, m)
    hit = cols == col_min[:, sorted_comp]
    col_arg = np.minimum.reduceat(np.where(hit, positions[None, :], n), starts, axis=1)
    np.fill_diagonal(col_min, _INF)

    sub_parent = _edmonds(col_min, int(comp[root]))

    result = parent.copy()
    for cv in range(m):
        cu = sub_parent[cv]
        if cu < 0:
            continue
        v = order[col_arg[cu, cv]]             # head inside component cv
        u = order[row_arg[cu, v]]              # tail inside component cu
        result[v] = u
    result[root] = -1
    return result


def best_root_arborescence(cost: np.ndarray, root_cost: np.ndarray,
                           inward: bool) -> Tuple[int, np.ndarray, float]:
    """``min over r of (root_cost[r] + cheapest arborescence rooted at r)``, in one Edmonds run.

    A super-root ``s`` gets an arc ``s -> r`` of cost ``M + root_cost[r]`` for every ``r``
    (``inf`` excludes ``r``); with ``M`` larger than any arborescence, the cheapest
    arborescence from ``s`` uses exactly one such arc, and its child is the best root. This
    prices all ``n`` roots for the cost of one run on ``n + 1`` nodes.

    Returns ``(root, parent, tree_cost)``; ``tree_cost`` excludes ``root_cost[root]``.
    """
    w = np.asarray(cost, dtype=float)
    n = w.shape[0]
    base = w.T if inward else w
    finite_w = base[np.isfinite(base)]
    finite_r = root_cost[np.isfinite(root_cost)]
    if not len(finite_r):
        raise ValueError("every root is excluded")
    big = 2.0 * (n * (float(np.abs(finite_w).max()) if len(finite_w) else 0.0)
                 + float(np.abs(finite_r).max())) + 1.0
    aug = np.full((n + 1, n + 1), _INF)
    aug[:n, :n] = base
    aug[n, :n] = big + root_cost
    if not _complete(base):  # else every node is reached from any finite root
        _check_reachable(aug, n)
    parent = _edmonds(aug, n)
    roots = np.flatnonzero(parent[:n] == n)
    if len(roots) != 1:
        raise ValueError("no spanning arborescence: some rank is unreachable")
    root = int(roots[0])
    parent = parent[:n].copy()
    parent[root] = -1
    tree_cost = arborescence_cost(w, parent, inward)
    if not np.isfinite(tree_cost):
        raise ValueError("no spanning arborescence: some rank is unreachable")
    return root, parent, tree_cost
