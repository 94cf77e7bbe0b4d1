"""The pure half of the probe by hosts (:mod:`horotopo.probe.hosts`): which ranks share a host,
what the concurrent rounds between host leaders say, and the measured-topology document.

- :func:`host_layout`: hosts by processor name (as ``local_rank`` groups ranks), each with its
  ranks and its leader (its lowest rank).
- :func:`depression`: how far each concurrent host-pair figure lies below what its two hosts
  reach at best (their fastest figures out and in).
- :func:`host_groups`: hosts whose pairs kept their rate when the whole round ran at once,
  grouped (a rack behind an oversubscribed uplink, one side of a WAN link), the hosts that
  reach the fastest rate first and the slower ones placed by them.
- :func:`group_flows`: the flows of a group test (a group's hosts to hosts of other groups).
- :func:`alone_estimates`: the host-pair rates alone, from the concurrent figures, the shared
  links found and the pairs measured alone.
- :func:`rank_document`: the measured-form document (docs/topology.md) over ranks, from host
  figures.

Rates are in one unit chosen by the caller (the probe passes gbps); only ratios matter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..params import PROBE, ProbeParams
from ..topology import measured_document
from .cluster import single_linkage_groups
from .pairing import Pair, round_robin

__all__ = ["HostLayout", "host_layout", "generated_hosts", "depression", "host_groups", "group_flows",
           "unproven_hosts", "fan_flows", "alone_estimates", "rank_document", "SharedLink",
           "fastest_out_and_in"]

# A shared link in host terms: (source hosts, destination hosts, capacity, label); it carries
# every transfer from a rank of a source host to a rank of a destination host.
SharedLink = Tuple[Tuple[int, ...], Tuple[int, ...], float, str]



@dataclass(frozen=True)
class HostLayout:
    """Which ranks share a host.

    Attributes
    ----------
    names : tuple of str
        Host names, ordered by each host's lowest rank.
    members : tuple of tuple of int
        ``members[h]``: the ranks on host ``h``, ascending; ``members[h][0]`` is its leader.
    host_of : tuple of int
        ``host_of[i]``: the host of rank ``i``.
    """

    names: Tuple[str, ...]
    members: Tuple[Tuple[int, ...], ...]
    host_of: Tuple[int, ...]

    @property
    def leaders(self) -> Tuple[int, ...]:
        return tuple(m[0] for m in self.members)


def host_layout(processor_names: Sequence[str]) -> HostLayout:
    """The hosts of ranks whose processor names are ``processor_names`` (rank order)."""
    index: Dict[str, int] = {}
    members: List[List[int]] = []
    host_of = []
    for rank, name in enumerate(processor_names):
        h = index.setdefault(str(name), len(index))
        if h == len(members):
            members.append([])
        members[h].append(rank)
        host_of.append(h)
    return HostLayout(tuple(index), tuple(tuple(m) for m in members), tuple(host_of))


def generated_hosts(doc: Mapping[str, Any]) -> List[str]:
    """Each rank's host in a declared document of :mod:`horotopo.generate`'s clusters: a rank
    node ``<S>g<k>`` linked to the switch ``<S>`` runs on host ``<S>`` (how those documents
    declare a multi-GPU host); any other rank runs on its own node. For a simulation, whose
    ranks' processor names are their nodes."""
    switches = set(doc.get("switches", []))
    linked = {(str(a), str(b)) for link in doc.get("links", []) for a, b in
              (link["ends"], link["ends"][::-1])}
    out = []
    for node in doc["ranks"]:
        stem, sep, tail = str(node).rpartition("g")
        out.append(stem if sep and tail.isdigit() and stem in switches
                   and (str(node), stem) in linked else str(node))
    return out


def fastest_out_and_in(rates: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(fastest figure out of each host, fastest into each host), NaN ignored."""
    with np.errstate(all="ignore"):
        return np.nanmax(rates, axis=1), np.nanmax(rates, axis=0)


def _nics(rates: np.ndarray, nic: Optional[Tuple[Sequence[float], Sequence[float]]]
          ) -> Tuple[np.ndarray, np.ndarray]:
    """Each host's NIC (out, in): ``nic`` where the fan tests gave it, else the best figures."""
    if nic is None:
        return fastest_out_and_in(rates)
    return np.asarray(nic[0], dtype=float), np.asarray(nic[1], dtype=float)


def depression(concurrent: Any) -> np.ndarray:
    """``concurrent[a, b] / min(best out of a, best into b)``: 1 for a pair that kept the rate
    its hosts reach at best, lower where something it shared with the round held it back
    (NaN on the diagonal). A slow NIC is its host's best too, so it does not read as shared."""
    c = np.asarray(concurrent, dtype=float)
    out, inn = fastest_out_and_in(c)
    with np.errstate(all="ignore"):
        return c / np.minimum(out[:, None], inn[None, :])


def host_groups(concurrent: Any, margin: float,
                params: ProbeParams = PROBE) -> List[List[int]]:
    """Hosts grouped by the pairs that kept their rate in the concurrent rounds.

    A pair kept its rate when, both ways, it reached at least ``1 - margin`` of its best
    (:func:`depression`). Behind oversubscribed uplinks the hosts of a rack keep their rate
    with each other and lose it to everyone else, so a rack is a group. But a pair capped by a
    slow NIC keeps its low rate through a loaded uplink as well, wherever the slow host sits;
    counted alike, a fast host's chance partners among the slow NICs outnumber its rack mates,
    and its rack falls apart. So the hosts are placed in three steps:

    1. The hosts that reach the fastest rate seen (their best figures out and in within
       ``margin`` of it) are grouped by their pairs among themselves
       (:func:`_profile_groups`).
    2. Every other host joins the one group with all of whose hosts it kept its rate: a slow
       NIC keeps its rate with its rack mates, with another rack's hosts only where each of
       their pairs met a light round. A host kept with every host of several groups (the
       uplinks' shares reach its NIC) is placed by nothing and stays a group of its own.
    3. The hosts kept with no group entirely (a rack whose uplink held back even its slow
       NICs) are grouped among themselves as in step 1.
    """
    c = np.asarray(concurrent, dtype=float)
    r = depression(c)
    n = r.shape[0]
    kept = (r >= 1.0 - margin) & (r.T >= 1.0 - margin)
    np.fill_diagonal(kept, True)
    out, inn = fastest_out_and_in(c)
    with np.errstate(invalid="ignore"):
        reach = np.fmin(out, inn)
        fastest = (reach >= (1.0 - margin) * np.nanmax(reach)) if np.isfinite(reach).any() \
            else np.zeros(n, dtype=bool)
    groups = _profile_groups(kept, [int(x) for x in np.flatnonzero(fastest)], params)
    joined: List[List[int]] = [[] for _ in groups]
    unplaced: List[int] = []
    alone: List[List[int]] = []
    for h in (int(x) for x in np.flatnonzero(~fastest)):
        fits = [k for k, g in enumerate(groups) if kept[h, g].all()]
        if len(fits) == 1:
            joined[fits[0]].append(h)
        elif fits:
            alone.append([h])
        else:
            unplaced.append(h)
    groups = [g + extra for g, extra in zip(groups, joined)]
    groups += alone + _profile_groups(kept, unplaced, params)
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def _profile_groups(kept_all: np.ndarray, nodes: List[int],
                    params: ProbeParams) -> List[List[int]]:
    """``nodes`` grouped by ``kept_all`` (which pairs kept their rate) among them: two hosts
    are linked when their pair kept its rate and the sets of hosts each kept its rate with
    overlap by at least ``params.group_overlap`` (Jaccard); the groups are the connected
    components, each split again with a stricter overlap while fewer than
    ``params.group_density`` of its own pairs kept their rate."""
    if not nodes:
        return []
    kept = kept_all[np.ix_(nodes, nodes)].copy()
    n = len(nodes)
    sizes = kept.sum(axis=1)
    # A host that kept its rate with far more hosts than is usual (below every share the
    # rounds left it) says nothing about where it sits: it stays a group of its own.
    universal = sizes > params.universal_ratio * np.median(sizes)
    kept[universal, :] = kept[:, universal] = False
    kept[np.arange(n), np.arange(n)] = True
    sizes = kept.sum(axis=1)
    both = kept.astype(np.int64) @ kept.astype(np.int64)
    overlap = both / (sizes[:, None] + sizes[None, :] - both)

    def split(part_nodes: List[int], threshold: float) -> List[List[int]]:
        sub = np.ix_(part_nodes, part_nodes)
        linked = (kept[sub] & (overlap[sub] >= threshold)).astype(float)
        found: List[List[int]] = []
        for part in single_linkage_groups(linked, 0.5):
            members = [part_nodes[v] for v in part]
            inside = kept[np.ix_(members, members)]
            dense = (inside.sum() - len(members)) / max(1, len(members) * (len(members) - 1))
            # A group whose own pairs lost their rate is two groups that a host kept with
            # both: ask for more overlap inside it.
            if dense < params.group_density and threshold < 1.0:
                found += split(members, min(1.0, threshold + params.group_overlap_step))
            else:
                found.append(members)
        return found

    return [[nodes[v] for v in g] for g in split(list(range(n)), params.group_overlap)]


def group_flows(groups: Sequence[Sequence[int]], g: int, outgoing: bool,
                speed: Optional[Sequence[float]] = None) -> List[Pair]:
    """The flows of the test of group ``g``'s link out (or in): each host of the group paired
    with a host of another group, the other groups taken in turn so that each of their links
    carries as few of the flows as can be, and within each group its fastest hosts first
    (``speed``: each host's best figure into it, or out of it for a link in; a slow NIC at
    the far end would cap its flow below the link's share). The hosts of groups of several
    come first, those of groups of one last: a host alone in its group was placed by nothing
    (a slow NIC keeps its rate through any uplink) and may sit behind the very link under
    test, where a flow to it would not cross that link and would add its rate to the link's,
    reading the link faster than it is. Fewer than two flows: no test
    (empty)."""
    mine = sorted(groups[g])

    def order(x: Sequence[int]) -> List[int]:
        return sorted(x) if speed is None else sorted(x, key=lambda v: (-speed[v], v))

    rest = [order(x) for k, x in enumerate(groups) if k != g]
    others = (round_robin([x for x in rest if len(x) > 1])
              + round_robin([x for x in rest if len(x) == 1]))
    m = min(len(mine), len(others))
    if m < 2:
        return []
    return [(mine[k], others[k]) if outgoing else (others[k], mine[k]) for k in range(m)]


def unproven_hosts(concurrent: Any, shared: Sequence[SharedLink], margin: float,
                   outgoing: bool = True) -> List[int]:
    """The hosts whose NIC out (or in) the rounds did not show: a host's best figure is
    clearly below the fastest host's, and no pair of it that reached that figure had a
    clearly faster partner (at its other end's best figure) and crossed no shared link. Such
    a host may be a fast NIC whose every partner was slower than it (a fast host in a rack of
    slow NICs behind an oversubscribed uplink reads as slow), which only a fan of flows can
    tell (:func:`fan_flows`); a slow NIC that reached its figure towards a faster host is
    shown slow."""
    c = np.asarray(concurrent, dtype=float)
    if not outgoing:
        c = c.T
    out, inn = fastest_out_and_in(c)
    if not np.isfinite(out).any():
        return []
    top = np.nanmax(out)
    covered = np.zeros(c.shape, dtype=bool)
    for src, dst, _, _ in shared:
        a, b = (src, dst) if outgoing else (dst, src)
        covered[np.ix_(list(a), list(b))] = True
    found = []
    for h in range(len(out)):
        if not (np.isfinite(out[h]) and out[h] < (1 - margin) * top):
            continue
        shown = (c[h] >= (1 - margin) * out[h]) & (inn * (1 - margin) >= out[h]) & ~covered[h]
        if not shown.any():
            found.append(h)
    return found


def fan_flows(h: int, outgoing: bool, speed: Sequence[float], shared: Sequence[SharedLink],
              want: float, limit: int = PROBE.fan_partners) -> Tuple[List[Pair], List[float]]:
    """The flows of a fan test of host ``h``'s NIC out (or in), and each flow's expected rate.

    Partners are taken fastest first (``speed``: each host's best figure into it, or out of it
    for a fan in), each expected at the least of its speed and what is left of every shared
    link between it and ``h`` (a rack's uplink carries the fan's flows through it together),
    until the expected rates add up to ``want`` (more than ``h``'s NIC can carry if it is as
    fast as the fastest seen) or ``limit`` partners. Partners that add nothing are skipped.
    """
    left = [float(cap) for _, _, cap, _ in shared]
    order = sorted((x for x in range(len(speed)) if x != h and np.isfinite(speed[x])),
                   key=lambda x: (-speed[x], x))
    flows: List[Pair] = []
    expected: List[float] = []
    for x in order:
        if sum(expected) >= want or len(flows) >= limit:
            break
        pair = (h, x) if outgoing else (x, h)
        crossed = [k for k, (src, dst, _, _) in enumerate(shared)
                   if pair[0] in src and pair[1] in dst]
        rate = min([float(speed[x])] + [left[k] for k in crossed])
        if rate <= 0:
            continue
        for k in crossed:
            left[k] -= rate
        flows.append(pair)
        expected.append(rate)
    return flows, expected


def alone_estimates(concurrent: Any, groups: Sequence[Sequence[int]],
                    shared: Sequence[SharedLink], alone: Mapping[Pair, float],
                    nic: Optional[Tuple[Sequence[float], Sequence[float]]] = None
                    ) -> np.ndarray:
    """The rate of every host pair alone.

    A concurrent figure is what the pair got beside the rest of its round; where no shared
    link found covers the pair, nothing it shared with the round held it back, and the figure
    stands. A pair that crosses shared links got a share of them that depended on its round,
    so its rate alone is estimated: the fastest its source sends and its destination receives
    (their best figures) within the capacity of every shared link it crosses, and never below
    what it got concurrently. Pairs measured alone (``alone``) keep their measured figure.
    ``nic`` (each host's NIC out and in, where fan tests measured more than the best figures)
    replaces the best figures.
    """
    c = np.asarray(concurrent, dtype=float)
    out, inn = _nics(c, nic)
    est = c.copy()
    n = c.shape[0]
    cap = np.full((n, n), np.inf)
    for src, dst, gbps, _ in shared:
        sub = np.ix_(list(src), list(dst))
        cap[sub] = np.minimum(cap[sub], gbps)
    covered = np.isfinite(cap)
    bound = np.minimum(np.minimum(out[:, None], inn[None, :]), cap)
    est[covered] = np.fmax(c[covered], bound[covered])
    for (a, b), v in alone.items():
        est[a, b] = v
    np.fill_diagonal(est, np.nan)
    return est


def _expand(values: Sequence[Sequence[Optional[float]]], layout: HostLayout,
            local: Sequence[Optional[Sequence[Sequence[Optional[float]]]]]
            ) -> List[List[Optional[float]]]:
    """A rank matrix from a host matrix (ranks on different hosts) and each host's own matrix
    over its ranks (``local[h]``, None for a host with one rank)."""
    host_of = layout.host_of
    slot = [0] * len(host_of)
    for m in layout.members:
        for u, rank in enumerate(m):
            slot[rank] = u
    n = len(host_of)
    rows = []
    for i in range(n):
        hi, ui = host_of[i], slot[i]
        row_h = values[hi]
        loc = local[hi]
        rows.append([None if i == j else
                     (loc[ui][slot[j]] if host_of[j] == hi and loc is not None
                      else row_h[host_of[j]]) for j in range(n)])
    return rows


def rank_document(name: str, layout: HostLayout, host_gbps: Any, host_latency_ms: Any,
                  local_gbps: Sequence[Optional[Any]], local_latency_ms: Sequence[Optional[Any]],
                  shared: Sequence[SharedLink], meta: Mapping[str, Any],
                  nic_gbps: Optional[Tuple[Sequence[float], Sequence[float]]] = None
                  ) -> Dict[str, Any]:
    """The measured-form document over ranks (docs/topology.md) from figures between hosts.

    A pair of ranks on two hosts gets its hosts' rate and latency, a pair on one host that
    host's figure for the two ranks. Each host's link out and in (its best figures) is a
    shared resource of the ranks on it, since they share its NIC (an egress/ingress cap for a
    host with one rank); every shared link found between hosts covers the pairs of their ranks.
    ``nic_gbps`` (out, in per host: the best figures raised by fan tests) replaces the best
    figures as the NICs.
    """
    n = len(layout.host_of)
    hb = [[None if v is None or not np.isfinite(v) else float(v) for v in row]
          for row in np.asarray(host_gbps, dtype=float).tolist()]
    hl = [[None if v is None or not np.isfinite(v) else float(v) for v in row]
          for row in np.asarray(host_latency_ms, dtype=float).tolist()]

    def matrix(m: Optional[Any]) -> Optional[List[List[Optional[float]]]]:
        return None if m is None else [[None if v is None or not np.isfinite(v) else float(v)
                                        for v in row] for row in np.asarray(m, float).tolist()]

    bw = _expand(hb, layout, [matrix(m) for m in local_gbps])
    lat = _expand(hl, layout, [matrix(m) for m in local_latency_ms])
    h = len(layout.members)
    out, inn = _nics(np.asarray(host_gbps, dtype=float), nic_gbps)
    links: List[SharedLink] = []
    egress: List[Optional[float]] = [None] * n
    ingress: List[Optional[float]] = [None] * n
    if h > 2:
        for k in range(h):
            rest = tuple(x for x in range(h) if x != k)
            if len(layout.members[k]) > 1:
                links.append(((k,), rest, float(out[k]), f"egress host {layout.names[k]}"))
                links.append((rest, (k,), float(inn[k]), f"ingress host {layout.names[k]}"))
            else:
                egress[layout.members[k][0]] = float(out[k])
                ingress[layout.members[k][0]] = float(inn[k])
    links += list(shared)
    docs_shared = []
    for src, dst, gbps, label in links:
        ranks_src = [i for x in src for i in layout.members[x]]
        ranks_dst = [j for x in dst for j in layout.members[x]]
        docs_shared.append({"pairs": [[i, j] for i in ranks_src for j in ranks_dst],
                            "gbps": float(f"{gbps:.6g}"), "label": label})
    doc = measured_document(
        name, [layout.names[layout.host_of[i]] for i in range(n)], bw, lat,
        egress_gbps=egress if any(v is not None for v in egress) else None,
        ingress_gbps=ingress if any(v is not None for v in ingress) else None,
        shared=docs_shared)
    doc["probe"] = dict(meta)
    return doc
