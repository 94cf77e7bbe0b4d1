"""Random topology documents for tests, benchmarks and the emulator.

Each function returns a plain JSON document (declared or measured form of DESIGN.md) that
:func:`horotopo.topology.from_dict` loads; the same seed gives the same document.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

__all__ = ["racks", "random_declared", "random_measured", "uniform_star"]


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
