"""The transport's small collective steps and its one poll loop, over the in-process transport
(threads standing in for ranks): results, rank order, and deadlines that name the missing peer.
"""
import time

import numpy as np
import pytest

from horotopo.bootstrap import BootstrapError, uniform_document
from horotopo.plan import Plan, make_plan, ring_plan
from horotopo.planning_protocol import share_plan
from horotopo.topology import from_dict
from horotopo.transport.base import TransportTimeout, WrappedTransport
from horotopo.transport.poll import DONE, IDLE, PROGRESS, poll
from loop_transport import run_ranks

SIZES = [1, 2, 3, 4]


def caught(fn):
    """``fn``'s result, or the exception it raised (so every rank's outcome can be checked)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the tests inspect it
        return exc


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_bytes_from_every_root(n):
    for root in range(n):
        got = run_ranks(n, lambda t: t.broadcast_bytes(
            f"from {t.rank}".encode() if t.rank == root else None, root, 10))
        assert got == [f"from {root}".encode()] * n


@pytest.mark.parametrize("n", SIZES)
def test_gather_bytes_in_rank_order_on_the_root_only(n):
    root = n - 1
    got = run_ranks(n, lambda t: t.gather_bytes(b"x" * t.rank, root, 10))
    assert got[root] == [b"x" * r for r in range(n)]
    assert all(g is None for r, g in enumerate(got) if r != root)


@pytest.mark.parametrize("n", SIZES)
def test_allgather_and_objects(n):
    got = run_ranks(n, lambda t: (t.allgather_bytes(bytes([t.rank]) * 3, 10),
                                  t.allgather_object({"rank": t.rank}, 10),
                                  t.broadcast_object([1, "two"] if t.rank == 0 else None, 0, 10),
                                  t.gather_object(t.rank * 10, 0, 10)))
    for r, (raw, objs, shared, gathered) in enumerate(got):
        assert raw == [bytes([p]) * 3 for p in range(n)]
        assert objs == [{"rank": p} for p in range(n)]
        assert shared == [1, "two"]
        assert gathered == ([p * 10 for p in range(n)] if r == 0 else None)


@pytest.mark.parametrize("n", SIZES)
def test_control_allreduce_with_deadline_and_barrier(n):
    def body(t):
        vec = np.array([t.rank, -t.rank, 1.5], dtype=np.float64)
        t.allreduce_control(vec, "max", timeout_s=10)
        total = np.array([t.rank + 1], dtype=np.int64)
        t.allreduce_control(total, "sum", timeout_s=10)
        t.barrier(10)
        return vec.tolist(), int(total[0])

    for vec, total in run_ranks(n, body):
        assert vec == [n - 1, 0, 1.5] and total == n * (n + 1) // 2


STEPS = {"allgather": lambda t: t.allgather_bytes(b"hi", 0.3, "settings"),
         "gather": lambda t: t.gather_bytes(b"hi", 0, 0.3, "settings"),
         "allreduce": lambda t: t.allreduce_control(np.zeros(2), "sum", 0.3, "settings"),
         "barrier": lambda t: t.barrier(0.3, "settings")}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_rank_that_never_comes_is_named(step):
    absent = 2
    got = run_ranks(4, lambda t: None if t.rank == absent else caught(lambda: STEPS[step](t)))
    for rank in (0, 1, 3):
        exc = got[rank]
        if step == "gather" and rank != 0:
            assert exc is None  # a non-root's send completes (eagerly) without rank 2
            continue
        assert isinstance(exc, TransportTimeout), (rank, exc)
        assert exc.missing == (absent,), (rank, exc.missing)
        assert str(exc) == "settings: nothing from rank 2 within 0.3 s"


def test_a_missing_root_is_named_by_the_broadcast():
    def body(t):
        if t.rank == 1:
            return None
        return caught(lambda: t.broadcast_bytes(None, 1, 0.2, "plan"))

    got = run_ranks(3, body)
    for rank in (0, 2):
        assert isinstance(got[rank], TransportTimeout) and got[rank].missing == (1,)
        assert "plan: nothing from rank 1 within 0.2 s" == str(got[rank])


def test_a_wrapper_passes_the_steps_to_the_inner_transport():
    calls = []

    class Spy(WrappedTransport):
        def isend(self, buf, dest, tag):  # the steps must not go through the wrapper's sends
            calls.append(dest)
            return self.inner.isend(buf, dest, tag)

    got = run_ranks(3, lambda t: Spy(t, owns=False).allgather_object(t.rank, 10))
    assert got == [[0, 1, 2]] * 3 and calls == []


def test_poll_stops_at_the_deadline_and_restarts_its_back_off_on_progress():
    start = time.perf_counter()
    assert poll(lambda: IDLE, start + 0.05) is False
    assert 0.05 <= time.perf_counter() - start < 1.0

    states = iter([IDLE, PROGRESS, IDLE, DONE])
    assert poll(lambda: next(states), None) is True

    # progress keeps a wait alive past its deadline: only an idle poll may end it
    steps = iter([PROGRESS] * 3 + [DONE])
    assert poll(lambda: next(steps), time.perf_counter() - 1) is True


def test_poll_spins_before_sleeping():
    slept = []
    polls = iter(range(100))

    def step():
        k = next(polls)
        slept.append(time.perf_counter())
        return DONE if k == 5 else IDLE

    start = time.perf_counter()
    assert poll(step, None, spin_polls=10, nap_s=(0.5, 0.5))
    assert time.perf_counter() - start < 0.4  # five idle polls, all within the spin budget


def _uniform_ring(n):
    topo = from_dict(uniform_document(n))
    return ring_plan(topo), topo


@pytest.mark.parametrize("n", [1, 3])
def test_share_plan_gives_every_rank_the_roots_plan(n):
    def body(t):
        build = (lambda: _uniform_ring(n)) if t.rank == 0 else (lambda: pytest.fail("not root"))
        plan, topo = share_plan(t, build, what="test", timeout_s=10, check_timeout_s=10)
        return plan.digest, topo.n

    got = run_ranks(n, body)
    assert got == [(_uniform_ring(n)[0].digest, n)] * n


def test_share_plan_raises_the_roots_failure_on_every_rank():
    def body(t):
        def build():
            raise ValueError("no capacity")
        return caught(lambda: share_plan(t, build, error=BootstrapError, failure="re-plan",
                                         timeout_s=10, check_timeout_s=10))

    got = run_ranks(3, body)
    assert all(isinstance(e, BootstrapError) for e in got)
    assert {str(e) for e in got} == {"re-plan: ValueError: no capacity"}


def test_share_plan_names_a_root_that_never_plans():
    def body(t):
        if t.rank == 0:
            return None
        return caught(lambda: share_plan(t, _uniform_ring, what="init", error=BootstrapError,
                                         timeout_s=0.2))

    got = run_ranks(3, body)
    for exc in got[1:]:
        assert isinstance(exc, BootstrapError)
        assert str(exc) == "init: waiting for the plan: nothing from rank 0 within 0.2 s"
        assert exc.__cause__.missing == (0,)


def _with_planner_seconds(plan, seconds):
    doc = plan.to_json()
    doc["planner"]["seconds"] = seconds
    doc["planner"]["forest"]["deep"]["seconds"] = seconds
    return Plan.from_json(doc)


def test_share_plans_broadcast_size_does_not_depend_on_the_planners_wall_time():
    # A simulated job charges the broadcast its bytes: "0.1" against "0.0855" seconds moved
    # every rank's start, and a 256-rank simulated allreduce in its 4th digit.
    topo = from_dict(uniform_document(3))
    made = make_plan(topo)
    sizes, seen = {}, {}
    for seconds in (0.1, 0.0855, 12.3456, 3.0):
        plan = _with_planner_seconds(made, seconds)

        class Sizes(WrappedTransport):
            def broadcast_bytes(self, data, root, timeout_s, what="broadcast"):
                got = self.inner.broadcast_bytes(data, root, timeout_s, what)
                sizes.setdefault(seconds, set()).add(len(got))
                return got

        def body(t):
            shared, _ = share_plan(Sizes(t, owns=False), lambda: (plan, topo), what="test",
                                   timeout_s=10, check_timeout_s=10)
            return shared.planner["seconds"], shared.planner["forest"]["deep"]["seconds"]

        seen[seconds] = run_ranks(3, body)
    assert len({s for got in sizes.values() for s in got}) == 1, sizes
    # ... and every rank still gets the root's timings, as the planner rounds them
    assert seen == {s: [(s, s)] * 3 for s in (0.1, 0.0855, 12.3456, 3.0)}
