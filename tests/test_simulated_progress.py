"""The simulated transport's completion queue (horotopo/simulation/pending.py): the
progress loop's requests kept between waits, so that a completion costs time in proportion to
the messages that can complete next, not to every message posted.

Checked: the same simulated times, to the last bit, as the list-based ``waitsome`` loop (which
a wrapper such as TrackedTransport still takes), on routes that keep many messages of a stream
in flight; what ``wait_any`` is handed stays small while hundreds of receives are posted; and
the misuses that would make it wait wrongly are errors, not hangs.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from horotopo.transport.simulated import SimulatorMissing, load_simgrid

try:
    load_simgrid()
except SimulatorMissing as _exc:
    pytest.skip(str(_exc), allow_module_level=True)

from horotopo.algorithms.progress import Progress  # noqa: E402
from horotopo.engine import Engine  # noqa: E402
from horotopo.generate import uniform_star  # noqa: E402
from horotopo.reliability.tracking import TrackedTransport  # noqa: E402
from horotopo.simulation import SimulationError  # noqa: E402
from horotopo.simulation.runner import run_simulated  # noqa: E402
from horotopo.topology import from_dict  # noqa: E402
from horotopo.transport.base import TransportError  # noqa: E402
from horotopo.transport.simulated import SimulatedTransport  # noqa: E402

from engine_cases import random_plan  # noqa: E402


def two_sites(per_site=4):
    """Two switches behind a 10 ms, 1 gbps link: a stream between the sites keeps about
    1.25 MB in flight, many chunks side by side (they may complete out of order)."""
    a = [f"a{i}" for i in range(per_site)]
    b = [f"b{i}" for i in range(per_site)]
    links = [{"ends": [h, "swa"], "gbps": 10.0, "latency_ms": 0.002} for h in a]
    links += [{"ends": [h, "swb"], "gbps": 2.5, "latency_ms": 0.002} for h in b]
    links.append({"ends": ["swa", "swb"], "gbps": 1.0, "latency_ms": 10.0})
    return from_dict({"name": "two-sites", "switches": ["swa", "swb"], "links": links,
                      "ranks": [h for pair in zip(a, b) for h in pair]})


@pytest.mark.parametrize("algorithm", ["tree", "ring", "dbtree"])
def test_the_queue_gives_the_list_loops_simulated_times_exactly(algorithm, monkeypatch):
    topo = two_sites()
    n = topo.n
    plan = random_plan(n, seed=3, chunk_bytes=48_000, trees=3)
    count = 100_003  # chunks of 12,000 int32, the last of each tree's share smaller

    def body(t):
        x = np.arange(count, dtype=np.int32) % 97 + t.rank
        eng = Engine(t, plan)
        t.barrier()
        t0 = t.now()
        got = eng.allreduce(x, algorithm=algorithm)
        return t.now() - t0, Progress(t)._queue is not None, got

    queued = run_simulated(topo, body, scale=4.0)
    # without the queue, Progress hands its list to waitsome (the forked child inherits this)
    monkeypatch.setattr(SimulatedTransport, "completion_queue", None)
    listed = run_simulated(topo, body, scale=4.0)
    want = (np.arange(count, dtype=np.int64) % 97 * n + n * (n - 1) // 2).astype(np.int32)
    for res in (queued, listed):
        for _, _, got in res.results:
            np.testing.assert_array_equal(got, want)
    assert [r[1] for r in queued.results] == [True] * n
    assert [r[1] for r in listed.results] == [False] * n
    assert [r[0] for r in queued.results] == [r[0] for r in listed.results]
    assert queued.finish_s == listed.finish_s
    assert queued.messages == listed.messages


def test_progress_takes_the_queue_only_from_the_simulated_transport_itself():
    def body(t):
        tracked = TrackedTransport(t, clock=t.now)
        direct, wrapped = Progress(t), Progress(tracked)
        buf = np.zeros(4, np.int64)
        peer = 1 - t.rank
        for prog, tag in ((direct, 1), (wrapped, 2)):
            got = []
            prog.isend(np.full(4, t.rank, np.int64), peer, tag, lambda: got.append("sent"))
            prog.irecv(buf, peer, tag, lambda: got.append(int(buf[0])))
            prog.run()
            assert sorted(map(str, got)) == sorted(["sent", str(peer)]) and prog.messages == 2
        # the wrapper saw its requests complete: the queue did not bypass its waitsome
        return (type(direct._queue).__name__, wrapped._queue, tracked.posted,
                tracked.completed)

    for res in run_simulated(from_dict(uniform_star(2)), body).results:
        assert res == ("CompletionQueue", None, 2, 2)


def test_wait_any_is_handed_the_messages_that_can_complete_not_every_receive_posted():
    sg = load_simgrid()
    lengths = []

    def wait_any(comms):
        lengths.append(len(comms))
        return sg.Comm.wait_any(comms)

    # what the transport reads of SimGrid, with wait_any counted
    counting = SimpleNamespace(Engine=sg.Engine, this_actor=sg.this_actor,
                               Comm=SimpleNamespace(wait_any=wait_any))

    def body(t):
        # 300 messages of 1 ms each on one short route: one at a time on the network
        bufs = [np.zeros(125_000, np.uint8) for _ in range(300)]
        if t.rank == 0:
            t.waitall([t.isend(b, 1, 3) for b in bufs])
            return None
        t.sg = counting
        prog = Progress(t)
        for b in bufs:
            prog.irecv(b, 0, 3, lambda: None)
        prog.run()
        return prog.messages, t.now(), lengths  # counted in the simulation's process

    done, clock, handed = run_simulated(from_dict(uniform_star(2)), body).results[1]
    assert done == 300 and clock > 0.3
    assert handed and max(handed) <= 2  # the list-based loop handed it up to 300


def test_misuse_is_an_error_not_a_wrong_wait():
    def body(t):
        if t.rank == 1:
            t.waitall([t.isend(np.zeros(2), 0, 2)])
            return []
        errors = []
        queue = t.completion_queue()
        with pytest.raises(TransportError, match="empty"):
            queue.next()
        by_reference = t._irecv_ref(1, 5)
        with pytest.raises(TransportError, match="isend and irecv"):
            queue.add(by_reference, lambda: None)
        outside = t.isend(np.zeros(2), 1, 9)
        behind = t.isend(np.zeros(2), 1, 9)  # same stream: goes out after `outside`
        with pytest.raises(TransportError, match="not in this completion queue"):
            queue.add(behind, lambda: None)
        for r in (by_reference, outside, behind):  # nobody answers them
            t.cancel(r)
        req = t.irecv(np.zeros(2), 1, 2)
        queue.add(req, lambda: errors.append("called"))
        with pytest.raises(TransportError, match="already"):
            queue.add(req, lambda: None)
        queue.next()()
        assert len(queue) == 0
        return errors

    assert run_simulated(from_dict(uniform_star(2)), body).results[0] == ["called"]


def test_a_message_charged_below_what_the_receive_expects_is_an_error():
    # The candidates assume the sender charges what the receive expects (both ends scaled,
    # or both inside true_size()); a sender inside true_size() alone breaks that.
    def body(t):
        buf = np.zeros(100, np.uint8)
        if t.rank == 0:
            with t.true_size():
                t.waitall([t.isend(buf, 1, 1)])
            return None
        prog = Progress(t)
        prog.irecv(buf, 0, 1, lambda: None)
        prog.run()
        return None

    with pytest.raises(SimulationError, match="true_size"):
        run_simulated(from_dict(uniform_star(2)), body, scale=8.0)



@pytest.mark.parametrize("queued", [True, False], ids=["queue", "list"])
def test_urgent_receives_complete_at_once_run_their_callbacks_first(queued, monkeypatch):
    # Both messages are in before rank 0 looks: the urgent receive's callback runs first,
    # though it was posted second, in the completion queue and in the list-based loop alike.
    if not queued:
        monkeypatch.setattr(SimulatedTransport, "completion_queue", None)

    def body(t):
        if t.rank == 1:
            t.waitall([t.isend(np.full(4, k, np.int64), 0, k) for k in (1, 2, 3)])
            return None
        prog = Progress(t)
        bufs = [np.zeros(4, np.int64) for _ in range(3)]
        order = []
        for k, urgent in ((1, False), (2, True), (3, False)):
            prog.irecv(bufs[k - 1], 1, k, lambda k=k: order.append(k), urgent=urgent)
        t.flush()  # the receives go on the network now, and the messages arrive meanwhile
        t.sg.this_actor.sleep_for(1.0)
        prog.run()
        return order, (prog._queue is not None)

    assert run_simulated(from_dict(uniform_star(2)), body).results[0] == ([2, 1, 3], queued)


def test_the_list_loop_runs_urgent_callbacks_first_from_one_wait():
    # what an MPI transport's waitsome gives: every request of the list complete at once
    class AllDone:
        def waitsome(self, requests):
            return list(range(len(requests)))[::-1]

    prog = Progress(AllDone())
    order = []
    for k, urgent in ((1, False), (2, True), (3, False), (4, True)):
        prog.post(object(), lambda k=k: order.append(k), urgent=urgent)
    prog.run()
    assert order == [2, 4, 1, 3]
