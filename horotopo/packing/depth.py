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

Receive cost. The engine reduces or copies every chunk it receives in software, about 0.47 ns a
byte (``ENGINE_COSTS.per_byte_s``, 2.1 GB/s), while the links between the ranks of one machine
run at 100 gbps: the network packing then hangs many ranks under one (free links), and that
rank's CPU, not the network, sets the pace (one rank receives several times the buffer,
where ring's ranks receive it twice). :func:`receive_limited`
adds each rank's receive CPU to the network as a resource that every arc into the rank crosses,
so that a packing balances it; :func:`choose_forest` packs a *balanced* forest on it.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..topology import Topology
from .certificate import RTOL
# gk's pool of halves and its split LP serve the bounded columns as they do gk's own
from .alphabeta import ENGINE_COSTS, FOREST_KINDS, SoftwareCosts
from .gk import UNBOUNDED_BPS, TreePool, pack, pair_rates
from .hierarchy import machines
from .hostforest import has_hosts, host_tree_counts, pack_bottleneck_forest, pack_host_forests
from .leveled import LEVEL_TOLERANCE, leveled
from .model import ArcModel, Packing

__all__ = ["bounded_arborescence", "depth_bound_for", "pack_bounded", "choose_forest",
           "check_forest", "floor_factor", "receive_limited", "FORESTS", "FOREST_MARGIN",
           "RECEIVE_CHUNK"]

#: ``make_plan(forest=...)``: choose on the prediction, or force one forest.
FORESTS = ("auto",) + FOREST_KINDS

#: How much faster (predicted) another forest must be to replace the deep one. The model's
#: error is a few percent on the bundled topologies (``benchmarks/predict_check.py``: within
#: 8%), and it errs most where a rank receives several flows at once (a shallow tree's root):
#: on the emulated slow-nic cluster a star at n3, predicted 0.05% faster than the chain at
#: 16 MiB, ran slower than it (0.88/0.92 of the optimum fell to 0.71/0.75). A
#: prediction closer than this is a tie, and a tie keeps the certified deep forest.
FOREST_MARGIN = 0.05

#: The chunk at which :func:`receive_limited` charges the per-message cost (a send and a
#: receive per arc) as a cost per byte: the planner's largest chunks, where it is small.
RECEIVE_CHUNK = 1 << 20


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
    pool = TreePool(model)
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


def _keep_top(pool: TreePool, rates: np.ndarray, per_root: int) -> np.ndarray:
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


def receive_limited(topology: Topology, costs: SoftwareCosts = ENGINE_COSTS,
                    chunk_bytes: int = RECEIVE_CHUNK) -> Topology:
    """``topology`` with each rank's receive CPU as one more resource.

    Every route into rank ``j`` also crosses ``"receive j"``, of capacity ``1 / (per_byte_s +
    2 per_message_s / chunk_bytes)`` bytes/s: the engine handles each received byte in
    software, and posts a send and a receive per chunk and arc. A packing on this topology
    balances how much each rank receives over all trees (a rank with ``d`` reduce children in
    a tree receives ``d + 1`` times that tree's share). Routes, latencies and names are those
    of ``topology`` otherwise; the route table is built in full (``n**2`` entries), as for the
    flat packing that uses it.

    Parameters
    ----------
    topology : Topology
        The network.
    costs : SoftwareCosts
        The engine's software costs (``ENGINE_COSTS`` by default).
    chunk_bytes : int
        The chunk at which the per-message cost is charged per byte.

    Returns
    -------
    Topology
        The network plus ``n`` receive resources.
    """
    per_byte = costs.per_byte_s + 2 * costs.per_message_s / max(1, int(chunk_bytes))
    if not per_byte > 0:
        raise ValueError("receive_limited needs a positive software cost per byte or message")
    n, base = topology.n, len(topology.capacity_Bps)
    routes = [[tuple(topology.routes[i][j]) + ((base + j,) if i != j else ())
               for j in range(n)] for i in range(n)]
    return replace(topology, resources=tuple(topology.resources)
                   + tuple(f"receive {j}" for j in range(n)),
                   capacity_Bps=tuple(topology.capacity_Bps) + (1.0 / per_byte,) * n,
                   routes=routes)


def check_forest(forest: str, hierarchical: bool = False) -> None:
    """Raise ValueError unless ``forest`` is one of :data:`FORESTS` (and, for a plan over
    hosts, one it offers: balanced and shallow are packed over ranks, ``n**2`` arcs)."""
    if forest not in FORESTS:
        raise ValueError(f"forest must be one of {', '.join(FORESTS)}, got {forest!r}")
    if hierarchical and forest in ("balanced", "shallow", "leveled"):
        raise ValueError(f"forest {forest!r} is packed over ranks; a plan over hosts "
                         "(hierarchy on, or auto above 64 ranks) offers deep and hosts only: "
                         "pass hierarchy='off' to force it")


def choose_forest(topology: Topology, packing: Packing, build: Callable[[Packing], Any],
                  size: int, *, floor_Bps: float, forest: str = "auto",
                  max_depth: Optional[int] = None, max_trees_per_root: int = 4,
                  progress: Optional[Callable[[str], None]] = None,
                  network: Any = None, hierarchical: bool = False,
                  ring: Optional[Packing] = None,
                  max_host_trees: Optional[int] = None) -> Tuple[Any, Dict[str, Any]]:
    """The deep forest (``packing``), a balanced, a shallow or a host one: the fastest
    predicted.

    ``build`` turns a packing into a plan (anything with ``predict_time(size)``,
    ``throughput_Bps`` and ``trees`` whose items have ``depth``). The *balanced* forest is the
    certified packing (:func:`~.gk.pack`) of :func:`receive_limited` ``(topology)``, so that no
    rank receives much more than another; the *shallow* one is :func:`pack_bounded` at
    ``max_depth`` (default :func:`depth_bound_for`) on the network alone (packed with the
    receive resources too, its trees spread into many deeper ones, and it lost the small
    allreduces across a WAN that it is there for); where machines hold several ranks
    (:func:`~.hostforest.has_hosts`), the *hosts* forest is :func:`~.hostforest.pack_host_forest`
    (rotated binary trees over hosts, one crossing of a WAN or rack cut each way; on sites and
    fattree at 64 ranks, 64 MiB, 16-23% faster simulated than the deep forest), packed with
    each count of host trees of :func:`~.hostforest.host_tree_counts` and predicted; of those
    above the floor the largest count stands for it unless a smaller one is predicted faster
    by more than :data:`FOREST_MARGIN` (``record["hosts"]["tried"]`` lists them all by
    count). Their trees
    keep their shares, at the rate
    the network alone allows them (:func:`_at_network_rate`), and they carry the deep
    packing's certified bound, which bounds every packing. Another forest replaces the deep
    one only where its throughput is at least ``floor_Bps`` (ring's, the plan's floor; a host
    forest of fewer than ``H / 2`` trees ``1 - 1 / H`` of it, the most such a forest can reach
    where ring reaches the NICs' bound: :func:`floor_factor`) and its predicted time is lower
    by more than
    :data:`FOREST_MARGIN` (``forest`` names one to force it). On a measured topology whose
    capacities :func:`~.leveled.leveled` changes (rates within the probe's noise of each
    other), the *leveled* forest, packed on the leveled network, replaces the pick where it
    has fewer trees, reaches the floor and is predicted at most
    :data:`~.leveled.LEVEL_TOLERANCE` slower. Returns the chosen plan and a
    record of the choice: the size, the margin, each forest's predicted time, throughput, tree
    count and deepest tree (reduce plus broadcast hops). ``network`` (a
    :class:`~horotopo.packing.alphabeta.NetworkModel`, default the links as declared) is what
    the predictions are made on. ``hierarchical`` (``packing`` is over hosts,
    :func:`~.hierarchy.pack_hierarchical`) offers the host forest alone beside the deep one:
    balanced and shallow are packed over ranks (``n**2`` arcs), and forcing either raises.
    ``max_host_trees`` bounds the host forest's counts (default
    :data:`~.hostforest.MAX_HOST_TREES`); a bound given is recorded
    (``record["max_host_trees"]``), so that a re-plan keeps it.
    ``ring`` (ring's chains, :func:`~.model.ring_packing`) replaces the chosen trees where
    their max-min fair rates sum below the floor (``record["below_ring"]`` says which forest
    and its throughput; the deep entry is then ring's chains).
    """
    check_forest(forest, hierarchical)
    if forest == "hosts" and not has_hosts(topology):
        # forcing a forest that this topology cannot have must not quietly give another one
        raise ValueError(f"forest 'hosts' needs machines that hold several ranks (or a local "
                         f"fabric much faster than the way out); {topology.name!r} has none")
    deep = build(packing)
    record: Dict[str, Any] = {"size": int(size), "chosen": "deep", "margin": FOREST_MARGIN,
                              "deep": _summary(deep, size, network)}
    if forest != "auto":
        record["forced"] = True
    if max_host_trees is not None:
        host_tree_counts(1, limit=max_host_trees)  # a bound below one fails before any packing
        record["max_host_trees"] = int(max_host_trees)
    constrained = (packing.upper_bound is not None and len(topology.capacity_Bps) > 0
                   and packing.throughput < UNBOUNDED_BPS)
    if forest == "deep" or topology.n < 3 or not constrained:
        return deep, record
    bound = max_depth or depth_bound_for(topology.n)
    packers = {} if hierarchical else {
        "balanced": lambda: [pack(receive_limited(topology),
                                  max_trees_per_root=max_trees_per_root)],
        "shallow": lambda: [pack_bounded(topology, bound, max_trees_per_root=max_trees_per_root)]}
    h_count = 0
    if has_hosts(topology):
        # rotated binary trees over hosts (horotopo.packing.hostforest): one crossing of a
        # WAN or rack uplink per tree each way, a few host hops deep; a few counts of host
        # trees (at most MAX_HOST_TREES), each predicted, the fastest kept
        h_count = len(set(machines(topology)))
        # and the bottleneck pair alone (pack_bottleneck_forest): on a probed network the
        # packing can miss the cut bound by a few percent and spread over host trees whose
        # fair rates lose far more
        packers["hosts"] = lambda: pack_host_forests(
            topology, host_tree_counts(h_count, limit=max_host_trees)) + (
                [pack_bottleneck_forest(topology)] if h_count >= 3 else [])
    # leveled only where it may be offered: a plan over hosts never packs over ranks
    flat = None if hierarchical else leveled(topology)
    if flat is not None and (forest == "leveled" or (
            topology.kind == "measured" and flat.capacity_Bps != topology.capacity_Bps)):
        # a measured network's rates within the probe's noise of each other, leveled: the
        # certified packing spends that noise on extra trees (horotopo.packing.leveled)
        packers["leveled"] = lambda: [pack(flat, max_trees_per_root=max_trees_per_root)]
        record["level_tolerance"] = LEVEL_TOLERANCE
    pick = deep
    # a tie with the deep forest keeps it (FOREST_MARGIN); among the others the faster wins
    best = record["deep"]["predicted_s"] * (1 - FOREST_MARGIN)
    for kind, packer in packers.items():
        if forest not in ("auto", kind):
            continue
        tried = [_candidate(topology, kind, found, packing, build, size, network, bound)
                 for found in packer()]
        # of one kind's candidates (host-tree counts) those above the floor (any, where the
        # kind is forced) are eligible to be weighed against the others
        floor = lambda c: floor_Bps * (1 - RTOL) * floor_factor(h_count, kind, c[1])
        eligible = [c for c in tried if forest == kind or c[0].throughput_Bps >= floor(c)]
        # the most host trees, unless fewer are predicted faster by more than the margin:
        # the model charges every count the same fill once the chunks are chosen (a tie but
        # for rounding from 16 trees up on 32 hosts), and it missed what fewer trees cost
        # across a WAN (simulated at 64 MiB: sites-64 245.4 ms at 4 trees, predicted 1% faster
        # than 8, which ran 188.6; sites-256 at --chunk 4M 273.0 ms at 16 trees, 220.2 at 32)
        pool = sorted(eligible or tried, key=lambda c: -c[1].get("host_trees", 0))
        plan, record[kind] = pool[0]
        for c in pool[1:]:
            if c[1]["predicted_s"] < record[kind]["predicted_s"] * (1 - FOREST_MARGIN):
                plan, record[kind] = c
        if len(tried) > 1:
            # by host-tree count (string keys: the record goes into the plan's JSON)
            record[kind]["tried"] = {
                str(c[1]["host_trees"]) + (" bottleneck" if c[1].get("bottleneck") else ""):
                c[1]["predicted_s"] for c in tried}
        plan_floor = floor((plan, record[kind]))
        above_floor = plan.throughput_Bps >= plan_floor
        record[kind]["floor_Bps"] = plan_floor / (1 - RTOL)
        if kind == "leveled":
            # fewer trees within the noise: kept unless the pick is predicted faster by more
            # than the levels' width
            faster = record[kind]["predicted_s"] <= (
                record[record["chosen"]]["predicted_s"] * (1 + LEVEL_TOLERANCE))
            # and never in place of a host forest: its count of trees is no noise but the
            # count its rotations were weighed at ("tried"), each a few host hops deep, while
            # the leveled packing over ranks chains them (sites-64 probed: 4 trees of up to
            # 37 hops, predicted 6% slower than 64 host-forest trees of 8, simulated 209.9 ms
            # against 181.6 for the declared plan's host forest)
            faster = (faster and len(plan.trees) < len(pick.trees)
                      and record["chosen"] != "hosts")
        else:
            faster = record[kind]["predicted_s"] < best
        if forest == kind or (above_floor and faster):
            pick, record["chosen"], best = plan, kind, record[kind]["predicted_s"]
    if (forest == "auto" and ring is not None and ring.trees
            and pick.throughput_Bps < floor_Bps * (1 - RTOL) * floor_factor(
                h_count, record["chosen"], record[record["chosen"]])):
        # the pick's max-min fair rates (what its flows get when they compete) fell below
        # ring's throughput, which its LP rates were not: ring's chains stand in, as their fair
        # rates are never below their common rate (a noisy 3-rank probe: 0.998x ring)
        record["below_ring"] = {"forest": record["chosen"], "throughput_Bps":
                                pick.throughput_Bps}
        pick = build(replace(packing, trees=ring.trees, throughput=ring.throughput))
        record["chosen"] = "deep"
        record["deep"] = _summary(pick, size, network)
    if progress is not None:
        progress(f"forest for {size} bytes: {record['chosen']} (predicted "
                 + ", ".join(f"{k} {record[k]['predicted_s'] * 1e3:.3f} ms"
                             for k in FORESTS[1:] if k in record)
                 + f"; shallow at depth <= {bound})")
    return pick, record


def floor_factor(h_count: int, kind: str, summary: Dict[str, Any]) -> float:
    """The share of ring's throughput (the plan's floor) that a forest of ``kind`` must reach
    on a network of ``h_count`` machines.

    1 but for a host forest of ``m`` trees over ``H`` machines with ``2 m < H``: every tree
    pair loads the NICs ``2 (H - 1)`` times in all, so ``m`` trees at one rate put at least
    ``ceil(2 m (H - 1) / H) = 2 m`` on the busiest NIC, and reach at most ``c / 2`` where ring,
    over all ``n`` roots, reaches ``H c / (2 (H - 1))``, the NICs' bound: ``1 - 1 / H`` of it
    (0.992 at 128 machines, 0.998 at 512). Only ``H / 2`` trees or more can tie it, ``H K / 2``
    rank-level trees, the count :data:`~.hostforest.MAX_HOST_TREES` bounds. So such a forest
    is held to ``1 - 1 / H`` of the floor: what any ``m`` trees can reach where ring does,
    and no lower (a forest below it for another reason, slow NICs inside, is still refused).
    """
    if kind != "hosts":
        return 1.0
    return 1.0 - 1.0 / h_count if 2 * summary["host_trees"] < h_count else 1.0


def _candidate(topology: Topology, kind: str, found: Packing, packing: Packing,
               build: Callable[[Packing], Any], size: int, network: Any, bound: int
               ) -> Tuple[Any, Dict[str, Any]]:
    """The plan of one forest ``found`` of ``kind`` and its record (:func:`choose_forest`)."""
    # the host forest is already at the flat model's rate (HostModel.max_rate), and
    # rescaling it would build the n**2-arc flat model, which a plan over hosts avoids
    scaled = found if kind == "hosts" else _at_network_rate(topology, found)
    # the plan carries the deep packing's certificate, so its statistics too (a plan over
    # hosts keeps its flat bound and machine count); the forest's own count of host trees
    plan = build(replace(scaled, upper_bound=packing.upper_bound,
                         bound_phase=packing.bound_phase, iterations=packing.iterations,
                         columns=packing.columns, seconds=packing.seconds,
                         extra=dict(packing.extra, **scaled.extra)))
    summary = dict(_summary(plan, size, network), seconds=round(found.seconds, 4),
                   **({"depth_bound": bound} if kind == "shallow" else {}),
                   **({"host_trees": found.extra["host_trees"]} if kind == "hosts" else {}),
                   **({"bottleneck": True} if found.extra.get("bottleneck") else {}))
    return plan, summary


def _at_network_rate(topology: Topology, found: Packing) -> Packing:
    """``found`` (packed with the receive resources) with its trees' shares kept and their
    rates scaled to the most the network of ``topology`` allows: the plan's throughput is then
    the network's, and the receive CPU is left to the prediction's software time."""
    model = ArcModel(topology)
    load = sum(t.rate * model.load(t.root, t.reduce_parent, t.bcast_parent)
               for t in found.trees)
    factor = model.max_rate(np.asarray(load, dtype=float))
    if not np.isfinite(factor):
        raise ValueError(f"{topology.name}: a forest that loads no link has no network rate")
    return replace(found, trees=tuple(replace(t, rate=t.rate * factor) for t in found.trees),
                   throughput=found.throughput * factor,
                   full_throughput=found.full_throughput * factor)


def _summary(plan: Any, size: int, network: Any) -> Dict[str, Any]:
    pred = plan.predict_time(size) if network is None else plan.predict_time(size,
                                                                            network=network)
    return {"predicted_s": pred, "throughput_Bps": plan.throughput_Bps,
            "trees": len(plan.trees), "max_hops": max(t.depth for t in plan.trees)}
