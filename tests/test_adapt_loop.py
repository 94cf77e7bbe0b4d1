"""The adaptive engine's switch over the in-process transport (threads standing in for ranks):
the re-plan's exchanges, the targeted re-probe and the plan protocol speak only to the
transport, so the switch runs without MPI; every rank switches to the same plan, and a planner
failure on rank 0 is raised on every rank."""
import numpy as np
import pytest

from horotopo.adapt import AdaptiveEngine
from horotopo.adapt.runtime import ReplanError
from horotopo.bootstrap import uniform_document
from horotopo.plan import make_plan
from horotopo.topology import from_dict
from loop_transport import run_ranks

N = 3


def _inputs(rank, step, count=4096):
    return ((np.arange(count) + rank + step) % 5).astype(np.float32)


def _want(step, count=4096):
    return sum(_inputs(r, step, count) for r in range(N))


def test_replan_switches_every_rank_to_the_same_plan():
    # 1000 gbps claimed: the re-probe of in-process copies finds less, so the model changes
    topo = from_dict(uniform_document(N, 1000.0))
    plan = make_plan(topo, chunk_bytes=4096)

    def body(t):
        eng = AdaptiveEngine(t, plan, topo, adapt=False, timeout_s=0)
        try:
            ok = all(np.array_equal(eng.allreduce(_inputs(t.rank, s), algorithm="tree"),
                                    _want(s)) for s in range(3))
            ev = eng.replan("test")
            ok &= np.array_equal(eng.allreduce(_inputs(t.rank, 3), algorithm="tree"), _want(3))
            return ok, ev, eng.plan.digest, eng.tracked.outstanding
        finally:
            eng.close()

    got = run_ranks(N, body)
    assert all(ok for ok, _, _, _ in got)
    events = [ev for _, ev, _, _ in got]
    assert all(ev.switched for ev in events), [ev.note for ev in events]
    assert len({(ev.new_digest, tuple(ev.suspects)) for ev in events}) == 1
    assert len({digest for _, _, digest, _ in got}) == 1
    assert events[0].new_digest == got[0][2]
    assert all(left == 0 for _, _, _, left in got)


def test_a_planner_failure_on_rank_0_is_raised_on_every_rank():
    topo = from_dict(uniform_document(N, 1000.0))
    plan = make_plan(topo, chunk_bytes=4096)

    def planner(t):
        raise ValueError("no trees today")

    def body(t):
        eng = AdaptiveEngine(t, plan, topo, adapt=False, timeout_s=0, planner=planner)
        try:
            eng.allreduce(_inputs(t.rank, 0), algorithm="tree")
            with pytest.raises(ReplanError) as caught:
                eng.replan("test")
            return str(caught.value), eng.plan.digest
        finally:
            eng.close()

    got = run_ranks(N, body)
    assert all(msg == "rank 0 could not re-plan: ValueError: no trees today" for msg, _ in got)
    assert all(digest == plan.digest for _, digest in got)  # the old plan stays
