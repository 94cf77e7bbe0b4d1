"""The one time model of every allreduce algorithm: flows of chunk messages sharing the
network's links and the ranks' CPUs.

Ring allreduce and the stages of hierarchical allreduce are stages of concurrent
point-to-point flows (:func:`stage_time`); the plan's trees and NCCL's double binary tree are
pipelined trees (:func:`trees_time`, :func:`plan_time`). Both share links as the transport
does (:class:`FlowNetwork`: max-min fair sharing, weighted by each flow's round trip as TCP
and SimGrid's LV08 model weight it, with acknowledgement traffic on the reverse routes;
:data:`TCP_NETWORK` by default for the chooser) and charge the busiest rank's per-message and
per-byte software costs.

A stage is a set of flows ``(from rank, to rank, bytes)`` that start together, each cut into
chunk messages that every rank posts at once, and it ends when its last chunk has arrived and
been handled. Its time is the sum of

- the posts: every rank's CPU posts each of its messages (a send or a receive per chunk) before
  they go out, the busiest rank's;
- the longest flow on the wire: its chunks follow one another on their stream (one source,
  destination and tag) as the transport lets them (:attr:`NetworkModel.streams`: one at a time,
  a bandwidth-delay product's worth, or all at once), each paying the route's latency, and its
  bytes cross every link of its route at that link's rate shared fairly among the stage's
  flows (max-min fair sharing: a link's bytes of all flows at its capacity), each message in
  flight capped by a TCP window over the round trip;
- the handling of received bytes (the copy or reduce after a receive), the busiest rank's,
  which overlaps the wire but for the last round's worth: the messages in flight at once
  land together and are handled after they land.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from ..packing.alphabeta import (ENGINE_COSTS, IDEAL_NETWORK, NetworkModel, SoftwareCosts,
                                 fill_time, on_network, rank_degrees, settled, window_for,
                                 window_rate)
from ..packing.profiles import forest_depths
from ..packing.sharing import progressive_filling, usage_of
from ..params import PLANNER, PlannerParams
from ..plan import Plan
from ..schedule import in_flight_for
from ..topology import Topology

__all__ = ["Flow", "FlowNetwork", "TCP_NETWORK", "stage_time", "trees_time", "plan_time",
           "sharing_matters"]

Flow = Tuple[int, int, float]  # (from rank, to rank, bytes)


@dataclass(frozen=True)
class FlowNetwork(NetworkModel):
    """A :class:`NetworkModel` that also says how concurrent flows share a link, as SimGrid's
    TCP model (LV08) shares it: each flow's share weighted by the inverse of its penalty, its
    route's latency plus ``weight_bytes`` over each of its links' rates (a flow over a short,
    fast route takes more), and each flow also loading its reverse route with
    ``crosstraffic`` of its rate (its acknowledgements). A flow held by such a link through
    its acknowledgements alone is held all the same, which no link-by-link count of flows
    shows: :func:`stage_time` then runs the stage as fluid flows (rates by weighted max-min
    sharing, recomputed as flows end)."""

    weight_bytes: float = 0.0
    crosstraffic: float = 0.0
    #: The fraction of a link's rate that two flows of one tree over it keep, against two flows
    #: of equal weights, where their weights are far apart (a rank's reduce flow and broadcast
    #: flow over routes of unequal latency): the tree's flows move at one pace, the lightest
    #: one's, and the link gives that one only its weighted share, so each flow costs the tree
    #: its weight over the other half's lightest in place of one flow's share, up to
    #: ``2 / mixed_efficiency - 1`` (:func:`_paced_load`;
    #: :func:`~horotopo.algorithms.simcheck.measure_network` times a three-rank chain with and
    #: without such a pair).
    mixed_efficiency: float = 1.0


#: The network TCP gives the declared links, as SimGrid's LV08 model (fitted to TCP) gives it
#: and :func:`horotopo.algorithms.simcheck.measure_network` measures it from single simulated
#: messages (``python benchmarks/predict_check.py`` prints the measured figures): rates at
#: 0.924 of the declared ones with traffic both ways, acknowledgements at 5% of a flow's rate on
#: its reverse route, a flow's share weighted by the inverse of its route's latency plus
#: 20.5 kB over each of its links' rates, a 4.4 MB TCP window over the round trip, and a
#: stream's messages past its bandwidth-delay product held back, and two flows of one tree
#: over a link whose weights are far apart keeping 0.69 of its rate (a three-rank chain, one
#: rank's reduce and broadcast flows on routes 3 times apart, against the same chain on one
#: switch). The chooser predicts on it (:mod:`horotopo.algorithms.choice`).
TCP_NETWORK = FlowNetwork(latency_factor=1.0, bandwidth_factor=0.924, tcp_window_bytes=4.4e6,
                          shared_messages=True, streams="bdp", weight_bytes=20.5e3,
                          crosstraffic=0.05, mixed_efficiency=0.69)


def sharing_matters(network: NetworkModel) -> bool:
    """Whether ``network`` shares links otherwise than equally among the flows that cross
    them (a :class:`FlowNetwork` with weights or cross traffic)."""
    return isinstance(network, FlowNetwork) and (network.crosstraffic > 0
                                                 or network.weight_bytes > 0)


def _sharing(topology: Topology, live: Sequence[Tuple[int, int, float, Tuple[int, ...]]],
             network: FlowNetwork, in_flight: Sequence[float]
             ) -> Tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """The links' load per unit of each flow's rate (its route, and its reverse route's cross
    traffic), the links' capacities, the flows' weights and their bounds (each of a flow's
    ``in_flight`` messages held to its own TCP window)."""
    capacity = topology.capacity_array
    n = len(live)
    rows, cols, coef = [], [], []
    penalty = np.empty(n)
    bound = np.empty(n)
    for f, (u, v, _, route) in enumerate(live):
        declared = topology.latency(u, v)
        inv = [1.0 / capacity[r] for r in route]
        penalty[f] = declared + network.weight_bytes * sum(inv)
        # alone, a flow has its reverse route to itself: the link's own rate bounds it
        s_per_byte = _flow_per_byte(network, declared, max(inv, default=0.0), in_flight[f])
        bound[f] = (1.0 + network.crosstraffic) / s_per_byte if s_per_byte > 0 else math.inf
        rows += list(route)
        cols += [f] * len(route)
        coef += [1.0] * len(route)
        if network.crosstraffic > 0:
            back = topology.route(v, u)
            rows += list(back)
            cols += [f] * len(back)
            coef += [network.crosstraffic] * len(back)
    used, row_of = np.unique(np.asarray(rows, dtype=np.int64), return_inverse=True)
    # sparse: a stage at a thousand ranks has thousands of flows over thousands of links
    matrix = sp.csr_matrix((np.asarray(coef), (row_of.ravel(), np.asarray(cols))),
                           shape=(len(used), n))
    # the measured factor is a flow's rate with its reverse traffic: the link's own is above it
    cap = capacity[used] * network.bandwidth_factor * (1.0 + network.crosstraffic)
    return matrix, cap, 1.0 / np.maximum(penalty, 1e-12), bound


def _flow_per_byte(network: NetworkModel, latency_s: float, s_per_byte: float,
                   messages: float) -> float:
    """Seconds per byte of a stream over a route of declared ``latency_s`` whose bottleneck
    moves a byte in ``s_per_byte``, ``messages`` of its messages in flight at once: the TCP
    window caps each message, not the stream."""
    _, capped = network.hop(latency_s, s_per_byte)
    return max(s_per_byte / network.bandwidth_factor, capped / max(1.0, messages))


def _fluid_finish(topology: Topology, live: Sequence[Tuple[int, int, float, Tuple[int, ...]]],
                  network: FlowNetwork, in_flight: Sequence[float]) -> np.ndarray:
    """Seconds until each of ``live``'s flows has moved its bytes, started together, at the
    rates weighted max-min sharing gives (:class:`FlowNetwork`), recomputed as flows end."""
    matrix, cap, weight, bound = _sharing(topology, live, network, in_flight)
    return _fluid(matrix, cap, weight, bound, np.array([b for _, _, b, _ in live], dtype=float))


def _fluid(matrix: np.ndarray, cap: np.ndarray, weight: np.ndarray, bound: np.ndarray,
           left: np.ndarray) -> np.ndarray:
    """Seconds until each flow (a column of ``matrix``) has moved its ``left`` bytes, all
    started together, at the weighted max-min rates of the ones still moving
    (:func:`_max_min`), recomputed as flows end."""
    left = left.astype(float)
    # A flow that crosses no link (ranks of one machine where the topology declares none
    # between them) is held by its own bound only: the network does not share it.
    free = np.asarray(matrix.sum(axis=0)).ravel() <= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        finish = np.where(free & (left > 0), left / bound, 0.0)
    active = (left > 0) & ~free
    clock = 0.0
    while active.any():
        rate = _max_min(matrix, cap, weight, bound, active)
        with np.errstate(divide="ignore"):
            until = np.where(active & (rate > 0), left / np.where(rate > 0, rate, 1.0), math.inf)
        step = float(until.min())
        if not math.isfinite(step):
            raise ValueError("a flow gets no rate on its route")
        clock += step
        left = np.where(active, left - rate * step, left)
        done = active & (until <= step * (1 + 1e-9))
        finish[done] = clock
        active &= ~done
    return finish


def _max_min(matrix: Any, cap: np.ndarray, weight: np.ndarray, bound: np.ndarray,
             active: np.ndarray) -> np.ndarray:
    """Weighted max-min rates of the ``active`` flows (the columns of ``matrix``, a resource's
    load per unit of each flow's rate): :func:`~horotopo.packing.sharing.progressive_filling`."""
    return progressive_filling(lambda x: matrix @ x, lambda r: matrix.T @ r, cap, weight, bound,
                               active)


def _in_flight(network: NetworkModel, latency_s: Any, s_per_byte: Any, chunk: Any) -> Any:
    """Chunks of one stream in flight at once on a route of declared ``latency_s`` whose
    bottleneck moves a byte in ``s_per_byte`` (inf: all of them); numbers or arrays alike."""
    if network.streams == "serial":
        return np.ones_like(np.asarray(latency_s, dtype=float))[()]
    if network.streams == "bdp":
        latency_s, s_per_byte = np.asarray(latency_s, dtype=float), np.asarray(s_per_byte)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (1.0 + np.where(s_per_byte > 0, np.floor(
                latency_s / np.where(s_per_byte > 0, s_per_byte, 1.0) / chunk), np.inf))[()]
    return np.full_like(np.asarray(latency_s, dtype=float), math.inf)[()]


def stage_time(topology: Topology, flows: Sequence[Flow], chunk_bytes: int,
               costs: SoftwareCosts = ENGINE_COSTS,
               network: NetworkModel = IDEAL_NETWORK) -> float:
    """Seconds of one stage of concurrent ``flows`` on ``topology`` (see the module docstring),
    each flow in chunks of ``chunk_bytes``, with the engine's software ``costs``, on what the
    transport makes of the declared links (``network``)."""
    live: List[Tuple[int, int, float, Tuple[int, ...]]] = []
    load: Dict[int, float] = {}
    posts: Dict[int, float] = {}
    handled: Dict[int, float] = {}
    chunk = float(max(1, int(chunk_bytes)))
    for u, v, nbytes in flows:
        if nbytes <= 0:
            continue
        route = topology.route(u, v)
        live.append((u, v, nbytes, route))
        for r in route:
            load[r] = load.get(r, 0.0) + nbytes
        chunks = math.ceil(nbytes / chunk)
        posts[u] = posts.get(u, 0.0) + chunks
        posts[v] = posts.get(v, 0.0) + chunks
        handled[v] = handled.get(v, 0.0) + nbytes
    if not live:
        return 0.0
    capacity = topology.capacity_Bps
    bf = network.bandwidth_factor
    # each flow's chunks, and how many of them its stream keeps in flight at once
    streams = []
    for u, v, nbytes, route in live:
        alone = max((1.0 / capacity[r] for r in route), default=0.0)
        c = min(chunk, nbytes)
        chunks = math.ceil(nbytes / c)
        streams.append((alone, c, chunks, min(float(chunks), _in_flight(
            network, topology.latency(u, v), alone, c))))
    fluid = (_fluid_finish(topology, live, network, [m for *_, m in streams])
             if sharing_matters(network) else None)
    wire = landed = 0.0
    pieces = 1
    for f, ((u, v, nbytes, route), (alone, c, chunks, messages)) in enumerate(
            zip(live, streams)):
        declared = topology.latency(u, v)
        shared = (float(fluid[f]) if fluid is not None else
                  max((load[r] / (capacity[r] * bf) for r in route), default=0.0))
        lat, _ = network.hop(declared, alone)
        inv = _flow_per_byte(network, declared, alone, messages)
        # the window cap binds each message in flight, the fair share all flows' on a link
        rounds = max(1, math.ceil(chunks / messages))
        # the fluid flows hold their window caps among their bounds
        moved = rounds * lat + (shared if fluid is not None else max(shared, nbytes * inv))
        wire = max(wire, moved)
        # where messages in flight share the route, a round's land together and the last
        # round's bytes are handled after it (one chunk's on a short route, the whole flow's
        # over a long one); else the messages land one after another, the last chunk last
        last = nbytes / rounds if network.shared_messages else c
        landed = max(landed, moved + last * costs.per_byte_s)
        pieces = max(pieces, chunks)
    post = max(posts.values()) * costs.per_message_s
    handling = max(handled.values()) * costs.per_byte_s
    return post + max(max(wire, handling) + min(wire, handling) / pieces, landed)


class _Arcs(NamedTuple):
    """Every arc of every tree, up and down (:func:`_arc_weights`): ``which[i]`` indexes the
    distinct arcs, whose routes are ``res[ptr[a]:ptr[a + 1]]``, weights (inverse penalties,
    :class:`FlowNetwork`) ``weight[a]`` and declared latencies ``latency[a]``; ``tree[i]`` is
    the tree and ``half[i]`` 0 for a reduce arc, 1 for a broadcast arc."""

    which: np.ndarray
    tree: np.ndarray
    ptr: np.ndarray
    res: np.ndarray
    weight: np.ndarray
    half: np.ndarray
    latency: np.ndarray


def _arc_weights(topology: Topology,
                 shapes: Sequence[Tuple[int, Sequence[int], Sequence[int]]],
                 network: FlowNetwork) -> _Arcs:
    """Every arc of every tree, up and down, each distinct arc's route read once
    (:class:`_Arcs`)."""
    n = topology.n
    inv_cap = 1.0 / topology.capacity_array
    keys, tree, half = [], [], []
    child = np.arange(n, dtype=np.int64)
    for k, (_, up, down) in enumerate(shapes):
        up_a, down_a = np.asarray(up, dtype=np.int64), np.asarray(down, dtype=np.int64)
        ups, downs = (child * n + up_a)[up_a >= 0], (down_a * n + child)[down_a >= 0]
        keys.append(np.concatenate([ups, downs]))
        tree.append(np.full(len(ups) + len(downs), k))
        half.append(np.concatenate([np.zeros(len(ups), np.int64), np.ones(len(downs), np.int64)]))
    # trees share most arcs (the channels of a host forest): each arc's route and weight once
    distinct, which = np.unique(np.concatenate(keys), return_inverse=True)
    ptr, res = topology.arc_routes(distinct)
    per_byte = np.zeros(len(distinct))
    np.add.at(per_byte, np.repeat(np.arange(len(distinct)), np.diff(ptr)), inv_cap[res])
    latency = topology.arc_latencies(distinct)
    weight = 1.0 / np.maximum(latency + network.weight_bytes * per_byte, 1e-12)
    return _Arcs(which.ravel(), np.concatenate(tree), ptr, res, weight, np.concatenate(half),
                 latency)


def _tree_weights(arcs: _Arcs, trees: int, links: int, load: np.ndarray,
                  cap: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Each tree's weight in the links' sharing: the mean weight of its ``arcs``
    (:func:`_arc_weights`) over its most loaded link, where its pace is set."""
    which, tree_of, ptr, res, weight = arcs.which, arcs.tree, arcs.ptr, arcs.res, arcs.weight
    routes = sp.csr_matrix((np.ones(len(res)), res, ptr), shape=(len(weight), links))
    busiest = used[np.argmax(load / cap[:, None], axis=0)]
    crosses = np.asarray(routes[which, busiest[tree_of]]).ravel() > 0
    total = np.bincount(tree_of, weights=np.where(crosses, weight[which], 0.0),
                        minlength=trees)
    count = np.bincount(tree_of, weights=crosses.astype(float), minlength=trees)
    return np.where(count > 0, total / np.maximum(count, 1.0), 1.0)


def _paced_load(arcs: _Arcs, trees: int, used: np.ndarray, width: int,
                most: float) -> np.ndarray:
    """``(len(used), trees)``: what a tree's ``arcs`` (:func:`_arc_weights`) load the link
    ``used[i]`` (of ``width`` resources, every arc's among them) with per byte of the tree's
    rate: one per flow, but where the link carries both a reduce flow and a broadcast flow
    of the tree, each flow counts its weight over the lightest flow of the other half
    there, between one and ``most``. There the two halves pace each other (a rank's
    broadcast waits on its reduce through the root), so a light flow moves at the share
    the link gives it against the other half's heavier flows, and the tree at its pace.
    Flows of one half over a link take turns as their window allows and keep the whole
    link (the simulator: a rank's children of unequal weights reducing into it lose
    nothing), so a flow costs nothing for the lighter flows of its own half."""
    which, tree_of, ptr, res, weight, half = (arcs.which, arcs.tree, arcs.ptr, arcs.res,
                                              arcs.weight, arcs.half)
    links = len(used)
    row = np.full(width, -1, dtype=np.int64)
    row[used] = np.arange(links)
    lens = np.diff(ptr)[which]
    occurrence = np.repeat(np.arange(len(which)), lens)
    offset = np.arange(len(occurrence)) - np.repeat(np.cumsum(lens) - lens, lens)
    key = tree_of[occurrence] * links + row[res[ptr[which][occurrence] + offset]]
    w = weight[which][occurrence]
    side = half[occurrence]
    # each half's lightest flow of the tree over the link (inf: the half is not there)
    low = np.full((2, trees * links), np.inf)
    np.minimum.at(low, (side, key), w)
    other = low[1 - side, key]
    paced = np.isfinite(other)
    load = np.zeros(trees * links)
    np.add.at(load, key, np.where(paced, np.clip(w / np.where(paced, other, w), 1.0, most),
                                  1.0))
    return load.reshape(trees, links).T


def _started_posts(shapes: Sequence[Tuple[int, Sequence[int], Sequence[int]]],
                   recvs: np.ndarray, chunks: np.ndarray, window: int) -> np.ndarray:
    """Per rank, the messages it posts at the start for the chunks of every tree, as the tree
    engine starts them all at once, less one chunk's posts of its own tree (which that tree's
    fill charges): a leaf as many chunks as the tree keeps in flight
    (:func:`~horotopo.schedule.in_flight_for` its depth), each a receive of the result and a
    send up; a rank with reduce children its ``window`` of chunks, each a receive per child.
    ``recvs`` is :func:`rank_degrees`' (a receive per reduce child, and one from the parent
    off the root), ``chunks`` each tree's count."""
    n = recvs.shape[1]
    roots = np.array([root for root, _, _ in shapes])
    off_root = np.ones((len(shapes), n))
    off_root[np.arange(len(shapes)), roots] = 0.0
    children = recvs - off_root
    leaf = (children == 0) & (off_root > 0)
    if chunks.max() <= window:
        in_flight = chunks  # every chunk starts at once whatever the depth
    else:
        depths = forest_depths(shapes, n)
        if depths is None:
            raise ValueError("a tree's parent arrays are not an arborescence at its root")
        in_flight = np.array([in_flight_for(window, up + down) for up, down in depths],
                             dtype=float)
    per_chunk = np.where(leaf, 2.0, children)
    started = np.where(leaf, np.minimum(chunks, in_flight)[:, None],
                       np.minimum(chunks, window)[:, None]) * per_chunk
    return started.sum(axis=0) - per_chunk.max(axis=0)


def _gated_arcs(topology: Topology, arcs: _Arcs, used: np.ndarray, width: int,
                chunk: np.ndarray, window: int, network: NetworkModel
                ) -> Tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """The reduce arcs whose windows a long route holds back: ``(routes, arc, tree, idle)``,
    ``routes`` the distinct arcs' loads on the ``used`` links (rows, columns as ``arcs``
    numbers them), and per reduce arc of a tree its distinct ``arc``, its ``tree`` and its
    ``idle`` seconds of latency per byte of the tree: the route's latency over the chunks its
    parent's window keeps in flight on it, where the route's bandwidth-delay product holds
    the whole window (0 elsewhere)."""
    reduce = arcs.half == 0
    arc, tree_of = arcs.which[reduce], arcs.tree[reduce]
    distinct = len(arcs.weight)
    slowest = np.zeros(distinct)
    np.maximum.at(slowest, np.repeat(np.arange(distinct), np.diff(arcs.ptr)),
                  1.0 / topology.capacity_array[arcs.res])
    latency, slowest = arcs.latency[arc], slowest[arc]
    c = chunk[tree_of]
    flight = np.minimum(float(window), _in_flight(network, latency, slowest, c))
    # where the stream holds its messages back, not the window, the arcs of a link do not
    # wait together
    idle = np.where(flight >= window, latency * network.latency_factor / (flight * c), 0.0)
    row = np.full(width, -1, dtype=np.int64)
    row[used] = np.arange(len(used))
    routes = sp.csr_matrix((np.ones(len(arcs.res)), row[arcs.res], arcs.ptr),
                           shape=(distinct, len(used)))
    return routes.T.tocsr(), arc, tree_of, idle


def trees_time(topology: Topology, shapes: Sequence[Tuple[int, Sequence[int], Sequence[int]]],
               parts: Sequence[float], chunks: Sequence[float], profiles: Sequence[Any],
               costs: SoftwareCosts = ENGINE_COSTS, network: NetworkModel = IDEAL_NETWORK,
               window: Optional[int] = None, params: PlannerParams = PLANNER) -> float:
    """Seconds of one allreduce over pipelined trees that run at once (a plan's, or NCCL's
    two), each tree ``(root, reduce_parent, bcast_parent)`` moving its ``parts`` bytes in
    chunks of ``chunks`` along every arc, up and down, with the critical-path ``profiles``
    (declared hops) that its first chunk crosses.

    A tree's arcs move at one rate, the tree's: the pipeline holds every arc to its slowest.
    The trees share the links as flows do (:func:`_max_min`, weighted and with cross traffic
    on a :class:`FlowNetwork`), and each rank's CPU as a resource too: a tree at rate ``r``
    costs a rank ``r`` times its posts per byte and its handled bytes per byte (the software
    ``costs``); each tree is also held to what its window of chunks per arc sustains over its
    hops (``window``, or the automatic one under ``params``) and per round trip of its
    critical paths, and where a long route holds a parent's whole window of a reduce arc in
    flight, the arcs of a link wait for their next windows together and the link idles with
    them. Rates are recomputed as trees finish. A tree's time is its first chunk's way up
    and down (its fill, over the ``profiles``' hops: a plan's are crowded by its other trees'
    first chunks, on the links and on the receiving ranks' CPUs) plus the rest of its part at
    those rates.
    """
    live = [k for k, p in enumerate(parts) if p > 0]
    if not live:
        return 0.0
    costs = settled(costs)
    shapes = [shapes[k] for k in live]
    parts_a = np.array([float(parts[k]) for k in live])
    chunk_a = np.minimum(np.array([float(chunks[k]) for k in live]), parts_a)
    profiles = [profiles[k] for k in live]
    win = window if window is not None else window_for(int(chunk_a.max()), len(live), params)
    g = len(live)
    # the links: each tree's arcs over them, and its acknowledgements over their reverse;
    # dense over the loaded links only (a measured topology has a resource per rank pair)
    forward = usage_of(topology, shapes).matrix().T.tocsr()
    cross = network.crosstraffic if isinstance(network, FlowNetwork) else 0.0
    back = (usage_of(topology, [(r, b, a) for r, a, b in shapes]).matrix().T.tocsr()
            if cross > 0 else None)
    width = forward.shape[0]
    loaded = forward.getnnz(axis=1) > 0
    if back is not None:
        loaded |= back.getnnz(axis=1) > 0
    used = np.flatnonzero(loaded)
    out = forward[used].toarray()
    arcs = _arc_weights(topology, shapes, network) if sharing_matters(network) else None
    if arcs is not None and network.mixed_efficiency < 1.0:
        # a tree's flows of unequal weights over a link move at the lightest one's share
        out = _paced_load(arcs, g, used, width, 2.0 / network.mixed_efficiency - 1.0)
    links = out if back is None else out + cross * back[used].toarray()
    link_cap = (topology.capacity_array[used]
                * network.bandwidth_factor * (1.0 + cross))
    # the ranks' CPUs: seconds of software work per byte of each tree
    msgs, recvs = rank_degrees(shapes)
    cpu = (msgs / chunk_a[:, None] * costs.per_message_s + recvs * costs.per_byte_s).T
    busy_cpu = cpu.sum(axis=1) > 0
    matrix = np.vstack([links, cpu[busy_cpu]])
    cap = np.concatenate([link_cap, np.ones(int(busy_cpu.sum()))])
    weight = (_tree_weights(arcs, g, width, links, link_cap, used) if arcs is not None
              else np.ones(g))
    hops = [on_network(p, network) for p in profiles]
    # the chunks a tree keeps in flight over its critical paths' hops (the engine counts its
    # depth, which walking every tree's ranks costs a prediction at scale)
    bound = np.array([window_rate(h, c, win, costs, network.streams, p, network,
                                  in_flight_for(win, sum(k for _, _, k in p)))
                      for h, c, p in zip(hops, chunk_a, profiles)])
    # a fill is its first chunk's way up and down; a rank's handling of the other trees'
    # first chunks that reach it at the same step is in the profile's hops (the plan's
    # crowding, horotopo.packing.profiles.Crowding), and its posts of the chunks every tree
    # starts at once, but for its own first chunk's, are below
    fill = np.array([fill_time(h, c, costs) for h, c in zip(hops, chunk_a)])
    finish = _fluid(matrix, cap, weight, bound, parts_a - chunk_a)
    if network.shared_messages and arcs is not None:
        # A parent posts a window of receives per child and the next only once they have
        # arrived: over a long route a reduce arc idles for the latency between its windows.
        # The arcs of a link start together and keep in step, so while their windows are on
        # the wire they load it at the rate x with 1 / r = 1 / x + idle (r the tree's rate,
        # x = r / (1 - r idle)), and the idle time is lost to the link; the rates the loads
        # come from are the last sharing's (passes below). A window bound already holds r
        # idle below 1; the cap keeps a rate of the first sharing that ignored it finite.
        routes, gated_arc, gated_tree, idle = _gated_arcs(topology, arcs, used, width, chunk_a,
                                                          win, network)
        base = links
        # The loads come from the rates they slow down: a pass from the last sharing's rates
        # overshoots where a tree's window waits most of its time (r idle near 1), and
        # passes in turn swing about the rates where the two agree; each pass takes the mean
        # of its shares and the last pass's, until they move by less than the threshold.
        last = None
        for _ in range(params.gated_passes):
            rate = (parts_a - chunk_a) / np.maximum(finish, 1e-300)
            busy = np.minimum(rate[gated_tree] * idle, params.gated_max_busy)
            if last is None and busy.max(initial=0.0) < params.gated_min_busy:
                break  # short routes: the windows' latency is lost in their bytes' time
            if last is not None:
                busy = (busy + last) / 2
                if np.abs(busy - last).max(initial=0.0) < params.gated_min_busy:
                    break
            last = busy
            # each gated arc's route, weighted, summed into its tree's column (sparse: a
            # measured topology at 1024 ranks has half a million arcs over 9,000 links)
            per_tree = sp.csr_matrix((busy / (1.0 - busy), (gated_arc, gated_tree)),
                                     shape=(routes.shape[1], base.shape[1]))
            links = base + (routes @ per_tree).toarray()
            matrix = np.vstack([links, cpu[busy_cpu]])
            finish = _fluid(matrix, cap, weight, bound, parts_a - chunk_a)
    # the chunks every tree starts at once, the first ones included (with a chunk per tree,
    # the busiest rank posts every tree's before the last of its sends is out): their posts
    # hold the network back where it sets the pace; where the CPU does, they are part of the
    # work it paces
    started = float(_started_posts(shapes, recvs, np.ceil(parts_a / chunk_a),
                                   win).max()) * costs.per_message_s
    slowest = float(finish.max())
    network_bound = (slowest if (cpu @ (parts_a - chunk_a)).max() + started <= slowest
                     else float(_fluid(links, link_cap, weight, bound, parts_a - chunk_a).max()))
    late = max(0.0, network_bound + started - slowest)
    return float((fill + finish).max()) + late


def plan_time(topology: Topology, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None,
              costs: SoftwareCosts = ENGINE_COSTS,
              network: NetworkModel = IDEAL_NETWORK, window: Optional[int] = None) -> float:
    """Seconds of an allreduce of ``nbytes`` over ``plan``'s trees on ``topology`` in chunks of
    ``chunk_bytes`` (None: the plan's), each tree with its share (:func:`trees_time`), at the
    engine's ``window`` (None: the automatic one under the parameters the plan was made with).
    """
    if nbytes <= 0 or plan.n == 1:
        return 0.0
    shapes = [(t.root, t.reduce_parent, t.bcast_parent) for t in plan.trees]
    profiles = [t.profile or ((plan.latency_s, 1.0 / t.rate_Bps, t.depth),)
                for t in plan.trees]
    return trees_time(topology, shapes, [t.share * nbytes for t in plan.trees],
                      plan.tree_chunks(chunk_bytes), profiles, costs, network, window,
                      plan.planner_params)
