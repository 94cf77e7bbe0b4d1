"""Certified fractional packing of reduce/broadcast trees.

The LP of :mod:`horotopo.packing.model` pairs a reduce tree ``A`` into root ``r`` with a
broadcast tree ``B`` out of ``r`` at one rate. What must really hold is only that each root
broadcasts as fast as it reduces, so the solver works with the equivalent *split* LP: reduce
trees with rates ``a``, broadcast trees with rates ``b``, and a balance row per root,

    max sum a   s.t.   sum a * load(A) + sum b * load(B) <= c,
                       sum_{A into r} a  =  sum_{B out of r} b   for every root r,

whose dual is ``min c.y`` with ``load(A).y + pi_r >= 1`` and ``load(B).y - pi_r >= 0``.
Pricing a reduce tree means ``min over r of (pi_r + cheapest in-arborescence into r)``, which one
Edmonds run with a super-root answers for all roots at once (see
:func:`~horotopo.packing.arborescence.best_root_arborescence`); likewise for broadcast trees.

Phases:

1. Garg-Konemann multiplicative weights ("Faster and simpler algorithms for multicommodity flow
   and other fractional packing problems", FOCS 1998), which the paper uses for its tree
   packing: route the bottleneck rate of a cheap pair, grow each length ``y_l`` by
   ``(1 + eps * load_l / c_l)``. It seeds the pool with good trees.
2. Column generation: HiGHS solves the LP restricted to the pool; its duals ``(y, pi)`` price new
   trees (smoothed towards the best certified dual point). Ring's ``n`` chains, in rank order
   and along a nearest-neighbour ring that follows the topology, are in the pool from the
   start, so the result is never below ring (unless pruning caps the roots, below).
3. Pruning: at most ``max_trees_per_root`` reduce trees and as many broadcast trees per root;
   over-quota trees are banned and the LP re-solved, with pricing restricted to roots that have
   quota left, until the support fits; with ``max_roots``, only the trees of the roots that
   carry the most. The kept trees' rates are exact LP rates.
4. Pairing: per root, reduce and broadcast rates are matched north-west-corner style into
   (A, B, x) triples, at most ``2k - 1`` per root.

Certificate: for lengths ``y >= 0`` and any ``pi``, with ``d1 = min_r (pi_r + in_r(y))`` and
``d2 = min_r (out_r(y) - pi_r)``, the point ``(y, pi + d2) / (d1 + d2)`` is dual feasible, so
``c.y / (d1 + d2)`` bounds the optimum from above. Every priced ``(y, pi)`` (the multiplicative
weights with ``pi = 0``, and every LP dual) gives such a bound; the smallest is kept, with the
phase that produced it, and ``gap = 1 - R / bound`` is certified. The bound is never raised to
``R``: one below the achieved rate (beyond rounding) raises
:class:`~horotopo.packing.certificate.CertificateError` naming the topology and the phase.

Symbols: ``x`` rate of a tree pair (the paper's flow on a tree), ``R = sum x`` throughput,
``c_l`` capacity, ``y_l`` length (dual price of resource ``l``), ``pi_r`` price of root balance.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from ..params import PLANNER, PlannerParams
from ..topology import Topology
from .arborescence import best_root_arborescence, min_out_arborescence
from .certificate import check_certificate
from .model import (ArcModel, Packing, TreeRate, aware_ring_order, match_halves, ring_parents,
                    ring_parents_in_order)

__all__ = ["pack", "dual_bound", "price", "match_halves", "start_bound", "TreePool", "PHASE_GK",
           "PHASE_COLUMNS", "PHASE_START"]

# Names of the steps that produce bounds, as CertificateError and Plan.planner report them.
PHASE_GK = "Garg-Konemann dual"
PHASE_COLUMNS = "column generation pricing"
PHASE_START = "degree dual at lengths 1/c"
PHASE_FILLED = "dual at lengths 1/c on the filled resources"

UNBOUNDED_BPS = 1e15  # reported when no resource constrains anything (one rank, one host)
Half = Tuple[bool, int, Tuple[int, ...]]  # (inward, root, parent)


def dual_bound(capacity: np.ndarray, lengths: np.ndarray, d1: float, d2: float) -> float:
    """``c.y / (d1 + d2)``: an upper bound on the optimum (see module docstring)."""
    if d1 + d2 <= 0:
        return np.inf
    return float(capacity @ lengths) / (d1 + d2)


def price(model: ArcModel, lengths: np.ndarray, root_price: np.ndarray, inward: bool,
          count: int = 1, allowed_roots: Optional[np.ndarray] = None) -> List[Tuple[float, Half]]:
    """The cheapest trees of one kind at up to ``count`` distinct roots.

    The cost of a reduce tree (``inward``) into ``r`` is ``root_price[r] + cost_y(A)``; pass
    ``-pi`` for broadcast trees. Returns ``(reduced cost, (inward, root, parent))``, cheapest
    first; the first entry is the exact minimum over the allowed roots.
    """
    w = model.arc_costs(lengths)
    fixed = model.fixed_cost(lengths, inward)
    offsets = np.asarray(root_price, dtype=float).copy()
    if allowed_roots is not None:
        offsets[~allowed_roots] = np.inf
    found: List[Tuple[float, Half]] = []
    for _ in range(count):
        if not np.isfinite(offsets).any():
            break
        r, parent, cost = best_root_arborescence(w, offsets, inward)
        found.append((float(offsets[r] + cost + fixed),
                      (inward, r, tuple(int(p) for p in parent))))
        offsets[r] = np.inf
    return found


def start_bound(model: ArcModel) -> float:
    """A certified bound in ``O(n^2)``, for plans that are not packed (ring).

    Lengths ``y = 1 / c``, ``pi = 0``, and for ``d1``/``d2`` lower bounds instead of Edmonds
    (which takes tens of seconds at 512 ranks): every rank but the root has exactly one arc
    out of it in a reduce tree and one arc into it in a broadcast tree, so the cheapest such
    arcs bound the cheapest tree from below. Smaller ``d1 + d2`` only raises ``c.y / (d1 + d2)``,
    which stays dual feasible (module docstring). Exact on uniform networks, where ring is
    optimal; loose elsewhere (``inf`` when no arc costs anything).
    """
    lengths = 1.0 / model.capacity
    w = model.arc_costs(lengths).copy()
    np.fill_diagonal(w, np.inf)
    cheapest_out = w.min(axis=1)
    cheapest_in = w.min(axis=0)
    d1 = float(cheapest_out.sum() - cheapest_out.max()) + model.fixed_cost(lengths, True)
    d2 = float(cheapest_in.sum() - cheapest_in.max()) + model.fixed_cost(lengths, False)
    return dual_bound(model.capacity, lengths, d1, d2)


class TreePool:
    """Reduce and broadcast trees found so far, deduplicated, with their unit loads."""

    def __init__(self, model: ArcModel, lazy_rows: bool = False):
        self.model = model
        self.halves: List[Half] = []
        self.index: Dict[Half, int] = {}
        self.loads: List[np.ndarray] = []
        # Row generation: the LP holds only the rows that bind or were violated so far
        # (None: every row). A solution feasible for every row is optimal for the full LP,
        # and the left-out rows' duals, 0, complete an optimal dual point.
        self.rows: Optional[np.ndarray] = (np.zeros(len(model.capacity), dtype=bool)
                                           if lazy_rows else None)

    def add(self, half: Half) -> bool:
        if half in self.index:
            return False
        self.index[half] = len(self.halves)
        self.halves.append(half)
        self.loads.append(self.model.half_load(half[2], half[0]))
        return True

    def solve(self, allowed: Optional[np.ndarray] = None
              ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact LP over the (allowed) pool: rates of every tree, lengths ``y``, prices ``pi``."""
        ids = np.arange(len(self.halves)) if allowed is None else np.flatnonzero(allowed)
        n = self.model.n
        cap = self.model.capacity
        scale = float(cap.max())
        inward = np.array([self.halves[i][0] for i in ids])
        roots = np.array([self.halves[i][1] for i in ids])
        loads = np.column_stack([self.loads[i] for i in ids])
        a_eq = sp.csc_matrix((np.where(inward, 1.0, -1.0), (roots, np.arange(len(ids)))),
                             shape=(n, len(ids)))
        rows = np.ones(len(cap), dtype=bool) if self.rows is None else self.rows
        if self.rows is not None:
            # Each column's own bottleneck keeps the restricted LP bounded.
            with np.errstate(divide="ignore"):
                ratio = np.where(loads > 0, cap[:, None] / loads, np.inf)
            rows[np.argmin(ratio, axis=0)] = True
        while True:
            res = linprog(-inward.astype(float), A_ub=sp.csc_matrix(loads[rows]),
                          b_ub=cap[rows] / scale, A_eq=a_eq, b_eq=np.zeros(n),
                          bounds=(0, None), method="highs")
            if res.status != 0:
                raise RuntimeError(f"HiGHS could not solve the rate LP: {res.message}")
            x = np.maximum(res.x, 0.0) * scale
            over = ~rows & (loads @ x > cap * (1 + 1e-9))
            if not over.any():
                break
            rows |= over
        x = _feasible(x, loads, cap, inward, roots, n)
        rates = np.zeros(len(self.halves))
        rates[ids] = x
        lengths = np.zeros(len(cap))
        lengths[rows] = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
        prices = -np.asarray(res.eqlin.marginals)
        return rates, lengths, prices


def _feasible(x: np.ndarray, loads: np.ndarray, cap: np.ndarray, inward: np.ndarray,
              roots: np.ndarray, n: int) -> np.ndarray:
    """HiGHS's rates made exactly feasible: each root's reduce and broadcast halves cut to
    the smaller of their two sums, then every rate scaled so that no resource is over.

    The solver meets its rows to its feasibility tolerance (about 1e-7), not exactly; the
    pool's rate is checked against certified bounds at 1e-9 (:data:`.certificate.RTOL`), and
    on a probed 1024-rank cluster over hosts HiGHS's rates stood 4.1e-8 above a true bound.
    This costs at most that tolerance of the rate."""
    into = np.bincount(roots[inward], weights=x[inward], minlength=n)
    out = np.bincount(roots[~inward], weights=x[~inward], minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(inward, np.minimum(1.0, out / into)[roots],
                        np.minimum(1.0, into / out)[roots])
    x = x * np.where(np.isfinite(keep), keep, 0.0)
    used = loads @ x
    busy = used > 0
    if busy.any():
        x = x * min(1.0, float(np.min(cap[busy] / used[busy])))
    return x


def _unconstrained(n: int) -> Packing:
    star = tuple(-1 if v == 0 else 0 for v in range(n))
    tree = TreeRate(0, star, star, UNBOUNDED_BPS)
    return Packing(trees=(tree,), throughput=UNBOUNDED_BPS, upper_bound=UNBOUNDED_BPS,
                   full_throughput=UNBOUNDED_BPS, bound_phase="no constrained resource")


def _single_node(model: "ArcModel") -> Packing:
    """One node: the only column is the empty tree, whose fixed load (a hierarchical model's
    intra-host stage) alone sets the rate, so the optimum is known exactly."""
    rate = model.max_rate(model.load(0, (-1,), (-1,)))
    if not np.isfinite(rate):
        return _unconstrained(1)
    tree = TreeRate(0, (-1,), (-1,), rate)
    return Packing(trees=(tree,), throughput=rate, upper_bound=rate, full_throughput=rate,
                   bound_phase="single node: the one column's rate")


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def pack(topology: Topology, *, max_trees_per_root: Optional[int] = None,
         min_share: Optional[float] = None, target_gap: Optional[float] = None,
         eps: Optional[float] = None, gk_iterations: Optional[int] = None,
         columns_per_round: Optional[int] = None, max_rounds: Optional[int] = None,
         time_limit_s: Optional[float] = None,
         progress: Optional[Callable[[str], None]] = None,
         model: Optional[ArcModel] = None, ring_seeds: bool = True, rank_ring: bool = True,
         lazy_rows: bool = False, filled_dual: bool = False, seeds: Sequence[Half] = (),
         known_bound: Optional[Tuple[float, str, Tuple[np.ndarray, np.ndarray]]] = None,
         max_roots: Optional[int] = None, params: PlannerParams = PLANNER) -> Packing:
    """Pack reduce/broadcast trees on ``topology`` with a certified optimality gap.

    ``max_trees_per_root``, ``target_gap``, ``eps``, ``columns_per_round``, ``max_rounds`` and
    ``time_limit_s`` default to the fields of ``params`` that hold them
    (:class:`~horotopo.params.PlannerParams`: ``max_trees_per_root``, ``target_gap``,
    ``packing_eps``, ``columns_per_round``, ``max_rounds``, ``packing_time_limit_s``).

    Parameters
    ----------
    topology : Topology
        The network (its name goes into certificate errors).
    model : ArcModel, optional
        The packing model (default ``ArcModel(topology)``, trees over ranks); the hierarchical
        planner passes its model of trees over hosts
        (:class:`~horotopo.packing.hierarchy.HostModel`).
    ring_seeds, rank_ring : bool
        Seed the pool with the topology-aware ring's chains and (``rank_ring``) node order's
        (``2n`` columns each); else the aware ring is only the floor the result never is below.
    lazy_rows : bool
        Row generation: the LP holds only the capacity rows that bind (local links never do).
    filled_dual : bool
        Every fifth round also price lengths ``1/c`` on the resources the pool's LP fills.
    seeds : sequence of (inward, root, parent)
        More trees for the pool from the start. When they and the ring alone meet the target
        gap against ``known_bound``, the multiplicative weights are skipped.
    known_bound : (bound, phase, dual), optional
        A certified bound priced beforehand (checked like every other), the phase that gave it
        and its dual point scaled to feasibility.
    max_trees_per_root : int
        ``k``: pruning keeps at most ``k`` reduce and ``k`` broadcast trees per root.
    max_roots : int, optional
        Pruning keeps the trees of at most this many roots, those that carry the most, and
        re-solves the LP over them; the ring's chains (one per root) are then no floor.
    min_share : float, optional
        Pruning drops trees below this fraction of ``R`` (default ``min(prune_min_share,
        prune_rank_share / n)`` of ``params``).
    target_gap : float
        Column generation stops once its certified gap is at most half of this.
    eps : float
        Garg-Konemann step size.
    gk_iterations : int, optional
        Multiplicative-weights iterations (default ``params.weights_iterations_per_rank`` per
        rank, at most ``params.max_weights_iterations``).
    columns_per_round : int
        Roots priced per kind and column-generation round.
    max_rounds, time_limit_s : int, float
        Caps on column generation and pruning, the time in this process's CPU seconds (so that
        other load on the machine does not change the plan); the result stays certified.
    progress : callable, optional
        Receives one-line progress messages.
    """
    start, wall, say = time.process_time(), time.perf_counter(), progress or (lambda m: None)
    max_trees_per_root = _given(max_trees_per_root, params.max_trees_per_root)
    target_gap = _given(target_gap, params.target_gap)
    eps = _given(eps, params.packing_eps)
    columns_per_round = _given(columns_per_round, params.columns_per_round)
    max_rounds = _given(max_rounds, params.max_rounds)
    time_limit_s = _given(time_limit_s, params.packing_time_limit_s)
    model = model if model is not None else ArcModel(topology)
    n = model.n
    cap = model.capacity
    if n == 1:
        return _single_node(model)
    if not model.constrained:
        return _unconstrained(n)
    if min_share is None:
        min_share = min(params.prune_min_share, params.prune_rank_share / n)
    zeros = np.zeros(n)

    pool = TreePool(model, lazy_rows)
    # Ring in node order, and a topology-aware ring (n chains), which is optimal on uniform
    # stars and near it on racks, and gives the pruning a low-support solution to fall back on.
    order = aware_ring_order(model)
    rings = [[(kind, r, ring_parents(n, r)[0 if kind else 1]) for r in range(n)
              for kind in (True, False)],
             [(kind, r, ring_parents_in_order(order, r)[0 if kind else 1]) for r in range(n)
              for kind in (True, False)]]
    for half in ((rings[0] if rank_ring else []) + rings[1] if ring_seeds else []):
        pool.add(half)
    aware_ring = [pool.index[h] for h in rings[1]] if ring_seeds else []
    for half in seeds:
        pool.add(half)
    # best_bound: which step produced it (for CertificateError), its (y, pi) scaled to dual
    # feasibility.
    best_bound, phase, dual = known_bound or (np.inf, "no dual point priced", None)
    history: List[Tuple[float, float]] = []
    iterations = 0
    gk_count = gk_iterations if gk_iterations is not None else min(
        params.weights_iterations_per_rank * n, params.max_weights_iterations)
    # A seeded pool (the hierarchical planner's) is often at the optimum already: its LP's
    # duals, priced once, certify it, and then the multiplicative weights (three Edmonds runs
    # per tree, most of the packing's time at hundreds of machines) would add nothing. That
    # LP and pricing are column generation's first round, kept for it.
    seeded: Optional[Tuple[Tuple[np.ndarray, np.ndarray, np.ndarray], tuple]] = None
    if seeds:
        rates, y, pi = pool.solve()
        found = (price(model, y, pi, True, columns_per_round),
                 price(model, y, -pi, False, columns_per_round))
        d1, d2 = found[0][0][0], found[1][0][0]
        if d1 + d2 > 0:
            point = (dual_bound(cap, y, d1, d2), PHASE_COLUMNS,
                     (y / (d1 + d2), (pi + d2) / (d1 + d2)))
            if point[0] < best_bound:
                best_bound, phase, dual = point
        if filled_dual:
            best_bound, phase, dual = _filled_bound(model, pool, rates, (best_bound, phase, dual))
        if float(rates[[h[0] for h in pool.halves]].sum()) >= (1 - target_gap / 2) * best_bound:
            gk_count = 0
            seeded = (rates, y, pi), found

    # Phase 1: Garg-Konemann multiplicative weights, seeding the pool.
    y = 1.0 / cap
    for _ in range(gk_count):
        (d1, (_, root, a)), = price(model, y, zeros, True)
        (d2, _), = price(model, y, zeros, False)
        bound = dual_bound(cap, y, d1, d2)
        if bound < best_bound:
            best_bound, phase = bound, PHASE_GK
            dual = (y / (d1 + d2), np.full(n, d2 / (d1 + d2)))
        b, _ = min_out_arborescence(model.arc_costs(y), root)
        b = tuple(int(p) for p in b)
        pool.add((True, root, a))
        pool.add((False, root, b))
        iterations += 1
        load = model.load(root, a, b)
        used = load > 0
        flow = float(np.min(cap[used] / load[used]))
        y = y * (1.0 + eps * flow * load / cap)
        y /= float(cap @ y)  # only the direction of y matters; keep it from overflowing
        if time.process_time() - start > params.packing_weights_share * time_limit_s:
            break

    # Phase 2: column generation on the LP duals, stabilized (Wentges smoothing): pricing at a
    # mix of the LP duals and the best certified dual point so far keeps the degenerate LP's
    # jumping duals from producing columns that never enter and bounds that never tighten.
    reused = seeded is not None  # its LP, pricing and filled bound: round 0's
    rates, y, pi = seeded[0] if seeded else pool.solve()
    rounds = 0
    center: Optional[Tuple[np.ndarray, np.ndarray]] = None
    mix = params.smoothing_mix
    while True:
        r_pool = float(rates[[h[0] for h in pool.halves]].sum())
        if center is None:
            ys, pis = y, pi
        else:
            ys, pis = mix * center[0] + (1 - mix) * y, mix * center[1] + (1 - mix) * pi
        if seeded:  # the first round, at the seeded pool's duals: priced above
            (found_a, found_b), seeded = seeded[1], None
        else:
            found_a = price(model, ys, pis, True, columns_per_round)
            found_b = price(model, ys, -pis, False, columns_per_round)
        iterations += 1
        d1, d2 = found_a[0][0], found_b[0][0]
        bound = dual_bound(cap, ys, d1, d2) if d1 + d2 > 0 else np.inf  # no claim
        if bound < best_bound:
            best_bound, phase = bound, PHASE_COLUMNS
            center = dual = (ys / (d1 + d2), (pis + d2) / (d1 + d2))
        if filled_dual and rounds % params.filled_dual_period == 0 and not (rounds == 0
                                                                           and reused):
            best_bound, phase, dual = _filled_bound(model, pool, rates,
                                                    (best_bound, phase, dual))
        # The pool's LP rate is feasible, so it can never exceed a true bound.
        check_certificate(best_bound, r_pool, topology=topology.name, phase=phase,
                          achieved_by="the column pool's LP")
        history.append((r_pool, best_bound))
        gap = 1.0 - r_pool / best_bound
        if rounds % 10 == 0:
            say(f"column generation round {rounds}: R {r_pool / 1e6:.3f} MB/s, bound "
                f"{best_bound / 1e6:.3f} MB/s, gap {gap * 100:.3f}%, {len(pool.halves)} trees")
        if gap <= target_gap / 2 or rounds >= max_rounds \
                or time.process_time() - start > params.packing_columns_share * time_limit_s:
            break
        added = 0
        for _, h in found_a + found_b:
            load = model.half_load(h[2], h[0])
            reduced = float(load @ y) + (pi[h[1]] if h[0] else -pi[h[1]])
            if reduced < (1.0 if h[0] else 0.0) - 1e-9:
                added += pool.add(h)
        rounds += 1
        if not added:
            if center is None or mix < params.smoothing_min_mix:
                break  # nothing prices out at the LP duals: the pool's LP is optimal
            mix /= params.smoothing_shrink  # mis-priced: trust the LP duals more
            continue
        rates, y, pi = pool.solve()
    inward = np.array([h[0] for h in pool.halves])
    r_full = float(rates[inward].sum())
    # once more, unless the last round of the loop priced it
    if filled_dual and rounds % params.filled_dual_period:
        best_bound, phase, dual = _filled_bound(model, pool, rates, (best_bound, phase, dual))
        check_certificate(best_bound, r_full, topology=topology.name, phase=phase,
                          achieved_by="the column pool's LP")

    # Phase 3: prune to the quota, re-solving and re-pricing.
    rates = _prune(pool, rates, max_trees_per_root, min_share, start, time_limit_s,
                   target_gap * params.prune_gap_share, aware_ring,
                   params.prune_passes_per_rank * pool.model.n + params.prune_min_passes)
    if max_roots is not None:
        rates = _keep_roots(pool, rates, max_roots)
    inward = np.array([h[0] for h in pool.halves])
    total = float(rates[inward].sum())
    # A ring's n chains at one common rate (model.ring_rate's figure for the node-order one).
    floor = rings[0] if ring_seeds and rank_ring else rings[1]
    ring = n * model.max_rate(np.sum([model.half_load(h[2], h[0]) for h in floor], axis=0))
    if total < ring * (1 - 1e-9) and (max_roots is None or n <= max_roots):
        # Ring's chains, one per root, always fit the quota.
        for half in floor:
            pool.add(half)
        rates = np.zeros(len(pool.halves))
        rates[[pool.index[h] for h in floor]] = ring / n
        total = ring
    trees = match_halves(pool.halves, rates)
    total = float(sum(t.rate for t in trees))
    say(f"pruned to {len(trees)} tree pairs: R {total / 1e6:.3f} MB/s "
        f"(before pruning {r_full / 1e6:.3f}), bound {best_bound / 1e6:.3f} MB/s")
    check_certificate(best_bound, total, topology=topology.name, phase=phase,
                      achieved_by="the pruned trees")
    # The raw bound (see module docstring); None if no dual point gave a finite one.
    return Packing(trees=trees, throughput=total,
                   upper_bound=float(best_bound) if np.isfinite(best_bound) else None,
                   full_throughput=max(r_full, total), iterations=iterations,
                   columns=len(pool.halves), seconds=time.perf_counter() - wall,
                   history=tuple(history), bound_phase=phase, dual=dual)


def _filled_bound(model: ArcModel, pool: TreePool, rates: np.ndarray, best: tuple) -> tuple:
    """``best`` ``(bound, phase, dual)``, or the dual point at lengths ``1/c`` on the resources
    the pool's LP fills where it bounds lower (degenerate LP duals on many symmetric NICs)."""
    used = np.sum([r * pool.loads[i] for i, r in enumerate(rates) if r > 0], axis=0)
    full = np.asarray(used >= model.capacity * (1 - 1e-6), dtype=float) / model.capacity
    if not full.any():
        return best
    (d1, _), = price(model, full, np.zeros(model.n), True)
    (d2, _), = price(model, full, np.zeros(model.n), False)
    bound = dual_bound(model.capacity, full, d1, d2) if d1 + d2 > 0 else np.inf
    if bound >= best[0]:
        return best
    return bound, PHASE_FILLED, (full / (d1 + d2), np.full(model.n, d2 / (d1 + d2)))


def _keep_roots(pool: TreePool, rates: np.ndarray, max_roots: int) -> np.ndarray:
    """``rates`` on the trees of the ``max_roots`` roots whose reduce trees carry the most
    (the lowest root on a tie), the LP re-solved over those trees alone."""
    inward = np.array([h[0] for h in pool.halves])
    roots = np.array([h[1] for h in pool.halves])
    carried = np.bincount(roots[inward], weights=rates[inward], minlength=pool.model.n)
    if np.count_nonzero(carried > 0) <= max_roots:
        return rates
    top = np.argsort(-carried, kind="stable")[:max_roots]
    allowed = (rates > 0) & np.isin(roots, top)
    kept, _, _ = pool.solve(allowed)
    kept[~allowed] = 0.0
    return kept


def _top_per_root(rates: np.ndarray, inward: np.ndarray, roots: np.ndarray, per_root: int,
                  min_share: float) -> np.ndarray:
    total = float(rates[inward].sum())
    keep = np.zeros(len(rates), dtype=bool)
    for kind in (True, False):
        for r in np.unique(roots):
            at = np.flatnonzero((inward == kind) & (roots == r) & (rates >= min_share * total)
                                & (rates > 0))
            keep[at[np.argsort(-rates[at], kind="stable")][:per_root]] = True
    return keep


def _prune(pool: TreePool, rates: np.ndarray, per_root: int, min_share: float,
           start: float, time_limit_s: float, tolerance: float,
           aware_ring: Sequence[int], max_passes: int) -> np.ndarray:
    """Cut the support to at most ``per_root`` trees of each kind per root.

    A root whose support reaches the quota is frozen to its ``per_root`` best trees (every
    other tree of that kind at that root is banned), so re-solving cannot shift its rate to
    yet another tree there; trees below ``min_share`` are banned. Roots still under quota may
    then take up new trees priced on the restricted LP's duals, for at most ``max_passes``
    passes.
    """
    model = pool.model
    n = model.n
    inward = np.array([h[0] for h in pool.halves])
    roots = np.array([h[1] for h in pool.halves])
    r_full = float(rates[inward].sum())
    # Shortcuts first: the topology-aware ring alone (one tree of each kind per root), then
    # each root's top trees; either is enough when it loses almost nothing.
    ring_only = np.zeros(len(pool.halves), dtype=bool)
    ring_only[list(aware_ring)] = True
    for allowed in (ring_only, _top_per_root(rates, inward, roots, per_root, min_share)):
        if not allowed.any():
            continue  # no ring in the pool (pack(ring_seeds=False))
        trial, _, _ = pool.solve(allowed)
        if trial[inward].sum() >= (1 - tolerance) * r_full:
            trial[~allowed] = 0.0
            return trial
    allowed = np.ones(len(pool.halves), dtype=bool)
    full = np.zeros((2, n), dtype=bool)
    for _ in range(max_passes):
        inward = np.array([h[0] for h in pool.halves])
        roots = np.array([h[1] for h in pool.halves])
        total = float(rates[inward].sum())
        support = rates > 1e-9 * total
        ban = support & (rates < min_share * total)
        for kind in (True, False):
            for r in np.unique(roots[support & (inward == kind)]):
                here = (inward == kind) & (roots == r)
                at = np.flatnonzero(support & here)
                if len(at) >= per_root and not full[int(kind), r]:
                    best = at[np.argsort(-rates[at], kind="stable")][:per_root]
                    others = here & allowed
                    others[best] = False
                    ban |= others
                    full[int(kind), r] = True
        if ban.any():
            allowed[ban] = False
            rates, _, _ = pool.solve(allowed)
            continue
        if time.process_time() - start > time_limit_s:
            break
        _, y, pi = pool.solve(allowed)
        count = len(pool.halves)
        added = 0
        for kind, threshold in ((True, 1.0), (False, 0.0)):
            found = price(model, y, pi if kind else -pi, kind, 2,
                          allowed_roots=~full[int(kind)])
            added += sum(pool.add(h) for cost, h in found if cost < threshold - 1e-9)
        if not added:
            break
        allowed = np.r_[allowed, np.ones(len(pool.halves) - count, dtype=bool)]
        rates, _, _ = pool.solve(allowed)
    rates = rates.copy()
    rates[~allowed[: len(rates)]] = 0.0
    return rates
