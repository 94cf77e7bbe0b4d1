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
    in-flight chunks per round trip (one chunk's hop time per window put window 16 at
    180.9 ms)."""
    topo = from_dict(generate("sites:gpus=1,wan_gbps=10", 2))
    chain = (-1, 0)
    plan = plan_from_trees(2, [(0, chain, chain, 1.25e9)], chunk_bytes=128 << 10,
                           topology=topo)
    got = plan_time(topo, plan, 64 * MiB, 128 << 10, NO_COSTS, TCP_NETWORK, window)
    assert got == pytest.approx(simulated_ms * 1e-3, rel=0.05)
