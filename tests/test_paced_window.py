"""The automatic in-flight bound of the tree tables follows each tree's planned rate
(horotopo.schedule.paced_window), and an explicit window keeps the window's bound."""
import math

import numpy as np
import pytest

from horotopo.plan import make_plan, plan_from_trees
from horotopo.schedule import (DEFAULT_WINDOW, IN_FLIGHT_SLACK_S, compile_allreduce,
                               in_flight_for, paced_window, window_for)
from horotopo.topology import bundled, from_dict, load

CHUNK = 64 << 10


def test_a_slow_tree_keeps_only_what_its_rate_needs_in_flight():
    plan = make_plan(load(bundled("racks-2x3")))  # one tree at 31.25 MB/s over the 0.25 gbps link
    (tree,) = plan.trees
    need = math.ceil(tree.rate_Bps * IN_FLIGHT_SLACK_S / CHUNK)
    assert DEFAULT_WINDOW < need < window_for(CHUNK)
    for rank in range(plan.n):
        auto = compile_allreduce(plan, rank, 4 << 20, np.float32, CHUNK // 4)
        fixed = compile_allreduce(plan, rank, 4 << 20, np.float32, CHUNK // 4,
                                  window=window_for(CHUNK))
        (a,), (f,) = auto.trees, fixed.trees
        assert a.in_flight == in_flight_for(need, a.hops)
        assert f.in_flight == in_flight_for(window_for(CHUNK), f.hops)
        # the scratch window is the same either way: only what is in flight is paced
        assert auto.window == fixed.window and a.scratch_rows == f.scratch_rows


def test_latency_and_bounds():
    # latency adds the rate's worth of it; the result stays within [DEFAULT_WINDOW, window]
    assert paced_window(31.25e6, 0.0, CHUNK, 32) == 8
    assert paced_window(31.25e6, 0.016, CHUNK, 32) == 16
    assert paced_window(31.25e6, 1.0, CHUNK, 32) == 32
    assert paced_window(1.0, 0.0, CHUNK, 32) == DEFAULT_WINDOW
    assert paced_window(1.0, 0.0, CHUNK, 2) == 2
    assert paced_window(math.inf, 0.0, CHUNK, 32) == 32


def test_fast_trees_keep_the_whole_window():
    # a shared-memory rate covers the window many times over: nothing changes
    plan = plan_from_trees(3, [(0, (-1, 0, 1), (-1, 0, 0), 5e9)], chunk_bytes=CHUNK)
    t = compile_allreduce(plan, 1, 1 << 20, np.float32, CHUNK // 4)
    assert t.trees[0].in_flight == in_flight_for(window_for(CHUNK), t.trees[0].hops)


@pytest.mark.parametrize("latency_ms", [0.0, 5.0])
def test_the_critical_paths_latency_is_covered(latency_ms):
    doc = {"name": "pair", "switches": ["s"],
           "links": [{"ends": [h, "s"], "gbps": 0.25, "latency_ms": latency_ms}
                     for h in ("a", "b")], "ranks": ["a", "b"]}
    plan = make_plan(from_dict(doc))
    tree = plan.trees[0]
    latency = sum(lat * hops for lat, _, hops in tree.profile)
    assert latency == pytest.approx(4 * latency_ms * 1e-3)  # 2 hops each way, both paths
    t = compile_allreduce(plan, 0, 4 << 20, np.float32, plan.chunk_bytes // 4).trees[0]
    ahead = paced_window(tree.rate_Bps, latency, plan.tree_chunks()[0], window_for(
        plan.chunk_bytes))
    assert t.in_flight == in_flight_for(ahead, t.hops)
