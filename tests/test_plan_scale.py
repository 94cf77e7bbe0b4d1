"""The planner's array versions at scale against simple oracles: hops to the root, arborescence
validation, the plan's latency, and the depth-first ring over machines."""
import numpy as np
import pytest

from horotopo.generate import generate
from horotopo.packing.hierarchy import HostModel
from horotopo.packing.model import (aware_ring_order, hops_to_root, ring_order_nearest,
                                    ring_order_rate, validate_arborescence)
from horotopo.plan import PlanError, _plan_latency, depth
from horotopo.packing.model import TreeRate
from horotopo.topology import from_dict


def _walk_hops(parent):
    """Oracle: follow every rank's parents one by one."""
    out = []
    for v in range(len(parent)):
        k, u = 0, v
        while parent[u] >= 0:
            u, k = parent[u], k + 1
        out.append(k)
    return out


def _random_tree(rng, n):
    order = rng.permutation(n)
    parent = np.full(n, -1)
    for i in range(1, n):
        parent[order[i]] = order[i - 1] if rng.random() < 0.5 else order[rng.integers(0, i)]
    return parent.tolist(), int(order[0])


def test_hops_to_root_and_depth_match_the_walk():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 64, 300):
        for _ in range(5):
            parent, root = _random_tree(rng, n)
            assert hops_to_root(parent).tolist() == _walk_hops(parent)
            assert depth(parent) == max(_walk_hops(parent))
            assert validate_arborescence(parent, root, n) is None
    chain = list(range(1, 1000)) + [-1]  # the deepest tree: 999 hops
    assert depth(chain) == 999


def test_cycles_are_named_as_before():
    # 0 -> 1 -> 2 -> 1: rank 1 is the first cycle rank a walk from rank 0 meets
    parent = [1, 2, 1, -1]
    assert hops_to_root(parent) is None
    assert validate_arborescence(parent, 3, 4) == "rank 1 is on a cycle and never reaches " \
                                                  "the root 3"
    assert validate_arborescence([2, 1, -1], 2, 3) == "rank 1 is its own parent"
    assert validate_arborescence([5, 0, -1], 2, 3) == "rank 0 has parent 5, out of range 0..2"
    with pytest.raises(PlanError, match="cycle"):
        depth(parent)


def test_plan_latency_is_the_slowest_arc():
    topology = from_dict(generate("sites:gpus=2,wan_gbps=10", 16))
    rng = np.random.default_rng(1)
    trees = []
    for _ in range(4):
        a, root = _random_tree(rng, topology.n)
        trees.append(TreeRate(root, tuple(a), tuple(a), 1.0))
    lat = topology.latency_s
    want = max(max(lat[v][p], lat[p][v]) for t in trees for v, p in enumerate(t.reduce_parent)
               if p >= 0)
    assert _plan_latency(topology, trees) == want


def test_depth_first_ring_keeps_racks_together():
    # 4 racks of 4 hosts, a quarter of the NICs slow: nearest neighbour leaves slow hosts for
    # last and crosses their racks' uplinks again; the depth-first order crosses each once
    topology = from_dict(generate("racks:hosts_per_rack=4,gpus=2,oversub=4,slow=0.25", 32))
    model = HostModel(topology)
    order = model.ring_order()
    assert sorted(order) == list(range(model.n))
    rack = [h // 4 for h in order]  # the generator numbers hosts rack by rack
    assert sum(a != b for a, b in zip(rack, rack[1:] + rack[:1])) == 4
    nearest = ring_order_nearest(model.arc_costs(1.0 / model.capacity))
    assert ring_order_rate(model, order) >= ring_order_rate(model, nearest)
    best = aware_ring_order(model)
    assert ring_order_rate(model, best) == max(ring_order_rate(model, order),
                                               ring_order_rate(model, nearest))


def test_ring_order_rate_equals_the_chains_summed():
    topology = from_dict(generate("racks:hosts_per_rack=2,gpus=2,oversub=4,slow=0.5", 16))
    model = HostModel(topology)
    rng = np.random.default_rng(2)
    from horotopo.packing.model import ring_parents_in_order
    for _ in range(3):
        order = rng.permutation(model.n).tolist()
        load = np.sum([model.half_load(half, kind) for r in range(model.n)
                       for kind, half in zip((True, False), ring_parents_in_order(order, r))],
                      axis=0)
        assert ring_order_rate(model, order) == pytest.approx(model.n * model.max_rate(load),
                                                              rel=1e-12)


def test_plan_checks_all_trees_at_once_and_names_a_bad_one():
    from horotopo.plan import Plan, Tree, plan_from_trees
    rng = np.random.default_rng(4)
    trees = []
    for _ in range(5):
        a, root = _random_tree(rng, 40)
        trees.append((root, a, a, 1.0))
    plan = plan_from_trees(40, trees)
    assert [t.depth for t in plan.trees] == [2 * max(_walk_hops(a)) for _, a, _, _ in trees]
    root, a, _, _ = trees[3]
    bad = list(a)
    u = next(v for v in range(40) if v != root and bad[v] != root)
    bad[bad[u]] = u  # u and its parent send to each other: a cycle
    doc = plan.to_json()
    doc["trees"][3]["bcast_parent"] = bad
    doc.pop("digest")
    with pytest.raises(PlanError, match=r"trees\[3\]\.bcast_parent: rank \d+ is on a cycle"):
        Plan.from_json(doc)


def test_cut_bound_is_the_slow_nic_and_checked():
    from horotopo.packing import hierarchy
    from horotopo.packing.certificate import CertificateError
    topology = from_dict(generate("racks:hosts_per_rack=4,gpus=2,oversub=4,slow=0.25", 32))
    model = HostModel(topology)
    y = model.cut_lengths()
    slow = 0.25 * 10e9 / 8  # the slow NICs' rate, bytes/s
    assert np.count_nonzero(y) == 2 and np.allclose(1.0 / y[y > 0], slow)
    host = hierarchy.pack(topology, model=model, gk_iterations=1, max_rounds=0)
    got = hierarchy.cut_bound(topology, model, host)
    # every tree pair crosses a slow NIC once each way: the bound is that NIC's rate
    assert got.upper_bound == pytest.approx(slow, rel=1e-12)
    assert got.upper_bound >= got.throughput
    real = hierarchy.price
    wrong = lambda *a, **k: [(cost * 4, h) for cost, h in real(*a, **k)]
    import unittest.mock
    with unittest.mock.patch.object(hierarchy, "price", wrong):
        with pytest.raises(CertificateError, match="slowest machine's cut"):
            hierarchy.cut_bound(topology, model, host)
