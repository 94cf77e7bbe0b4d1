"""A shallow forest: reduce and broadcast trees of bounded depth, packed by column generation.

The certified packing (:mod:`horotopo.packing.gk`) maximises throughput, and its best trees are
often long chains (a chain through a rack loads every NIC once each way). A chain of ``n``
ranks takes ``n - 1`` hops before the pipeline is full, which dominates a small allreduce or a
network with long latencies. This module packs trees whose reduce and broadcast arborescences
are at most ``max_depth`` hops deep; the plan (:func:`horotopo.plan.make_plan`) predicts both
forests' allreduce time (:mod:`horotopo.packing.alphabeta`) and keeps the faster.

Oracle. The cheapest depth-bounded arborescence is NP-hard; :func:`bounded_arborescence` is
Prim's greedy growth from the root, where a rank may take children only while it is less than
``max_depth`` hops from the root. Prices come from the LP duals, as in column generation: every
round solves the split LP (reduce and broadcast halves with a balance row per root, see
:mod:`horotopo.packing.gk`) over the pool, re-prices the arcs at the duals and grows one tree of
each kind at a few roots. The heuristic oracle gives no certificate of its own: a plan built
from this forest carries the certified bound of the unrestricted packing, which bounds every
packing, shallow ones included.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..topology import Topology
from .certificate import RTOL
# gk's pool of halves and its split LP serve the bounded columns as they do gk's own
from .gk import UNBOUNDED_BPS, _Pool, pair_rates
from .model import ArcModel, Packing

__all__ = ["bounded_arborescence", "depth_bound_for", "pack_bounded", "choose_forest",
           "check_forest", "FORESTS"]

#: ``make_plan(forest=...)``: choose on the prediction, or force the deep or shallow forest.
FORESTS = ("auto", "deep", "shallow")


def bounded_arborescence(cost: np.ndarray, root: int, max_depth: int,
                         inward: bool) -> Tuple[Tuple[int, ...], float]:
    """A cheap arborescence at ``root`` of depth at most ``max_depth`` (Prim, depth-limited).

    Parameters
    ----------
    cost : ndarray (n, n)
        ``cost[u, v]`` is the price of a message ``u -> v``.
    root : int
        The root: where a reduce tree ends, where a broadcast tree starts.
    max_depth : int
        Most hops from any rank to the root (at least 1).
    inward : bool
        True for a reduce tree (``v`` sends to its parent: arc ``v -> parent``), False for a
        broadcast tree (the parent sends to ``v``).

    Returns
    -------
    (parent, cost)
        The parent array (``-1`` at the root) and the sum of its arcs' prices.
    """
    n = cost.shape[0]
    if max_depth < 1:
        raise ValueError(f"max_depth must be at least 1, got {max_depth}")
    if not 0 <= root < n:
        raise ValueError(f"root {root} is out of range 0..{n - 1}")
    # attach[v, u]: the price of hanging v under u
    attach = cost if inward else cost.T
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    left = np.ones(n, dtype=bool)
    left[root] = False
    best = np.where(left, attach[:, root], np.inf)
    best_parent = np.full(n, root, dtype=np.int64)
    total = 0.0
    for _ in range(n - 1):
        v = int(np.argmin(best))
        if not np.isfinite(best[v]):
            raise ValueError(f"no depth-{max_depth} arborescence at root {root}: rank {v} "
                             "cannot be reached")
        u = int(best_parent[v])
        parent[v] = u
        depth[v] = depth[u] + 1
        total += float(best[v])
        left[v] = False
        best[v] = np.inf
        if depth[v] < max_depth:
            better = left & (attach[:, v] < best)
            best[better] = attach[better, v]
            best_parent[better] = v
    return tuple(int(p) for p in parent), total


def depth_bound_for(n: int) -> int:
    """The default depth bound: ``ceil(log2 n)`` hops, at least 1 (a binary tree's depth, so
    no rank of the bounded forest needs more than a couple of children on average)."""
    return max(1, int(np.ceil(np.log2(max(n, 2)))))


def _roots(model: ArcModel, w: np.ndarray, count: int, tried: np.ndarray) -> List[int]:
    """Roots to grow trees at this round: the cheapest by their star's price (a root that is
    central in the network), least-tried first."""
    star = w.sum(axis=0) + w.sum(axis=1)
    order = np.lexsort((star, tried))
    return [int(r) for r in order[:count]]


def pack_bounded(topology: Topology, max_depth: int, *, rounds: int = 30,
                 roots_per_round: int = 4, max_trees_per_root: int = 4,
                 time_limit_s: float = 20.0) -> Packing:
    """Pack tree pairs whose reduce and broadcast trees are at most ``max_depth`` deep.

    Parameters
    ----------
    topology : Topology
        The network.
    max_depth : int
        Most hops from any rank to the root, in every reduce and every broadcast tree.
    rounds : int
        Column-generation rounds (each solves the LP once and grows trees at a few roots).
    roots_per_round : int
        Roots at which each round grows a reduce and a broadcast tree.
    max_trees_per_root : int
        Kept trees of each kind per root (the rest are dropped and the LP re-solved).
    time_limit_s : float
        Wall-clock limit of the rounds.

    Returns
    -------
    Packing
        The kept trees with exact LP rates; ``upper_bound`` is None (the heuristic oracle
        certifies nothing: see the module docstring).
    """
    start = time.perf_counter()
    model = ArcModel(topology)
    n = model.n
    if n < 2:
        raise ValueError("a bounded-depth packing needs at least two ranks")
    pool = _Pool(model)
    y = 1.0 / model.capacity
    pi = np.zeros(n)
    tried = np.zeros(n)
    iterations = 0
    best_total = 0.0
    stale = 0
    for _ in range(max(1, rounds)):
        iterations += 1
        w = model.arc_costs(y)
        # A small price per hop, so that free arcs (ranks sharing memory) still prefer short
        # trees and the greedy growth is deterministic on ties.
        w = w + 1e-9 * float(w.max() or 1.0)
        added = 0
        for r in _roots(model, w, roots_per_round, tried):
            tried[r] += 1
            for inward in (True, False):
                parent, _ = bounded_arborescence(w, r, max_depth, inward)
                added += pool.add((inward, r, parent))
        rates, y_new, pi = pool.solve()
        total = float(rates[[h[0] for h in pool.halves]].sum())
        stale = stale + 1 if total <= best_total * (1 + 1e-4) else 0
        best_total = max(best_total, total)
        # Prices for the next round: the LP duals, smoothed with the previous prices so that
        # one round's degenerate duals (zero on most resources) do not erase what is known.
        y = 0.5 * y / max(float(model.capacity @ y), 1e-300) \
            + 0.5 * (y_new + 1e-3 / model.capacity) / max(float(model.capacity @ y_new), 1e-300)
        if not added or stale >= 5 or time.perf_counter() - start > time_limit_s:
            break
    rates, _, _ = pool.solve()
    rates = _keep_top(pool, rates, max_trees_per_root)
    trees = pair_rates(pool.halves, rates)
    total = float(sum(t.rate for t in trees))
    return Packing(trees=trees, throughput=total, upper_bound=None,
                   full_throughput=max(best_total, total), iterations=iterations,
                   columns=len(pool.halves), seconds=time.perf_counter() - start,
                   bound_phase="")


def _keep_top(pool: _Pool, rates: np.ndarray, per_root: int) -> np.ndarray:
    """Rates after keeping each root's ``per_root`` best halves of each kind (re-solved)."""
    inward = np.array([h[0] for h in pool.halves])
    roots = np.array([h[1] for h in pool.halves])
    keep = np.zeros(len(rates), dtype=bool)
    for kind in (True, False):
        for r in np.unique(roots):
            at = np.flatnonzero((inward == kind) & (roots == r) & (rates > 0))
            keep[at[np.argsort(-rates[at], kind="stable")][:per_root]] = True
    if keep.all() or not (rates[~keep] > 1e-9 * rates.sum()).any():
        return np.where(keep, rates, 0.0)
    sub, _, _ = pool.solve(keep)
    return np.where(keep, sub, 0.0)


def check_forest(forest: str) -> None:
    """Raise ValueError unless ``forest`` is one of :data:`FORESTS`."""
    if forest not in FORESTS:
        raise ValueError(f"forest must be one of {', '.join(FORESTS)}, got {forest!r}")


def choose_forest(topology: Topology, packing: Packing, build: Callable[[Packing], Any],
                  size: int, *, floor_Bps: float, forest: str = "auto",
                  max_depth: Optional[int] = None, max_trees_per_root: int = 4,
                  progress: Optional[Callable[[str], None]] = None,
                  network: Any = None) -> Tuple[Any, Dict[str, Any]]:
    """The deep forest (``packing``) or the shallow one, whichever predicts less time.

    ``build`` turns a packing into a plan (anything with ``predict_time(size)``,
    ``throughput_Bps`` and ``trees`` whose items have ``depth``). The shallow forest
    (:func:`pack_bounded` at ``max_depth``, default :func:`depth_bound_for`) is a candidate
    only where its throughput is at least ``floor_Bps`` (ring's, the plan's floor); it
    carries the deep packing's certified bound, which bounds every packing. Returns the
    chosen plan and a record of the choice: the size, both forests' predicted time,
    throughput, tree count and deepest tree (reduce plus broadcast hops). ``network`` (a
    :class:`~horotopo.packing.alphabeta.NetworkModel`, default the links as declared) is
    what the predictions are made on.
    """
    check_forest(forest)
    deep = build(packing)
    record: Dict[str, Any] = {"size": int(size), "chosen": "deep",
                              "deep": _summary(deep, size, network)}
    constrained = (packing.upper_bound is not None and len(topology.capacity_Bps) > 0
                   and packing.throughput < UNBOUNDED_BPS)
    if forest == "deep" or topology.n < 3 or not constrained:
        return deep, record
    bound = max_depth or depth_bound_for(topology.n)
    found = pack_bounded(topology, bound, max_trees_per_root=max_trees_per_root)
    shallow = build(replace(found, upper_bound=packing.upper_bound,
                            bound_phase=packing.bound_phase))
    record["shallow"] = dict(_summary(shallow, size, network), depth_bound=bound,
                             seconds=round(found.seconds, 4))
    pick = deep
    above_floor = shallow.throughput_Bps >= floor_Bps * (1 - RTOL)
    if forest == "shallow" or (above_floor and record["shallow"]["predicted_s"]
                               < record["deep"]["predicted_s"]):
        pick, record["chosen"] = shallow, "shallow"
    if progress is not None:
        progress(f"forest for {size} bytes: {record['chosen']} (predicted deep "
                 f"{record['deep']['predicted_s'] * 1e3:.3f} ms, shallow "
                 f"{record['shallow']['predicted_s'] * 1e3:.3f} ms at depth <= {bound})")
    return pick, record


def _summary(plan: Any, size: int, network: Any) -> Dict[str, Any]:
    pred = plan.predict_time(size) if network is None else plan.predict_time(size,
                                                                            network=network)
    return {"predicted_s": pred, "throughput_Bps": plan.throughput_Bps,
            "trees": len(plan.trees), "max_hops": max(t.depth for t in plan.trees)}
