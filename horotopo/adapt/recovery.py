"""The recovery verdict: did a job re-plan after the network changed, and how well did it recover.

A run's series holds one entry per timed call: its ``step``, its ``phase`` (``"before"`` or
``"after"`` the change), its ``seconds``, and whether the call ``replanned``. ``fresh_s`` are the
times of a plan made afresh for the changed network, and ``wrong`` counts wrong elements.
Pure, so the verdict is the same on an emulated cluster and on made-up series.
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List


def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize_recovery(res: Dict[str, Any], tolerance: float, skip: int) -> Dict[str, Any]:
    """Medians per phase and the verdict ``ok``.

    ``ok`` holds when no element was wrong, the job re-planned after the change, and the calls
    after the re-plan (less the first ``skip``) took at most ``1 + tolerance`` times the fresh
    plan's median (its worst time dropped). ``calls_to_detect`` counts the calls after the
    change up to and including the one that re-planned.
    """
    series = res["series"]
    switch = [s["step"] for s in series if s["replanned"] and s["phase"] == "after"]
    before = [s["seconds"] for s in series if s["phase"] == "before"][skip:]
    half = min(s["step"] for s in series if s["phase"] == "after")
    degraded = [s["seconds"] for s in series
                if s["phase"] == "after" and (not switch or s["step"] <= switch[0])]
    recovered = ([s["seconds"] for s in series if switch and s["step"] > switch[0]][skip:]
                 if switch else [])
    fresh = sorted(res["fresh_s"])[:max(1, len(res["fresh_s"]) - 1)]  # drop the worst
    rec, fr = _median(recovered), _median(fresh)
    ratio = rec / fr if recovered and fr > 0 else float("nan")
    return {"before_s": _median(before), "degraded_s": _median(degraded), "recovered_s": rec,
            "fresh_s": fr, "recovered_over_fresh": ratio,
            "replan_step": switch[0] if switch else None, "degrade_step": half,
            "calls_to_detect": (switch[0] - half + 1) if switch else None,
            "ok": bool(res["wrong"] == 0 and switch and ratio <= 1.0 + tolerance)}
