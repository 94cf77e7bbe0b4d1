"""The alpha-beta prediction of a plan's allreduce time and per-tree chunks
(horotopo.packing.alphabeta)."""
import math
from pathlib import Path

import numpy as np
import pytest

from horotopo.generate import generate
from horotopo.packing import alphabeta as ab
from horotopo.params import PlannerParams
from horotopo.plan import Plan, make_plan, plan_from_trees
from horotopo.schedule import compile_allreduce
from horotopo.topology import bundled, from_dict, load

from plan_checks import checked

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent


def _star(n=4, gbps=1.0, latency_ms=0.1):
    """``n`` hosts on one switch, each link ``gbps`` and ``latency_ms`` (a route crosses two)."""
    return from_dict({"name": f"star-{n}", "switches": ["s"],
                      "links": [{"ends": [f"h{i}", "s"], "gbps": gbps, "latency_ms": latency_ms}
                                for i in range(n)],
                      "ranks": [f"h{i}" for i in range(n)]})


def _by_hand(nbytes, chunk, hops, lat, inv, rate, costs, window, fill_only=False):
    """One tree, brute force: the first chunk crosses ``hops`` hops; the rest follow at the
    tree's rate or at what ``window`` chunks in flight sustain over one hop. ``fill_only``:
    the first chunk's time alone."""
    part = float(nbytes)
    c = min(chunk, part)
    hop = lat + c * inv + 2 * costs.per_message_s + costs.per_byte_s * c
    if fill_only:
        return hops * hop
    rate = min(rate, window * c / hop)
    # the slowest hop (every hop here) moves the chunk at the tree's rate
    return hops * hop + (part - c) / rate + c * (1 / rate - inv)


COSTS = ab.SoftwareCosts(per_message_s=20e-6, per_byte_s=1e-9)


@pytest.mark.parametrize("nbytes", [1000, MiB, 64 * MiB])
def test_chain_matches_the_formula(nbytes):
    topo = _star(4)
    chain = (0, (-1, 0, 1, 2), (-1, 0, 1, 2))   # reduce 3->2->1->0, broadcast 0->1->2->3
    rate = 125e6 / 2                            # a chain loads every NIC twice each way
    plan = plan_from_trees(4, [(*chain, rate)], chunk_bytes=256 << 10, topology=topo)
    got = plan.predict_time(nbytes, costs=COSTS)
    net = _by_hand(nbytes, 256 << 10, 6, 2e-4, 1 / 125e6, rate, COSTS, ab.window_for(256 << 10))
    # the busiest rank (a middle one) posts 4 messages and receives 2 chunks per chunk
    chunks = math.ceil(nbytes / (256 << 10))
    c = min(256 << 10, nbytes)
    cpu = chunks * (4 * COSTS.per_message_s + 2 * c * COSTS.per_byte_s)
    # that rank works within the allreduce: after the first chunk's fill, not over it
    fill = _by_hand(nbytes, 256 << 10, 6, 2e-4, 1 / 125e6, rate, COSTS, 4, fill_only=True)
    assert got == pytest.approx(max(net, cpu + fill), rel=1e-12)
    # the network alone: no software cost anywhere
    assert plan.predict_time(nbytes, costs=ab.NO_COSTS) == pytest.approx(
        _by_hand(nbytes, 256 << 10, 6, 2e-4, 1 / 125e6, rate, ab.NO_COSTS,
                 ab.window_for(256 << 10)), rel=1e-12)


def test_star_charges_the_root_for_its_children():
    topo = _star(5, latency_ms=0.0)
    star = (0, (-1, 0, 0, 0, 0), (-1, 0, 0, 0, 0))
    rate = 125e6 / 4                             # the root's NIC carries four arcs each way
    plan = plan_from_trees(5, [(*star, rate)], chunk_bytes=64 << 10, topology=topo)
    for nbytes in (4096, 16 * MiB):
        net = _by_hand(nbytes, 64 << 10, 2, 0.0, 1 / 125e6, rate, COSTS, ab.window_for(64 << 10))
        c = min(64 << 10, nbytes)
        cpu = math.ceil(nbytes / (64 << 10)) * (8 * COSTS.per_message_s
                                                + 4 * c * COSTS.per_byte_s)
        fill = _by_hand(nbytes, 64 << 10, 2, 0.0, 1 / 125e6, rate, COSTS, 4, fill_only=True)
        assert plan.predict_time(nbytes, costs=COSTS) == pytest.approx(max(net, cpu + fill),
                                                                       rel=1e-12)
    # with costs that large the root's CPU is the bottleneck of a big allreduce, from the
    # first chunk's arrival to the last one's departure
    heavy = ab.SoftwareCosts(1e-3, 1e-7)
    cpu = math.ceil(16 * MiB / (64 << 10)) * (8e-3 + 4 * (64 << 10) * 1e-7)
    fill = _by_hand(16 * MiB, 64 << 10, 2, 0.0, 1 / 125e6, rate, heavy, 4, fill_only=True)
    assert plan.predict_time(16 * MiB, costs=heavy) == pytest.approx(cpu + fill, rel=1e-12)


def test_fill_is_charged_at_link_rates_not_at_a_small_trees_rate():
    """A tree with a tiny share (fattree at 64 ranks) has a tiny rate, but its chunk
    crosses each link at the link's speed."""
    topo = _star(4)
    chain = (0, (-1, 0, 1, 2), (-1, 0, 1, 2))
    big, small = plan_from_trees(4, [(*chain, 60e6), (*chain, 0.6e6)], chunk_bytes=MiB,
                                 topology=topo).trees
    plan = Plan(n=4, trees=(big, small), chunk_bytes=MiB, throughput_Bps=60.6e6,
                ring_Bps=60.6e6, upper_bound_Bps=None, latency_s=2e-4)
    t = plan.predict_time(64 * MiB, costs=ab.NO_COSTS)
    # M / R plus five more hops of a 1 MiB chunk at 1 gbps and six latencies, not six hops
    # at 0.6 MB/s (10 s)
    assert t == pytest.approx(64 * MiB / 60.6e6 + 5 * MiB / 125e6 + 6 * 2e-4, rel=1e-9)


def test_network_model_scales_latency_and_caps_a_message():
    net = ab.NetworkModel(latency_factor=13.0, bandwidth_factor=0.97, tcp_window_bytes=4 * MiB)
    lat, inv = net.hop(5e-3, 1 / 1.25e9)
    assert lat == pytest.approx(65e-3)
    assert 1 / inv == pytest.approx(0.97 * 4 * MiB / 10e-3)   # the window over the round trip
    assert net.hop(0.0, 1 / 1e9)[1] == pytest.approx(1 / 0.97e9)
    with pytest.raises(ValueError):
        ab.NetworkModel(latency_factor=0.0)


def test_chunk_choice_grows_with_size():
    # 100 gbps local links: the engine's software cost per chunk binds at small chunks
    topo = from_dict(generate("fattree:hosts_per_leaf=8,spines=4,gpus=8", 16))
    chunks = [max(make_plan(topo, size=size, forest="deep").tree_chunks())
              for size in (64 << 10, MiB, 16 * MiB, 256 * MiB, 4096 * MiB)]
    assert chunks == sorted(chunks) and chunks[0] == 64 << 10 and chunks[-1] == 4 * MiB
    # the tree-level rule alone, over a fine ladder of sizes, on a fast and a slow path
    for rate, inv in ((2e9, 1 / 12.5e9), (60e6, 1 / 125e6)):
        profile = ((2e-5, inv, 6),)
        picks = [ab.choose_chunk(p, rate, profile, (4.0, 2.0), 64 << 10, 4 * MiB)
                 for p in np.geomspace(1e3, 1e10, 40)]
        assert picks == sorted(picks) and picks[-1] <= 4 * MiB
        assert all(c >= 64 << 10 or c == math.ceil(p) for c, p in
                   zip(picks, np.geomspace(1e3, 1e10, 40)))


def test_plan_carries_per_tree_chunks_through_json_digest_and_tables():
    topo = from_dict(generate("sites:gpus=8,wan_gbps=10", 32))
    plan = checked(make_plan(topo, size=64 * MiB, forest="deep"), topo)
    # the deepest tree gets a smaller chunk than another (its fill is depth x chunk)
    deep = max(plan.trees, key=lambda t: t.depth)
    assert deep.chunk_bytes < max(plan.tree_chunks()) == plan.chunk_bytes
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.digest == plan.digest
    assert plan.with_chunk(plan.chunk_bytes).digest != plan.digest
    # the step table cuts each tree's segment in that tree's chunks, scaled with the engine's
    elems = plan.chunk_bytes // 4
    table = compile_allreduce(plan, 0, 1 << 20, np.float32, elems)
    for t in table.trees:
        want = plan.tree_chunks(elems)[t.tree]
        assert max(b - a for a, b in t.chunks) == min(want, t.chunks[-1][1] - t.chunks[0][0])


# -- against the simulator ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def network():
    """The simulator's network as measured (horotopo.algorithms.simcheck)."""
    pytest.importorskip("horotopo.simulation")
    from horotopo.transport.simulated import SimulatorMissing

    from horotopo.algorithms import simcheck
    try:
        return simcheck.measure_network()
    except SimulatorMissing as exc:
        pytest.skip(str(exc))


def test_simulator_network_is_measured(network):
    from horotopo.algorithms import simcheck

    assert network.latency_factor > 0 and 0.5 < network.bandwidth_factor <= 1
    # the model reproduces one message over a long link (latency, rate, window cap), here
    # with the link carrying only that message: the bandwidth factor measured both ways is
    # the lower one, so the model may be up to its few percent slow
    lat, inv = network.hop(5e-3, 1 / 1.25e9)
    got = simcheck.one_message(simcheck.pair(10.0, 5.0), 64 * MiB)
    assert lat + 64 * MiB * inv == pytest.approx(got, rel=0.1)


def test_the_chooser_predicts_on_the_network_the_simulator_measures(network):
    """flows.TCP_NETWORK, what init's chooser predicts on, holds the figures that
    measure_network reads from single simulated messages (SimGrid's LV08 TCP model)."""
    from horotopo.algorithms.flows import TCP_NETWORK

    for field in ("latency_factor", "bandwidth_factor", "tcp_window_bytes", "weight_bytes",
                  "crosstraffic", "mixed_efficiency"):
        assert getattr(TCP_NETWORK, field) == pytest.approx(getattr(network, field), rel=0.02)
    assert (TCP_NETWORK.streams, TCP_NETWORK.shared_messages) == (network.streams,
                                                                  network.shared_messages)


@pytest.mark.parametrize("spec,n,size,forest", [
    ("racks-2x3", 6, 16 * MiB, "deep"),
    ("slow-nic", 4, MiB, "deep"),
    pytest.param("fattree:hosts_per_leaf=8,spines=4,gpus=8", 16, 64 * MiB, "hosts",
                 marks=pytest.mark.xfail(strict=True, reason=(
                     "a known miss: the chain inside each host, with the CPU profile's costs, "
                     "simulates 94.2 ms where the plan predicts 76.9 (the network alone: "
                     "60.3 against 58.7)"))),
])
def test_prediction_within_15_percent_of_the_simulation(network, spec, n, size, forest):
    from horotopo.algorithms import simcheck

    topo = from_dict(generate(spec, n)) if ":" in spec else load(bundled(spec))
    plan = make_plan(topo, size=size, forest=forest)
    sim = simcheck.simulate_allreduce(topo, plan, "tree", size, timeout_s=120)
    assert sim["wrong"] == 0
    pred = plan.predict_time(size, costs=simcheck.simulated_costs(), network=network)
    assert pred == pytest.approx(sim["time_s"], rel=0.15)


@pytest.mark.parametrize("spec,n,algorithm", [
    # ring stands on the stage model that hierarchical allreduce checks here too
    pytest.param("racks:hosts_per_rack=2,gpus=4,oversub=4,slow=0.25", 16, "ring",
                 marks=pytest.mark.slow),
    ("racks:hosts_per_rack=2,gpus=4,oversub=4,slow=0.25", 16, "hierarchical"),
    ("racks:hosts_per_rack=2,gpus=4,oversub=4,slow=0.25", 16, "dbtree"),
])
def test_every_algorithm_within_10_percent_of_the_simulation(network, spec, n, algorithm):
    """The chooser's predictions (horotopo.algorithms.choice) of the peers against one
    simulated allreduce each, at the plan's chunk."""
    from horotopo.algorithms import simcheck
    from horotopo.algorithms.choice import predictions

    topo = from_dict(generate(spec, n))
    plan = make_plan(topo, size=16 * MiB)
    sim = simcheck.simulate_allreduce(topo, plan, algorithm, 16 * MiB, timeout_s=120)
    assert sim["wrong"] == 0
    pred = predictions(topo, plan, 16 * MiB, costs=simcheck.simulated_costs(),
                       network=network)[algorithm]
    assert pred == pytest.approx(sim["time_s"], rel=0.10)


def test_plan_level_chunk_scale_counts_every_tree_on_a_rank():
    """fattree at 16 ranks, host forest (two hosts: 16 rank-level trees),
    16 MiB: tree by tree each picks 64 KiB chunks, but every rank serves all the trees'
    messages; scaling all chunks alike to the plan's best prediction (with the fill's
    crowding, horotopo.packing.profiles.Crowding) makes them larger and cuts the predicted
    time by more than 10%, and the simulated time with it (`horotopo simulate ... --plan P
    --chunk C`)."""
    topo = from_dict(generate("fattree:hosts_per_leaf=8,spines=4,gpus=8", 16))
    size = 16 * MiB
    scaled = make_plan(topo, size=size, forest="hosts")
    alone = make_plan(topo, size=size, forest="hosts",
                      params=PlannerParams(chunk_scales=(1.0,)))
    assert [t.reduce_parent for t in alone.trees] == [t.reduce_parent for t in scaled.trees]
    assert max(alone.tree_chunks()) == 64 << 10 < max(scaled.tree_chunks())
    assert scaled.predict_time(size) < 0.9 * alone.predict_time(size)
