"""Liveness pings and the tracked control allreduce over the in-process transport (threads
standing in for ranks): a silent peer is named within the deadline, a late answer to an earlier
ping is not taken for a live peer, and the abort path never loads MPI."""
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from horotopo.reliability import LivenessResponder, TrackedTransport
from horotopo.transport.base import TransportTimeout
from loop_transport import LoopWorld, run_ranks


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_live_rank_answers_every_pinger_at_once(n):
    def body(t):
        responder = LivenessResponder(t)
        try:
            silent = responder.silent_ranks(10.0)
            verdict = responder.describe(wait_s=10.0)
            t.barrier(10.0)  # nobody stops answering while another still pings
        finally:
            responder.close()
        return silent, verdict

    for silent, verdict in run_ranks(n, body):
        assert silent == []
        assert "every rank answered" in verdict


def test_a_silent_peer_is_named_within_the_deadline():
    world = LoopWorld(3)
    ts = world.transports()
    # rank 2 runs no responder: a stopped process as the others see it
    responders = [LivenessResponder(t) for t in ts[:2]]
    try:
        t0 = time.monotonic()
        with pytest.raises(TransportTimeout, match=r"no answer from rank\(s\) 2 within 0.5 s") \
                as caught:
            responders[0].ping(0.5)
        took = time.monotonic() - t0
        assert caught.value.missing == (2,)
        assert 0.5 <= took < 2.0, took
        assert responders[1].silent_ranks(0.3) == [2]
        verdict = responders[0].describe("waiting for ranks 1, 2", wait_s=0.3)
        # Blame from the ping alone: rank 1, which this rank was waiting for, answered.
        assert verdict.startswith("faulty rank(s) 2: no answer to a liveness ping within 0.3 s")
        assert "rank(s) 1" not in verdict
    finally:
        for r in responders:
            r.close()


def test_a_late_answer_to_an_earlier_ping_is_not_taken_for_life():
    world = LoopWorld(3)
    ts = world.transports()
    responders = [LivenessResponder(t) for t in ts[:2]]
    late = None
    try:
        assert responders[0].silent_ranks(0.3) == [2]          # round 1: rank 2 is stopped
        # rank 2 wakes up just long enough to answer round 1, after rank 0 gave up on it
        stale = np.array([0, 1], dtype=np.int64)
        ts[2].isend(stale, 0, responders[0]._pong_tag)
        assert responders[0].silent_ranks(0.3) == [2]          # round 2 wants its own answer
        # rank 2 comes back for good: it answers the pings queued meanwhile, then this one
        late = LivenessResponder(ts[2])
        assert responders[0].silent_ranks(5.0) == []
        assert late.silent_ranks(5.0) == []
    finally:
        for r in responders + ([late] if late else []):
            r.close()


def test_tracked_control_allreduce_with_a_deadline_names_the_missing_peer():
    world = LoopWorld(3)
    ts = [TrackedTransport(t) for t in world.transports()]
    outcome = {}

    def rank(t):
        buf = np.full(2, t.rank + 1, dtype=np.int64)
        try:
            t.allreduce_control(buf, "sum", timeout_s=0.5, what="metadata check")
            outcome[t.rank] = buf
        except TransportTimeout as exc:
            outcome[t.rank] = exc

    threads = [threading.Thread(target=rank, args=(t,), daemon=True) for t in ts[:2]]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=10)
    for r in (0, 1):  # rank 2 never came
        assert isinstance(outcome[r], TransportTimeout), outcome[r]
        assert outcome[r].missing == (2,)
        assert "metadata check" in str(outcome[r])
        # the requests given up on are no longer outstanding, and were not link traffic
        assert ts[r].outstanding == 0
        assert ts[r].take_link_stats() == ([0, 0, 0], [0.0, 0.0, 0.0])


def test_tracked_control_allreduce_with_a_deadline_when_everyone_comes():
    def body(t):
        tracked = TrackedTransport(t)
        buf = np.full(2, t.rank + 1, dtype=np.int64)
        tracked.allreduce_control(buf, "sum", timeout_s=10.0)
        return buf.tolist(), tracked.outstanding

    for got, left in run_ranks(3, body):
        assert got == [6, 6] and left == 0


def test_the_abort_path_never_loads_mpi():
    code = ("import sys, horotopo.reliability as r\n"
            "from horotopo.reliability.abort import who\n"
            "print(who().startswith('process ('), 'mpi4py.MPI' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
