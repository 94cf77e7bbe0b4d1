"""Pacing a tree allreduce's sends at the plan's tree rates (EngineParams.pace_factor).

Checked: with pacing off the progress loop never reads the clock (no cost per message); with
pacing on the results are the unpaced run's, bit for
bit, in the simulator (its completion queue and its list-based wait) and over threads standing
in for ranks (the polled wait, as MPI's); and a paced run cannot beat its pace, while the same
run unpaced does, so a pacing that holds nothing back fails here.
"""
import time

import numpy as np
import pytest

from horotopo.algorithms.progress import Progress
from horotopo.algorithms.tree import TreeAllreduce
from horotopo.engine import Engine
from horotopo.generate import uniform_star
from horotopo.params import EngineParams
from horotopo.plan import plan_from_trees
from horotopo.topology import from_dict
from horotopo.transport.base import TransportError

from loop_transport import LoopTransport, run_ranks



class PostOrderLoopTransport(LoopTransport):
    """A loop transport whose receives of one stream take its messages in the order they were
    posted, as MPI matches them, whichever is tested first: the polled timed wait tests its
    requests one by one, and the loop transport alone would match at test time."""

    def irecv(self, buf, source, tag):
        req = super().irecv(buf, source, tag)
        with self.world.cv:
            posted = getattr(self.world, "posted", None)
            if posted is None:
                posted = self.world.posted = {}
            posted.setdefault(req.key, []).append(req)
        return req

    def _try(self, req):
        if req.done:
            return True
        queue = self.world.posted[req.key] if req.kind == "recv" else None
        if queue is not None and queue[0] is not req:
            return False
        if super()._try(req) and queue is not None:
            queue.pop(0)
        return req.done


N = 4
#: two trees over 4 ranks: a chain rooted at 0 and a star rooted at 3
CHAIN = (0, (-1, 0, 1, 2), (-1, 0, 1, 2))
STAR = (3, (3, 3, 3, -1), (3, 3, 3, -1))


def two_tree_plan(rate_Bps: float, chunk_bytes: int):
    """The chain and the star, the chain planned at ``rate_Bps`` and the star at twice it."""
    return plan_from_trees(N, [(*CHAIN, rate_Bps), (*STAR, 2 * rate_Bps)],
                           chunk_bytes=chunk_bytes)


def data(rank: int, count: int) -> np.ndarray:
    """Floats whose sum depends on the order of addition: bitwise equality means the same
    reduction order."""
    return np.random.default_rng(rank).standard_normal(count).astype(np.float32)


def test_pacing_off_never_reads_the_clock(monkeypatch):
    plan = two_tree_plan(1e6, chunk_bytes=4000)

    def no_clock(self):
        raise AssertionError("the unpaced loop read the clock")

    def body(t):
        x = data(t.rank, 10_001)
        TreeAllreduce(t, plan).run(x, x, "sum", 1000)
        return x

    monkeypatch.setattr(LoopTransport, "now", no_clock)
    got = run_ranks(N, body)
    for x in got[1:]:
        np.testing.assert_array_equal(x, got[0])


def test_a_pace_factor_must_be_a_finite_non_negative_number():
    plan = two_tree_plan(1e6, chunk_bytes=4000)
    t = LoopTransport(type("W", (), {"size": N})(), 0)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="pace_factor"):
            TreeAllreduce(t, plan, pace_factor=bad)
        with pytest.raises(ValueError, match="pace_factor"):
            EngineParams(pace_factor=bad)


def test_over_polled_waits_a_paced_run_keeps_its_pace_and_its_bits():
    """Threads as ranks, the wall clock: the poll loop's timed wait (as MPI's)."""
    count, chunk = 60_000, 6_000          # 240 KB: the chain 80 KB, the star 160 KB
    rate = 1.0e6                          # the chain at 1 MB/s, the star at 2: 80 ms each
    plan = two_tree_plan(rate, chunk_bytes=chunk * 4)
    segment_s = count * 4 / (3 * rate)
    last_chunk_s = chunk * 4 / rate        # the last chunk goes out at most this before the end

    def body(pace):
        def run(t):
            x = data(t.rank, count)
            alg = TreeAllreduce(t, plan, pace_factor=pace)
            t0 = time.perf_counter()
            alg.run(x, x, "sum", chunk)
            return time.perf_counter() - t0, x
        return run

    paced = run_ranks(N, body(1.0), transport=PostOrderLoopTransport)
    unpaced = run_ranks(N, body(0.0), transport=PostOrderLoopTransport)
    for (_, a), (_, b) in zip(paced, unpaced):
        np.testing.assert_array_equal(a, b)
    assert max(s for s, _ in paced) >= segment_s - last_chunk_s
    assert max(s for s, _ in unpaced) < 0.5 * (segment_s - last_chunk_s)




def _simgrid():
    from horotopo.transport.simulated import SimulatorMissing, load_simgrid
    try:
        load_simgrid()
    except SimulatorMissing as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("queue", [True, False], ids=["completion-queue", "waitsome"])
def test_in_the_simulator_a_paced_run_is_no_faster_than_its_pace(queue, monkeypatch):
    _simgrid()
    from horotopo.simulation.runner import run_simulated
    from horotopo.transport.simulated import SimulatedTransport

    if not queue:  # Progress then hands its list to waitsome_until
        monkeypatch.setattr(SimulatedTransport, "completion_queue", None)
    topo = from_dict(uniform_star(N, gbps=10.0))
    count, chunk, scale = 30_000, 2_500, 10.0   # 1.2 MB on the network
    rate = 20e6                                  # the trees together at 60 MB/s: 20 ms
    plan = two_tree_plan(rate, chunk_bytes=int(chunk * 4 * scale))
    segment_s = count * 4 * scale / (3 * rate)
    last_chunk_s = chunk * 4 * scale / rate

    def body(pace):
        def run(t):
            x = data(t.rank, count)
            eng = Engine(t, plan, chunk_bytes=chunk * 4,
                         params=EngineParams(pace_factor=pace))
            start = t.start_together()
            got = eng.allreduce(x, algorithm="tree")
            t.settle()
            return t.now() - start, Progress(t)._queue is not None, got
        return run

    paced = run_simulated(topo, body(1.0), scale=scale).results
    fast = run_simulated(topo, body(1.1), scale=scale).results
    unpaced = run_simulated(topo, body(0.0), scale=scale).results
    assert [r[1] for r in paced] == [queue] * N
    for a, b, c in zip(paced, fast, unpaced):
        np.testing.assert_array_equal(a[2], c[2])
        np.testing.assert_array_equal(b[2], c[2])
    paced_s = max(r[0] for r in paced)
    fast_s = max(r[0] for r in fast)
    unpaced_s = max(r[0] for r in unpaced)
    assert paced_s >= segment_s - last_chunk_s
    assert fast_s >= (segment_s - last_chunk_s) / 1.1
    assert fast_s < paced_s
    # the network alone (10 gbps NICs) is many times faster than the pace
    assert unpaced_s < 0.5 * (segment_s - last_chunk_s)
    # pacing holds sends back to the pace, not longer: the pipeline's fill on top
    assert paced_s < 1.5 * segment_s


def test_a_timed_wait_through_a_wrapper_over_the_simulator_is_an_error_not_a_hang():
    _simgrid()
    from horotopo.reliability.tracking import TrackedTransport
    from horotopo.simulation.runner import run_simulated

    def body(t):
        try:
            TrackedTransport(t, owns=False).waitsome_until([], t.now() + 1.0)
        except TransportError as exc:
            return str(exc)
        return "waited"

    for res in run_simulated(from_dict(uniform_star(2)), body).results:
        assert "cannot wait with a deadline" in res
