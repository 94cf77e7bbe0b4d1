"""Critical-path profiles of many trees at once (the plan's per-tree chunk step at scale).

A tree pair's profile is the hops of its critical reduce path and critical broadcast path,
merged; walking one tree in Python (:func:`~horotopo.packing.alphabeta.critical_profile`) looks
every arc's route up one by one. A hierarchical plan at 4096 ranks has 2048 rank-level trees
of 4096 ranks each (tens of millions of arcs), which that walk does not finish in minutes. This
module gives the same profiles, bit for bit, with array operations over a batch of trees:

- arc figures (route latency, inverse bottleneck rate) in closed form from a declared
  topology's :class:`~horotopo.topology.HostRoutes` parts, or per distinct arc otherwise;
- each rank's time to the root summed root-first, one depth level of the whole batch at a
  time, so every sum is formed in the same order as the one-tree walk (same floats);
- the slowest rank (ties to the lowest rank) and its path's hops grouped and sorted as there.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..topology import HostRoutes, Topology
from .model import hops_to_root

__all__ = ["Profile", "declared_arc", "tree_profiles", "TreeProfiler", "arc_figures_batch",
           "forest_depths", "plan_latency", "Crowding", "fill_crowding"]

#: Rank entries (trees x ranks) handled per batch: bounds the arrays at some tens of MB.
BATCH_ENTRIES = 1 << 20

#: Hops of a critical path, grouped: ``(latency_s, seconds per byte, count)``, the second the
#: inverse of the rate a first chunk gets on the hop (its bottleneck link's, or in a plan that
#: link's share, see :mod:`horotopo.packing.alphabeta`; 0 between ranks that share memory);
#: the order of the groups does not matter.
Profile = Tuple[Tuple[float, float, int], ...]


def declared_arc(topology: Topology, u: int, v: int) -> Tuple[float, float]:
    """``(latency_s, seconds per byte)`` of one message ``u -> v`` on the declared network: the
    route's latency and its bottleneck link's inverse rate (0 for ranks that share memory)."""
    rate = min((topology.capacity_Bps[r] for r in topology.route(u, v)), default=math.inf)
    return topology.latency(u, v), 1.0 / rate


def _figures_declared(topology: Topology, tails: np.ndarray, heads: np.ndarray
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """``(latency, 1 / bottleneck rate)`` of the arcs ``tails -> heads`` on HostRoutes, as
    :func:`~horotopo.packing.alphabeta.arc_figures` computes them one by one."""
    node, attach, up, down, core_rate, leaf_lat, core_lat = topology.host_route_figures
    a, b = attach[tails], attach[heads]
    same = node[tails] == node[heads]
    latency = np.where(same, 0.0, leaf_lat[tails] + core_lat[a, b] + leaf_lat[heads])
    rate = np.where(same, math.inf, np.minimum(np.minimum(up[tails], core_rate[a, b]),
                                               down[heads]))
    return latency, 1.0 / rate


def _figures_generic(topology: Topology, tails: np.ndarray, heads: np.ndarray
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """Arc figures looked up once per distinct arc (route tables held in full), as
    :func:`declared_arc` gives them, the bottleneck rates taken over the arcs' routes at once."""
    n = topology.n
    keys, inverse = np.unique(tails * n + heads, return_inverse=True)
    ptr, res = topology.arc_routes(keys)
    rate = np.full(len(keys), math.inf)
    routed = ptr[1:] > ptr[:-1]
    if routed.any():
        rate[routed] = np.minimum.reduceat(topology.capacity_array[res], ptr[:-1][routed])
    latency = topology.arc_latencies(keys)
    return latency[inverse], (1.0 / rate)[inverse]


def arc_figures_batch(topology: Topology, tails: np.ndarray, heads: np.ndarray
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """``(latency_s, seconds per byte)`` of every arc ``tails[k] -> heads[k]`` on the declared
    network, as :func:`~horotopo.packing.alphabeta.arc_figures` gives them one by one.

    Parameters
    ----------
    topology : Topology
    tails, heads : ndarray of int
        The arcs' ends (ranks).

    Returns
    -------
    (latency, inverse rate) : ndarray, ndarray
        Route latency, and the inverse of the route's bottleneck rate (0 within a node).
    """
    tails, heads = np.asarray(tails, dtype=np.int64), np.asarray(heads, dtype=np.int64)
    if isinstance(topology.routes, HostRoutes):
        return _figures_declared(topology, tails, heads)
    return _figures_generic(topology, tails, heads)


def _arcs_by_step(topology: Topology, pairs: Sequence[Tuple[Sequence[int], Sequence[int]]]
                  ) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Every arc of the trees, a batch at a time: ``(tails, heads, half, step)``, half 0 for
    reduce arcs (child -> parent) and 1 for broadcast arcs, step as :func:`_steps`."""
    n = topology.n
    per = max(1, BATCH_ENTRIES // max(1, 2 * n))
    for lo in range(0, len(pairs), per):
        parent = np.array([p for a, b in pairs[lo:lo + per] for p in (a, b)], dtype=np.int64)
        inward = (np.arange(len(parent)) % 2 == 0)[:, None]
        has, tails, heads, flat = _half_arcs(parent, inward)
        step = _steps(_levels(flat), flat, inward, parent.shape)
        half = np.broadcast_to(~inward, parent.shape)[has].astype(np.int64)
        yield tails, heads, half, step[has]


def _half_arcs(parent: np.ndarray, inward: np.ndarray
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The arcs of a stack of parent arrays (trees x ranks; ``inward`` per row: reduce arcs
    run child -> parent, broadcast arcs parent -> child): ``(has, tails, heads, flat)``, the
    entries with a parent, their arcs' ends, and the parents as flat indices (-1 at roots)."""
    t, n = parent.shape
    has = parent >= 0
    v = np.broadcast_to(np.arange(n), parent.shape)
    p = np.maximum(parent, 0)
    tails, heads = np.where(inward, v, p)[has], np.where(inward, p, v)[has]
    flat = np.where(has, parent + (np.arange(t) * n)[:, None], -1).ravel()
    return has, tails, heads, flat


def _depths(levels: List[np.ndarray], shape: Tuple[int, int]) -> np.ndarray:
    """Every entry's hops from its root, from :func:`_levels`, in ``shape``."""
    depth = np.zeros(shape[0] * shape[1], dtype=np.int64)
    for d, at in enumerate(levels, start=1):
        depth[at] = d
    return depth.reshape(shape)


def _steps(levels: List[np.ndarray], flat_parent: np.ndarray, inward: np.ndarray,
           shape: Tuple[int, int]) -> np.ndarray:
    """The step at which each entry's arc first carries a chunk (:class:`Crowding`), in
    ``shape``: in a broadcast row (``inward`` False) its hops from the root; in a reduce row
    one more than the hops of the longest path below it (a leaf's arc is at step 1)."""
    depth = _depths(levels, shape)
    below = np.zeros(shape[0] * shape[1], dtype=np.int64)
    for at in reversed(levels):
        np.maximum.at(below, flat_parent[at], below[at] + 1)
    return np.where(inward, below.reshape(shape) + 1, depth)


def _arc_keys(n: int, tails: np.ndarray, heads: np.ndarray, half: np.ndarray,
              step: np.ndarray) -> np.ndarray:
    """One key per ``(arc, half, step)``: ``((tail * n + head) * 2 + half) * n + step``."""
    return ((tails * n + heads) * 2 + half) * n + step


def _handled_keys(n: int, heads: np.ndarray, half: np.ndarray, step: np.ndarray) -> np.ndarray:
    """One key per ``(receiving rank, half, step)``: ``(head * 2 + half) * n + step``."""
    return (heads * 2 + half) * n + step


class Crowding:
    """How fast a plan's first chunks cross each arc, the links and the receiving ranks' CPUs
    shared among the chunks that reach them together.

    A plan's trees start together, and a chunk's first crossing of a link is shared with the
    flows that reach that link at the same moment. Chunks that cross at the same *step* move
    in step: the channels of one host tree (a host forest's or a hierarchical plan's 8
    rank-level copies of each host tree) cross every NIC together, so each first chunk gets
    an eighth of it (priced at the links' full rates, such a plan is predicted several times
    faster than it runs). Trees of different shapes reach a link at different steps and
    mostly do not crowd it (charged at the trees' steady rates, as if every flow were always
    there, they would be predicted far slower than they run). A broadcast arc's step is its
    child's hops from the root (the chunk leaves the root and goes down a hop a step); a
    reduce arc's is one more than the hops of the longest path below its child, since a rank
    sends up once its slowest child's chunk is in: every leaf sends at the first step, and a
    reduce arc at a given depth of a deep tree crosses long after those at that depth of a
    shallow one (counted by depth, the host forests of 128 trees at 1024 ranks were
    predicted far slower than they run: docs/results/predict_check_scale.md). A flow of a
    reduce (half 0) or broadcast (half 1) arc at ``step`` crowds the others of that half and
    step on every resource of its route; an arc's *shared rate* is the least over its route
    of the resource's capacity over its crowd.

    The receiving rank handles every chunk that reaches it at one step, one after another:
    its CPU is crowded by them as a link is (:attr:`handled`, the chunks per receiving rank,
    half and step), which :class:`TreeProfiler` charges at the software costs' handling rate.
    """

    def __init__(self, n: int, keys: np.ndarray, shared: np.ndarray,
                 handled_keys: Optional[np.ndarray] = None,
                 handled: Optional[np.ndarray] = None):
        self.n, self.keys, self.shared = n, keys, shared
        self.handled_keys = np.zeros(0, np.int64) if handled_keys is None else handled_keys
        self.handled = np.zeros(0) if handled is None else handled

    def inverse_rates(self, tails: np.ndarray, heads: np.ndarray, half: np.ndarray,
                      step: np.ndarray, inv: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """Seconds per byte of a first chunk on each arc of a tree at ``rate``: its shared
        rate, at least ``rate`` and at most the bottleneck's ``1 / inv`` (``inv`` 0: within
        a node, unchanged)."""
        keys = _arc_keys(self.n, tails, heads, half.astype(np.int64), step)
        crossing = inv > 0
        at = _positions(self.keys, keys, crossing)
        shared = np.where(crossing, self.shared[at] if len(self.keys) else np.inf, np.inf)
        with np.errstate(divide="ignore"):
            slow = 1.0 / np.maximum(shared, np.where(np.isfinite(rate), rate, 0.0))
        return np.where(crossing, np.maximum(inv, slow), inv)

    def handled_at(self, heads: np.ndarray, half: np.ndarray, step: np.ndarray) -> np.ndarray:
        """The first chunks that the rank ``heads[k]`` receives at ``step[k]`` of ``half[k]``
        (at least 1: the arc's own)."""
        keys = _handled_keys(self.n, heads, half.astype(np.int64), step)
        return self.handled[_positions(self.handled_keys, keys, np.ones(len(keys), bool))]


def _positions(known: np.ndarray, keys: np.ndarray, needed: np.ndarray) -> np.ndarray:
    """Where each of ``keys`` is in the sorted ``known`` (:class:`Crowding`'s tables); a key
    that ``needed`` marks and ``known`` lacks is a tree the crowding never counted."""
    # looked up once per distinct key, in order: channels repeat most keys, and sorted
    # queries run about 10x faster than scattered ones at 4096 ranks (a million per batch)
    distinct, which = np.unique(keys, return_inverse=True)
    at = np.minimum(np.searchsorted(known, distinct), max(0, len(known) - 1))[which.ravel()]
    if needed.any() and (not len(known) or not np.array_equal(known[at[needed]], keys[needed])):
        raise ValueError("fill_crowding must count every tree of the plan")
    return at


def fill_crowding(topology: Topology, pairs: Sequence[Tuple[Sequence[int], Sequence[int]]]
                  ) -> Crowding:
    """:class:`Crowding` of every ``(reduce_parent, bcast_parent)`` of a plan: the flows
    counted per resource, half and step, then each distinct arc's shared rate; and the
    chunks each rank receives per half and step."""
    n = topology.n
    # the distinct (arc, half, step) and their flows: channels and rotations repeat most
    found, flows_found = [], []
    for arcs in _arcs_by_step(topology, pairs):
        keys, flows = np.unique(_arc_keys(n, *arcs), return_counts=True)
        found.append(keys)
        flows_found.append(flows)
    if not found:
        return Crowding(n, np.zeros(0, np.int64), np.zeros(0))
    keys, which = np.unique(np.concatenate(found), return_inverse=True)
    flows = np.bincount(which.ravel(), weights=np.concatenate(flows_found),
                        minlength=len(keys))
    step, rest = keys % n, keys // n
    half, arcs = rest % 2, rest // 2
    # the receiving rank's chunks per (rank, half, step)
    handled_keys, at = np.unique(_handled_keys(n, arcs % n, half, step), return_inverse=True)
    handled = np.bincount(at.ravel(), weights=flows, minlength=len(handled_keys))
    # each arc's route once (an arc recurs at several steps and in both halves)
    distinct, arc_of = np.unique(arcs, return_inverse=True)
    arc_of = arc_of.ravel()
    arc_ptr, arc_res = topology.arc_routes(distinct)
    lengths = np.diff(arc_ptr)[arc_of]
    ptr = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    owner = np.repeat(np.arange(len(keys)), lengths)
    res = arc_res[arc_ptr[arc_of[owner]] + np.arange(len(owner)) - ptr[owner]]
    # the crowd of each (resource, half, step): every flow that crosses it there
    crowd_keys, at = np.unique((res * 2 + half[owner]) * n + step[owner], return_inverse=True)
    crowd = np.bincount(at.ravel(), weights=flows[owner], minlength=len(crowd_keys))
    rates = topology.capacity_array[res] / crowd[at.ravel()]
    crossing = lengths > 0
    if not crossing.any():
        return Crowding(n, np.zeros(0, np.int64), np.zeros(0), handled_keys, handled)
    return Crowding(n, keys[crossing], np.minimum.reduceat(rates, ptr[:-1][crossing]),
                    handled_keys, handled)


def _levels(parent: np.ndarray) -> List[np.ndarray]:
    """The entries of a flat forest (``parent`` flat indices, -1 at roots) level by level
    below the roots, breadth first; every entry comes after its parent."""
    kids = np.flatnonzero(parent >= 0)
    kids = kids[np.argsort(parent[kids], kind="stable")]
    count = np.bincount(parent[kids], minlength=len(parent))
    first = np.cumsum(count) - count
    levels: List[np.ndarray] = []
    seen = 0
    frontier = np.flatnonzero(parent < 0)
    while True:
        k = count[frontier]
        frontier = frontier[k > 0]
        if not len(frontier):
            return levels
        k = k[k > 0]
        # the children of every frontier entry: kids[first[f] : first[f] + count[f]]
        offsets = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
        frontier = kids[np.repeat(first[frontier], k) + offsets]
        levels.append(frontier)
        seen += len(frontier)
        if seen > len(parent):
            raise ValueError("parent arrays with a cycle have no critical path")


class _Batch:
    """A batch of ``(parent, inward, rate)`` halves with what their critical paths need at any
    chunk: each arc's latency and inverse rate (crowded where asked) and the levels of the
    forest, computed once."""

    def __init__(self, topology: Topology, halves: List[Tuple[np.ndarray, bool, float]],
                 crowding: Optional[Crowding] = None):
        n = topology.n
        self.n, self.t = n, len(halves)
        parent = np.stack([h[0] for h in halves])                       # (t, n)
        inward = np.array([h[1] for h in halves])[:, None]
        has, tails, heads, self.flat_parent = _half_arcs(parent, inward)
        figures = arc_figures_batch(topology, tails, heads)
        lat = np.zeros(parent.shape)
        inv = np.zeros(parent.shape)
        lat[has], inv[has] = figures
        self.levels = _levels(self.flat_parent)
        # per entry, the first chunks its receiving rank handles at that arc's step and the
        # tree's rate (0 chunks: no crowding asked, nothing charged)
        self.handled = np.zeros(parent.shape)
        self.rate = np.zeros(parent.shape)
        if crowding is not None:
            rate = np.broadcast_to(np.array([h[2] for h in halves], dtype=float)[:, None],
                                   parent.shape)[has]
            half = np.broadcast_to(~inward, parent.shape)[has]
            step = _steps(self.levels, self.flat_parent, inward, parent.shape)[has]
            inv[has] = crowding.inverse_rates(tails, heads, half, step, inv[has], rate)
            self.handled[has] = crowding.handled_at(heads, half, step)
            self.rate[has] = rate
        self.has, self.lat, self.inv = has, lat, inv

    def _crowded_inverse(self, costs: Any) -> np.ndarray:
        """Each entry's seconds per byte: its link's (crowded where asked), or where slower
        the receiving rank's handling of the other chunks that reach it at that step (the
        chunk waits for them as a flow waits for a link's others), at least at the tree's
        rate. Folded into the hop's inverse rate, so that a profile stays ``(latency,
        s_per_byte, count)``; the chunk's own handling is charged besides, as every hop's is
        (:func:`~.alphabeta.fill_time`)."""
        others = np.maximum(self.handled - 1.0, 0.0)
        if costs.per_byte_s <= 0 or not np.any(others > 0):
            return self.inv
        with np.errstate(divide="ignore"):
            cpu = 1.0 / np.maximum(1.0 / (costs.per_byte_s * others), self.rate)
        return np.maximum(self.inv, cpu)

    def groups(self, chunks: Sequence[float], costs: Any) -> List[Dict[Tuple[float, float], int]]:
        """Grouped hops of each half's critical path at its chunk in ``chunks``."""
        n, t, flat_parent = self.n, self.t, self.flat_parent
        chunk = np.asarray(chunks, dtype=float)[:, None]
        # alphabeta._hop_time, term by term in its order: latency + chunk * s_per_byte
        # + chunk * per_byte + 2 * per_message
        inv_all = self._crowded_inverse(costs)
        hop = np.where(self.has, self.lat + chunk * inv_all + chunk * costs.per_byte_s
                       + 2 * costs.per_message_s, 0.0).ravel()
        total = np.zeros(t * n)
        # root first, a level at a time: total[w] = total[parent[w]] + hop[w] as in the walk
        for at in self.levels:
            total[at] = total[flat_parent[at]] + hop[at]
        worst = np.argmax(total.reshape(t, n), axis=1) + np.arange(t) * n  # first max: lowest v
        # walk every slowest rank up to its root, all trees at once, collecting its hops
        lat, inv = self.lat.ravel(), inv_all.ravel()
        steps: List[np.ndarray] = []
        cur = worst
        # a rank reaches its root in fewer than n steps, or its parents go round a cycle
        for _ in range(n + 1):
            cur = cur[flat_parent[cur] >= 0]
            if not len(cur):
                break
            steps.append(cur)
            cur = flat_parent[cur]
        else:
            raise ValueError("a tree's parent array has a cycle: some ranks never reach its "
                             "root")
        groups: List[Dict[Tuple[float, float], int]] = [{} for _ in range(t)]
        if not steps:
            return groups
        at = np.concatenate(steps)
        tree, a, b = at // n, lat[at], inv[at]
        order = np.lexsort((b, a, tree))
        tree, a, b = tree[order], a[order], b[order]
        new = np.r_[True, (tree[1:] != tree[:-1]) | (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
        starts = np.flatnonzero(new)
        counts = np.diff(np.r_[starts, len(tree)])
        for k, x, y, c in zip(tree[starts].tolist(), a[starts].tolist(), b[starts].tolist(),
                              counts.tolist()):
            groups[k][(x, y)] = c
        return groups


class TreeProfiler:
    """The profiles (hops of the critical reduce and broadcast paths, merged) of a fixed set of
    ``(reduce_parent, bcast_parent)`` pairs, at whatever chunks: the arcs' figures, crowding
    and levels are computed once, the critical paths at each call (the plan's chunk choice
    asks for two or three sets of chunks). Arguments as :func:`tree_profiles`."""

    def __init__(self, topology: Topology, pairs: Sequence[Tuple[Sequence[int], Sequence[int]]],
                 costs: Any, rates: Optional[Sequence[float]] = None,
                 crowding: Optional[Crowding] = None):
        if (rates is None) != (crowding is None):
            raise ValueError("tree_profiles: rates and crowding go together")
        rates = [math.inf] * len(pairs) if rates is None else rates
        self.costs, self.count = costs, len(pairs)
        self.per = max(1, BATCH_ENTRIES // max(1, 2 * topology.n))
        self.batches = [
            _Batch(topology, [(np.asarray(parent, dtype=np.int64), inward, float(x))
                              for (a, b), x in zip(pairs[lo:lo + self.per],
                                                   rates[lo:lo + self.per])
                              for parent, inward in ((a, True), (b, False))], crowding)
            for lo in range(0, len(pairs), self.per)]

    def at(self, chunks: Sequence[float]) -> List[Profile]:
        """Each pair's profile at its chunk in ``chunks`` (bytes)."""
        if len(chunks) != self.count:
            raise ValueError(f"tree_profiles: {self.count} pairs, {len(chunks)} chunks")
        out: List[Profile] = []
        for k, batch in enumerate(self.batches):
            mine = chunks[k * self.per:(k + 1) * self.per]
            groups = batch.groups([float(c) for c in mine for _ in (0, 1)], self.costs)
            for up, down in zip(groups[0::2], groups[1::2]):
                for key, count in down.items():
                    up[key] = up.get(key, 0) + count
                out.append(tuple((lat, inv, count) for (lat, inv), count in sorted(up.items())))
        return out


def tree_profiles(topology: Topology, pairs: Sequence[Tuple[Sequence[int], Sequence[int]]],
                  chunks: Sequence[float], costs: Any, rates: Optional[Sequence[float]] = None,
                  crowding: Optional["Crowding"] = None) -> List[Profile]:
    """The profile (hops of the critical reduce and broadcast paths, merged) of every
    ``(reduce_parent, bcast_parent)`` in ``pairs`` at its chunk in ``chunks``, on the declared
    network.

    Parameters
    ----------
    topology : Topology
        The network whose routes give each arc's latency and bottleneck rate.
    pairs : sequence of (reduce_parent, bcast_parent)
        Parent arrays over the topology's ranks (``-1`` at the root).
    chunks : sequence of float
        Chunk size of each pair, in bytes (it decides which path is the slowest).
    costs : SoftwareCosts
        The engine's software costs (``per_byte_s``, ``per_message_s``).
    rates, crowding : optional
        Each pair's rate, and :func:`fill_crowding` of every tree of the plan: a hop is then
        charged at its links' rates shared among the flows that cross them at the same step,
        or where slower at the rate its receiving rank handles the other chunks that reach it
        at that step (:class:`Crowding`), at least at the tree's rate.
        Without them a hop is charged at its bottleneck link's rate, as a tree alone on the
        network sees it.

    Returns
    -------
    list of Profile
        Per pair, its critical reduce and broadcast paths' hops ``(latency_s, s_per_byte,
        count)`` merged and sorted; without ``crowding``, identical to what the one-tree walk
        returns.
    """
    return TreeProfiler(topology, pairs, costs, rates, crowding).at(chunks)


def forest_depths(trees: Sequence[Tuple[int, Sequence[int], Sequence[int]]], n: int
                  ) -> Optional[List[Tuple[int, int]]]:
    """Depths ``(reduce, broadcast)`` of every ``(root, reduce_parent, bcast_parent)``, or None
    when some parent array is not an arborescence of ``n`` ranks at its root.

    A batch of trees at a time is checked as one forest (thousands of trees of thousands of
    ranks at scale): pointer doubling finds every rank's hops to its root, or a cycle.
    """
    per = max(1, BATCH_ENTRIES // max(1, 2 * n))
    out: List[Tuple[int, int]] = []
    for lo in range(0, len(trees), per):
        batch = trees[lo:lo + per]
        if any(len(a) != n or len(b) != n or not 0 <= r < n for r, a, b in batch):
            return None
        parent = np.array([p for _, a, b in batch for p in (a, b)], dtype=np.int64)
        roots = np.repeat([r for r, _, _ in batch], 2)
        v = np.arange(n)[None, :]
        is_root = v == roots[:, None]
        if not np.all(np.where(is_root, parent == -1, (parent >= 0) & (parent < n)
                               & (parent != v))):
            return None
        offset = (np.arange(len(parent)) * n)[:, None]
        hops = hops_to_root(np.where(parent >= 0, parent + offset, -1).ravel())
        if hops is None:
            return None
        deepest = hops.reshape(len(parent), n).max(axis=1)
        out += [(int(up), int(down)) for up, down in zip(deepest[0::2], deepest[1::2])]
    return out


def plan_latency(topology: Topology, trees: Sequence[Any]) -> float:
    """The slowest arc's latency over every tree (anything with ``reduce_parent`` and
    ``bcast_parent``), a batch of trees at a time (a hierarchical plan at 4096 ranks has tens
    of millions of arcs)."""
    n = topology.n
    if not trees or n == 1:
        return 0.0
    worst = 0.0
    per = max(1, BATCH_ENTRIES // n)
    for lo in range(0, len(trees), per):
        up = np.array([t.reduce_parent for t in trees[lo:lo + per]]).ravel()
        down = np.array([t.bcast_parent for t in trees[lo:lo + per]]).ravel()
        v = np.tile(np.arange(n), len(up) // n)
        lat, _ = arc_figures_batch(topology, np.r_[v[up >= 0], down[down >= 0]],
                                   np.r_[up[up >= 0], v[down >= 0]])
        worst = max(worst, float(lat.max(initial=0.0)))
    return worst
