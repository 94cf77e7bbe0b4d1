"""A shallow forest over hosts: rotated binary trees, one crossing of each slow-latency cut.

The flat packing (:mod:`horotopo.packing.gk`) sees a job of
multi-GPU hosts as ``n`` ranks. On the two-site generator at 64 ranks their trees are 8 to 75
hops deep and some cross the 5 ms WAN link 3 or 4 times on one root path, so a chunk's first
trip costs several WAN latencies before the pipeline is full (``horotopo simulate
sites:gpus=8,wan_gbps=10 --ranks 64`` shows the flat plan far from the optimum).

This forest is built, not packed. The machines (:func:`~.hierarchy.machines`) are split into
*groups* of machines close to each other: routes within a group have at most
``group_latency_factor`` (:class:`~horotopo.params.PlannerParams`) times the smallest route
latency between two machines, both counted beyond the latency between two ranks of one
machine (a site across a WAN, a rack behind its uplink), and groups close to each other form
groups of the next level (the racks of one site). Tree ``t`` has machine ``t`` as root; in
every finest group the machines, in the network's depth-first order rotated by ``t``, form a binary heap, and at
each level the heads of the groups (the machine where the tree enters each) form a binary heap
too, from the group the tree enters the level by: a reduce tree crosses the WAN once and has
one arc per rack it enters (a single level of rack groups would cross the WAN twice), about
``log2`` of the machines hops deep. The
broadcast tree is the same tree reversed. Rotating
the roles over the ``H`` trees gives every machine each position once per group size, so the
NICs carry equal loads, the condition for the hierarchical optimum ``H c / (2 (H - 1))`` when
the NICs are the bottleneck. Each host-level tree runs in ``K`` channels with the intra-host
chain (:meth:`~.hierarchy.HostModel.expand`), at one common rate: the most the network allows.

A forest of all ``H`` rotations expands to ``H K`` rank-level trees: 4096 trees of 4096 ranks
at 512 hosts of 8, each with a 16 KiB share of 64 MiB, too many trees to run or even
simulate. So a forest keeps a subset of the rotations (:func:`pick_rotations`): chosen one by one,
each the rotation that most raises the common rate of those kept (the real loads, NICs,
uplinks and WAN alike), then improved by swaps, which spreads the roots and the heads over the
groups (rotations evenly spread, ``t = i H / m``, share their heads' positions in every group
and reach about half of every rotation's rate). A rotation by
half a group swaps a heap's interior and leaf roles (NCCL's double binary tree), so a few trees
balance well; whatever imbalance is left shows in the rate, which is computed from the kept
trees' loads. :func:`~.forests.choose_forest` predicts each count of ``host_tree_counts`` (at
most ``max_host_trees``, which bounds the planning time at thousands of ranks).
Fewer than ``H / 2`` trees at one rate cannot reach the NICs' bound (they miss it by
``1 / H``); the prediction weighs that against their shorter fill.

It certifies nothing; :func:`~.forests.choose_forest` offers it beside the others and keeps
it where it is predicted fastest.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from ..params import PLANNER, PlannerParams
from ..topology import Topology
from .hierarchy import HostModel, lone_ranks_at_scale, machines
from .model import Packing, TreeRate

__all__ = ["host_groups", "host_trees", "pick_rotations", "pack_host_forest",
           "pack_host_forests", "host_tree_counts", "has_hosts"]

#: A group of machines (:func:`host_groups`): its machines, or its subgroups (nested).
Group = Union[List[int], List["Group"]]


def has_hosts(topology: Topology, params: PlannerParams = PLANNER) -> bool:
    """Whether ``topology`` has at least two machines and one with several ranks on one host
    name or on a local fabric ``params.host_fabric_factor`` times faster than its way out (the
    case this forest is for), or racks of single-rank hosts that :func:`machines` plans as
    machines past ``params.hierarchy_auto_min_ranks`` ranks (the forest's trees cross each
    rack's uplink once, a few racks deep, where the certified packing's run hundreds of ranks
    deep)."""
    of = machines(topology, params)
    if not 2 <= len(set(of)) < topology.n:
        return False
    if lone_ranks_at_scale(topology, params):
        return True
    cap = topology.capacity_Bps
    slowest = lambda i, j: min((cap[r] for r in topology.route(i, j)), default=np.inf)
    first: dict = {}
    for i, m in enumerate(of):
        j = first.setdefault(m, i)
        if j == i:
            continue
        if topology.hosts[i] == topology.hosts[j]:
            return True
        out = next(k for k in range(topology.n) if of[k] != m)
        return slowest(i, j) >= params.host_fabric_factor * slowest(j, out)
    return False


def _own_latency(model: HostModel, between: float) -> float:
    """The smallest latency between two ranks of one machine, what every route pays before it
    leaves a machine; 0 where no machine has two ranks or that latency is not below
    ``between``, the smallest between two machines (no floor shared by the routes out)."""
    topo = model.topology
    own = min((topo.latency(int(m[0]), int(m[1])) for m in model.members if len(m) > 1),
              default=0.0)
    return own if own < between else 0.0


def host_groups(model: HostModel, params: PlannerParams = PLANNER) -> List[Group]:
    """Machines grouped by route latency (``params.group_latency_factor``), level by level.

    Latencies count beyond the latency between two ranks of one machine
    (:func:`_own_latency`). The finest groups are the machines whose routes are within the
    factor of the smallest latency between two machines (a rack); groups whose routes to each
    other are within the factor of the smallest latency between two groups form the next
    level (the racks of a site), and so on until one group would hold all. A group of one
    level is the list of its subgroups, a finest group the list of its machines; a group with
    one subgroup is that subgroup. Members are in the network's depth-first order
    (:meth:`HostModel.ring_order`). On a network of one level (racks behind one core, sites
    of one rack each) this is a list of lists of machines.
    """
    h_count = model.n
    d = model.designated[0]
    lat = np.array([[model.topology.latency(int(d[a]), int(d[b])) if a != b else np.inf
                     for b in range(h_count)] for a in range(h_count)])
    # A probe's latencies carry every message's software cost, the same on every route, which
    # shrinks their ratios toward 1 (on the probed 1024-rank racks 23 us within a rack and 27
    # across, where the declared routes take 6 and 10: one group). Beyond the latency between
    # two ranks of one machine both read 4 against 8 us.
    lat = lat - _own_latency(model, float(lat.min()))
    labels = []  # one partition per level, finest first; the last has two or more groups
    label = np.arange(h_count)
    while h_count > 1:
        between = lat[label[:, None] != label[None, :]]
        if between.size == 0:
            break
        close = lat <= params.group_latency_factor * float(between.min())
        count, label = connected_components(sp.csr_matrix(close), directed=False)
        if count == 1:
            break
        labels.append(label)
    if not labels:
        return [list(model.ring_order())]
    pos = {h: i for i, h in enumerate(model.ring_order())}

    def split(members: List[int], level: int) -> Group:
        """``members`` (in depth-first order) split by the partition of ``level`` and
        below; a group with one subgroup is that subgroup."""
        if level < 0:
            return members
        parts: dict = {}
        for h in members:
            parts.setdefault(int(labels[level][h]), []).append(h)
        if len(parts) == 1:
            return split(members, level - 1)
        return [split(p, level - 1) for p in parts.values()]

    return split(sorted(range(h_count), key=pos.__getitem__), len(labels) - 1)


def _flat(group: Group) -> List[int]:
    """The machines of a (nested) group, in order."""
    return [h for g in group for h in ([g] if isinstance(g, (int, np.integer)) else _flat(g))]


def _is_finest(group: Group) -> bool:
    """Whether ``group`` holds machines (a finest group) rather than subgroups."""
    return all(isinstance(g, (int, np.integer)) for g in group)


def host_trees(groups: Sequence[Group], h_count: int, arity: int = PLANNER.host_tree_arity
               ) -> List[Tuple[int, Tuple[int, ...]]]:
    """``(root, parent)`` of the ``h_count`` rotated trees over machines (module docstring).

    ``groups`` is :func:`host_groups`' nesting: tree ``t`` is rooted at machine ``t``; at
    each level, every group but the one of the head (the machine where the tree enters the
    level's parent group: machine ``t`` at the top) takes its machine at position ``t`` mod
    its size as its own head, and the heads, in the groups' order rotated to start at the
    head's group, form an ``arity``-ary heap (with two or three groups: the others' heads
    hang from the head); a finest group is an ``arity``-ary heap of its machines rotated to
    start at its head. A tree so crosses the boundary of every group it enters once each
    way, and the rotation gives the machines of a group each head position equally often.
    """
    if arity < 1:
        raise ValueError(f"arity must be at least 1, got {arity}")
    flat = _flat(groups)
    if sorted(flat) != list(range(h_count)) or len(flat) != h_count:
        raise ValueError("groups must hold every machine 0..H-1 exactly once")

    def grow(group: Group, head: int, t: int, parent: List[int]) -> None:
        if _is_finest(group):
            s = list(group).index(head)
            rot = list(group[s:]) + list(group[:s])
            for i in range(1, len(rot)):
                parent[rot[i]] = rot[(i - 1) // arity]
            return
        subs = list(group)
        inside = [_flat([sub]) for sub in subs]
        first = next(i for i, m in enumerate(inside) if head in m)
        heads: List[int] = []
        # the groups' heads form an arity-ary heap too, from the head's group on: a star of
        # them under the head gave the root one child per group (65 on fattree at 4096
        # ranks), a load that only every rotation together evens out
        for k, i in enumerate(list(range(first, len(subs))) + list(range(first))):
            own = head if k == 0 else inside[i][t % len(inside[i])]
            if k:
                parent[own] = heads[(k - 1) // arity]
            heads.append(own)
            grow(subs[i], own, t, parent)

    out = []
    for t in range(h_count):
        parent = [-1] * h_count
        grow(list(groups), t, t, parent)
        out.append((t, tuple(parent)))
    return out


def _score(util: np.ndarray) -> Tuple[float, float]:
    """How well rotations with summed utilisations ``util`` (rows: alternatives) balance:
    the highest utilisation (the common rate is its inverse), then the sum of squares (the
    loads spread further), lower being better."""
    return util.max(axis=-1), (util ** 2).sum(axis=-1)


def _best(total: np.ndarray, util: np.ndarray, free: np.ndarray, crowd: np.ndarray
          ) -> Tuple[int, float, float]:
    """The free rotation whose utilisations added to ``total`` score best (:func:`_score`),
    among equals (to rounding) the one whose root's group is least ``crowd``-ed with roots,
    then the lowest; and its score."""
    worst, spread = _score(total[None, :] + util)
    worst = np.where(free, worst, np.inf)
    tied = free & (worst <= worst.min() * (1 + 1e-9))
    spread = np.where(tied, spread, np.inf)
    tied &= spread <= spread.min() * (1 + 1e-9)
    t = int(np.argmin(np.where(tied, crowd, np.inf)))  # argmin: the lowest among equals
    return t, float(worst[t]), float(spread[t])


def pick_rotations(loads: np.ndarray, capacity: np.ndarray, count: int,
                   max_passes: int = PLANNER.rotation_passes,
                   root_group: Optional[Sequence[int]] = None
                   ) -> List[int]:
    """``count`` rotations whose trees together balance the loads best.

    Kept one by one, each the rotation that most raises the common rate of those kept so far
    (greedy); then each kept one is swapped for the free rotation that improves the whole
    set most, while any does (at most ``max_passes`` passes over the set): the greedy
    alone, blind to what later trees can make up, left 4 trees on 32 fattree hosts at 0.78
    of every rotation's rate. Among rotations that score the same, the one whose root's
    group (``root_group``) holds the fewest kept roots per machine is kept: the flat loads
    do not see which side of a WAN the roots are on, and with every root in one site each
    WAN direction carries only reduces or only broadcasts, one after the other.

    Parameters
    ----------
    loads : ndarray (H, R)
        Row ``t``: rotation ``t``'s load at unit rate on every resource.
    capacity : ndarray (R,)
        The resources' capacities.
    count : int
        How many rotations to keep (1..H).
    max_passes : int
        Passes of swaps at most (each tries every kept rotation once).
    root_group : sequence of int, optional
        Group of each rotation's root (rotation ``t`` is rooted at machine ``t``); default
        one group.

    Returns
    -------
    list of int
        ``count`` distinct rotations, ascending. The score of a set is the highest
        utilisation (the common rate of its trees is the inverse), then the sum of squared
        utilisations; ties go to the lower rotation.
    """
    loads = np.asarray(loads, dtype=float)
    h_count = loads.shape[0]
    if not 1 <= count <= h_count:
        raise ValueError(f"count must lie in 1..{h_count}, got {count}")
    used = loads.any(axis=0)
    if not used.any():
        raise ValueError("rotations that load no resource have no rate to balance")
    util = loads[:, used] / np.asarray(capacity, dtype=float)[used]
    label = np.zeros(h_count, dtype=np.int64) if root_group is None \
        else np.asarray(root_group, dtype=np.int64)
    if label.shape != (h_count,):
        raise ValueError(f"root_group must give one group per rotation ({h_count})")
    size = np.bincount(label).astype(float)
    crowd = lambda kept: (np.bincount(label[kept], minlength=len(size)) / size)[label]
    free = np.ones(h_count, dtype=bool)
    total = np.zeros(util.shape[1])
    kept: List[int] = []
    for _ in range(count):
        t, _, _ = _best(total, util, free, crowd(kept))
        kept.append(t)
        free[t] = False
        total = total + util[t]
    score = tuple(float(x) for x in _score(total))
    for _ in range(max_passes if count < h_count else 0):
        changed = False
        for i, old in enumerate(kept):
            without = total - util[old]
            t, worst, spread = _best(without, util, free, crowd(kept[:i] + kept[i + 1:]))
            # strictly better by more than rounding: a swap back and forth never repeats
            if (worst < score[0] * (1 - 1e-9)
                    or (worst <= score[0] * (1 + 1e-9) and spread < score[1] * (1 - 1e-9))):
                free[old], free[t] = True, False
                kept[i], total, score, changed = t, without + util[t], (worst, spread), True
        if not changed:
            break
    return sorted(kept)


def host_tree_counts(h_count: int, counts: Optional[Sequence[int]] = None,
                     limit: Optional[int] = None, params: PlannerParams = PLANNER) -> List[int]:
    """The host-tree counts to offer on ``h_count`` machines: ``counts`` (default
    ``params.host_tree_counts``) at most ``H`` and ``limit`` (default
    ``params.max_host_trees``), ``min(H, limit)`` itself where that is below the largest
    count, and every rotation (``H``) where ``H`` is at most ``limit``, distinct and
    ascending.

    Every rotation roots a host tree at each machine once, which balances the machines' loads
    exactly; a subset of the rotations balances them only as well as :func:`pick_rotations`
    finds, and in the simulator 32 of 128 machines' rotations ran many times slower than
    predicted (docs/results/scale_sim.md keeps the rows that every rotation runs)."""
    if h_count < 1:
        raise ValueError(f"a host forest needs machines, got {h_count}")
    counts = params.host_tree_counts if counts is None else counts
    limit = params.max_host_trees if limit is None else int(limit)
    if limit < 1:
        raise ValueError(f"at most {limit} host trees: need at least 1")
    top = min(h_count, limit)
    # every rotation where the limit allows them all, else the limit where no count reaches it
    every = h_count <= limit or top < max(counts)
    return sorted({c for c in counts if 1 <= c <= top} | ({top} if every else set()))


def pack_host_forests(topology: Topology, counts: Sequence[int], arity: Optional[int] = None,
                      model: Optional[HostModel] = None,
                      params: PlannerParams = PLANNER) -> List[Packing]:
    """The rotated host forest of ``topology`` with each of ``counts`` host-level trees
    (:func:`pick_rotations`' first ones), as rank-level trees at one common rate: the most
    every resource allows for those trees' loads (``upper_bound`` None).

    Parameters
    ----------
    topology : Topology
        A network whose machines hold several ranks (:func:`has_hosts`).
    counts : sequence of int
        Host-level tree counts, each in ``1..H``.
    arity : int, optional
        Children per machine in a finest group's heap (default ``params.host_tree_arity``).
    model : HostModel, optional
        ``HostModel(topology)``, where the caller has built it already.
    params : PlannerParams
        Where machines are (``host_fabric_factor``) and how they group
        (``group_latency_factor``).

    Returns
    -------
    list of Packing
        One per count, in the order given; ``extra["host_trees"]`` is the count and
        ``extra["rotations"]`` the kept rotations (their roots).

    Raises
    ------
    ValueError
        Fewer than two machines, or no machine with several ranks (:func:`has_hosts`); a
        count outside ``1..H``.
    """
    if not has_hosts(topology, params):
        raise ValueError(f"{topology.name}: a host forest needs two or more machines and one "
                         "with several ranks")
    model = HostModel(topology, params=params) if model is None else model
    counts = [int(c) for c in counts]
    if not counts or any(not 1 <= c <= model.n for c in counts):
        raise ValueError(f"host tree counts must lie in 1..{model.n}, got {counts}")
    groups = host_groups(model, params)
    every = host_trees(groups, model.n,
                       params.host_tree_arity if arity is None else arity)
    loads = np.array([model.load(r, p, p) for r, p in every], dtype=float)
    # the top level's groups (the sites across a WAN; the racks where there is one level)
    top = np.zeros(model.n, dtype=np.int64)
    for k, group in enumerate([groups] if _is_finest(groups) else groups):
        top[_flat([group])] = k
    out = []
    for count in counts:
        kept = pick_rotations(loads, model.capacity, count, params.rotation_passes,
                              root_group=top)
        # the rate from the kept trees' own loads: an unbalanced subset shows as a lower rate
        rate = float(model.max_rate(loads[kept].sum(axis=0)))
        if not np.isfinite(rate):
            raise ValueError(f"{topology.name}: a host forest that loads no resource has no "
                             "rate")
        trees = model.expand([TreeRate(r, p, p, rate) for r, p in (every[t] for t in kept)])
        total = float(sum(t.rate for t in trees))
        out.append(Packing(trees=trees, throughput=total, upper_bound=None,
                           full_throughput=total, bound_phase="",
                           extra={"host_trees": count, "rotations": kept}))
    return out


def pack_host_forest(topology: Topology, arity: Optional[int] = None,
                     count: Optional[int] = None,
                     params: PlannerParams = PLANNER) -> Packing:
    """The rotated host forest of ``topology`` with ``count`` host-level trees (default
    ``min(H, params.max_host_trees)``; see :func:`pack_host_forests`).

    Raises
    ------
    ValueError
        Fewer than two machines, or no machine with several ranks (:func:`has_hosts`); a
        count outside ``1..H``.
    """
    if count is None:
        count = min(len(set(machines(topology, params))), params.max_host_trees)
    return pack_host_forests(topology, [count], arity, params=params)[0]
