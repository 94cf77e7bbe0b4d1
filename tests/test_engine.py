"""Engine pieces that need no second rank: cost model, tags, single-rank semantics."""
import numpy as np
import pytest
from mpi4py import MPI

from horotopo.algorithms.cost import CostModel, fit_line, messages_per_rank
from horotopo.engine import Engine, MismatchError
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from horotopo.transport.base import TagAllocator, TransportError

from plan_checks import checked


def _ring(n, rate=1e9, chunk=1 << 20, latency=1e-5):
    return checked(plan_from_trees(n, [(r, *ring_parents(n, r), rate) for r in range(n)],
                                   chunk_bytes=chunk, latency_s=latency))


def test_fit_line_recovers_a_line():
    pts = [(s, 1e-4 + s / 2e9) for s in (1 << 10, 1 << 14, 1 << 20, 1 << 24)]
    a, bw = fit_line(pts)
    assert a == pytest.approx(1e-4, rel=1e-6) and bw == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(ValueError):
        fit_line(pts[:1])


def test_cost_model_picks_mpi_small_and_tree_large_when_the_plan_is_faster():
    plan = _ring(4)
    model = CostModel(mpi_latency_s=20e-6, mpi_Bps=0.5e9, tree_latency_s=200e-6,
                      per_message_s=10e-6)
    assert model.choose(plan, 1024) == "mpi"
    assert model.choose(plan, 256 << 20) == "tree"
    cut = model.cutover_bytes(plan)
    assert cut is not None and model.choose(plan, cut) == "tree"
    assert model.choose(plan, cut // 2) == "mpi"
    # an MPI as fast as the plan never loses to the tree's extra overhead
    same = model.with_(mpi_Bps=None)
    assert same.cutover_bytes(plan, limit=1 << 30) is None
    assert model.choose(_ring(1), 1 << 30) == "mpi"


def test_cost_model_uses_measured_tree_bandwidth_when_calibrated():
    plan = _ring(3, rate=1.0)  # absurd model rate: only a measurement can rescue the tree
    model = CostModel(mpi_latency_s=1e-5, mpi_Bps=1e9, tree_latency_s=1e-4, per_message_s=0.0)
    assert model.choose(plan, 1 << 26) == "mpi"
    assert model.with_(tree_Bps=2e9).choose(plan, 1 << 26) == "tree"


def test_messages_per_rank_counts_the_busiest_rank():
    plan = _ring(4, chunk=1000)
    # each of 4 chains carries one 1000 B chunk; in a chain a rank is the root (2 messages:
    # one from its reduce child, one to its broadcast child), an end (3) or the middle (4),
    # and every rank plays each role once: 2 + 3 + 4 + 3
    assert messages_per_rank(plan, 4000, 1000) == 12
    assert messages_per_rank(plan, 0, 1000) == 0


def test_window_for_keeps_scratch_near_two_mib_within_bounds():
    from horotopo.algorithms.tree import window_for

    assert window_for(64 << 10) == 32
    assert window_for(256 << 10) == 8
    assert window_for(1 << 20) == 4
    assert window_for(8) == 32
    # ... and about rank_window_bytes (12 MiB) over all of a plan's trees, at least 3 chunks
    assert window_for(4 << 20) == 3
    assert window_for(64 << 20) == 3
    assert window_for(64 << 10, trees=4) == 32     # the bundled and emulated plans: unchanged
    assert window_for(64 << 10, trees=16) == 12
    assert window_for(128 << 10, trees=32) == 3     # sites-64 and fattree-64's host forests
    assert window_for(128 << 10, trees=16) == 6
    assert window_for(512 << 10, trees=16) == 3
    assert window_for(64 << 10, trees=1024) == 3
    assert window_for(1 << 20, trees=2) == 4        # dbtree at 1 MiB chunks
    with pytest.raises(ValueError, match="trees must be at least 1"):
        window_for(1 << 20, trees=0)


def test_the_automatic_window_counts_the_trees_that_carry_a_segment():
    from horotopo.plan import plan_from_trees
    from horotopo.schedule import compile_allreduce, window_for

    n = 4
    chain = [-1, 0, 1, 2]
    plan = plan_from_trees(n, [(0, chain, chain, 1.0)] * 32, chunk_bytes=128 << 10)
    elems = (128 << 10) // 4
    assert compile_allreduce(plan, 1, 32 * 4 * elems, np.float32, elems).window == 3
    assert window_for(128 << 10, 32) == 3
    # a buffer that only 4 of the 32 trees carry: those 4 may hold the whole window
    assert compile_allreduce(plan, 1, 4, np.float32, elems).window == window_for(128 << 10, 4)


def test_tag_allocator_rotates_and_checks():
    tags = TagAllocator(upper=200, first=1)
    assert tags.alloc(100) == 1
    assert tags.alloc(100) == 101
    assert tags.alloc(50) == 1  # wrapped
    with pytest.raises(TransportError):
        tags.alloc(1000)
    with pytest.raises(ValueError):
        tags.alloc(0)
    with pytest.raises(TransportError):
        TagAllocator(upper=10)


@pytest.fixture
def engine():
    eng = Engine(MPI.COMM_SELF, _ring(1))
    yield eng
    eng.close()


@pytest.mark.parametrize("alg", [None, "tree", "ring", "mpi"])
def test_single_rank_allreduce_copies_and_scales(engine, alg):
    x = np.arange(10, dtype=np.int32).reshape(2, 5)
    out = engine.allreduce(x, op="average", prescale_factor=3.0, postscale_factor=0.5,
                           algorithm=alg)
    assert out.shape == (2, 5) and out is not x
    assert out.tolist() == (x.astype(np.float64) * 3.0 * 0.5).astype(np.int32).tolist()
    y = np.arange(6, dtype=np.float32)
    assert engine.allreduce(y, y, op="max", algorithm=alg) is y
    assert y.tolist() == list(range(6))


def test_single_rank_rejects_bad_arguments(engine):
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="op must be"):
        engine.allreduce(x, op="mean")
    with pytest.raises(ValueError, match="supports dtypes"):
        engine.allreduce(np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="must match"):
        engine.allreduce(x, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="overlaps"):
        engine.allreduce(x, x.reshape(2, 2))
    with pytest.raises(ValueError, match="C-contiguous"):
        engine.allreduce(x, np.zeros(8, np.float32)[::2])
    with pytest.raises(ValueError, match="algorithm must be"):
        engine.allreduce(x, algorithm="butterfly")
    with pytest.raises(ValueError, match="out of range"):
        engine.broadcast(x, 1)
    with pytest.raises(TypeError):
        engine.broadcast([1, 2], 0)
    assert issubclass(MismatchError, ValueError)
    # still usable after the errors
    assert engine.allreduce(np.ones(3, np.float64)).tolist() == [1.0, 1.0, 1.0]


def test_engine_rejects_a_plan_for_another_size():
    with pytest.raises(ValueError, match="plan is for 3 ranks"):
        Engine(MPI.COMM_SELF, _ring(3))


def test_non_contiguous_input_is_accepted(engine):
    x = np.arange(12, dtype=np.float64).reshape(3, 4).T
    out = engine.allreduce(x, op="sum")
    assert np.array_equal(out, x)


def test_calibrate_fits_a_model(engine):
    model = engine.calibrate(sizes=[1 << 14, 1 << 10], repeats=1)
    assert model.source == "calibrated" and model.mpi_Bps > 0 and model.tree_scale > 0
    assert model.per_message_s == 0.0  # the fit holds it; counting it again biases to MPI
    assert engine.calibration["sizes"] == [1 << 10, 1 << 14]  # smallest first
    assert engine.choose(1 << 20) in ("tree", "mpi")


def test_calibrate_budget_stops_the_ladder_after_two_sizes(engine):
    engine.calibrate(sizes=[1 << 10, 1 << 12, 1 << 14, 1 << 16], repeats=1, budget_s=0.0)
    assert engine.calibration["sizes"] == [1 << 10, 1 << 12]


def test_a_callable_window_is_given_the_plan():
    # a simulation's chunks stand for larger ones: its window is the full-size chunk's, for
    # each plan it runs (adapt_sim's re-plans)
    plan = _ring(1)
    seen = []

    def window(p):
        seen.append(p)
        return 5

    eng = Engine(MPI.COMM_SELF, plan, window=window)
    try:
        assert seen == [plan, plan]  # the tree allreduce and the tree broadcast (one rank: no dbtree)
        tree = next(b.runner for b in eng.allreduce_algorithms.bound if b.name == "tree")
        assert tree.window == 5 and tree.schedules.window == 5
        x = np.arange(10, dtype=np.float64)
        assert np.array_equal(eng.allreduce(x.copy(), algorithm="tree"), x)
    finally:
        eng.close()


def test_a_callable_window_is_resolved_on_dbtrees_own_plan():
    # dbtree runs its own two trees: a window as a function of the plan sees that plan, not the
    # job's (whose trees it does not run)
    from loop_transport import run_ranks
    from horotopo.algorithms.dbtree import double_tree_plan
    from horotopo.schedule import window_for

    n = 5  # ring's 5 trees of 1 MiB chunks get 3, dbtree's 2 trees 4
    plan = _ring(n)

    def body(t):
        eng = Engine(t, plan, window=lambda p: window_for(plan.chunk_bytes, len(p.trees)))
        try:
            runners = {b.name: b.runner for b in eng.allreduce_algorithms.bound}
            got = (runners["tree"].window, runners["dbtree"]._trees.window,
                   runners["dbtree"]._trees.plan.digest)
            x = np.full(16, t.rank, np.float64)
            assert np.array_equal(eng.allreduce(x, algorithm="dbtree"), np.full(16, 10.0))
            return got
        finally:
            eng.close()

    want = (window_for(plan.chunk_bytes, n), window_for(plan.chunk_bytes, 2),
            double_tree_plan(n).digest)
    assert want[:2] == (3, 4)
    assert run_ranks(n, body) == [want] * n
