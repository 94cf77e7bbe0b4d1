"""The bottleneck-greedy seed pair (horotopo.packing.bottleneck) on racks with slow NICs: slow
hosts as leaves, the pair alone at the machine cut's bound, shallow trees, and the known bound
checked like every other."""
import numpy as np
import pytest

from horotopo.generate import generate
from horotopo.packing import gk
from horotopo.packing.bottleneck import bottleneck_pair, seed_pairs
from horotopo.packing.certificate import CertificateError
from horotopo.packing.hierarchy import HostModel, cut_point, pack_hierarchical
from horotopo.packing.model import hops_to_root, validate_arborescence
from horotopo.topology import from_dict

SLOW_RACKS = "racks:hosts_per_rack=8,gpus=8,oversub=4,slow=0.25"
SLOW_BPS = 0.25 * 10e9 / 8  # the slow NICs' rate, bytes/s


@pytest.fixture(scope="module")
def racks():
    """32 hosts of 8 ranks in 4 racks, 8 of the hosts with a NIC at a quarter rate."""
    return from_dict(generate(SLOW_RACKS, 256))


def _slow_hosts(model):
    """Machines whose cut (every arc out of them) crosses a resource at the slow rate."""
    w = model.arc_costs(1.0 / model.capacity)
    return np.flatnonzero(np.min(np.where(np.eye(model.n, dtype=bool), np.inf, w), axis=1)
                          > 1.5 / (10e9 / 8) * 2)


def test_seed_pair_meets_the_cut_bound_with_slow_hosts_as_leaves(racks):
    model = HostModel(racks)
    bound, _, _ = cut_point(model)
    assert bound == pytest.approx(SLOW_BPS, rel=1e-12)
    (inward, root, parent), (outward, root_b, parent_b) = seed_pairs(model, 1, bound)
    assert inward and not outward and root == root_b and parent == parent_b
    assert validate_arborescence(parent, root, model.n) is None
    slow = _slow_hosts(model)
    assert len(slow) == 8
    has_child = np.zeros(model.n, dtype=bool)
    has_child[[p for p in parent if p >= 0]] = True
    assert not has_child[slow].any() and root not in slow
    # alone, the pair runs at the bound: every slow NIC crossed once each way, no more
    assert model.max_rate(model.load(root, parent, parent)) == pytest.approx(bound, rel=1e-9)
    # within the target every arc is free, so the tree fills level by level
    assert hops_to_root(parent).max() <= 4


def test_without_a_target_the_tree_is_still_an_arborescence(racks):
    model = HostModel(racks)
    parent = bottleneck_pair(model, 3)
    assert validate_arborescence(parent, 3, model.n) is None
    assert model.max_rate(model.load(3, parent, parent)) == pytest.approx(SLOW_BPS, rel=1e-9)


def test_pack_hierarchical_certifies_zero_gap_from_the_seed(racks):
    packing = pack_hierarchical(racks, with_flat_bound=False)
    assert packing.throughput == pytest.approx(SLOW_BPS, rel=1e-9)
    assert packing.upper_bound == pytest.approx(SLOW_BPS, rel=1e-12)
    assert "slowest machine's cut" in packing.bound_phase


def test_a_known_bound_below_the_seeds_raises(racks):
    model = HostModel(racks)
    bound, phase, dual = cut_point(model)
    seeds = seed_pairs(model, 1, bound)
    with pytest.raises(CertificateError, match="slowest machine's cut"):
        gk.pack(racks, model=model, seeds=seeds, known_bound=(0.9 * bound, phase, dual),
                lazy_rows=True)


def test_flat_model_seed_crosses_each_uplink_once():
    from horotopo.generate import racks as racks_doc
    from horotopo.packing.model import ArcModel, ring_rate
    model = ArcModel(from_dict(racks_doc([3, 3])))
    parent = bottleneck_pair(model, 0)
    assert validate_arborescence(parent, 0, model.n) is None
    # the pair crosses each rack's uplink once each way: it runs at the uplink's rate, 5x the
    # ring in (interleaved) rank order
    assert model.max_rate(model.load(0, parent, parent)) == pytest.approx(0.25e9 / 8, rel=1e-12)
    assert ring_rate(model) == pytest.approx(0.25e9 / 8 / 5, rel=1e-9)
