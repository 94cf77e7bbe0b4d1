"""Certified fractional packing of reduce/broadcast tree pairs.

The LP (see :mod:`horotopo.packing.model`) has one column per tree pair, exponentially many, so
it is solved with an oracle that, for resource lengths ``y``, returns the cheapest pair: for each
root ``r``, a minimum in-arborescence ``A`` into ``r`` plus a minimum out-arborescence ``B`` from
``r`` under arc costs ``W[u, v] = sum_{l in route(u, v)} y_l`` (two Edmonds runs per root).

Phases, following Garg & Konemann ("Faster and simpler algorithms for multicommodity flow and
other fractional packing problems", FOCS 1998) as the paper does for its tree packing:

1. Multiplicative weights: route the bottleneck rate of the cheapest column, then grow the length
   of each resource by ``(1 + eps * load / capacity)``. This seeds a pool of good columns.
2. Exact rates: re-solve the LP restricted to the pool with HiGHS, take its duals as new lengths,
   and ask the oracle for columns that price out (column generation). Ring's ``n`` chains are in
   the pool from the start, so the result is never below ring.
3. Prune to at most ``max_trees_per_root`` trees per root (and drop trees with a negligible
   share), then re-solve the kept trees' rates exactly and report the loss.

Certificate: for any lengths ``y >= 0``, ``y / alpha(y)`` (``alpha`` the oracle's cheapest column
cost) is dual feasible, so ``c.y / alpha(y)`` bounds the optimum from above. Every set of lengths
that the algorithm prices (the multiplicative weights and every LP dual) yields such a bound; the
smallest is kept, and ``gap = 1 - R / bound`` is certified.

Symbols: ``x`` (rate of a tree, the paper's flow on a tree), ``R = sum x`` (throughput),
``c_l`` (capacity), ``y_l`` (length, the dual price of resource ``l``).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from ..topology import Topology
from .arborescence import min_in_arborescence, min_out_arborescence
from .model import ArcModel, Packing, TreeRate, ring_parents

__all__ = ["pack", "cheapest_columns", "dual_bound", "solve_rates"]

Column = Tuple[int, Tuple[int, ...], Tuple[int, ...]]
UNBOUNDED_BPS = 1e15  # reported when no resource constrains anything (one rank, one host)


def cheapest_columns(model: ArcModel, lengths: np.ndarray,
                     roots: Optional[Sequence[int]] = None) -> List[Tuple[float, Column]]:
    """For each root, the cheapest (in-arborescence, out-arborescence) pair under ``lengths``.

    Returns ``(cost, (root, reduce_parent, bcast_parent))`` per root, cheapest first.
    """
    w = model.arc_costs(lengths)
    out: List[Tuple[float, Column]] = []
    for r in (range(model.n) if roots is None else roots):
        a, cost_a = min_in_arborescence(w, r)
        b, cost_b = min_out_arborescence(w, r)
        out.append((cost_a + cost_b, (int(r), tuple(int(p) for p in a), tuple(int(p) for p in b))))
    out.sort(key=lambda t: t[0])
    return out


def dual_bound(model: ArcModel, lengths: np.ndarray, alpha: float) -> float:
    """Upper bound ``c.y / alpha(y)`` on the optimal throughput (weak LP duality)."""
    if alpha <= 0:
        return np.inf
    return float(model.capacity @ lengths) / alpha


def solve_rates(loads: np.ndarray, capacity: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Exact LP ``max sum x  s.t.  loads @ x <= capacity, x >= 0`` with HiGHS.

    Parameters
    ----------
    loads : (m, k) array or sparse matrix
        Column ``t`` is the unit-rate load of tree pair ``t`` on each resource.
    capacity : (m,) array

    Returns
    -------
    x : (k,) rates; y : (m,) dual prices (>= 0) of the capacity rows.
    """
    scale = float(capacity.max())
    k = loads.shape[1]
    res = linprog(-np.ones(k), A_ub=sp.csc_matrix(loads), b_ub=capacity / scale,
                  bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS could not solve the rate LP: {res.message}")
    x = np.maximum(res.x, 0.0) * scale
    y = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    return x, y


class _Pool:
    """Columns found so far, with their loads, deduplicated."""

    def __init__(self, model: ArcModel):
        self.model = model
        self.columns: List[Column] = []
        self.index: Dict[Column, int] = {}
        self.loads: List[np.ndarray] = []

    def add(self, col: Column) -> Tuple[int, bool]:
        if col in self.index:
            return self.index[col], False
        self.index[col] = len(self.columns)
        self.columns.append(col)
        self.loads.append(self.model.load(*col))
        return self.index[col], True

    def matrix(self, subset: Optional[Sequence[int]] = None) -> sp.csc_matrix:
        picked = self.loads if subset is None else [self.loads[i] for i in subset]
        return sp.csc_matrix(np.column_stack(picked))


def _unconstrained(n: int) -> Packing:
    star = tuple(-1 if v == 0 else 0 for v in range(n))
    tree = TreeRate(0, star, star, UNBOUNDED_BPS)
    return Packing(trees=(tree,), throughput=UNBOUNDED_BPS, upper_bound=UNBOUNDED_BPS,
                   full_throughput=UNBOUNDED_BPS)


def pack(topology: Topology, *, max_trees_per_root: int = 2, min_share: float = 0.01,
         target_gap: float = 0.01, eps: float = 0.1, gk_iterations: Optional[int] = None,
         max_rounds: int = 200, time_limit_s: float = 120.0,
         progress: Optional[Callable[[str], None]] = None) -> Packing:
    """Pack reduce/broadcast tree pairs on ``topology`` with a certified gap.

    Parameters
    ----------
    topology : Topology
    max_trees_per_root : int
        Pruning keeps at most this many trees per root (the engine pays per tree).
    min_share : float
        Pruning also drops trees whose LP rate is below this fraction of ``R``.
    target_gap : float
        Column generation stops once ``1 - R_pool / bound`` is at most half of this, leaving
        the other half to pruning.
    eps : float
        Multiplicative-weights step (Garg-Konemann's epsilon).
    gk_iterations : int, optional
        Multiplicative-weights iterations before column generation (default ``min(2n, 16)``).
    max_rounds, time_limit_s : int, float
        Caps on column generation; the result stays certified whatever stops it.
    progress : callable, optional
        Receives one-line progress messages.

    Returns
    -------
    Packing
    """
    start = time.perf_counter()
    say = progress or (lambda msg: None)
    n = topology.n
    model = ArcModel(topology)
    cap = model.capacity
    if n == 1 or model.incidence.nnz == 0:
        return _unconstrained(n)

    pool = _Pool(model)
    for r in range(n):
        pool.add((r, *ring_parents(n, r)))

    best_bound = np.inf
    history: List[Tuple[float, float]] = []
    iterations = 0

    # Phase 1: multiplicative weights (Garg-Konemann).
    y = 1.0 / cap
    for _ in range(gk_iterations if gk_iterations is not None else min(2 * n, 16)):
        priced = cheapest_columns(model, y)
        iterations += 1
        alpha, col = priced[0]
        best_bound = min(best_bound, dual_bound(model, y, alpha))
        for _, c in priced[: max(1, n // 4)]:
            pool.add(c)
        load = pool.loads[pool.index[col]]
        used = load > 0
        flow = float(np.min(cap[used] / load[used]))
        y = y * (1.0 + eps * flow * load / cap)
        y /= float(cap @ y)  # only the direction of y matters; keep it from overflowing

    # Phase 2: exact rates on the pool, LP duals as lengths, columns that price out.
    x, duals = solve_rates(pool.matrix(), cap)
    rounds = 0
    while True:
        r_pool = float(x.sum())
        priced = cheapest_columns(model, duals)
        iterations += 1
        alpha = priced[0][0]
        best_bound = min(best_bound, dual_bound(model, duals, alpha))
        history.append((r_pool, best_bound))
        gap = 1.0 - r_pool / best_bound
        say(f"round {rounds}: R {r_pool / 1e6:.3f} MB/s, bound {best_bound / 1e6:.3f} MB/s, "
            f"gap {gap * 100:.3f}%, {len(pool.columns)} columns")
        if gap <= target_gap / 2 or rounds >= max_rounds \
                or time.perf_counter() - start > time_limit_s:
            break
        # A column prices out when its cost is below 1 in units where the LP's duals make the
        # pool's columns cost at least 1: c.y = R_pool, so the threshold is c.y / R_pool.
        threshold = float(cap @ duals) / r_pool
        added = sum(pool.add(c)[1] for cost, c in priced if cost < threshold * (1 - 1e-9))
        if not added:
            break
        x, duals = solve_rates(pool.matrix(), cap)
        rounds += 1
    r_full = float(x.sum())

    # Phase 3: prune. Banning a tree and re-solving lets the LP move its rate to trees at
    # other roots, which loses far less than keeping the top trees of each root.
    kept, kx = _prune(pool, x, n, max_trees_per_root, min_share, say)
    trees = tuple(TreeRate(pool.columns[i][0], pool.columns[i][1], pool.columns[i][2], float(v))
                  for i, v in zip(kept, kx))
    total = float(sum(t.rate for t in trees))
    return Packing(trees=trees, throughput=total, upper_bound=max(best_bound, total),
                   full_throughput=max(r_full, total), iterations=iterations,
                   columns=len(pool.columns), seconds=time.perf_counter() - start,
                   history=tuple(history))


def _ring_rate(model: ArcModel, n: int) -> float:
    load = sum(model.load(r, *ring_parents(n, r)) for r in range(n))
    return n * model.max_rate(load)


def _prune(pool: _Pool, x: np.ndarray, n: int, per_root: int, min_share: float,
           say: Callable[[str], None]) -> Tuple[List[int], np.ndarray]:
    """Ban columns until every root has at most ``per_root`` trees of share >= ``min_share``.

    Each step bans, at every root over its quota, its lowest-rate trees beyond the quota, and
    the trees below ``min_share``; then re-solves the LP over the unbanned pool.
    If the pruned rate falls below ring's, ring's chains (pool columns ``0..n-1``, one per
    root) are returned instead, so the result is never below ring.
    """
    allowed = np.ones(len(pool.columns), dtype=bool)
    roots = np.array([c[0] for c in pool.columns])
    ids = np.arange(len(pool.columns))
    for _ in range(10 * len(pool.columns)):
        total = float(x.sum())
        support = x > 1e-12 * total
        small = support & (x < min_share * total)
        over = np.zeros_like(support)
        for r in np.unique(roots[support]):
            at_root = ids[support & (roots == r)]
            if len(at_root) > per_root:
                order = at_root[np.argsort(-x[at_root], kind="stable")]
                over[order[per_root:]] = True
        ban = small | over
        if not ban.any():
            break
        allowed[ban] = False
        sub = ids[allowed]
        if not len(sub):
            break
        xs, _ = solve_rates(pool.matrix(sub), pool.model.capacity)
        x = np.zeros(len(pool.columns))
        x[sub] = xs
    total = float(x.sum())
    ring = _ring_rate(pool.model, n)
    if total < ring * (1 - 1e-9):
        # Ring's chains (pool columns 0..n-1) satisfy any quota of one tree per root.
        x = np.zeros(len(pool.columns))
        x[:n] = ring / n
        total = ring
    keep = [int(i) for i in ids if x[i] > 1e-12 * total]
    say(f"pruned to {len(keep)} trees, R {total / 1e6:.3f} MB/s")
    return keep, x[keep]
