"""The batched critical-path profiles equal the one-tree walk (alphabeta.critical_profile of
each direction, merged), tree by tree: the oracle."""
import numpy as np
import pytest

from horotopo.generate import generate
from horotopo.packing import alphabeta as ab
from horotopo.packing import profiles
from horotopo.packing.hierarchy import HostModel
from horotopo.packing.model import TreeRate
from horotopo.topology import from_dict, measured_document


def _random_tree(rng, n, chainy):
    order = rng.permutation(n)
    parent = np.full(n, -1)
    for i in range(1, n):
        j = i - 1 if chainy and rng.random() < 0.7 else int(rng.integers(0, i))
        parent[order[i]] = order[j]
    return tuple(parent.tolist())


def _walked_profile(topology, reduce_parent, bcast_parent, chunk_bytes):
    groups = {}
    for parent, inward in ((reduce_parent, True), (bcast_parent, False)):
        for lat, inv, count in ab.critical_profile(topology, parent, inward, chunk_bytes,
                                                   costs=ab.ENGINE_COSTS):
            groups[(lat, inv)] = groups.get((lat, inv), 0) + count
    return tuple((lat, inv, count) for (lat, inv), count in sorted(groups.items()))


def _measured(rng, n):
    bw = [[None if i == j else float(rng.choice([1, 2, 5])) for j in range(n)] for i in range(n)]
    lat = [[0 if i == j else float(rng.choice([0.1, 0.2])) for j in range(n)] for i in range(n)]
    return from_dict(measured_document("m", [f"h{i // 2}" for i in range(n)], bw, lat))


@pytest.mark.parametrize("case", ["racks:hosts_per_rack=2,gpus=4,oversub=4,slow=0.25:64",
                                  "sites:gpus=2,wan_gbps=10:32", "measured:9"])
def test_batch_equals_tree_by_tree(case, monkeypatch):
    spec, n = case.rsplit(":", 1)
    rng = np.random.default_rng(len(case))
    topology = _measured(rng, int(n)) if spec == "measured" else from_dict(generate(spec,
                                                                                   int(n)))
    pairs = [(_random_tree(rng, topology.n, k % 2), _random_tree(rng, topology.n, k % 3 == 0))
             for k in range(30)]
    chunks = [65536 * (1 + k % 5) for k in range(30)]
    want = [_walked_profile(topology, a, b, c) for (a, b), c in zip(pairs, chunks)]
    # small batches too, so that the batching itself is exercised
    monkeypatch.setattr(profiles, "BATCH_ENTRIES", 5 * topology.n)
    assert profiles.tree_profiles(topology, pairs, chunks, ab.ENGINE_COSTS) == want


def test_hierarchical_expansion_and_single_rank():
    topology = from_dict(generate("fattree:hosts_per_leaf=2,spines=2,gpus=4", 32))
    model = HostModel(topology)
    rng = np.random.default_rng(3)
    host = []
    for k in range(3):
        a = _random_tree(rng, model.n, k % 2)  # a reduce tree; its arcs reversed broadcast
        host.append(TreeRate(a.index(-1), a, a, 1.0))
    trees = model.expand(host)
    assert len(trees) == 3 * model.channels
    pairs = [(t.reduce_parent, t.bcast_parent) for t in trees]
    assert profiles.tree_profiles(topology, pairs, [1 << 20] * len(pairs), ab.ENGINE_COSTS) \
        == [_walked_profile(topology, a, b, 1 << 20) for a, b in pairs]
    one = from_dict(generate("racks:hosts_per_rack=1,gpus=1", 1))
    assert profiles.tree_profiles(one, [((-1,), (-1,))], [65536], ab.ENGINE_COSTS) == [()]


def test_a_parent_array_with_a_cycle_is_refused_not_walked_forever():
    """Ranks 0 and 1 are each other's reduce parent under root 2: the walk from a rank to the
    root never ends (the walked path grew without bound), so the profile refuses the tree."""
    topo = from_dict(generate("sites:gpus=1,wan_gbps=10", 3))
    cycle, star = (1, 0, -1), (2, 2, -1)
    with pytest.raises(ValueError, match="cycle"):
        profiles.tree_profiles(topo, [(cycle, star)], [128 << 10], ab.NO_COSTS)
