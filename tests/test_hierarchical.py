"""Hierarchical allreduce (horotopo.algorithms.hierarchical): its schedule, its results bit for
bit against NumPy on hosts of equal and unequal sizes, in process over threads, and its model."""
from __future__ import annotations

import numpy as np
import pytest

from engine_cases import random_plan
from loop_transport import LoopTransport, run_ranks
from reduction_cases import OPS, dtype_name, mismatches, oracle, special_input
from horotopo.algorithms.hierarchical import (HierarchicalAllreduce, hierarchical_schedule,
                                              predict_time)
from horotopo.engine import Engine
from horotopo.generate import generate
from horotopo.packing.alphabeta import NO_COSTS
from horotopo.probe.hostinfer import generated_hosts, host_layout
from horotopo.topology import from_dict

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

#: hosts x ranks per host, then two layouts of unequal hosts (rank order interleaves them)
LAYOUTS = {
    "2x2": ["a", "a", "b", "b"],
    "3x2": ["a", "a", "b", "b", "c", "c"],
    "2x3": ["a", "a", "a", "b", "b", "b"],
    "1x4": ["a"] * 4,
    "4x1": ["a", "b", "c", "d"],
    "3+1+2": ["a", "b", "a", "c", "a", "c"],
    "1+3": ["a", "b", "b", "b"],
}
DTYPES = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64),
          np.dtype(np.int32), np.dtype(np.int64)]


def named(hosts):
    """A LoopTransport factory whose rank ``r`` runs on the host ``hosts[r]``."""
    class OnHost(LoopTransport):
        @property
        def processor_name(self):
            return hosts[self.rank]
    return lambda world, rank: OnHost(world, rank)


def inputs(rank, count, dtype, op):
    if dtype.kind == "f":
        return special_input(rank, count, dtype, op)
    rng = np.random.default_rng([rank, count, len(op)])
    if op == "product":
        return rng.choice([-2, -1, 1, 2], count).astype(dtype)
    return rng.integers(-1000, 1000, count).astype(dtype)


def want(xs, op):
    if xs[0].dtype.kind == "f":
        return oracle(xs, op)
    acc = xs[0].copy()
    for x in xs[1:]:
        acc = {"sum": np.add, "product": np.multiply, "max": np.maximum,
               "min": np.minimum}[op](acc, x)
    return acc


def through_engine(hosts, cases, op, in_place=False, chunk_bytes=64):
    """Every rank's results of the engine's ``hierarchical`` algorithm, forced, for each
    ``(count, dtype)`` of ``cases``: ``[case][rank]``."""
    n = len(hosts)
    plan = random_plan(n, seed=3, chunk_bytes=chunk_bytes)

    def body(t):
        eng = Engine(t, plan)
        try:
            out = []
            for count, dtype in cases:
                x = inputs(t.rank, count, dtype, op)
                out.append(eng.allreduce(x, x if in_place else None, op=op,
                                         algorithm="hierarchical"))
                assert eng.last_algorithm == "hierarchical"
            return out
        finally:
            eng.close()

    per_rank = run_ranks(n, body, transport=named(hosts))
    return [[r[k] for r in per_rank] for k in range(len(cases))]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("op", OPS)
def test_every_rank_gets_numpys_bits_on_every_layout(layout, op):
    hosts = LAYOUTS[layout]
    n = len(hosts)
    # tiny (fewer elements than ranks), not divisible by the host size, several chunks
    cases = [(count, dtype) for dtype in DTYPES for count in sorted({1, n - 1, 7, 129}) if count]
    for (count, dtype), got in zip(cases, through_engine(hosts, cases, op)):
        expect = want([inputs(r, count, dtype, op) for r in range(n)], op)
        for r, g in enumerate(got):
            bad = mismatches(g, expect, op)
            assert not bad, f"{layout} {dtype_name(dtype)} {op} n={count} rank {r}: {bad}"


@pytest.mark.parametrize("layout", ["2x3", "3+1+2"])
def test_in_place_gives_the_same_bits(layout):
    hosts = LAYOUTS[layout]
    dtype = np.dtype(np.float32)
    expect = want([inputs(r, 1000, dtype, "sum") for r in range(len(hosts))], "sum")
    for g in through_engine(hosts, [(1000, dtype)], "sum", in_place=True, chunk_bytes=256)[0]:
        assert not mismatches(g, expect, "sum")


def test_the_schedule_gives_each_local_rank_one_shard_and_the_ring_of_its_peers():
    layout = host_layout(LAYOUTS["3x2"])
    plan = hierarchical_schedule(layout, 3, 10)
    assert plan.shards == ((0, 5), (5, 10))
    assert plan.local == (2, 3) and plan.owner == (2, 3)
    # local rank 1 of every host allreduces shard 1
    assert plan.rings == ((1, (1, 3, 5)),)


def test_on_unequal_hosts_a_small_host_owns_several_shards():
    layout = host_layout(LAYOUTS["3+1+2"])  # host a: 0, 2, 4; b: 1; c: 3, 5
    assert hierarchical_schedule(layout, 1, 9).rings == ((0, (0, 1, 3)), (1, (2, 1, 5)),
                                                         (2, (4, 1, 3)))
    assert hierarchical_schedule(layout, 3, 9).rings == ((0, (0, 1, 3)), (2, (4, 1, 3)))
    # a buffer smaller than the shard count: empty shards have no ring
    assert hierarchical_schedule(layout, 0, 2).rings == ()


def test_given_hosts_are_checked_against_the_rank_count():
    def body(t):
        with pytest.raises(ValueError, match="hosts names 3 ranks"):
            HierarchicalAllreduce(t, hosts=["a", "a", "b"])
        runner = HierarchicalAllreduce(t, hosts=["a", "b"])
        x = np.arange(5, dtype=np.float64) * (t.rank + 1)
        out = np.empty_like(x)
        runner.run(x, out, "sum", 2)
        return out

    for got in run_ranks(2, body):
        np.testing.assert_array_equal(got, np.arange(5) * 3.0)


def test_the_model_times_the_network_and_the_software_costs():
    doc = generate("racks:hosts_per_rack=2,gpus=4", 16)
    topology = from_dict(doc)
    hosts = generated_hosts(doc)
    assert len(set(hosts)) == 4
    small = predict_time(topology, hosts, 1 << 20, 1 << 18)
    big = predict_time(topology, hosts, 64 << 20, 1 << 20)
    assert 0 < small < big
    # The network alone: each NIC carries 4 rings' flows of 1/16 of the buffer in 6 steps
    # (1.5 buffers at 1.25 GB/s), and each rank 3/4 of the buffer over its 12.5 GB/s local
    # link in and out in each host stage; one host per rank instead makes one ring of 30
    # steps of 1/16, 1.875 buffers per NIC.
    nbytes = 64 << 20
    network = predict_time(topology, hosts, nbytes, 1 << 20, costs=NO_COSTS)
    assert network == pytest.approx(1.5 * nbytes / 1.25e9 + 2 * 0.75 * nbytes / 12.5e9,
                                    rel=0.01)
    flat = predict_time(topology, [str(i) for i in range(16)], nbytes, 1 << 20, costs=NO_COSTS)
    assert flat == pytest.approx(1.875 * nbytes / 1.25e9, rel=0.01) and flat > network
    assert big > network  # the receive-side software cost is charged on the busiest rank
    with pytest.raises(ValueError, match="hosts names 3 ranks"):
        predict_time(topology, ["a"] * 3, 1 << 20, 1 << 18)


@pytest.mark.parametrize("setting", [None, "1"])
def test_horovod_hierarchical_allreduce_forces_it_for_every_call_left_to_the_engine(
        monkeypatch, setting):
    from horotopo.adapt import AdaptiveEngine
    from horotopo.bootstrap import uniform_document
    from horotopo.plan import make_plan

    if setting is None:
        monkeypatch.delenv("HOROVOD_HIERARCHICAL_ALLREDUCE", raising=False)
    else:
        monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", setting)
    hosts = LAYOUTS["2x2"]
    topo = from_dict(uniform_document(len(hosts), 10.0))
    plan = make_plan(topo, chunk_bytes=4096)
    dtype = np.dtype(np.float32)
    want_sum = want([inputs(r, 3000, dtype, "sum") for r in range(len(hosts))], "sum")

    def body(t):
        eng = AdaptiveEngine(t, plan, topo, adapt=False, timeout_s=0)
        try:
            got = eng.allreduce(inputs(t.rank, 3000, dtype, "sum"), op="sum")
            chosen = eng.engine.last_algorithm
            eng.allreduce(np.ones(8, np.float32), algorithm="ring")  # named: still honoured
            return got, chosen, eng.engine.last_algorithm
        finally:
            eng.close()

    for got, chosen, named_alg in run_ranks(len(hosts), body, transport=named(hosts)):
        assert not mismatches(got, want_sum, "sum")
        assert (chosen == "hierarchical") == (setting is not None), chosen
        assert named_alg == "ring"
