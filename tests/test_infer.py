"""The probe's inference on synthetic measurements (no MPI): schedule, clustering, shared
bottlenecks, host caps, the document, and the planned optimum of what it infers."""
import math

import numpy as np
import pytest

from horotopo.plan import make_plan, modelled_rate_on
from horotopo.generate import racks as generated_racks
from horotopo.generate import random_declared
from horotopo.probe.infer import (build_document, circle_rounds, cluster_levels, cluster_ranks,
                                  expected_fan, expected_rates, extension_tests, format_report,
                                  group_tests, infer_all, infer_host_caps, infer_shared)
from horotopo.topology import GBPS_TO_BPS, bundled, from_dict, load


# ---------------------------------------------------------------------------------------------
# a simulated network: what the probe would measure on a declared topology


LOCAL_GBPS = 25.0


def maxmin_rates(topo, flows):
    """Max-min fair rates (gbps) of ``flows`` running at once (what TCP flows roughly get)."""
    cap = np.array(topo.capacity_Bps) / GBPS_TO_BPS
    # ranks on one host: no shaped link in between (the emulator's loopback is that fast)
    rate = {f: (0.0 if topo.routes[f[0]][f[1]] else LOCAL_GBPS) for f in flows}
    active = {f for f in flows if topo.routes[f[0]][f[1]]}
    while active:
        count = np.zeros(len(cap))
        for i, j in active:
            for r in topo.routes[i][j]:
                count[r] += 1
        used = count > 0
        inc = float(np.min(cap[used] / count[used]))
        for f in active:
            rate[f] += inc
        cap = cap - inc * count
        full = {r for r in np.flatnonzero(used) if cap[r] <= 1e-9}
        active = {f for f in active if not full.intersection(topo.routes[f[0]][f[1]])}
    return [rate[f] for f in flows]


def simulate(topo, noise=0.0, seed=0):
    """The probe's pipeline on a simulated network, with multiplicative noise on every figure."""
    rng = np.random.default_rng(seed)
    n = topo.n

    def jitter(x):
        return x * (1.0 + rng.uniform(-noise, noise))

    bw = [[None if i == j else jitter(maxmin_rates(topo, [(i, j)])[0]) for j in range(n)]
          for i in range(n)]
    lat = [[None if i == j else 0.05 for j in range(n)] for i in range(n)]
    groups = cluster_ranks(bw)
    levels = cluster_levels(bw)
    results = [(t.src, t.dst, t.flows, jitter(sum(maxmin_rates(topo, list(t.flows)))))
               for t in group_tests(levels)]
    ext = [(t.src, t.dst, t.rank, t.side, t.flows, jitter(sum(maxmin_rates(topo, list(t.flows)))))
           for t in extension_tests(infer_shared(bw, results), levels, n)]
    shared = infer_all(bw, results, ext)
    fan_out = [jitter(sum(maxmin_rates(topo, [(k, j) for j in range(n) if j != k])))
               for k in range(n)]
    fan_in = [jitter(sum(maxmin_rates(topo, [(j, k) for j in range(n) if j != k])))
              for k in range(n)]
    assert shared == infer_all(bw, results, ext)  # pure: same input, same answer
    return build_document(f"probed {topo.name}", list(topo.hosts), bw, lat, fan_out_gbps=fan_out,
                          fan_in_gbps=fan_in, shared_results=results, extension_results=ext,
                          groups=groups,
                          meta={"mode": "simulated"})


def racks(a=3, b=3, nic=1.0, uplink=0.25):
    hosts = [f"p{k}" for k in range(a)] + [f"q{k}" for k in range(b)]
    links = [{"ends": [h, "tor0" if h[0] == "p" else "tor1"], "gbps": nic} for h in hosts]
    links.append({"ends": ["tor0", "tor1"], "gbps": uplink})
    return from_dict({"name": f"racks-{a}x{b}", "switches": ["tor0", "tor1"], "links": links,
                      "ranks": hosts})


def uniform_matrix(n, value=1.0, noise=0.0, seed=1):
    rng = np.random.default_rng(seed)
    return [[None if i == j else value * (1 + rng.uniform(-noise, noise)) for j in range(n)]
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# the schedule


@pytest.mark.parametrize("n", range(1, 10))
def test_circle_rounds_cover_every_pair_once_in_disjoint_rounds(n):
    rounds = circle_rounds(n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == [(i, j) for i in range(n) for j in range(i + 1, n)]
    for r in rounds:
        ranks = [v for p in r for v in p]
        assert len(ranks) == len(set(ranks)), f"round {r} reuses a rank"
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


# ---------------------------------------------------------------------------------------------
# clustering


def test_two_racks_cluster_into_their_racks():
    topo = racks()
    bw = [[None if i == j else topo.pair_capacity_Bps(i, j) for j in range(6)] for i in range(6)]
    assert cluster_ranks(bw) == [[0, 1, 2], [3, 4, 5]]


def test_interleaved_racks_cluster_by_rate_not_by_rank_order():
    doc = load(bundled("racks-2x3"))  # ranks p0 q0 p1 q1 p2 q2
    bw = [[None if i == j else doc.pair_capacity_Bps(i, j) for j in range(6)] for i in range(6)]
    assert cluster_ranks(bw) == [[0, 2, 4], [1, 3, 5]]


@pytest.mark.parametrize("noise", [0.0, 0.05, 0.15])
def test_uniform_network_is_one_group(noise):
    assert cluster_ranks(uniform_matrix(6, noise=noise)) == [list(range(6))]


@pytest.mark.parametrize("seed", range(5))
def test_racks_survive_measurement_noise(seed):
    topo = racks(4, 4)
    rng = np.random.default_rng(seed)
    bw = [[None if i == j else topo.pair_capacity_Bps(i, j) * (1 + rng.uniform(-0.15, 0.15))
           for j in range(8)] for i in range(8)]
    assert cluster_ranks(bw) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_asymmetric_uplink_still_splits_the_racks():
    topo = from_dict({"name": "asym", "switches": ["a", "b"],
                      "links": [{"ends": ["x0", "a"], "gbps": 1}, {"ends": ["x1", "a"], "gbps": 1},
                                {"ends": ["y0", "b"], "gbps": 1}, {"ends": ["y1", "b"], "gbps": 1},
                                {"ends": ["a", "b"], "gbps": [0.2, 0.9]}],
                      "ranks": ["x0", "x1", "y0", "y1"]})
    bw = [[None if i == j else topo.pair_capacity_Bps(i, j) for j in range(4)] for i in range(4)]
    assert cluster_ranks(bw) == [[0, 1], [2, 3]]


def test_small_and_degenerate_inputs():
    assert cluster_ranks([[None]]) == [[0]]
    assert cluster_ranks([[None, 1.0], [0.1, None]]) == [[0, 1]]
    with pytest.raises(ValueError, match="square"):
        cluster_ranks([[None, 1.0]])


def test_group_tests_need_two_pairs():
    tests = group_tests([[0, 2, 4], [1, 3, 5]])
    assert [t.flows for t in tests] == [((0, 1), (2, 3), (4, 5)), ((1, 0), (3, 2), (5, 4))]
    assert tests[0].src == (0, 2, 4) and tests[0].dst == (1, 3, 5)
    # a lone slow rank cannot show sharing: one transfer alone is its pairwise figure
    assert group_tests([[0, 1, 3], [2]]) == []


def test_three_groups_also_test_each_against_the_rest():
    tests = group_tests([[[0, 1], [2, 3], [4, 5]]])
    keys = {(t.src, t.dst) for t in tests}
    assert ((0, 1), (2, 3, 4, 5)) in keys and ((2, 3, 4, 5), (0, 1)) in keys
    rest = next(t for t in tests if t.src == (0, 1) and len(t.dst) == 4)
    assert rest.flows == ((0, 2), (1, 4))  # the destinations spread over the other groups
    assert len(tests) == 6 + 6


def test_levels_nest_hosts_inside_racks():
    # ranks 0,1 share a host (fast), hosts sit in two racks behind a slow uplink
    bw = [[None, 20, 1, 1, .2, .2], [20, None, 1, 1, .2, .2], [1, 1, None, 1, .2, .2],
          [1, 1, 1, None, .2, .2], [.2, .2, .2, .2, None, 1], [.2, .2, .2, .2, 1, None]]
    assert cluster_levels(bw) == [[[0, 1], [2], [3], [4], [5]], [[0, 1, 2, 3], [4, 5]]]
    assert cluster_levels(uniform_matrix(5, noise=0.1)) == []


# ---------------------------------------------------------------------------------------------
# shared bottlenecks and host caps


def test_two_racks_behind_one_uplink_are_found():
    doc = simulate(racks())
    shared = doc["shared"]
    assert len(shared) == 2
    for s in shared:
        assert s["gbps"] == pytest.approx(0.25)
        assert len(s["pairs"]) == 9
    forward = {tuple(p) for p in shared[0]["pairs"]}
    assert forward == {(i, j) for i in range(3) for j in range(3, 6)}


def test_uniform_network_gives_no_shared_group():
    doc = simulate(load(bundled("uniform-4")), noise=0.1)
    assert "shared" not in doc
    assert doc["probe"]["groups"] == [[0, 1, 2, 3]]
    # one switch with 0.4 gbps NICs: each host's NIC caps its fan-out and fan-in
    assert doc["egress_gbps"] == pytest.approx([0.4] * 4, rel=0.11)
    assert doc["ingress_gbps"] == pytest.approx([0.4] * 4, rel=0.11)


def test_non_blocking_fabric_gives_no_caps():
    """Pairwise figures that add up (a full-bisection fabric): no shared group, no cap."""
    bw = uniform_matrix(4, noise=0.05)
    doc = build_document("fabric", list("abcd"), bw, uniform_matrix(4, 0.01),
                         fan_out_gbps=[2.9, 3.0, 3.1, 2.95], fan_in_gbps=[3.0] * 4)
    assert "shared" not in doc and "egress_gbps" not in doc and "ingress_gbps" not in doc


@pytest.mark.parametrize("seed", range(4))
def test_uplink_found_under_noise(seed):
    doc = simulate(racks(4, 4), noise=0.1, seed=seed)
    assert len(doc["shared"]) == 2
    for s in doc["shared"]:
        assert s["gbps"] == pytest.approx(0.25, rel=0.11)


def test_aggregate_near_the_sum_is_not_shared():
    bw = uniform_matrix(4)
    results = [((0, 1), (2, 3), [(0, 2), (1, 3)], 1.85)]  # 2 x 1.0 alone, 7.5% below: noise
    assert infer_shared(bw, results) == []
    results = [((0, 1), (2, 3), [(0, 2), (1, 3)], 1.1)]
    (s,) = infer_shared(bw, results)
    assert sorted(map(tuple, s["pairs"])) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    with pytest.raises(ValueError, match=r"ranks \[0\] -> \[2\]"):
        infer_shared(bw, [((0,), (2,), [(0, 2)], 0.0)])


def test_three_racks_find_each_uplink_to_the_rest():
    topo = from_dict(generated_racks([2, 2, 2], uplink_gbps=0.3))
    doc = simulate(topo)
    groups = doc["probe"]["groups"]
    assert sorted(map(len, groups)) == [2, 2, 2]
    caps = {(tuple(sorted({i for i, _ in s["pairs"]})), len(s["pairs"])): s["gbps"]
            for s in doc["shared"]}
    for g in groups:
        # each rack's uplink carries everything from the rack to the other 4 ranks
        assert caps[(tuple(g), 2 * 4)] == pytest.approx(0.3)
    want = make_plan(topo).throughput_Bps
    assert make_plan(from_dict(doc)).throughput_Bps == pytest.approx(want, rel=0.15)


def test_ranks_sharing_a_host_share_its_nic():
    topo = from_dict({"name": "two-per-host", "switches": ["sw"],
                      "links": [{"ends": ["h0", "sw"], "gbps": 1.0},
                                {"ends": ["h1", "sw"], "gbps": 1.0},
                                {"ends": ["h2", "sw"], "gbps": 1.0}],
                      "ranks": ["h0", "h0", "h1", "h2"]})
    bw = [[None if i == j else (25.0 if topo.hosts[i] == topo.hosts[j]
                                else topo.pair_capacity_Bps(i, j) / GBPS_TO_BPS)
           for j in range(4)] for i in range(4)]
    levels = cluster_levels(bw)
    assert levels == [[[0, 1], [2], [3]]]
    tests = group_tests(levels)
    out = next(t for t in tests if t.src == (0, 1))
    assert out.flows == ((0, 2), (1, 3))
    results = [(out.src, out.dst, out.flows, 1.0)]  # the NIC: 1 gbps for both
    (s,) = infer_shared(bw, results)
    assert sorted(map(tuple, s["pairs"])) == [(0, 2), (0, 3), (1, 2), (1, 3)]


def test_slow_nic_caps_bind_only_at_the_slow_host():
    doc = simulate(load(bundled("slow-nic")))
    assert "shared" not in doc
    egress, ingress = doc["egress_gbps"], doc["ingress_gbps"]
    assert egress[2] == pytest.approx(0.2) and ingress[2] == pytest.approx(0.2)
    # the fast hosts' NICs (0.8) bind too: three flows of 0.8, 0.8 and 0.2 alone
    assert egress[0] == pytest.approx(0.8)


def test_expected_fan_applies_shared_caps():
    bw = uniform_matrix(4)
    shared = [{"pairs": [[0, 2], [0, 3]], "gbps": 0.5}]
    assert expected_fan(bw, 0, shared, outgoing=True) == pytest.approx(1.0 + 0.5)
    assert expected_fan(bw, 0, shared, outgoing=False) == pytest.approx(3.0)
    assert expected_rates(bw, [(0, 2), (0, 3), (1, 0)], shared) == pytest.approx([0.25, 0.25, 1])
    assert infer_host_caps(bw, [1.45, 3.0, 3.0, 3.0], [3.0] * 4, shared) == (None, None)
    egress, ingress = infer_host_caps(bw, [0.9, 3.0, 3.0, 3.0], [3.0] * 4, shared)
    assert egress == [0.9, None, None, None] and ingress is None


# ---------------------------------------------------------------------------------------------
# the document, the report, and what the planner makes of it


def test_document_loads_and_reports():
    doc = simulate(racks())
    topo = from_dict(doc)
    assert topo.kind == "measured" and topo.n == 6
    assert doc["probe"]["groups"] == [[0, 1, 2], [3, 4, 5]]
    text = format_report(doc)
    assert "# bandwidth (gbps)" in text and "shared 0,1,2->3,4,5" in text
    assert text.count("\n     0 ") >= 1 and "0.250" in text


MAKERS = [lambda: racks(), lambda: racks(4, 4, uplink=0.4), lambda: load(bundled("slow-nic")),
          lambda: load(bundled("uniform-4")), lambda: load(bundled("racks-2x3")),
          lambda: from_dict(random_declared(6, 2)), lambda: from_dict(random_declared(6, 3)),
          lambda: from_dict(random_declared(4, 1))]


@pytest.mark.parametrize("make", MAKERS)
def test_probed_optimum_within_15_percent_of_declared(make):
    declared = make()
    probed = from_dict(simulate(declared, noise=0.05, seed=3))
    want = make_plan(declared)
    got = make_plan(probed)
    assert got.throughput_Bps == pytest.approx(want.throughput_Bps, rel=0.15), declared.name
    # and the plan made from the probe, run on the real network, is nearly as good
    real = modelled_rate_on(got, declared) / modelled_rate_on(want, declared)
    assert real >= 0.85, f"{declared.name}: the probed plan gets {real:.3f} of the declared one"


@pytest.mark.xfail(strict=True, reason="known limit: a rack's downlink shared by ranks the rates "
                   "put in different groups (a host with two ranks and a lone fast host) is not "
                   "found; only ranks alone at every level get extension tests")
def test_downlink_shared_by_ungrouped_ranks():
    # Stated on the probed model (its optimum overstates the network by the missing
    # downlink), not on a plan's rate on the real network: a planner may pick trees that
    # happen to spare the downlink, which says nothing about the probe.
    declared = from_dict(random_declared(5, 7))
    probed = from_dict(simulate(declared, noise=0.05, seed=3))
    ratio = make_plan(probed).throughput_Bps / make_plan(declared).throughput_Bps
    assert ratio <= 1.15, f"the probed optimum is {ratio:.3f} of the declared one"


def test_a_slow_nic_inside_a_rack_still_shares_its_uplink():
    """The rates cannot place a slow host (slow to everyone); its uplink traffic can."""
    declared = from_dict(random_declared(6, 2))  # rank 2: a slow NIC in the rack of 0 and 5
    doc = simulate(declared)
    covering = [s for s in doc["shared"] if [2, 1] in s["pairs"]]
    assert covering, doc["shared"]
    assert doc["probe"]["extension"], "no extension test ran"


def test_without_inference_the_uplink_model_is_too_optimistic():
    """The reason for the concurrent tests: pairwise figures alone overstate a shared uplink."""
    declared = racks()
    doc = simulate(declared)
    doc.pop("shared")
    naive = make_plan(from_dict(doc)).throughput_Bps
    assert naive > 1.3 * make_plan(declared).throughput_Bps


def test_document_rejects_bad_figures():
    bw = uniform_matrix(2)
    bw[0][1] = 0.0
    with pytest.raises(ValueError, match=r"/bandwidth_gbps/0/1: must be positive"):
        build_document("x", ["a", "b"], bw, [[None, 0.1], [0.1, None]])
    with pytest.raises(ValueError, match="rank 1: fan-out"):
        infer_host_caps(uniform_matrix(3), [1.0, -1.0, 1.0], [1.0] * 3)
    assert math.isclose(build_document("y", ["a", "b"], uniform_matrix(2),
                                       [[None, 0.1], [0.1, None]])["bandwidth_gbps"][0][1], 1.0)
