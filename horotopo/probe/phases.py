"""The probe's tests, phase by phase, each made with a :class:`~horotopo.probe.flows.Prober`.

- :func:`pair_rates`: latency and bandwidth of every ordered pair, in circle-method order, one
  direction at a time; then a second look at the pairs whose two directions disagree.
- :func:`concurrent`: the group tests (:func:`~horotopo.probe.pairing.group_tests`), each a set
  of cross-group flows at once.
- :func:`extensions`: the extension tests (:func:`~horotopo.probe.pairing.extension_tests`).
- :func:`fans`: fan-out and fan-in at each rank.

Every rank calls these together with the same arguments; the results are the same on every rank.
What the figures mean is :mod:`horotopo.probe.infer`'s to decide.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence, Tuple

import numpy as np

from .flows import Prober, pow2
from .infer import expected_rates
from .pairing import ExtensionResult, ExtensionTest, GroupResult, GroupTest, Pair, circle_rounds

__all__ = ["pair_rates", "concurrent", "extensions", "fans", "fan_tests", "tests_after_pairs",
           "aggregate_rate", "aggregate_and_flow_rates"]


def fan_tests(n: int) -> int:
    """How many fan tests :func:`fans` runs on ``n`` ranks: a fan-out and a fan-in per rank,
    from three ranks on (with two, a fan is just the pair)."""
    return 2 * n if n > 2 else 0


def tests_after_pairs(n: int) -> int:
    """The concurrent tests left once the pairs are done, guessed before the clustering: two
    group tests (two groups) and the fan tests. The budget plans with it."""
    return 2 + fan_tests(n) if n > 2 else 0


def _span(ranks: Sequence[int]) -> str:
    return "ranks " + ",".join(str(r) for r in ranks)


def pair_rates(pr: Prober) -> np.ndarray:
    """Rates (bytes/s) of every ordered pair, alone; ``pr.rtt`` gets their round trips.

    One pair at a time, or a circle-method round at once with ``concurrent_pairs`` (see
    :mod:`horotopo.probe.measure` for why not by default).
    """
    n = pr.n
    bw = np.full((n, n), np.nan)
    rounds = circle_rounds(n)
    groups = rounds if pr.cfg.concurrent_pairs else [[p] for r in rounds for p in r]
    done = 0
    total = n * (n - 1) // 2
    scale = float(pr.cfg.start_bytes)
    for pairs in groups:
        pr.latency(pairs)
        # One direction at a time: through a shaped link with a deep queue, the reverse
        # stream's TCP acknowledgements wait behind data, and both directions measure low.
        for flows in ([(a, b) for a, b in pairs], [(b, a) for a, b in pairs]):
            # Start below the last test's size: this pair may be much slower (a wasted
            # attempt would last long) or faster (one cheap attempt to grow).
            rates, _, scale = pr.measure(
                flows, [], f"bandwidth {flows}",
                int(max(pr.cfg.start_bytes, scale * pr.cfg.params.next_pair_start_share)))
            for (s, d), r in zip(flows, rates):
                bw[s, d] = r
        done += len(pairs)
        pr.budget(2 * (total - done), tests_after_pairs(n))
        pr.note(f"bandwidth: {done}/{total} pairs")
    _retry_lopsided(pr, bw, tests_after_pairs(n))
    return bw


def _retry_lopsided(pr: Prober, bw: np.ndarray, tests_after: int) -> None:
    """Measure again the pairs whose two directions disagree, while the budget allows.

    Most links are symmetric, and the way a figure goes wrong (a descheduled rank, a
    neighbour's burst of load) is low: a pair much slower one way than the other is worth
    a second look, and each direction keeps the better of its two figures.
    """
    cfg = pr.cfg
    suspects = sorted(((min(bw[a, b], bw[b, a]) / max(bw[a, b], bw[b, a]), a, b)
                       for a in range(pr.n) for b in range(a + 1, pr.n)
                       if min(bw[a, b], bw[b, a]) < (1 - 2 * cfg.tolerance)
                       * max(bw[a, b], bw[b, a])))
    retried = 0
    for _, a, b in suspects:
        # what a retry costs, from the tests so far; keep the rest of the budget for the
        # concurrent and fan tests
        per_test = pr.clock / max(pr.tests, 1)
        if pr.clock + per_test * (2 + cfg.params.subset_factor * tests_after) > cfg.budget_s:
            break
        for s, d in ((a, b), (b, a)):
            rates, _, _ = pr.measure([(s, d)], [], f"bandwidth again [{s}, {d}]",
                                     pow2(bw[s, d] * pr.target, cfg.min_bytes, cfg.max_bytes))
            bw[s, d] = max(bw[s, d], float(rates[0]))
        retried += 1
    if suspects:
        pr.note(f"bandwidth: measured {retried} of {len(suspects)} lopsided pairs again",
                force=True)


def aggregate_rate(pr: Prober, flows: Sequence[Pair], label: str,
               expected: Sequence[float]) -> float:
    """The aggregate rate (bytes/s) of ``flows`` run at once, sized by their ``expected`` rates
    so that they finish together unless something they share caps them."""
    return aggregate_and_flow_rates(pr, flows, label, expected)[1]


def aggregate_and_flow_rates(pr: Prober, flows: Sequence[Pair], label: str,
                         expected: Sequence[float]) -> Tuple[np.ndarray, float]:
    """:func:`aggregate_rate`, and the rate each flow got (bytes/s)."""
    # The first scale gives the fastest flow about a concurrent test's target.
    start = pow2(max(expected) * pr.target * pr.cfg.params.subset_factor, pr.cfg.min_bytes,
                 pr.cfg.max_bytes)
    rates, agg, _ = pr.measure(flows, [list(range(len(flows)))], label, start, weights=expected)
    return rates, float(agg[0])


def concurrent(pr: Prober, tests: Sequence[GroupTest], bw: np.ndarray) -> List[GroupResult]:
    """Run the group ``tests``; each gives ``(src, dst, flows, aggregate)`` in bytes/s."""
    results: List[GroupResult] = []
    for test in tests:
        flows = list(test.flows)
        alone = expected_rates(bw, flows)
        label = f"concurrent {_span(test.src)} -> {_span(test.dst)}"
        agg = aggregate_rate(pr, flows, label, alone)
        results.append((test.src, test.dst, flows, agg))
        pr.note(f"{label}: {len(flows)} pairs, {agg * 8 / 1e9:.3f} gbps in all "
                f"(alone {sum(alone) * 8 / 1e9:.3f})", force=True)
    return results


def extensions(pr: Prober, tests: Sequence[ExtensionTest], bw: np.ndarray
               ) -> List[ExtensionResult]:
    """Run the extension ``tests``; each gives ``(src, dst, rank, side, flows, aggregate)``."""
    results: List[ExtensionResult] = []
    for test in tests:
        flows = list(test.flows)
        alone = expected_rates(bw, flows)
        label = f"rank {test.rank} behind {_span(test.src)} -> {_span(test.dst)}"
        agg = aggregate_rate(pr, flows, label, alone)
        results.append((test.src, test.dst, test.rank, test.side, flows, agg))
        pr.note(f"{label}: {agg * 8 / 1e9:.3f} gbps together (alone "
                f"{sum(alone) * 8 / 1e9:.3f})")
    return results


def fans(pr: Prober, bw: np.ndarray, shared: Sequence[Mapping[str, Any]]
         ) -> Tuple[List[float], List[float]]:
    """(fan-out, fan-in) of every rank in bytes/s: one rank sending to all the others at once,
    then all the others sending to it, sized by what the known ``shared`` resources allow."""
    n = pr.n
    out, inn = [0.0] * n, [0.0] * n
    for k in range(n):
        others = [j for j in range(n) if j != k]
        for flows, into in (([(k, j) for j in others], out), ([(j, k) for j in others], inn)):
            label = f"fan-{'out' if into is out else 'in'} at rank {k}"
            into[k] = aggregate_rate(pr, flows, label, expected_rates(bw, flows, shared))
        pr.note(f"host limits: {k + 1}/{n} ranks")
    return out, inn
