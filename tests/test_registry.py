"""The engine's algorithm registry: priority order, enabled(plan, buffer), the cost model's
choice among the enabled candidates, forced names and their errors; and the buffer layer's
adapters for other frameworks' buffers."""
import numpy as np
import pytest
from mpi4py import MPI

from horotopo import buffers
from horotopo.algorithms.cost import CostModel
from horotopo.algorithms.registry import (ALLREDUCE, BROADCAST, REGISTRY, Candidate, Candidates,
                                          NotEnabledError, register)
from horotopo.buffers import ScratchPool
from horotopo.engine import Engine, MismatchError
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from horotopo.transport.base import Transport, allreduce_point_to_point

from loop_transport import LoopTransport, LoopWorld, run_ranks
from plan_checks import checked

#: Small messages to MPI, large ones to the tree (as test_engine's cost-model test).
SPLIT = CostModel(mpi_latency_s=20e-6, mpi_Bps=0.5e9, tree_latency_s=200e-6,
                  per_message_s=10e-6)


def _ring(n, chunk=1 << 20):
    return checked(plan_from_trees(n, [(r, *ring_parents(n, r), 1e9) for r in range(n)],
                                   chunk_bytes=chunk, latency_s=1e-5))


class NoLibraryTransport(LoopTransport):
    """A transport without a library allreduce (a simulator's, say): its control steps go
    point to point, and the engine must not offer the "mpi" algorithm on it."""

    allreduce = Transport.allreduce

    def allreduce_control(self, buf, op, timeout_s=None, what="allreduce"):
        allreduce_point_to_point(self, buf, op, timeout_s, what)


def _bound(transport, plan):
    return Candidates.bind(ALLREDUCE, transport, plan, ScratchPool())


def test_default_candidates_in_priority_order():
    t = LoopWorld(4).transports()[0]
    assert _bound(t, _ring(4)).names == ("tree", "ring", "mpi", "dbtree", "hierarchical")
    assert Candidates.bind(BROADCAST, t, _ring(4), ScratchPool()).names == ("tree",)


def test_enabled_follows_the_transport_and_the_dtype():
    plan = _ring(4)
    f32, u8 = np.zeros(8, np.float32), np.zeros(8, np.uint8)
    assert _bound(LoopWorld(4).transports()[0], plan).enabled(plan, f32) == [
        "tree", "ring", "mpi", "dbtree", "hierarchical"]
    bare = _bound(NoLibraryTransport(LoopWorld(4), 0), plan)
    assert bare.enabled(plan, f32) == ["tree", "ring", "dbtree", "hierarchical"]
    # size only: any dtype
    assert bare.enabled(plan, None) == ["tree", "ring", "dbtree", "hierarchical"]
    assert bare.enabled(plan, u8) == []  # uint8 is broadcast-only
    bcast = Candidates.bind(BROADCAST, NoLibraryTransport(LoopWorld(4), 0), plan, ScratchPool())
    assert bcast.enabled(plan, u8) == ["tree"]


def test_cost_model_picks_among_enabled_only():
    plan = _ring(4)
    x = np.zeros(4, np.float32)
    full = _bound(LoopWorld(4).transports()[0], plan)
    assert full.select(plan, x, 1024, plan.chunk_bytes, SPLIT).name == "mpi"
    assert full.select(plan, x, 256 << 20, plan.chunk_bytes, SPLIT).name == "tree"
    # Without a library allreduce the model's small-size choice (mpi) is not enabled: the
    # enabled modelled algorithm runs, at every size.
    bare = _bound(NoLibraryTransport(LoopWorld(4), 0), plan)
    for nbytes in (8, 1024, 256 << 20):
        assert bare.select(plan, x, nbytes, plan.chunk_bytes, SPLIT).name == "tree"


def test_a_forced_algorithm_that_is_not_enabled_names_the_enabled_ones():
    plan = _ring(4)
    bare = _bound(NoLibraryTransport(LoopWorld(4), 0), plan)
    x = np.zeros(4, np.float32)
    assert bare.select(plan, x, 16, plan.chunk_bytes, SPLIT, forced="ring").name == "ring"
    with pytest.raises(NotEnabledError, match=r"'mpi' is not enabled .*library allreduce.*"
                                              r"enabled: tree, ring"):
        bare.select(plan, x, 16, plan.chunk_bytes, SPLIT, forced="mpi")
    with pytest.raises(ValueError,
                       match="must be None or one of tree, ring, mpi, dbtree, "
                             "hierarchical; got 'nccl'"):
        bare.select(plan, x, 16, plan.chunk_bytes, SPLIT, forced="nccl")
    with pytest.raises(NotEnabledError, match="no allreduce algorithm is enabled"):
        bare.select(plan, np.zeros(4, np.uint8), 4, plan.chunk_bytes, SPLIT)


def test_engine_raises_the_forced_error_on_every_rank_and_runs_the_enabled_ones():
    def body(t):
        eng = Engine(t, _ring(2, chunk=64), cost_model=SPLIT)
        with pytest.raises(NotEnabledError, match="enabled: tree, ring"):
            eng.allreduce(np.ones(10, np.float32), algorithm="mpi")
        out = eng.allreduce(np.full(10, t.rank + 1.0, np.float32))  # the model would say mpi
        return eng.last_algorithm, out.tolist()

    got = run_ranks(2, body, NoLibraryTransport)
    assert got == [("tree", [3.0] * 10)] * 2


def test_ranks_forcing_different_algorithms_disagree_on_every_rank():
    def body(t):
        eng = Engine(t, _ring(2, chunk=64))
        with pytest.raises(MismatchError, match="algorithm"):
            eng.allreduce(np.ones(10, np.float32), algorithm="ring" if t.rank else "tree")
        return True

    assert run_ranks(2, body) == [True, True]


def test_a_registered_candidate_is_bound_in_its_place_and_can_be_forced(monkeypatch):
    monkeypatch.setitem(REGISTRY, ALLREDUCE, list(REGISTRY[ALLREDUCE]))
    ran = []

    class Doubling:
        """Not an allreduce: it marks that the registered runner, and only it, ran."""

        last_messages = 7

        def run(self, src, out, op, chunk_elems):
            ran.append(op)
            out[...] = 2 * src

    register(Candidate("double", ALLREDUCE, "nothing", lambda t, plan, buf: True,
                       lambda t, plan, pool, window, params: Doubling()), before="ring")
    with pytest.raises(ValueError, match="registered"):
        register(Candidate("double", ALLREDUCE, "nothing", lambda t, plan, buf: True,
                           lambda t, plan, pool, window, params: Doubling()))

    def body(t):
        eng = Engine(t, _ring(2, chunk=64))
        assert eng.allreduce_algorithms.names == ("tree", "double", "ring", "mpi", "dbtree",
                                                  "hierarchical")
        out = eng.allreduce(np.arange(4, dtype=np.int64), op="max", algorithm="double")
        return out.tolist(), eng.last_messages, eng.last_algorithm

    assert run_ranks(2, body) == [([0, 2, 4, 6], 7, "double")] * 2
    assert ran == ["max", "max"]


def test_a_forced_unknown_broadcast_algorithm_raises():
    with Engine(MPI.COMM_SELF, _ring(1, chunk=64)) as eng:
        buf = np.arange(5, dtype=np.uint8)
        assert eng.broadcast(buf, 0, algorithm="tree") is buf
        with pytest.raises(ValueError, match="broadcast algorithm must be None or one of tree"):
            eng.broadcast(buf, 0, algorithm="ring")


# -- buffer adapters ------------------------------------------------------------------------
class FakeTensor:
    """A buffer of a framework the engine does not know: it holds a NumPy array."""

    def __init__(self, data):
        self.data = data
        self.dtype = data.dtype  # the engine must not take this for a NumPy dtype holder

    def __dlpack__(self, stream=None):
        return self.data.__dlpack__()


FakeTensor.__module__ = "fakeframework.tensor"


class FakeAdapter:
    def as_array(self, buf):
        return buf.data

    def empty_like(self, buf):
        return FakeTensor(np.empty_like(buf.data))


def test_an_adapted_buffer_goes_in_and_its_kind_comes_back(monkeypatch):
    monkeypatch.setattr(buffers, "_ADAPTERS", dict(buffers._ADAPTERS))
    monkeypatch.setattr(buffers, "_BY_TYPE", {})
    x = FakeTensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with Engine(MPI.COMM_SELF, _ring(1, chunk=64)) as eng:
        with pytest.raises(TypeError, match="no buffer adapter is registered for "
                                            "'fakeframework'"):
            eng.allreduce(x)
        buffers.register_adapter("fakeframework", FakeAdapter())
        got = eng.allreduce(x, op="sum", postscale_factor=2.0)
        assert isinstance(got, FakeTensor) and got is not x
        assert got.data.tolist() == [[0, 2, 4], [6, 8, 10]]
        assert eng.allreduce(x, x, op="max") is x  # in place, on the buffer's own memory
        assert eng.broadcast(x, 0) is x
    buffers.unregister_adapter("fakeframework")
    assert buffers.adapter_for(x) is None
    with pytest.raises(ValueError, match="need no adapter"):
        buffers.register_adapter("numpy", FakeAdapter())


def test_enabled_is_asked_once_per_buffer_type_and_dtype_of_the_bound_plan(monkeypatch):
    monkeypatch.setitem(REGISTRY, ALLREDUCE, list(REGISTRY[ALLREDUCE]))
    asked = []

    def only_float64(t, plan, buf):
        asked.append(None if buf is None else buf.dtype.name)
        return buf is not None and buf.dtype == np.float64

    register(Candidate("f64", ALLREDUCE, "float64", only_float64,
                       lambda t, plan, pool, window, params: None), before="tree")
    plan = _ring(4)
    bound = _bound(LoopWorld(4).transports()[0], plan)
    f32, f64 = np.zeros(3, np.float32), np.zeros(5, np.float64)
    for _ in range(3):
        assert bound.select(plan, f32, 12, plan.chunk_bytes, SPLIT, forced="ring").name == "ring"
    assert bound.select(plan, f64, 40, plan.chunk_bytes, None, forced="f64").name == "f64"
    with pytest.raises(NotEnabledError, match="'f64' is not enabled"):
        bound.select(plan, f32, 12, plan.chunk_bytes, None, forced="f64")
    # Unforced, the first enabled algorithm the cost model times wins over a higher one it
    # does not time.
    assert bound.select(plan, np.ones(9), 72, plan.chunk_bytes, None).name == "tree"
    assert asked == ["float32", "float64"]
    # Another plan than the bound one is asked afresh (an engine's plan is fixed, a caller's
    # query about another plan is not cached over it).
    treeless = type("Treeless", (), {"trees": (), "planner": {}})()
    assert bound.enabled(treeless, f32) == ["ring", "mpi", "dbtree", "hierarchical"]
    assert bound.enabled(treeless, f32) == ["ring", "mpi", "dbtree", "hierarchical"]
    assert asked == ["float32", "float64", "float32", "float32"]
    assert bound.enabled(plan, f32) == ["tree", "ring", "mpi", "dbtree", "hierarchical"]
