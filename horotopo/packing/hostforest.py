"""A shallow forest over hosts: rotated binary trees, one crossing of each slow-latency cut.

The flat packings (:mod:`horotopo.packing.gk`, :mod:`horotopo.packing.depth`) see a job of
multi-GPU hosts as ``n`` ranks. On the two-site generator at 64 ranks their trees are 8 to 75
hops deep and some cross the 5 ms WAN link 3 or 4 times on one root path, so a chunk's first
trip costs 15-20 ms of latency before the pipeline is full (``horotopo simulate
sites:gpus=8,wan_gbps=10 --ranks 64``: 69.7 ms simulated at 16 MiB for a 23.4 ms optimum).

This forest is built, not packed. The machines (:func:`~.hierarchy.machines`) are split into
*groups* of machines close to each other: routes within a group have at most
:data:`GROUP_LATENCY_FACTOR` times the smallest route latency between two machines (a site
across a WAN, a rack behind its uplink), and groups close to each other form groups of the
next level (the racks of one site). Tree ``t`` has machine ``t`` as root; in every finest group
the machines, in the network's depth-first order rotated by ``t``, form a binary heap, and at
each level every other group's first machine hangs from the head of the group it joins: a
reduce tree crosses the WAN once and has one arc per rack it enters (at 128 ranks on sites,
one level of 4 rack groups crossed the WAN twice and fell to 625 MB/s from 666.7), ``ceil(log2
g)`` plus one host hop per level deep. The broadcast tree is the same tree reversed. Rotating
the roles over the ``H`` trees gives every machine each position once per group size, so the
NICs carry equal loads, the condition for the hierarchical optimum ``H c / (2 (H - 1))`` when
the NICs are the bottleneck. Each host-level tree runs in ``K`` channels with the intra-host
star (:meth:`~.hierarchy.HostModel.expand`), at one common rate: the most the network allows.

It certifies nothing; :func:`~.depth.choose_forest` offers it beside the others and keeps it
where it predicts less time by the margin.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from ..topology import Topology
from .alphabeta import _entry
from .hierarchy import HostModel, _route, machines
from .model import Packing, TreeRate

__all__ = ["GROUP_LATENCY_FACTOR", "HOST_FABRIC_FACTOR", "host_groups", "host_trees", "pack_host_forest",
           "has_hosts"]

#: Machines whose route latency is at most this multiple of the smallest one between two
#: machines share a group. Within one switch a route has two NIC hops (plus local links);
#: through a rack uplink it has two more (about 1.7x on the generators: racks split), and a
#: WAN's milliseconds are thousands of times a data-centre hop.
GROUP_LATENCY_FACTOR = 1.5

#: A group of machines (:func:`host_groups`): its machines, or its subgroups (nested).
Group = Union[List[int], List["Group"]]


#: A declared *host switch* (:func:`~.hierarchy.machines`) counts as a host for this forest
#: when its ranks reach each other at least this many times faster than they reach another
#: machine: a GPU node's local fabric (10x the NIC on the generators). A top-of-rack switch of
#: single-rank hosts behind a slower uplink also passes the machine test (racks-2x3: 4x), but
#: a probe, which groups ranks by host name, could not find such a forest again.
HOST_FABRIC_FACTOR = 8.0


def has_hosts(topology: Topology) -> bool:
    """Whether ``topology`` has at least two machines and one with several ranks on one host
    name or on a local fabric :data:`HOST_FABRIC_FACTOR` times faster than its way out (the
    case this forest is for)."""
    of = machines(topology)
    if not 2 <= len(set(of)) < topology.n:
        return False
    cap = topology.capacity_Bps
    slowest = lambda i, j: min((cap[r] for r in _route(topology, i, j)), default=np.inf)
    first: dict = {}
    for i, m in enumerate(of):
        j = first.setdefault(m, i)
        if j == i:
            continue
        if topology.hosts[i] == topology.hosts[j]:
            return True
        out = next(k for k in range(topology.n) if of[k] != m)
        return slowest(i, j) >= HOST_FABRIC_FACTOR * slowest(j, out)
    return False


def host_groups(model: HostModel) -> List[Group]:
    """Machines grouped by route latency (see :data:`GROUP_LATENCY_FACTOR`), level by level.

    The finest groups are the machines whose routes are within the factor of the smallest
    latency between two machines (a rack); groups whose routes to each other are within the
    factor of the smallest latency between two groups form the next level (the racks of a
    site), and so on until one group would hold all. A group of one level is the list of
    its subgroups, a finest group the list of its machines; a group with one subgroup is
    that subgroup. Members are in the network's depth-first order
    (:meth:`HostModel.ring_order`). On a network of one level (racks behind one core, sites
    of one rack each) this is a list of lists of machines.
    """
    h_count = model.n
    d = model.designated[0]
    lat = np.array([[float(_entry(model.topology.latency_s, int(d[a]), int(d[b]))) if a != b else np.inf
                     for b in range(h_count)] for a in range(h_count)])
    labels = []  # one partition per level, finest first; the last has two or more groups
    label = np.arange(h_count)
    while h_count > 1:
        between = lat[label[:, None] != label[None, :]]
        if between.size == 0:
            break
        close = lat <= GROUP_LATENCY_FACTOR * float(between.min())
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


def host_trees(groups: Sequence[Group], h_count: int, arity: int = 2
               ) -> List[Tuple[int, Tuple[int, ...]]]:
    """``(root, parent)`` of the ``h_count`` rotated trees over machines (module docstring).

    ``groups`` is :func:`host_groups`' nesting: tree ``t`` is rooted at machine ``t``; at
    each level, every group but the one of the head (the machine where the tree enters the
    level's parent group: machine ``t`` at the top) takes its machine at position ``t`` mod
    its size as its own head, which hangs from the parent group's head; a finest group is an
    ``arity``-ary heap of its machines rotated to start at its head. A tree so crosses the
    boundary of every group it enters once each way, and the rotation gives the machines
    of a group each head position equally often.
    """
    if arity < 1:
        raise ValueError(f"arity must be at least 1, got {arity}")
    flat = _flat(groups)
    if sorted(flat) != list(range(h_count)) or len(flat) != h_count:
        raise ValueError("groups must hold every machine 0..H-1 exactly once")
    def grow(group: Group, head: int, t: int, parent: List[int]) -> None:
        if all(isinstance(g, (int, np.integer)) for g in group):
            s = list(group).index(head)
            rot = list(group[s:]) + list(group[:s])
            for i in range(1, len(rot)):
                parent[rot[i]] = rot[(i - 1) // arity]
            return
        for sub in group:
            inside = _flat([sub])
            if head in inside:
                grow(sub, head, t, parent)
            else:
                own = inside[t % len(inside)]
                parent[own] = head
                grow(sub, own, t, parent)

    out = []
    for t in range(h_count):
        parent = [-1] * h_count
        grow(list(groups), t, t, parent)
        out.append((t, tuple(parent)))
    return out


def pack_host_forest(topology: Topology, arity: int = 2) -> Packing:
    """The rotated host forest of ``topology`` as rank-level trees at one common rate (the
    most every resource of the flat model allows; ``upper_bound`` None).

    Raises
    ------
    ValueError
        Fewer than two machines, or no machine with several ranks (:func:`has_hosts`).
    """
    if not has_hosts(topology):
        raise ValueError(f"{topology.name}: a host forest needs two or more machines and one "
                         "with several ranks")
    model = HostModel(topology)
    pairs = host_trees(host_groups(model), model.n, arity)
    load = sum(model.load(r, p, p) for r, p in pairs)
    rate = float(model.max_rate(np.asarray(load, dtype=float)))
    if not np.isfinite(rate):
        raise ValueError(f"{topology.name}: a host forest that loads no resource has no rate")
    trees = model.expand([TreeRate(r, p, p, rate) for r, p in pairs])
    total = float(sum(t.rate for t in trees))
    return Packing(trees=trees, throughput=total, upper_bound=None, full_throughput=total,
                   bound_phase="", extra={"host_trees": len(pairs)})
