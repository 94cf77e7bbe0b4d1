"""Plans made from a measured network: as good as the plan of the network as declared.

A probe reads every capacity a few percent low (its messages pay software costs) and some much
lower: a fast NIC whose rack mates are slow and whose uplink is narrow cannot be filled from
the other hosts, so the probe reads it at what it could fill. On the racks generator with slow
NICs at 1024 ranks that NIC keeps every single host-level tree at 0.917 of the bound, and the
certified packing mixes one leading tree with dozens of small ones to reach it. The plan must
not let fair sharing hand the small ones a share of the links the leading one needs.
"""
from __future__ import annotations

import copy

import pytest

from horotopo.generate import generate
from horotopo.packing.bottleneck import bottleneck_pair
from horotopo.packing.hierarchy import HostModel
from horotopo.packing.model import TreeRate
from horotopo.packing.sharing import fair_subset
from horotopo.plan import make_plan, modelled_rate_on
from horotopo.topology import from_dict

MiB = 1 << 20
#: Three of rack 0's four NICs at 2.5 gbps, its uplink at 4.375, every other NIC at 10.
SLOW_RACKS = "racks:hosts_per_rack=4,gpus=4,oversub=4,slow=0.25"
#: How a probe of the simulated 1024-rank racks read them against their declared rates: the
#: links between hosts 0.967, the links inside a host 0.878, and a fast NIC boxed in by slow
#: rack mates and a 4.375 gbps uplink 0.886.
BETWEEN_HOSTS, INSIDE_HOSTS, BOXED_NIC = 0.967, 0.878, 0.886


def measured_like(doc: dict, boxed: str) -> dict:
    """``doc`` with its capacities as a probe reads them; ``boxed`` names the boxed-in NIC's
    host."""
    out = copy.deepcopy(doc)
    hosts = {h.rsplit("g", 1)[0] for h in out["ranks"]}
    for link in out["links"]:
        a, b = link["ends"]
        local = b in hosts  # a rank on its host's switch
        link["gbps"] *= (INSIDE_HOSTS if local else BOXED_NIC if a == boxed
                         else BETWEEN_HOSTS)
    return out


def test_the_leading_host_tree_keeps_its_rate_beside_many_small_ones():
    """One host-level tree at 0.7 of its rate alone and six host chains at 0.05 each, as the
    packing's LP gives them (56 rank-level trees): run together, every chain's flows take an
    equal share of the NICs the leading tree needs. The trees the LP gives most, kept alone,
    get their whole rate; removing the others a few at a time (the search without the LP's
    rates) stays below half of it."""
    topo = from_dict(measured_like(generate("racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25",
                                            128), boxed=""))
    model = HostModel(topo)
    lead = bottleneck_pair(model, 0)
    alone = model.max_rate(model.load(0, lead, lead))
    h_count = model.n
    columns = [TreeRate(0, lead, lead, 0.7 * alone)]
    for stride in (1, 3, 5, 7, 9, 11):
        order = [stride * i % h_count for i in range(h_count)]
        parent = [-1] * h_count
        for child, up in zip(order[1:], order[:-1]):
            parent[child] = up
        columns.append(TreeRate(order[0], tuple(parent), tuple(parent), 0.05 * alone))
    trees = model.expand(columns)
    assert len(trees) == 56
    keep, rates, record = fair_subset(topo, trees)
    assert sorted(keep) == list(range(8))  # the leading tree's eight channels
    assert rates.sum() == pytest.approx(alone, rel=1e-9)
    assert record["all_fair_Bps"] < 0.5 * alone
    _, blind, _ = fair_subset(topo, [(t.root, t.reduce_parent, t.bcast_parent) for t in trees])
    assert blind.sum() < 0.5 * alone


@pytest.mark.slow
def test_a_plan_from_measured_racks_rates_as_the_declared_plan_on_both_networks():
    """racks with slow NICs at 128 ranks, read as a probe reads them (rack 0's one fast NIC
    boxed in at 0.886): the plan made from those figures rates as the declared plan does, on
    the measured network and on the declared one. The packing's mix of five host trees, of
    which fair sharing kept 15 of the 20 channels, rated 0.82 of the declared plan on the
    declared network and 0.90 on the measured one."""
    doc = generate(SLOW_RACKS, 128)
    declared = from_dict(doc)
    measured = from_dict(measured_like(doc, boxed="r0h3"))
    ours = make_plan(declared, size=64 * MiB)
    probed = make_plan(measured, size=64 * MiB)
    for network in (declared, measured):
        assert modelled_rate_on(probed, network) >= 0.99 * modelled_rate_on(ours, network)
