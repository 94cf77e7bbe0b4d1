"""The robustness verdict: how close repeated allreduce jobs came to the optimum, and the misses.

Each job is one worker's document: per buffer size, the times of horotopo's allreduce
(``hvd_s``), of ``MPI_Allreduce`` in the same run (``mpi_s``), the algorithms it picked, and the
count of wrong elements. The targets hold at :data:`TARGET_SIZE`: every job reaches at least
:data:`MIN_FRACTION` of the optimum, their median at least :data:`MEDIAN_FRACTION`, none takes
more than :data:`MPI_SLACK` times ``MPI_Allreduce``'s time, and no element is wrong anywhere.
Pure, so the verdict is the same on a cluster and on made-up documents.
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Sequence, Tuple

MIN_FRACTION = 0.75
MEDIAN_FRACTION = 0.85
MPI_SLACK = 1.05  # horotopo may take at most this times MPI_Allreduce's time
TARGET_SIZE = 16 << 20


def _spread(values: Sequence[float]) -> Dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(name: str, optimum_s: Dict[int, float], jobs: Sequence[Dict[str, Any]]
              ) -> Tuple[Dict[str, Any], List[str]]:
    """Per-size statistics of topology ``name`` over ``jobs``, and one line per target missed.

    ``optimum_s`` maps each buffer size (bytes) to the optimal allreduce time; the fraction of a
    job is that time over the median of its ``hvd_s``.
    """
    sizes: Dict[int, Dict[str, Any]] = {}
    misses: List[str] = []
    for size, opt in sorted(optimum_s.items()):
        fractions, ratios, counts = [], [], {}
        for job in jobs:
            row = next(r for r in job["rows"] if int(r["size"]) == size)
            hvd = statistics.median(row["hvd_s"])
            mpi = statistics.median(row["mpi_s"])
            fractions.append(opt / hvd)
            ratios.append(mpi / hvd)
            for alg in row["algorithms"]:
                counts[alg] = counts.get(alg, 0) + 1
        entry = {"size": size, "optimum_s": opt, "fraction": _spread(fractions),
                 "ratio_to_mpi": _spread(ratios), "fractions": fractions, "ratios": ratios,
                 "algorithms": counts}
        sizes[size] = entry
        if size == TARGET_SIZE:
            f = entry["fraction"]
            if f["min"] < MIN_FRACTION:
                misses.append(f"{name} 16 MiB: minimum fraction of optimum {f['min']:.3f} "
                              f"< {MIN_FRACTION}")
            if f["median"] < MEDIAN_FRACTION:
                misses.append(f"{name} 16 MiB: median fraction of optimum {f['median']:.3f} "
                              f"< {MEDIAN_FRACTION}")
            worst = min(ratios)
            if worst < 1.0 / MPI_SLACK:
                misses.append(f"{name} 16 MiB: a job took {1.0 / worst:.3f}x MPI_Allreduce's "
                              f"time (> {MPI_SLACK})")
    wrong = sum(int(j.get("wrong", 0)) for j in jobs)
    if wrong:
        misses.append(f"{name}: {wrong} wrong elements")
    return {"name": name, "jobs": len(jobs), "sizes": list(sizes.values()),
            "replans": [int(j.get("replans", 0)) for j in jobs],
            "init_s": [round(float(j.get("init_s", 0.0)), 3) for j in jobs],
            "cost_models": [j.get("cost_model", "") for j in jobs]}, misses
