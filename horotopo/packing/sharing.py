"""The rates that concurrent trees get from a network that shares its links fairly.

The packing LP gives every tree a rate ``x_t`` such that no resource is over capacity, and a plan
used to split each buffer in proportion to those rates. A real network does not enforce them:
the trees run at once, and a link is shared among the *flows* crossing it (max-min fair in
SimGrid's model, per TCP connection on a cluster). A tree is a pipeline, so it moves at the pace
of its slowest flow, and every flow of one tree carries the tree's rate. The rates the network
gives are then the max-min fair allocation over trees in which tree ``t`` at rate ``r_t`` loads
resource ``l`` with ``U[t, l] * r_t``: ``U[t, l]`` is the number of the tree's flows (reduce
arcs child -> parent, broadcast arcs parent -> child) whose route crosses ``l``.

A tree whose share of the buffer is larger than its fair rate allows finishes last, while the
others idle: on ``random_declared(4, 12, gbps_range=(0.2, 1.0))`` the LP's rates 4.0, 6.375,
4.875 and 16.375 MB/s (31.6 in all) become 7.125 MB/s each under fair sharing (28.5), and the
tree planned for half the buffer finishes long after the others. So the plan
gives shares in proportion to the fair rates (every tree then finishes together) and keeps the
subset of trees whose fair rates sum highest (:func:`fair_subset`).

The fair rates are a feasible allocation of the trees, so their sum is at most the LP optimum
over the same trees. The plan's certificate stays the LP packing's: its bound is checked
against the packing's total (``planner["packed_Bps"]``), not against the fair sum.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from ..params import PLANNER, PlannerParams
from ..topology import Topology
from .certificate import plural
from .model import TreeRate

__all__ = ["Usage", "usage_of", "tree_usage", "fair_rates", "progressive_filling",
           "fair_subset", "share_fairly",
           "sharing_note", "SATURATED_RTOL", "fewest_trees"]

#: A resource whose load is within this fraction of its capacity counts as saturated (the
#: step that fills it leaves a few ulps of rounding).
SATURATED_RTOL = 1e-9


def _parents(tree: Any) -> Tuple[Sequence[int], Sequence[int]]:
    """``(reduce_parent, bcast_parent)`` of a Tree, a TreeRate or a ``(root, A, B, ...)``."""
    if hasattr(tree, "reduce_parent"):
        return tree.reduce_parent, tree.bcast_parent
    return tree[1], tree[2]


@dataclass(frozen=True)
class Usage:
    """``U = arcs @ route``, kept as its two factors: ``arcs[t, a]`` counts tree ``t``'s flows
    over distinct arc ``a``, ``route[a, l]`` is 1 where arc ``a``'s route crosses resource
    ``l``. The product is never formed where it need not be: a hierarchical plan at 4096 ranks
    has 2048 trees that each cross some 9000 resources (mostly their hosts' local links), and
    forming it took longer than all of progressive filling."""

    arcs: sp.csr_matrix
    route: sp.csr_matrix

    def rows(self, keep: np.ndarray) -> "Usage":
        """The usage of trees ``keep`` only."""
        return Usage(self.arcs[keep], self.route)

    def load(self, x: np.ndarray) -> np.ndarray:
        """``U.T @ x``: each resource's load when tree ``t`` runs at ``x[t]``."""
        return self.route.T @ (self.arcs.T @ x)

    def crossing(self, resources: np.ndarray) -> np.ndarray:
        """``U @ resources`` (a 0/1 vector): each tree's flows over those resources."""
        return self.arcs @ (self.route @ resources)

    def matrix(self) -> sp.csr_matrix:
        """``U`` itself."""
        return (self.arcs @ self.route).tocsr()


def usage_of(topology: Topology, trees: Sequence[Any]) -> Usage:
    """:class:`Usage` of ``trees`` on ``topology`` (see :func:`tree_usage`)."""
    n, width, k = topology.n, len(topology.capacity_Bps), len(trees)
    halves = [p for t in trees for p in _parents(t)]
    if any(len(p) != n for p in halves):
        raise ValueError(f"every tree needs two parent arrays of {n} entries")
    # fromiter reads tuples of ints about twice as fast as np.array (4096 x 4096: 0.3 s); the
    # arc keys i * n + j are built in place over whole arrays, in 32 bits where they fit
    kind = np.int32 if n * n < 2**31 else np.int64
    parent = np.fromiter(itertools.chain.from_iterable(halves), dtype=kind,
                         count=2 * k * n).reshape(k, 2, n)
    rank = np.arange(n, dtype=kind)
    keys = np.empty_like(parent)
    np.add(rank * n, parent[:, 0], out=keys[:, 0])  # reduce: child -> parent
    np.multiply(parent[:, 1], n, out=keys[:, 1])
    keys[:, 1] += rank  # broadcast: parent -> child
    real = parent >= 0
    keys = keys[real]  # in tree order
    starts = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(real.reshape(k, -1).sum(axis=1), out=starts[1:])
    # trees share most arcs (a hierarchical plan's channels share their intra-host stars), so
    # routes are looked up per distinct arc
    distinct, which = _distinct(keys, n * n)
    ptr, res = topology.arc_routes(distinct)
    arcs = sp.csr_matrix((np.ones(len(keys)), which, starts),
                         shape=(k, len(distinct)))
    return Usage(arcs, sp.csr_matrix((np.ones(len(res)), res, ptr),
                                     shape=(len(distinct), width)))


def tree_usage(topology: Topology, trees: Sequence[Any]) -> sp.csr_matrix:
    """``U[t, l]``: how many flows of tree ``t`` cross resource ``l`` of ``topology``.

    Parameters
    ----------
    topology : Topology
    trees : sequence
        Trees as :class:`~horotopo.plan.Tree`, :class:`~horotopo.packing.model.TreeRate` or
        ``(root, reduce_parent, bcast_parent, ...)`` tuples over ``topology.n`` ranks.

    Returns
    -------
    scipy.sparse.csr_matrix
        ``len(trees) x len(topology.capacity_Bps)``; reduce arcs run child -> parent,
        broadcast arcs parent -> child, and an arc between ranks of one node loads nothing.
    """
    return usage_of(topology, trees).matrix()


def _distinct(keys: np.ndarray, space: int) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for keys in ``[0, space)``: by a table over
    the key space where that is no larger than a few times the keys (at thousands of ranks,
    millions of arcs, the table is an order of magnitude faster than sorting), else by
    sorting."""
    if space > max(4 * len(keys), 1 << 22):
        distinct, which = np.unique(keys, return_inverse=True)
        return distinct, which.ravel()
    seen = np.zeros(space, dtype=bool)
    seen[keys] = True
    distinct = np.flatnonzero(seen)
    index = np.empty(space, dtype=np.int32 if len(distinct) < 2**31 else np.int64)
    index[distinct] = np.arange(len(distinct))
    return distinct, index[keys]


def fair_rates(topology: Topology, trees: Sequence[Any],
               usage: Optional[Usage] = None, cap: Optional[np.ndarray] = None) -> np.ndarray:
    """The max-min fair rates of ``trees`` running together on ``topology``.

    Progressive filling (Bertsekas and Gallager, *Data Networks*, 2nd ed., Prentice Hall
    1992, section 6.5.2, "max-min fairness"): all trees' rates rise together from zero, every
    flow of tree ``t`` taking ``r_t`` on each resource of its route; when a resource fills,
    every tree crossing it stops, and the others go on rising. The result is the unique
    allocation in which every tree has a *bottleneck*: a full resource on which no tree has a
    higher rate. This is what a network that shares each link equally among its flows gives
    trees that each move at the pace of their slowest flow.

    Parameters
    ----------
    topology : Topology
    trees : sequence
        As for :func:`tree_usage`.
    usage : Usage, optional
        :func:`usage_of` these trees, when the caller has it (``trees`` is then not read).
    cap : ndarray, optional
        The capacities of the resources ``usage`` spans (default ``topology.capacity_array``:
        every resource), where the caller has narrowed them to those the trees load.

    Returns
    -------
    ndarray
        One rate per tree, bytes/s; ``inf`` for a tree that crosses no resource (all ranks on
        one node, or ``n == 1``): the network limits it in nothing.
    """
    usage = usage_of(topology, trees) if usage is None else usage
    cap = topology.capacity_array if cap is None else cap
    k = usage.arcs.shape[0]
    free = usage.crossing(np.ones(len(cap))) == 0
    rate = progressive_filling(usage.load, usage.crossing, cap, np.ones(k), np.full(k, np.inf),
                               ~free)
    rate[free] = np.inf
    return rate


def progressive_filling(load: Callable[[np.ndarray], np.ndarray],
                        crossing: Callable[[np.ndarray], np.ndarray], cap: np.ndarray,
                        weight: np.ndarray, bound: np.ndarray,
                        active: np.ndarray) -> np.ndarray:
    """Weighted max-min fair rates by progressive filling (:func:`fair_rates`), of flows or
    trees over resources: the ``active`` ones' rates rise together, each as its ``weight``;
    one stops when a resource it loads is full or its rate reaches its ``bound``.

    ``load(x)`` gives each resource's load when flow ``f`` runs at ``x[f]`` (its coefficient
    there times its rate), ``crossing(r)`` how much of each flow crosses the resources marked
    in the 0/1 vector ``r``; ``cap`` holds the resources' capacities. Inactive flows get 0, and
    so does an active flow that loads nothing and has no finite bound.
    """
    rate = np.zeros(len(weight))
    active = active.copy()
    while active.any():  # every round stops at least one flow
        demand = load(np.where(active, weight, 0.0))
        used = load(rate)
        live = np.flatnonzero(demand > 0)
        room = (cap[live] - used[live]) / demand[live]
        with np.errstate(divide="ignore", invalid="ignore"):
            by_bound = np.where(active, (bound - rate) / weight, np.inf)
        to_link = float(room.min()) if len(live) else np.inf
        step = max(min(to_link, float(by_bound.min())), 0.0)
        if not np.isfinite(step):
            break
        rate[active] += step * weight[active]
        used = used + step * demand
        full = np.zeros(len(cap))
        full[live] = cap[live] - used[live] <= SATURATED_RTOL * cap[live]
        if to_link <= step:
            full[live[int(np.argmin(room))]] = 1.0  # the resource the step filled, rounding aside
        active &= ~(crossing(full) > 0) & ~(by_bound <= step * (1 + 1e-9))
    return rate


def _packed_rates(trees: Sequence[Any]) -> Optional[np.ndarray]:
    """The rate each tree was packed at (``rate`` of a TreeRate, ``rate_Bps`` of a Tree, the
    fourth item of a tuple), or None where some tree has none."""
    out = []
    for t in trees:
        rate = getattr(t, "rate", getattr(t, "rate_Bps", None))
        if rate is None and isinstance(t, (tuple, list)) and len(t) > 3:
            rate = t[3]
        if rate is None:
            return None
        out.append(float(rate))
    return np.asarray(out)


def _leading_trees(trees: Sequence[Any], rates_of: Any
                   ) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """``(fair rates, indices)`` of the trees packed at the highest rates, or None where the
    trees carry no packed rates or all carry one.

    Trees of equal packed rate (to rounding) form one group, as the channels of one
    host-level tree do; groups are taken highest first, 1, 2, 4... of them, while the fair
    sum of ``rates_of(indices)`` does not fall. On the probed racks with slow NICs at 1024
    ranks the LP gives one host-level tree most of the rate and over a dozen others the rest:
    together they get 109-132 MB/s of fair rates, that one alone 277. Doubling keeps the fair
    allocations to ``log2`` of the groups.
    """
    packed = _packed_rates(trees)
    if packed is None:
        return None
    order = np.argsort(-packed, kind="stable")
    ranked = packed[order]
    ends = np.append(np.flatnonzero(ranked[1:] < ranked[:-1] * (1 - SATURATED_RTOL)) + 1,
                     len(order))
    best: Optional[Tuple[np.ndarray, np.ndarray]] = None
    groups = 1
    while groups < len(ends):  # every group together is the caller's own starting point
        keep = np.sort(order[:ends[groups - 1]])
        got = rates_of(keep)
        if best is not None and got.sum() < best[0].sum() * (1 - SATURATED_RTOL):
            break
        best = (got, keep)
        groups *= 2
    return best


def fewest_trees(topology: Topology, trees: Sequence[TreeRate]
                 ) -> Optional[Tuple[TreeRate, ...]]:
    """The fewest of ``trees`` that carry, at their max-min fair rates, as much as all of them
    do: the first 1, 2, 4... in order of packed rate, each at its fair rate, or None where it
    takes all of them.

    An LP packing spreads its rate over trees that each alone could carry the whole of it
    (on racks with slow NICs at 256 ranks, 8 trees of 39 MB/s where any one of them carries
    312.5 MB/s, the bound). The same rate in fewer trees pipelines each tree's share through
    its depth faster: a tree fills in ``depth`` chunk times at its own rate.
    """
    if len(trees) < 2:
        return None
    whole = fair_rates(topology, trees)
    if not np.isfinite(whole).all():
        return None
    order = np.argsort(-np.asarray([t.rate for t in trees]), kind="stable")
    count = 1
    while count < len(trees):
        keep = order[:count]
        got = fair_rates(topology, [trees[int(i)] for i in keep])
        if got.sum() >= whole.sum() * (1 - SATURATED_RTOL):
            return tuple(replace(trees[int(i)], rate=float(x)) for i, x in zip(keep, got))
        count *= 2
    return None


def _score(usage: Usage, rates: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """How over-represented each tree is at its bottleneck: its flows there over the mean
    flows of the trees bottlenecked there too. Removing a tree with many flows on a full
    resource frees room for several trees' worth of others' flows."""
    full = usage.load(np.where(np.isfinite(rates), rates, 0.0)) >= cap * (1 - 1e-6)
    sub = (usage.arcs @ usage.route[:, full]).toarray()
    # a tree's bottleneck: the full resource where its rate is the highest there (it is
    # where progressive filling stopped it); among several, the one where it has most flows
    on = sub > 0
    top = np.where(on, rates[:, None], -np.inf).max(axis=0)
    mine = on & (rates[:, None] >= top[None, :] * (1 - 1e-9))
    flows = np.where(mine, sub, 0.0)
    mean = flows.sum(axis=0) / np.maximum(mine.sum(axis=0), 1)
    return np.where(mine, flows / np.where(mean > 0, mean, 1.0), 0.0).max(axis=1)


def fair_subset(topology: Topology, trees: Sequence[Any], ceiling: float = np.inf,
                params: PlannerParams = PLANNER
                ) -> Tuple[np.ndarray, np.ndarray, Dict[str, Any]]:
    """The subset of ``trees`` whose max-min fair rates (:func:`fair_rates`) sum highest.

    A tree that crosses a full resource with many flows takes several trees' worth of its
    capacity: removing it can raise the others by more than it carried. Up to
    ``params.exhaustive_max`` trees every non-empty subset is tried; beyond, trees are removed
    one at a time, each round the removal that raises the fair sum most (of every tree up to
    ``params.greedy_all_max`` trees, else, for at most ``params.greedy_rounds`` rounds, of the
    ``params.candidates`` trees most over-represented at their bottleneck), while the sum
    rises (:class:`~horotopo.params.PlannerParams`). Among the subsets of the exhaustive
    search, those within ``params.tree_tie`` of the best sum tie, and the fewest trees win:
    each tree costs its own pipeline fill and messages, and a
    fair sum within the model's error is no gain (two trees predicted a fraction of a percent
    ahead of one can run slower than it).

    Beside the removals, the trees the LP gives the most are weighed as a set of their own
    (:func:`_leading_trees`): many small trees of an LP mix can each take an equal share of
    the links its leading tree needs, and removing them one at a time never gets back to it.

    Parameters
    ----------
    topology : Topology
    trees : sequence
        As for :func:`tree_usage`.
    ceiling : float
        The search stops once the fair sum reaches it: the LP's rate of these trees, which no
        subset exceeds where an LP re-solved their rates (the deep forest). A hierarchical
        plan's symmetric trees usually reach it at once, so the search costs nothing at scale.

    Returns
    -------
    keep : ndarray of int
        Indices of the kept trees, increasing.
    rates : ndarray
        Their fair rates (``inf`` when the trees cross no resource; then all are kept).
    record : dict
        ``trees``, ``kept``, ``fair_Bps`` (the kept trees' fair sum), ``all_fair_Bps`` (every
        tree's) and ``method`` (``exhaustive`` or ``greedy``).
    """
    k = len(trees)
    if k == 0:
        raise ValueError("fair_subset needs at least one tree")
    usage = usage_of(topology, trees)
    # only the resources these trees load: a measured topology has one per ordered pair of
    # ranks (a million at 1024 ranks), and every round of filling would sweep them all
    loaded = np.unique(usage.route.indices)
    usage = Usage(usage.arcs, usage.route[:, loaded].tocsr())
    cap = topology.capacity_array[loaded]

    def rates_of(keep: np.ndarray) -> np.ndarray:
        return fair_rates(topology, (), usage=usage if len(keep) == k else usage.rows(keep),
                          cap=cap)

    keep = np.arange(k)
    rates = rates_of(keep)
    first = float(rates.sum())
    method = "exhaustive" if k <= params.exhaustive_max else "greedy"
    if not np.isfinite(rates).all() or k == 1 or first >= ceiling * (1 - SATURATED_RTOL):
        pass  # nothing shares anything, nothing to choose, or no subset can do better
    elif k <= params.exhaustive_max:
        found = [(rates_of(np.asarray(sub)), np.asarray(sub)) for size in range(k - 1, 0, -1)
                 for sub in itertools.combinations(range(k), size)] + [(rates, keep)]
        top = max(float(got.sum()) for got, _ in found)
        # the fewest trees within the tie of the best, then the highest sum among those
        rates, keep = min((x for x in found if x[0].sum() >= top * (1 - params.tree_tie)),
                          key=lambda x: (len(x[1]), -x[0].sum()))
    else:
        small = k <= params.greedy_all_max
        # only removals that raise the sum (accepting ties here, a chain of them went to 8 of
        # sites-64's 13 trees, which ran 16 MiB in 88.3 ms simulated against 82.9), and with
        # many trees for a few rounds (a fair allocation of 2048 trees takes about 0.1 s)
        for _ in range(k if small else params.greedy_rounds):
            if len(keep) == 1:
                break
            tries = (range(len(keep)) if small else np.argsort(
                -_score(usage.rows(keep), rates, cap), kind="stable")[:params.candidates])
            subs = [np.delete(keep, i) for i in tries]
            got, sub = max(((rates_of(x), x) for x in subs), key=lambda x: x[0].sum())
            if got.sum() <= rates.sum() * (1 + SATURATED_RTOL):
                break
            keep, rates = sub, got
        lead = _leading_trees(trees, rates_of)
        if lead is not None and lead[0].sum() > rates.sum() * (1 + SATURATED_RTOL):
            rates, keep = lead
    return keep, rates, {"trees": k, "kept": int(len(keep)), "fair_Bps": float(rates.sum()),
                         "all_fair_Bps": first, "method": method}


def share_fairly(topology: Topology, trees: Sequence[TreeRate], ceiling: float = np.inf,
                 keep_rates: bool = False, params: PlannerParams = PLANNER
                 ) -> Tuple[Tuple[TreeRate, ...], Dict[str, Any]]:
    """The trees of :func:`fair_subset`, each at its fair rate, and the search's record.

    Trees that cross no resource (one node) keep their rates: the network limits them in
    nothing, so the packing's figure stands (``record["sharing"]`` says so). ``keep_rates``
    returns ``trees`` as they are with an empty record (ring's chains, which the ring plan
    runs at one common rate). ``params`` bounds the search (:func:`fair_subset`).
    """
    if keep_rates:
        return tuple(trees), {}
    keep, rates, record = fair_subset(topology, trees, ceiling, params)
    if not np.isfinite(rates).all():
        return tuple(trees), dict(record, fair_Bps=None, all_fair_Bps=None,
                                  sharing="none: the trees cross no resource")
    kept = tuple(replace(trees[int(i)], rate=float(x)) for i, x in zip(keep, rates))
    return kept, dict(record, sharing="max-min fair")


def sharing_note(planner: Dict[str, Any]) -> str:
    """What :meth:`horotopo.plan.Plan.describe` says after the throughput: how many trees fair
    sharing kept and the LP packing's total beside (empty for plans without the record)."""
    got = planner.get("sharing")
    if not got or got.get("fair_Bps") is None:
        return ""
    return (f" (max-min fair rates of {got['kept']} of {plural(got['trees'], 'tree')}; at the "
            f"LP's rates {planner['packed_Bps'] / 1e6:.3f} MB/s)")
