"""The collective measurements of the probe (the half that talks to the other ranks).

Every rank calls :func:`probe` together, over a :class:`~horotopo.transport.base.Transport`
(MPI's, or any other: the probe never touches MPI itself). Above 16 ranks (``scheme``) it
runs the probe by hosts (:mod:`horotopo.probe.hosts`); up to that, every pair, in phases:

1. Latency: ping-pong between every pair, just before the pair's bandwidth test.
2. Bandwidth: every ordered pair, in circle-method order, one direction at a time (both at once
   measure low through a shaped link with a deep queue: each stream's TCP acknowledgements
   wait behind the other's data). By default one pair runs at a time: disjoint pairs are not
   independent when they cross a shared uplink (the very thing the probe looks for), so
   running a round's pairs together would understate the pairwise figures. ``concurrent_pairs=True`` runs each round at once, which is
   ``n / 2`` times faster and exact on non-blocking fabrics.
3. Shared bottlenecks: the ranks are clustered by their pairwise rates (at every gap between
   rate levels: hosts, racks...), and every two groups run concurrent tests (``a_k -> b_k``
   for ``k < min(|A|, |B|)``, then the reverse); with three groups or more, each group also
   against all the others.
4. Host limits: fan-out and fan-in at each rank (one rank sends to all others at once, then
   all others send to it).


The measurements themselves (ping-pong, timed flows, the adaptive test and the time budget) are
:mod:`horotopo.probe.flows`'; the tests of each phase, :mod:`horotopo.probe.phases`'; which
ranks they pair, :mod:`horotopo.probe.pairing`'. The inference (groups, shared resources,
binding caps, the document) is pure and lives in :mod:`horotopo.probe.infer`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..topology import GBPS_TO_BPS
from ..transport.base import Transport
from . import phases
from .cluster import cluster_levels, cluster_ranks
from .config import MODES, ProbeConfig, ProbeError
from .flows import Prober, as_probe_error
from .group import TAG_BLOCK, GroupTransport
from .hosts import probe_hosts
from .infer import build_document, infer_all, infer_shared
from .pairing import (ExtensionResult, GroupResult, Pair, bipartitions,
                      extension_tests, group_tests)

# Prober stays importable from here (the MPI tests drive one directly).
__all__ = ["ProbeConfig", "ProbeError", "probe", "measure_pairs", "MODES", "Prober"]


def _checked(link: Any) -> Transport:
    """``link``, which must be a :class:`Transport` (the probe never opens MPI itself)."""
    if not isinstance(link, Transport):
        raise TypeError(f"the probe runs over a Transport, got {type(link).__name__} "
                        f"(an MPI communicator: horotopo.transport.as_transport(comm))")
    return link


def probe(transport: Transport, mode: str = "full", *, name: Optional[str] = None,
          progress: Optional[Callable[[str], None]] = None,
          hosts: Optional[Sequence[str]] = None, **overrides: Any
          ) -> Optional[Dict[str, Any]]:
    """Measure the network between the ranks of ``transport``; collective.

    Parameters
    ----------
    transport : Transport
        Every rank of it calls this.
    mode : str
        ``"full"`` (the default of ``horotopo probe``; about 10 s at most for 8 ranks) or
        ``"quick"`` (what ``init()`` runs by default).
    name : str, optional
        Name of the document (default ``"probed-<n>"``).
    progress : callable, optional
        Receives one-line progress messages (give it on rank 0 only).
    hosts : sequence of str, optional
        The host of each rank, for the hosts scheme, where the processor names do not tell
        (a simulated cluster whose ranks are nodes of a host switch:
        :func:`horotopo.probe.hostinfer.generated_hosts`). Default: the processor names.
    **overrides
        Fields of :class:`ProbeConfig` (``max_bytes``, ``timeout_s``, ``concurrent_pairs``...).

    Returns
    -------
    dict or None
        The measured-topology document (docs/topology.md); it loads with
        :func:`horotopo.topology.from_dict`. Extra figures are under its ``"probe"`` key.
        The pairs scheme returns it on every rank; the hosts scheme (``scheme``, by default
        above 16 ranks) on rank 0 only, the rank that plans, and None on the others.

    Raises
    ------
    ProbeError
        A pair that cannot reach each other, a timeout or a zero measurement; the message names
        the pair.
    """
    cfg = ProbeConfig.for_mode(mode, **overrides)
    say = progress or (lambda msg: None)
    link = _checked(transport)
    if cfg.scheme_for(link.size) == "hosts":
        return probe_hosts(link, cfg, say, name or f"probed-{link.size}", hosts)
    return _probe(Prober(link, cfg, say), cfg, name)


def _probe(pr: Prober, cfg: ProbeConfig, name: Optional[str]) -> Dict[str, Any]:
    """The phases of :func:`probe`."""
    with as_probe_error():
        pr.hosts = [str(h) for h in pr.transport.allgather_object(
            pr.transport.processor_name, cfg.timeout_s, "probe: host names")]
    n = pr.n
    groups: List[List[int]] = [list(range(n))]
    levels: List[List[List[int]]] = []
    shared: List[GroupResult] = []
    extended: List[ExtensionResult] = []
    fan_out = fan_in = None
    bw = np.full((n, n), np.nan)
    if n > 1:
        pr.note(f"latency and bandwidth: {n * (n - 1) // 2} pairs, "
                f"{'a round' if cfg.concurrent_pairs else 'one pair'} at a time", force=True)
        # the pairs, then (guessing two groups) two group tests and 2n fan tests
        pr.budget(n * (n - 1), phases.tests_after_pairs(n))
        bw = phases.pair_rates(pr)
        groups = cluster_ranks(bw, gap=cfg.gap)
        levels = cluster_levels(bw, gap=cfg.gap)
        partitions = levels
        if not levels and n <= cfg.params.scan_max_ranks:
            # No groups by rate: a shared link may still hide behind NICs no faster than it
            # (pairing.bipartitions); a few ranks can afford to test every split.
            partitions = bipartitions(n)
        tests = group_tests(partitions)
        pr.budget(0, len(tests) + phases.fan_tests(n))
        if tests:
            pr.note(f"groups by rate: {levels}" if levels else
                    f"no groups by rate: testing all {len(partitions)} splits in two", force=True)
            shared = phases.concurrent(pr, tests, bw)
            ext = extension_tests(infer_shared(bw, shared, margin=cfg.margin), partitions, n)
            pr.budget(0, len(ext) + phases.fan_tests(n))
            extended = phases.extensions(pr, ext, bw)
        if n > 2:
            pr.note("host limits: fan-out and fan-in", force=True)
            found = infer_all(bw, shared, extended, margin=cfg.margin)
            fan_out, fan_in = phases.fans(pr, bw, found)
    to_gbps = 1.0 / GBPS_TO_BPS
    meta = {"levels": levels, "mode": cfg.mode, "seconds": round(pr.clock, 3),
            "tests": pr.tests,
            "target_ms": round(pr.target * 1e3, 2),
            "concurrent_pairs": cfg.concurrent_pairs}
    doc = build_document(
        name or f"probed-{n}", pr.hosts,
        [[None if i == j else bw[i, j] * to_gbps for j in range(n)] for i in range(n)],
        [[None if i == j else pr.rtt[i, j] / 2 * 1e3 for j in range(n)] for i in range(n)],
        fan_out_gbps=None if fan_out is None else [v * to_gbps for v in fan_out],
        fan_in_gbps=None if fan_in is None else [v * to_gbps for v in fan_in],
        shared_results=[(a, b, f, v * to_gbps) for a, b, f, v in shared],
        extension_results=[(a, b, r, side, f, v * to_gbps)
                           for a, b, r, side, f, v in extended],
        groups=groups, gap=cfg.gap, margin=cfg.margin, meta=meta)
    pr.note(f"done: {pr.tests} tests", force=True)
    return doc


def measure_pairs(transport: Transport, pairs: Sequence[Pair], mode: str = "quick",
                  **overrides: Any) -> Dict[Pair, float]:
    """Rates (bytes/s) of the given directed pairs, each alone; collective.

    The probe's pairwise test (latency, warm-up, adaptive size, repeats) for just these pairs,
    e.g. to re-measure links that an allreduce found slow. Every rank passes the same
    ``pairs``; the result is the same on every rank.

    Raises
    ------
    ValueError
        A pair of one rank with itself, or a rank out of range.
    ProbeError
        A pair that cannot reach each other, or a timeout, naming the pair.
    """
    cfg = ProbeConfig.for_mode(mode, **overrides)
    link = _checked(transport)
    size = link.size
    for a, b in pairs:
        if a == b or not (0 <= a < size and 0 <= b < size):
            raise ValueError(f"a pair needs two different ranks in 0..{size - 1}, "
                             f"got ({a}, {b})")
    if not pairs:
        return {}
    # Only the pairs' ranks take part: each test ends with a control allreduce, and over the
    # world that made every rank of a 1024-rank job join every attempt of every pair (an
    # adaptive re-plan's re-probe of a few pairs did not end within 13 minutes of simulation).
    # Every rank reserves the group's tags, so the world's stay in step.
    members = sorted({int(r) for pair in pairs for r in pair})
    whole = len(members) == size
    tag = None if whole else link.alloc_tags(TAG_BLOCK)  # the same choice on every rank
    out: Optional[Dict[Pair, float]] = None
    if link.rank in members:
        index = {r: k for k, r in enumerate(members)}
        if whole:
            pr = Prober(link, cfg, lambda msg: None)
        else:
            assert tag is not None
            pr = Prober(GroupTransport(link, members, tag), cfg, lambda msg: None)
            pr.hosts = [f"world rank {r}" for r in members]
        out = {}
        for a, b in pairs:
            s, d = index[int(a)], index[int(b)]
            pr.latency([(min(s, d), max(s, d))])
            rates, _, _ = pr.measure([(s, d)], [], f"bandwidth [{a}, {b}]", cfg.start_bytes)
            out[(int(a), int(b))] = float(rates[0])
    if whole:
        assert out is not None
        return out
    with as_probe_error():
        # the others wait without a bound of their own making: the pairs' tests end within
        # their timeouts and budget, or raise there (and the broadcast times out here)
        wait_s = cfg.timeout_s * (2 + len(pairs)) + cfg.params.wait_budgets * cfg.budget_s
        return link.broadcast_object(out, members[0], wait_s, "probe: the pairs' rates")
