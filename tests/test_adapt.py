"""The pure half of adaptivity: detector, suspects, refreshed capacities, topology rewrite."""
import math

import numpy as np
import pytest

from horotopo.adapt import Detector, refresh_capacities, suspects, topology_with_capacities
from horotopo.adapt.policy import plan_arcs
from horotopo.plan import make_plan, plan_from_trees
from horotopo.topology import GBPS_TO_BPS, bundled, from_dict, load

G = GBPS_TO_BPS


def test_detector_needs_consecutive_slow_calls():
    d = Detector(threshold=0.3, consecutive=3, warmup=3, min_seconds=0.0)
    for _ in range(3):
        assert not d.update(1.0, 2.0)           # efficiency 0.5: the baseline
    assert d.baseline == pytest.approx(0.5)
    assert not d.update(1.0, 2.5)               # 0.4 >= 0.7 * 0.5 = 0.35: fine
    assert not d.update(1.0, 3.0) and not d.update(1.0, 3.0)   # two slow (0.33)
    assert not d.update(1.0, 2.0)               # a normal call breaks the run
    assert not d.update(1.0, 3.0) and not d.update(1.0, 3.0)
    assert d.update(1.0, 3.0)                   # third slow in a row
    assert d.slow_run == 0


def test_detector_ignores_short_calls_and_resets():
    d = Detector(threshold=0.5, consecutive=1, warmup=1, min_seconds=0.01)
    assert not d.update(1e-3, 1e-3)             # too short: no baseline from it
    assert d.baseline is None
    assert not d.update(0.1, 0.1)
    assert d.baseline == 1.0
    assert not d.update(1e-3, 5e-3)             # short and slow: still ignored
    assert d.update(0.1, 0.3)
    d.reset()
    assert d.baseline is None and d.slow_run == 0
    assert not d.update(0.1, 0.0)               # nonsense timings say nothing


@pytest.mark.parametrize("kw", [dict(threshold=0), dict(threshold=1.5), dict(consecutive=0),
                                dict(warmup=0), dict(consecutive=1.5)])
def test_detector_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        Detector(**kw)


def test_suspects_worst_first_limit_and_healthy():
    n = 3
    base_b = np.full((n, n), 100.0)
    base_s = np.ones((n, n))
    rec_b = base_b.copy()
    rec_s = base_s.copy()
    rec_s[0, 1] = 4.0       # 0->1 at a quarter
    rec_s[2, 0] = 2.0       # 2->0 at half
    rec_s[1, 2] = 1.2       # 1->2 at 0.83: within the threshold
    base_s[2, 1] = 0.0      # 2->1 never sent in the baseline: no figure
    sus, healthy = suspects(base_b, base_s, rec_b, rec_s, threshold=0.3, limit=5)
    assert sus == [(0, 1), (2, 0)]
    assert (1, 2) in healthy and (2, 1) not in healthy and (0, 1) not in healthy
    assert suspects(base_b, base_s, rec_b, rec_s, threshold=0.3, limit=1)[0] == [(0, 1)]


def _racks():
    return load(bundled("racks-2x3"))


def test_refresh_blames_the_link_no_healthy_pair_crosses():
    t = _racks()                     # ranks: p0 q0 p1 q1 p2 q2; rack uplink 0.25 gbps
    up = t.resources.index("p0->tor0")
    tors = t.resources.index("tor0->tor1")
    # p0 -> q0 probes at 0.05 gbps; p1 -> q0 (same uplink tor0->tor1, same tor1->q0) is fine
    caps = refresh_capacities(t, {(0, 1): 0.05 * G}, healthy=[(2, 1)], threshold=0.3)
    changed = [k for k, (a, b) in enumerate(zip(caps, t.capacity_Bps)) if a != b]
    assert changed == [up]
    assert caps[up] == pytest.approx(0.05 * G)
    assert caps[tors] == t.capacity_Bps[tors]


def test_refresh_without_evidence_lowers_the_route_and_never_raises():
    t = _racks()
    caps = refresh_capacities(t, {(0, 1): 0.05 * G})
    route = set(t.routes[0][1])
    for k, (a, b) in enumerate(zip(caps, t.capacity_Bps)):
        assert a == (min(b, 0.05 * G) if k in route else b)
    # a pair probed at its modelled rate changes nothing
    assert refresh_capacities(t, {(0, 2): 1.0 * G}) == list(t.capacity_Bps)
    # every resource cleared: the tightest of the route takes the blame
    caps = refresh_capacities(t, {(0, 1): 0.05 * G}, healthy=[(0, 3), (2, 1)])
    assert caps[t.resources.index("tor0->tor1")] == pytest.approx(0.05 * G)
    with pytest.raises(ValueError):
        refresh_capacities(t, {(0, 1): 0.0})


def test_rewrite_declared_round_trip_and_asymmetric():
    t = _racks()
    same = topology_with_capacities(t, t.capacity_Bps)
    assert same.capacity_Bps == t.capacity_Bps and same.routes == t.routes
    caps = list(t.capacity_Bps)
    caps[t.resources.index("p0->tor0")] = 0.25 * G
    new = topology_with_capacities(t, caps, name="racks-2x3 adapted")
    assert new.name == "racks-2x3 adapted"
    assert list(new.capacity_Bps) == pytest.approx(caps)
    link = [ln for ln in new.to_json()["links"] if ln["ends"] == ["p0", "tor0"]][0]
    assert link["gbps"] == [0.25, 1.0]
    with pytest.raises(ValueError, match="capacities"):
        topology_with_capacities(t, caps[:-1])


def test_rewrite_measured_form():
    doc = {"name": "m", "ranks": ["a", "b", "c"],
           "bandwidth_gbps": [[None, 1, 1], [1, None, 1], [1, 1, None]],
           "egress_gbps": [None, 1.5, None], "ingress_gbps": [2.0, None, None],
           "shared": [{"pairs": [[0, 1], [0, 2]], "gbps": 1.2}]}
    t = from_dict(doc)
    caps = [c * 0.5 for c in t.capacity_Bps]
    new = topology_with_capacities(t, caps)
    assert list(new.capacity_Bps) == pytest.approx(caps)
    assert new.routes == t.routes


def test_refreshed_model_plans_like_the_true_new_network():
    """End to end on the model: the p0 uplink drops to a quarter; planning the refreshed model
    gives the same throughput as planning the truly degraded topology."""
    t = _racks()
    truth_doc = t.to_json()
    for ln in truth_doc["links"]:
        if ln["ends"] == ["p0", "tor0"]:
            ln["gbps"] = [0.25, 1.0]
    truth = from_dict(truth_doc)
    # what a re-probe of p0 -> p1 (same rack: only the host links) would see alone
    probed = {(0, 2): truth.pair_capacity_Bps(0, 2)}
    caps = refresh_capacities(t, probed, healthy=[(4, 2)], threshold=0.3)
    refreshed = topology_with_capacities(t, caps)
    assert make_plan(refreshed).throughput_Bps == pytest.approx(make_plan(truth).throughput_Bps,
                                                                rel=0.02)
    assert math.isclose(refreshed.capacity_Bps[t.resources.index("p0->tor0")], 0.25 * G)


def test_plan_arcs_most_loaded_first():
    # tree 0 (share 0.75): 1 -> 0 <- 2 up, 0 -> 1 -> 2 down; tree 1 (0.25): chain to 2
    plan = plan_from_trees(3, [(0, [-1, 0, 0], [-1, 0, 1], 3.0),
                               (2, [1, 2, -1], [1, 2, -1], 1.0)])
    # loads: 0->1, 1->0 and 1->2 carry 0.75 + 0.25; 2->0 0.75; 2->1 0.25 (ties by pair)
    assert plan_arcs(plan) == [(0, 1), (1, 0), (1, 2), (2, 0), (2, 1)]
