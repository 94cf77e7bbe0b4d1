"""The probe by hosts: leaders between hosts, concurrent rounds, the trust test and
the group tests, on small simulated clusters (no mpiexec), plus its pure parts."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from horotopo.generate import generate
from horotopo.probe import ProbeConfig, circle_rounds, probe
from horotopo.probe.group import TAG_BLOCK, GroupTransport
from horotopo.probe.hostinfer import (alone_estimates, generated_hosts, group_flows,
                                      host_groups, host_layout)
from horotopo.topology import from_dict

from loop_transport import run_ranks


# ---- pure parts ------------------------------------------------------------------------------

def test_host_layout_groups_ranks_by_name_with_the_lowest_rank_leading():
    layout = host_layout(["b", "a", "b", "c", "a"])
    assert layout.names == ("b", "a", "c")
    assert layout.members == ((0, 2), (1, 4), (3,))
    assert layout.leaders == (0, 1, 3)
    assert layout.host_of == (0, 1, 0, 2, 1)


def test_generated_hosts_name_a_gpu_rank_by_its_host_switch():
    doc = generate("racks:hosts_per_rack=2,gpus=3", 7)
    assert generated_hosts(doc) == ["r0h0"] * 3 + ["r0h1"] * 3 + ["r1h0"]
    single = generate("racks:hosts_per_rack=2", 3)  # one rank per host: the rank is the host
    assert generated_hosts(single) == single["ranks"]


@pytest.mark.parametrize("n", [2, 3, 8, 13, 64, 129])
def test_circle_rounds_over_hosts_are_disjoint_and_cover_every_pair_once(n):
    rounds = circle_rounds(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    for pairs in rounds:
        ends = [v for p in pairs for v in p]
        assert len(ends) == len(set(ends))  # disjoint: each host in one pair per round
    every = sorted(p for r in rounds for p in r)
    assert every == list(itertools.combinations(range(n), 2))


def _racks_concurrent(racks, per, nic=10.0, uplink=10.0, slow=(), oversub=None):
    """Concurrent figures of circle rounds over racks of ``per`` hosts: a pair inside a rack
    gets its NICs' rate; a pair across racks shares each uplink evenly with the round's other
    flows (the hosts in ``slow`` have NICs at a quarter). ``oversub``: each rack's uplink is
    its NICs' sum over it, as the generator's racks have (else ``uplink`` for every rack)."""
    h = racks * per
    rack = [x // per for x in range(h)]
    nics = [nic / 4 if x in slow else nic for x in range(h)]
    ups = [uplink if oversub is None else
           sum(v for x, v in enumerate(nics) if rack[x] == r) / oversub for r in range(racks)]
    c = np.full((h, h), np.nan)
    for pairs in circle_rounds(h):
        for flows in ([(a, b) for a, b in pairs], [(b, a) for a, b in pairs]):
            out = {r: sum(rack[a] == r != rack[b] for a, b in flows) for r in range(racks)}
            inn = {r: sum(rack[b] == r != rack[a] for a, b in flows) for r in range(racks)}
            for a, b in flows:
                c[a, b] = min(nics[a], nics[b]) if rack[a] == rack[b] else min(
                    nics[a], nics[b], ups[rack[a]] / out[rack[a]], ups[rack[b]] / inn[rack[b]])
    return c


def test_host_groups_find_racks_behind_oversubscribed_uplinks():
    c = _racks_concurrent(racks=8, per=4)
    assert host_groups(c, 0.2) == [list(range(k, k + 4)) for k in range(0, 32, 4)]


def test_host_groups_place_slow_nics_with_their_racks():
    # a slow NIC keeps its low rate through a loaded uplink, so it is kept with hosts of
    # other racks too; the racks must not merge through it
    slow = (4, 8, 11, 13)
    c = _racks_concurrent(racks=4, per=4, uplink=8.0, slow=slow)
    groups = host_groups(c, 0.2)
    # here every share an uplink leaves exceeds a slow NIC: nothing places the slow hosts,
    # and they stay groups of their own; the fast hosts of each rack are one group
    assert groups == sorted([[x for x in range(k, k + 4) if x not in slow]
                             for k in range(0, 16, 4)] + [[x] for x in slow])


def test_host_groups_keep_racks_whole_where_uplink_shares_come_near_the_slow_nics():
    # Uplinks at a quarter of their racks' NICs leave a fast host's flow about what a slow NIC
    # (a quarter) carries, so a slow NIC keeps or loses its rate by chance; counted alike with
    # the fast hosts' pairs, a fast host's chance partners among the slow NICs outnumbered its
    # rack mates: rack 5 fell into two groups, and rack 0's group took rack 1's slow hosts
    slow = (2, 5, 6, 9, 13, 20, 21, 26)
    c = _racks_concurrent(racks=8, per=4, slow=slow, oversub=4)
    groups = host_groups(c, 0.2)
    for g in groups:
        assert len({x // 4 for x in g}) == 1, groups  # no group spans two racks
    for r in range(8):
        fast = [x for x in range(4 * r, 4 * r + 4) if x not in slow]
        assert fast in groups or any(set(fast) < set(g) for g in groups), (r, groups)


def test_host_groups_keep_a_non_blocking_network_whole():
    c = _racks_concurrent(racks=4, per=4, uplink=40.0)
    assert host_groups(c, 0.2) == [list(range(16))]


def test_group_flows_spread_over_the_other_groups():
    groups = [[0, 1, 2], [3, 4], [5, 6]]
    assert group_flows(groups, 0, True) == [(0, 3), (1, 5), (2, 4)]
    assert group_flows(groups, 1, False) == [(0, 3), (5, 4)]
    assert group_flows([[0], [1, 2]], 0, True) == []  # one flow is its pair, not a test
    # the far ends fastest first: host 5's slow NIC would cap its flow below the link's share
    speed = [10.0, 10.0, 10.0, 10.0, 10.0, 2.5, 10.0]
    assert group_flows(groups, 0, True, speed) == [(0, 3), (1, 6), (2, 4)]


def test_alone_estimates_lift_only_the_pairs_a_shared_link_covers():
    c = _racks_concurrent(racks=2, per=2, uplink=5.0)
    groups = [[0, 1], [2, 3]]
    shared = [((0, 1), (2, 3), 5.0, "up"), ((2, 3), (0, 1), 5.0, "down")]
    est = alone_estimates(c, groups, shared, {(0, 1): 9.0})
    assert est[0, 2] == pytest.approx(5.0) and est[3, 1] == pytest.approx(5.0)
    assert c[0, 2] < 5.0  # they read lower in their rounds
    assert est[0, 1] == 9.0  # measured alone wins
    assert est[1, 0] == c[1, 0] == 10.0  # not covered: the concurrent figure stands
    untouched = alone_estimates(c, groups, [], {})
    assert np.array_equal(np.isnan(untouched), np.isnan(c))
    assert np.nanmax(np.abs(untouched - c)) == 0


@pytest.mark.parametrize("members", [[0], [1, 3], [0, 2, 4], [4, 0, 1, 3, 2]])
def test_group_transport_allreduce_runs_between_its_members_only(members):
    def body(t):
        base = t.alloc_tags(TAG_BLOCK)
        if t.rank not in members:
            return None
        g = GroupTransport(t, members, base)
        v = np.array([float(t.rank), -float(t.rank)])
        g.allreduce_control(v, "sum", 5.0)
        w = np.array([float(g.rank)])
        g.allreduce_control(w, "max", 5.0)
        return v.tolist(), w.tolist(), g.rank, g.size

    out = run_ranks(5, body)
    for r in range(5):
        if r in members:
            assert out[r] == ([sum(members), -sum(members)], [len(members) - 1],
                              members.index(r), len(members))
        else:
            assert out[r] is None


def test_probe_config_scheme_is_checked_and_auto_switches_above_16_ranks():
    cfg = ProbeConfig.for_mode("quick")
    assert cfg.scheme_for(16) == "pairs" and cfg.scheme_for(17) == "hosts"
    assert ProbeConfig.for_mode("quick", scheme="hosts").scheme_for(4) == "hosts"
    with pytest.raises(ValueError, match="scheme"):
        ProbeConfig.for_mode("quick", scheme="leaders")


# ---- over the simulated transport ------------------------------------------------------------

simulated = pytest.importorskip("horotopo.transport.simulated")
try:
    simulated.load_simgrid()
    HAVE_SIMGRID = True
except simulated.SimulatorMissing:
    HAVE_SIMGRID = False
needs_simgrid = pytest.mark.skipif(not HAVE_SIMGRID, reason="SimGrid is not installed")


class Recording(GroupTransport):
    """The whole world as a group, noting every message this rank sends (world rank, bytes)."""

    def __init__(self, inner):
        # room for the probe's own two blocks
        super().__init__(inner, range(inner.size), inner.alloc_tags(4 * TAG_BLOCK), 4 * TAG_BLOCK)
        self.sent = []

    def isend(self, buf, dest, tag):
        self.sent.append((int(dest), int(np.asarray(buf).nbytes)))
        return super().isend(buf, dest, tag)


def _probe_sim(spec, n, **overrides):
    """Run the probe by hosts on the generated cluster; (rank 0's document, declared topology,
    every rank's sends)."""
    from horotopo.simulation import SimCosts
    from horotopo.simulation.runner import run_simulated
    doc = generate(spec, n)
    topo = from_dict(doc)
    hosts = generated_hosts(doc)
    # The probe's receives land in place: no per-byte reduction cost (see probe_scale.py).
    costs = SimCosts(simulated.DEFAULT_COSTS.per_message_s, 0.0)

    def body(t):
        rec = Recording(t)
        with t.true_size():
            got = probe(rec, "quick", hosts=hosts, scheme="hosts", **overrides)
        return got, rec.sent

    sim = run_simulated(topo, body, costs=costs, timeout_s=120)
    return sim.results[0][0], topo, hosts, [r[1] for r in sim.results], sim.results


def _gbps(topo, i, j):
    return topo.pair_capacity_Bps(i, j) * 8 / 1e9


@needs_simgrid
def test_shared_uplinks_are_detected_located_and_in_the_document():
    # 3 racks x 2 hosts x 2 GPUs; uplinks of 2 x 10 / 4 = 5 gbps
    doc, topo, hosts, sent, results = _probe_sim("racks:hosts_per_rack=2,gpus=2,oversub=4", 12)
    assert all(r[0] is None for r in results[1:])  # only rank 0 assembles the document
    info = doc["probe"]
    assert info["scheme"] == "hosts" and not info["trusted"]
    assert info["host_groups"] == [[0, 1], [2, 3], [4, 5]]
    found = {(tuple(s["from"]), tuple(s["to"])): s["gbps"] for s in info["shared_hosts"]}
    for rack in ((0, 1), (2, 3), (4, 5)):
        rest = tuple(x for x in range(6) if x not in rack)
        for key in ((rack, rest), (rest, rack)):
            assert found[key] == pytest.approx(5.0, rel=0.15)
    model = from_dict(doc)  # the planner's view: each uplink a resource over its ranks' pairs
    up = [r for r, name in enumerate(model.resources) if name == "out of hosts 0-1"]
    assert len(up) == 1 and model.capacity_Bps[up[0]] * 8 / 1e9 == pytest.approx(5.0, rel=0.15)
    assert all(up[0] in model.routes[i][j] for i in (0, 1, 2, 3) for j in range(4, 12))
    assert not any(up[0] in model.routes[i][j] for i in (0, 1) for j in (2, 3))
    for i in range(12):
        for j in range(12):
            if i != j and hosts[i] != hosts[j]:
                bw = doc["bandwidth_gbps"][i][j]
                assert bw == pytest.approx(_gbps(topo, i, j), rel=0.15), (i, j)


@needs_simgrid
def test_only_host_leaders_move_data_between_hosts():
    doc, topo, hosts, sent, _ = _probe_sim("racks:hosts_per_rack=2,gpus=3,oversub=1", 12)
    leaders = {0, 3, 6, 9}
    for rank, messages in enumerate(sent):
        big = [(dest, nbytes) for dest, nbytes in messages if nbytes >= 4096]
        assert big, f"rank {rank} measured nothing"
        for dest, _ in big:
            if hosts[dest] != hosts[rank]:
                assert rank in leaders and dest in leaders, (rank, dest)
    info = doc["probe"]
    assert info["trusted"] and info["shared_hosts"] == []  # non-blocking: nothing shared
    assert info["rounds"] == 3  # the circle method over 4 leaders
    local = doc["bandwidth_gbps"][0][1]  # two GPUs of one host: the local fabric
    assert local == pytest.approx(_gbps(topo, 0, 1), rel=0.15)


@needs_simgrid
def test_sites_wan_link_is_found():
    doc, topo, hosts, _, _ = _probe_sim("sites:hosts_per_rack=2,wan_gbps=2", 8,
                                        max_bytes=1 << 20)
    info = doc["probe"]
    assert info["host_groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    found = {(tuple(s["from"]), tuple(s["to"])): s["gbps"] for s in info["shared_hosts"]}
    assert found[((0, 1, 2, 3), (4, 5, 6, 7))] == pytest.approx(2.0, rel=0.15)
    assert found[((4, 5, 6, 7), (0, 1, 2, 3))] == pytest.approx(2.0, rel=0.15)


@needs_simgrid
def test_probe_cost_grows_linearly_in_the_hosts():
    tests = {}
    for h in (4, 8, 16):
        doc, *_ = _probe_sim("racks:hosts_per_rack=4", h, max_bytes=256 << 10)
        info = doc["probe"]
        assert info["rounds"] == h - 1
        tests[h] = info["tests"]
    # two tests per round, the fixed sample alone, two per group: about linear
    for h in (4, 8, 16):
        assert tests[h] <= 2 * (h - 1) + 8 + 2 * (h // 4)
    assert tests[16] - tests[8] <= 2 * (tests[8] - tests[4]) + 4
