"""The leveled forest: few trees where a measured network's rates differ only by noise."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horotopo.packing.alphabeta import describe_choice
from horotopo.packing.depth import check_forest
from horotopo.packing.leveled import LEVEL_RATIO, LEVEL_TOLERANCE, level_capacities, leveled
from horotopo.packing.model import ArcModel
from horotopo.plan import make_plan
from horotopo.topology import bundled, from_dict, load

MiB = 1 << 20

#: What ``python -m horotopo probe --quick`` measured on the emulated uniform-4 star (four
#: ranks, 0.4 gbps links; benchmarks/probe_accuracy.py uniform-4 --quick): the
#: pairs within 1% of each other, the NICs' fan-out and fan-in up to 7% apart.
PROBED_UNIFORM_STAR = {
    "name": "probed-4", "ranks": ["u0", "u1", "u2", "u3"],
    "bandwidth_gbps": [[None, 0.397964, 0.398235, 0.402815],
                       [0.398526, None, 0.400471, 0.398258],
                       [0.400993, 0.397602, None, 0.398366],
                       [0.39988, 0.400391, 0.397652, None]],
    "egress_gbps": [0.411181, 0.401083, 0.407119, 0.423616],
    "ingress_gbps": [0.421198, 0.416521, 0.40139, 0.427955]}


def _fewest_levels(caps, ratio):
    """Brute force: the fewest capacities whose ``[c, c * ratio]`` intervals cover them all."""
    for k in range(1, len(caps) + 1):
        for starts in itertools.combinations(sorted(set(caps)), k):
            if all(any(s <= c <= s * ratio for s in starts) for c in caps):
                return k
    return 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=6),
       st.sampled_from([1.05, LEVEL_RATIO, 1.5]))
def test_levels_are_narrow_never_raise_and_are_as_few_as_possible(caps, ratio):
    out = level_capacities(caps, ratio)
    assert len(out) == len(caps)
    for c, v in zip(caps, out):
        assert v <= c <= v * ratio  # never raised, never more than the ratio below
        assert v in caps
    assert level_capacities(out, ratio) == out
    assert len(set(out)) == _fewest_levels(caps, ratio)


def test_bad_levels_are_refused():
    with pytest.raises(ValueError, match="above 1"):
        level_capacities([1.0], 1.0)
    with pytest.raises(ValueError, match="positive"):
        level_capacities([1.0, 0.0])
    assert level_capacities([]) == ()
    assert level_capacities([np.inf, 2.0]) == (np.inf, 2.0)


def _declared_rate(plan, declared):
    """The plan's trees, at their shares, at the most the declared network allows."""
    model = ArcModel(declared)
    load = sum(t.share * model.load(t.root, t.reduce_parent, t.bcast_parent)
               for t in plan.trees)
    return model.max_rate(np.asarray(load, dtype=float))


def test_a_noisy_probe_of_a_uniform_star_plans_the_stars_two_trees():
    """uniform-4: the certified packing of the probed figures spends their noise on five
    trees; on the star as declared they reach 0.94 of its two-tree plan, and on the emulated
    cluster such plans run slower than two trees."""
    probed = from_dict(PROBED_UNIFORM_STAR)
    declared = load(bundled("uniform-4"))
    best = make_plan(declared, size=16 * MiB)
    deep = make_plan(probed, size=16 * MiB, forest="deep")
    assert len(deep.trees) > len(best.trees) == 2
    assert _declared_rate(deep, declared) < 0.95 * best.throughput_Bps

    plan = make_plan(probed, size=16 * MiB)
    record = plan.planner["forest"]
    assert record["chosen"] == "leveled"
    assert len(plan.trees) == 2
    assert record["leveled"]["predicted_s"] <= record["deep"]["predicted_s"] * (
        1 + LEVEL_TOLERANCE)
    assert plan.throughput_Bps >= plan.ring_Bps * (1 - 1e-9)  # the plan's floor holds
    assert _declared_rate(plan, declared) >= 0.999 * best.throughput_Bps
    assert "forest: leveled" in plan.describe()
    # the certificate is the measured network's, not the leveled one's
    assert plan.upper_bound_Bps == deep.upper_bound_Bps
    assert plan.topology_digest == probed.digest


def test_rates_apart_by_more_than_noise_are_kept_apart():
    """A NIC at half rate is structure: leveling leaves it, and on exact figures (nothing to
    level) no leveled forest is offered, so the plan is what it was."""
    doc = dict(PROBED_UNIFORM_STAR, egress_gbps=[0.2, 0.4, 0.4, 0.4],
               ingress_gbps=[0.2, 0.4, 0.4, 0.4],
               bandwidth_gbps=[[None if i == j else (0.2 if 0 in (i, j) else 0.4)
                                for j in range(4)] for i in range(4)])
    exact = from_dict(doc)
    assert leveled(exact).capacity_Bps == exact.capacity_Bps
    assert "leveled" not in make_plan(exact, size=16 * MiB).planner["forest"]
    noisy = from_dict(PROBED_UNIFORM_STAR)
    slow = dict(PROBED_UNIFORM_STAR, egress_gbps=[0.2] + PROBED_UNIFORM_STAR["egress_gbps"][1:])
    flat = leveled(from_dict(slow)).capacity_Bps
    assert min(flat) == pytest.approx(0.2e9 / 8)
    assert sorted(flat)[1] == pytest.approx(min(noisy.capacity_Bps))


def test_a_slower_leveled_forest_says_why_it_was_kept():
    summary = {"throughput_Bps": 1e6, "max_hops": 6}
    record = {"size": 16 * MiB, "chosen": "leveled", "level_tolerance": LEVEL_TOLERANCE,
              "deep": dict(summary, predicted_s=0.50, trees=5),
              "leveled": dict(summary, predicted_s=0.52, trees=2)}
    text = "\n".join(describe_choice(record))
    assert "forest: leveled, fewer trees: deep is predicted faster by at most the 10%" in text


def test_declared_topologies_are_not_leveled_unless_asked():
    """Declared rates are exact: auto offers the leveled forest on measured networks only."""
    topo = from_dict({"name": "near-uniform", "switches": ["sw"], "ranks": ["a", "b", "c", "d"],
                      "links": [{"ends": [h, "sw"], "gbps": g}
                                for h, g in zip("abcd", (0.40, 0.41, 0.42, 0.43))]})
    assert leveled(topo).capacity_Bps != topo.capacity_Bps  # it would level something
    assert "leveled" not in make_plan(topo, size=16 * MiB).planner["forest"]
    forced = make_plan(topo, size=16 * MiB, forest="leveled")
    assert forced.planner["forest"]["chosen"] == "leveled"
    with pytest.raises(ValueError, match="packed over ranks"):
        check_forest("leveled", hierarchical=True)


def _noisy_star(n, seed, noise):
    """A probe's figures of a uniform 0.4 gbps star, each off by up to ``noise``."""
    rng = np.random.default_rng(seed)
    jitter = lambda: float(0.4 * (1 + rng.uniform(-noise, noise)))  # noqa: E731
    return {"name": "noisy", "ranks": [f"h{i}" for i in range(n)],
            "bandwidth_gbps": [[None if i == j else jitter() for j in range(n)]
                               for i in range(n)],
            "egress_gbps": [jitter() for _ in range(n)],
            "ingress_gbps": [jitter() for _ in range(n)]}


def test_fair_rates_below_ring_give_ring_chains():
    """Found by the property below: on this 3-rank probe the deep trees' max-min fair rates
    sum to 0.998 of ring's throughput (their LP rates to 1.001): ring's chains run instead."""
    topo = from_dict(_noisy_star(3, 198, 0.01))
    deep = make_plan(topo, size=16 * MiB, forest="deep")
    assert deep.throughput_Bps < deep.ring_Bps * 0.999
    plan = make_plan(topo, size=16 * MiB)
    below = plan.planner["forest"]["below_ring"]
    assert below["throughput_Bps"] == pytest.approx(deep.throughput_Bps)
    assert plan.throughput_Bps >= plan.ring_Bps * (1 - 1e-9)
    assert len(plan.trees) == 3 and all(t.depth == 4 for t in plan.trees)  # chains
    assert "ring's chains instead of the deep forest" in plan.describe()


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 6), st.integers(0, 2 ** 16), st.sampled_from([0.01, 0.03, 0.06]))
def test_the_choice_keeps_its_promises_on_noisy_probes(n, seed, noise):
    """On random noisy figures of a uniform star: the plan never drops below ring's
    throughput, and a leveled pick has fewer trees than every forest predicted faster and is
    at most LEVEL_TOLERANCE slower than the fastest."""
    plan = make_plan(from_dict(_noisy_star(n, seed, noise)), size=16 * MiB)
    record = plan.planner["forest"]
    assert plan.throughput_Bps >= plan.ring_Bps * (1 - 1e-6)
    assert "leveled" in record  # noise below 10% always levels something
    if record["chosen"] == "leveled":
        fastest = min(v["predicted_s"] for k, v in record.items()
                      if isinstance(v, dict) and "predicted_s" in v)
        assert record["leveled"]["predicted_s"] <= fastest * (1 + LEVEL_TOLERANCE) * (1 + 1e-9)
        assert record["leveled"]["trees"] < record["deep"]["trees"]


def test_the_leveled_forest_never_replaces_a_host_forest():
    """What the simulated quick probe measured on two sites of 3 hosts of 4 ranks each
    (``horotopo simulate sites:gpus=4,wan_gbps=10 --ranks 24 --probe quick --json``, its
    ``probed_topology``): the leveled packing over ranks has fewer trees than the host forest
    and is predicted within LEVEL_TOLERANCE of it, so the leveled rule would take it, but its
    trees are chains several times deeper, and run slower than the host forest."""
    import gzip
    import json
    from pathlib import Path

    path = Path(__file__).parent / "data" / "probed-sites-24-g4.json.gz"
    with gzip.open(path, "rt") as fh:
        topology = from_dict(json.load(fh))
    plan = make_plan(topology, size=64 * MiB)
    record = plan.planner["forest"]
    hosts, level = record["hosts"], record["leveled"]
    # the case the rule is for: fewer, deeper trees predicted within the tolerance
    assert level["trees"] < hosts["trees"]
    assert level["predicted_s"] <= hosts["predicted_s"] * (1 + LEVEL_TOLERANCE)
    assert level["max_hops"] > 2 * hosts["max_hops"]
    assert record["chosen"] == "hosts"
    assert len(plan.trees) == hosts["trees"]
