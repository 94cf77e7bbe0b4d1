"""The time of one stage of concurrent point-to-point flows: the model that ring allreduce and
the stages of hierarchical allreduce are predicted with.

A stage is a set of flows ``(from rank, to rank, bytes)`` that start together, each cut into
chunk messages that every rank posts at once, and it ends when its last chunk has arrived and
been handled. Its time is the sum of

- the posts: every rank's CPU posts each of its messages (a send or a receive per chunk) before
  they go out, the busiest rank's;
- the longest flow on the wire: its chunks follow one another on their stream (one source,
  destination and tag) as the transport lets them (:attr:`NetworkModel.streams`: one at a time,
  a bandwidth-delay product's worth, or all at once), each paying the route's latency, and its
  bytes cross every link of its route at that link's rate shared fairly among the stage's
  flows (max-min fair sharing: a link's bytes of all flows at its capacity), capped by a TCP
  window over the round trip;
- the handling of received bytes (the copy or reduce after a receive), the busiest rank's,
  which overlaps the wire but for one chunk's worth: the last chunk is handled after it lands.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..packing.alphabeta import ENGINE_COSTS, IDEAL_NETWORK, NetworkModel, SoftwareCosts
from ..topology import Topology

__all__ = ["Flow", "FlowNetwork", "stage_time", "flow_rates", "sharing_matters"]

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


def sharing_matters(network: NetworkModel) -> bool:
    """Whether ``network`` shares links otherwise than equally among the flows that cross
    them (a :class:`FlowNetwork` with weights or cross traffic)."""
    return isinstance(network, FlowNetwork) and (network.crosstraffic > 0
                                                 or network.weight_bytes > 0)


def flow_rates(topology: Topology, groups: Sequence[Sequence[Flow]],
               network: FlowNetwork) -> np.ndarray:
    """The rate (bytes per second) of each group of flows that move at one rate (a tree's
    arcs), while all groups flow at once: max-min sharing with cross traffic
    (:class:`FlowNetwork`), each group weighted by its flows' mean weight."""
    live = [(u, v, b, topology.route(u, v)) for flows in groups for u, v, b in flows]
    matrix, cap, weight, bound = _sharing(topology, live, network)
    member = np.zeros((len(live), len(groups)))
    member[np.arange(len(live)), np.repeat(np.arange(len(groups)),
                                           [len(flows) for flows in groups])] = 1.0
    sizes = member.sum(axis=0)
    return _max_min(matrix @ member, cap, (weight @ member) / sizes,
                    np.array([bound[member[:, k] > 0].min() for k in range(len(groups))]),
                    np.ones(len(groups), dtype=bool))


def _sharing(topology: Topology, live: Sequence[Tuple[int, int, float, Tuple[int, ...]]],
             network: FlowNetwork) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The links' load per unit of each flow's rate (its route, and its reverse route's cross
    traffic), the links' capacities, the flows' weights and their bounds."""
    capacity = np.asarray(topology.capacity_Bps, dtype=float)
    n = len(live)
    rows, cols, coef = [], [], []
    penalty = np.empty(n)
    bound = np.empty(n)
    for f, (u, v, _, route) in enumerate(live):
        declared = topology.latency(u, v)
        inv = [1.0 / capacity[r] for r in route]
        penalty[f] = declared + network.weight_bytes * sum(inv)
        # alone, a flow has its reverse route to itself: the link's own rate bounds it
        _, s_per_byte = network.hop(declared, max(inv, default=0.0))
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
    matrix = np.zeros((len(used), n))
    np.add.at(matrix, (row_of, np.asarray(cols)), np.asarray(coef))
    # the measured factor is a flow's rate with its reverse traffic: the link's own is above it
    cap = capacity[used] * network.bandwidth_factor * (1.0 + network.crosstraffic)
    return matrix, cap, 1.0 / np.maximum(penalty, 1e-12), bound


def _fluid_finish(topology: Topology, live: Sequence[Tuple[int, int, float, Tuple[int, ...]]],
                  network: FlowNetwork) -> np.ndarray:
    """Seconds until each of ``live``'s flows has moved its bytes, started together, at the
    rates weighted max-min sharing gives (:class:`FlowNetwork`), recomputed as flows end."""
    matrix, cap, weight, bound = _sharing(topology, live, network)
    n = len(live)
    left = np.array([b for _, _, b, _ in live], dtype=float)
    finish = np.zeros(n)
    active = left > 0
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


def _max_min(matrix: np.ndarray, cap: np.ndarray, weight: np.ndarray, bound: np.ndarray,
             active: np.ndarray) -> np.ndarray:
    """Weighted max-min rates of the ``active`` flows: every unfrozen flow's rate grows as its
    weight until a link it loads (with its coefficient in ``matrix``) is full or it reaches
    its ``bound``; then it is frozen."""
    rate = np.zeros(len(weight))
    free = active.copy()
    left = cap.copy()
    while free.any():
        demand = matrix[:, free] @ weight[free]
        with np.errstate(divide="ignore", invalid="ignore"):
            by_link = np.where(demand > 0, left / demand, math.inf)
            by_bound = np.where(free, (bound - rate) / weight, math.inf)
        grow = min(float(by_link.min()), float(by_bound.min()))
        if not math.isfinite(grow):
            break
        rate[free] += grow * weight[free]
        left -= grow * demand
        full = (demand > 0) & (left <= cap * 1e-9)
        frozen = (matrix[full].sum(axis=0) > 0) | (by_bound <= grow * (1 + 1e-9))
        free &= ~frozen
    return rate


def _in_flight(network: NetworkModel, latency_s: float, s_per_byte: float,
               chunk: float) -> float:
    """Chunks of one stream in flight at once on a route of declared ``latency_s`` whose
    bottleneck moves a byte in ``s_per_byte`` (inf: all of them)."""
    if network.streams == "serial":
        return 1.0
    if network.streams == "bdp":
        return 1.0 + (math.floor(latency_s / s_per_byte / chunk) if s_per_byte > 0 else math.inf)
    return math.inf


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
    fluid = _fluid_finish(topology, live, network) if sharing_matters(network) else None
    wire = 0.0
    pieces = 1
    for f, (u, v, nbytes, route) in enumerate(live):
        declared = topology.latency(u, v)
        shared = (float(fluid[f]) if fluid is not None else
                  max((load[r] / (capacity[r] * bf) for r in route), default=0.0))
        alone = max((1.0 / capacity[r] for r in route), default=0.0)
        lat, inv = network.hop(declared, alone)
        # the window cap binds one stream's bytes, the fair share all flows' on a link
        c = min(chunk, nbytes)
        chunks = math.ceil(nbytes / c)
        rounds = max(1, math.ceil(chunks / _in_flight(network, declared, alone, c)))
        # the fluid flows hold their window caps among their bounds
        wire = max(wire, rounds * lat + (shared if fluid is not None
                                         else max(shared, nbytes * inv)))
        pieces = max(pieces, chunks)
    post = max(posts.values()) * costs.per_message_s
    handling = max(handled.values()) * costs.per_byte_s
    return post + max(wire, handling) + min(wire, handling) / pieces
