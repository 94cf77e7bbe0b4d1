"""The cluster generators (horotopo.generate): rank, switch and link counts, rates, where the
ranks share a NIC, and the NAME:key=value specs of `horotopo simulate`."""
import pytest

from horotopo.generate import (GENERATORS, describe_generators, fat_tree, generate, parse_spec,
                               rack_cluster, two_sites)
from horotopo.plan import make_plan
from horotopo.topology import GBPS_TO_BPS, from_dict


def rates(doc, end):
    """The rates of the links with ``end`` at one end."""
    return sorted(link["gbps"] for link in doc["links"] if end in link["ends"])


def test_racks_of_multi_gpu_hosts_share_the_nic_and_oversubscribe_the_uplinks():
    doc = rack_cluster(64, hosts_per_rack=4, gpus=8, oversub=4)
    topo = from_dict(doc)
    assert topo.n == 64 and topo.kind == "declared"
    # 8 hosts in 2 racks: a spine, 2 ToRs, 8 host switches; 64 local links, 8 NICs, 2 uplinks
    assert len(doc["switches"]) == 11 and len(doc["links"]) == 74
    assert rates(doc, "tor0") == [10.0] * 4 + [10.0]  # four 10 gbps NICs, uplink 40 / 4
    assert rates(doc, "r0h0") == [10.0] + [100.0] * 8
    # ranks are numbered host by host; two GPUs of one host talk over the local fabric only,
    # two GPUs of different hosts cross both hosts' NICs
    assert doc["ranks"][:9] == [f"r0h0g{g}" for g in range(8)] + ["r0h1g0"]
    assert topo.pair_capacity_Bps(0, 7) == pytest.approx(100 * GBPS_TO_BPS)
    assert topo.pair_capacity_Bps(0, 8) == pytest.approx(10 * GBPS_TO_BPS)
    nic = topo.resources.index("r0h0->tor0")
    assert all(nic in topo.routes[g][j] for g in range(8) for j in range(8, 64))


def test_a_fraction_of_slow_nics_and_a_partial_last_host():
    doc = rack_cluster(20, hosts_per_rack=2, gpus=8, slow=0.34, slow_gbps=1.0, seed=3)
    nics = [link["gbps"] for link in doc["links"]
            if link["ends"][1].startswith("tor")]
    assert sorted(nics) == [1.0, 10.0, 10.0]  # round(0.34 * 3 hosts) = 1 slow NIC
    assert from_dict(doc).n == 20
    assert sum(1 for r in doc["ranks"] if r.startswith("r1h0")) == 4  # 8 + 8 + 4
    assert rack_cluster(20, hosts_per_rack=2, gpus=8, slow=0.34, seed=3) == \
        rack_cluster(20, hosts_per_rack=2, gpus=8, slow=0.34, seed=3)


def test_one_rank_per_host_puts_the_rank_on_the_host():
    doc = rack_cluster(6, hosts_per_rack=3)
    assert doc["ranks"] == ["r0h0", "r0h1", "r0h2", "r1h0", "r1h1", "r1h2"]
    assert len(doc["links"]) == 6 + 2 and doc["switches"] == ["spine", "tor0", "tor1"]


def test_fat_tree_leaf_uplinks_are_full_bisection_by_default():
    doc = fat_tree(32, hosts_per_leaf=8, spines=4)
    topo = from_dict(doc)
    assert topo.n == 32 and len(doc["switches"]) == 1 + 4
    # four spines at 8 * 10 / 4 gbps, aggregated: one 80 gbps link per leaf
    assert rates(doc, "spine") == [80.0] * 4
    assert rates(fat_tree(32, hosts_per_leaf=8, spines=4, spine_gbps=5.0), "spine") == [20.0] * 4


def test_two_sites_join_their_spines_by_the_wan_link():
    doc = two_sites(10, wan_gbps=0.5, wan_latency_ms=20.0)
    topo = from_dict(doc)
    assert topo.n == 10
    wan = [link for link in doc["links"] if link["ends"] == ["a-spine", "b-spine"]]
    assert wan == [{"ends": ["a-spine", "b-spine"], "gbps": 0.5, "latency_ms": 20.0}]
    assert topo.pair_capacity_Bps(0, 9) == pytest.approx(0.5 * GBPS_TO_BPS)
    assert topo.pair_capacity_Bps(0, 4) == pytest.approx(10 * GBPS_TO_BPS)


def test_specs_name_a_generator_and_its_parameters():
    assert parse_spec("racks:hosts_per_rack=4,gpus=8,oversub=4.5") == \
        ("racks", {"hosts_per_rack": 4, "gpus": 8, "oversub": 4.5})
    assert parse_spec("sites") == ("sites", {})
    assert from_dict(generate("fattree:gpus=4", 16)).n == 16
    with pytest.raises(ValueError, match="generators: racks, fattree, sites"):
        parse_spec("torus:k=3")
    with pytest.raises(ValueError, match="'gpu=8' is not KEY=VALUE with KEY one of"):
        parse_spec("racks:gpu=8")
    with pytest.raises(ValueError, match="oversub must be positive"):
        generate("racks:oversub=0", 8)
    for name in GENERATORS:
        assert f"  {name}: " in describe_generators()


def test_the_planner_beats_ring_on_an_oversubscribed_multi_gpu_cluster():
    topo = from_dict(rack_cluster(16, hosts_per_rack=2, gpus=4, oversub=4))
    plan = make_plan(topo)
    assert plan.throughput_Bps >= plan.ring_Bps
