"""The runtime's reliability and adaptivity wiring, at any size: hvd.init() installs
the abort-on-exception hook and runs the collectives through the adaptive engine under the
watchdog; hvd.retune() re-probes and switches every rank to the same new plan."""
import sys

import numpy as np
import pytest

import horotopo as hvd
from horotopo import reliability
from horotopo.adapt import AdaptiveEngine
from horotopo.api.basics import runtime
from test_api_collectives import need_two, start


@pytest.fixture(scope="module", autouse=True)
def started():
    start()
    yield


def test_init_wires_the_excepthook_watchdog_and_adaptive_engine():
    rt = runtime()
    assert sys.excepthook is reliability.abort_excepthook
    assert isinstance(rt.engine, AdaptiveEngine)
    assert rt.engine.watchdog is not None
    assert rt.engine.watchdog.timeout_s == reliability.timeout_from_env()
    dog = rt.controller.watchdog
    assert dog is not None and dog.timeout_s == rt.engine.watchdog.timeout_s
    # every rank holds the same model the plan was made on
    digests = rt.controller.transport.allgather_object(
        (rt.setup.topology.n, rt.plan.digest, rt.setup.source), 30)
    assert all(d == digests[0] for d in digests)
    assert rt.setup.topology.n == hvd.size()


def test_probe_off_model_is_not_adapted_by_default():
    rt = runtime()
    if rt.setup.source != "uniform":
        pytest.skip(f"the job was started on a {rt.setup.source} model, not HOROTOPO_PROBE=off")
    assert rt.engine.adapt is False


def test_retune_switches_every_rank_to_the_same_plan():
    rt = runtime()
    before = rt.plan.digest
    event = hvd.retune()
    assert event["old_digest"] == before and event["switched"] is True
    assert rt.plan.digest == event["new_digest"] == rt.engine.plan.digest
    seen = rt.controller.transport.allgather_object(event["new_digest"], 30)
    assert all(d == seen[0] for d in seen)
    # collectives still give exact results on the new plan, on every algorithm's path
    n = hvd.size()
    for count in (1, 7, 300_001):
        x = (np.arange(count) % 5 + hvd.rank()).astype(np.float32)
        want = sum((np.arange(count) % 5 + k) for k in range(n)).astype(np.float32)
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name=f"after.retune.{count}"),
                                      want)


def test_retune_rejects_a_bad_mode():
    with pytest.raises(ValueError, match=r"retune\(mode='fast'\): mode must be one of quick, full"):
        hvd.retune("fast")


def test_retune_modes_must_agree():
    need_two()
    mode = "quick" if hvd.rank() == 0 else "full"
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched retune modes"):
        hvd.retune(mode)
    # the job carries on
    assert hvd.allreduce(np.ones(3), op=hvd.Sum, name="after.mismatch").tolist() == \
        [float(hvd.size())] * 3
