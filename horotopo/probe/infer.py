"""From measurements to the measured topology: the pure half of the probe (no MPI here).

The probe (:mod:`horotopo.probe.measure`) runs the tests that this module schedules and hands the
figures back; everything that decides what the figures mean lives here, so that it can be tested
on synthetic matrices.

- :func:`circle_rounds`: the round-robin schedule (circle method) of disjoint pairs.
- :func:`cluster_ranks`: groups of ranks by their pairwise rates (single linkage cut at the
  widest gap between rate levels, so a uniform network stays one group).
- :func:`cluster_levels`: the same cut at every such gap (ranks on a host, hosts in a rack...).
- :func:`group_tests`: which concurrent cross-group tests to run.
- :func:`infer_shared`: a shared resource wherever the concurrent aggregate is clearly below the
  sum of the pairwise figures. Pairwise figures are not additive: two racks behind one uplink
  give each cross pair the full uplink alone, but concurrent cross pairs split it.
- :func:`extension_tests` / :func:`extend_shared`: whether a rank that no group holds (a slow
  NIC in a rack) sits behind a shared resource too.
- :func:`infer_host_caps`: per-rank egress/ingress caps, kept only where they bind.
- :func:`build_document`: the measured-topology JSON of DESIGN.md, validated by loading it.
- :func:`format_report`: the nccl-tests style text that ``horotopo probe`` prints.

Every rate here is in one unit chosen by the caller (the probe passes gbps); only ratios matter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..topology import from_dict, measured_document

__all__ = ["circle_rounds", "cluster_ranks", "cluster_levels", "GroupTest", "group_tests",
           "infer_shared", "ExtensionTest", "extension_tests", "extend_shared", "infer_all",
           "infer_host_caps", "expected_fan", "expected_rates", "build_document", "format_report",
           "DEFAULT_GAP", "DEFAULT_MARGIN"]

Pair = Tuple[int, int]

DEFAULT_GAP = 1.5     # rate levels closer than this ratio are one level (noise, not structure)
DEFAULT_MARGIN = 0.2  # "clearly below": more than 20% under what the pairwise figures predict


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


def _matrix(bandwidth: Any) -> np.ndarray:
    b = np.array([[np.nan if v is None else float(v) for v in row] for row in bandwidth])
    if b.ndim != 2 or b.shape[0] != b.shape[1]:
        raise ValueError(f"bandwidth must be a square matrix, got shape {b.shape}")
    return b


def _symmetric(bandwidth: Any) -> np.ndarray:
    b = _matrix(bandwidth)
    # The geometric mean of the two directions: an asymmetric uplink still stands out (0.2
    # one way and 0.9 the other is 0.42 against 1.0 inside a rack), and one direction that
    # measured low (the usual way measurements go wrong) moves the pair half as far.
    with np.errstate(invalid="ignore"):
        return np.sqrt(b * b.T)


def _partition(s: np.ndarray, threshold: float) -> List[List[int]]:
    """Connected components of the pairs at or above ``threshold`` (single linkage)."""
    n = s.shape[0]
    parent = list(range(n))

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for i, j in zip(*np.triu_indices(n, 1)):
        if s[i, j] >= threshold:
            parent[find(int(i))] = find(int(j))
    groups: Dict[int, List[int]] = {}
    for v in range(n):
        groups.setdefault(find(v), []).append(v)
    return sorted(groups.values(), key=lambda g: g[0])


def _levels(bandwidth: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(symmetric rates, distinct pair rates high to low, ratios between neighbours)."""
    s = _symmetric(bandwidth)
    n = s.shape[0]
    iu = np.triu_indices(n, 1)
    values = np.sort(s[iu][np.isfinite(s[iu])])[::-1]
    if len(values) < 2 or values[-1] <= 0:
        return s, values, np.zeros(0)
    return s, values, values[:-1] / values[1:]


def cluster_ranks(bandwidth: Any, *, gap: float = DEFAULT_GAP) -> List[List[int]]:
    """Groups of ranks that talk to each other faster than to the rest.

    Sorts the distinct pair rates, finds the widest ratio between consecutive levels and, if it
    is at least ``gap``, joins every pair above it (single linkage); the connected components
    are the groups. A network whose rates are all within ``gap`` of each other is one group.

    Parameters
    ----------
    bandwidth : n x n array-like
        ``bandwidth[i][j]`` is the rate ``i -> j`` alone; the diagonal is ignored.
    gap : float
        Smallest ratio between two rate levels that counts as structure rather than noise.

    Returns
    -------
    list of list of int
        Groups, each sorted, ordered by their lowest rank.
    """
    s, values, ratios = _levels(bandwidth)
    n = s.shape[0]
    if n < 3 or not len(ratios) or ratios.max() < gap:
        return [list(range(n))]
    k = int(np.argmax(ratios))
    return _partition(s, math.sqrt(values[k] * values[k + 1]))


def cluster_levels(bandwidth: Any, *, gap: float = DEFAULT_GAP) -> List[List[List[int]]]:
    """The groups at every gap of at least ``gap`` between rate levels, finest first.

    Networks are nested (ranks on a host, hosts in a rack, racks behind a spine): each gap
    between rate levels cuts one level. Partitions into a single group or into single ranks
    only are left out, as are repeats.
    """
    s, values, ratios = _levels(bandwidth)
    n = s.shape[0]
    out: List[List[List[int]]] = []
    if n < 3:
        return out
    for k in np.flatnonzero(ratios >= gap):
        part = _partition(s, math.sqrt(values[k] * values[k + 1]))
        if 1 < len(part) < n and part not in out:
            out.append(part)
    return out


@dataclass(frozen=True)
class GroupTest:
    """A concurrent test: ``flows`` from ranks of ``src`` to ranks of ``dst``, all at once.

    If their aggregate is clearly below the sum of their pairwise rates, every pair from
    ``src`` to ``dst`` shares a resource (an uplink, a NIC) of the aggregate's capacity.
    """

    src: Tuple[int, ...]
    dst: Tuple[int, ...]
    flows: Tuple[Pair, ...]


def _spread(groups: Sequence[Sequence[int]]) -> List[int]:
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
                rest = _spread([g for y, g in enumerate(groups) if y != x])
                add(a, rest)
                add(rest, a)
    return tests


def infer_shared(bandwidth: Any, results: Sequence[Tuple[Sequence[int], Sequence[int],
                                                         Sequence[Pair], float]], *,
                 margin: float = DEFAULT_MARGIN,
                 known: Sequence[Mapping[str, Any]] = ()) -> List[Dict[str, Any]]:
    """Shared resources from concurrent tests.

    Parameters
    ----------
    bandwidth : n x n pairwise rates (alone)
    results : sequence of ``(src ranks, dst ranks, flows, aggregate)``
        ``flows`` are the directed pairs that ran at once from ``src`` to ``dst``;
        ``aggregate`` is their measured total rate.
    margin : float
        The aggregate must be below ``(1 - margin)`` times the sum of the flows' pairwise rates.
    known : shared resources found already
        The expectation for the flows takes these into account (:func:`expected_rates`), so a
        test that only meets a resource already known adds nothing.

    Returns
    -------
    list of dict
        ``{"pairs": every [i, j] from src to dst, "gbps": aggregate, "label": ...}``
        (``gbps`` is in the unit of the inputs).
    """
    shared = []
    for src, dst, flows, aggregate in results:
        alone = float(sum(expected_rates(bandwidth, flows, known)))
        if not (aggregate > 0 and math.isfinite(aggregate)):
            raise ValueError(f"ranks {list(src)} -> {list(dst)}: aggregate must be positive, "
                             f"got {aggregate!r}")
        if aggregate < (1.0 - margin) * alone:
            pairs = [[int(i), int(j)] for i in src for j in dst]
            shared.append({"pairs": pairs, "gbps": float(aggregate),
                           "label": f"shared {_ranks(src)}->{_ranks(dst)}"})
    return shared


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


def _ends(shared: Mapping[str, Any]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
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
        a, b = _ends(s)
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


def extend_shared(shared: Sequence[Mapping[str, Any]], bandwidth: Any,
                  results: Sequence[Tuple[Sequence[int], Sequence[int], int, str,
                                          Sequence[Pair], float]], *,
                  margin: float = DEFAULT_MARGIN) -> List[Dict[str, Any]]:
    """``shared`` with ranks added where an :class:`ExtensionTest` showed sharing.

    ``results`` holds ``(src, dst, rank, side, flows, aggregate)``: when the two flows together
    get clearly less than the sum of their pairwise rates, ``rank`` joins the resource's
    sources (or destinations), and the resource covers every pair from the one set to the
    other.
    """
    b = _matrix(bandwidth)
    grow: Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], Tuple[set, set]] = {}
    for src, dst, rank, side, flows, aggregate in results:
        if not (aggregate > 0 and math.isfinite(aggregate)):
            raise ValueError(f"rank {rank} against {list(src)} -> {list(dst)}: aggregate must "
                             f"be positive, got {aggregate!r}")
        if aggregate < (1.0 - margin) * float(sum(b[i, j] for i, j in flows)):
            add = grow.setdefault((tuple(src), tuple(dst)), (set(), set()))
            add[0 if side == "src" else 1].add(int(rank))
    out = []
    for s in shared:
        s = dict(s)
        key = _ends(s)
        if key in grow:
            a = sorted(set(key[0]) | grow[key][0])
            d = sorted(set(key[1]) | grow[key][1])
            s["pairs"] = [[i, j] for i in a for j in d if i != j]
            s["label"] = f"shared {_ranks(a)}->{_ranks(d)}"
        out.append(s)
    return out


def infer_all(bandwidth: Any, results: Sequence[Tuple[Sequence[int], Sequence[int],
                                                      Sequence[Pair], float]],
              extension_results: Sequence[Tuple[Sequence[int], Sequence[int], int, str,
                                                Sequence[Pair], float]] = (), *,
              margin: float = DEFAULT_MARGIN) -> List[Dict[str, Any]]:
    """Every shared resource the concurrent tests show, in order of specificity.

    First the tests between groups that leave some ranks out, extended by the extension tests;
    then the tests that span every rank (a group against all the others, or the two groups of
    a two-group network), judged against what is known by then. A group's test against the
    rest can run into another group's known downlink; that must not read as its own uplink.
    """
    n = _matrix(bandwidth).shape[0]
    spans = [len(set(r[0]) | set(r[1])) >= n for r in results]
    narrow = [r for r, wide in zip(results, spans) if not wide]
    wide = [r for r, w in zip(results, spans) if w]
    shared = extend_shared(infer_shared(bandwidth, narrow, margin=margin), bandwidth,
                           extension_results, margin=margin)
    return shared + infer_shared(bandwidth, wide, margin=margin, known=shared)


def _ranks(members: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in members)


def expected_rates(bandwidth: Any, flows: Sequence[Pair],
                   shared: Sequence[Mapping[str, Any]] = ()) -> List[float]:
    """The rate each of ``flows`` would get, all at once, with no cap at any rank.

    A flow gets its pairwise rate, except that the flows crossing one shared resource together
    are scaled down to fit its capacity. The probe sizes concurrent transfers in proportion to
    these, so that they finish together unless a cap it has not found yet binds.
    """
    b = _matrix(bandwidth)
    rates = [float(b[i, j]) for i, j in flows]
    for s in shared:
        pairs = {tuple(p) for p in s["pairs"]}
        members = [f for f, arc in enumerate(flows) if tuple(arc) in pairs]
        total = sum(rates[f] for f in members)
        if total > float(s["gbps"]):
            for f in members:
                rates[f] *= float(s["gbps"]) / total
    return rates


def expected_fan(bandwidth: Any, k: int, shared: Sequence[Mapping[str, Any]],
                 outgoing: bool) -> float:
    """What rank ``k``'s fan-out (or fan-in) would reach with no cap at ``k`` itself."""
    n = _matrix(bandwidth).shape[0]
    flows = [((k, j) if outgoing else (j, k)) for j in range(n) if j != k]
    return float(sum(expected_rates(bandwidth, flows, shared)))


def infer_host_caps(bandwidth: Any, fan_out: Sequence[Optional[float]],
                    fan_in: Sequence[Optional[float]], shared: Sequence[Mapping[str, Any]] = (),
                    *, margin: float = DEFAULT_MARGIN
                    ) -> Tuple[Optional[List[Optional[float]]], Optional[List[Optional[float]]]]:
    """Egress and ingress caps per rank, kept only where they bind.

    Rank ``k``'s measured fan-out is its egress cap when it is clearly below
    :func:`expected_fan` (otherwise the pairwise and shared resources already explain it and a
    cap would only add noise to the model). Same for fan-in and ingress.

    Returns
    -------
    (egress, ingress)
        Each a list with ``None`` where the cap does not bind, or ``None`` if no rank's does.
    """
    caps = []
    for figures, outgoing in ((fan_out, True), (fan_in, False)):
        row: List[Optional[float]] = []
        for k, value in enumerate(figures):
            if value is None or not math.isfinite(value):
                row.append(None)
                continue
            if value <= 0:
                raise ValueError(f"rank {k}: fan-{'out' if outgoing else 'in'} must be positive, "
                                 f"got {value!r}")
            want = expected_fan(bandwidth, k, shared, outgoing)
            row.append(float(value) if value < (1.0 - margin) * want else None)
        caps.append(row if any(v is not None for v in row) else None)
    return caps[0], caps[1]


def build_document(name: str, hosts: Sequence[str], bandwidth_gbps: Any, latency_ms: Any, *,
                   fan_out_gbps: Optional[Sequence[Optional[float]]] = None,
                   fan_in_gbps: Optional[Sequence[Optional[float]]] = None,
                   shared_results: Sequence[Tuple[Sequence[int], Sequence[int],
                                                  Sequence[Pair], float]] = (),
                   extension_results: Sequence[Tuple[Sequence[int], Sequence[int], int, str,
                                                     Sequence[Pair], float]] = (),
                   groups: Optional[Sequence[Sequence[int]]] = None,
                   gap: float = DEFAULT_GAP, margin: float = DEFAULT_MARGIN,
                   meta: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The measured-topology document from the probe's figures (all in gbps and ms).

    Runs the inference (groups, shared resources, binding host caps), assembles the document
    with :func:`horotopo.topology.measured_document` and validates it by loading it.
    ``meta`` goes under the document's ``"probe"`` key with the groups found.
    """
    n = len(hosts)
    bw = [[None if i == j else _round(bandwidth_gbps[i][j]) for j in range(n)] for i in range(n)]
    lat = [[None if i == j else _round(latency_ms[i][j]) for j in range(n)] for i in range(n)]
    if groups is None:
        groups = cluster_ranks(bw, gap=gap)
    shared = infer_all(bw, shared_results, extension_results, margin=margin)
    for s in shared:
        s["gbps"] = _round(s["gbps"])
    egress = ingress = None
    if fan_out_gbps is not None and fan_in_gbps is not None:
        egress, ingress = infer_host_caps(bw, fan_out_gbps, fan_in_gbps, shared, margin=margin)
    doc = measured_document(name, hosts, bw, lat, egress_gbps=_round_list(egress),
                            ingress_gbps=_round_list(ingress), shared=shared)
    info: Dict[str, Any] = dict(meta or {})
    info["groups"] = [list(g) for g in groups]
    if fan_out_gbps is not None:
        info["fan_out_gbps"] = _round_list(fan_out_gbps)
    if fan_in_gbps is not None:
        info["fan_in_gbps"] = _round_list(fan_in_gbps)
    info["concurrent"] = [{"from": list(src), "to": list(dst), "flows": [list(f) for f in flows],
                           "gbps": _round(agg)} for src, dst, flows, agg in shared_results]
    info["extension"] = [{"from": list(src), "to": list(dst), "rank": rank, "side": side,
                          "flows": [list(f) for f in flows], "gbps": _round(agg)}
                         for src, dst, rank, side, flows, agg in extension_results]
    doc["probe"] = info
    from_dict(doc)
    return doc


def _round(v: Any) -> Optional[float]:
    if v is None:
        return None
    v = float(v)
    if v == 0 or not math.isfinite(v):
        return v
    return float(f"{v:.6g}")


def _round_list(values: Optional[Sequence[Optional[float]]]) -> Optional[List[Optional[float]]]:
    return None if values is None else [_round(v) for v in values]


def _matrix_lines(title: str, m: Sequence[Sequence[Any]], fmt: str) -> List[str]:
    n = len(m)
    lines = [f"# {title}", "#  S\\R " + "".join(f"{j:>9}" for j in range(n))]
    for i in range(n):
        cells = "".join(f"{'-':>9}" if i == j or m[i][j] is None else f"{m[i][j]:>9{fmt}}"
                        for j in range(n))
        lines.append(f"  {i:>4} {cells}")
    return lines


def format_report(doc: Mapping[str, Any]) -> str:
    """The probe's result as text in the style of nccl-tests (``#`` lines are commentary)."""
    n = len(doc["ranks"])
    info = doc.get("probe", {})
    groups = info.get("groups", [list(range(n))])
    group_of = {v: g for g, members in enumerate(groups) for v in members}
    head = f"# horotopo probe: {n} ranks"
    if "mode" in info:
        head += f", mode {info['mode']}"
    if "seconds" in info:
        head += f", {info['seconds']:.2f} s"
    if "tests" in info:
        head += f", {info['tests']} tests"
    lines = [head, "#", "#  rank  group  host"]
    lines += [f"#  {i:>4}  {group_of.get(i, 0):>5}  {h}" for i, h in enumerate(doc["ranks"])]
    lines.append("#")
    lines += _matrix_lines("bandwidth (gbps), sender down, receiver across",
                           doc["bandwidth_gbps"], ".3f")
    if "latency_ms" in doc:
        lines += _matrix_lines("latency (ms, one way)", doc["latency_ms"], ".3f")
    for key, label in (("egress_gbps", "egress cap"), ("ingress_gbps", "ingress cap")):
        caps = doc.get(key)
        if caps:
            cells = ", ".join(f"{k}: {v:.3f}" for k, v in enumerate(caps) if v is not None)
            lines.append(f"# {label} (gbps, binding only): {cells}")
    fans = [(info.get("fan_out_gbps"), "fan-out"), (info.get("fan_in_gbps"), "fan-in")]
    for figures, label in fans:
        if figures:
            cells = ", ".join(f"{k}: {v:.3f}" for k, v in enumerate(figures) if v is not None)
            lines.append(f"# {label} measured (gbps): {cells}")
    shared = doc.get("shared", [])
    if shared:
        lines.append("# shared bottlenecks:")
        for s in shared:
            arcs = " ".join(f"{i}->{j}" for i, j in s["pairs"])
            lines.append(f"#   {s.get('label', 'shared'):<22} {s['gbps']:.3f} gbps over "
                         f"{len(s['pairs'])} pairs: {arcs}")
    else:
        lines.append("# shared bottlenecks: none found")
    return "\n".join(lines)
