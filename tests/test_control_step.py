"""The transport's nonblocking control step (``iallreduce_control``) and the runtime's control
cycle over it, on the in-process transport (threads standing in for ranks): results in every
op, a request that tests itself, a deadline that names the missing peer, and the controller's
negotiation and response cache with no MPI at all."""
import contextlib
import threading
import time
from collections import OrderedDict

import numpy as np
import pytest

from horotopo.api.controller import Controller
from horotopo.api.queue import RequestQueue
from horotopo.api.records import ALLREDUCE, BROADCAST
from horotopo.api.settings import Settings
from horotopo.transport.base import TransportTimeout
from horotopo.transport.p2p import CollectiveRequest, iallreduce_point_to_point
from horotopo.transport.poll import deadline_after
from loop_transport import run_ranks

SIZES = [1, 2, 3, 4]


@pytest.mark.parametrize("n", SIZES)
def test_iallreduce_control_in_every_op(n):
    def body(t):
        flags = np.array([0b111 & ~(1 << (t.rank % 3)), (1 << 64) - 1 - t.rank],
                         dtype=np.uint64)
        ints = np.array([t.rank + 1, -t.rank], dtype=np.int64)
        floats = np.array([t.rank + 0.5], dtype=np.float64)
        reqs = [t.iallreduce_control(flags, "band"), t.iallreduce_control(ints, "sum"),
                t.iallreduce_control(floats, "max")]
        t.wait(reqs, deadline_after(10), what="control")
        prod = np.array([2.0], dtype=np.float64)
        req = t.iallreduce_control(prod, "product")
        t.wait([req], deadline_after(10))
        low = np.array([t.rank], dtype=np.int32)
        t.wait([t.iallreduce_control(low, "min")], deadline_after(10))
        return flags.tolist(), ints.tolist(), floats.tolist(), prod.tolist(), low.tolist()

    want_flags = 0b111
    last = (1 << 64) - 1
    for r in range(n):
        want_flags &= ~(1 << (r % 3))
        last &= (1 << 64) - 1 - r
    for flags, ints, floats, prod, low in run_ranks(n, body):
        assert flags == [want_flags, last]
        assert ints == [n * (n + 1) // 2, -(n * (n - 1) // 2)]
        assert floats == [n - 0.5] and prod == [2.0 ** n] and low == [0]


def test_the_result_lands_only_when_the_request_completes():
    ready = threading.Event()

    def body(t):
        vec = np.array([t.rank + 1], dtype=np.int64)
        if t.rank == 1:
            ready.wait(10)  # rank 0 posts and tests before rank 1 has sent anything
        req = t.iallreduce_control(vec, "sum")
        if t.rank == 0:
            early = (req.test(), vec.tolist())
            ready.set()
            t.wait([req], deadline_after(10))
            return early, req.test(), vec.tolist()
        t.wait([req], deadline_after(10))
        return None, req.test(), vec.tolist()

    (early, done0, vec0), (_, done1, vec1) = run_ranks(2, body)
    assert early == (False, [1])             # untouched while the step is in flight
    assert done0 and done1 and vec0 == vec1 == [3]   # tested again after completing: still True


def test_a_rank_that_never_comes_is_named_by_the_control_wait():
    absent = 2

    def body(t):
        if t.rank == absent:
            return None
        req = t.iallreduce_control(np.ones(3, dtype=np.uint64), "band")
        try:
            t.wait([req], deadline_after(0.3), what="control cycle 7")
        except TransportTimeout as exc:
            return str(exc), exc.missing
        return "completed"

    got = run_ranks(4, body)
    for rank in (0, 1, 3):
        assert got[rank] == ("control cycle 7", (absent,)), rank


def test_a_collective_request_finishes_once_and_cancels_what_is_pending():
    finished = []

    class Parts:
        """A transport double whose requests are flags the test sets."""

        def __init__(self):
            self.cancelled = []

        def test(self, req):
            return req["done"]

        def cancel(self, req):
            self.cancelled.append(req["peer"])

    t = Parts()
    parts = [{"done": False, "peer": 1}, {"done": False, "peer": 3}, {"done": False, "peer": 1}]
    req = CollectiveRequest(t, parts, [1, 3, 1], lambda: finished.append(True))
    assert not req.test() and req.pending_peers() == [1, 3]
    parts[0]["done"] = parts[2]["done"] = True
    assert not req.test() and req.pending_peers() == [3]
    req.cancel()
    assert t.cancelled == [3]
    parts[1]["done"] = True
    assert req.test() and req.test() and finished == [True]


def test_an_unknown_op_posts_nothing():
    class NoMessages:
        rank, size = 0, 2

        def alloc_tags(self, count):
            raise AssertionError("a tag was taken for a step that cannot run")

    with pytest.raises(ValueError, match="op must be one of"):
        iallreduce_point_to_point(NoMessages(), np.zeros(1), "bor")


class _Dog:
    """The watchdog's interface, recording what each guarded wait was called."""

    timeout_s = 30.0

    def __init__(self):
        self.guarded = []

    @contextlib.contextmanager
    def guard(self, what):
        self.guarded.append(what)
        yield

    def close(self):
        pass


def _controller(t, **settings):
    stats = {"cycles": 0, "negotiations": 0, "cache_hits": 0}
    stalls = []
    ctl = Controller(t, Settings.from_env(**settings), _Dog(), stats, stalls.append)
    return ctl, stats


def _run_until_done(ctl, queue, pending, stopping=False):
    """Cycle until every pending name was answered; the responses in order."""
    entries, _ = queue.take()
    pending.update((e.name, e) for e in entries)
    got = []
    while pending:
        responses = ctl.cycle(pending, stopping, None)
        for resp in responses:
            queue.finish([pending.pop(resp.name)], [None])  # frees the name, as a run does
            got.append((resp.kind, resp.name, resp.error))
    return got


@pytest.mark.parametrize("n", [1, 3])
def test_controller_negotiates_by_name_then_serves_the_cache(n):
    def body(t):
        ctl, stats = _controller(t)
        queue, pending = RequestQueue(), OrderedDict()
        queue.size = t.size
        # Ranks submit in different orders: negotiation is by name.
        names = ["grad.a", "grad.b"] if t.rank % 2 == 0 else ["grad.b", "grad.a"]
        steps = []
        for _ in range(2):
            for name in names:
                queue.enqueue(ALLREDUCE, [(name, np.ones(2, np.float32), None)], op=1)
            steps.append(_run_until_done(ctl, queue, pending))
        after_two_steps = dict(stats)
        # A cached name asked for with other parameters goes back to rank 0 and is refused.
        queue.enqueue(ALLREDUCE if t.rank == 0 else BROADCAST,
                      [("grad.a", np.ones(2, np.float32), None)], op=1)
        mismatch = _run_until_done(ctl, queue, pending)
        stopped = ctl.cycle(pending, t.rank == 0, None)  # one rank's stop ends every loop
        return steps, after_two_steps, mismatch, stopped, ctl.watchdog.guarded

    got = run_ranks(n, body)
    for steps, stats, mismatch, stopped, guarded in got:
        assert steps == got[0][0]                       # the same order on every rank
        assert sorted(steps[0]) == [(ALLREDUCE, "grad.a", None), (ALLREDUCE, "grad.b", None)]
        assert sorted(steps[1]) == sorted(steps[0])
        assert stats["negotiations"] == 1 and stats["cache_hits"] == 2  # step 2: all cached
        assert stopped is None
        assert guarded[0] == "cycle 0" and "negotiation in cycle 1" in guarded
        if n == 1:
            assert mismatch == [(ALLREDUCE, "grad.a", None)]
        else:
            ((kind, name, error),) = mismatch
            assert (kind, name) == (ALLREDUCE, "grad.a") and error.startswith(
                "Mismatched operations: One rank did an ALLREDUCE, but another rank did an "
                "BROADCAST.")


def test_stall_shutdown_reaches_rank_0s_callback_naming_the_missing_rank():
    def body(t):
        stats = {"cycles": 0, "negotiations": 0, "cache_hits": 0}
        stalls = []
        settings = Settings.from_env(stall_check_s=0.05, stall_shutdown_s=0.2)
        ctl = Controller(t, settings, _Dog(), stats, stalls.append)
        queue, pending = RequestQueue(), OrderedDict()
        if t.rank == 0:
            queue.enqueue(ALLREDUCE, [("lonely", np.ones(1, np.float32), None)], op=1)
        entries, _ = queue.take()
        pending.update((e.name, e) for e in entries)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            # Every rank cycles as long as rank 0 has not stopped; rank 0's stop ends it.
            if ctl.cycle(pending, bool(stalls), None) is None:
                break
            time.sleep(0.01)
        return stalls

    got = run_ranks(2, body)
    assert got[1] == []
    (reason,) = got[0]
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: lonely (missing ranks 1)" in reason
