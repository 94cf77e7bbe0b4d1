"""The tree-or-MPI choice: calibration fit, the per-size selector with hysteresis and
exploration, the collective agreement of timings, and the noise-proof re-plan detector.

Pure functions and in-process ranks (tests/loop_transport.py); no MPI, no timed assertions:
every "timing" here is a number the test makes up.
"""
import numpy as np
import pytest

from horotopo.adapt import Detector
from horotopo.algorithms.cost import (DEFAULT_COST_MODEL, CostModel, Selector, agree_max,
                                      calibrated_model, fit_affine, size_bucket)
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from horotopo.transport.p2p import allreduce_point_to_point

from loop_transport import run_ranks

MiB = 1 << 20


def _plan(n=4, rate=100e6, chunk=64 << 10, latency=1e-4, trees=None):
    """A plan of ``n`` ring chains at ``rate`` each (R = n * rate), or the first ``trees``."""
    roots = range(n if trees is None else trees)
    return plan_from_trees(n, [(r, *ring_parents(n, r), rate) for r in roots],
                           chunk_bytes=chunk, latency_s=latency)


def _model(mpi_Bps, tree_scale=1.0, mpi_lat=1e-3, tree_lat=2e-3):
    return CostModel(mpi_latency_s=mpi_lat, mpi_Bps=mpi_Bps, tree_latency_s=tree_lat,
                     per_message_s=0.0, tree_scale=tree_scale, source="test")


# -- calibration --------------------------------------------------------------------------------


def test_fit_affine_recovers_a_line_and_never_goes_negative():
    a, slope = fit_affine([(x, 0.003 + 1.5 * x) for x in (0.01, 0.04, 0.16)])
    assert a == pytest.approx(0.003) and slope == pytest.approx(1.5)
    # noise that points below the origin: no negative latency, slope through the origin
    a, slope = fit_affine([(1.0, 0.5), (2.0, 2.0)])
    assert a == 0.0 and 0.5 < slope < 1.0


def test_calibration_uses_the_measured_mpi_rate_not_the_plans_ring_rate():
    """The old default took MPI_Allreduce to run at the model's ring rate; on a network where
    the plan is 3x faster than MPI's real rate the prior could still pick MPI."""
    plan = _plan(n=4, rate=25e6)             # R = 100 MB/s; ring chains of a uniform model
    sizes = [64 << 10, 256 << 10, MiB]
    tree_s = [0.004 + 1.1 * plan.predict_time(s) for s in sizes]
    mpi_s = [0.002 + s / 30e6 for s in sizes]  # MPI_Allreduce at 30 MB/s, measured
    prior = DEFAULT_COST_MODEL
    model = calibrated_model(plan, sizes, tree_s, mpi_s, prior=prior)
    assert model.source == "calibrated" and model.per_message_s == 0.0
    assert model.mpi_Bps == pytest.approx(30e6, rel=1e-6)
    assert model.tree_scale == pytest.approx(1.1, rel=1e-6)
    assert model.tree_latency_s == pytest.approx(0.004, rel=1e-6)
    assert model.choose(plan, 16 * MiB) == "tree"
    # ...and when this job's MPI_Allreduce really is faster, MPI it is
    fast = calibrated_model(plan, sizes, tree_s, [0.001 + s / 400e6 for s in sizes])
    assert fast.choose(plan, 16 * MiB) == "mpi"


def test_calibration_scale_carries_to_another_plan():
    slow_plan, fast_plan = _plan(rate=10e6), _plan(rate=40e6)
    sizes = [256 << 10, MiB]
    model = calibrated_model(slow_plan, sizes, [2 * slow_plan.predict_time(s) for s in sizes],
                             [s / 5e6 for s in sizes])
    # the same 2x overhead applies to the next plan's prediction (after a re-plan)
    assert model.tree_time(fast_plan, 4 * MiB) == pytest.approx(
        model.tree_latency_s + 2 * fast_plan.predict_time(4 * MiB), rel=1e-3)


def test_calibration_rejects_mismatched_rows():
    with pytest.raises(ValueError):
        calibrated_model(_plan(), [MiB, 2 * MiB], [0.1], [0.1, 0.2])


# -- the selector -------------------------------------------------------------------------------


def test_size_bucket_is_power_of_two():
    assert size_bucket(MiB) == 20 and size_bucket(MiB + 1) == 21 and size_bucket(2 * MiB) == 21
    assert size_bucket(0) == 0 and size_bucket(1) == 0


def test_selector_first_choice_follows_the_model():
    plan = _plan()
    assert Selector(_model(mpi_Bps=10e6), explore_ratio=1.0).choose(plan, 16 * MiB) == "tree"
    assert Selector(_model(mpi_Bps=1e12), explore_ratio=1.0).choose(plan, 16 * MiB) == "mpi"
    assert Selector(_model(mpi_Bps=10e6)).choose(_plan(n=1), 16 * MiB) == "mpi"


def _feed(sel, plan, size, alg, ratio, times=1):
    """Feed calls of ``alg`` whose time is ``ratio`` times the model's."""
    for _ in range(times):
        sel.update(plan, size, alg, ratio * sel.model.time(alg, plan, size))


def test_selector_hysteresis_keeps_the_choice_within_the_margin():
    plan, size = _plan(), 16 * MiB
    model = _model(mpi_Bps=40e6)   # MPI's model time is well above the tree's (R=400 MB/s)
    sel = Selector(model, margin=0.1, explore_ratio=1.0)
    assert sel.choose(plan, size) == "tree"
    mpi_t = sel.estimate("mpi", plan, size)
    _feed(sel, plan, size, "mpi", 1.0, times=3)
    tree_t = model.time("tree", plan, size)
    # the tree measured 5% slower than MPI: inside the margin, no switch
    _feed(sel, plan, size, "tree", 1.05 * mpi_t / tree_t, times=5)
    assert sel.choose(plan, size) == "tree"
    # 20% slower, over the whole window: switch
    _feed(sel, plan, size, "tree", 1.2 * mpi_t / tree_t, times=5)
    assert sel.choose(plan, size) == "mpi"
    # and back only when the tree is better by more than the margin again
    _feed(sel, plan, size, "tree", 0.95 * mpi_t / tree_t, times=5)
    assert sel.choose(plan, size) == "mpi"
    _feed(sel, plan, size, "tree", 0.5 * mpi_t / tree_t, times=5)
    assert sel.choose(plan, size) == "tree"


def test_one_noisy_slow_call_does_not_flip_the_choice():
    plan, size = _plan(), 16 * MiB
    sel = Selector(_model(mpi_Bps=40e6), window=5, explore_ratio=1.0)
    _feed(sel, plan, size, "mpi", 1.0, times=2)
    _feed(sel, plan, size, "tree", 1.0, times=4)
    assert sel.choose(plan, size) == "tree"
    _feed(sel, plan, size, "tree", 20.0)   # a rank descheduled for one call
    assert sel.choose(plan, size) == "tree"


def test_selector_explores_an_ambiguous_alternative_once():
    plan, size = _plan(), 16 * MiB
    model = _model(mpi_Bps=None)            # the prior: MPI at the plan's ring rate
    tree_t, mpi_t = model.tree_time(plan, size), model.mpi_time(plan, size)
    sel = Selector(model, explore_ratio=2.0)
    first = sel.choose(plan, size)
    other = "mpi" if first == "tree" else "tree"
    assert max(tree_t, mpi_t) < 2.0 * min(tree_t, mpi_t)    # ambiguous: within 2x
    _feed(sel, plan, size, first, 1.0)
    assert sel.choose(plan, size) == other                   # one try of the other
    # the other measured 3x faster than its model: the bucket moves to it
    _feed(sel, plan, size, other, 0.3)
    assert sel.choose(plan, size) == other
    # exploration happens once per bucket, and not below explore_min_bytes
    assert sel.choose(plan, size) == other
    small = Selector(model, explore_min_bytes=MiB)
    c = small.choose(plan, 256 << 10)
    _feed(small, plan, 256 << 10, c, 1.0)
    assert small.choose(plan, 256 << 10) == c


def test_selector_forget_drops_the_tree_after_a_replan():
    plan, size = _plan(), 16 * MiB
    sel = Selector(_model(mpi_Bps=40e6), explore_ratio=1.0)
    _feed(sel, plan, size, "tree", 1.0, times=3)
    _feed(sel, plan, size, "mpi", 1.0, times=3)
    sel.choose(plan, size)
    sel.forget("tree")
    assert sel.samples("tree", size) == 0 and sel.samples("mpi", size) == 3
    assert sel.current(size) is None


def test_selector_ignores_small_calls_and_other_algorithms():
    plan = _plan()
    sel = Selector(_model(mpi_Bps=40e6), sample_min_bytes=64 << 10)
    sel.update(plan, 1024, "tree", 1.0)
    sel.update(plan, MiB, "ring", 1.0)
    assert sel.samples("tree", 1024) == 0 and sel.samples("ring", MiB) == 0
    assert not sel.wants(1024) and sel.wants(MiB)


def test_selector_snapshot_restores_a_choice():
    plan = _plan()
    sel = Selector(_model(mpi_Bps=40e6))
    saved = sel.snapshot()
    sel.choose(plan, 16 * MiB)
    assert sel.current(16 * MiB) is not None
    sel.restore(saved)
    assert sel.current(16 * MiB) is None


@pytest.mark.parametrize("kw", [dict(margin=1.0), dict(margin=-0.1), dict(window=0),
                                dict(explore_ratio=0.5)])
def test_selector_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        Selector(**kw)


# -- the collective agreement ------------------------------------------------------------------


def _noisy_times(rank, steps, tree_s, mpi_s):
    """Per-rank, per-call times: a different rank is descheduled at each call."""
    rng = np.random.default_rng(100 + rank)
    return [(tree_s * (1 + 0.6 * rng.random()), mpi_s * (1 + 0.6 * rng.random()))
            for _ in range(steps)]


def _choices(plan, timings, size, agree):
    sel = Selector(_model(mpi_Bps=None), margin=0.05, explore_ratio=3.0)
    out = []
    for tree_t, mpi_t in timings:
        alg = sel.choose(plan, size)
        local = tree_t if alg == "tree" else mpi_t
        sel.update(plan, size, alg, agree(local))
        out.append(alg)
    return out


def test_agreed_timings_give_every_rank_the_same_choices():
    plan, size, steps = _plan(n=3), 8 * MiB, 30
    model = _model(mpi_Bps=None)
    # tree and MPI within a few percent of each other: the noisiest case for a choice
    tree_s = model.tree_time(plan, size)
    mpi_s = 1.02 * tree_s

    def body(t):
        def agree(v):
            return agree_max([v], lambda vec: allreduce_point_to_point(t, vec, "max"))[0]
        mine = _noisy_times(t.rank, steps, tree_s, mpi_s)
        return _choices(plan, mine, size, agree), _choices(plan, mine, size, lambda v: v)

    results = run_ranks(3, body)
    agreed = [r[0] for r in results]
    local = [r[1] for r in results]
    assert agreed[0] == agreed[1] == agreed[2]
    # what the same selectors do on rank-local times: they drift apart (the deadlock or the
    # mixed-algorithm call that the agreement prevents)
    assert not (local[0] == local[1] == local[2])


def test_agree_max_takes_the_slowest_rank():
    def body(t):
        return agree_max([t.rank + 0.5, 10.0 - t.rank],
                         lambda vec: allreduce_point_to_point(t, vec, "max"))

    assert run_ranks(3, body) == [[2.5, 10.0]] * 3


# -- the re-plan detector against noise ---------------------------------------------------------


def _warm(d, key=0, pred=1.0, meas=2.0):
    for _ in range(d.warmup):
        assert not d.update(pred, meas, key)


def test_one_noisy_slow_call_never_triggers():
    d = Detector(threshold=0.3, consecutive=3, warmup=3, min_seconds=0.0, min_slow_s=1.0)
    _warm(d)
    for k in range(20):
        slow = k % 4 == 3          # every fourth call 20x slow: noise, not a lasting slowdown
        assert not d.update(1.0, 40.0 if slow else 2.0)


def test_a_short_burst_of_slow_calls_does_not_trigger_but_a_lasting_one_does():
    d = Detector(threshold=0.3, consecutive=3, warmup=3, min_seconds=0.0, min_slow_s=1.0)
    _warm(d, pred=0.05, meas=0.1)
    # three slow calls in a row, 0.45 s in all: a burst of scheduling noise
    assert not any(d.update(0.05, 0.15) for _ in range(3))
    assert not d.update(0.05, 0.1)                      # back to normal: the run is over
    fired = [d.update(0.05, 0.15) for _ in range(7)]    # a lasting slowdown
    assert fired.index(True) == 6                        # after 7 x 0.15 s >= 1 s


def test_backoff_doubles_the_run_needed_and_reset_restores_it():
    d = Detector(threshold=0.3, consecutive=2, warmup=1, min_seconds=0.0)
    _warm(d)
    assert not d.update(1.0, 4.0) and d.update(1.0, 4.0)
    d.backoff()                         # the re-probe found nothing: the new normal
    assert d.needed == 4 and d.baseline is None
    _warm(d)
    assert [d.update(1.0, 4.0) for _ in range(4)] == [False, False, False, True]
    for _ in range(5):
        d.backoff()
    assert d.needed == 2 * d.max_backoff
    d.reset()
    assert d.needed == 2


def test_each_size_has_its_own_baseline():
    d = Detector(threshold=0.3, consecutive=1, warmup=2, min_seconds=0.0)
    _warm(d, key=24, pred=1.0, meas=1.1)      # large calls reach 0.9 of the plan
    _warm(d, key=20, pred=1.0, meas=3.0)      # small ones 0.33: pipeline fill, latency
    assert not d.update(1.0, 3.2, 20)         # normal for its size
    assert d.update(1.0, 3.2, 24)             # the same efficiency in a large call is slow


def test_detector_rejects_bad_noise_settings():
    with pytest.raises(ValueError):
        Detector(min_slow_s=-1.0)
    with pytest.raises(ValueError):
        Detector(max_backoff=0)
