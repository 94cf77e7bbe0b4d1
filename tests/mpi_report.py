"""What the MPI tier's inner pytest runs did: per rank, each test's outcome and each skip's reason.

tests/test_mpi_tier.py launches ``pytest tests/mpi`` under mpiexec. mpiexec's exit status says
only that nothing failed: a module that skips itself (torch missing, say) passes just as well. So
each launch sets ``HOROTOPO_MPI_REPORT`` to a directory; tests/conftest.py then registers
:class:`RankReport` in every rank's pytest, and each rank writes ``rank<i>.json`` there when its
session ends. :func:`check_launch` reads them back, counts the outcomes for the outer test's
report, and lists what is wrong: a rank that wrote nothing, ranks that disagree, nothing run, or a
skip that :data:`ALLOWED_SKIPS` does not allow for a launch of that size.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpu_support import SKIP_REASON as NO_CUDA_DEVICE

REPORT_ENV = "HOROTOPO_MPI_REPORT"


@dataclass(frozen=True)
class AllowedSkip:
    """A skip that may occur inside the MPI tier, and why it is not a hidden failure."""
    reason: str                      # a regular expression the whole skip reason must match
    why: str                         # what makes the skip expected
    max_ranks: Optional[int] = None  # allowed only in launches of at most this many ranks


ALLOWED_SKIPS: Tuple[AllowedSkip, ...] = (
    AllowedSkip(re.escape(NO_CUDA_DEVICE),
                "a CPU-only machine has no CUDA device; benchmarks/gpu_check.sh sets "
                "HOROTOPO_TEST_GPU=1, which turns this skip into a failure"),
    AllowedSkip(re.escape("this torch build has no CUDA (a CPU build)"),
                "launch/venv.sh installs the CPU build of torch"),
    AllowedSkip(re.escape("MPI is not CUDA-aware here: ") + ".*",
                "the PyPI MPICH wheel is not CUDA-aware; the host-staged path is tested instead"),
    AllowedSkip("needs at least 2 ranks.*|needs two ranks.*|a mismatch needs at least two ranks",
                "one rank has no peer to disagree with or to wait for", max_ranks=1),
)


def _rank_from_env() -> int:
    """This process's rank, from what the MPI launcher exports (no MPI call at session end)."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    mpi = sys.modules.get("mpi4py.MPI")
    return int(mpi.COMM_WORLD.rank) if mpi is not None else 0


def _skip_reason(longrepr: Any) -> str:
    # A skip's longrepr is (path, lineno, "Skipped: <reason>") for skip(), skipif and
    # importorskip alike, at collection as at run time.
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


class RankReport:
    """A pytest plugin: records every test's outcome and writes them as JSON at session end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.outcomes: Dict[str, str] = {}   # nodeid -> passed/failed/skipped/xfailed/xpassed/error
        self.skips: Dict[str, str] = {}      # nodeid -> reason

    def pytest_collectreport(self, report: Any) -> None:
        if report.skipped:                   # a whole module skipped (importorskip at the top)
            self.outcomes[report.nodeid] = "skipped"
            self.skips[report.nodeid] = _skip_reason(report.longrepr)
        elif report.failed:
            self.outcomes[report.nodeid] = "error"

    def pytest_runtest_logreport(self, report: Any) -> None:
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            outcome = (("xfailed" if report.skipped else "xpassed") if xfail
                       else report.outcome)
        elif report.failed:                  # setup or teardown raised
            outcome = "error"
        elif report.skipped and report.when == "setup":
            outcome = "xfailed" if xfail else "skipped"
        else:
            return
        if outcome == "skipped":
            self.skips[report.nodeid] = _skip_reason(report.longrepr)
        if self.outcomes.get(report.nodeid) != "error":  # a teardown error outranks a pass
            self.outcomes[report.nodeid] = outcome

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        rank = _rank_from_env()
        doc = {"rank": rank, "exitstatus": int(exitstatus), "outcomes": self.outcomes,
               "skips": self.skips}
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"rank{rank}.json").write_text(json.dumps(doc, indent=1))


def register(config: Any) -> None:
    """Register :class:`RankReport` where ``HOROTOPO_MPI_REPORT`` names a directory (a pytest
    session inside an MPI-tier launch); elsewhere do nothing."""
    report_dir = os.environ.get(REPORT_ENV)
    if report_dir:
        config.pluginmanager.register(RankReport(Path(report_dir)), "horotopo_mpi_report")


def read_reports(directory: Path) -> Dict[int, Dict[str, Any]]:
    """rank -> that rank's report, for every rank<i>.json in ``directory``."""
    found = {}
    for path in sorted(directory.glob("rank*.json")):
        doc = json.loads(path.read_text())
        found[int(doc["rank"])] = doc
    return found


def allowed(reason: str, n: int, allow: Sequence[AllowedSkip] = ALLOWED_SKIPS) -> bool:
    """Whether a skip with this reason may occur in a launch of ``n`` ranks."""
    return any(re.fullmatch(a.reason, reason) and (a.max_ranks is None or n <= a.max_ranks)
               for a in allow)


@dataclass(frozen=True)
class LaunchResult:
    """One launch's inner results (rank 0's counts; the ranks are checked to agree)."""
    label: str
    counts: Dict[str, int]
    skip_reasons: Dict[str, int]     # reason -> how many tests skipped with it
    problems: List[str]

    def line(self) -> str:
        order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
        counts = ", ".join(f"{self.counts[k]} {k}" for k in order if self.counts.get(k))
        why = "; ".join(f"{c} x {r!r}" for r, c in sorted(self.skip_reasons.items()))
        return f"{self.label}: {counts or 'no tests'}" + (f" (skipped: {why})" if why else "")


def check_launch(label: str, n: int, reports: Dict[int, Dict[str, Any]],
                 allow: Sequence[AllowedSkip] = ALLOWED_SKIPS) -> LaunchResult:
    """Counts of a launch of ``n`` ranks and what is wrong with it (empty when all is well)."""
    problems = []
    missing = sorted(set(range(n)) - set(reports))
    if missing:
        problems.append(f"ranks {missing} wrote no report (did they reach the end of pytest?)")
    first = reports[min(reports)] if reports else {"outcomes": {}, "skips": {}}
    unlisted: Dict[Tuple[str, str], List[int]] = {}
    for rank, doc in sorted(reports.items()):
        if doc["outcomes"] != first["outcomes"]:
            differ = sorted(k for k in set(doc["outcomes"]) | set(first["outcomes"])
                            if doc["outcomes"].get(k) != first["outcomes"].get(k))
            problems.append(f"rank {rank} disagrees with rank {min(reports)} on "
                            f"{len(differ)} tests, e.g. {differ[:3]}")
        for nodeid, reason in doc["skips"].items():
            if not allowed(reason, n, allow):
                unlisted.setdefault((nodeid, reason), []).append(rank)
    for (nodeid, reason), ranks in sorted(unlisted.items()):
        problems.append(f"{nodeid} skipped on ranks {ranks} ({reason!r}): not on the "
                        f"allow-list for {n} ranks (tests/mpi_report.py ALLOWED_SKIPS)")
    counts = Counter(first["outcomes"].values())
    if not counts.get("passed"):
        problems.append("no test passed")
    return LaunchResult(label, dict(counts), dict(Counter(first["skips"].values())), problems)
