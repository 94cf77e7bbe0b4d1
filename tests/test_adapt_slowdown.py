"""A sustained slowdown that no plan can help is said once: which link, the predicted and the
observed time. Over the in-process transport with an injected clock (each rank's clock moves by
the bytes it sends over a rate the test sets), so no assertion rests on wall-clock time."""
import logging

import numpy as np

from horotopo.adapt import AdaptiveEngine
from horotopo.adapt.runtime import ReplanEvent, slowdown_notice
from horotopo.bootstrap import uniform_document
from horotopo.plan import make_plan
from horotopo.topology import from_dict
from horotopo.transport.base import WrappedTransport
from loop_transport import run_ranks

N = 3
COUNT = 1 << 16  # 256 KiB of float32 per call


class ClockedTransport(WrappedTransport):
    """The loop transport with a clock of its own: a send moves it by bytes over ``rate``."""

    def __init__(self, inner, rate):
        super().__init__(inner, owns=False)
        self.rate = rate          # [bytes/s]: the test lowers it to slow every link at once
        self.clock = 0.0

    def now(self):
        return self.clock

    def isend(self, buf, dest, tag):
        self.clock += buf.nbytes / self.rate[0]
        return self.inner.isend(buf, dest, tag)

    def irecv(self, buf, source, tag):
        return self.inner.irecv(buf, source, tag)

    def test(self, request):
        return self.inner.test(request)

    def waitsome(self, requests):
        return self.inner.waitsome(requests)

    def waitall(self, requests):
        self.inner.waitall(requests)

    def allreduce(self, sendbuf, recvbuf, op):
        self.inner.allreduce(sendbuf, recvbuf, op)


def test_a_slowdown_no_plan_helps_is_told_once_with_the_link_and_the_times(caplog):
    topo = from_dict(uniform_document(N, 1.0))
    plan = make_plan(topo, chunk_bytes=1 << 16)
    rate = [1.25e8]  # the model's 1 Gbit/s, shared by every rank's clock

    def body(t):
        clocked = ClockedTransport(t, rate)
        eng = AdaptiveEngine(clocked, plan, topo, adapt=False, timeout_s=0, warmup=3,
                             consecutive=3, min_seconds=0.0)
        told = []
        try:
            for step in range(16):
                if step == 6:
                    t.barrier(10.0)
                    rate[0] = 1.25e8 / 20   # 1 Gbit/s -> 50 Mbit/s on every link
                    t.barrier(10.0)
                x = np.full(COUNT, float(t.rank), dtype=np.float32)
                out = eng.allreduce(x, algorithm="tree")
                assert np.array_equal(out, np.full(COUNT, float(sum(range(N))), np.float32))
                told.append(eng.slowdown)
            return told, eng.plan.digest
        finally:
            eng.close()

    with caplog.at_level(logging.WARNING, logger="horotopo"):
        got = run_ranks(N, body)
    for told, digest in got:
        assert digest == plan.digest
        # nothing while the calls ran at the plan's speed; told at the 3rd slow call, then kept
        assert told[:8] == [None] * 8, told
        assert told[8] is not None and len(set(told[8:])) == 1, told
    notice = got[0][0][-1]
    assert notice.startswith(f"horotopo: allreduce calls stay slower than the plan predicts: "
                             f"{COUNT * 4} bytes took ")
    assert "the plan's most loaded tree edge is rank " in notice
    assert "No re-plan: re-planning is off (HOROTOPO_ADAPT)" in notice
    said = [r.getMessage() for r in caplog.records if "stay slower" in r.getMessage()]
    assert said == [notice]  # once, by rank 0
    observed, predicted = (float(v) for v in
                           notice.split(" took ")[1].split(" s predicted")[0].split(" s against "))
    assert 10 < observed / predicted < 30, notice   # the injected 20x, give or take the model


def test_the_notice_names_the_worst_re_probed_link_against_the_model():
    topo = from_dict(uniform_document(N, 1.0))
    plan = make_plan(topo, chunk_bytes=1 << 16)
    event = ReplanEvent(step=9, reason="slow", old_digest=plan.digest, new_digest=plan.digest,
                        probed_gbps={"0->1": 0.9, "2->0": 0.05, "1->2": 0.95})
    text = slowdown_notice(plan, topo, event, 1 << 20, 0.01, 0.07, "no plan is faster")
    assert text == ("horotopo: allreduce calls stay slower than the plan predicts: 1048576 bytes "
                    "took 0.07 s against 0.01 s predicted (7.0x); the slowest link re-probed is "
                    "rank 2 -> rank 0 at 0.05 Gbit/s (the plan was made for 1). No re-plan: no "
                    "plan is faster. Running on with the current plan.")
