"""Adaptivity in the simulation: a rack's uplink slowed to a quarter between two
calls must be detected by the adaptive engine's own detector, re-probed at host level and
re-planned over hosts, and the new plan must run within 15% of the plan of the truly slowed
network. 16 ranks on 4 hosts (4 racks of one host), 8 MiB calls: a few seconds of wall time."""
import pytest

from horotopo.adapt.policy import host_pairs, refresh_capacities, split_pairs
from horotopo.adapt.slowdown import (SlowdownScenario, run_slowdown, series_lines, slowed,
                                     summarize_slowdown)
from horotopo.adapt.trial import Trial
from horotopo.generate import generate
from horotopo.plan import plan_from_trees
from horotopo.topology import from_dict
from horotopo.transport.simulated import SimulatorMissing, load_simgrid

try:
    load_simgrid()
except SimulatorMissing as _exc:
    pytest.skip(str(_exc), allow_module_level=True)

# 4 racks of one host of 4 ranks; rack 1's uplink slows (the scenario's default links)
CLUSTER = "racks:hosts_per_rack=1,gpus=4,oversub=2"
# float32 elements a rank really reduces: the rest of each 8 MiB call is scale, as
# benchmarks/adapt_sim.py simulates 16 ranks
ELEMENTS = 1 << 16


def _cluster():
    return from_dict(generate(CLUSTER, 16))


def test_host_pairs_keep_one_pair_per_pair_of_machines():
    machine_of = [0, 0, 1, 1, 2]
    pairs = [(0, 2), (1, 3), (2, 0), (0, 1), (1, 0), (1, 4), (3, 4)]
    # (1, 3) and (3, 4) repeat machine pairs (0, 1) and (1, 2); pairs inside machine 0 stay
    assert host_pairs(pairs, machine_of) == [(0, 2), (2, 0), (0, 1), (1, 0), (1, 4), (3, 4)]
    assert host_pairs([], machine_of) == []


def test_refresh_blames_the_link_that_explains_every_degraded_pair():
    # racks of 2 single-rank hosts; rack 1's downlink at a quarter: four pairs into rack 1
    # read low, each route crossing a NIC, an uplink, the downlink and a NIC
    topo = from_dict(generate("racks:hosts_per_rack=2,oversub=2", 8))
    rack = {r: topo.hosts[r][:2] for r in range(8)}
    into = [r for r in range(8) if rack[r] == "r1"]
    slow = topo.capacity_Bps[topo.resources.index("spine->tor1")] / 4
    senders = [next(r for r in range(8) if rack[r] == k) for k in ("r0", "r2", "r3")]
    probed = {(senders[0], into[0]): slow, (senders[1], into[0]): slow,
              (senders[2], into[1]): slow, (senders[0], into[1]): slow}
    caps = refresh_capacities(topo, probed, threshold=0.3)
    lowered = [name for name, c, t in zip(topo.resources, caps, topo.capacity_Bps) if c != t]
    assert lowered == ["spine->tor1"]
    assert caps[topo.resources.index("spine->tor1")] == slow
    # the second round of the re-probe: pairs sharing each end of a degraded route
    a, b = next(iter(probed))
    extra = split_pairs(topo, list(range(8)), [(a, b)], [(a, b)])
    route = set(topo.routes[a][b])
    # two that split the route, then one inside each end's rack (the NIC without the rack link)
    assert len(extra) == 4 and extra[0][0] == a and extra[1][1] == b, extra
    assert [len(route & set(topo.routes[s][d])) for s, d in extra[2:]] == [1, 1]
    for s, d in extra[:2]:  # a third rack: it shares one half of the route (NIC and rack link)
        assert len(route & set(topo.routes[s][d])) == 2
        assert rack[d if s == a else s] not in (rack[a], rack[b])


def test_a_slowed_uplink_is_detected_and_the_replan_recovers():
    sc = SlowdownScenario(size=8 << 20, chunk=256 << 10, calls=10, degrade_at=4,
                          fresh_calls=2, fresh=False, init="declared", max_wall_s=300)
    # 256 KiB chunks: the plans are made for the 8 MiB they are timed at, and at 1 MiB chunks
    # the first plan runs the slowed network about as fast as its re-plan (so the trial drops
    # the re-plan); at 256 KiB the re-plan is clearly faster.
    topo = _cluster()
    res = run_slowdown(topo, sc, elements=ELEMENTS)
    s = summarize_slowdown(res, sc.tolerance)
    assert s["wrong"] == 0
    assert s["replans_before"] == 0, res["events"]
    # detected from the engine's own call times after `consecutive` slow calls, no later
    assert s["calls_to_detect"] == sc.consecutive, series_lines(res)
    assert s["slowed_s"] > 1.3 * s["before_s"], s
    [event] = res["events"]
    assert event["switched"] and event["new_digest"] != event["old_digest"]
    # host level: one pair per pair of hosts, at most 4 (the hosts) per round, two rounds
    assert 0 < len(event["suspects"]) <= 2 * 4
    hosts = [topo.hosts[r][:4] for r in range(16)]
    keys = [(hosts[a], hosts[b]) for a, b in event["suspects"] if hosts[a] != hosts[b]]
    assert len(keys) == len(set(keys)), event["suspects"]
    # the re-probe blamed the slowed uplink (both directions) and nothing of the other rack
    caps = dict(zip(topo.resources, res["final_model_Bps"]))
    truth = dict(zip(topo.resources, topo.capacity_Bps))
    for name in ("tor1->spine", "spine->tor1"):
        assert caps[name] == pytest.approx(truth[name] * sc.factor, rel=0.15), name
    # Nothing else lowered but rack 1's host (its NIC is in series with the uplink for every
    # pair: one host per rack) and local links (the simulated software cost, 0.47 ns a byte,
    # holds a pair inside a host to about 16 gbps, under the 100 gbps declared; still above
    # the NICs' 10).
    for name, cap in caps.items():
        if cap != truth[name] and "tor1" not in name and "r1h0" not in name.replace(
                "r1h0g", "local"):
            assert truth[name] == 100 * 1.25e8 and cap > 10 * 1.25e8, (name, cap)
    assert s["recovered_over_reference"] <= 1.15, s
    # on trial for calls 7-9, faster than the old plan's slow run: kept
    assert event["kept"] is True and event["decided_step"] == event["step"] + 3, event
    assert event["trial_new"] < event["trial_old"], event
    assert s["ok"], s


def test_the_replan_keeps_the_plans_size_forced_forest_and_host_tree_bound():
    # The engine's re-plan once used the planner's defaults: the fusion threshold's size
    # (128 MiB) and the auto forest, so a plan made for 64 MiB over a forced host forest came
    # back as another forest (at 1024 ranks with 4 MiB chunks, 512 trees instead of 32). A
    # bound on host trees (4 hosts here: 4 host trees unbounded) must come back too.
    sc = SlowdownScenario(size=8 << 20, chunk=1 << 20, calls=8, degrade_at=3, fresh_calls=1,
                          fresh=False, reference=False, init="declared", forest="hosts",
                          trial=0, max_wall_s=300, max_host_trees=2)
    res = run_slowdown(_cluster(), sc, elements=ELEMENTS)
    [event] = res["events"]
    assert event["switched"], event
    for which in ("first", "final"):
        record = res["plans"][which]["planner"]["forest"]
        assert (record["chosen"], record.get("forced"), record["size"],
                record.get("max_host_trees")) == ("hosts", True, 8 << 20, 2), (which, record)
        # at most 2 host trees of 4 channels: the 2 rotations, or, where it is predicted
        # faster, the bottleneck pair alone (the re-plan after the uplink slowed takes it)
        hosts = record["hosts"]
        assert hosts["host_trees"] <= 2, (which, hosts)
        assert len(res["plans"][which]["trees"]) == hosts["host_trees"] * 4, which
    assert res["plans"]["first"]["planner"]["forest"]["hosts"]["host_trees"] == 2
    assert res["plans"]["final"]["digest"] != res["plans"]["first"]["digest"]


class _Plan:
    """A stand-in plan for the trial's verdict: predicts ``bytes / rate``."""

    def predict_time(self, nbytes, chunk_bytes=None):
        return nbytes / 1e9


def test_the_trial_keeps_a_new_plan_only_when_it_is_faster():
    old = [(10 ** 6, 0.004), (10 ** 6, 0.004), (4 * 10 ** 6, 0.016)]  # 4x the prediction
    faster = Trial(_Plan(), old, calls=2)
    assert not faster.add(4 * 10 ** 6, 0.010) and faster.add(10 ** 6, 0.003)
    assert faster.keep_new() and faster.new_s == pytest.approx(2.75)
    assert faster.old_s == pytest.approx(4.0)
    # sizes are compared on the old plan's prediction: 2x the size in 2x the time is a tie,
    # and a tie keeps the old plan
    tie = Trial(_Plan(), old, calls=1)
    tie.add(2 * 10 ** 6, 0.008)
    assert not tie.keep_new()
    with pytest.raises(ValueError, match="1 calls"):
        Trial(_Plan(), old, calls=1).keep_new()
    with pytest.raises(ValueError, match="old plan's timed calls"):
        Trial(_Plan(), [], calls=1)
    with pytest.raises(ValueError, match="at least one call"):
        Trial(_Plan(), old, calls=0)


def _zigzag(topo):
    """A worse re-plan: one chain that changes racks at every hop (rack k holds ranks
    4k..4k+3), so it crosses rack 1's slowed uplink and downlink four times each way."""
    order = [r for k in range(4) for r in range(k, topo.n, 4)]
    parent = [-1] * topo.n
    for a, b in zip(order, order[1:]):
        parent[b] = a
    return plan_from_trees(topo.n, [(order[0], parent, parent, 1e9)], chunk_bytes=1 << 20,
                           topology=topo)


def test_a_replan_slower_than_the_old_plan_is_dropped_after_its_trial():
    sc = SlowdownScenario(size=8 << 20, chunk=1 << 20, calls=12, degrade_at=4, fresh=False,
                          reference=False, init="declared", max_wall_s=300)
    topo = _cluster()
    res = run_slowdown(topo, sc, elements=ELEMENTS, planner=_zigzag)
    s = summarize_slowdown(res, sc.tolerance)
    series = res["series"]
    assert s["wrong"] == 0 and s["calls_to_detect"] == sc.consecutive, s
    [event] = res["events"]  # no second re-plan: the revert backs the detector off
    assert event["switched"] and event["kept"] is False, event
    assert event["decided_step"] == event["step"] + sc.trial
    old, new = series[0]["plan"], event["new_digest"][:8]
    ran = [c["plan"] for c in series]
    # calls 0-6 on the old plan, 7-9 on trial, then every rank back on the old plan
    assert ran == [old] * 7 + [new] * 3 + [old] * 2, ran
    assert res["final_digest"] == old
    assert s["rejected_plan_s"] > 1.2 * s["slowed_s"], s  # the zigzag was the slower plan
    assert s["recovered_s"] == pytest.approx(s["slowed_s"], rel=0.05), s
    # the refreshed model stays: the next re-plan starts from the slowed uplink
    caps = dict(zip(topo.resources, res["final_model_Bps"]))
    assert caps["tor1->spine"] < 0.5 * 10 * 1.25e8, caps["tor1->spine"]


def _racks_measured(racks: int = 3, hosts: int = 2) -> dict:
    """A measured model as the probe by hosts writes it: one rank per host, 10 gbps pairs,
    NICs, and each rack's uplink and downlink as shared groups, the downlinks listed first
    (the probe lists groups in the order its tests find them, not in path order)."""
    n = racks * hosts
    rack = [r // hosts for r in range(n)]
    pairs = [[i, j] for i in range(n) for j in range(n) if i != j and rack[i] != rack[j]]
    shared = [{"pairs": [p for p in pairs if rack[p[1]] == k], "gbps": 10.0,
               "label": f"down r{k}"} for k in range(racks)]
    shared += [{"pairs": [p for p in pairs if rack[p[0]] == k], "gbps": 10.0,
                "label": f"up r{k}"} for k in range(racks)]
    return {"name": "racks-measured", "ranks": [f"r{rack[r]}h{r % hosts}" for r in range(n)],
            "bandwidth_gbps": [[None if i == j else 10.0 for j in range(n)] for i in range(n)],
            "egress_gbps": [10.0] * n, "ingress_gbps": [10.0] * n, "shared": shared}


def test_the_split_needs_no_route_order_in_a_measured_model():
    # The 256-rank case: rack 1's uplink and downlink at a quarter, and the first round found
    # r0 -> r1 and r1 -> r2 degraded. The second round must clear rack 0's uplink and rack 2's
    # downlink; splitting the routes by their order (pair, egress, ingress, down, up) tested
    # "down r1 + up r0" together and blamed both ends of both pairs.
    topo = from_dict(_racks_measured())
    truth = list(topo.capacity_Bps)
    for name in ("up r1", "down r1"):
        truth[topo.resources.index(name)] /= 4

    def rate(i, j):  # a pair alone runs at its route's narrowest resource
        return min(truth[r] for r in topo.routes[i][j])

    first = {(0, 2): rate(0, 2), (2, 4): rate(2, 4)}
    extra = split_pairs(topo, list(range(topo.n)), list(first), list(first))
    probed = {**first, **{p: rate(*p) for p in extra}}
    caps = refresh_capacities(topo, probed, threshold=0.3)
    lowered = {name for name, c, t in zip(topo.resources, caps, topo.capacity_Bps) if c != t}
    # not rack 0's uplink nor rack 2's downlink, nor rack 1's host NIC (in series with
    # rack 1's links on both degraded routes; the pairs inside rack 1 clear it)
    assert lowered == {"up r1", "down r1"}, (lowered, extra)
    for name in lowered:
        assert caps[topo.resources.index(name)] == pytest.approx(truth[topo.resources.index(name)])
    assert len(extra) == 8, extra  # per degraded pair: 2 that split it, 2 that split those
    for k, (a, b) in enumerate(first):  # one pair from the sender, one to the receiver
        mine, theirs = extra[2 * k:2 * k + 2]
        assert mine[0] == a and theirs[1] == b, extra
        route = set(topo.routes[a][b])
        # each crosses part of the route, and not the same part
        parts = [route & set(topo.routes[s][d]) for s, d in (mine, theirs)]
        assert parts[0] and parts[1] and not parts[0] & parts[1], extra


def test_an_impossible_scenario_or_link_is_refused():
    with pytest.raises(ValueError, match="0 < degrade_at < calls"):
        SlowdownScenario(calls=4, degrade_at=4)
    with pytest.raises(ValueError, match="0 < factor <= 1"):
        SlowdownScenario(factor=0.0)
    with pytest.raises(ValueError, match="max_host_trees: need at least 1"):
        SlowdownScenario(max_host_trees=0)
    topo = _cluster()
    with pytest.raises(ValueError, match="has no resource 'tor9->spine'"):
        slowed(topo, ["tor9->spine"], 0.5)
    quarter = slowed(topo, ["tor1->spine"], 0.25)
    k = topo.resources.index("tor1->spine")
    assert quarter.capacity_Bps[k] == topo.capacity_Bps[k] * 0.25
    assert [c for i, c in enumerate(quarter.capacity_Bps) if i != k] == [
        c for i, c in enumerate(topo.capacity_Bps) if i != k]
