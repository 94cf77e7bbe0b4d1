"""The one chooser over every allreduce algorithm with a topology model
(horotopo.algorithms.choice), the one time model it predicts with (horotopo.algorithms.flows:
stages of flows for ring and hierarchical, pipelined trees for the plan's and dbtree's), and the
engine running the algorithm the plan records.

Pure predictions and in-process ranks (tests/loop_transport.py); no simulator, no timing."""
import dataclasses

import numpy as np
import pytest

from horotopo.algorithms import dbtree, hierarchical, ring
from horotopo.algorithms.choice import choose, predictions, recorded_algorithm, with_choice
from horotopo.algorithms.cost import CostModel
from horotopo.algorithms.flows import TCP_NETWORK, FlowNetwork, plan_time, stage_time
from horotopo.engine import Engine
from horotopo.generate import generate, racks
from horotopo.packing import ring_parents
from horotopo.packing import alphabeta as ab
from horotopo.packing.alphabeta import NO_COSTS, NetworkModel, SoftwareCosts
from horotopo.plan import Plan, make_plan, plan_from_trees
from horotopo.topology import from_dict

from loop_transport import run_ranks
from test_registry import NoLibraryTransport

MiB = 1 << 20
COSTS = SoftwareCosts(per_message_s=10e-6, per_byte_s=0.5e-9)


def _star(n=4, gbps=1.0, latency_ms=0.1):
    """``n`` one-rank hosts on one switch, every NIC ``gbps`` and ``latency_ms``."""
    return from_dict({"name": f"star-{n}", "switches": ["s"],
                      "links": [{"ends": [f"h{i}", "s"], "gbps": gbps, "latency_ms": latency_ms}
                                for i in range(n)],
                      "ranks": [f"h{i}" for i in range(n)]})


def _two_hosts(gpus=4, nic_gbps=10.0, wan_ms=5.0):
    """Two hosts of ``gpus`` ranks each (fast local links), their NICs joined over a long
    link of ``wan_ms``."""
    links, ranks = [], []
    for h in ("a", "b"):
        links.append({"ends": [h, "wan"], "gbps": nic_gbps, "latency_ms": wan_ms / 2})
        for g in range(gpus):
            links.append({"ends": [f"{h}g{g}", h], "gbps": 100.0, "latency_ms": 0.001})
            ranks.append(f"{h}g{g}")
    return from_dict({"name": "two-hosts", "switches": ["a", "b", "wan"], "links": links,
                      "ranks": ranks})


def _star_tree(topology, root=0):
    """One star tree at ``root`` (its NIC carries every other rank's arc, both ways)."""
    parent = tuple(-1 if v == root else root for v in range(topology.n))
    return plan_from_trees(topology.n, [(root, parent, parent, 1.0)], chunk_bytes=256 << 10,
                           topology=topology)


def _chain(topology, chunk=256 << 10):
    """One chain in rank order (reduce towards rank 0, broadcast back)."""
    parent = tuple(v - 1 for v in range(topology.n))
    return plan_from_trees(topology.n, [(0, parent, parent, 1.0)], chunk_bytes=chunk,
                           topology=topology)


# -- the models ---------------------------------------------------------------------------------


def test_ring_on_a_uniform_star_is_two_n_minus_one_steps_of_a_segment():
    topo = _star(4, gbps=1.0, latency_ms=0.1)
    size = 8 * MiB
    # every NIC carries one segment each way per step; each route crosses two links
    step = 2e-4 + size / 4 / 125e6
    assert ring.predict_time(topo, size, 64 << 10, NO_COSTS) == pytest.approx(6 * step)


def test_a_stage_charges_the_posts_before_the_wire_and_the_last_handling_after_it():
    topo = _star(2, gbps=1.0, latency_ms=0.0)
    flows = [(0, 1, 1 * MiB), (1, 0, 1 * MiB)]
    wire = MiB / 125e6
    chunks = MiB // (64 << 10)
    # each rank posts a send and a receive per chunk, then handles every received byte
    post = 2 * chunks * COSTS.per_message_s
    handling = MiB * COSTS.per_byte_s
    assert stage_time(topo, flows, 64 << 10, COSTS) == pytest.approx(
        post + wire + handling / chunks)


def test_serial_streams_pay_the_latency_once_per_chunk():
    topo = _star(2, gbps=1.0, latency_ms=1.0)
    flows = [(0, 1, 1 * MiB)]
    free = stage_time(topo, flows, 64 << 10, NO_COSTS)
    serial = stage_time(topo, flows, 64 << 10, NO_COSTS, NetworkModel(streams="serial"))
    assert free == pytest.approx(2e-3 + MiB / 125e6)
    assert serial == pytest.approx(16 * 2e-3 + MiB / 125e6)


def test_the_slowest_link_shared_fairly_sets_a_stage():
    # four flows into one rank: its NIC carries all four
    topo = _star(5, gbps=1.0, latency_ms=0.0)
    flows = [(v, 0, MiB) for v in range(1, 5)]
    assert stage_time(topo, flows, MiB, NO_COSTS) == pytest.approx(4 * MiB / 125e6)


def test_a_flows_acknowledgements_load_its_reverse_route():
    topo = _star(2, gbps=1.0, latency_ms=0.01)
    net = FlowNetwork(bandwidth_factor=0.9, crosstraffic=0.05)
    # alone, a flow has the link's own rate; with one the other way, each loses what the
    # other's acknowledgements take
    alone = stage_time(topo, [(0, 1, MiB)], MiB, NO_COSTS, net)
    both = stage_time(topo, [(0, 1, MiB), (1, 0, MiB)], MiB, NO_COSTS, net)
    assert alone == pytest.approx(2e-5 + MiB / (125e6 * 0.9 * 1.05))
    assert both == pytest.approx(2e-5 + MiB / (125e6 * 0.9))


def test_a_flow_held_through_its_acknowledgements_is_held():
    """Flow A leaves rank 1 over a long route, flow B enters rank 1 over a short one: B's
    larger weight fills rank 1's way in, where A's acknowledgements go, and holds A there
    until B ends."""
    topo = from_dict({"name": "held", "switches": ["s"], "ranks": ["a", "b", "c"],
                      "links": [{"ends": ["a", "s"], "gbps": 10.0, "latency_ms": 0.2},
                                {"ends": ["b", "s"], "gbps": 1.0, "latency_ms": 0.001},
                                {"ends": ["c", "s"], "gbps": 10.0, "latency_ms": 0.001}]})
    net = FlowNetwork(crosstraffic=0.05, weight_bytes=20000.0)
    alone = stage_time(topo, [(1, 0, MiB)], MiB, NO_COSTS, net)
    held = stage_time(topo, [(1, 0, MiB), (2, 1, MiB)], MiB, NO_COSTS, net)
    plain = stage_time(topo, [(1, 0, MiB), (2, 1, MiB)], MiB, NO_COSTS)
    assert held > 1.3 * alone and plain < 1.1 * alone


def test_dbtree_is_predicted_as_the_plan_of_its_two_trees():
    topo = _star(8, gbps=1.0)
    two = dbtree.double_tree_plan_on(topo, 256 << 10)
    shape = dbtree.double_tree_plan(8)
    assert [t.reduce_parent for t in two.trees] == [t.reduce_parent for t in shape.trees]
    assert [t.share for t in two.trees] == pytest.approx([0.5, 0.5])
    assert all(t.profile for t in two.trees)
    assert dbtree.predict_time(topo, 16 * MiB, 256 << 10, COSTS) == pytest.approx(
        plan_time(topo, two, 16 * MiB, 256 << 10, COSTS))


def test_dbtree_first_chunks_crowd_the_links_they_cross_together():
    # Four ranks on a 1 gbps star: in the first tree (root 0, child 2, whose children are 1
    # and 3) both leaves send up into rank 2 at the first step and rank 2 sends down to both
    # at the last, over one link each time; the mirrored tree does the same at rank 1. Each
    # critical path is then two hops at half the link's rate and two at its full rate (the
    # pair's planned rate, a quarter of it per tree, is below both).
    topo = _star(4, gbps=1.0, latency_ms=0.0)
    for tree in dbtree.double_tree_plan_on(topo, 256 << 10).trees:
        assert ab.fill_time(tree.profile, 256 << 10, NO_COSTS) == pytest.approx(
            (256 << 10) * (2 / 125e6 + 2 / 62.5e6))


def _pair_tree(topo, trees=1):
    """``trees`` copies of the one tree of two ranks (rank 1 reduces to rank 0, which
    broadcasts back), sharing the buffer equally."""
    return plan_from_trees(2, [(0, (-1, 0), (-1, 0), 1.0)] * trees, chunk_bytes=256 << 10,
                           topology=topo)


def test_a_tree_moves_its_part_at_its_links_rate_after_its_first_chunk():
    topo = _star(2, gbps=1.0)
    plan = _pair_tree(topo)
    chunk = 256 << 10
    fill = ab.fill_time(plan.trees[0].profile, chunk, NO_COSTS)
    assert plan_time(topo, plan, 16 * MiB, chunk, NO_COSTS) == pytest.approx(
        fill + (16 * MiB - chunk) / 125e6)
    # two trees over the same arcs share the links: each half the rate for half the bytes
    assert plan_time(topo, _pair_tree(topo, 2), 16 * MiB, chunk, NO_COSTS) == pytest.approx(
        fill + (8 * MiB - chunk) / 62.5e6)


def test_a_ranks_cpu_is_shared_by_the_trees_as_a_link_is():
    topo = _star(2, gbps=1.0)
    chunk = 256 << 10
    # every rank handles each byte once (rank 0 the reduce, rank 1 the broadcast): at
    # 0.1 us a byte the CPUs, not the 1 gbps links, hold the tree to 10 MB/s
    slow = SoftwareCosts(per_message_s=0.0, per_byte_s=1e-7)
    fill = ab.fill_time(_pair_tree(topo).trees[0].profile, chunk, slow)
    assert plan_time(topo, _pair_tree(topo), 16 * MiB, chunk, slow) == pytest.approx(
        fill + (16 * MiB - chunk) / 1e7)
    # ... and, profiled as a plan of both, each tree's first chunk waits at each step for
    # its receiving rank to handle the other tree's: up at rank 0 and down at rank 1 (a CPU
    # that takes them in turn staggers them at the first, so the model counts one wait more
    # than a simulation of this pair would)
    two = _pair_tree(topo, 2)
    assert plan_time(topo, two, 16 * MiB, chunk, slow) == pytest.approx(
        fill + (8 * MiB - chunk) / 5e6)
    assert plan_time(topo, two.profiled_on(topo, chunk, slow), 16 * MiB, chunk,
                     slow) == pytest.approx(fill + (8 * MiB - chunk) / 5e6
                                            + 2 * chunk * (1e-7 - 1 / 125e6))


def test_dbtree_over_a_wan_keeps_the_rate_of_its_paced_arcs():
    """Each tree's arcs move at the tree's one rate, so a long arc's small weighted share of a
    link it does not fill does not hold the tree: on two sites the prediction on TCP's network
    stays within twice the declared one (weighing every arc alone gave 87x). Above it: flows of
    unequal weights and rates, and the windows the 5 ms WAN holds back; the simulator runs this
    case (the CPU profile's costs) in 348.2 ms, 1.89x the declared prediction."""
    topo = from_dict(generate("sites:gpus=2,wan_gbps=10", 16))
    declared = dbtree.predict_time(topo, 64 * MiB, 128 << 10, COSTS, ab.IDEAL_NETWORK)
    assert declared < dbtree.predict_time(topo, 64 * MiB, 128 << 10, COSTS, TCP_NETWORK) \
        < 2 * declared


def test_hierarchical_hosts_come_from_a_generated_clusters_gpus():
    topo = from_dict(generate("racks:hosts_per_rack=2,gpus=4,oversub=1", 16))
    hosts = hierarchical.topology_hosts(topo)
    assert len(set(hosts)) == 4 and hosts[:4] == [hosts[0]] * 4


# -- the chooser --------------------------------------------------------------------------------


def test_every_candidate_with_a_model_is_predicted_and_mpi_is_not():
    topo = _star(4)
    got = predictions(topo, _star_tree(topo), 4 * MiB, costs=COSTS)
    assert list(got) == ["tree", "ring", "dbtree", "hierarchical"]
    assert all(v > 0 for v in got.values())
    with pytest.raises(ValueError, match="3 ranks, the topology 4"):
        predictions(topo, _star_tree(_star(3)), MiB)


def test_ring_where_ring_is_predicted_faster_than_the_plans_tree():
    topo = _star(6)
    name, got = choose(topo, _star_tree(topo), 64 * MiB, costs=COSTS)
    # the star's root NIC carries five arcs each way; ring's every NIC one
    assert got["ring"] < 0.5 * got["tree"]
    assert name == min(got, key=got.get) == "ring"


def test_hierarchical_where_it_crosses_the_long_link_fewest_times():
    topo = _two_hosts(gpus=4, wan_ms=5.0)
    name, got = choose(topo, _chain(topo), 4 * MiB, costs=COSTS)
    # ring pays the long link's latency in each of its 2 (n - 1) steps, hierarchical in 2
    assert got["hierarchical"] < got["ring"] and got["hierarchical"] < got["tree"]
    assert name == "hierarchical"


def test_the_tree_on_oversubscribed_racks_with_slow_nics():
    topo = from_dict(generate("racks:hosts_per_rack=4,gpus=2,oversub=4,slow=0.25", 16))
    plan = make_plan(topo, size=64 * MiB)
    name, got = choose(topo, plan, 64 * MiB)
    assert name == "tree" and got["tree"] < 0.8 * min(got["ring"], got["hierarchical"])


def test_on_two_racks_of_1gbps_hosts_the_choice_is_as_fast_as_ring():
    """Two racks of 16 hosts with 1 gbps NICs and 4:1 uplinks, ranks rack by rack: ring
    crosses the uplinks only twice and is near the optimum, so whatever is chosen must be
    predicted no slower than ring (simulated at 32 ranks: the trees 1146.5 ms, ring 1173.0,
    dbtree 1172.7; predicted 1146.7, 1172.7, 1166.0)."""
    topo = from_dict(racks([16, 16], nic_gbps=1.0, uplink_gbps=4.0, interleave=False))
    plan = make_plan(topo, size=64 * MiB)
    name, got = choose(topo, plan, 64 * MiB, costs=COSTS)
    assert got["ring"] < 1.2 * 64 * MiB / plan.upper_bound_Bps
    assert got[name] <= got["ring"]


def test_the_choice_is_recorded_in_the_plan_and_travels_with_it():
    topo = _star(6)
    plan = _star_tree(topo)
    chosen = with_choice(plan, topo, 64 * MiB, costs=COSTS)
    assert chosen.digest == plan.digest and chosen.trees == plan.trees
    assert chosen.planner["algorithm"] == "ring" == recorded_algorithm(chosen)
    assert chosen.planner["algorithm_size"] == 64 * MiB
    assert set(chosen.planner["predicted_s"]) == {"tree", "ring", "dbtree", "hierarchical"}
    back = Plan.from_json(chosen.to_json())
    assert recorded_algorithm(back) == "ring"
    assert back.planner["predicted_s"] == chosen.planner["predicted_s"]
    assert recorded_algorithm(plan) == "tree"


# -- the engine runs the recorded algorithm -----------------------------------------------------

#: Small messages to the library, large ones (from a few KiB) to the topology's choice.
SPLIT = CostModel(mpi_latency_s=20e-6, mpi_Bps=10e6, tree_latency_s=200e-6,
                  per_message_s=10e-6)


def _recording(n, algorithm):
    plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1e9) for r in range(n)],
                           chunk_bytes=1 << 12, latency_s=1e-5)
    return dataclasses.replace(plan, planner=dict(plan.planner, algorithm=algorithm))


@pytest.mark.parametrize("algorithm", ["ring", "dbtree"])
def test_an_engine_whose_plan_records_an_algorithm_runs_it_for_large_buffers(algorithm):
    n, count = 4, 100_003  # not a multiple of the ranks or the chunk

    def body(t):
        eng = Engine(t, _recording(n, algorithm), cost_model=SPLIT)
        x = np.arange(count, dtype=np.float32) % 97 + t.rank
        big = eng.allreduce(x)
        ran = eng.last_algorithm
        small = eng.allreduce(np.full(4, t.rank + 1.0, np.float32))
        ran_small = eng.last_algorithm
        forced = eng.allreduce(x, algorithm="tree")
        return ran, ran_small, eng.last_algorithm, big, small, forced

    want = (np.arange(count, dtype=np.float32) % 97) * n + n * (n - 1) / 2
    for ran, ran_small, last, big, small, forced in run_ranks(n, body):
        assert (ran, ran_small, last) == (algorithm, "mpi", "tree")
        np.testing.assert_array_equal(big, want)
        np.testing.assert_array_equal(forced, want)
        assert small.tolist() == [n * (n + 1) / 2] * 4


def test_without_a_library_the_recorded_algorithm_runs_at_every_size():
    def body(t):
        eng = Engine(t, _recording(2, "ring"), cost_model=SPLIT)
        out = eng.allreduce(np.full(10, t.rank + 1.0, np.float32))
        return eng.last_algorithm, out.tolist()

    assert run_ranks(2, body, NoLibraryTransport) == [("ring", [3.0] * 10)] * 2


def test_a_recorded_algorithm_that_is_not_registered_leaves_the_trees():
    def body(t):
        eng = Engine(t, _recording(2, "nccl"), cost_model=SPLIT)
        out = eng.allreduce(np.full(1 << 16, t.rank + 1.0, np.float32))
        return eng.last_algorithm, float(out[0])

    assert run_ranks(2, body) == [("tree", 3.0)] * 2


def test_init_records_the_choice_in_the_plan_every_rank_gets():
    from horotopo.bootstrap import setup
    from horotopo.topology import load

    env = {"HOROTOPO_TOPOLOGY": "racks-2x3", "HOROTOPO_PROBE": "quick"}
    got = run_ranks(6, lambda t: setup(t, env=env).plan.planner)
    assert all(p == got[0] for p in got)
    plan = make_plan(load("racks-2x3"))
    name, predicted = choose(load("racks-2x3"), plan)
    assert got[0]["algorithm"] == name
    assert got[0]["predicted_s"] == pytest.approx(predicted)


def test_a_shared_plan_gets_the_choice_unless_its_builder_made_one():
    from horotopo.planning_protocol import share_plan
    from horotopo.topology import load

    topo = load("racks-2x3")
    plan = make_plan(topo)
    fixed = dataclasses.replace(plan, planner=dict(plan.planner, algorithm="dbtree"))
    got = run_ranks(6, lambda t: (share_plan(t, lambda: (plan, topo))[0].planner,
                                  share_plan(t, lambda: (fixed, topo))[0].planner,
                                  share_plan(t, lambda: (plan, None))[0].planner))
    for chosen, kept, bare in got:
        assert chosen["algorithm"] == choose(topo, plan)[0]
        assert kept["algorithm"] == "dbtree"
        assert "algorithm" not in bare
