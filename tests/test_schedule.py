"""horotopo.schedule: the step tables the tree algorithms walk, checked by hand on small plans."""
import json

import numpy as np
import pytest

from horotopo.plan import children, depth, plan_from_trees
from horotopo.schedule import (RECV_CHILD, RECV_PARENT, SEND_CHILD, SEND_PARENT, Schedule,
                               ScheduleCache, compile_allreduce, compile_broadcast, rerooted,
                               window_for)

from plan_checks import checked


@pytest.fixture
def plan():
    # tree 0: reduce chain 2 -> 1 -> 0, broadcast star from 0; tree 1: star into 2, chain out
    return checked(plan_from_trees(3, [(0, (-1, 0, 1), (-1, 0, 0), 3.0),
                                       (2, (2, 2, -1), (1, 2, -1), 1.0)], chunk_bytes=16))


def test_children_and_depth_are_the_one_copy_the_tables_use():
    assert children((-1, 0, 1, 0)) == ((1, 3), (2,), (), ())
    assert depth((-1, 0, 1, 0)) == 2
    assert depth((-1,)) == 0


def test_allreduce_table_by_hand(plan):
    t = compile_allreduce(plan, 1, 100, np.float32, 10, window=2)
    assert (t.kind, t.count, t.dtype, t.chunk_elems, t.window, t.root, t.tags) == \
        ("allreduce", 100, "float32", 10, 2, -1, 4)
    a, b = t.trees  # shares 3/4 and 1/4: segments [0, 75) and [75, 100)
    assert (a.tree, a.root, a.recv_children, a.send_parent, a.recv_parent, a.send_children) == \
        (0, 0, (2,), 0, 0, ())
    assert a.chunks == tuple((s, min(s + 10, 75)) for s in range(0, 75, 10))
    assert (a.hops, a.in_flight, a.stream_up, a.stream_down) == (3, 2 + 2 * 3 + 2, 0, 1)
    assert (a.scratch_offset, a.scratch_rows, a.scratch_width) == (0, 2, 10)
    assert (b.tree, b.root, b.recv_children, b.send_parent, b.recv_parent, b.send_children) == \
        (1, 2, (), 2, 2, (0,))
    assert b.chunks == ((75, 85), (85, 95), (95, 100))
    assert (b.scratch_rows, t.scratch_elems) == (0, 20)
    rows = list(t.rows())
    assert len(rows) == 8 * 3 + 3 * 3  # three messages per chunk in each tree at rank 1
    first = [(s.direction, s.peer, s.start, s.length, s.reduce) for s in a.steps(0)]
    assert first == [(RECV_CHILD, 2, 0, 10, True), (SEND_PARENT, 0, 0, 10, False),
                     (RECV_PARENT, 0, 0, 10, False)]
    last = [(s.direction, s.peer, s.start, s.length) for s in b.steps(2)]
    assert last == [(SEND_PARENT, 2, 95, 5), (RECV_PARENT, 2, 95, 5), (SEND_CHILD, 0, 95, 5)]
    # the root of tree 0 reduces its child's chunks and sends them down
    root = compile_allreduce(plan, 0, 100, "float32", 10, window=2).trees[0]
    assert (root.recv_children, root.send_parent, root.recv_parent, root.send_children) == \
        ((1,), -1, -1, (1, 2))


def test_window_defaults_to_the_chunk_size():
    plan = plan_from_trees(2, [(0, (-1, 0), (-1, 0), 1.0)])
    assert compile_allreduce(plan, 0, 10, np.float64, 8192).window == window_for(8192 * 8)
    assert compile_allreduce(plan, 0, 10, np.float16, 8).window == window_for(16)
    with pytest.raises(ValueError, match="window"):
        compile_allreduce(plan, 0, 10, np.float32, 8, window=0)
    with pytest.raises(ValueError, match="rank"):
        compile_allreduce(plan, 2, 10, np.float32, 8)
    with pytest.raises(ValueError, match="chunk_elems"):
        compile_allreduce(plan, 0, 10, np.float32, 0)


def test_broadcast_reroots_each_tree_at_the_broadcast_root(plan):
    assert rerooted((-1, 0, 0), 0, 2) == (2, 0, -1)
    assert rerooted((-1, 0, 1), 0, 1) == (1, -1, 1)
    assert rerooted((1, 2, -1), 2, 2) == (1, 2, -1)
    # root 1: tree 0 (star from 0) becomes 1 -> 0 -> 2; tree 1 (2 -> 1 -> 0) becomes 1 -> 2
    # and 1 -> 0, since nobody sends back to 1
    tables = [compile_broadcast(plan, v, 100, "float32", 10, root=1) for v in range(3)]
    peers = [[(t.tree, t.recv_parent, t.send_children) for t in tab.trees] for tab in tables]
    assert peers[1] == [(0, -1, (0,)), (1, -1, (0, 2))]
    assert peers[0] == [(0, 1, (2,)), (1, 1, ())]
    assert peers[2] == [(0, 0, ()), (1, 1, ())]
    for tab in tables:
        assert tab.kind == "broadcast" and tab.root == 1 and tab.tags == 2
        assert all(t.recv_children == () and t.send_parent == -1 for t in tab.trees)
        assert {s.direction for s in tab.rows()} <= {RECV_PARENT, SEND_CHILD}
    assert [t.hops for t in tables[0].trees] == [2, 1]


def test_a_single_chunk_broadcast_takes_the_largest_share():
    plan = plan_from_trees(3, [(0, (-1, 0, 0), (-1, 0, 0), 1.0), (1, (1, -1, 1), (1, -1, 1), 2.0),
                               (2, (2, 2, -1), (2, 2, -1), 2.0)])
    tab = compile_broadcast(plan, 0, 10, "float32", 10, root=0)
    assert [t.tree for t in tab.trees] == [1] and tab.trees[0].chunks == ((0, 10),)
    assert [t.tree for t in compile_broadcast(plan, 0, 11, "float32", 10, 0).trees] == [0, 1, 2]
    with pytest.raises(ValueError, match="root"):
        compile_broadcast(plan, 0, 10, "float32", 10, root=3)


def test_empty_segments_have_no_table():
    # the last segment ends at the buffer's end, so the tiny share goes first
    plan = plan_from_trees(2, [(1, (1, -1), (1, -1), 1e-9), (0, (-1, 0), (-1, 0), 1.0)])
    tab = compile_allreduce(plan, 0, 5, "float32", 2)
    assert [t.tree for t in tab.trees] == [1] and tab.tags == 4
    assert compile_allreduce(plan, 0, 0, "float32", 2).trees == ()


def test_json_round_trip_and_describe(plan):
    for tab in (compile_allreduce(plan, 1, 100, "float32", 10),
                compile_broadcast(plan, 2, 100, "int64", 7, root=0)):
        again = Schedule.from_json(json.loads(json.dumps(tab.to_json())))
        assert again == tab
        assert list(again.rows()) == list(tab.rows())
    text = compile_allreduce(plan, 1, 100, "float32", 10).describe(max_chunks=1)
    assert "rank 1/3: allreduce of 100 x float32" in text
    assert "recv_child  peer 2    [0, +10) reduce" in text
    assert "recv_parent peer 0    [0, +10) copy" in text
    assert "7 more chunks, same peers" in text
    assert "broadcast from rank 0" in compile_broadcast(plan, 2, 9, "int64", 7, 0).describe()
    doc = compile_allreduce(plan, 1, 100, "float32", 10).to_json()
    doc["version"] = 99
    with pytest.raises(ValueError, match="version"):
        Schedule.from_json(doc)


def test_the_cache_compiles_each_shape_once_and_forgets_the_oldest(plan):
    cache = ScheduleCache(plan, 1, capacity=2)
    a = cache.allreduce(100, np.float32, 10)
    assert cache.allreduce(100, np.float32, 10) is a and cache.compiled == 1
    b = cache.broadcast(100, np.float32, 10, 2)
    assert cache.broadcast(100, np.float32, 10, 2) is b and cache.compiled == 2
    assert cache.allreduce(100, np.float32, 10) is a  # a is now the most recent
    cache.allreduce(200, np.float32, 10)  # evicts b
    assert len(cache) == 2 and cache.compiled == 3
    assert cache.allreduce(100, np.float32, 10) is a
    assert cache.broadcast(100, np.float32, 10, 2) == b and cache.compiled == 4
    assert cache.allreduce(100, np.float32, 10) != cache.allreduce(100, np.float32, 20)
    with pytest.raises(ValueError, match="capacity"):
        ScheduleCache(plan, 0, capacity=0)
