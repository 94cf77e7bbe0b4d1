"""The one self-tuner: one record of timed calls that the tree-or-library selector and the
contention detector both read, with the plan's recorded algorithm as the topology side.

Pure tests feed made-up agreed times; the engine tests run in-process ranks
(tests/loop_transport.py), where only a sleep far above the calls' own time is asserted on.
"""
import dataclasses
import time

import numpy as np
import pytest

from horotopo.adapt import AdaptiveEngine
from horotopo.adapt.tuner import SelfTuner
from horotopo.algorithms.choice import predictions
from horotopo.algorithms.cost import CallRecord, CostModel, Selector, TopologySide
from horotopo.bootstrap import uniform_document
from horotopo.engine import Engine
from horotopo.packing import ring_parents
from horotopo.params import AdaptParams
from horotopo.plan import make_plan, plan_from_trees
from horotopo.topology import from_dict

from loop_transport import run_ranks

MiB = 1 << 20


def _ring_plan(n=4, rate=100e6):
    return plan_from_trees(n, [(r, *ring_parents(n, r), rate) for r in range(n)],
                           chunk_bytes=64 << 10, latency_s=1e-4)


def _recording(plan, topology, algorithm, size=4 * MiB):
    """``plan`` recording ``algorithm`` as the topology's fastest, with every candidate's
    prediction at ``size``, as init's chooser records it."""
    return dataclasses.replace(plan, planner=dict(
        plan.planner, algorithm=algorithm, algorithm_size=size,
        predicted_s=predictions(topology, plan, size)))


def _model(side, mpi_Bps=40e6):
    return CostModel(mpi_latency_s=1e-3, mpi_Bps=mpi_Bps, tree_latency_s=2e-3,
                     per_message_s=0.0, source="test", side=side)


class _Counting:
    """A topology model that doubles the plan's trees' time and counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, topology, plan, nbytes, chunk_bytes, costs, network):
        self.calls += 1
        return 2.0 * plan.predict_time(nbytes, chunk_bytes, costs=costs)


# -- the topology side's prediction -------------------------------------------------------------


def test_a_peer_is_predicted_by_its_own_model_once_per_size():
    plan, model = _ring_plan(), _Counting()
    side = TopologySide("dbtree", model, from_dict(uniform_document(4, 1.0)))
    first = side.seconds(plan, 4 * MiB)
    assert first == pytest.approx(2.0 * plan.predict_time(4 * MiB))
    assert side.seconds(plan, 4 * MiB) == first and model.calls == 1
    side.seconds(plan, 8 * MiB)
    assert model.calls == 2


def test_the_kept_predictions_answer_for_their_own_plan_only():
    side = TopologySide()
    slow, fast = _ring_plan(rate=10e6), _ring_plan(rate=40e6)
    for plan in (slow, fast, slow):
        assert side.seconds(plan, 4 * MiB) == plan.predict_time(4 * MiB)
    assert side.seconds(fast, 4 * MiB, 16 << 10) == fast.predict_time(4 * MiB, 16 << 10)


def test_a_cost_model_travels_without_its_kept_predictions():
    import pickle

    plan = _ring_plan()
    model = _model(TopologySide("dbtree", _predict_double, from_dict(uniform_document(4, 1.0))))
    model.plan_time(plan, 4 * MiB)
    back = pickle.loads(pickle.dumps(model))
    assert back == model and back.side.algorithm == "dbtree"
    assert back.plan_time(plan, 4 * MiB) == model.plan_time(plan, 4 * MiB)


def _predict_double(topology, plan, nbytes, chunk_bytes, costs, network):
    return 2.0 * plan.predict_time(nbytes, chunk_bytes, costs=costs)


def test_without_a_topology_a_peer_scales_its_recorded_figure_as_the_trees_scale():
    topo = from_dict(uniform_document(4, 1.0))
    plan = _recording(_ring_plan(), topo, "dbtree", size=4 * MiB)
    side = TopologySide("dbtree")
    recorded = plan.planner["predicted_s"]["dbtree"]
    assert side.seconds(plan, 4 * MiB) == pytest.approx(recorded)
    assert side.seconds(plan, 16 * MiB) == pytest.approx(
        recorded * plan.predict_time(16 * MiB) / plan.predict_time(4 * MiB))
    # a plan naming a peer without its figures gives no prediction, not the trees' one
    bare = dataclasses.replace(plan, planner={"algorithm": "dbtree"})
    assert side.seconds(bare, 4 * MiB) is None


def test_calibration_fits_the_topology_side_against_its_own_prediction():
    from horotopo.algorithms.cost import calibrated_model

    plan, peer = _ring_plan(), _Counting()
    prior = _model(TopologySide("dbtree", peer, from_dict(uniform_document(4, 1.0))))
    sizes = [256 << 10, MiB, 4 * MiB]
    # the peer measured at 1.5x its own model (which is 2x the plan's trees)
    peer_s = [0.003 + 1.5 * 2.0 * plan.predict_time(s) for s in sizes]
    got = calibrated_model(plan, sizes, peer_s, [0.002 + s / 30e6 for s in sizes], prior=prior)
    assert got.tree_scale == pytest.approx(1.5, rel=1e-6)
    assert got.side.algorithm == "dbtree"


# -- one record, two readers --------------------------------------------------------------------


def _tuner(side, **params):
    return SelfTuner(_model(side), AdaptParams(min_seconds=0.0, **params))


def test_a_recorded_peer_is_kept_under_its_name_and_read_as_the_topology_side():
    plan, size = _ring_plan(), 16 * MiB
    tuner = _tuner(TopologySide("dbtree", _Counting(), from_dict(uniform_document(4, 1.0))))
    assert tuner.times("dbtree", size) and tuner.times("mpi", size)
    assert not tuner.times("hierarchical", size)   # no model here: no agreement spent on it
    modelled = tuner.model.tree_time(plan, size)
    sample = tuner.observe(plan, "dbtree", size, 1.5 * modelled)
    assert sample.ratio == pytest.approx(1.5)
    assert sample.predicted_s == pytest.approx(2.0 * plan.predict_time(size))
    assert [s.observed_s for s in tuner.record.samples("dbtree", size)] == [1.5 * modelled]
    # the selector reads the peer's calls as "tree"
    assert tuner.selector.samples("tree", size) == 1
    assert tuner.selector.estimate("tree", plan, size) == pytest.approx(1.5 * modelled)
    assert tuner.selector.state()[str(24)]["tree"] == pytest.approx(1.5)


def test_a_recorded_peers_slowdown_is_detected_from_the_record():
    plan, size = _ring_plan(), 16 * MiB
    tuner = _tuner(TopologySide("dbtree", _Counting(), from_dict(uniform_document(4, 1.0))),
                   consecutive=3, warmup=3)
    predicted = 2.0 * plan.predict_time(size)
    for _ in range(3):   # the baseline: the peer at half its prediction's rate
        assert not tuner.slowed(tuner.observe(plan, "dbtree", size, 2 * predicted), "dbtree")
    fired = [tuner.slowed(tuner.observe(plan, "dbtree", size, 5 * predicted), "dbtree")
             for _ in range(3)]
    assert fired == [False, False, True]
    # the library's calls are recorded for the selector and never read as a slowdown
    lib = tuner.observe(plan, "mpi", size, 100.0)
    assert lib.predicted_s is None and not tuner.slowed(lib, "mpi")


def test_each_algorithm_has_its_own_baseline():
    """Forced plan trees beside the recorded peer: the trees' lower efficiency is their own
    normal, not a slowdown of the peer's."""
    plan, size = _ring_plan(), 16 * MiB
    tuner = _tuner(TopologySide("dbtree", _Counting(), from_dict(uniform_document(4, 1.0))),
                   consecutive=1, warmup=2)
    tree_pred, peer_pred = plan.predict_time(size), 2.0 * plan.predict_time(size)
    for _ in range(2):
        tuner.slowed(tuner.observe(plan, "dbtree", size, 1.1 * peer_pred), "dbtree")
        tuner.slowed(tuner.observe(plan, "tree", size, 3.0 * tree_pred), "tree")
    assert not tuner.slowed(tuner.observe(plan, "tree", size, 3.2 * tree_pred), "tree")
    assert tuner.slowed(tuner.observe(plan, "dbtree", size, 3.2 * peer_pred), "dbtree")


def test_a_plan_switch_keeps_only_the_librarys_calls():
    plan, size = _ring_plan(), 16 * MiB
    tuner = _tuner(TopologySide("dbtree", _Counting(), from_dict(uniform_document(4, 1.0))),
                   warmup=1)
    tuner.observe(plan, "dbtree", size, 1.0)
    tuner.observe(plan, "tree", size, 1.0)
    tuner.observe(plan, "mpi", size, 1.0)
    tuner.choose(plan, size)
    tuner.slowed(tuner.observe(plan, "dbtree", size, 1.0), "dbtree")
    tuner.switched(tuner.model.with_(side=TopologySide()))
    assert tuner.topology_algorithm == "tree"
    assert tuner.record.samples("dbtree", size) == () == tuner.record.samples("tree", size)
    assert len(tuner.record.samples("mpi", size)) == 1
    assert tuner.selector.current(size) is None and tuner.detector.baselines == {}


def test_the_selector_takes_its_settings_from_the_adapt_parameters():
    params = AdaptParams(choice_margin=0.2, choice_window=7, explore_ratio=3.0,
                         explore_min_bytes=2 * MiB, sample_min_bytes=1 << 10)
    sel = Selector.from_params(_model(TopologySide()), params, CallRecord(window=7))
    assert (sel.margin, sel.window, sel.explore_ratio, sel.explore_min_bytes,
            sel.sample_min_bytes) == (0.2, 7, 3.0, 2 * MiB, 1 << 10)
    with pytest.raises(ValueError, match="choice_margin"):
        AdaptParams(choice_margin=1.0)
    with pytest.raises(ValueError, match="choice_window"):
        AdaptParams(choice_window=0)


# -- the engines ---------------------------------------------------------------------------------


def test_calibration_times_the_recorded_peer():
    n = 3
    topo = from_dict(uniform_document(n, 10.0))
    plan = _recording(make_plan(topo, chunk_bytes=16 << 10), topo, "dbtree", size=MiB)

    def body(t):
        eng = Engine(t, plan, topology=topo)
        model = eng.calibrate(sizes=[16 << 10, 64 << 10], repeats=1)
        return eng.calibration["algorithm"], eng.topology_side.algorithm, model.side.algorithm

    assert run_ranks(n, body) == [("dbtree", "dbtree", "dbtree")] * n


def test_the_adaptive_engine_records_and_watches_the_recorded_peer():
    """The plan records NCCL's double binary tree: the calls the selector sends to the
    topology side run it, enter the record under its name, and a lasting slowdown of it (a
    rank late by far more than a call takes) is detected."""
    n, count = 3, 1 << 18
    topo = from_dict(uniform_document(n, 10.0))
    plan = _recording(make_plan(topo, chunk_bytes=64 << 10), topo, "dbtree", size=MiB)

    def body(t):
        eng = AdaptiveEngine(t, plan, topo, adapt=False, timeout_s=0, min_seconds=0.0,
                             warmup=3, consecutive=3,
                             cost_model=CostModel(mpi_latency_s=1.0, mpi_Bps=1.0,
                                                  tree_latency_s=0.0, per_message_s=0.0))
        try:
            ran = []
            for step in range(6):
                if step >= 3 and t.rank == n - 1:
                    time.sleep(0.15)
                out = eng.allreduce(np.full(count, t.rank + 1.0, np.float32))
                assert out[0] == n * (n + 1) / 2
                ran.append(eng.engine.last_algorithm)
            return ran, len(eng.tuner.record.samples("dbtree", count * 4)), eng.slowdown
        finally:
            eng.close()

    for ran, kept, slowdown in run_ranks(n, body):
        assert ran == ["dbtree"] * 6
        assert kept == 5     # the record's window: the last five calls
        assert slowdown is not None and "re-planning is off" in slowdown


def test_a_slowdown_of_the_recorded_peer_re_plans_and_the_new_plan_is_watched():
    """The re-plan that the peer's slowdown triggers installs a plan with its own recorded
    choice; the record starts again with that plan's topology side."""
    n, count = 3, 1 << 18
    topo = from_dict(uniform_document(n, 1000.0))  # the re-probe finds less: the model changes
    plan = _recording(make_plan(topo, chunk_bytes=64 << 10), topo, "dbtree", size=MiB)

    def body(t):
        eng = AdaptiveEngine(t, plan, topo, timeout_s=0, min_seconds=0.0, warmup=3,
                             consecutive=3, trial=0,
                             cost_model=CostModel(mpi_latency_s=1.0, mpi_Bps=1.0,
                                                  tree_latency_s=0.0, per_message_s=0.0))
        try:
            for step in range(7):
                if 3 <= step < 6 and t.rank == n - 1:
                    time.sleep(0.15)
                eng.allreduce(np.full(count, t.rank + 1.0, np.float32))
            side = eng.tuner.topology_algorithm
            return ([e.step for e in eng.events], eng.plan.digest, side,
                    eng.engine.last_algorithm,
                    sorted({alg for b in eng.tuner.record.summary().values() for alg in b}))
        finally:
            eng.close()

    got = run_ranks(n, body)
    assert len({g[1] for g in got}) == 1
    for steps, _, side, last, recorded in got:
        assert steps == [6]            # the third slow call
        assert last == side            # the new plan's topology side runs ...
        assert recorded == [side]      # ... and is all the record holds since the switch
