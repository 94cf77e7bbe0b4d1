"""Fair sharing of links among concurrent trees (horotopo/packing/sharing.py) and the plan's
shares that follow from it.

The oracle is independent of the module: exact progressive filling in rational arithmetic over
a usage matrix counted arc by arc from the topology's routes, and the defining property of a
max-min fair allocation (Bertsekas and Gallager, Data Networks, 6.5.2): every tree has a full
resource on which no tree has a higher rate.
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from horotopo.generate import random_declared, random_measured
from horotopo.packing.model import ring_parents
from horotopo.packing.model import TreeRate
from horotopo.packing.sharing import fair_rates, fair_subset, fewest_trees, tree_usage
from horotopo.plan import Plan, PlanError, make_plan, ring_plan
from horotopo.topology import bundled, from_dict, load

MB = 1e6
RD4 = random_declared(4, 12, gbps_range=(0.2, 1.0))
# the four trees the certified packing of RD4 gives at 16 MiB (LP rates 4.0, 6.375, 4.875 and
# 16.375 MB/s), written out so that the test does not depend on which LP vertex HiGHS returns
RD4_TREES = [(2, (1, 2, -1, 0), (3, 0, -1, 2)), (2, (1, 2, -1, 0), (1, 2, -1, 0)),
             (2, (3, 0, -1, 2), (1, 2, -1, 0)), (3, (3, 2, 0, -1), (3, 2, 0, -1))]


def usage_by_hand(topo, trees):
    """U[t][l] counted arc by arc over ``topo.routes`` (reduce child->parent, broadcast
    parent->child)."""
    out = []
    for _, up, down in trees:
        row = [0] * len(topo.capacity_Bps)
        for v in range(topo.n):
            if up[v] >= 0:
                for r in topo.routes[v][up[v]]:
                    row[r] += 1
            if down[v] >= 0:
                for r in topo.routes[down[v]][v]:
                    row[r] += 1
        out.append(row)
    return out


def filling_exact(cap, usage):
    """Progressive filling in exact rationals, one tree-freezing event at a time."""
    cap = [Fraction(c) for c in cap]
    k = len(usage)
    rate = [Fraction(0)] * k
    active = [any(row) for row in usage]
    while any(active):
        used = [sum(rate[t] * usage[t][l] for t in range(k)) for l in range(len(cap))]
        load = [sum(usage[t][l] for t in range(k) if active[t]) for l in range(len(cap))]
        step = min((cap[l] - used[l]) / load[l] for l in range(len(cap)) if load[l])
        rate = [r + step if a else r for r, a in zip(rate, active)]
        full = [load[l] and used[l] + step * load[l] == cap[l] for l in range(len(cap))]
        active = [a and not any(usage[t][l] and full[l] for l in range(len(cap)))
                  for t, a in enumerate(active)]
    return rate


def assert_max_min_fair(cap, usage, rate):
    """Feasible, and every tree has a bottleneck: a full resource it crosses on which its rate
    is the highest of the trees crossing it."""
    usage, rate, cap = np.asarray(usage, float), np.asarray(rate, float), np.asarray(cap, float)
    load = rate @ usage
    assert (load <= cap * (1 + 1e-9)).all()
    full = load >= cap * (1 - 1e-9)
    for t in range(len(rate)):
        on = full & (usage[t] > 0)
        assert on.any(), f"tree {t} crosses no full resource"
        assert any(rate[t] >= rate[usage[:, l] > 0].max() * (1 - 1e-9)
                   for l in np.flatnonzero(on)), f"tree {t} has no bottleneck"


def random_trees(rng, n, k):
    """k random (root, reduce_parent, bcast_parent) over n ranks: each rank but the root hangs
    from a rank placed before it in a random order (so every tree is an arborescence)."""
    out = []
    for _ in range(k):
        root = int(rng.integers(n))
        halves = []
        for _ in range(2):
            order = [root] + [v for v in rng.permutation(n).tolist() if v != root]
            parent = [-1] * n
            for i, v in enumerate(order[1:], 1):
                parent[v] = order[int(rng.integers(i))]
            halves.append(tuple(parent))
        out.append((root, *halves))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_fair_rates_match_exact_filling_and_are_max_min_fair(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    doc = random_declared(n, seed) if seed % 3 else random_measured(n, seed)
    topo = from_dict(doc)
    trees = random_trees(rng, n, int(rng.integers(1, 6)))
    usage = usage_by_hand(topo, trees)
    got = fair_rates(topo, trees)
    want = filling_exact(topo.capacity_Bps, usage)
    assert got == pytest.approx([float(x) for x in want], rel=1e-9)
    assert (tree_usage(topo, trees).toarray() == np.asarray(usage)).all()
    assert_max_min_fair(topo.capacity_Bps, usage, got)


def test_rd4_trees_share_equally_under_max_min_fairness():
    topo = from_dict(RD4)
    rates = fair_rates(topo, RD4_TREES)
    assert rates / MB == pytest.approx([7.125] * 4, rel=1e-12)
    keep, kept_rates, record = fair_subset(topo, RD4_TREES)
    # the best subset, by trying all 15 (the exhaustive search does): trees 1 and 3 alone
    # reach 28.583 MB/s against 28.5 for all four
    best = max((sum(fair_rates(topo, [RD4_TREES[i] for i in sub])), sub)
               for size in range(1, 5) for sub in itertools.combinations(range(4), size))
    assert tuple(keep) == best[1] and kept_rates.sum() == pytest.approx(best[0], rel=1e-12)
    assert record["fair_Bps"] / MB == pytest.approx(28.583333, rel=1e-6)
    assert record["all_fair_Bps"] / MB == pytest.approx(28.5, rel=1e-12)


@pytest.mark.parametrize("count", [9, 40])  # every removal tried; the candidates only
def test_greedy_subset_never_lowers_the_fair_sum(count):
    rng = np.random.default_rng(5)
    topo = from_dict(random_declared(8, 3))
    trees = random_trees(rng, 8, count)  # above the exhaustive search's size
    keep, rates, record = fair_subset(topo, trees)
    assert record["method"] == "greedy"
    assert rates.sum() > fair_rates(topo, trees).sum()  # random trees: some are bad ones
    assert rates == pytest.approx(fair_rates(topo, [trees[i] for i in keep]), rel=1e-12)
    # no single removal from what was kept raises the sum further (for the full search)
    if count <= 32:
        assert all(fair_rates(topo, [trees[j] for j in keep if j != i]).sum()
                   <= rates.sum() * (1 + 1e-9) for i in keep)


def test_a_tie_keeps_the_fewest_trees():
    """racks-2x3: two trees that each cross the 0.25 gbps uplink once per direction share it
    at 15.625 MB/s each, what either reaches alone (31.25): one tree is kept."""
    topo = load(bundled("racks-2x3"))
    trees = [(2, (2, 3, -1, 5, 2, 2), (2, 5, -1, 5, 2, 4)),
             (4, (2, 3, 4, 5, -1, 4), (4, 3, 4, 4, -1, 3))]
    assert fair_rates(topo, trees) / MB == pytest.approx([15.625, 15.625], rel=1e-12)
    keep, rates, _ = fair_subset(topo, trees)
    assert len(keep) == 1 and rates / MB == pytest.approx([31.25], rel=1e-12)


def test_fewest_trees_of_a_tie_carry_what_both_do():
    """The racks-2x3 pair above: either tree alone carries the 31.25 MB/s both share."""
    topo = load(bundled("racks-2x3"))
    trees = [TreeRate(2, (2, 3, -1, 5, 2, 2), (2, 5, -1, 5, 2, 4), 2e6),
             TreeRate(4, (2, 3, 4, 5, -1, 4), (4, 3, 4, 4, -1, 3), 1e6)]
    (kept,) = fewest_trees(topo, trees)
    assert kept.root == 2 and kept.rate / MB == pytest.approx(31.25, rel=1e-12)
    assert fewest_trees(topo, trees[:1]) is None


@pytest.mark.parametrize("seed", range(8))
def test_fewest_trees_is_the_first_prefix_that_carries_the_whole(seed):
    """Against every prefix of 1, 2, 4... trees in order of packed rate: the first whose fair
    rates sum to the whole set's, or None where only the whole set does."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    topo = from_dict(random_declared(n, seed))
    trees = [TreeRate(*t, float(rng.integers(1, 4))) for t in
             random_trees(rng, n, int(rng.integers(2, 9)))]
    whole = fair_rates(topo, trees).sum()
    ranked = [trees[i] for i in np.argsort([-t.rate for t in trees], kind="stable")]
    sizes = [k for k in (1, 2, 4, 8) if k < len(trees)]
    carries = [fair_rates(topo, ranked[:k]).sum() >= whole * (1 - 1e-9) for k in sizes]
    got = fewest_trees(topo, trees)
    if not any(carries):
        assert got is None
    else:
        k = sizes[carries.index(True)]
        assert got is not None and list(got) == [
            TreeRate(t.root, t.reduce_parent, t.bcast_parent, float(r))
            for t, r in zip(ranked[:k], fair_rates(topo, ranked[:k]))]


def test_single_tree_one_rank_and_one_host():
    topo = from_dict(RD4)
    (rate,) = fair_rates(topo, RD4_TREES[3:])
    # alone, a tree runs at its bottleneck's capacity over its flows there
    usage = np.asarray(usage_by_hand(topo, RD4_TREES[3:])[0], float)
    cap = np.asarray(topo.capacity_Bps)
    assert rate == pytest.approx((cap[usage > 0] / usage[usage > 0]).min(), rel=1e-12)
    one = from_dict({"name": "one", "switches": ["s"], "links": [
        {"ends": ["a", "s"], "gbps": 1.0}], "ranks": ["a"]})
    assert np.isinf(fair_rates(one, [(0, (-1,), (-1,))])).all()
    shared = from_dict({"name": "shm", "switches": ["s"], "links": [
        {"ends": ["a", "s"], "gbps": 1.0}, {"ends": ["b", "s"], "gbps": 1.0}],
        "ranks": ["a", "a", "a"]})
    chains = [(r, *ring_parents(3, r)) for r in range(3)]
    assert np.isinf(fair_rates(shared, chains)).all()
    for topo_ in (one, shared):
        plan = make_plan(topo_, size=1 << 20)
        assert abs(sum(t.share for t in plan.trees) - 1) < 1e-12


def test_bad_trees_are_refused():
    topo = from_dict(RD4)
    with pytest.raises(ValueError, match="two parent arrays of 4"):
        fair_rates(topo, [(0, (-1, 0, 0), (-1, 0, 0, 0))])
    with pytest.raises(ValueError, match="at least one tree"):
        fair_subset(topo, [])


def test_rd4_plan_shares_follow_the_fair_rates():
    """The old plan split 16 MiB 0.126/0.202/0.154/0.518 by the LP's rates; under fair
    sharing its big tree finished last (686.5 ms simulated against 539.6 predicted)."""
    plan = make_plan(from_dict(RD4), size=16 << 20, forest="deep")
    rates = np.array([t.rate_Bps for t in plan.trees])
    shares = np.array([t.share for t in plan.trees])
    assert shares == pytest.approx(rates / rates.sum(), rel=1e-12)
    assert plan.throughput_Bps == pytest.approx(rates.sum(), rel=1e-12)
    assert plan.throughput_Bps / MB == pytest.approx(28.583333, rel=1e-6)
    assert plan.packed_Bps / MB == pytest.approx(31.625, rel=1e-9)
    assert plan.planner["sharing"]["all_fair_Bps"] / MB == pytest.approx(28.5, rel=1e-9)
    # every tree finishes together: share / rate is the same for all
    assert shares / rates == pytest.approx(np.full(len(rates), 1 / rates.sum()), rel=1e-9)
    # the certificate still bounds the LP packing: fair <= packed <= bound, gap of the packing
    assert plan.throughput_Bps <= plan.packed_Bps <= plan.upper_bound_Bps * (1 + 1e-9)
    assert plan.gap == pytest.approx(1 - plan.packed_Bps / plan.upper_bound_Bps, abs=1e-15)
    text = plan.describe()
    assert "max-min fair rates of 2 of 4 trees" in text and "of the LP packing" in text
    again = Plan.from_json(plan.to_json())
    assert again.packed_Bps == plan.packed_Bps and again.gap == plan.gap


def test_a_bound_below_the_packing_is_refused_on_load():
    doc = make_plan(from_dict(RD4), size=16 << 20).to_json()
    # above the fair sum but below the LP packing's rate: the certificate is wrong
    doc["upper_bound_Bps"] = 30e6
    doc.pop("digest")
    with pytest.raises(PlanError, match="below the packing's rate"):
        Plan.from_json(doc)
    doc["planner"]["packed_Bps"] = "x"
    with pytest.raises(PlanError, match="packed_Bps"):
        Plan.from_json(doc)


def test_ring_plans_keep_equal_rates():
    topo = from_dict(RD4)
    plan = ring_plan(topo, size=16 << 20)
    assert len(plan.trees) == 4
    assert len({t.rate_Bps for t in plan.trees}) == 1 and len({t.share for t in plan.trees}) <= 2
    assert plan.throughput_Bps == plan.packed_Bps


def test_cli_verdict_names_the_packing_and_the_fair_rate(tmp_path, capsys):
    import json

    from horotopo.cli import main

    path = tmp_path / "rd4.json"
    path.write_text(json.dumps(RD4))
    assert main(["plan", str(path), "--size", "16M", "-q"]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert "the LP packing certified within 0.00% of optimal" in verdict
    assert "fair-shared rate 9.62% below the bound" in verdict


def test_the_subset_search_over_loaded_resources_matches_every_resource():
    """fair_subset fills over the resources its trees load only; on a measured topology (a
    resource per ordered pair, most of which a few chains leave unloaded) the kept trees' rates
    are their fair rates over every resource."""
    topo = from_dict(random_measured(12, 3, shared=2))
    chains = [(r, tuple(-1 if v == r else (v + 1) % 12 for v in range(12)),
               tuple(-1 if v == r else (v - 1) % 12 for v in range(12))) for r in (0, 5)]
    trees = chains + random_trees(np.random.default_rng(2), 12, 10)
    loaded = tree_usage(topo, trees).sum(axis=0).A.ravel() > 0
    assert 0 < loaded.sum() < len(topo.capacity_Bps)  # some resources stay unloaded
    keep, rates, _ = fair_subset(topo, trees)
    assert rates == pytest.approx(fair_rates(topo, [trees[i] for i in keep]), rel=1e-12)
