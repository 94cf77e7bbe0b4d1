"""Which ranks the probe's tests pair up, and in what order (pure, no transport).

- :func:`circle_rounds`: the round-robin schedule (circle method) of disjoint pairs, the order
  of the pairwise tests.
- :func:`group_tests`: the concurrent cross-group tests, from the clustering's partitions.
- :func:`bipartitions`: every split of a few ranks in two, the partitions to test when the
  rates show no groups.
- :func:`extension_tests`: whether a rank that no group holds (a slow NIC in a rack) sits
  behind a shared resource that the group tests found.

The probe (:mod:`horotopo.probe.phases`) runs these tests and hands their results, typed
:data:`GroupResult` and :data:`ExtensionResult`, to the inference (:mod:`horotopo.probe.infer`).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any, List, Mapping, Sequence, Tuple

import numpy as np

from ..params import PROBE

__all__ = ["circle_rounds", "GroupTest", "group_tests", "bipartitions", "SCAN_MAX_RANKS",
           "ExtensionTest", "extension_tests", "resource_ends", "Pair", "GroupResult",
           "ExtensionResult", "round_robin"]

Pair = Tuple[int, int]
# What a concurrent test measured: (src ranks, dst ranks, the flows that ran at once, their
# aggregate rate).
GroupResult = Tuple[Sequence[int], Sequence[int], Sequence[Pair], float]
# What an extension test measured: (src ranks, dst ranks, the rank tried, its side ("src" or
# "dst"), the two flows, their aggregate rate).
ExtensionResult = Tuple[Sequence[int], Sequence[int], int, str, Sequence[Pair], float]


def circle_rounds(n: int) -> List[List[Pair]]:
    """Round-robin schedule of all unordered pairs of ``n`` ranks (the circle method).

    Rank ``n - 1`` (or a phantom rank when ``n`` is odd) stays fixed and the others rotate, so
    every round holds disjoint pairs and every pair meets once: ``n - 1`` rounds for even ``n``,
    ``n`` rounds (one rank idle in each) for odd ``n``. Pairs are ``(low, high)``.
    """
    if n < 2:
        return []
    m = n if n % 2 == 0 else n + 1
    ring = list(range(m - 1))
    rounds = []
    for r in range(m - 1):
        order = ring[r:] + ring[:r]
        pairs = [(order[0], m - 1)] + [(order[k], order[m - 1 - k]) for k in range(1, m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a < n and b < n))
    return rounds


#: Most ranks for which :func:`bipartitions` are all tested when the pair rates show no groups,
#: by default (:attr:`horotopo.params.ProbeParams.scan_max_ranks`, where the value is explained).
SCAN_MAX_RANKS = PROBE.scan_max_ranks


def bipartitions(n: int) -> List[List[List[int]]]:
    """Every split of ranks ``0..n-1`` into two groups of at least two ranks each, once.

    Shared links hide from the rate clustering when they are no slower than the NICs behind
    them: on ``random_declared(4, 12)`` a rack's 0.285 gbps uplink sits behind NICs of 0.29 and
    0.89 gbps, so every pair reads 0.28-0.38 gbps, one level, and without a group test the
    plan sends three flows through that uplink at once. In a tree network two flows that share
    a link have their sources on one side of it and their destinations on the other, so a
    link crossed by two disjoint pairs shows up in the group test of some split: its sources
    on one side, destinations on the other.

    Returns
    -------
    list of partitions
        Each ``[group with rank 0, the other group]``, groups sorted; ordered by the first
        group. Empty for ``n < 4``.
    """
    out: List[List[List[int]]] = []
    for k in range(1, n - 2):               # rank 0 and k others, at least two left over
        for others in combinations(range(1, n), k):
            first = [0, *others]
            out.append([first, [r for r in range(1, n) if r not in others]])
    return sorted(out)


@dataclass(frozen=True)
class GroupTest:
    """A concurrent test: ``flows`` from ranks of ``src`` to ranks of ``dst``, all at once.

    If their aggregate is clearly below the sum of their pairwise rates, every pair from
    ``src`` to ``dst`` shares a resource (an uplink, a NIC) of the aggregate's capacity.
    """

    src: Tuple[int, ...]
    dst: Tuple[int, ...]
    flows: Tuple[Pair, ...]


def round_robin(groups: Sequence[Sequence[int]]) -> List[int]:
    """The ranks of ``groups`` taken round-robin, one group after another."""
    out: List[int] = []
    for k in range(max((len(g) for g in groups), default=0)):
        out += [g[k] for g in groups if k < len(g)]
    return out


def group_tests(partitions: Sequence[Sequence[Sequence[int]]], min_pairs: int = 2
                ) -> List[GroupTest]:
    """The concurrent tests for every partition: between every two groups, both ways, and,
    with three groups or more, between each group and all the others (its uplink).

    A test pairs ranks one to one (``min(|A|, |B|)`` pairs, the other side's groups taken in
    turn); it needs at least ``min_pairs`` of them, since one transfer alone is just its
    pairwise figure. Accepts a single partition too (a list of groups).
    """
    if partitions and partitions[0] and isinstance(partitions[0][0], (int, np.integer)):
        partitions = [partitions]  # type: ignore[list-item]
    tests: List[GroupTest] = []
    seen = set()

    def add(src_order: Sequence[int], dst_order: Sequence[int]) -> None:
        m = min(len(src_order), len(dst_order))
        key = (tuple(sorted(src_order)), tuple(sorted(dst_order)))
        if m < min_pairs or key in seen:
            return
        seen.add(key)
        tests.append(GroupTest(src=key[0], dst=key[1],
                               flows=tuple((src_order[k], dst_order[k]) for k in range(m))))

    for groups in partitions:
        groups = [sorted(g) for g in groups]
        for x, a in enumerate(groups):
            for y, b in enumerate(groups):
                if x != y:
                    add(a, b)
        if len(groups) >= 3:
            for x, a in enumerate(groups):
                rest = round_robin([g for y, g in enumerate(groups) if y != x])
                add(a, rest)
                add(rest, a)
    return tests


@dataclass(frozen=True)
class ExtensionTest:
    """Does ``rank``'s traffic cross the shared resource found between ``src`` and ``dst``?

    ``flows`` are one transfer that is known to cross it and one from ``rank`` into ``dst``
    (``side == "src"``) or from ``src`` to ``rank`` (``side == "dst"``), run at once. A rank
    with a slow NIC in a rack has slow pairs to everyone, so the rates cannot place it; its
    traffic through the rack's uplink can.
    """

    src: Tuple[int, ...]
    dst: Tuple[int, ...]
    rank: int
    side: str
    flows: Tuple[Pair, Pair]


def resource_ends(shared: Mapping[str, Any]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(sources, destinations) of a shared resource: the ends of its pairs, each sorted."""
    return (tuple(sorted({int(p[0]) for p in shared["pairs"]})),
            tuple(sorted({int(p[1]) for p in shared["pairs"]})))


def extension_tests(shared: Sequence[Mapping[str, Any]], partitions: Sequence[Sequence[Sequence[int]]],
                    n: int) -> List[ExtensionTest]:
    """The tests that decide whether ranks no group holds sit behind each shared resource.

    Only ranks that are alone in their group at every level are tried (the others have
    group tests of their own), and only against resources that do not already span all ranks.
    """
    grouped = {v for part in partitions for g in part if len(g) > 1 for v in g}
    loners = [v for v in range(n) if v not in grouped]
    tests = []
    for s in shared:
        a, b = resource_ends(s)
        if len(set(a) | set(b)) >= n:
            continue
        for r in loners:
            if r in a or r in b:
                continue
            if len(b) >= 2:
                tests.append(ExtensionTest(a, b, r, "src", ((a[0], b[0]), (r, b[1]))))
            if len(a) >= 2:
                tests.append(ExtensionTest(a, b, r, "dst", ((a[0], b[0]), (a[1], r))))
    return tests
