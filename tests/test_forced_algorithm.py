"""An allreduce algorithm the user forces for every call (HOROVOD_HIERARCHICAL_ALLREDUCE) that
the plan does not record is predicted by its own model and watched by the contention detector,
like the algorithm a plan records."""
from __future__ import annotations

import numpy as np
import pytest

from horotopo.adapt import AdaptiveEngine
from horotopo.algorithms import choice
from horotopo.algorithms.cost import size_bucket
from horotopo.bootstrap import uniform_document
from horotopo.plan import make_plan
from horotopo.topology import from_dict
from loop_transport import LoopTransport, run_ranks

HOSTS = ["a", "a", "b", "b"]


class OnHost(LoopTransport):
    @property
    def processor_name(self) -> str:
        return HOSTS[self.rank]


@pytest.mark.parametrize("forced", [True, False])
def test_a_forced_hierarchical_allreduce_is_predicted_and_watched(monkeypatch, forced):
    if forced:
        monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1")
    else:
        monkeypatch.delenv("HOROVOD_HIERARCHICAL_ALLREDUCE", raising=False)
    topology = from_dict(uniform_document(len(HOSTS), 10.0))
    plan = make_plan(topology, chunk_bytes=4096)
    assert plan.planner.get("algorithm", "tree") != "hierarchical"
    values = np.ones(3000, np.float32)
    nbytes = values.nbytes

    def body(t):
        eng = AdaptiveEngine(t, plan, topology, adapt=False, timeout_s=0, min_seconds=0.0)
        try:
            for _ in range(eng.detector.warmup):
                eng.allreduce(values, algorithm=None if forced else "hierarchical")
            return (eng.engine.last_algorithm, eng.tuner.record.samples("hierarchical", nbytes),
                    set(eng.detector.baselines), eng.tuner.model.costs)
        finally:
            eng.close()

    for ran, samples, watched, costs in run_ranks(len(HOSTS), body,
                                                  transport=lambda w, r: OnHost(w, r)):
        assert ran == "hierarchical"
        if not forced:
            # named for one call, it is not the topology side: nothing predicts it
            assert watched == set(), watched
            continue
        want = choice.predictions(topology, plan, nbytes, 4096, costs=costs)["hierarchical"]
        assert len(samples) == 3
        assert [s.predicted_s for s in samples] == pytest.approx([want] * 3)
        assert watched == {(size_bucket(nbytes), "hierarchical")}
