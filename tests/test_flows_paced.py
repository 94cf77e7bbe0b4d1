"""One tree's flows over one link move at the pace of the lightest: the link gives that flow
its weighted share, and the heavier ones cost the tree their weight over its (flows.py)."""
import pytest

from horotopo.algorithms.flows import FlowNetwork, plan_time
from horotopo.packing.alphabeta import NO_COSTS
from horotopo.plan import plan_from_trees
from horotopo.topology import from_dict

MiB = 1 << 20
GiB = 1 << 30
NIC_BPS = 1.25e9  # 10 gbps


def _chain(far_ms: float):
    """Rank 2 reduces to rank 1, rank 1 to rank 0, and the result comes back: rank 1's NIC
    carries its reduce flow to rank 0 and its broadcast flow to rank 2, whose routes are
    20 us and 20 us plus ``far_ms`` long."""
    topology = from_dict({"name": "chain", "switches": ["s", "t"], "ranks": ["a", "b", "c"],
                          "links": [{"ends": ["a", "s"], "gbps": 10.0, "latency_ms": 0.01},
                                    {"ends": ["b", "s"], "gbps": 10.0, "latency_ms": 0.01},
                                    {"ends": ["c", "t"], "gbps": 10.0, "latency_ms": 0.01},
                                    {"ends": ["s", "t"], "gbps": 1000.0, "latency_ms": far_ms}]})
    chain = (-1, 0, 1)
    return topology, plan_from_trees(3, [(0, chain, chain, 1.0)], chunk_bytes=64 << 10,
                                     topology=topology)


# a flow's weight: the inverse of its route's latency plus 2.5 kB over each of its links'
# rates; no acknowledgement traffic
NETWORK = FlowNetwork(weight_bytes=2500.0, crosstraffic=0.0, mixed_efficiency=0.8)


def _penalty(topology, u: int, v: int) -> float:
    return topology.latency(u, v) + NETWORK.weight_bytes * sum(
        1.0 / topology.capacity_array[r] for r in topology.route(u, v))


@pytest.mark.parametrize("far_ms,ratio", [
    (0.0, 1.0),      # equal weights: two flows' shares
    (0.0072, 1.3),   # the reduce flow weighs 1.3 times the broadcast flow: 1.3 shares
    (0.06, 1.5),     # 3.5 times: at most 2 / 0.8 - 1 = 1.5 shares
])
def test_a_rank_whose_two_flows_differ_in_weight_holds_the_tree_to_the_lighter_share(
        far_ms, ratio):
    topology, plan = _chain(far_ms)
    assert min(_penalty(topology, 1, 2) / _penalty(topology, 1, 0), 1.5) == pytest.approx(
        ratio, rel=0.01)
    got = plan_time(topology, plan, GiB, costs=NO_COSTS, network=NETWORK)
    assert got == pytest.approx(GiB * (1.0 + ratio) / NIC_BPS, rel=0.01)


def test_without_a_measured_cost_of_unequal_weights_the_flows_share_equally():
    topology, plan = _chain(0.06)
    network = FlowNetwork(weight_bytes=NETWORK.weight_bytes, crosstraffic=0.0)
    assert plan_time(topology, plan, GiB, costs=NO_COSTS, network=network) == pytest.approx(
        GiB * 2.0 / NIC_BPS, rel=0.01)


def test_flows_of_one_half_take_turns_and_keep_the_link():
    """Two children of unequal weights reduce into one rank over its NIC, and it broadcasts
    back over the other direction: each direction carries one half of the tree, and the
    simulator runs it at the flows' equal shares (weighing them cost 26-54% here)."""
    topology = from_dict({"name": "star", "switches": ["s", "t"], "ranks": ["p", "c0", "c1"],
                          "links": [{"ends": ["p", "s"], "gbps": 10.0, "latency_ms": 0.01},
                                    {"ends": ["c0", "s"], "gbps": 10.0, "latency_ms": 0.01},
                                    {"ends": ["c1", "t"], "gbps": 10.0, "latency_ms": 0.01},
                                    {"ends": ["s", "t"], "gbps": 1000.0, "latency_ms": 0.06}]})
    assert _penalty(topology, 2, 0) > 3 * _penalty(topology, 1, 0)
    star = (-1, 0, 0)
    plan = plan_from_trees(3, [(0, star, star, 1.0)], chunk_bytes=64 << 10, topology=topology)
    got = plan_time(topology, plan, GiB, costs=NO_COSTS, network=NETWORK)
    assert got == pytest.approx(GiB * 2.0 / NIC_BPS, rel=0.01)


def test_the_halves_of_different_ranks_over_one_link_pace_each_other_too():
    """One 10 gbps uplink carries rank a1's reduce flow and rank a2's broadcast flow to a far
    rank, 3.5 times lighter; every other link is ten times faster. The simulator runs such a
    tree at 0.64 of two flows' shares (64 MiB: 189.3 ms against 120.7 with the far rank
    near), so the link is charged as for one rank's two halves."""
    fast = 100.0
    topology = from_dict({
        "name": "uplink", "switches": ["s", "t", "u"], "ranks": ["r", "a1", "a2", "z"],
        "links": [{"ends": ["r", "t"], "gbps": fast, "latency_ms": 0.01},
                  {"ends": ["a1", "s"], "gbps": fast, "latency_ms": 0.01},
                  {"ends": ["a2", "s"], "gbps": fast, "latency_ms": 0.01},
                  {"ends": ["z", "u"], "gbps": fast, "latency_ms": 0.01},
                  {"ends": ["s", "t"], "gbps": 10.0, "latency_ms": 0.0},
                  {"ends": ["t", "u"], "gbps": fast, "latency_ms": 0.06}]})
    assert _penalty(topology, 2, 3) > 2 * _penalty(topology, 1, 0)
    reduce_parent = (-1, 0, 1, 0)   # a2 -> a1 -> r, z -> r
    bcast_parent = (-1, 0, 0, 2)    # r -> a1, r -> a2, a2 -> z
    plan = plan_from_trees(4, [(0, reduce_parent, bcast_parent, 1.0)], chunk_bytes=64 << 10,
                           topology=topology)
    got = plan_time(topology, plan, GiB, costs=NO_COSTS, network=NETWORK)
    assert got == pytest.approx(GiB * 2.5 / NIC_BPS, rel=0.01)


def _fork(far_ms: float, network_gbps: float = 10.0):
    """Rank b reduces to rank a and gathers the reduce flows of a far rank c and a near rank
    d: b's NIC carries, each way, the far flow, a near flow of its half and a near flow of
    the other half."""
    topology = from_dict({"name": "fork", "switches": ["s", "t"],
                          "ranks": ["a", "b", "c", "d"],
                          "links": [{"ends": ["a", "s"], "gbps": 10.0, "latency_ms": 0.002},
                                    {"ends": ["b", "s"], "gbps": 10.0, "latency_ms": 0.002},
                                    {"ends": ["c", "t"], "gbps": 10.0, "latency_ms": 0.002},
                                    {"ends": ["d", "s"], "gbps": 10.0, "latency_ms": 0.002},
                                    {"ends": ["s", "t"], "gbps": network_gbps,
                                     "latency_ms": far_ms}]})
    fork = (-1, 0, 1, 1)
    return topology, plan_from_trees(4, [(0, fork, fork, 1.0)], chunk_bytes=128 << 10,
                                     topology=topology)


def test_a_heavier_flow_of_the_lightest_flows_half_takes_turns_with_it():
    """Into b: c's reduce flow (the lightest), d's reduce flow and a's broadcast flow, both
    heavier; out of b the same with the halves swapped. Only the other half's flow is
    charged its weight: 1 + 1 + 1.5 shares each way, not 1 + 2 x 1.5."""
    topology, plan = _fork(0.06, network_gbps=1000.0)
    assert _penalty(topology, 2, 1) > 3 * _penalty(topology, 3, 1)
    assert _penalty(topology, 1, 2) > 3 * _penalty(topology, 0, 1)
    got = plan_time(topology, plan, GiB, costs=NO_COSTS, network=NETWORK)
    assert got == pytest.approx(GiB * 3.5 / NIC_BPS, rel=0.01)


@pytest.mark.parametrize("far_ms,simulated_ms", [(0.01, 215.2), (0.05, 230.3)])
def test_the_fork_runs_as_simulated(far_ms, simulated_ms):
    """The fork over a 10 gbps link between its switches, 64 MiB in 128 KiB chunks, window
    16, no software cost, on the simulator's network (TCP_NETWORK), against the simulated
    times of this plan (simcheck.timed_allreduce): charging the near flow of the far flow's
    own half its weight too predicts 254 and 274 ms."""
    from horotopo.algorithms.flows import TCP_NETWORK

    topology, plan = _fork(far_ms)
    got = plan_time(topology, plan, 64 * MiB, 128 << 10, NO_COSTS, TCP_NETWORK, 16)
    assert got == pytest.approx(simulated_ms * 1e-3, rel=0.05)


def test_the_double_binary_tree_over_two_racks_runs_as_simulated():
    """NCCL's two trees over 16 ranks, two per host, four hosts per rack behind a 4:1
    uplink, 64 MiB in 128 KiB chunks (window 16), no software cost, on the simulator's
    network, against the simulated 221.8 ms (simcheck.timed_allreduce): a host's NIC carries
    a far broadcast flow beside near reduce flows and a near broadcast flow, which takes turns
    with it (charged its weight too, the prediction is 246.9 ms)."""
    from horotopo.algorithms.dbtree import double_tree_plan_on
    from horotopo.algorithms.flows import TCP_NETWORK
    from horotopo.generate import generate

    topology = from_dict(generate("racks:hosts_per_rack=4,gpus=2,oversub=4", 16))
    plan = double_tree_plan_on(topology, 128 << 10)
    got = plan_time(topology, plan, 64 * MiB, 128 << 10, NO_COSTS, TCP_NETWORK, 16)
    assert got == pytest.approx(221.8e-3, rel=0.08)


def test_the_double_binary_tree_over_two_sites_runs_as_simulated():
    """NCCL's two trees over 64 ranks at two sites (10 gbps WAN of 5 ms), 64 MiB in 128 KiB
    chunks (window 16), no software cost, on the simulator's network, against the simulated
    317.5 ms (simcheck.timed_allreduce): a NIC carries both halves' WAN flows, each the
    lightest of its half, beside heavier local flows of both halves, and each local flow is
    charged against the other half's WAN flow (charging none of them, the prediction is
    258.9 ms)."""
    from horotopo.algorithms.dbtree import double_tree_plan_on
    from horotopo.algorithms.flows import TCP_NETWORK
    from horotopo.generate import generate

    topology = from_dict(generate("sites:gpus=8,wan_gbps=10", 64))
    plan = double_tree_plan_on(topology, 128 << 10)
    got = plan_time(topology, plan, 64 * MiB, 128 << 10, NO_COSTS, TCP_NETWORK, 16)
    assert got == pytest.approx(317.5e-3, rel=0.08)
