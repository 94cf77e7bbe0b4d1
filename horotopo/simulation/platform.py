"""A SimGrid platform from a topology: the network that :mod:`horotopo.topology` models, built
link for link, so that the simulation and the planner see the same resources and routes.

- Declared form: one SimGrid host per node of the document that holds ranks (its ranks are
  actors on it, and talk over SimGrid's loopback: memory, which the model does not constrain
  either); every link becomes two simplex links, one per direction (split duplex: each
  direction has its own rate, ``[a->b, b->a]`` when the document gives two), with the link's
  latency. Routes are SimGrid's hierarchical routing over the parts of the topology's
  :class:`~horotopo.topology.HostRoutes`: one star zone per *attachment node* (a rank's node,
  or the switch its node hangs from by a single leaf link) holding the nodes attached there,
  each with its leaf link up and down, and the attachment node as the zone's gateway; the root
  zone routes every pair of attachment nodes over the planner's own shortest path between
  them. A pair of ranks thus crosses ``up[i] + core[a][b] + down[j]``, exactly
  :attr:`Topology.routes`, while the platform holds ``A**2`` routes for ``A`` attachment nodes
  (the hosts of a multi-GPU cluster) instead of one per pair of ranks: 1024 ranks on 128
  hosts build in about a second where the per-pair routes took minutes.
- Measured form: one host per rank; every resource (the pair link ``i -> j`` with the pair's
  latency, each rank's egress and ingress, each shared bottleneck) becomes a simplex link, and
  the pair ``i -> j`` routes over its route's resources, as the planner's model has it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from ..probe.hostinfer import generated_hosts
from ..topology import HostRoutes, Topology
from .actors import Simulation

__all__ = ["Platform", "build_platform", "processor_names", "resource_latencies", "link_name",
           "set_link_rate"]

# A host's speed in flops (unused by the costs, which are charged as simulated sleeps; SimGrid
# needs one).
HOST_FLOPS = 1e9
# SimGrid's implicit loopback link (10 GBps, FATPIPE, network/loopback-bw): what a full zone
# gives two actors of one host, named here for the star zones, which add no loopback of their
# own.
LOOPBACK = "__loopback__"


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
        ``names[i]``: rank ``i``'s ``processor_name`` (:func:`processor_names`).
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


def link_name(topology: Topology, resource: int) -> str:
    """The SimGrid name of the link that :func:`build_platform` makes for ``resource`` (an
    index into ``topology.resources``): unique, and readable in SimGrid's messages."""
    return f"{resource}:{topology.resources[resource]}"


def set_link_rate(transport: Any, topology: Topology, resource: Union[int, str],
                  rate_Bps: float, at_s: Optional[float] = None) -> None:
    """Change the rate of ``resource``'s simulated link, now or at simulated time ``at_s``.

    Call it from inside a rank (a SimGrid actor: ``transport`` is its
    :class:`~horotopo.transport.simulated.SimulatedTransport`), on one rank only. A lower rate
    applies to transfers in flight too (SimGrid re-shares the link at once); a higher one only
    to transfers that start after it (SimGrid 3.32 keeps a flow's rate bound from its start:
    a 1 MiB transfer slowed to a quarter stayed at a quarter when the rate came back in
    flight). The transports' cached bandwidth-delay products are not updated. With ``at_s``, a
    helper actor on the rank's host sleeps until that simulated time and makes the change,
    while the ranks go on (an ``at_s`` in the past changes it at once).

    Parameters
    ----------
    transport : SimulatedTransport
    topology : Topology
        The topology the platform was built from.
    resource : int or str
        Index into ``topology.resources``, or its name (``"tor0->spine"``: one direction of
        a declared link).
    rate_Bps : float
        The new rate, bytes/s.
    at_s : float, optional
        Simulated time of the change (default: now).

    Raises
    ------
    ValueError
        An unknown resource name or index, or a rate that is not positive.
    """
    if isinstance(resource, str):
        try:
            resource = topology.resources.index(resource)
        except ValueError:
            raise ValueError(f"{topology.name} has no resource {resource!r}") from None
    if not 0 <= int(resource) < len(topology.resources):
        raise ValueError(f"resource index {resource} is not in 0..{len(topology.resources) - 1}")
    if not rate_Bps > 0:
        raise ValueError(f"rate must be positive, got {rate_Bps!r}")
    sg = transport.sim.sg
    link = sg.Link.by_name(link_name(topology, int(resource)))
    if at_s is None or at_s <= sg.Engine.clock:
        link.set_bandwidth(float(rate_Bps))
        return

    def change() -> None:
        sg.this_actor.sleep_until(float(at_s))
        link.set_bandwidth(float(rate_Bps))

    sg.Actor.create(f"rate-change-{resource}", sg.Host.current(), change)


def build_platform(sim: Simulation, topology: Topology) -> Platform:
    """Build ``topology`` on ``sim``'s zone and seal it; returns where each rank runs."""
    zone = sim.zone
    lat = resource_latencies(topology)
    links = []
    for r, (name, cap) in enumerate(zip(topology.resources, topology.capacity_Bps)):
        link = zone.create_link(link_name(topology, r), [float(cap)])
        link.set_latency(lat[r])
        links.append(link.seal())
    if isinstance(topology.routes, HostRoutes):
        hosts = _declared(sim, topology, topology.routes, links)
    else:
        hosts = _per_pair(sim, topology, links)
    zone.seal()
    return Platform(sim=sim, hosts=hosts, names=processor_names(topology), links=links)


def processor_names(topology: Topology) -> List[str]:
    """Each rank's processor name in a simulation: its machine's, as MPI names a node's ranks.

    A declared multi-GPU host is a switch with its GPU ranks hanging from it
    (:func:`horotopo.probe.hostinfer.generated_hosts`: ``<host>g<k>`` under ``<host>``); its
    ranks are named by that host, so the probe groups them into one host as on a real cluster.
    Any other rank, and every rank of a measured topology, is named by its node.
    """
    if topology.kind != "declared":
        return list(topology.hosts)
    return generated_hosts(topology.to_json())


def _declared(sim: Simulation, topology: Topology, routes: HostRoutes,
              links: Sequence[Any]) -> List[Any]:
    """Star zones per attachment node under the root's routes between them (module doc)."""
    sg, root = sim.sg, sim.zone

    def via(resources: Sequence[int]) -> List[Any]:
        return [sg.LinkInRoute(links[r]) for r in resources]

    # The nodes attached at each attachment node, each with its first rank (its leaf links).
    members: Dict[int, Dict[int, int]] = defaultdict(dict)
    shared = defaultdict(int)
    for i, (node, a) in enumerate(zip(routes.node, routes.attach)):
        members[a].setdefault(node, i)
        shared[node] += 1
    loopback = sg.Link.by_name(LOOPBACK) if any(c > 1 for c in shared.values()) else None
    endpoint: Dict[int, Any] = {}
    zones: Dict[int, Any] = {}
    gateways: Dict[int, Any] = {}
    for a in sorted(members):
        sub = sg.NetZone.create_star_zone(f"attach{a}")
        sub.set_parent(root)
        gw = sub.create_router(f"attach{a}-gw")
        sub.add_route(gw, None, None, None, [], False)
        sub.add_route(None, gw, None, None, [], False)
        for node, i in sorted(members[a].items()):
            host = sub.create_host(topology.hosts[i], HOST_FLOPS)
            up = [routes.up[i]] if routes.up[i] >= 0 else []
            down = [routes.down[i]] if routes.down[i] >= 0 else []
            sub.add_route(host.netpoint, None, None, None, via(up), False)
            sub.add_route(None, host.netpoint, None, None, via(down), False)
            if shared[node] > 1:
                sub.add_route(host.netpoint, host.netpoint, None, None,
                              [sg.LinkInRoute(loopback)], False)
            endpoint[node] = host
        sub.seal()
        zones[a], gateways[a] = sub, gw
    for a in zones:
        for b in zones:
            if a != b:
                root.add_route(zones[a].netpoint, zones[b].netpoint, gateways[a], gateways[b],
                               via(routes.core[a][b]), False)
    return [endpoint[node] for node in routes.node]


def _per_pair(sim: Simulation, topology: Topology, links: Sequence[Any]) -> List[Any]:
    """One host per rank, every ordered pair routed over its resources (the measured form)."""
    sg, zone = sim.sg, sim.zone
    n = topology.n
    hosts = [zone.create_host(f"rank{i}", HOST_FLOPS) for i in range(n)]
    for i in range(n):
        for j in range(n):
            if i != j:
                zone.add_route(hosts[i].netpoint, hosts[j].netpoint, None, None,
                               [sg.LinkInRoute(links[r]) for r in topology.routes[i][j]], False)
    return hosts
