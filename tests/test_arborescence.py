"""The Edmonds oracle against brute force and networkx."""
import itertools

import networkx as nx
import numpy as np
import pytest

from horotopo.packing.arborescence import (arborescence_cost, best_root_arborescence,
                                           min_in_arborescence, min_out_arborescence)
from horotopo.packing.model import validate_arborescence


def all_arborescences(n, root):
    others = [v for v in range(n) if v != root]
    for choice in itertools.product(range(n), repeat=n - 1):
        parent = [-1] * n
        for v, p in zip(others, choice):
            parent[v] = p
        if validate_arborescence(parent, root, n) is None:
            yield parent


def brute_min(cost, root, inward):
    return min(arborescence_cost(cost, np.array(p), inward)
               for p in all_arborescences(len(cost), root))


@pytest.mark.parametrize("seed", range(60))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    # integer costs make ties, which is where contraction bookkeeping goes wrong
    cost = rng.integers(0, 4, size=(n, n)).astype(float) if seed % 2 else rng.random((n, n))
    root = int(rng.integers(n))
    for fn, inward in ((min_out_arborescence, False), (min_in_arborescence, True)):
        parent, total = fn(cost, root)
        assert validate_arborescence(parent.tolist(), root, n) is None
        assert total == pytest.approx(arborescence_cost(cost, parent, inward))
        assert total == pytest.approx(brute_min(cost, root, inward))


@pytest.mark.parametrize("seed", range(30))
def test_best_root_prices_every_root_at_once(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 8))
    cost = rng.random((n, n))
    offsets = rng.normal(size=n)
    offsets[rng.integers(n)] = np.inf  # an excluded root
    for inward in (True, False):
        fn = min_in_arborescence if inward else min_out_arborescence
        each = [offsets[r] + fn(cost, r)[1] for r in range(n)]
        root, parent, tree_cost = best_root_arborescence(cost, offsets, inward)
        assert np.isfinite(offsets[root])
        assert offsets[root] + tree_cost == pytest.approx(min(each))
        assert validate_arborescence(parent.tolist(), root, n) is None


def test_matches_networkx_at_32_ranks():
    rng = np.random.default_rng(7)
    n = 32
    cost = rng.random((n, n))
    graph = nx.DiGraph()
    graph.add_weighted_edges_from((u, v, cost[u, v]) for u in range(n) for v in range(n)
                                  if u != v and v != 0)
    expected = nx.minimum_spanning_arborescence(graph).size(weight="weight")
    assert min_out_arborescence(cost, 0)[1] == pytest.approx(expected)


def test_unreachable_rank_is_an_error():
    cost = np.full((3, 3), np.inf)
    cost[0, 1] = 1.0
    with pytest.raises(ValueError, match="unreachable"):
        min_out_arborescence(cost, 0)
