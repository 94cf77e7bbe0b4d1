"""The probe by hosts: about linear in the number of hosts (the collective half).

:func:`probe_hosts`, which :func:`horotopo.probe.probe` runs on larger jobs:

1. Hosts by processor name (:func:`~horotopo.probe.hostinfer.host_layout`); a host's lowest
   rank is its leader.
2. On every host at once, its ranks measure each other: the circle method's rounds over the
   host's ranks, each round at once, one direction at a time (a host's ranks sit on links of
   their own to the host's fabric, so disjoint pairs do not meet).
3. The leaders measure the network between hosts: every round of the circle method over the
   leaders at once (``H - 1`` rounds for ``H`` hosts, each direction in turn, or both at once
   where some pair's round trip is at least the target: :func:`round_rates`), so every host
   pair gets a *concurrent* figure.
4. The trust test: the pairs whose concurrent figures fell furthest below what their hosts
   reach at best, and a spread of others, are measured again alone. If none reads clearly
   faster alone, nothing the rounds shared held them back, and the concurrent figures stand.
5. Otherwise the group test: hosts are grouped by the pairs that kept their rate in the
   rounds (a rack behind an oversubscribed uplink, a site behind a WAN link), and each
   group's link out and link in is measured by several flows crossing it at once (each host
   of the group to hosts of other groups). An aggregate clearly below what the flows reach
   alone is a shared link of that capacity; the pairs it carries get their rate alone
   estimated (:func:`~horotopo.probe.hostinfer.alone_estimates`).

The tests are ``2 (H - 1)`` rounds, a fixed number of pairs alone and two tests per group:
linear in the hosts, where the pairwise probe (:mod:`horotopo.probe.phases`) is quadratic in
the ranks. Only rank 0 assembles the document (it plans); the other ranks return None.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..topology import GBPS_TO_BPS
from ..transport.base import Transport
from .config import ProbeConfig
from .flows import Prober, as_probe_error
from .group import TAG_BLOCK, GroupTransport
from .hostinfer import (HostLayout, SharedLink, alone_estimates, depression, fan_flows,
                        fastest_out_and_in, group_flows, host_groups, host_layout,
                        rank_document, unproven_hosts)
from .pairing import Pair, circle_rounds
from .phases import aggregate_and_flow_rates, aggregate_rate

__all__ = ["probe_hosts", "round_rates"]


def round_rates(pr: Prober, label: str, later_tests: int = 0) -> np.ndarray:
    """Rates (bytes/s) of every ordered pair of ``pr``'s ranks, each round of the circle
    method at once; ``pr.rtt`` gets the round trips. ``later_tests`` is what the caller runs
    afterwards (the budget keeps time for it).

    A round runs one direction at a time, unless some of its pairs are *far*: a round trip of
    at least the target (a WAN). A far pair's test is mostly waiting (the data's latency, the
    acknowledgement's, the allreduce's), so such a round runs both directions of every pair
    at once (the links are full duplex): one wait instead of two. Each flow is then sized by
    what its kind moved in the target last time, so that near flows last about as long as
    far ones: sized alike, a near flow moved a few hundred kilobytes in a hundred
    microseconds, and the posting of its receiver's own sends read as a fifth of it (two sites
    at 1024 ranks: 10% of the host pairs 20% low).
    """
    n = pr.n
    bw = np.full((n, n), np.nan)
    rounds = circle_rounds(n)
    scale = float(pr.cfg.start_bytes)
    # Far or not -> the bytes a flow of that kind moved in the target, in the last test that
    # had it (the far flows' slowest: they share what they cross, and sized by a typical
    # share some outlast the target and hold the round up).
    size: Dict[bool, float] = {}
    per_round = 2
    pr.budget(per_round * len(rounds), later_tests)
    for k, pairs in enumerate(rounds):
        pr.latency(pairs)  # synced: every rank sees the same round trips and splits alike
        far = [bool(pr.rtt[a, b] >= pr.target) for a, b in pairs]
        there, back = [(a, b) for a, b in pairs], [(b, a) for a, b in pairs]
        tests = [(there + back, far + far)] if any(far) else [(there, far), (back, far)]
        for flows, kinds in tests:
            weights = None
            if any(kinds):
                # Not yet seen: a far flow starts where every test does; a near one at the
                # most a test moves, which lasts the least on its short round trip (sized
                # like the far flows, the first mixed round read 7.1 of 10 gbps inside a
                # site over a 0.25 gbps WAN).
                unseen = {True: float(pr.cfg.start_bytes), False: float(pr.cfg.max_bytes)}
                want = [size.get(x, unseen[x]) for x in kinds]
                scale = max(want)
                weights = want if min(want) < scale else None
            # The last round's size first: rounds mix the same kinds of pairs, so it usually
            # fits, and a size that is wrong costs one attempt.
            # Paired: the first two attempts share one allreduce (see measure).
            rates, _, scale = pr.measure(flows, [], f"{label} round {k}", int(scale),
                                         weights=weights, paired=True)
            for (s, d), r in zip(flows, rates):
                bw[s, d] = r
            if any(kinds):
                for kind in set(kinds):
                    got = [r for r, x in zip(rates, kinds) if x == kind]
                    pick = np.min if kind else np.median
                    size[kind] = float(np.clip(pick(got) * pr.target, pr.cfg.min_bytes,
                                               pr.cfg.max_bytes))
        per_round = len(tests)
        pr.budget(per_round * (len(rounds) - k - 1), later_tests)
        pr.note(f"{label}: {k + 1}/{len(rounds)} rounds")
    return bw


def _samples(ratio: np.ndarray, count: int) -> List[Pair]:
    """The pairs to measure alone: the half of ``count`` that lost most in the rounds, and the
    rest spread over the others (a resource that every pair shares alike shows in none's
    ratio)."""
    n = ratio.shape[0]
    arcs = [(a, b) for a in range(n) for b in range(n) if a != b]
    if len(arcs) <= count:
        return arcs
    worst = sorted(arcs, key=lambda p: (ratio[p], p))[:count - count // 2]
    rest = [p for p in arcs if p not in set(worst)]
    step = len(rest) / (count // 2)
    return worst + [rest[int(k * step)] for k in range(count // 2)]


def _leaders(pr: Prober, cfg: ProbeConfig) -> Dict[str, Any]:
    """Steps 3 to 5 of the module's list, on the leaders (bytes/s)."""
    h = pr.n
    margin = cfg.margin
    count = min(cfg.sample_pairs, h * (h - 1))
    groups_guess = max(1, h // cfg.params.hosts_per_group_guess)
    concurrent = round_rates(pr, "hosts", count + 2 * groups_guess)
    ratio = depression(concurrent)
    alone: Dict[Pair, float] = {}
    trusted = True
    for a, b in _samples(ratio, count):
        rates, _, _ = pr.measure([(a, b)], [], f"host pair [{a}, {b}] alone",
                                 cfg.start_bytes)
        alone[(a, b)] = float(rates[0])
        trusted &= not concurrent[a, b] < (1.0 - margin) * alone[(a, b)]
    pr.note(f"trust test: {len(alone)} pairs alone, "
            f"{'agree' if trusted else 'faster alone: a shared link'}", force=True)
    groups: List[List[int]] = [list(range(h))]
    tests: List[Dict[str, Any]] = []
    shared: List[SharedLink] = []
    if not trusted:
        groups = host_groups(concurrent, margin, cfg.params)
        pr.note(f"host groups: {len(groups)} ({sum(len(g) > 1 for g in groups)} of several "
                f"hosts)", force=True)
        out, inn = np.nanmax(concurrent, axis=1), np.nanmax(concurrent, axis=0)
        pr.budget(0, 2 * sum(len(g) > 1 for g in groups))
        for g, members in enumerate(groups):
            rest = tuple(x for x in range(h) if x not in members)
            for outgoing in (True, False):
                flows = group_flows(groups, g, outgoing, list(inn if outgoing else out))
                if not flows:
                    continue
                expected = [min(out[a], inn[b]) for a, b in flows]
                way = "out of" if outgoing else "into"
                agg = aggregate_rate(pr, flows, f"{way} host group {g}", expected)
                found = agg < (1.0 - margin) * sum(expected)
                tests.append({"group": g, "out": outgoing, "flows": [list(f) for f in flows],
                              "aggregate": agg, "alone": float(sum(expected)),
                              "shared": bool(found)})
                if found:
                    src, dst = (tuple(members), rest) if outgoing else (rest, tuple(members))
                    shared.append((src, dst, agg, f"{way} hosts {_span(members)}"))
    shared = _unique(shared)
    nic, fans = _fans(pr, concurrent, shared, margin)
    return {"concurrent": concurrent, "alone": alone, "trusted": trusted, "groups": groups,
            "tests": tests, "shared": shared, "rtt": pr.rtt.copy(), "nic": nic, "fans": fans,
            "rates": alone_estimates(concurrent, groups, shared, alone, nic=nic),
            "clock": pr.clock, "count": pr.tests, "rounds": len(circle_rounds(h))}


def _fans(pr: Prober, concurrent: np.ndarray, shared: List[SharedLink], margin: float
          ) -> Tuple[Tuple[np.ndarray, np.ndarray], List[Dict[str, Any]]]:
    """Each host's NIC out and in (bytes/s): its best figure in the rounds, raised where a fan
    test measured more, and the fan tests run.

    A host's best figure is what its fastest partner allowed; a fast NIC among slow partners
    (a fast host in a rack of slow NICs behind an oversubscribed uplink) reads as slow, and a
    plan on that figure leaves much of the NIC unused. Each host clearly slower than the fastest
    (:func:`~horotopo.probe.hostinfer.unproven_hosts`) sends to (receives from) several hosts
    at once, partners whose rates add up to more than the fastest NIC seen
    (:func:`~horotopo.probe.hostinfer.fan_flows`); the aggregate went through its NIC, so the
    NIC carries at least that. A slow NIC reads as before; no fan where the partners cannot
    show more than the host's best figure."""
    best = fastest_out_and_in(concurrent)
    nic = (best[0].copy(), best[1].copy())
    top = float(np.nanmax(np.concatenate(best)))
    plans = []
    for way, outgoing in ((0, True), (1, False)):
        speed = best[1] if outgoing else best[0]  # the partners' figures the other way
        for host in unproven_hosts(concurrent, shared, margin, outgoing):
            flows, expected = fan_flows(host, outgoing, speed, shared,
                                        pr.cfg.params.fan_headroom * top,
                                        pr.cfg.params.fan_partners)
            if len(flows) >= 2 and sum(expected) > (1 + margin) * best[way][host]:
                plans.append((way, host, flows, expected))
    pr.budget(0, len(plans))
    fans: List[Dict[str, Any]] = []
    for way, host, flows, expected in plans:
        label = f"fan {'out of' if way == 0 else 'into'} host {host}"
        agg = _fan(pr, flows, expected, label, margin)
        nic[way][host] = max(nic[way][host], agg)
        fans.append({"host": host, "out": way == 0, "flows": [list(f) for f in flows],
                     "aggregate": agg, "expected": float(sum(expected)),
                     "best": float(best[way][host])})
    if plans:
        pr.note(f"fan tests: {len(plans)} hosts' NICs", force=True)
    return nic, fans


def _fan(pr: Prober, flows: List[Pair], expected: List[float], label: str,
         margin: float) -> float:
    """A fan test's aggregate (bytes/s): the flows sized by their expected rates, then, where
    the aggregate fell clearly short of them, sized again by the rates each flow got, so that
    they finish together (sized by the expected rates, the flow through a rack's uplink gets
    what the slow partners leave of the NIC and runs on alone, so the aggregate reads the NIC
    short). Either is bytes through the NIC over the time
    they took, so the larger bounds the NIC from below."""
    rates, first = aggregate_and_flow_rates(pr, flows, label, expected)
    if first >= (1 - margin) * sum(expected) or not np.all(rates > 0):
        return first
    return max(first, aggregate_rate(pr, flows, f"{label}, resized", list(rates)))


def _span(members: List[int]) -> str:
    return f"{members[0]}-{members[-1]}" if members == list(range(members[0], members[-1] + 1)) \
        else ",".join(map(str, members))


def _unique(shared: List[SharedLink]) -> List[SharedLink]:
    """One link per set of pairs (two groups' tests of one WAN link find it twice), the
    lower capacity kept."""
    best: Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], SharedLink] = {}
    for link in shared:
        key = (link[0], link[1])
        if key not in best or link[2] < best[key][2]:
            best[key] = link
    return list(best.values())


def probe_hosts(transport: Transport, cfg: ProbeConfig, say: Callable[[str], None],
                name: str, hosts: Optional[Sequence[str]] = None) -> Optional[Dict[str, Any]]:
    """The probe by hosts (the module's steps); collective over ``transport``.

    ``hosts`` names each rank's host (every rank passes the same); default: the processor
    names, gathered. Returns the measured-topology document on rank 0 and None on the other
    ranks.
    """
    t = transport
    start = t.now()
    if hosts is not None:
        if len(hosts) != t.size:
            raise ValueError(f"hosts: one name per rank ({t.size}), got {len(hosts)}")
        names = [str(x) for x in hosts]
    else:
        with as_probe_error():
            # Gathered and broadcast (2 (n - 1) messages), not allgathered (n (n - 1)).
            names = t.gather_object(t.processor_name, 0, cfg.timeout_s, "probe: host names")
            names = t.broadcast_object(names, 0, cfg.timeout_s, "probe: host names")
    layout = host_layout(names)
    # Every rank reserves both blocks, so the world's tags stay in step while groups talk.
    tag_local, tag_leaders = t.alloc_tags(TAG_BLOCK), t.alloc_tags(TAG_BLOCK)
    me = t.rank
    host = layout.host_of[me]
    quiet: Callable[[str], None] = lambda msg: None  # noqa: E731
    say(f"[probe] {t.size} ranks on {len(layout.members)} hosts: by hosts "
        f"({len(circle_rounds(len(layout.members)))} rounds between leaders)")
    local: Optional[Tuple[np.ndarray, np.ndarray]] = None
    local_clock = 0.0
    if len(layout.members[host]) > 1:
        knobs = cfg.params
        inside = replace(cfg, budget_s=cfg.budget_s * knobs.intra_share,
                         max_bytes=max(cfg.start_bytes,
                                       min(cfg.max_bytes, knobs.local_max_bytes)))
        pr = Prober(GroupTransport(t, layout.members[host], tag_local), inside,
                     say if me == 0 else quiet)
        pr.hosts = [f"world rank {r} on {layout.names[host]}" for r in layout.members[host]]
        local = (round_rates(pr, f"inside {layout.names[host]}"), pr.rtt.copy())
        local_clock = pr.clock
    leaders = None
    if me in layout.leaders and len(layout.members) > 1:
        pr = Prober(GroupTransport(t, layout.leaders, tag_leaders),
                     replace(cfg, ping_reps=min(cfg.ping_reps, cfg.params.round_pings)),
                     say if me == 0 else quiet)
        pr.hosts = [f"leader of {layout.names[h]}, world rank {r}"
                    for h, r in enumerate(layout.leaders)]
        # only the leaders' rounds: the emulated cluster's pairwise probe keeps its samples
        pr.long_rtt_s = cfg.params.long_rtt_s
        leaders = _leaders(pr, cfg)
    with as_probe_error():
        got = t.gather_object((local, local_clock) if me in layout.leaders else None, 0,
                              cfg.timeout_s + cfg.params.wait_budgets * cfg.budget_s,
                              "probe: the hosts' figures")
    if me != 0:
        return None
    assert got is not None
    return _document(name, layout, leaders, [got[r] for r in layout.leaders], cfg,
                     t.now() - start)


def _document(name: str, layout: HostLayout, leaders: Optional[Dict[str, Any]],
              per_host: List[Any], cfg: ProbeConfig, seconds: float) -> Dict[str, Any]:
    """Rank 0's document from the leaders' figures and each host's (bytes/s, seconds)."""
    to_gbps = 1.0 / GBPS_TO_BPS
    if leaders is None:  # one host
        leaders = {"rates": np.full((1, 1), np.nan), "rtt": np.zeros((1, 1)), "shared": [],
                   "concurrent": np.full((1, 1), np.nan), "alone": {}, "trusted": True,
                   "groups": [[0]], "tests": [], "clock": 0.0, "count": 0, "rounds": 0,
                   "nic": None, "fans": []}
    local_gbps = [None if x[0] is None else x[0][0] * to_gbps for x in per_host]
    local_ms = [None if x[0] is None else x[0][1] / 2 * 1e3 for x in per_host]
    shared = [(s, d, v * to_gbps, label) for s, d, v, label in leaders["shared"]]
    rounded = lambda m: [[None if not np.isfinite(v) else float(f"{v:.6g}") for v in row]  # noqa: E731
                         for row in np.asarray(m, dtype=float).tolist()]
    meta = {"scheme": "hosts", "mode": cfg.mode, "seconds": round(seconds, 3),
            "tests": leaders["count"], "rounds": leaders["rounds"],
            "leaders_seconds": round(leaders["clock"], 3),
            "local_seconds": round(max(x[1] for x in per_host), 3),
            "hosts": list(layout.names), "members": [list(m) for m in layout.members],
            "host_gbps": rounded(leaders["rates"] * to_gbps),
            "concurrent_gbps": rounded(leaders["concurrent"] * to_gbps),
            "alone": [[a, b, float(f"{v * to_gbps:.6g}")] for (a, b), v in
                      leaders["alone"].items()],
            "trusted": leaders["trusted"], "host_groups": leaders["groups"],
            "group_tests": [dict(x, aggregate=x["aggregate"] * to_gbps,
                                 alone=x["alone"] * to_gbps) for x in leaders["tests"]],
            "shared_hosts": [{"from": list(s), "to": list(d), "gbps": v, "label": label}
                             for s, d, v, label in shared],
            "fan_tests": [dict(x, aggregate=x["aggregate"] * to_gbps,
                               expected=x["expected"] * to_gbps, best=x["best"] * to_gbps)
                          for x in leaders["fans"]]}
    nic = leaders["nic"]
    return rank_document(name, layout, leaders["rates"] * to_gbps,
                         leaders["rtt"] / 2 * 1e3, local_gbps, local_ms, shared, meta,
                         nic_gbps=None if nic is None else (nic[0] * to_gbps, nic[1] * to_gbps))
