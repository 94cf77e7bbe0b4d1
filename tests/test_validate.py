"""horotopo.validate: good plans pass, and every invariant fails on a plan or table built to
break it, with the invariant's name in the error."""
from dataclasses import replace

import pytest

from horotopo import generate
from horotopo.plan import Tree, make_plan, plan_from_trees, ring_plan
from horotopo.schedule import compile_allreduce, compile_broadcast
from horotopo.topology import bundled, from_dict, load
from horotopo.validate import INVARIANTS, InvariantError, check_tables, validate

N = 4


@pytest.fixture
def plan():
    # two trees over 4 ranks: a star into 0 with a chain broadcast, and a chain into 3
    return plan_from_trees(N, [(0, (-1, 0, 0, 0), (-1, 0, 1, 2), 2.0),
                               (3, (1, 2, 3, -1), (3, 3, 3, -1), 1.0)], chunk_bytes=64)


def _tree(plan, k, **fields):
    trees = list(plan.trees)
    trees[k] = replace(trees[k], **fields)
    return replace(plan, trees=tuple(trees))


def _fails(invariant, fn, *args, **kwargs):
    with pytest.raises(InvariantError, match=invariant) as info:
        fn(*args, **kwargs)
    assert info.value.invariant == invariant
    assert INVARIANTS[invariant] in str(info.value)
    return info.value


def _allreduce(plan, count=50, chunk=4):
    return [compile_allreduce(plan, v, count, "float32", chunk) for v in range(plan.n)]


def _broadcast(plan, root, count=50, chunk=4):
    return [compile_broadcast(plan, v, count, "float32", chunk, root) for v in range(plan.n)]


def _with_tree(tables, rank, k, **fields):
    """``tables`` with rank ``rank``'s table of tree index ``k`` (position) changed."""
    out = list(tables)
    trees = list(out[rank].trees)
    trees[k] = replace(trees[k], **fields)
    out[rank] = replace(out[rank], trees=tuple(trees))
    return out


def test_good_plans_pass_and_the_report_says_what_was_skipped(plan):
    report = validate(plan)
    assert set(report.checked) == set(INVARIANTS) - {"capacity"}
    assert [name for name, _ in report.skipped] == ["capacity"]
    assert "skipped  capacity" in report.describe()
    topology = load(bundled("racks-2x3"))
    for p in (make_plan(topology), ring_plan(topology)):
        assert set(validate(p, topology).checked) == set(INVARIANTS)
    # tables of every root and of the buffer sizes the engine meets pass too
    for root in range(N):
        for count in (1, 7, 4096):
            check_tables(plan, _broadcast(plan, root, count, 64))
    check_tables(plan, _allreduce(plan, 1, 64))


def test_broken_plans_name_the_invariant(plan):
    _fails("plan-shape", validate, replace(plan, trees=()))
    _fails("plan-shape", validate, replace(plan, chunk_bytes=0))
    _fails("reduce-arborescence", validate, _tree(plan, 0, reduce_parent=(-1, 2, 1, 0)))
    _fails("reduce-arborescence", validate, _tree(plan, 1, reduce_parent=(1, 2, 3)))
    _fails("broadcast-arborescence", validate, _tree(plan, 0, bcast_parent=(1, 0, 1, 2)))
    _fails("shares-sum-to-one", validate, _tree(plan, 0, share=0.9))
    _fails("shares-sum-to-one", validate, _tree(_tree(plan, 0, share=1.5), 1, share=-0.5))
    _fails("rates-positive", validate, _tree(plan, 1, rate_Bps=0.0))
    _fails("rates-positive", validate, _tree(plan, 1, rate_Bps=float("nan")))


def test_capacity_is_checked_against_the_topology():
    topology = from_dict(generate.racks([2, 2], uplink_gbps=0.3))
    plan = make_plan(topology)
    validate(plan, topology)
    fast = replace(plan, trees=tuple(replace(t, rate_Bps=t.rate_Bps * 1.01)
                                     for t in plan.trees))
    err = _fails("capacity", validate, fast, topology)
    assert "carries" in str(err)
    other = from_dict(generate.racks([2, 2], uplink_gbps=0.6))
    assert "topology digest" in str(_fails("capacity", validate, plan, other))
    _fails("capacity", validate, plan, from_dict(generate.racks([2, 3])))
    # a plan the topology cannot carry at all: every tree crosses the uplink both ways
    star = Tree(0, (-1, 0, 0, 0), (-1, 0, 0, 0), 1e12, 1.0)
    _fails("capacity", validate, replace(plan, trees=(star,)), topology)


def test_tables_of_another_collective_or_plan_are_inconsistent(plan):
    tables = _allreduce(plan)
    check_tables(plan, tables)
    _fails("tables-consistent", check_tables, plan, tables[:-1])
    _fails("tables-consistent", check_tables, plan, [tables[1]] + tables[1:])
    mixed = tables[:1] + _allreduce(plan, count=51)[1:]
    _fails("tables-consistent", check_tables, plan, mixed)
    other = _tree(plan, 0, reduce_parent=(-1, 0, 1, 0))
    _fails("tables-consistent", check_tables, plan, _allreduce(other))
    chunks = tables[2].trees[0].chunks
    _fails("tables-consistent", check_tables, plan,
           _with_tree(tables, 2, 0, chunks=chunks[:-1]))


def test_chunks_must_tile_the_buffer(plan):
    tables = _allreduce(plan)
    for cut in (lambda c: c[:-1], lambda c: c[:1] + c[2:], lambda c: ((c[0][0], c[0][1] + 1),)
                + c[1:]):
        broken = tables
        for v in range(N):
            broken = _with_tree(broken, v, 0, chunks=cut(tables[v].trees[0].chunks))
        _fails("segments-cover-buffer", check_tables, plan, broken)


def test_reduce_sends_each_chunk_up_once_and_reaches_the_root(plan):
    tables = _allreduce(plan)
    # tree 0 is the star into rank 0: rank 2 forgets to send up, or the root sends up
    _fails("reduce-sends-once", check_tables, plan, _with_tree(tables, 2, 0, send_parent=-1))
    _fails("reduce-sends-once", check_tables, plan, _with_tree(tables, 0, 0, send_parent=1))
    # a broadcast table that sends up
    bcast = _broadcast(plan, 1)
    _fails("reduce-sends-once", check_tables, plan, _with_tree(bcast, 2, 0, send_parent=0))
    # tree 1 is the chain 0 -> 1 -> 2 -> 3: ranks 1 and 2 send to each other instead, every
    # send matched by a receive, each rank sending once, and the chunk never reaches rank 3
    loop = _with_tree(tables, 1, 1, send_parent=2, recv_children=(0, 2))
    loop = _with_tree(loop, 2, 1, send_parent=1, recv_children=(1,))
    loop = _with_tree(loop, 3, 1, recv_children=())
    _fails("reduce-reaches-root", check_tables, plan, loop)


def test_broadcast_delivers_each_chunk_once_from_the_root(plan):
    for tables, root_rank in ((_allreduce(plan), 0), (_broadcast(plan, 2), 2)):
        k = 0
        victim = (root_rank + 1) % N
        _fails("broadcast-receives-once", check_tables, plan,
               _with_tree(tables, victim, k, recv_parent=-1))
        _fails("broadcast-receives-once", check_tables, plan,
               _with_tree(tables, root_rank, k, recv_parent=victim))
    # tree 0's broadcast chain 0 -> 1 -> 2 -> 3 turned into 0 -> 1 and a loop 2 <-> 3
    tables = _allreduce(plan)
    loop = _with_tree(tables, 1, 0, send_children=())
    loop = _with_tree(loop, 2, 0, recv_parent=3, send_children=(3,))
    loop = _with_tree(loop, 3, 0, recv_parent=2, send_children=(2,))
    _fails("broadcast-reaches-all", check_tables, plan, loop)


def test_every_send_has_a_receive(plan):
    tables = _allreduce(plan)
    # rank 0 stops receiving rank 3's part of tree 0: rank 3's send has no partner
    _fails("messages-match", check_tables, plan, _with_tree(tables, 0, 0, recv_children=(1, 2)))
    # rank 1 forwards tree 0's chunks to rank 3 as well, who does not expect them
    _fails("messages-match", check_tables, plan, _with_tree(tables, 1, 0, send_children=(2, 3)))
    # rank 3 expects tree 0's chunks from rank 1 while rank 2 still sends them: each rank
    # still receives once, from a tree out of the root, but both messages lack a partner
    _fails("messages-match", check_tables, plan, _with_tree(tables, 3, 0, recv_parent=1))
