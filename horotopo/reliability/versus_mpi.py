"""horotopo against MPI_Allreduce: the rows an allreduce benchmark prints, the table per size
beside the plan's prediction, and the verdict at the largest size.

A row is one buffer size of ``benchmarks/allreduce_perf.py --json``: ``size`` (bytes),
``time_s`` (horotopo's), ``mpi_time_s`` (MPI_Allreduce's, timed in the same run), ``ratio``
(MPI's time over horotopo's) and ``wrong`` (mismatched elements). Pure, so the verdict is the
same on an emulated cluster and on made-up rows.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence, Tuple

from ..plan import format_size

__all__ = ["benchmark_rows", "versus_mpi_report"]


def benchmark_rows(stdout: str) -> List[Dict[str, Any]]:
    """The rows of the benchmark's JSON document in ``stdout`` (rank 0 prints it; other lines
    may come before or after it).

    Raises
    ------
    RuntimeError
        No line holds a JSON document with ``rows``.
    """
    try:
        return list(json.loads(stdout)["rows"])
    except (ValueError, KeyError, TypeError):
        pass
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"rows"' in line:
            try:
                return list(json.loads(line)["rows"])
            except (ValueError, KeyError):
                continue
    raise RuntimeError("the benchmark printed no JSON document with 'rows'")


def versus_mpi_report(rows: Sequence[Dict[str, Any]], plan: Any, emulated: bool
                      ) -> Tuple[str, bool]:
    """The table and the verdict line; the flag is False when any result was wrong (or there
    are no rows).

    ``plan`` gives the prediction (``predict_time(bytes)``), which holds for the topology's
    links only: ``emulated`` False (plain local ranks) says so and leaves it out of the
    verdict.
    """
    lines = [f"{'size':>10} {'horotopo':>11} {'MPI_Allreduce':>14} {'MPI/horotopo':>13} "
             f"{'predicted':>11} {'wrong':>6}"]
    ok = True
    for row in rows:
        size = int(row["size"])
        pred = plan.predict_time(size)
        ok &= int(row.get("wrong", 0)) == 0
        lines.append(f"{format_size(size):>10} {row['time_s'] * 1e3:>9.1f}ms "
                     f"{row['mpi_time_s'] * 1e3:>12.1f}ms {row['ratio']:>12.2f}x "
                     f"{pred * 1e3:>9.1f}ms {int(row.get('wrong', 0)):>6}")
    if not emulated:
        lines.append("(predicted: for the topology's links, which plain local ranks do not have)")
    if not rows:
        return "\n".join(lines), False
    big = max(rows, key=lambda r: int(r["size"]))
    size = int(big["size"])
    ratio = float(big["ratio"])
    pred = plan.predict_time(size)
    if not ok:
        verdict = "verdict: WRONG RESULTS (mismatched elements above); the timings do not count"
    else:
        how = ("faster than" if ratio >= 1.05 else "slower than" if ratio <= 0.95
               else "on par with")
        verdict = (f"verdict: at {format_size(size)} horotopo is {how} MPI_Allreduce "
                   f"({ratio:.2f}x)")
        if emulated:
            verdict += (f", and took {big['time_s'] / pred:.2f}x the plan's predicted "
                        f"{pred * 1e3:.0f} ms")
        else:
            verdict += " on plain local ranks (not the topology's links: no prediction)"
    return "\n".join(lines + [verdict]), ok
