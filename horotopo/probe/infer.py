"""From measurements to the measured topology: the pure half of the probe (no transport here).

The probe (:mod:`horotopo.probe.measure`) runs the tests that :mod:`horotopo.probe.pairing`
schedules and hands the figures back; everything that decides what the figures mean lives here
and in :mod:`horotopo.probe.cluster`, so that it can be tested on synthetic matrices.

- :func:`infer_shared`: a shared resource wherever the concurrent aggregate is clearly below the
  sum of the pairwise figures. Pairwise figures are not additive: two racks behind one uplink
  give each cross pair the full uplink alone, but concurrent cross pairs split it.
- :func:`extend_shared`: ranks that no group holds (a slow NIC in a rack) added to the shared
  resources their extension tests showed them behind.
- :func:`infer_all`: both, in order of specificity.
- :func:`infer_host_caps`: per-rank egress/ingress caps, kept only where they bind.
- :func:`build_document`: the measured-topology JSON of docs/topology.md, validated by loading it.

The schedule (:func:`circle_rounds`, :func:`group_tests`, :func:`extension_tests`), the
clustering (:func:`cluster_ranks`, :func:`cluster_levels`) and the text report
(:func:`format_report`) live in modules of their own and stay importable from here.

Every rate here is in one unit chosen by the caller (the probe passes gbps); only ratios matter.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..params import PROBE
from ..topology import from_dict, measured_document
from .cluster import as_matrix, cluster_levels, cluster_ranks
from .pairing import (ExtensionResult, ExtensionTest, GroupResult, GroupTest, Pair, circle_rounds,
                      extension_tests, group_tests, resource_ends)
from .report import format_report

__all__ = ["circle_rounds", "cluster_ranks", "cluster_levels", "GroupTest", "group_tests",
           "infer_shared", "ExtensionTest", "extension_tests", "extend_shared", "infer_all",
           "infer_host_caps", "expected_fan", "expected_rates", "build_document", "format_report"]


def infer_shared(bandwidth: Any, results: Sequence[GroupResult], *,
                 margin: float = PROBE.margin,
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


def extend_shared(shared: Sequence[Mapping[str, Any]], bandwidth: Any,
                  results: Sequence[ExtensionResult], *,
                  margin: float = PROBE.margin) -> List[Dict[str, Any]]:
    """``shared`` with ranks added where an :class:`ExtensionTest` showed sharing.

    ``results`` holds ``(src, dst, rank, side, flows, aggregate)``: when the two flows together
    get clearly less than the sum of their pairwise rates, ``rank`` joins the resource's
    sources (or destinations), and the resource covers every pair from the one set to the
    other.
    """
    b = as_matrix(bandwidth)
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
        key = resource_ends(s)
        if key in grow:
            a = sorted(set(key[0]) | grow[key][0])
            d = sorted(set(key[1]) | grow[key][1])
            s["pairs"] = [[i, j] for i in a for j in d if i != j]
            s["label"] = f"shared {_ranks(a)}->{_ranks(d)}"
        out.append(s)
    return out


def infer_all(bandwidth: Any, results: Sequence[GroupResult],
              extension_results: Sequence[ExtensionResult] = (), *,
              margin: float = PROBE.margin) -> List[Dict[str, Any]]:
    """Every shared resource the concurrent tests show, in order of specificity.

    First the tests between groups that leave some ranks out, extended by the extension tests;
    then the tests that span every rank (a group against all the others, or the two groups of
    a two-group network), judged against what is known by then. A group's test against the
    rest can run into another group's known downlink; that must not read as its own uplink.
    """
    n = as_matrix(bandwidth).shape[0]
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
    b = as_matrix(bandwidth)
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
    n = as_matrix(bandwidth).shape[0]
    flows = [((k, j) if outgoing else (j, k)) for j in range(n) if j != k]
    return float(sum(expected_rates(bandwidth, flows, shared)))


def infer_host_caps(bandwidth: Any, fan_out: Sequence[Optional[float]],
                    fan_in: Sequence[Optional[float]], shared: Sequence[Mapping[str, Any]] = (),
                    *, margin: float = PROBE.margin
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
                   shared_results: Sequence[GroupResult] = (),
                   extension_results: Sequence[ExtensionResult] = (),
                   groups: Optional[Sequence[Sequence[int]]] = None,
                   gap: float = PROBE.gap, margin: float = PROBE.margin,
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
