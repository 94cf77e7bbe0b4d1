"""The tree engine starts the first chunks of every tree at once, and a rank's CPU posts
their messages before the pipelines run full (flows.trees_time)."""
import pytest

from horotopo.algorithms.flows import plan_time
from horotopo.algorithms.simcheck import pair
from horotopo.packing.alphabeta import SoftwareCosts
from horotopo.plan import plan_from_trees

MiB = 1 << 20
CHUNK = 64 << 10
WINDOW = 4
# one tree of two ranks, one hop each way: a tree keeps WINDOW + 2 * 2 + 2 = 10 chunks in
# flight, and the leaf starts them all, each a receive of the result and a send up; the
# root starts its window, a receive each
LEAF_POSTS_AHEAD = 2 * (10 - 1)


def _pair_plan():
    topology = pair(1.0, 0.0)  # 125 MB/s: the link paces the tree unless the CPU does
    tree = (-1, 0)
    return topology, plan_from_trees(2, [(0, tree, tree, 1.0)], chunk_bytes=CHUNK,
                                     topology=topology)


def test_the_posts_of_the_chunks_started_at_once_delay_a_run_the_network_paces():
    topology, plan = _pair_plan()
    m = 1e-4  # a chunk's two messages a rank: 13 ms of CPU against 0.5 s of link
    costs, free = SoftwareCosts(per_message_s=m), SoftwareCosts(per_message_s=0.0)
    extra = (plan_time(topology, plan, 64 * MiB, costs=costs, window=WINDOW)
             - plan_time(topology, plan, 64 * MiB, costs=free, window=WINDOW))
    # the first chunk's posts on its way up and down, and the leaf's posts started with it
    assert extra == pytest.approx((4 + LEAF_POSTS_AHEAD) * m, rel=1e-6)


def test_where_the_cpu_paces_the_run_the_posts_started_at_once_are_part_of_its_work():
    topology, plan = _pair_plan()
    m = 1e-3  # 2 s of CPU against 0.5 s of link
    chunks = 64 * MiB // CHUNK
    fill = 2 * (CHUNK / 125e6 + 2 * m)
    got = plan_time(topology, plan, 64 * MiB, costs=SoftwareCosts(per_message_s=m),
                    window=WINDOW)
    assert got == pytest.approx(fill + (chunks - 1) * 2 * m, rel=1e-6)
