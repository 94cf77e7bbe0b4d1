"""The probe's result as text: the nccl-tests style report that ``horotopo probe`` prints.

Reads only the measured-topology document (:func:`horotopo.probe.infer.build_document`), so it
prints a document loaded from a file as well as one just measured.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence

__all__ = ["format_report"]


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
