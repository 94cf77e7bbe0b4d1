"""The group tests of the probe by hosts on racks with slow NICs: every flow of a
rack's test crosses that rack's uplink.

At 256 ranks (32 hosts of 8) on ``racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25``, the
slow NIC of r1h3 (host 7) kept its rate with everyone, so it stayed a group of its own, and
the test of rack 1's uplink (hosts 4-6) sent one of its three flows to it: 5 -> 7, inside
rack 1. That flow's 2.42 gbps never crossed the uplink, yet counted in the aggregate, and the
uplink of 8.125 gbps read 9.38.
"""
from __future__ import annotations

from typing import Dict, List

from horotopo.generate import generate
from horotopo.probe.hostinfer import generated_hosts, group_flows

# The layout of that run with one rank per host: the same 32 hosts, the same slow NICs.
SPEC = "racks:hosts_per_rack=4,oversub=4,slow=0.25"
# The host groups the probe found in that run (rank 0's document, ``probe.host_groups``):
# slow NICs 7 (rack 1) and a 10 gbps host 31 (rack 7) alone.
GROUPS = [[0, 1, 2, 3], [4, 5, 6], [7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19],
          [20, 21, 22, 23], [24, 25, 26, 27], [28, 29, 30], [31]]


def _racks_and_nics(doc: Dict) -> tuple:
    """(each host's top-of-rack switch, each host's NIC gbps), hosts in rank order."""
    hosts = generated_hosts(doc)
    tor: Dict[str, str] = {}
    nic: Dict[str, float] = {}
    for link in doc["links"]:
        a, b = link["ends"]
        if a in hosts and "tor" in b:
            tor[a], nic[a] = b, float(link["gbps"])
    return [tor[h] for h in hosts], [nic[h] for h in hosts]


def test_every_flow_of_a_rack_test_crosses_the_racks_uplink() -> None:
    doc = generate(SPEC, 32)
    tor, nic = _racks_and_nics(doc)
    assert len(tor) == 32 and tor[4:8] == ["tor1"] * 4  # the fixture's layout
    assert nic[7] == 2.5 and nic[4:7] == [10.0] * 3
    for g, members in enumerate(GROUPS):
        for outgoing in (True, False):
            flows = group_flows(GROUPS, g, outgoing, nic)
            crossing = [(a, b) for a, b in flows if tor[a] != tor[b]]
            assert crossing == flows, (g, outgoing, flows)


def test_hosts_alone_in_their_group_are_far_ends_last() -> None:
    # placed hosts first, round-robin over their groups; host 5 (alone) only when needed
    assert group_flows([[0, 1, 2], [3, 4], [5]], 0, True) == [(0, 3), (1, 4), (2, 5)]
    assert group_flows([[0, 1], [2], [3, 4]], 0, False) == [(3, 0), (4, 1)]
    # nothing but hosts alone: they are all there is
    assert group_flows([[0, 1], [2], [3]], 0, True) == [(0, 2), (1, 3)]


def test_rack_one_test_no_longer_stays_inside_rack_one() -> None:
    flows: List = group_flows(GROUPS, 1, True, [10.0] * 32)
    assert all(b not in (4, 5, 6, 7) for _, b in flows), flows
