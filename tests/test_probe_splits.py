"""The probe's split scan: where pair rates show no groups, a few ranks test every split in two,
so a shared link that is no slower than the NICs behind it is still found."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from horotopo.generate import random_declared
from horotopo.packing import ArcModel
from horotopo.plan import make_plan
from horotopo.probe.pairing import SCAN_MAX_RANKS, bipartitions, group_tests
from horotopo.topology import from_dict

from test_probe_scale import needs_simgrid


@pytest.mark.parametrize("n", range(0, 8))
def test_bipartitions_are_every_split_in_two_of_at_least_two_ranks_once(n):
    oracle = set()
    for k in range(n + 1):
        for side in itertools.combinations(range(n), k):
            rest = tuple(r for r in range(n) if r not in side)
            if len(side) >= 2 and len(rest) >= 2:
                oracle.add(frozenset([side, rest]))
    got = bipartitions(n)
    assert len(got) == len(oracle) == max(0, 2 ** (n - 1) - 1 - n) if n else True
    assert {frozenset(tuple(g) for g in part) for part in got} == oracle
    assert all(part[0][0] == 0 and part[0] == sorted(part[0]) and part[1] == sorted(part[1])
               for part in got)


def test_the_scan_stays_within_its_test_count():
    # two group tests per split: 6 at 4 ranks, 20 at 5 (the docstring's count)
    assert [len(group_tests(bipartitions(n))) for n in (4, 5)] == [6, 20]
    assert SCAN_MAX_RANKS == 5


def _probed(doc):
    from horotopo.probe import probe
    from horotopo.simulation import SimCosts
    from horotopo.simulation.runner import run_simulated
    from horotopo.transport.simulated import DEFAULT_COSTS

    costs = SimCosts(DEFAULT_COSTS.per_message_s, 0.0)

    def body(t):
        with t.true_size():
            return probe(t, "quick")

    return run_simulated(from_dict(doc), body, costs=costs, timeout_s=120).results[0]


@needs_simgrid
def test_a_rack_uplink_as_slow_as_its_nics_is_found():
    # random_declared(4, 12): ranks 0 and 3 (h3, h2) behind tor0, whose uplink (0.285 gbps
    # out) is no slower than h2's NIC (0.292): every pair reads 0.28-0.38 gbps, one rate
    # level. Before the scan no group test ran and the probed model had no shared link.
    doc = random_declared(4, 12, gbps_range=(0.2, 1.0))
    assert doc["ranks"] == ["h3", "h0", "h1", "h2"]
    probed = _probed(doc)
    assert probed["probe"]["levels"] == []
    found = {(tuple(sorted({p[0] for p in s["pairs"]})), tuple(sorted({p[1] for p in s["pairs"]}))):
             s["gbps"] for s in probed["shared"]}
    assert found.get(((0, 3), (1, 2))) == pytest.approx(0.285, rel=0.15), found
    # What the probe is for: the plan made from it, its trees and shares loaded on the declared
    # network, is as fast as the declared topology's own plan (0.62 of it before the scan).
    declared = from_dict(doc)
    assert _rate_on(make_plan(from_dict(probed)), declared) >= \
        0.95 * _rate_on(make_plan(declared), declared)


def _rate_on(plan, topology):
    """Modelled rate of ``plan``'s trees at its shares on ``topology`` (the busiest resource)."""
    model = ArcModel(topology)
    use = sum(t.share * model.load(t.root, t.reduce_parent, t.bcast_parent) for t in plan.trees)
    return 1.0 / float(np.max(np.asarray(use, dtype=float) / model.capacity))


@needs_simgrid
def test_the_scan_finds_nothing_on_a_non_blocking_switch():
    doc = {"name": "uniform-4", "switches": ["s"],
           "links": [{"ends": [f"h{i}", "s"], "gbps": 0.5} for i in range(4)],
           "ranks": [f"h{i}" for i in range(4)]}
    probed = _probed(doc)
    assert probed.get("shared", []) == []
