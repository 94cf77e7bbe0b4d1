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
from typing import Dict, List, Sequence, Tuple

from ..packing.alphabeta import ENGINE_COSTS, IDEAL_NETWORK, NetworkModel, SoftwareCosts
from ..topology import Topology

__all__ = ["Flow", "stage_time"]

Flow = Tuple[int, int, float]  # (from rank, to rank, bytes)


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
    wire = 0.0
    pieces = 1
    for u, v, nbytes, route in live:
        declared = topology.latency(u, v)
        shared = max((load[r] / (capacity[r] * bf) for r in route), default=0.0)
        alone = max((1.0 / capacity[r] for r in route), default=0.0)
        lat, inv = network.hop(declared, alone)
        # the window cap binds one stream's bytes, the fair share all flows' on a link
        c = min(chunk, nbytes)
        chunks = math.ceil(nbytes / c)
        rounds = max(1, math.ceil(chunks / _in_flight(network, declared, alone, c)))
        wire = max(wire, rounds * lat + max(shared, nbytes * inv))
        pieces = max(pieces, chunks)
    post = max(posts.values()) * costs.per_message_s
    handling = max(handled.values()) * costs.per_byte_s
    return post + max(wire, handling) + min(wire, handling) / pieces
