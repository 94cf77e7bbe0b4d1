"""Topology documents for tests, benchmarks, the emulator and the simulator.

Each function returns a plain JSON document (declared or measured form, docs/topology.md) that
:func:`horotopo.topology.from_dict` loads; the same seed gives the same document.

Small random networks: :func:`uniform_star`, :func:`racks`, :func:`random_declared`,
:func:`random_measured`. Realistic large clusters, for the simulator (:data:`GENERATORS`, by
name through :func:`generate`): :func:`rack_cluster` (racks of multi-GPU hosts, oversubscribed
top-of-rack uplinks, a fraction of slower NICs), :func:`fat_tree` (two-level leaf-spine) and
:func:`two_sites` (two rack clusters behind a slow WAN link).

How a multi-GPU host is declared: the host is a switch (``r0h1``) and each of its ``gpus``
ranks a node (``r0h1g0``...) on a *local* link to it (NVLink or PCIe, fast); the host's NIC is
the link from that switch to the top-of-rack switch, so the host's ranks share it, and the
local fabric is a resource the planner and the simulator both see.
Ranks are numbered host by host, as ``mpirun`` fills a host's slots before the next host's.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["racks", "random_declared", "random_measured", "uniform_star", "rack_cluster",
           "fat_tree", "two_sites", "GENERATORS", "generate", "parse_spec",
           "describe_generators", "SCALE_TABLE_SPECS"]


def uniform_star(n: int, gbps: float = 1.0) -> Dict[str, Any]:
    """``n`` hosts on one switch, every NIC at ``gbps``."""
    hosts = [f"h{i}" for i in range(n)]
    return {"name": f"uniform-star-{n}", "switches": ["sw"],
            "links": [{"ends": [h, "sw"], "gbps": gbps} for h in hosts], "ranks": hosts}


def racks(sizes: List[int], nic_gbps: float = 1.0, uplink_gbps: float = 0.25,
          interleave: bool = True) -> Dict[str, Any]:
    """Racks of hosts, one top-of-rack switch each, every ToR on one spine by an uplink.

    With ``interleave`` the rank order alternates racks, as a scheduler that ignores the
    topology would place them (the worst case for a ring in rank order).
    """
    switches = ["spine"] + [f"tor{k}" for k in range(len(sizes))]
    links: List[Dict[str, Any]] = []
    per_rack: List[List[str]] = []
    for k, size in enumerate(sizes):
        hosts = [f"r{k}h{i}" for i in range(size)]
        per_rack.append(hosts)
        links += [{"ends": [h, f"tor{k}"], "gbps": nic_gbps} for h in hosts]
        links.append({"ends": [f"tor{k}", "spine"], "gbps": uplink_gbps})
    if interleave:
        ranks = [rack[i] for i in range(max(sizes)) for rack in per_rack if i < len(rack)]
    else:
        ranks = [h for rack in per_rack for h in rack]
    return {"name": f"racks-{'x'.join(map(str, sizes))}", "switches": switches,
            "links": links, "ranks": ranks}


def random_declared(n: int, seed: int, racks_max: int = 4,
                    gbps_range: tuple = (0.1, 1.0)) -> Dict[str, Any]:
    """A random two-level switch tree: hosts with random (possibly asymmetric) NIC rates in
    random racks, racks joined to a spine by random uplinks. Some hosts carry two ranks."""
    rng = np.random.default_rng(seed)
    lo, hi = gbps_range
    k = int(rng.integers(1, min(racks_max, n) + 1))
    n_hosts = max(2, n - int(rng.integers(0, max(1, n // 4) + 1))) if n > 1 else 1
    hosts = [f"h{i}" for i in range(n_hosts)]
    rack_of = rng.integers(0, k, size=n_hosts)
    switches = ["spine"] + [f"tor{j}" for j in range(k)]

    def rate() -> Any:
        a = round(float(rng.uniform(lo, hi)), 3)
        if rng.random() < 0.3:
            return [a, round(float(rng.uniform(lo, hi)), 3)]
        return a

    links = [{"ends": [h, f"tor{rack_of[i]}"], "gbps": rate()} for i, h in enumerate(hosts)]
    links += [{"ends": [f"tor{j}", "spine"], "gbps": rate()} for j in range(k)]
    ranks = list(hosts) + [hosts[int(i)] for i in rng.integers(0, n_hosts, size=n - n_hosts)]
    rng.shuffle(ranks)
    return {"name": f"random-declared-{n}-{seed}", "switches": switches, "links": links,
            "ranks": ranks[:n]}


def random_measured(n: int, seed: int, gbps_range: tuple = (0.1, 1.0),
                    host_caps: bool = True, shared: Optional[int] = None) -> Dict[str, Any]:
    """A random measured-form document: pair rates, optional egress/ingress caps, and
    ``shared`` random shared bottlenecks over groups of cross pairs."""
    rng = np.random.default_rng(seed)
    lo, hi = gbps_range
    bw = rng.uniform(lo, hi, size=(n, n)).round(3)
    lat = rng.uniform(0.01, 0.2, size=(n, n)).round(3)
    doc: Dict[str, Any] = {
        "name": f"random-measured-{n}-{seed}", "ranks": [f"m{i}" for i in range(n)],
        "bandwidth_gbps": [[None if i == j else float(bw[i, j]) for j in range(n)]
                           for i in range(n)],
        "latency_ms": [[None if i == j else float(lat[i, j]) for j in range(n)]
                       for i in range(n)]}
    if host_caps:
        doc["egress_gbps"] = [float(v) for v in rng.uniform(lo, hi, size=n).round(3)]
        doc["ingress_gbps"] = [float(v) for v in rng.uniform(lo, hi, size=n).round(3)]
    groups = shared if shared is not None else (1 if n >= 4 else 0)
    if groups and n >= 2:
        doc["shared"] = []
        for _ in range(groups):
            side = rng.permutation(n)
            a, b = side[: n // 2], side[n // 2:]
            pairs = [[int(i), int(j)] for i in a for j in b]
            doc["shared"].append({"pairs": pairs,
                                  "gbps": round(float(rng.uniform(lo, hi)), 3)})
    return doc


# ---- realistic clusters for the simulator ---------------------------------------------------

#: Default one-way latencies (ms) of the generated links: a host's local fabric, a NIC or switch
#: hop inside a data centre, and the WAN between two sites.
LOCAL_LATENCY_MS = 0.001
HOP_LATENCY_MS = 0.002
WAN_LATENCY_MS = 5.0


def _hosts(n: int, gpus: int) -> List[int]:
    """GPUs per host: ``ceil(n / gpus)`` hosts, the last one holding what is left."""
    if n < 1:
        raise ValueError(f"a cluster needs at least one rank, got {n}")
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}")
    full, rest = divmod(n, gpus)
    return [gpus] * full + ([rest] if rest else [])


def _cluster(prefix: str, n: int, *, hosts_per_rack: int, gpus: int, nic_gbps: float,
             local_gbps: float, uplink_gbps: Callable[[float], float], slow: float,
             slow_gbps: Optional[float], seed: int) -> Tuple[List[str], List[Dict[str, Any]],
                                                             List[str], str]:
    """Racks of hosts under one top switch: (switches, links, ranks, top switch name).

    ``uplink_gbps(sum of the rack's NIC rates)`` gives each rack's uplink."""
    if hosts_per_rack < 1:
        raise ValueError(f"hosts_per_rack must be at least 1, got {hosts_per_rack}")
    if not 0.0 <= slow <= 1.0:
        raise ValueError(f"slow must be a fraction in [0, 1], got {slow}")
    per_host = _hosts(n, gpus)
    rng = np.random.default_rng(seed)
    n_slow = int(round(slow * len(per_host)))
    slow_hosts = set(int(h) for h in rng.choice(len(per_host), size=n_slow, replace=False))
    slow_rate = nic_gbps / 4 if slow_gbps is None else slow_gbps
    top = f"{prefix}spine"
    switches = [top]
    links: List[Dict[str, Any]] = []
    ranks: List[str] = []
    n_racks = math.ceil(len(per_host) / hosts_per_rack)
    for k in range(n_racks):
        tor = f"{prefix}tor{k}"
        switches.append(tor)
        rack_nics = 0.0
        for h in range(k * hosts_per_rack, min((k + 1) * hosts_per_rack, len(per_host))):
            host = f"{prefix}r{k}h{h - k * hosts_per_rack}"
            nic = slow_rate if h in slow_hosts else nic_gbps
            rack_nics += nic
            links.append({"ends": [host, tor], "gbps": nic, "latency_ms": HOP_LATENCY_MS})
            if gpus == 1:
                ranks.append(host)
                continue
            switches.append(host)
            for g in range(per_host[h]):
                gpu = f"{host}g{g}"
                links.append({"ends": [gpu, host], "gbps": local_gbps,
                              "latency_ms": LOCAL_LATENCY_MS})
                ranks.append(gpu)
        links.append({"ends": [tor, top], "gbps": round(uplink_gbps(rack_nics), 6),
                      "latency_ms": HOP_LATENCY_MS})
    return switches, links, ranks, top


def _check_oversub(oversub: float) -> None:
    if not oversub > 0:
        raise ValueError(f"oversub must be positive, got {oversub}")


def rack_cluster(n: int, *, hosts_per_rack: int = 4, gpus: int = 1, nic_gbps: float = 10.0,
                 local_gbps: float = 100.0, oversub: float = 1.0, slow: float = 0.0,
                 slow_gbps: Optional[float] = None, seed: int = 0) -> Dict[str, Any]:
    """Racks of hosts with ``gpus`` ranks each, every rack's top-of-rack switch on one spine.

    Parameters
    ----------
    n : int
        Ranks (hosts are filled ``gpus`` at a time; the last may hold fewer).
    hosts_per_rack : int
        Hosts under each top-of-rack switch.
    gpus : int
        Ranks per host; they share the host's NIC and talk over a ``local_gbps`` link each.
    nic_gbps, local_gbps : float
        A host's NIC, and each rank's link to its host's local fabric.
    oversub : float
        Oversubscription of the top-of-rack uplinks: each rack's uplink carries the sum of its
        hosts' NIC rates divided by ``oversub`` (1: non-blocking).
    slow : float
        Fraction of the hosts whose NIC runs at ``slow_gbps`` (default a quarter of
        ``nic_gbps``): an older NIC generation, placed at random by ``seed``.
    """
    _check_oversub(oversub)
    switches, links, ranks, _ = _cluster(
        "", n, hosts_per_rack=hosts_per_rack, gpus=gpus, nic_gbps=nic_gbps,
        local_gbps=local_gbps, uplink_gbps=lambda nics: nics / oversub, slow=slow,
        slow_gbps=slow_gbps, seed=seed)
    return {"name": f"racks-{n}-h{hosts_per_rack}-g{gpus}-o{oversub:g}"
                    + (f"-slow{slow:g}" if slow else ""),
            "switches": switches, "links": links, "ranks": ranks}


def fat_tree(n: int, *, hosts_per_leaf: int = 8, spines: int = 4,
             spine_gbps: Optional[float] = None, gpus: int = 1, nic_gbps: float = 10.0,
             local_gbps: float = 100.0, seed: int = 0) -> Dict[str, Any]:
    """A two-level fat tree (leaf-spine): hosts on leaf switches, every leaf wired to each of
    ``spines`` spine switches by a ``spine_gbps`` link (default: full bisection,
    ``hosts_per_leaf * nic_gbps / spines``).

    The planner and the simulator route each pair over one path, so ECMP across the spines is
    modelled as perfect spreading: one aggregate link per leaf of ``spines * spine_gbps`` to a
    single core switch, the flow-level limit of hashing many flows over the spines.
    """
    if spines < 1:
        raise ValueError(f"spines must be at least 1, got {spines}")
    per_link = spine_gbps

    def uplink(nics: float) -> float:
        return spines * (per_link if per_link is not None
                         else hosts_per_leaf * nic_gbps / spines)

    switches, links, ranks, _ = _cluster(
        "", n, hosts_per_rack=hosts_per_leaf, gpus=gpus, nic_gbps=nic_gbps,
        local_gbps=local_gbps, uplink_gbps=uplink, slow=0.0, slow_gbps=None, seed=seed)
    return {"name": f"fattree-{n}-l{hosts_per_leaf}-s{spines}-g{gpus}", "switches": switches,
            "links": links, "ranks": ranks}


def two_sites(n: int, *, wan_gbps: float = 1.0, wan_latency_ms: float = WAN_LATENCY_MS,
              hosts_per_rack: int = 4, gpus: int = 1, nic_gbps: float = 10.0,
              local_gbps: float = 100.0, oversub: float = 1.0, seed: int = 0
              ) -> Dict[str, Any]:
    """Two rack clusters (:func:`rack_cluster`; ``n // 2`` ranks and the rest) whose spines are
    joined by one WAN link of ``wan_gbps`` and ``wan_latency_ms``; site A's ranks first."""
    if n < 2:
        raise ValueError(f"two sites need at least 2 ranks, got {n}")
    _check_oversub(oversub)
    switches: List[str] = []
    links: List[Dict[str, Any]] = []
    ranks: List[str] = []
    tops = []
    for prefix, count in (("a-", n // 2), ("b-", n - n // 2)):
        sw, ln, rk, top = _cluster(
            prefix, count, hosts_per_rack=hosts_per_rack, gpus=gpus, nic_gbps=nic_gbps,
            local_gbps=local_gbps, uplink_gbps=lambda nics: nics / oversub, slow=0.0,
            slow_gbps=None, seed=seed)
        switches += sw
        links += ln
        ranks += rk
        tops.append(top)
    links.append({"ends": tops, "gbps": wan_gbps, "latency_ms": wan_latency_ms})
    return {"name": f"sites-{n}-wan{wan_gbps:g}", "switches": switches, "links": links,
            "ranks": ranks}


#: The cluster generators by the name ``horotopo simulate NAME:key=value,... --ranks N`` uses.
GENERATORS: Dict[str, Callable[..., Dict[str, Any]]] = {
    "racks": rack_cluster, "fattree": fat_tree, "sites": two_sites}


#: The clusters of the scale table (8-GPU hosts: racks with 4:1 uplinks and a quarter of the
#: NICs slow, the same racks without slow NICs, a fat tree, two sites over a 10 gbps WAN): the
#: rows that benchmarks/scale_sim.py, predict_check.py, forest_kinds.py and planner_scale.py
#: share, so that their tables describe the same clusters.
SCALE_TABLE_SPECS: Tuple[str, ...] = ("racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25",
                                      "racks:hosts_per_rack=4,gpus=8,oversub=4",
                                      "fattree:hosts_per_leaf=8,spines=4,gpus=8",
                                      "sites:gpus=8,wan_gbps=10")

def _value(text: str) -> Any:
    """A parameter's value: an int, a float, true/false, or the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_spec(spec: str) -> Tuple[str, Dict[str, Any]]:
    """``"racks:gpus=8,oversub=4"`` -> ``("racks", {"gpus": 8, "oversub": 4})``.

    Raises
    ------
    ValueError
        Not a generator's name, or a parameter it does not take (the message lists them).
    """
    name, _, params = spec.partition(":")
    if name not in GENERATORS:
        raise ValueError(f"no cluster generator {name!r}; generators: "
                         f"{', '.join(GENERATORS)}")
    known = [p for p in inspect.signature(GENERATORS[name]).parameters if p != "n"]
    kwargs: Dict[str, Any] = {}
    for item in filter(None, params.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in known:
            raise ValueError(f"{name}: {item!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(known)}")
        kwargs[key] = _value(value)
    return name, kwargs


def generate(spec: str, n: int) -> Dict[str, Any]:
    """The declared topology of ``n`` ranks that the generator ``spec`` describes (see
    :func:`parse_spec`)."""
    name, kwargs = parse_spec(spec)
    return GENERATORS[name](n, **kwargs)


def describe_generators() -> str:
    """One line per generator: its name and parameters with their defaults (for --help)."""
    lines = []
    for name, fn in GENERATORS.items():
        params = [f"{p.name}={p.default}" for p in inspect.signature(fn).parameters.values()
                  if p.name != "n"]
        lines.append(f"  {name}: {', '.join(params)}")
    return "\n".join(lines)
