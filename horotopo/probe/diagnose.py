"""What a measured network says to its user: the findings of ``horotopo doctor`` (pure).

From a measured-topology document (what :func:`horotopo.probe.probe` returns, or a saved one),
:func:`diagnose` finds:

- each host's NIC out and in. Hosts are the ranks' processor names, as the probe groups them.
  A host's NIC out is the one the measured model holds, which the planner plans with: its
  binding egress cap, or its own link out where the probe by hosts measured one; else the most
  it was seen to send (its fastest transfer to another host, or its fan-out where its rank is
  alone on it). The same for in;
- what is clearly below its peers (:attr:`horotopo.params.ProbeParams.slow_ratio` times
  below, by default): a NIC against the median of the other
  hosts' NICs, a host pair against what its two ends reach with other hosts, a shared link
  against the median NIC;
- the shared bottlenecks: which hosts sit behind which shared link, and its capacity.

:class:`PlanSummary` carries the plan the doctor would run, as plain figures (this layer sits
below the planner); :func:`report_lines` turns both into the text the doctor prints.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..params import PROBE
from ..topology import plural
from .hostinfer import host_layout

__all__ = ["HostNic", "Slow", "SharedLink", "Diagnosis", "PlanSummary",
           "diagnose", "report_lines", "format_ranks"]



@dataclass(frozen=True)
class HostNic:
    """One host: its name, its ranks, and its NIC's rates out and in as the measured model
    holds them (gbps; None: not measured, as for the only host of a job); ``best_*``: the most
    the probe saw it carry."""

    name: str
    ranks: Tuple[int, ...]
    out_gbps: Optional[float]
    in_gbps: Optional[float]
    best_out_gbps: Optional[float] = None
    best_in_gbps: Optional[float] = None


@dataclass(frozen=True)
class Slow:
    """Something clearly below its peers.

    ``kind``: ``"nic out"``, ``"nic in"`` (a host's NIC), ``"link"`` (one host pair, ``hosts``
    the source and the destination) or ``"shared"`` (a shared link, ``shared`` its index in
    :attr:`Diagnosis.shared`). ``reference_gbps`` is what it is compared with, described by
    ``reference``; ``ratio`` is ``reference_gbps / gbps``. ``seen_gbps``: for a NIC that the
    model holds clearly below what one of its transfers reached, that transfer's rate.
    """

    kind: str
    what: str
    hosts: Tuple[str, ...]
    ranks: Tuple[int, ...]
    gbps: float
    reference_gbps: float
    reference: str
    ratio: float
    shared: Optional[int] = None
    seen_gbps: Optional[float] = None

    def sentence(self) -> str:
        """The finding in one line of plain words."""
        label = {"nic out": "NIC out", "nic in": "NIC in", "link": "", "shared": ""}[self.kind]
        rate = f"{label + ' ' if label else ''}{_gbps(self.gbps)} gbps"
        text = (f"{self.what}: {rate}, {self.ratio:.1f}x below {self.reference} "
                f"{_gbps(self.reference_gbps)} gbps")
        if self.seen_gbps is not None:
            way = "into" if self.kind == "nic in" else "out of"
            text += (f" (but a single transfer {way} it reached {_gbps(self.seen_gbps)} gbps: "
                     f"the probe's figures disagree and the plan uses the low one; run the "
                     f"doctor again)")
        return text


@dataclass(frozen=True)
class SharedLink:
    """A shared bottleneck the probe found: every transfer from a rank of ``src_ranks`` to a
    rank of ``dst_ranks`` crosses it, together, at ``gbps`` in all."""

    src_hosts: Tuple[str, ...]
    dst_hosts: Tuple[str, ...]
    src_ranks: Tuple[int, ...]
    dst_ranks: Tuple[int, ...]
    gbps: float
    label: str

    @property
    def outgoing(self) -> bool:
        """Whether the hosts behind it are its sources (a group's link out): the smaller side
        is the group, the other side the rest of the network."""
        return len(self.src_hosts) <= len(self.dst_hosts)

    @property
    def behind(self) -> Tuple[str, ...]:
        """The hosts that sit behind it (see :attr:`outgoing`)."""
        return self.src_hosts if self.outgoing else self.dst_hosts

    def describe(self, all_hosts: Sequence[str]) -> str:
        """Which hosts sit behind it, in words."""
        everyone = set(all_hosts)
        if self.outgoing and set(self.dst_hosts) == everyone - set(self.src_hosts):
            return (f"out of {_hosts(self.src_hosts)} ({format_ranks(self.src_ranks)}) "
                    f"to the other hosts")
        if not self.outgoing and set(self.src_hosts) == everyone - set(self.dst_hosts):
            return (f"into {_hosts(self.dst_hosts)} ({format_ranks(self.dst_ranks)}) "
                    f"from the other hosts")
        return (f"from {_hosts(self.src_hosts)} ({format_ranks(self.src_ranks)}) to "
                f"{_hosts(self.dst_hosts)} ({format_ranks(self.dst_ranks)})")


@dataclass(frozen=True)
class PlanSummary:
    """The plan the doctor would run, in figures (seconds, bytes/s, bytes).

    ``speedup`` is ring's predicted time over the plan's, both from the planner's model.
    """

    trees: int
    roots: Tuple[int, ...]
    throughput_Bps: float
    ring_Bps: float
    size: int
    size_label: str
    plan_s: float
    ring_s: float
    forest: str = ""

    @property
    def speedup(self) -> float:
        return self.ring_s / self.plan_s if self.plan_s > 0 else math.inf

    def versus_ring(self) -> str:
        """How the plan's predicted time compares with ring's, in words."""
        if self.speedup >= 1.005:
            return f"{self.speedup:.2f}x faster than ring"
        if self.speedup <= 0.995:
            return f"ring is predicted {1 / self.speedup:.2f}x faster at this size"
        return "about as fast as ring"

    def to_json(self) -> Dict[str, Any]:
        return dict(asdict(self), roots=list(self.roots), speedup=self.speedup)


@dataclass(frozen=True)
class Diagnosis:
    """The findings on one measured network (see the module's docstring)."""

    name: str
    ranks: int
    hosts: Tuple[HostNic, ...]
    slow: Tuple[Slow, ...]
    shared: Tuple[SharedLink, ...]
    ratio: float = PROBE.slow_ratio

    def named(self) -> List[Tuple[str, Tuple[str, ...]]]:
        """``(kind, hosts)`` of every finding of :attr:`slow`: what a reader is told to look
        at (a shared link by the hosts on its sending side)."""
        return [(s.kind, s.hosts) for s in self.slow]

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "ranks": self.ranks, "slow_ratio": self.ratio,
                "hosts": [dict(asdict(h), ranks=list(h.ranks)) for h in self.hosts],
                "slow": [dict(asdict(s), hosts=list(s.hosts), ranks=list(s.ranks),
                              sentence=s.sentence()) for s in self.slow],
                "shared": [dict(asdict(s), src_hosts=list(s.src_hosts),
                                dst_hosts=list(s.dst_hosts), src_ranks=list(s.src_ranks),
                                dst_ranks=list(s.dst_ranks),
                                behind=s.describe([h.name for h in self.hosts]))
                           for s in self.shared]}


def format_ranks(ranks: Sequence[int]) -> str:
    """``"rank 2"``, ``"ranks 6-7"``, ``"ranks 0,2,4"``, ``"ranks 0-15,20-23"``."""
    values = sorted(int(r) for r in ranks)
    if len(values) == 1:
        return f"rank {values[0]}"
    spans: List[str] = []
    start = prev = values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return "ranks " + ",".join(spans)


def _hosts(names: Sequence[str], show: int = 6) -> str:
    names = list(names)
    word = "host" if len(names) == 1 else "hosts"
    if len(names) <= show:
        return f"{word} {', '.join(names)}"
    return f"{word} {', '.join(names[:show])} and {len(names) - show} more"


def _gbps(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _finite(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _best(values: Sequence[Optional[float]]) -> Optional[float]:
    seen = [v for v in values if v is not None]
    return max(seen) if seen else None


def _median_of_others(values: Sequence[Optional[float]], k: int) -> Optional[float]:
    others = [v for i, v in enumerate(values) if i != k and v is not None]
    return statistics.median(others) if others else None


def diagnose(doc: Mapping[str, Any], *, ratio: float = PROBE.slow_ratio) -> Diagnosis:
    """The findings on the measured-topology document ``doc`` (see the module's docstring).

    Raises
    ------
    ValueError
        ``ratio`` not above 1, or a document without ranks or a bandwidth matrix.
    """
    if not ratio > 1:
        raise ValueError(f"ratio: a factor above 1, got {ratio!r}")
    if "bandwidth_gbps" not in doc or not doc.get("ranks"):
        raise ValueError("a measured-topology document needs 'ranks' and 'bandwidth_gbps' "
                         "(a declared topology has no measurements to diagnose)")
    names = [str(h) for h in doc["ranks"]]
    n = len(names)
    layout = host_layout(names)
    hosts = layout.names
    h_count = len(hosts)
    members = layout.members
    bw = [[_finite(v) for v in row] for row in doc["bandwidth_gbps"]]
    # Host pairs: the fastest transfer between their ranks (a low sample is noise more often
    # than a fast one is).
    pair = [[None if a == b else _best([bw[i][j] for i in members[a] for j in members[b]])
             for b in range(h_count)] for a in range(h_count)]
    # What the probe saw each host's NIC carry (its single transfers, and the fan test of a
    # rank alone on its host, whose flows all crossed the NIC), and the NIC the measured model
    # holds where it has one (a binding cap, or a host's own link out or in): the planner plans
    # with the model's, so the doctor reports that one.
    seen_out = [[pair[a][b] for b in range(h_count)] for a in range(h_count)]
    seen_in = [[pair[b][a] for b in range(h_count)] for a in range(h_count)]
    model_out: List[Optional[float]] = [None] * h_count
    model_in: List[Optional[float]] = [None] * h_count
    info = doc.get("probe", {}) or {}
    for a in range(h_count):
        if len(members[a]) == 1 and h_count > 1:
            r = members[a][0]
            for seen, model, fan, cap in ((seen_out, model_out, info.get("fan_out_gbps"),
                                           doc.get("egress_gbps")),
                                          (seen_in, model_in, info.get("fan_in_gbps"),
                                           doc.get("ingress_gbps"))):
                if fan and r < len(fan):
                    seen[a].append(_finite(fan[r]))
                if cap and r < len(cap):
                    model[a] = _finite(cap[r])

    def _rest(one: int) -> List[int]:
        return [i for i in range(n) if layout.host_of[i] != one]

    shared: List[SharedLink] = []
    for s in doc.get("shared", []) or []:
        src = sorted({int(p[0]) for p in s["pairs"]})
        dst = sorted({int(p[1]) for p in s["pairs"]})
        src_h = sorted({layout.host_of[i] for i in src})
        dst_h = sorted({layout.host_of[j] for j in dst})
        gbps = _finite(s.get("gbps"))
        if gbps is None:
            continue
        if len(src_h) == 1 and src == list(members[src_h[0]]) and dst == _rest(src_h[0]):
            model_out[src_h[0]] = gbps  # the host's own link out: its NIC
            continue
        if len(dst_h) == 1 and dst == list(members[dst_h[0]]) and src == _rest(dst_h[0]):
            model_in[dst_h[0]] = gbps
            continue
        shared.append(SharedLink(tuple(hosts[x] for x in src_h), tuple(hosts[x] for x in dst_h),
                                 tuple(src), tuple(dst), gbps, str(s.get("label", "shared"))))
    best_out = [_best(row) for row in seen_out]
    best_in = [_best(row) for row in seen_in]
    nic_out = [m if m is not None else b for m, b in zip(model_out, best_out)]
    nic_in = [m if m is not None else b for m, b in zip(model_in, best_in)]
    nics = tuple(HostNic(hosts[a], members[a], nic_out[a], nic_in[a], best_out[a], best_in[a])
                 for a in range(h_count))

    slow: List[Slow] = []
    for a in range(h_count):
        for kind, values, seen in (("nic out", nic_out, best_out), ("nic in", nic_in, best_in)):
            value, ref = values[a], _median_of_others(values, a)
            if value is not None and ref is not None and value * ratio <= ref:
                doubt = seen[a] if seen[a] is not None and value * ratio <= seen[a] else None
                slow.append(Slow(kind, f"host {hosts[a]} ({format_ranks(members[a])})",
                                 (hosts[a],), members[a], value, ref,
                                 "the median of the other hosts", ref / value,
                                 seen_gbps=doubt))
    for a in range(h_count):
        for b in range(h_count):
            rate = pair[a][b]
            if rate is None or best_out[a] is None or best_in[b] is None:
                continue
            ref = min(best_out[a], best_in[b])
            if rate * ratio > ref:
                continue
            covers = [s.gbps for s in shared
                      if any(layout.host_of[i] == a for i in s.src_ranks)
                      and any(layout.host_of[j] == b for j in s.dst_ranks)]
            if any(cap <= rate * ratio for cap in covers):
                continue  # a shared link found explains it; that link is what is named
            slow.append(Slow("link", f"link {hosts[a]} -> {hosts[b]}", (hosts[a], hosts[b]),
                             tuple(members[a]) + tuple(members[b]), rate, ref,
                             "what its two hosts reach with others", ref / rate))
    typical = [v for v in nic_out if v is not None]
    median_nic = statistics.median(typical) if typical else None
    for k, s in enumerate(shared):
        if median_nic is not None and s.gbps * ratio <= median_nic:
            slow.append(Slow("shared", f"shared link {s.describe(hosts)}", s.behind,
                             s.src_ranks if s.outgoing else s.dst_ranks, s.gbps, median_nic,
                             "the median host NIC", median_nic / s.gbps, shared=k))
    return Diagnosis(str(doc.get("name", "")), n, nics, tuple(slow), tuple(shared), ratio)


def report_lines(diagnosis: Diagnosis, plan: Optional[PlanSummary] = None,
                 probe_info: Optional[Mapping[str, Any]] = None, *,
                 listed_links: int = PROBE.listed_links) -> List[str]:
    """The doctor's text: hosts and their NICs, what is slow, the shared bottlenecks, and
    the plan (``probe_info``: the document's ``"probe"`` entry, for the heading). The first
    ``listed_links`` slow host pairs are named, the rest counted."""
    d = diagnosis
    head = f"horotopo doctor: {plural(d.ranks, 'rank')} on {plural(len(d.hosts), 'host')}"
    info = probe_info or {}
    if "mode" in info:
        head += f", probe {info['mode']}"
    if "seconds" in info:
        head += f" in {float(info['seconds']):.1f} s"
    lines = [head, ""]
    slow_hosts = {h for s in d.slow if s.kind in ("nic out", "nic in") for h in s.hosts}
    width = max([len(f"{h.name} ({format_ranks(h.ranks)})") for h in d.hosts] + [4])
    lines.append("hosts, NIC out / in (gbps, as measured and planned with):")
    for h in d.hosts:
        label = f"{h.name} ({format_ranks(h.ranks)})"
        figures = " / ".join("-" if v is None else _gbps(v) for v in (h.out_gbps, h.in_gbps))
        lines.append(f"  {label:<{width}}  {figures}" + ("   slow" if h.name in slow_hosts
                                                           else ""))
    if len(d.hosts) == 1:
        lines.append("  (one host: no network between hosts to measure)")
    lines += ["", f"clearly below their peers (at least {d.ratio:g}x below):"]
    links = [s for s in d.slow if s.kind == "link"]
    others = [s for s in d.slow if s.kind != "link"]
    lines += [f"  {s.sentence()}" for s in others + links[:listed_links]]
    if len(links) > listed_links:
        lines.append(f"  ... and {len(links) - listed_links} more slow host pairs (see the "
                     f"JSON)")
    if not d.slow:
        lines.append("  nothing: every NIC, host pair and shared link is within "
                     f"{d.ratio:g}x of its peers")
    lines += ["", "shared bottlenecks (hosts behind one shared link):"]
    names = [h.name for h in d.hosts]
    for s in d.shared:
        lines.append(f"  {s.describe(names)}: {_gbps(s.gbps)} gbps shared")
    if not d.shared:
        lines.append("  none found")
    if plan is not None:
        roots = ", ".join(str(r) for r in plan.roots[:8]) + (", ..." if len(plan.roots) > 8
                                                              else "")
        lines += ["", f"plan: {plural(plan.trees, 'tree')} "
                      f"(root{'s' if len(plan.roots) != 1 else ''} {roots})"
                      + (f", {plan.forest} forest" if plan.forest else "")
                      + f", modelled {plan.throughput_Bps / 1e6:.1f} MB/s "
                        f"(ring {plan.ring_Bps / 1e6:.1f} MB/s)",
                  f"  allreduce of {plan.size_label} predicted {plan.plan_s * 1e3:.1f} ms, "
                  f"ring {plan.ring_s * 1e3:.1f} ms: {plan.versus_ring()}"]
    return lines
