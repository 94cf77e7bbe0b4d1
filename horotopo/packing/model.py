"""The packing model: columns (tree pairs), their resource loads, and the ring baseline.

A column is the paper's pair of a reduce in-arborescence ``A`` into root ``r`` and a broadcast
out-arborescence ``B`` from ``r``; at rate ``x`` it loads resource ``l`` with
``x * (arcs of A whose route uses l + arcs of B whose route uses l)``. The packing LP is

    max sum_t x_t   s.t.   sum_t x_t * load_t(l) <= c_l  for every resource l,  x >= 0,

and its dual is ``min c.y  s.t.  cost_y(t) >= 1`` for every column ``t``, where
``cost_y(t) = sum_l load_t(l) y_l``. Any ``y >= 0`` scaled by ``1 / min_t cost_y(t)`` is dual
feasible, which is where every certified upper bound in this package comes from.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from ..topology import Topology
from .certificate import format_percent
from .certificate import gap as certificate_gap

__all__ = ["TreeRate", "Packing", "ArcModel", "ring_packing", "ring_parents", "ring_rate",
           "ring_parents_in_order", "ring_order_nearest", "aware_ring_order", "ring_order_rate",
           "hops_to_root", "validate_arborescence", "match_halves"]


@dataclass(frozen=True)
class TreeRate:
    """One column of the packing with its rate ``x`` in bytes/s."""

    root: int
    reduce_parent: Tuple[int, ...]
    bcast_parent: Tuple[int, ...]
    rate: float


@dataclass(frozen=True)
class Packing:
    """Result of the packing: kept trees with rates, and the certificate.

    ``throughput`` is ``R = sum x`` of the kept trees; ``upper_bound`` is a dual-feasible bound
    on the optimum exactly as computed (never raised to ``R``; None when no certificate was
    computed, as for :func:`ring_packing`) and ``bound_phase`` names the step that produced it;
    ``full_throughput`` is the LP optimum over every column generated, before pruning, so
    ``pruning_loss = 1 - throughput / full_throughput``.
    """

    trees: Tuple[TreeRate, ...]
    throughput: float
    upper_bound: Optional[float]
    full_throughput: float
    iterations: int = 0
    columns: int = 0
    seconds: float = 0.0
    history: Tuple[Tuple[float, float], ...] = field(default=(), compare=False)
    bound_phase: str = ""
    #: The dual-feasible point ``(y, pi)`` behind ``upper_bound`` (``c.y == upper_bound``), or
    #: None; the hierarchical planner prices it in the flat model for the flat bound.
    dual: Optional[Tuple[np.ndarray, np.ndarray]] = field(default=None, compare=False,
                                                          repr=False)
    #: Further figures for the plan's ``planner`` record (the hierarchical model's).
    extra: Dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def gap(self) -> Optional[float]:
        """``1 - R / upper_bound`` unfloored (see :func:`.certificate.gap`); None if no bound."""
        return certificate_gap(self.throughput, self.upper_bound)

    @property
    def pruning_loss(self) -> float:
        if self.full_throughput <= 0:
            return 0.0
        return max(0.0, 1.0 - self.throughput / self.full_throughput)

    def stats(self) -> Dict[str, Any]:
        return {"iterations": self.iterations, "columns": self.columns,
                "seconds": round(self.seconds, 4), "full_throughput_Bps": self.full_throughput,
                "bound_phase": self.bound_phase, **self.extra}

    def to_json(self) -> Dict[str, Any]:
        return {"throughput_Bps": self.throughput, "upper_bound_Bps": self.upper_bound,
                "full_throughput_Bps": self.full_throughput, "gap": self.gap,
                "pruning_loss": self.pruning_loss, **self.stats(),
                "trees": [{"root": t.root, "reduce_parent": list(t.reduce_parent),
                           "bcast_parent": list(t.bcast_parent), "rate_Bps": t.rate}
                          for t in self.trees]}

    def describe(self) -> str:
        gap = self.gap
        cert = ("no certificate" if self.upper_bound is None or gap is None else
                f"bound {self.upper_bound / 1e6:.3f} MB/s, gap {format_percent(gap)}")
        return (f"packing: {len(self.trees)} trees, R {self.throughput / 1e6:.3f} MB/s, "
                f"{cert}, pruning loss {self.pruning_loss * 100:.2f}%, {self.iterations} iterations, "
                f"{self.columns} columns, {self.seconds:.2f} s")

    def __str__(self) -> str:  # pragma: no cover - convenience
        return json.dumps(self.to_json())


def hops_to_root(parent: Sequence[int]) -> Optional[np.ndarray]:
    """Hops from every entry of the parent array ``parent`` (-1 at roots) to its root, or None
    when some entry never reaches a root (a cycle).

    Breadth first from the roots, a level at a time over every tree at once, with each
    entry's children gathered by a counting sort (a sparse matrix's rows): ``O(n)`` array
    work plus a few small operations per level. Pointer doubling takes ``log2`` of the depth
    passes over all ``n`` entries, the most of a validation at thousands of ranks."""
    p = np.asarray(parent, dtype=np.int64)
    n = len(p)
    has = p >= 0
    kids = sp.csr_matrix((np.ones(int(has.sum()), dtype=np.int8), (p[has], np.flatnonzero(has))),
                         shape=(n, n))
    dist = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(~has)
    dist[frontier] = 0
    level = 0
    while len(frontier):
        first = kids.indptr[frontier]
        count = kids.indptr[frontier + 1] - first
        first, count = first[count > 0], count[count > 0]
        # the children of every frontier entry: indices[first[f] : first[f] + count[f]]
        offsets = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        frontier = kids.indices[np.repeat(first, count) + offsets]
        level += 1
        dist[frontier] = level
    return None if (dist < 0).any() else dist


def validate_arborescence(parent: Sequence[int], root: int, n: int) -> Optional[str]:
    """Return what is wrong with ``parent`` as an arborescence rooted at ``root``, or None."""
    if len(parent) != n:
        return f"must have {n} entries, got {len(parent)}"
    if not 0 <= root < n:
        return f"root {root} is out of range 0..{n - 1}"
    if parent[root] != -1:
        return f"the root {root} must have parent -1, got {parent[root]}"
    p = np.asarray(parent, dtype=np.int64)
    v = np.arange(n)
    bad = (v != root) & ((p < 0) | (p >= n) | (p == v))
    if bad.any():
        u = int(np.argmax(bad))
        return (f"rank {u} is its own parent" if p[u] == u
                else f"rank {u} has parent {p[u]}, out of range 0..{n - 1}")
    if hops_to_root(p) is None:
        # name the first rank on a cycle that a walk from rank 0 upwards meets
        state = [0] * n  # 0 unknown, 1 on the current walk, 2 reaches the root
        state[root] = 2
        for v0 in range(n):
            walk, u = [], v0
            while state[u] == 0:
                state[u] = 1
                walk.append(u)
                u = int(p[u])
            if state[u] == 1:
                return f"rank {u} is on a cycle and never reaches the root {root}"
            for w in walk:
                state[w] = 2
    return None


def ring_parents(n: int, root: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """Ring in rank order as one column: reduce chain r+1 -> r+2 -> ... -> r, broadcast chain
    r -> r+1 -> ... -> r-1 (ring allreduce is n such columns at equal rates)."""
    reduce_parent = [-1] * n
    bcast_parent = [-1] * n
    for v in range(n):
        if v != root:
            reduce_parent[v] = (v + 1) % n
            bcast_parent[v] = (v - 1) % n
    return tuple(reduce_parent), tuple(bcast_parent)


class ArcModel:
    """Sparse incidence of logical arcs ``i -> j`` (index ``i * n + j``) on resources."""

    def __init__(self, topology: Topology):
        n = topology.n
        self.n = n
        self.capacity = topology.capacity_array
        rows: List[int] = []
        cols: List[int] = []
        for i in range(n):
            for j in range(n):
                for r in topology.routes[i][j]:
                    rows.append(i * n + j)
                    cols.append(r)
        self.incidence = sp.csr_matrix((np.ones(len(rows)), (rows, cols)),
                                       shape=(n * n, len(self.capacity)))
        self.incidence_T = self.incidence.T.tocsr()

    @property
    def constrained(self) -> bool:
        """Whether any column loads any resource (else every rate is feasible)."""
        return self.incidence.nnz > 0

    def fixed_cost(self, lengths: np.ndarray, inward: bool) -> float:
        """Cost under ``lengths`` of the load every tree of a kind carries whatever its arcs
        (none here; a hierarchical model's intra-host stage)."""
        return 0.0

    def arc_costs(self, lengths: np.ndarray) -> np.ndarray:
        """``W[i, j] = sum of lengths over the route of i -> j`` (0 for same-host arcs)."""
        return (self.incidence @ lengths).reshape(self.n, self.n)

    def load(self, root: int, reduce_parent: Sequence[int], bcast_parent: Sequence[int]) -> np.ndarray:
        """Resource load of one column (a reduce tree plus a broadcast tree) at unit rate."""
        return self.half_load(reduce_parent, True) + self.half_load(bcast_parent, False)

    def arc_parts(self, tails: np.ndarray, heads: np.ndarray
                  ) -> List[Tuple[sp.csr_matrix, np.ndarray]]:
        """Load at unit rate of each arc ``tails[i] -> heads[i]``: row ``rows[i]`` of the
        ``(matrix, rows)`` listed (as :meth:`HostModel.arc_parts`, which lists several)."""
        return [(self.incidence, np.asarray(tails) * self.n + np.asarray(heads))]

    def half_load(self, parent: Sequence[int], inward: bool) -> np.ndarray:
        """Resource load at unit rate of one reduce tree (``inward``) or one broadcast tree."""
        n = self.n
        idx = [(v * n + p) if inward else (p * n + v) for v, p in enumerate(parent) if p >= 0]
        counts = np.bincount(np.asarray(idx, dtype=np.int64), minlength=n * n)
        return np.asarray(self.incidence_T @ counts, dtype=float).ravel()

    def max_rate(self, load: np.ndarray) -> float:
        """Largest rate of a column with ``load`` alone on the network."""
        used = load > 0
        if not used.any():
            return np.inf
        return float(np.min(self.capacity[used] / load[used]))


def ring_order_nearest(cost: np.ndarray) -> List[int]:
    """A ring through all ranks by nearest neighbour on ``cost`` (lowest index breaks ties).

    Under unit lengths ``1 / c`` the cost of an arc grows with every slow link it crosses, so
    this ring stays inside racks and crosses each uplink about once per direction: the ring a
    topology-aware scheduler would pick, and a strong seed for the packing.
    """
    n = cost.shape[0]
    order = [0]
    left = np.ones(n, dtype=bool)
    left[0] = False
    for _ in range(n - 1):
        row = np.where(left, cost[order[-1]] + cost[:, order[-1]], np.inf)
        nxt = int(np.argmin(row))
        order.append(nxt)
        left[nxt] = False
    return order


def aware_ring_order(model: "ArcModel") -> List[int]:
    """The topology-aware ring: nearest neighbour at lengths ``1 / c``
    (:func:`ring_order_nearest`), or the model's own order (``model.ring_order()``, where it
    has one) when that ring's ``n`` chains reach a higher common rate.

    Nearest neighbour minimises the summed lengths, not the busiest link: on racks whose
    hosts' NICs differ it leaves a rack's slow hosts for last and crosses their uplinks once
    per slow host, well below what the NICs allow.
    """
    orders = [ring_order_nearest(model.arc_costs(1.0 / model.capacity))]
    if not hasattr(model, "ring_order"):
        return orders[0]
    orders.append(list(model.ring_order()))
    rates = [ring_order_rate(model, order) for order in orders]
    return orders[int(np.argmax(rates))]  # the first on a tie


def ring_order_rate(model: "ArcModel", order: Sequence[int]) -> float:
    """The common rate of the ``n`` chains of the ring ``order`` (one per root).

    Each ring arc is in ``n - 1`` of the reduce chains and ``n - 1`` of the broadcast chains,
    and each chain carries the model's fixed load once (its load with no arcs), so the sum of
    the ``2n`` chains' loads takes four loads: the whole cycle and the empty tree, per kind.
    """
    n = len(order)
    cycle = np.empty(n, dtype=np.int64)
    cycle[np.asarray(order)] = np.roll(order, -1)  # every node sends to the next
    empty = np.full(n, -1, dtype=np.int64)
    load = 0.0
    for kind in (True, False):
        fixed = model.half_load(empty, kind)
        load = load + (n - 1) * (model.half_load(cycle, kind) - fixed) + n * fixed
    return n * model.max_rate(load)


def ring_parents_in_order(order: Sequence[int], root: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """Like :func:`ring_parents`, along the ring ``order`` instead of rank order."""
    n = len(order)
    pos = {v: k for k, v in enumerate(order)}
    reduce_parent = [-1] * n
    bcast_parent = [-1] * n
    for v in range(n):
        if v != root:
            k = pos[v]
            reduce_parent[v] = order[(k + 1) % n]
            bcast_parent[v] = order[(k - 1) % n]
    return tuple(reduce_parent), tuple(bcast_parent)


def ring_rate(model: ArcModel) -> float:
    """Throughput ``R`` of ring allreduce in rank order: ``n`` chains at one common rate
    (``inf`` when no resource constrains it)."""
    n = model.n
    load = sum((model.load(r, *ring_parents(n, r)) for r in range(n)),
               np.zeros(len(model.capacity)))
    return n * model.max_rate(load)


def ring_packing(topology: Topology) -> Packing:
    """Ring allreduce in rank order on the model: n chain columns at one common rate.

    It carries no certificate (``upper_bound`` None): ring's rate says nothing about the optimum
    of a non-uniform network. :func:`horotopo.packing.gk.start_bound` gives one cheaply.
    """
    n = topology.n
    cols = [(r, *ring_parents(n, r)) for r in range(n)]
    x = ring_rate(ArcModel(topology)) / n
    if not np.isfinite(x):
        # Every arc is free (one host): any rate works; report a large finite figure.
        x = 1e15
    trees = tuple(TreeRate(r, a, b, float(x)) for r, a, b in cols)
    total = float(x) * n
    return Packing(trees=trees, throughput=total, upper_bound=None, full_throughput=total)


def match_halves(halves: Sequence[Tuple[bool, int, Tuple[int, ...]]], rates: np.ndarray
                 ) -> Tuple[TreeRate, ...]:
    """Match each root's reduce and broadcast rates into (A, B, x) triples (north-west corner).

    The LP balances each root's totals; the broadcast rates are rescaled to the reduce total
    to absorb the solver's rounding.
    """
    total = float(sum(rates[i] for i, h in enumerate(halves) if h[0]))
    tiny = 1e-9 * total
    by_root: Dict[int, Tuple[List[List], List[List]]] = {}
    for i, (inward, root, parent) in enumerate(halves):
        if rates[i] > tiny:
            by_root.setdefault(root, ([], []))[0 if inward else 1].append([parent, float(rates[i])])
    out: List[TreeRate] = []
    for root in sorted(by_root):
        ups, downs = by_root[root]
        up_sum = sum(u[1] for u in ups)
        down_sum = sum(d[1] for d in downs)
        if up_sum <= tiny or down_sum <= tiny:
            continue
        for d in downs:
            d[1] *= up_sum / down_sum
        i = j = 0
        while i < len(ups) and j < len(downs):
            x = min(ups[i][1], downs[j][1])
            if x > tiny:
                out.append(TreeRate(root, tuple(ups[i][0]), tuple(downs[j][0]), x))
            ups[i][1] -= x
            downs[j][1] -= x
            if ups[i][1] <= tiny:
                i += 1
            if downs[j][1] <= tiny:
                j += 1
    return tuple(out)
