"""Hierarchical packing: trees over hosts, an intra-host stage, and every local rank driving.

Large jobs run several ranks per host (one per GPU). They share the host's NIC and talk to each
other over a faster local fabric (NVLink, PCIe), which is a modelled resource like any link.
The hierarchical model plans over *machines* (:func:`machines`) instead of ranks:

- a column is a reduce tree ``A`` and a broadcast tree ``B`` over the ``H`` machines;
- it runs in ``K`` *channels* (``K`` = the most ranks on one machine), each carrying ``1/K`` of
  its rate, like NCCL's rings, one per GPU: in channel ``c`` machine ``h`` is driven by its
  local rank ``c mod k_h`` (the *designated* rank ``d_h^c``). The host-level arc ``h -> g`` is
  the rank arc ``d_h^c -> d_g^c``, so every local rank carries part of the NIC traffic;
- the intra-host stage: in channel ``c`` the ranks of ``h`` form a chain from ``d_h^c`` in
  local rank order (wrapping around), each reducing into the one before it and receiving the
  broadcast from it, over the local links, as NCCL's trees run inside a node. A star would
  load ``d_h^c``'s local link with every other rank's flow beside its NIC traffic: where the
  transport shares that link by round trip, as TCP and the simulator do, the short local
  flows then take most of it and the one from the network waits (two hosts of 8 ranks
  behind 10 gbps NICs: 125 ms simulated for 64 MiB down a star, 61.5 ms down a chain).

So a host-level column at rate ``x`` *is* ``K`` ordinary rank-level reduce/broadcast trees at
rate ``x / K`` each (:meth:`HostModel.expand`): the engine, the step tables and the validator
run them unchanged, with no new step kind. Its load on every resource of the flat model is
computed exactly (:class:`HostModel`): the arcs' routes averaged over the channels, plus a
fixed load, the same for every column, of the intra-host stage. A plan packed here is therefore
feasible in the flat model at the rates it states; its certificate bounds the best schedule of
this form (the *hierarchical bound*). The flat model's bound, priced at the hierarchical dual
(:func:`flat_bound`), is reported beside it.

The packing itself is :func:`horotopo.packing.gk.pack` on a :class:`HostModel`: ``H`` nodes
instead of ``n = H * K``, so Edmonds, the LP and the pool are ``K`` to ``K^2`` times smaller.
Resources whose rows are identical in every column (a host's ``K`` local links, by the channels'
symmetry) are merged into one LP row.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from .. import config
from ..params import PLANNER, PlannerParams
from ..topology import HostRoutes, Topology, run_positions
from .arborescence import best_root_arborescence
from .bottleneck import seed_pairs
from .certificate import check_certificate
from .gk import dual_bound, pack, price
from .model import ArcModel, Packing, TreeRate

__all__ = ["machines", "lone_ranks_at_scale", "HostModel", "use_hierarchy", "pack_hierarchical",
           "packing_cpu_cap", "flat_bound", "ring_throughput"]

#: The certificate's phase when :func:`cut_bound` gives the bound.
PHASE_CUT = "dual at lengths 1/c on the slowest machine's cut"


def lone_ranks_at_scale(topology: Topology, params: PlannerParams = PLANNER) -> bool:
    """Whether every rank of ``topology`` has a host of its own and there are more than
    ``params.hierarchy_auto_min_ranks``: then :func:`machines` groups them by rack."""
    return (topology.n > params.hierarchy_auto_min_ranks
            and len(set(topology.hosts)) == topology.n)


def machines(topology: Topology, params: PlannerParams = PLANNER) -> Tuple[int, ...]:
    """The machine (host) of every rank, numbered in order of first rank.

    Ranks with one host name are on one machine, as ``local_rank`` counts them. In a declared
    topology so are the ranks under a *host switch*, the way :mod:`horotopo.generate` declares
    a multi-GPU host: a node whose routes all leave by one link (its NIC) and that only ranks on
    leaf links hang from, every leaf link faster in both directions than the NIC in either. A
    top-of-rack switch of single-rank hosts passes when its uplink is slower than every NIC,
    and, past ``params.hierarchy_auto_min_ranks`` ranks that each have a host of their own,
    whatever its uplink (:func:`lone_ranks_at_scale`): the rack is then planned as one
    machine, a valid (if coarser) schedule, where planning a thousand single-rank hosts flat
    takes minutes.
    """
    label: Dict[Any, int] = {}
    key: List[Any] = list(topology.hosts)
    routes = topology.routes
    if isinstance(routes, HostRoutes):
        alone = lone_ranks_at_scale(topology, params)
        cap = topology.capacity_Bps
        by_attach: Dict[int, List[int]] = {}
        for i in range(topology.n):
            by_attach.setdefault(routes.attach[i], []).append(i)
        for a, ranks in by_attach.items():
            others = [b for b in range(len(routes.core)) if b != a]
            if not others or any(routes.up[i] < 0 for i in ranks):
                continue  # the only node, or ranks sit on it: a host, not a host switch
            nic_out = {routes.core[a][b][0] for b in others}
            nic_in = {routes.core[b][a][-1] for b in others}
            if len(nic_out) != 1 or len(nic_in) != 1:
                continue
            local = min(min(cap[routes.up[i]], cap[routes.down[i]]) for i in ranks)
            if alone or local > max(cap[nic_out.pop()], cap[nic_in.pop()]):
                for i in ranks:
                    key[i] = ("host switch", a)
    return tuple(label.setdefault(k, len(label)) for k in key)


def _unit_rows(rows: Sequence[Sequence[int]], weight: float, width: int) -> sp.csr_matrix:
    """A sparse matrix with ``weight`` at every resource listed in each row (summed)."""
    r = np.repeat(np.arange(len(rows)), [len(x) for x in rows])
    c = np.fromiter((v for x in rows for v in x), dtype=np.int64, count=len(r))
    return sp.csr_matrix((np.full(len(r), weight), (r, c)), shape=(len(rows), width))


def _route_rows(topology: Topology, rows: np.ndarray, tails: np.ndarray, heads: np.ndarray,
                count: int, weight: float) -> sp.csr_matrix:
    """A ``count``-row sparse matrix with ``weight`` at every resource of the route of arc
    ``tails[i] -> heads[i]`` in row ``rows[i]`` (summed), as :func:`_unit_rows` of those
    routes listed row by row."""
    ptr, res = topology.arc_routes(tails * topology.n + heads)
    r = np.repeat(rows, np.diff(ptr))
    return sp.csr_matrix((np.full(len(r), weight), (r, res)),
                         shape=(count, len(topology.capacity_Bps)))


class HostModel:
    """The hierarchical model: columns are trees over machines (see module docstring).

    Duck-types :class:`~horotopo.packing.model.ArcModel` for :func:`~horotopo.packing.gk.pack`
    over ``n`` = the number of machines; ``capacity`` and the loads are over merged resources.

    Parameters
    ----------
    topology : Topology
    machine_of : sequence of int, optional
        Machine of every rank (default :func:`machines` under ``params``).
    params : PlannerParams
        What :func:`machines` groups by default.
    """

    def __init__(self, topology: Topology, machine_of: Optional[Sequence[int]] = None,
                 params: PlannerParams = PLANNER):
        self.topology = topology
        self.machine_of = np.asarray(machine_of if machine_of is not None
                                     else machines(topology, params), dtype=np.int64)
        h_count = int(self.machine_of.max()) + 1
        self.n = h_count
        self.members = [np.flatnonzero(self.machine_of == h) for h in range(h_count)]
        if any(len(m) == 0 for m in self.members):
            raise ValueError("machine numbers must run 0..H-1 with every machine used")
        self.channels = max(len(m) for m in self.members)
        k = self.channels
        #: ``designated[c, h]``: the rank that drives machine ``h`` in channel ``c``.
        self.designated = np.array([[m[c % len(m)] for m in self.members] for c in range(k)])
        #: ``local_parent[c, i]``: rank ``i``'s parent in channel ``c``'s intra-host chain
        #: (``-1`` at the designated ranks).
        self.local_parent = np.full((k, len(self.machine_of)), -1, dtype=np.int64)
        for c in range(k):
            for m in self.members:
                chain = np.roll(m, -(c % len(m)))
                self.local_parent[c, chain[1:]] = chain[:-1]
        width = len(topology.capacity_Bps)
        routes = topology.routes
        attach = (np.asarray(routes.attach)[self.designated[0]]
                  if isinstance(routes, HostRoutes) else None)
        if attach is not None and all(len({routes.attach[i] for i in m}) == 1
                                      for m in self.members):
            # Routes between machines split into the designated ranks' leaf links and the
            # path between the machines' attachment nodes (topology.HostRoutes).
            self.key = attach
            self.keys = len(routes.core)
            leaf = lambda side: [[side[i] for i in self.designated[:, h] if side[i] >= 0]
                                 for h in range(h_count)]
            out_rows, in_rows = leaf(routes.up), leaf(routes.down)
            core = _unit_rows([path for row in routes.core for path in row], 1.0, width)
        else:
            self.key = np.arange(h_count)
            self.keys = h_count
            out_rows = in_rows = [[] for _ in range(h_count)]
            # row h * H + g: the routes between the machines' designated ranks, channel by
            # channel (none from a machine to itself)
            h_of, g_of = np.divmod(np.arange(h_count * h_count), h_count)
            rows = np.repeat(np.flatnonzero(h_of != g_of), k)
            tails = self.designated[:, h_of[h_of != g_of]].T.ravel()
            heads = self.designated[:, g_of[h_of != g_of]].T.ravel()
            core = _route_rows(topology, rows, tails, heads, h_count * h_count, 1.0 / k)
        out_m = _unit_rows(out_rows, 1.0 / k, width)
        in_m = _unit_rows(in_rows, 1.0 / k, width)
        # every channel's chain inside every machine: row 0 the reduce arcs (child to parent),
        # row 1 the broadcast arcs
        channel, child = np.nonzero(self.local_parent >= 0)
        ends = np.stack([self.local_parent[channel, child], child], axis=1)
        fixed = _route_rows(topology, np.repeat([0, 1], len(ends)),
                            np.concatenate([ends[:, 1], ends[:, 0]]),
                            np.concatenate([ends[:, 0], ends[:, 1]]), 2, 1.0 / k)
        self._merge(topology.capacity_array, out_m, in_m, core, fixed)

    def _merge(self, cap: np.ndarray, *parts: sp.csr_matrix) -> None:
        """Merge resources whose column in every part is identical (same capacity too) and
        drop those no column loads; keep the map back to the flat resources."""
        stacked = sp.vstack(parts).tocsc()
        stacked.sort_indices()
        groups: Dict[Any, int] = {}
        self.group_of = np.full(len(cap), -1, dtype=np.int64)
        reps: List[int] = []
        # only the loaded resources (a measured topology has one per ordered pair of ranks),
        # each column's signature sliced from the whole arrays' bytes: numpy's per-element
        # indexing took most of the loop over a hundred thousand columns
        loaded = np.flatnonzero(np.diff(stacked.indptr))
        ptr = stacked.indptr.tolist()
        index_bytes, data_bytes = stacked.indices.itemsize, stacked.data.itemsize
        indices, data = stacked.indices.tobytes(), stacked.data.tobytes()
        group = np.empty(len(loaded), dtype=np.int64)
        for k, (r, c) in enumerate(zip(loaded.tolist(), cap[loaded].tolist())):
            lo, hi = ptr[r], ptr[r + 1]
            sig = (c, indices[lo * index_bytes:hi * index_bytes],
                   data[lo * data_bytes:hi * data_bytes])
            if sig not in groups:
                groups[sig] = len(reps)
                reps.append(r)
            group[k] = groups[sig]
        self.group_of[loaded] = group
        self.group_size = np.bincount(self.group_of[self.group_of >= 0], minlength=len(reps))
        self.flat_capacity = cap
        self.capacity = cap[reps]
        out_m, in_m, core, fixed = (p[:, reps].tocsr() for p in parts)
        self._core_flat = parts[2]
        self.out_m, self.in_m, self.core = out_m, in_m, core
        self.out_T, self.in_T = out_m.T.tocsr(), in_m.T.tocsr()
        self.fixed = (fixed[0].toarray().ravel(), fixed[1].toarray().ravel())

    @property
    def constrained(self) -> bool:
        return bool(self.out_m.nnz or self.in_m.nnz or self.core.nnz
                    or self.fixed[0].any() or self.fixed[1].any())

    def fixed_cost(self, lengths: np.ndarray, inward: bool) -> float:
        """Cost under ``lengths`` of the intra-host stage of a reduce (``inward``) or broadcast
        tree: the same for every column."""
        return float(self.fixed[0 if inward else 1] @ lengths)

    def arc_costs(self, lengths: np.ndarray) -> np.ndarray:
        """``W[h, g]``: cost of the host-level arc ``h -> g`` averaged over the channels."""
        core = (self.core @ lengths).reshape(self.keys, self.keys)[np.ix_(self.key, self.key)]
        return (self.out_m @ lengths)[:, None] + core + (self.in_m @ lengths)[None, :]

    def arc_parts(self, tails: np.ndarray, heads: np.ndarray
                  ) -> List[Tuple[sp.csr_matrix, np.ndarray]]:
        """Load at unit rate of each host-level arc ``tails[i] -> heads[i]``: the sum of row
        ``rows[i]`` of every ``(matrix, rows)`` listed (leaf links out, core path, leaf in)."""
        return [(self.out_m, tails), (self.core, self.key[tails] * self.keys + self.key[heads]),
                (self.in_m, heads)]

    def half_load(self, parent: Sequence[int], inward: bool) -> np.ndarray:
        """Load at unit rate of a host-level reduce (``inward``) or broadcast tree, with its
        intra-host stage, on the merged resources."""
        parent = np.asarray(parent, dtype=np.int64)
        v = np.flatnonzero(parent >= 0)
        tails, heads = (v, parent[v]) if inward else (parent[v], v)
        h = self.n
        # the core route of each arc, read from the CSR arrays: scipy's row indexing costs
        # more per call than the rest of this sum (it runs for every column the LP prices)
        rows = self.key[tails] * self.keys + self.key[heads]
        lo = self.core.indptr[rows]
        pos = run_positions(lo, self.core.indptr[rows + 1] - lo)
        return (self.out_T @ np.bincount(tails, minlength=h)
                + self.in_T @ np.bincount(heads, minlength=h)
                + np.bincount(self.core.indices[pos], weights=self.core.data[pos],
                              minlength=len(self.capacity))
                + self.fixed[0 if inward else 1])

    def load(self, root: int, reduce_parent: Sequence[int], bcast_parent: Sequence[int]
             ) -> np.ndarray:
        """Load of one column at unit rate."""
        return self.half_load(reduce_parent, True) + self.half_load(bcast_parent, False)

    max_rate = ArcModel.max_rate

    def flat_lengths(self, lengths: np.ndarray) -> np.ndarray:
        """Lengths on the flat resources: a merged resource's length spread evenly over its
        members (equal capacities, so ``c.y`` is unchanged)."""
        out = np.zeros(len(self.flat_capacity))
        used = self.group_of >= 0
        out[used] = lengths[self.group_of[used]] / self.group_size[self.group_of[used]]
        return out

    def ring_order(self) -> List[int]:
        """Machines in depth-first order of the network seen from machine 0: sorted by their
        route from it (channel 0's ranks), so that the machines behind any one link, which
        share the route up to it, are consecutive. A ring in this order crosses every link of
        a tree-shaped network once per direction, the fewest any ring can; what it gives
        elsewhere, :func:`~horotopo.packing.model.aware_ring_order` weighs."""
        d = self.designated[0]
        return sorted(range(self.n), key=lambda h: (self.topology.route(d[0], d[h]), h))

    def cut_lengths(self) -> np.ndarray:
        """Lengths ``1 / c`` on the slowest machine's *cut*: the slowest resource that every
        host-level arc out of it loads in full (its NIC out) and the slowest that every arc
        into it loads (its NIC in); zero elsewhere. Priced exactly
        (:func:`cut_bound`), they bound the optimum by about that machine's NIC rate, which
        every tree pair crosses at least once each way (a non-root machine sends once in the
        reduce tree; the root sends in the broadcast tree)."""
        keys = np.unique(self.key)
        weight = np.zeros(len(self.capacity))
        best = (-1.0, None)
        for h in np.unique(self.key, return_index=True)[1]:
            a = self.key[h]
            others = keys[keys != a]
            if not len(others):
                continue
            picked = []
            for rows in (a * self.keys + others, others * self.keys + a):  # out of, into h
                sub = self.core[rows]
                every = np.flatnonzero(np.bincount(sub.indices, minlength=len(weight))
                                       == len(rows))
                if len(every):
                    picked.append(every[np.argmin(self.capacity[every])])
            score = float(sum(1.0 / self.capacity[r] for r in picked))
            if score > best[0]:
                best = (score, picked)
        if best[1]:
            weight[best[1]] = 1.0 / self.capacity[best[1]]
        return weight

    def expand(self, trees: Sequence[TreeRate]) -> Tuple[TreeRate, ...]:
        """Rank-level trees of host-level columns: each in ``K`` channels at ``1/K`` of its
        rate (identical trees, from machines with fewer ranks than channels, merged)."""
        rates: Dict[Tuple[int, Tuple[int, ...], Tuple[int, ...]], float] = {}
        for t in trees:
            for c, d in enumerate(self.designated):
                tree = (int(d[t.root]), self._expand(c, t.reduce_parent),
                        self._expand(c, t.bcast_parent))
                rates[tree] = rates.get(tree, 0.0) + t.rate / self.channels
        return tuple(TreeRate(r, a, b, x) for (r, a, b), x in rates.items())

    def _expand(self, channel: int, host_parent: Sequence[int]) -> Tuple[int, ...]:
        d = self.designated[channel]
        hp = np.asarray(host_parent, dtype=np.int64)
        parent = self.local_parent[channel].copy()  # every rank on its machine's chain
        parent[d] = np.where(hp >= 0, d[np.maximum(hp, 0)], -1)
        return tuple(parent.tolist())


def _flat_costs(topology: Topology, model: HostModel, y: np.ndarray) -> np.ndarray:
    """``W[i, j]`` of the flat model under flat lengths ``y``, without an n^2 route table."""
    routes = topology.routes
    if not isinstance(routes, HostRoutes):
        return ArcModel(topology).arc_costs(y)
    ends = lambda side: np.where(np.asarray(side) >= 0, y[np.maximum(side, 0)], 0.0)
    attach = np.asarray(routes.attach)
    core = (model._core_flat @ y).reshape(model.keys, model.keys)
    w = ends(routes.up)[:, None] + core[np.ix_(attach, attach)] + ends(routes.down)[None, :]
    node = np.asarray(routes.node)
    w[node[:, None] == node[None, :]] = 0.0
    return w


def _is_tree(topology: Topology) -> bool:
    """Whether a declared topology's links form a tree (one path between any two nodes)."""
    doc = topology.to_json()
    if "links" not in doc:
        return False
    nodes = set(doc.get("switches", [])) | {e for link in doc["links"] for e in link["ends"]}
    return len(doc["links"]) == len(nodes) - 1


def _tree_prices(topology: Topology, model: HostModel, y: np.ndarray
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """Lower bounds on the cheapest flat reduce tree into every rank and broadcast tree out of
    it, on a network whose links form a tree.

    Every rank's data reaches the root along a walk of rank arcs that, in a tree, crosses
    every link of its one path to the root; so a reduce tree into ``r`` crosses at least once
    every link of the union of the paths ``v -> r``: the other ranks' leaf links, the paths
    into ``r``'s attachment node, and ``r``'s own leaf link. Broadcast mirrors it. The links
    into the ranks that gather a subtree are not counted, so this is a lower bound (exact when
    those have no length), and a lower ``d1 + d2`` only raises the certified bound. O(links)
    per attachment node instead of Edmonds on ``n`` ranks.
    """
    routes = topology.routes
    keys = model.keys
    pick = lambda side: np.where(np.asarray(side) >= 0, y[np.maximum(side, 0)], 0.0)
    node = np.asarray(routes.node)
    up, down = pick(routes.up), pick(routes.down)
    first = np.unique(node, return_index=True)[1]  # one rank per node: its leaf links
    up_total, down_total = up[first].sum(), down[first].sum()
    pairs = model._core_flat.tocoo()
    into = sp.csr_matrix((np.ones(pairs.nnz), (pairs.row % keys, pairs.col)),
                         shape=(keys, len(y)))
    out_of = sp.csr_matrix((np.ones(pairs.nnz), (pairs.row // keys, pairs.col)),
                           shape=(keys, len(y)))
    core_in = (into > 0).astype(float) @ y
    core_out = (out_of > 0).astype(float) @ y
    attach = np.asarray(routes.attach)
    alone = np.bincount(node, minlength=node.max() + 1)[node] == len(node)
    reduce_cost = np.where(alone, 0.0, up_total - up + core_in[attach] + down)
    bcast_cost = np.where(alone, 0.0, down_total - down + core_out[attach] + up)
    return reduce_cost, bcast_cost


def flat_bound(topology: Topology, model: HostModel, dual: Tuple[np.ndarray, np.ndarray],
               params: PlannerParams = PLANNER) -> Tuple[Optional[float], str]:
    """A certified upper bound on the *flat* model's optimum from a hierarchical dual point.

    ``dual = (y, pi)`` over merged resources and machines. ``y`` spread over the flat
    resources and ``pi`` given to every rank of a machine form a dual point of the flat LP;
    pricing it there gives ``d1, d2`` and the bound ``c.y / (d1 + d2)``
    (:mod:`horotopo.packing.gk`): exactly, by Edmonds on the ranks (one super-root run per
    kind), up to ``params.flat_bound_edmonds_max_ranks`` ranks; beyond, on a network whose
    links form a tree, from lower bounds on ``d1, d2`` (:func:`_tree_prices`; the bound stays
    certified, maybe looser). Returns ``(bound, method)``.
    """
    y = model.flat_lengths(dual[0])
    pi = np.asarray(dual[1])[model.machine_of]
    if topology.n > params.flat_bound_edmonds_max_ranks:
        if not (isinstance(topology.routes, HostRoutes) and _is_tree(topology)):
            return None, (f"not computed: more than {params.flat_bound_edmonds_max_ranks} "
                          f"ranks, links not a tree")
        into, out_of = _tree_prices(topology, model, y)
        return (dual_bound(model.flat_capacity, y, float(np.min(pi + into)),
                           float(np.min(out_of - pi))), "tree path lower bound")
    w = _flat_costs(topology, model, y)
    r1, _, c1 = best_root_arborescence(w, pi, True)
    r2, _, c2 = best_root_arborescence(w, -pi, False)
    return dual_bound(model.flat_capacity, y, pi[r1] + c1, c2 - pi[r2]), "Edmonds"


def cut_point(model: HostModel) -> Optional[Tuple[float, str, Tuple[np.ndarray, np.ndarray]]]:
    """The bound of the slowest machine's cut (:meth:`HostModel.cut_lengths`, priced exactly
    by Edmonds) as ``(bound, phase, dual)`` for :func:`~horotopo.packing.gk.pack`'s
    ``known_bound``; None when no resource is on every arc of a machine."""
    y = model.cut_lengths()
    if not y.any():
        return None
    zeros = np.zeros(model.n)
    (d1, _), = price(model, y, zeros, True)
    (d2, _), = price(model, y, zeros, False)
    return (dual_bound(model.capacity, y, d1, d2), PHASE_CUT,
            (y / (d1 + d2), np.full(model.n, d2 / (d1 + d2))))


def cut_bound(topology: Topology, model: HostModel, host: Packing) -> Packing:
    """``host`` with the bound of :func:`cut_point` where that is lower; the raw bound either
    way (it is checked against the trees' rate like every other)."""
    point = cut_point(model)
    if point is None:
        return host
    bound, _, dual = point
    check_certificate(bound, host.full_throughput, topology=topology.name, phase=PHASE_CUT,
                      achieved_by="the column pool's LP")
    if host.upper_bound is not None and bound >= host.upper_bound:
        return host
    return replace(host, upper_bound=bound, bound_phase=PHASE_CUT, dual=dual)


def ring_throughput(topology: Topology) -> float:
    """Ring allreduce's throughput in rank order on the flat model, in O(n) routes.

    Its ``n`` reduce and ``n`` broadcast chains use each ring arc ``v -> v+1`` ``2(n-1)``
    times in all, at one common rate (as :func:`horotopo.packing.model.ring_rate`).
    """
    n = topology.n
    cap = topology.capacity_array
    used = [r for v in range(n) for r in topology.route(v, (v + 1) % n)] if n > 1 else []
    load = 2.0 * (n - 1) * np.bincount(np.asarray(used, dtype=np.int64), minlength=len(cap))
    hit = load > 0
    return float(n * np.min(cap[hit] / load[hit])) if hit.any() else np.inf


def use_hierarchy(topology: Topology, setting: Optional[str] = None,
                  params: PlannerParams = PLANNER) -> bool:
    """Whether to plan ``topology`` over hosts: ``setting`` (default ``HOROTOPO_HIERARCHY``)
    ``on``, ``off``, or ``auto``: when some machine (:func:`machines`) has several ranks and
    there are more than ``params.hierarchy_auto_min_ranks`` ranks."""
    setting = setting or config.get("HOROTOPO_HIERARCHY")
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"hierarchy must be auto, on or off, got {setting!r}")
    if setting != "auto":
        return setting == "on"
    return (topology.n > params.hierarchy_auto_min_ranks
            and len(set(machines(topology, params))) < topology.n)


def packing_cpu_cap(machines: int, params: PlannerParams = PLANNER) -> float:
    """The CPU seconds the hierarchical packing may take on ``machines`` machines past
    ``hierarchical_large_machines``: ``hierarchical_packing_cpu_s`` from 512 machines (4096
    ranks of 8) up, in proportion to the square of the machines below. A round's
    Edmonds runs grow with the arcs between machines, and the planning targets (2 s at 1024
    ranks, 20 s at 4096) leave the packing about a tenth as much at a quarter of the
    machines."""
    return params.hierarchical_packing_cpu_s * min(
        1.0, (machines / params.packing_cpu_full_machines) ** 2)


def pack_hierarchical(topology: Topology, *, with_flat_bound: bool = True,
                      progress: Optional[Callable[[str], None]] = None,
                      host_model: Optional["HostModel"] = None,
                      params: PlannerParams = PLANNER, **pack_args: Any) -> Packing:
    """Pack trees over the machines of ``topology`` and expand them to rank-level trees.

    Parameters
    ----------
    topology : Topology
    with_flat_bound : bool
        Also price the final dual in the flat model (:func:`flat_bound`; two Edmonds runs on
        ``n`` ranks) and report it as ``flat_upper_bound_Bps``.
    progress : callable, optional
        Receives one-line progress messages.
    host_model : HostModel, optional
        ``HostModel(topology)``, where the caller has built it already.
    params : PlannerParams
        Past ``hierarchical_large_machines`` machines the packing seeds and prices less per
        round, keeps the trees of at most ``hierarchical_max_roots`` roots and takes at most
        ``hierarchical_packing_cpu_s``; ``flat_bound_edmonds_max_ranks`` as :func:`flat_bound`.
    **pack_args
        Passed to :func:`horotopo.packing.gk.pack` (``max_trees_per_root``, ``target_gap``...).

    Returns
    -------
    Packing
        Rank-level trees whose rates are the hierarchical solution's; ``upper_bound`` is the
        hierarchical bound (``bound_phase`` says so); ``extra`` holds the model's figures.
    """
    start = time.perf_counter()
    say = progress or (lambda msg: None)
    model = HostModel(topology, params=params) if host_model is None else host_model
    built = time.perf_counter() - start
    say(f"hierarchy: {model.n} machines, {model.channels} channels, "
        f"{len(model.capacity)} merged resources of {len(model.flat_capacity)} ({built:.2f} s)")
    # The topology-aware ring's chains seed the pool (at 1024 ranks they alone reach the
    # optimum); the machine-order ring's would double the LP at hundreds of machines. Most
    # rows (local links) never bind: row generation leaves them out.
    large = model.n > params.hierarchical_large_machines
    pack_args.setdefault("rank_ring", not large)
    if large:
        pack_args.setdefault("max_roots", params.hierarchical_max_roots)
        pack_args.setdefault("time_limit_s", packing_cpu_cap(model.n, params))
    pack_args.setdefault("lazy_rows", True)
    pack_args.setdefault("filled_dual", True)
    # Edmonds is the cost at hundreds of machines (a rack's hosts all prefer one parent, so it
    # contracts one cycle per level): one tree per kind and round there. The multiplicative-
    # weights trees stay (capped at a fifth of the time): on racks at 4096 ranks they lift R
    # from the ring's 195 to 307 MB/s.
    huge = model.n > params.huge_machines_factor * params.hierarchical_large_machines
    pack_args.setdefault("columns_per_round", params.huge_columns_per_round if huge
                         else params.large_columns_per_round if large
                         else params.columns_per_round)
    # Trees built for their bottleneck (slow hosts as leaves, fast ones as the backbone), with
    # the machine cut's bound: on racks with slow NICs they meet it at once, where column
    # generation on 512 machines stalled 6% short in its time cap (1.5 s per root there).
    # One root past 64 machines: a second one moved no row of the scale table.
    if model.n > 2:
        cut = pack_args.setdefault("known_bound", cut_point(model))
        pack_args.setdefault("seeds", seed_pairs(model, 1 if large else params.seed_roots,
                                                 cut[0] if cut else np.inf))
    host = pack(topology, model=model, progress=say, params=params, **pack_args)
    if host.upper_bound is None or host.gap > pack_args.get("target_gap",
                                                            params.target_gap) / 2:
        host = cut_bound(topology, model, host)  # the LP duals did not certify the plan
    trees = model.expand(host.trees)
    extra: Dict[str, Any] = {"model": "hierarchical", "machines": model.n,
                             "channels": model.channels, "host_trees": len(host.trees),
                             "model_seconds": round(built, 4)}
    if with_flat_bound and host.dual is not None:
        t0 = time.perf_counter()
        extra["flat_upper_bound_Bps"], extra["flat_bound_method"] = \
            flat_bound(topology, model, host.dual, params)
        extra["flat_bound_seconds"] = round(time.perf_counter() - t0, 4)
    return Packing(trees=trees, throughput=float(sum(t.rate for t in trees)),
                   upper_bound=host.upper_bound, full_throughput=host.full_throughput,
                   iterations=host.iterations, columns=host.columns,
                   seconds=time.perf_counter() - start, history=host.history,
                   bound_phase=f"hierarchical model: {host.bound_phase}", dual=host.dual,
                   extra=extra)
