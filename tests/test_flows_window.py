"""The flow model's window over a long route (horotopo.algorithms.flows.trees_time): the
chunks in flight over a hop cross it as one block, and a tree keeps its in-flight chunks per
round trip of its critical paths."""
import pytest

from horotopo.algorithms.flows import TCP_NETWORK, plan_time
from horotopo.generate import generate
from horotopo.packing.alphabeta import NO_COSTS
from horotopo.plan import plan_from_trees
from horotopo.topology import from_dict

MiB = 1 << 20


@pytest.mark.parametrize("window,simulated_ms", [(4, 709.57), (8, 441.93), (16, 327.74),
                                                 (32, 239.91)])
def test_one_tree_over_a_wan_is_held_by_its_window_per_round_trip(window, simulated_ms):
    """Two ranks at two sites joined by a 10 gbps WAN of 5 ms, one tree (the reduce up the
    WAN and the broadcast back), 64 MiB in 128 KiB chunks, no software cost, against the
    simulated times of this plan at each window (simcheck.timed_allreduce): a window of
    chunks crosses per latency plus its bytes at the link's rate, and the tree keeps its
    in-flight chunks per round trip (a window per one chunk's hop time is twice as fast at
    window 16)."""
    topo = from_dict(generate("sites:gpus=1,wan_gbps=10", 2))
    chain = (-1, 0)
    plan = plan_from_trees(2, [(0, chain, chain, 1.25e9)], chunk_bytes=128 << 10,
                           topology=topo)
    got = plan_time(topo, plan, 64 * MiB, 128 << 10, NO_COSTS, TCP_NETWORK, window)
    assert got == pytest.approx(simulated_ms * 1e-3, rel=0.05)


def _host_forest(hosts, per_host):
    """Every rank the root of one tree: a chain through each machine from the rank at the
    root's position, each chain's head under the root (the planner's host forest of
    machines on one switch each)."""
    n = hosts * per_host
    trees = []
    for root in range(n):
        parent = [-1] * n
        for h in range(hosts):
            base = h * per_host
            head = base + root % per_host
            parent[head] = -1 if head == root else root
            for i in range(1, per_host):
                parent[base + (root + i) % per_host] = base + (root + i - 1) % per_host
        trees.append((root, tuple(parent), tuple(parent), 1.25e9 / n))
    return trees


@pytest.mark.parametrize("window,simulated_ms", [(3, 82.81), (6, 75.66), (12, 72.04)])
def test_reduce_arcs_over_a_wan_idle_in_step(window, simulated_ms):
    """Two sites of one 8-rank machine each over a 10 gbps WAN of 5 ms, the host forest of
    16 trees (each a chain per machine, the far chain's head reducing into the root across
    the WAN), 64 MiB in 256 KiB chunks, no software cost, against the simulated times of this
    plan at each window (simcheck.timed_allreduce): the WAN's reduce arcs wait a latency
    between their windows together, and the link idles with them (fair sharing alone gives
    every window the same time, the WAN's bytes at its rate)."""
    topo = from_dict(generate("sites:gpus=8,wan_gbps=10", 16))
    plan = plan_from_trees(16, _host_forest(2, 8), chunk_bytes=256 << 10, topology=topo)
    got = plan_time(topo, plan, 64 * MiB, 256 << 10, NO_COSTS, TCP_NETWORK, window)
    assert got == pytest.approx(simulated_ms * 1e-3, rel=0.05)


@pytest.mark.parametrize("chunk_kib,simulated_ms", [(128, 123.22), (1024, 124.75)])
def test_the_tcp_window_caps_each_message_of_a_ring_step(chunk_kib, simulated_ms):
    """Ring allreduce between two sites over a 10 gbps WAN of 5 ms, 64 MiB, no software
    cost, against its simulated times (simcheck.timed_allreduce, 128 KiB and 1 MiB chunks):
    a step's chunks in flight each get a TCP window over the round trip, so together they
    fill the link (one window for the whole step would make it nearly twice as slow)."""
    from horotopo.algorithms.ring import predict_time

    topo = from_dict(generate("sites:gpus=1,wan_gbps=10", 2))
    got = predict_time(topo, 64 * MiB, chunk_kib << 10, NO_COSTS, TCP_NETWORK)
    assert got == pytest.approx(simulated_ms * 1e-3, rel=0.08)


def _gated_fan(far_ms: float):
    """Rank p's NIC (10 gbps out, 100 gbps in) carries only the reduce flows to a far rank f
    of eight equal trees (n reduces to p, p to f; f broadcasts to n, n to p); every other
    link is ten or more times faster, so p's NIC out binds, and every flow on it waits out
    the same latency between its windows."""
    fast = 100.0
    topology = from_dict({
        "name": "gated-fan", "switches": ["s", "t"], "ranks": ["p", "n", "f"],
        "links": [{"ends": ["p", "s"], "gbps": [10.0, fast], "latency_ms": 0.002},
                  {"ends": ["n", "s"], "gbps": fast, "latency_ms": 0.002},
                  {"ends": ["f", "t"], "gbps": fast, "latency_ms": 0.002},
                  {"ends": ["s", "t"], "gbps": 1000.0, "latency_ms": far_ms}]})
    tree = (2, (2, 0, -1), (1, 2, -1))
    return topology, plan_from_trees(3, [tree + (1.0,)] * 8, chunk_bytes=128 << 10,
                                     topology=topology)


@pytest.mark.parametrize("size_mib,simulated_ms", [(64, 115.3), (256, 462.2)])
def test_flows_that_all_wait_together_leave_the_link_idle_for_the_latency(size_mib,
                                                                          simulated_ms):
    """Eight trees' reduce arcs over a 5 ms route, alone on their binding link, window 6,
    128 KiB chunks, no software cost, against the simulated times of this plan
    (simcheck.timed_allreduce): each cycle pushes the eight windows (5.4 ms at the link's
    rate), then waits 5 ms, so the link runs at about half its rate (one tree alone runs at
    its window's rate, 140 MB/s, well above its eighth of the link). The idle shares start
    near 1 here (0.88 of an arc's time at the first sharing's rates), where one pass from
    the last one's rates swings far past the rates they agree with (138, 18, then 123 MB/s a
    tree: 77.8 ms predicted at 64 MiB)."""
    topology, plan = _gated_fan(5.0)
    got = plan_time(topology, plan, size_mib * MiB, 128 << 10, NO_COSTS, TCP_NETWORK, 6)
    assert got == pytest.approx(simulated_ms * 1e-3, rel=0.10)
