"""A SimGrid platform from a topology: the network that :mod:`horotopo.topology` models, built
link for link, so that the simulation and the planner see the same resources and routes.

- Declared form: one SimGrid host per host of the document (its ranks are actors on it, and
  talk over SimGrid's loopback: memory, which the model does not constrain either); every link
  becomes two simplex links, one per direction (split duplex: each direction has its own rate,
  ``[a->b, b->a]`` when the document gives two), with the link's latency; every ordered host
  pair routes over exactly the links of :attr:`Topology.routes` (the planner's shortest path).
- Measured form: one host per rank; every resource (the pair link ``i -> j`` with the pair's
  latency, each rank's egress and ingress, each shared bottleneck) becomes a simplex link, and
  the pair ``i -> j`` routes over its route's resources, as the planner's model has it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from ..topology import Topology
from ..transport.simulated import Simulation

__all__ = ["Platform", "build_platform", "resource_latencies"]

# A host's speed in flops (unused by the costs, which are charged as simulated sleeps; SimGrid
# needs one).
HOST_FLOPS = 1e9


@dataclass
class Platform:
    """A topology built in a simulation.

    Attributes
    ----------
    sim : Simulation
        Where it lives.
    hosts : list
        ``hosts[i]`` is the SimGrid host that rank ``i`` runs on.
    names : list of str
        ``names[i]``: rank ``i``'s host name in the topology (its ``processor_name``).
    links : list
        One SimGrid link per resource of the topology, in its order.
    """

    sim: Simulation
    hosts: List[Any]
    names: List[str]
    links: List[Any]


def resource_latencies(topology: Topology) -> List[float]:
    """One-way latency in seconds of each resource, so that a route's links add up to the
    model's pair latency: a declared link's own, a measured pair's on its pair resource, and
    zero on shared resources."""
    lat = [0.0] * len(topology.resources)
    doc = topology.to_json()
    if topology.kind == "declared":
        # _declared adds two resources per link, in the document's order: a->b, then b->a.
        for k, link in enumerate(doc["links"]):
            a, b = link["ends"]
            if topology.resources[2 * k] != f"{a}->{b}":
                raise ValueError(f"resource {2 * k} is {topology.resources[2 * k]!r}, expected "
                                 f"{a}->{b}: the topology's layout changed")
            lat[2 * k] = lat[2 * k + 1] = float(link.get("latency_ms", 0.0)) / 1e3
        return lat
    for i in range(topology.n):
        for j in range(topology.n):
            if i != j:
                lat[topology.routes[i][j][0]] = topology.latency_s[i][j]
    return lat


def build_platform(sim: Simulation, topology: Topology) -> Platform:
    """Build ``topology`` on ``sim``'s zone and seal it; returns where each rank runs."""
    sg = sim.sg
    zone = sim.zone
    lat = resource_latencies(topology)
    links = []
    for r, (name, cap) in enumerate(zip(topology.resources, topology.capacity_Bps)):
        link = zone.create_link(f"{r}:{name}", [float(cap)])
        link.set_latency(lat[r])
        links.append(link.seal() if hasattr(link, "seal") else link)
    n = topology.n
    if topology.kind == "declared":
        names = sorted(set(topology.hosts))
        endpoint = {h: zone.create_host(h, HOST_FLOPS) for h in names}
        rep: Dict[str, int] = {}
        for i, h in enumerate(topology.hosts):
            rep.setdefault(h, i)
        pairs: List[Tuple[Any, Any, Sequence[int]]] = [
            (endpoint[a], endpoint[b], topology.routes[rep[a]][rep[b]])
            for a in names for b in names if a != b]
        hosts = [endpoint[h] for h in topology.hosts]
    else:
        hosts = [zone.create_host(f"rank{i}", HOST_FLOPS) for i in range(n)]
        pairs = [(hosts[i], hosts[j], topology.routes[i][j])
                 for i in range(n) for j in range(n) if i != j]
    for src, dst, route in pairs:
        zone.add_route(src.netpoint, dst.netpoint, None, None,
                       [sg.LinkInRoute(links[r]) for r in route], False)
    zone.seal()
    return Platform(sim=sim, hosts=hosts, names=list(topology.hosts), links=links)
