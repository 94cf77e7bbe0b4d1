"""NCCL's double binary tree (horotopo.algorithms.dbtree): the trees NCCL's trees.cc draws, the
complementary property, and the plan the tree runner interprets. (Its allreduce results are in
the engine grid of tests/test_simulated.py.)"""
import pytest

from horotopo.algorithms.dbtree import btree, double_binary_tree, double_tree_plan


def children(parent):
    kids = {v: [] for v in range(len(parent))}
    for v, p in enumerate(parent):
        if p >= 0:
            kids[p].append(v)
    return kids


def test_the_first_tree_is_ncclGetBtree_as_drawn_in_trees_cc():
    # 0 -> 8; 8 -> 4, 12; 4 -> 2, 6; 12 -> 10, 13; 2 -> 1, 3; 6 -> 5, 7; 10 -> 9, 11
    got = {v: btree(14, v) for v in range(14)}
    assert got[0] == (-1, [8])
    assert got[8] == (0, [4, 12]) and got[12] == (8, [10, 13]) and got[13] == (12, [])
    assert got[4] == (8, [2, 6]) and got[10] == (12, [9, 11])
    assert all(got[v][1] == [] for v in range(1, 14, 2))


def test_the_second_tree_mirrors_for_even_and_shifts_for_odd_rank_counts():
    (r0, first), (r1, second) = double_binary_tree(12)
    assert (r0, r1) == (0, 11)
    assert children(second)[11] == [3] and sorted(children(second)[3]) == [1, 7]
    assert all(second[11 - v] == (-1 if first[v] < 0 else 11 - first[v]) for v in range(12))
    (r0, first), (r1, second) = double_binary_tree(13)
    assert (r0, r1) == (0, 1)
    assert children(second)[1] == [9] and sorted(children(second)[9]) == [0, 5]


@pytest.mark.parametrize("n", [2, 4, 6, 8, 16, 64])
def test_with_an_even_count_no_rank_is_an_inner_node_of_both_trees(n):
    (_, first), (_, second) = double_binary_tree(n)
    inner = [set(v for v, kids in children(t).items() if kids) for t in (first, second)]
    assert not inner[0] & inner[1]
    # binary: at most two children, and the trees are spanning (validated by the plan)
    assert max(len(k) for t in (first, second) for k in children(t).values()) <= 2


@pytest.mark.parametrize("n", [2, 3, 5, 13, 100])
def test_the_plan_has_the_two_trees_at_half_the_buffer_each(n):
    plan = double_tree_plan(n)
    assert [t.share for t in plan.trees] == [0.5, 0.5]
    assert all(t.reduce_parent == t.bcast_parent for t in plan.trees)
    with pytest.raises(ValueError):
        btree(n, n)
