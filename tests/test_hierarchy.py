"""The hierarchical planner: machines, the host model's loads, exact optima on tiny clusters,
plan invariants under the flat model, the flat bound, the setting, and an engine run."""
import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from horotopo import config, generate
from horotopo.engine import Engine
from horotopo.params import PlannerParams
from horotopo.packing import ArcModel, hierarchy, pack
from horotopo.packing.arborescence import best_root_arborescence
from horotopo.packing.hostforest import has_hosts
from horotopo.plan import make_plan
from horotopo.topology import from_dict
from horotopo.validate import validate

from loop_transport import run_ranks
from test_arborescence import all_arborescences

RACKS = "racks:hosts_per_rack=2,gpus=3,oversub=4,slow=0.25"


def _topo(spec, n):
    return from_dict(generate.generate(spec, n))


def test_machines_follow_host_switches_and_host_names():
    topo = _topo("racks:hosts_per_rack=2,gpus=4", 14)  # 3 hosts of 4, one of 2
    assert hierarchy.machines(topo) == (0,) * 4 + (1,) * 4 + (2,) * 4 + (3,) * 2
    # ranks on one host name share a machine; single-NIC hosts under a fast-uplink switch do not
    star = generate.uniform_star(4)
    assert hierarchy.machines(from_dict(star)) == (0, 1, 2, 3)
    star["ranks"] = ["h0", "h1", "h0", "h1"]
    assert hierarchy.machines(from_dict(star)) == (0, 1, 0, 1)
    measured = generate.random_measured(4, 0)
    measured["ranks"] = ["a", "a", "b", "b"]
    assert hierarchy.machines(from_dict(measured)) == (0, 0, 1, 1)


def test_past_the_auto_threshold_single_rank_hosts_are_grouped_by_rack():
    # one rank per host behind uplinks as fast as a NIC: flat planning is exact up to the
    # threshold, past it the racks are the machines (flat took 202 s at 1024 ranks)
    small = _topo("racks:hosts_per_rack=4,oversub=4,gpus=1", 64)
    assert hierarchy.machines(small) == tuple(range(64))
    assert not hierarchy.use_hierarchy(small, "auto")
    large = _topo("racks:hosts_per_rack=4,oversub=4,gpus=1", 68)
    assert hierarchy.machines(large) == tuple(np.repeat(np.arange(17), 4))
    assert hierarchy.use_hierarchy(large, "auto")
    assert hierarchy.machines(large, PlannerParams(hierarchy_auto_min_ranks=68)) == \
        tuple(range(68))
    assert make_plan(large, size=16 << 20).planner["machines"] == 17
    # and the racks get the host forest's shallow trees among the candidates
    assert has_hosts(large) and not has_hosts(small)


def _flat_load(topo, trees):
    model = ArcModel(topo)
    return sum(t.rate * model.load(t.root, t.reduce_parent, t.bcast_parent) for t in trees)


@pytest.mark.parametrize("spec,n", [(RACKS, 12), ("sites:gpus=2,hosts_per_rack=2", 12),
                                    ("fattree:hosts_per_leaf=2,spines=2,gpus=4", 15)])
def test_host_model_loads_are_the_expanded_trees_flat_loads(spec, n):
    topo = _topo(spec, n)
    model = hierarchy.HostModel(topo)
    rng = np.random.default_rng(0)
    for root in range(model.n):
        a = list(all_arborescences(model.n, root))
        pick = [a[int(k)] for k in rng.integers(0, len(a), size=2)]
        host = hierarchy.TreeRate(root, pick[0], pick[1], 1.0)
        expanded = model.expand([host])
        assert sum(t.rate for t in expanded) == pytest.approx(1.0)
        flat = _flat_load(topo, expanded)
        merged = np.zeros(len(model.capacity))
        np.add.at(merged, model.group_of[model.group_of >= 0], flat[model.group_of >= 0]
                  / model.group_size[model.group_of[model.group_of >= 0]])
        assert np.allclose(merged, model.load(root, pick[0], pick[1]))
        assert not flat[model.group_of < 0].any()  # dropped resources carry nothing


def _exact_lp(cols, kinds, roots, cap, n):
    a_eq = np.zeros((n, len(cols)))
    for k, (inward, r) in enumerate(zip(kinds, roots)):
        a_eq[r, k] = 1.0 if inward else -1.0
    scale = cap.max()
    res = linprog(-np.array(kinds, dtype=float), A_ub=np.column_stack(cols), b_ub=cap / scale,
                  A_eq=a_eq, b_eq=np.zeros(n), bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun * scale


def _exhaustive(model):
    """The hierarchical optimum over every host-level tree, loads from the model."""
    cols, kinds, roots = [], [], []
    for r in range(model.n):
        for parent in all_arborescences(model.n, r):
            for inward in (True, False):
                cols.append(model.half_load(parent, inward))
                kinds.append(inward)
                roots.append(r)
    return _exact_lp(cols, kinds, roots, model.capacity, model.n)


@pytest.mark.parametrize("hosts,gpus,oversub", [(2, 2, 1), (3, 2, 4), (3, 2, 1)])
def test_tiny_clusters_hierarchical_vs_flat_vs_exhaustive(hosts, gpus, oversub):
    topo = _topo(f"racks:hosts_per_rack=2,gpus={gpus},oversub={oversub},slow=0.34",
                 hosts * gpus)
    model = hierarchy.HostModel(topo)
    got = hierarchy.pack_hierarchical(topo)
    best_hier = _exhaustive(model)
    from test_packing import exact_optimum
    best_flat = exact_optimum(topo)
    assert got.throughput == pytest.approx(best_hier, rel=1e-6)
    assert best_hier <= best_flat * (1 + 1e-9)
    assert got.upper_bound >= best_hier * (1 - 1e-9)
    flat_bound = got.extra["flat_upper_bound_Bps"]
    assert flat_bound >= best_flat * (1 - 1e-9)
    assert pack(topo).throughput == pytest.approx(best_flat, rel=0.02)


@pytest.mark.parametrize("spec,n", [(RACKS, 23), ("sites:gpus=4,hosts_per_rack=2", 24)])
def test_hierarchical_plan_invariants(spec, n):
    topo = _topo(spec, n)
    plan = make_plan(topo, hierarchy="on")
    validate(plan, topo)  # step tables, arborescences, shares, and capacity in the flat model
    assert plan.planner["model"] == "hierarchical"
    assert plan.gap is not None and -1e-9 <= plan.gap <= 0.02
    assert plan.planner["flat_upper_bound_Bps"] >= plan.throughput_Bps * (1 - 1e-9)
    assert plan.throughput_Bps >= plan.ring_Bps * (1 - 1e-9)
    machine = np.array(hierarchy.machines(topo))
    for t in plan.trees:
        for parent, inward in ((t.reduce_parent, True), (t.bcast_parent, False)):
            arcs = [(v, p) if inward else (p, v) for v, p in enumerate(parent) if p >= 0]
            cross = [(a, b) for a, b in arcs if machine[a] != machine[b]]
            # one arc leaves (reduce) / enters (broadcast) each machine but the root's: its NIC
            # is crossed once per tree and direction
            ends = [machine[a] if inward else machine[b] for a, b in cross]
            assert sorted(ends) == sorted(set(range(machine.max() + 1)) - {machine[t.root]})
            # traffic between ranks of one machine stays on its local links
            for a, b in arcs:
                if machine[a] == machine[b]:
                    route = topo.routes.pair(a, b)
                    assert all(topo.resources[r].split("->")[0].rstrip("0123456789")
                               .endswith("g") or topo.resources[r].split("->")[1]
                               .rstrip("0123456789").endswith("g") for r in route), route
    # every local rank drives part of its machine's NIC traffic in the certified packing (its
    # channels); the plan may keep fewer of its trees (the fewest that carry as much)
    drivers = set()
    for t in hierarchy.pack_hierarchical(topo).trees:
        for parent, inward in ((t.reduce_parent, True), (t.bcast_parent, False)):
            drivers.update(v for child, p in enumerate(parent) if p >= 0
                           and machine[child] != machine[p] for v in (child, p))
    sizes = np.bincount(machine)
    assert len(drivers) == sum(min(s, sizes.max()) for s in sizes)


def test_flat_bound_tree_prices_are_lower_bounds_of_edmonds():
    topo = _topo(RACKS, 12)
    model = hierarchy.HostModel(topo)
    y = np.random.default_rng(3).random(len(topo.capacity_Bps))
    into, out_of = hierarchy._tree_prices(topo, model, y)
    w = ArcModel(topo).arc_costs(y)
    for r in range(topo.n):
        only = np.full(topo.n, np.inf)
        only[r] = 0.0
        assert best_root_arborescence(w, only, True)[2] >= into[r] - 1e-12
        assert best_root_arborescence(w, only, False)[2] >= out_of[r] - 1e-12


def test_a_seeded_pool_its_lp_certifies_skips_the_multiplicative_weights():
    # 64 machines of a fat tree: the aware ring's chains and the bottleneck seeds are optimal,
    # and the pool's first LP dual (with the filled-resource bound) certifies it at once
    packing = hierarchy.pack_hierarchical(_topo("fattree:hosts_per_leaf=8,spines=4,gpus=8", 512),
                                          target_gap=0.01)
    assert packing.iterations == 1
    assert packing.gap <= 0.005


def test_past_64_machines_the_packing_keeps_the_trees_of_a_few_roots():
    # 128 machines of a fat tree: the LP's optimum spreads the ring's chains over 64 roots
    # (512 rank-level trees, 128 machines deep); 16 roots give all but 1/H of that rate
    topo = _topo("fattree:hosts_per_leaf=8,spines=4,gpus=8", 1024)
    capped = hierarchy.pack_hierarchical(topo, params=PlannerParams(hierarchical_max_roots=2))
    machine = hierarchy.machines(topo)
    assert len({machine[t.root] for t in capped.trees}) <= 2
    assert len(capped.trees) <= 2 * 7 * 8
    assert capped.throughput >= 1.25e9 / 2 * (1 - 1e-9)  # the NICs' c / 2
    assert capped.gap <= 0.02 and capped.upper_bound >= capped.throughput


def test_setting_and_auto_rule():
    small, big = _topo(RACKS, 12), _topo(RACKS, 66)
    assert not hierarchy.use_hierarchy(small, "auto") and hierarchy.use_hierarchy(big, "auto")
    assert hierarchy.use_hierarchy(small, "on") and not hierarchy.use_hierarchy(big, "off")
    assert not hierarchy.use_hierarchy(big, "auto") or len(set(hierarchy.machines(big))) < 66
    with pytest.raises(config.ConfigError, match="HOROTOPO_HIERARCHY"):
        config.get("HOROTOPO_HIERARCHY", env={"HOROTOPO_HIERARCHY": "sometimes"})
    with pytest.raises(ValueError, match="auto, on or off"):
        hierarchy.use_hierarchy(small, "yes")
    assert make_plan(small, hierarchy="off").planner.get("model") is None


def test_one_machine_is_its_intra_host_stage():
    topo = _topo("racks:gpus=4", 4)
    plan = make_plan(topo, hierarchy="on")
    validate(plan, topo)
    # 4 channels of one star each: per tree 2 * 3 arcs each way, spread over the 4 local links,
    # so R = c * 4 / 6, which is also ring's optimum on a star
    assert plan.throughput_Bps == pytest.approx(100e9 / 8 * 4 / 6)
    assert plan.gap == pytest.approx(0.0, abs=1e-9)


def test_engine_runs_a_hierarchical_plan_exactly():
    topo = _topo(RACKS, 12)
    plan = make_plan(topo, hierarchy="on", chunk_bytes=1024)
    assert len(plan.trees) > 1

    def body(t):
        eng = Engine(t, plan)
        outs = []
        for count, dtype in itertools.product((1, 1000, 4099), (np.float32, np.int64)):
            x = ((np.arange(count) * (t.rank + 3)) % 17).astype(dtype)
            outs.append(eng.allreduce(x))
        return outs

    got = run_ranks(topo.n, body)
    for k, (count, dtype) in enumerate(itertools.product((1, 1000, 4099),
                                                         (np.float32, np.int64))):
        want = sum(((np.arange(count) * (r + 3)) % 17).astype(dtype) for r in range(topo.n))
        for rank in range(topo.n):
            assert np.array_equal(got[rank][k], want), (count, dtype, rank)


def test_the_packing_cpu_cap_grows_with_the_square_of_the_machines():
    """The packing's CPU cap is hierarchical_packing_cpu_s from 512 machines up and falls with
    the square of the machines below (0.5 s of the default 8 at 128 machines, 1024 ranks)."""
    params = PlannerParams()
    assert hierarchy.packing_cpu_cap(512, params) == params.hierarchical_packing_cpu_s
    assert hierarchy.packing_cpu_cap(1024, params) == params.hierarchical_packing_cpu_s
    assert hierarchy.packing_cpu_cap(128, params) == pytest.approx(
        params.hierarchical_packing_cpu_s / 16)
    assert hierarchy.packing_cpu_cap(128, PlannerParams(hierarchical_packing_cpu_s=2.0)) == \
        pytest.approx(0.125)


def test_the_intra_host_stage_is_a_chain_from_the_designated_rank():
    """In every channel the ranks of a machine form one chain from the channel's designated
    rank, the host-level arcs hanging off it: no rank takes more than one child from its own
    machine (a star would put all of them on the designated rank's local link)."""
    topo = from_dict(generate.generate("racks:hosts_per_rack=2,gpus=4,oversub=2", 16))
    model = hierarchy.HostModel(topo)
    host_tree = (-1, 0, 1, 1)
    trees = model.expand([hierarchy.TreeRate(0, host_tree, host_tree, 1.0)])
    assert len(trees) == 4
    for channel, tree in enumerate(trees):
        d = model.designated[channel]
        assert tree.root == d[0]
        for parent in (tree.reduce_parent, tree.bcast_parent):
            mine = model.machine_of
            local_children = np.bincount([p for v, p in enumerate(parent)
                                          if p >= 0 and mine[p] == mine[v]], minlength=16)
            assert local_children.max() == 1
            for v, p in enumerate(parent):
                if v in d:  # the designated ranks carry the host-level tree
                    h = mine[v]
                    assert p == (-1 if host_tree[h] < 0 else d[host_tree[h]])
                else:
                    assert p >= 0 and mine[p] == mine[v]
