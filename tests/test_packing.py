"""Packing invariants, against an exact LP over every tree (n <= 6), and closed forms."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from horotopo import generate
from horotopo.packing import ArcModel, CertificateError, check_certificate, pack, ring_packing, \
    start_bound
from horotopo.packing import gk
from horotopo.packing.model import validate_arborescence
from horotopo.plan import plan_from_trees
from horotopo.topology import GBPS_TO_BPS, bundled, from_dict, load

from plan_checks import checked
from test_arborescence import all_arborescences


def check_invariants(topology, packing):
    n = topology.n
    model = ArcModel(topology)
    # the raw bound: pack() no longer raises it to the throughput, so this can fail
    assert packing.upper_bound is not None
    assert packing.upper_bound >= packing.throughput * (1 - 1e-9), "dual below primal"
    assert packing.gap == 1 - packing.throughput / packing.upper_bound
    load = np.zeros(len(model.capacity))
    for t in packing.trees:
        assert t.rate > 0
        assert validate_arborescence(t.reduce_parent, t.root, n) is None
        assert validate_arborescence(t.bcast_parent, t.root, n) is None
        load += t.rate * model.load(t.root, t.reduce_parent, t.bcast_parent)
    assert np.all(load <= model.capacity * (1 + 1e-6)), "a resource is over capacity"
    assert sum(t.rate for t in packing.trees) == pytest.approx(packing.throughput)
    assert packing.throughput >= ring_packing(topology).throughput * (1 - 1e-9)
    # the plan these trees make passes every plan and step-table invariant
    checked(plan_from_trees(n, [(t.root, t.reduce_parent, t.bcast_parent, t.rate)
                                for t in packing.trees]), topology)


def exact_optimum(topology):
    """Max throughput over every reduce and broadcast tree, built here from scratch."""
    n = topology.n
    cap = np.asarray(topology.capacity_Bps)
    cols, kinds, roots = [], [], []
    for r in range(n):
        for parent in all_arborescences(n, r):
            for inward in (True, False):
                load = np.zeros(len(cap))
                for v, p in enumerate(parent):
                    if p >= 0:
                        i, j = (v, p) if inward else (p, v)
                        for res in topology.routes[i][j]:
                            load[res] += 1
                cols.append(load)
                kinds.append(inward)
                roots.append(r)
    a_ub = np.column_stack(cols)
    a_eq = np.zeros((n, len(cols)))
    for k, (inward, r) in enumerate(zip(kinds, roots)):
        a_eq[r, k] = 1.0 if inward else -1.0
    scale = cap.max()
    res = linprog(-np.array(kinds, dtype=float), A_ub=a_ub, b_ub=cap / scale, A_eq=a_eq,
                  b_eq=np.zeros(n), bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun * scale


SMALL = [generate.random_declared(4, s) for s in range(4)] + \
        [generate.random_measured(4, s) for s in range(3)] + \
        [generate.random_measured(5, 9, gbps_range=(0.5, 1.0), host_caps=False, shared=0),
         generate.racks([2, 3], uplink_gbps=0.3), generate.racks([3, 3], uplink_gbps=0.6),
         load(bundled("slow-nic")).to_json(), load(bundled("uniform-4")).to_json()]


@pytest.mark.parametrize("doc", SMALL, ids=lambda d: d["name"])
def test_within_two_percent_of_exact_lp(doc):
    topology = from_dict(doc)
    packing = pack(topology)
    check_invariants(topology, packing)
    best = exact_optimum(topology)
    assert packing.upper_bound >= best * (1 - 1e-6), "the certified bound is below the optimum"
    assert start_bound(ArcModel(topology)) >= best * (1 - 1e-9), "ring's bound is below the optimum"
    assert packing.throughput >= 0.98 * best
    assert packing.gap <= 0.02


def test_uniform_star_equals_ring():
    topology = from_dict(generate.uniform_star(6, gbps=0.5))
    packing = pack(topology)
    ring = ring_packing(topology).throughput
    assert ring == pytest.approx(6 * 0.5 * GBPS_TO_BPS / (2 * 5))
    assert packing.throughput == pytest.approx(ring, rel=1e-6)
    assert packing.upper_bound == pytest.approx(ring, rel=0.01)


@pytest.mark.parametrize("uplink", [0.1, 0.25, 0.4])
def test_two_racks_limited_by_the_uplink_once_per_direction(uplink):
    # 3 + 3 hosts at 1 gbps: hosts alone allow 6 * 1 / 10 = 0.6 gbps; every tree crosses the
    # uplink once up (reduce) and once down (broadcast), so R = uplink rate.
    topology = from_dict(generate.racks([3, 3], nic_gbps=1.0, uplink_gbps=uplink))
    packing = pack(topology)
    assert packing.throughput == pytest.approx(uplink * GBPS_TO_BPS, rel=1e-6)
    assert packing.gap <= 1e-6


def test_bundled_racks_beats_rank_order_ring_fivefold():
    topology = load(bundled("racks-2x3"))
    packing = pack(topology)
    assert packing.throughput == pytest.approx(0.25 * GBPS_TO_BPS)
    # rank order alternates racks, so ring crosses the uplink on all 6 of its arcs
    assert ring_packing(topology).throughput == pytest.approx(0.25 * GBPS_TO_BPS / 5)


def test_pruning_respects_the_quota():
    topology = from_dict(generate.racks([4, 4, 4], uplink_gbps=1.5))
    for k in (1, 2):
        packing = pack(topology, max_trees_per_root=k)
        check_invariants(topology, packing)
        for r in range(topology.n):
            at_root = [t for t in packing.trees if t.root == r]
            assert len({t.reduce_parent for t in at_root}) <= k
            assert len({t.bcast_parent for t in at_root}) <= k


def test_single_rank_and_single_host_are_unconstrained():
    for doc in (generate.uniform_star(1), generate.racks([1])):
        packing = pack(from_dict(doc))
        assert len(packing.trees) == 1
    same_host = from_dict({"switches": [], "links": [{"ends": ["a", "b"], "gbps": 1}],
                           "ranks": ["a", "a", "a"]})
    packing = pack(same_host)
    assert packing.trees[0].reduce_parent == (-1, 0, 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 9), seed=st.integers(0, 10_000), measured=st.booleans())
def test_random_topologies_property(n, seed, measured):
    doc = generate.random_measured(n, seed) if measured else generate.random_declared(n, seed)
    topology = from_dict(doc)
    packing = pack(topology)
    check_invariants(topology, packing)
    assert packing.gap <= 0.02


def test_bound_phase_is_recorded():
    topology = load(bundled("racks-2x3"))
    packing = pack(topology)
    assert packing.upper_bound == pytest.approx(packing.throughput, rel=1e-6)
    assert packing.bound_phase in (gk.PHASE_GK, gk.PHASE_COLUMNS)
    assert packing.stats()["bound_phase"] == packing.bound_phase


def test_wrong_garg_konemann_dual_is_an_error(monkeypatch):
    real = gk.dual_bound
    calls = []

    def too_small_first(capacity, lengths, d1, d2):
        calls.append(1)  # only the first bound, which multiplicative weights prices, is wrong
        return real(capacity, lengths, d1, d2) * (0.01 if len(calls) == 1 else 1.0)

    monkeypatch.setattr(gk, "dual_bound", too_small_first)
    with pytest.raises(CertificateError, match="racks-2x3") as err:
        pack(load(bundled("racks-2x3")))
    assert err.value.phase == gk.PHASE_GK == "Garg-Konemann dual"
    assert err.value.topology == "racks-2x3"
    assert "Garg-Konemann dual" in str(err.value) and err.value.bound < err.value.achieved


def test_wrong_column_generation_pricing_is_an_error(monkeypatch):
    real = gk.price

    def overpriced(model, lengths, root_price, inward, count=1, allowed_roots=None):
        # a reduced cost too high makes d1 + d2 too large and the bound c.y / (d1 + d2) too small
        return [(cost + 0.5, half) for cost, half in
                real(model, lengths, root_price, inward, count, allowed_roots)]

    monkeypatch.setattr(gk, "price", overpriced)
    topology = from_dict(generate.racks([2, 3], uplink_gbps=0.3))
    with pytest.raises(CertificateError) as err:
        pack(topology, gk_iterations=0)
    assert err.value.phase == "column generation pricing"
    assert err.value.topology == topology.name
    assert repr(topology.name) in str(err.value)


def test_rounding_tolerance_and_unfloored_gap():
    check_certificate(1.0, 1.0 + 1e-12, topology="t", phase="p")  # rounding: accepted
    with pytest.raises(CertificateError, match="'t'.*from the p"):
        check_certificate(1.0, 1.0 + 1e-7, topology="t", phase="p")
    with pytest.raises(CertificateError):
        check_certificate(float("nan"), 1.0, topology="t", phase="p")
    tight = pack(from_dict(generate.uniform_star(4)))
    # exactly 1 - R / bound, negative when the bound's rounding lands a hair below R
    assert tight.gap == 1 - tight.throughput / tight.upper_bound
    assert -1e-9 <= tight.gap <= 1e-9


def test_ring_packing_claims_no_certificate_and_start_bound_is_exact_on_a_star():
    topology = from_dict(generate.uniform_star(5, gbps=0.5))
    ring = ring_packing(topology)
    assert ring.upper_bound is None and ring.gap is None and "no certificate" in ring.describe()
    assert start_bound(ArcModel(topology)) == pytest.approx(ring.throughput, rel=1e-12)
    racks = load(bundled("racks-2x3"))
    # a valid bound on racks-2x3 lies above the optimum (the uplink's 0.25 gbps)
    assert start_bound(ArcModel(racks)) >= 0.25 * GBPS_TO_BPS


def test_solver_rates_are_made_exactly_feasible():
    """HiGHS meets capacities and the per-root balance to about 1e-7, not exactly; the pool's
    rate is checked against certified bounds at 1e-9, and a probed 1024-rank plan over hosts
    failed that check by 4.1e-8. gk._feasible cuts each root's halves to the smaller sum and
    scales every rate under the capacities."""
    rng = np.random.default_rng(5)
    n, halves, resources = 4, 12, 7
    inward = np.arange(halves) % 2 == 0
    roots = rng.integers(0, n, halves)
    loads = rng.integers(0, 3, (resources, halves)).astype(float)
    cap = rng.uniform(1.0, 2.0, resources)
    x = rng.uniform(0.0, 1.0, halves)
    x *= float(np.min(cap / (loads @ x))) * (1 + 1e-7)  # over one capacity by 1e-7
    into = np.bincount(roots[inward], weights=x[inward], minlength=n)
    out = np.bincount(roots[~inward], weights=x[~inward], minlength=n)
    assert (loads @ x > cap).any() and not np.allclose(into, out, rtol=1e-12, atol=0)
    got = gk._feasible(x, loads, cap, inward, roots, n)
    assert np.all(loads @ got <= cap * (1 + 1e-15))
    into = np.bincount(roots[inward], weights=got[inward], minlength=n)
    out = np.bincount(roots[~inward], weights=got[~inward], minlength=n)
    assert into == pytest.approx(out, rel=1e-12, abs=0)
    assert np.all(got <= x) and got.sum() > 0
