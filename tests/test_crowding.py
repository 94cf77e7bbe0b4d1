"""The fill's crowding (horotopo.packing.profiles.Crowding): a first chunk crosses each link at
its rate shared among the flows of the plan's trees that reach the link at the same step, and
waits for its receiving rank to handle the other chunks that reach it then, at least at its
tree's rate. Checked against a brute-force count over every arc, on hand-worked
cases, and against the simulator where the links' rates alone were off by 3x."""
import math
from collections import Counter

import numpy as np
import pytest

from horotopo.generate import generate
from horotopo.packing import alphabeta as ab
from horotopo.packing import profiles
from horotopo.packing.hierarchy import HostModel
from horotopo.packing.model import TreeRate
from horotopo.topology import from_dict

from test_plan_scale import _walk_hops  # the oracle of every rank's hops to its root


def _steps(parent, half):
    """Each rank's arc's step, counted the slow way: a broadcast arc's its hops from the root;
    a reduce arc's one more than the longest path of children below it."""
    if half == 1:
        return _walk_hops(parent)
    below = [0] * len(parent)
    for v in range(len(parent)):
        u, hops = v, 0
        while parent[u] >= 0:  # v is `hops` below each rank on its way to the root
            u, hops = parent[u], hops + 1
            below[u] = max(below[u], hops)
    return [b + 1 for b in below]


def _brute_inverse_rates(topology, pairs, rates):
    """Per tree, per half, per rank: the first chunk's seconds per byte on its arc, from a
    count of every flow over (resource, half, step)."""
    routes, cap = topology.routes, topology.capacity_Bps
    arcs = []
    for t, (a, b) in enumerate(pairs):
        for half, parent in enumerate((a, b)):
            for v, d in enumerate(_steps(parent, half)):
                if parent[v] >= 0:
                    tail, head = (v, parent[v]) if half == 0 else (parent[v], v)
                    arcs.append((t, half, v, d, routes.pair(tail, head)))
    crowd = Counter((r, half, d) for _, half, _, d, route in arcs for r in route)
    out = {}
    for t, half, v, d, route in arcs:
        if not route:
            out[t, half, v] = 0.0
            continue
        shared = min(cap[r] / crowd[r, half, d] for r in route)
        out[t, half, v] = max(1.0 / min(cap[r] for r in route),
                              1.0 / max(shared, rates[t]))
    return out


def _random_tree(rng, n):
    order = rng.permutation(n)
    parent = [-1] * n
    for i in range(1, n):
        parent[int(order[i])] = int(order[int(rng.integers(0, i))])
    return tuple(parent)


@pytest.mark.parametrize("spec,n", [("racks:hosts_per_rack=2,gpus=4,oversub=4,slow=0.25", 32),
                                    ("sites:gpus=2,wan_gbps=10", 16)])
def test_inverse_rates_equal_a_brute_force_count(spec, n, monkeypatch):
    topology = from_dict(generate(spec, n))
    rng = np.random.default_rng(n)
    # random trees, and copies of one tree (which crowd every link they cross)
    pairs = [(_random_tree(rng, n), _random_tree(rng, n)) for _ in range(5)]
    pairs += [pairs[0]] * 3
    rates = [float(x) for x in rng.uniform(1e7, 1e9, len(pairs))]
    want = _brute_inverse_rates(topology, pairs, rates)
    monkeypatch.setattr(profiles, "BATCH_ENTRIES", 3 * n)  # batches of one tree pair
    crowding = profiles.fill_crowding(topology, pairs)
    for t, ((a, b), rate) in enumerate(zip(pairs, rates)):
        for half, parent in enumerate((a, b)):
            kids = np.array([v for v in range(n) if parent[v] >= 0])
            ups = np.array([parent[v] for v in kids])
            tails, heads = (kids, ups) if half == 0 else (ups, kids)
            inv = np.array([ab.arc_figures(topology, int(i), int(j))[1]
                            for i, j in zip(tails, heads)])
            got = crowding.inverse_rates(tails, heads, np.full(len(kids), half),
                                         np.array(_steps(parent, half))[kids], inv,
                                         np.full(len(kids), rate))
            assert got == pytest.approx([want[t, half, int(v)] for v in kids], rel=1e-12)


def _two_hosts():
    """Two hosts of 4 ranks behind 10 gbps NICs (1.25 GB/s), on one switch."""
    return from_dict(generate("racks:hosts_per_rack=2,gpus=4,nic_gbps=10", 8))


def test_channels_of_one_host_tree_share_the_nic_and_other_shapes_do_not():
    topology = _two_hosts()
    nic = 1.25e9
    # a star per host, rank 4 under the root 0: four copies of one shape, each crossing both
    # NICs at depth 1
    star = (-1, 0, 0, 0, 0, 4, 4, 4)
    pair = (star, star)
    crowding = profiles.fill_crowding(topology, [pair] * 4)
    links_alone = ab.SoftwareCosts(per_message_s=ab.ENGINE_COSTS.per_message_s, per_byte_s=0.0)
    got = profiles.tree_profiles(topology, [pair] * 4, [1 << 20] * 4, links_alone,
                                 rates=[1.0] * 4, crowding=crowding)
    alone = profiles.tree_profiles(topology, [pair], [1 << 20], ab.ENGINE_COSTS)
    inv = max(h[1] for h in got[0])
    inv_alone = max(h[1] for h in alone[0])
    assert inv_alone == pytest.approx(1 / nic)
    assert inv == pytest.approx(4 / nic)  # a quarter of the NIC per chunk where 4 share it
    # a chain that crosses at step 4 both ways (0 <- 1 <- 2 <- 3 <- 4 ...) crowds nothing at
    # the star's steps 1 and 2
    deep = tuple([-1, 0, 1, 2, 3, 4, 5, 6])
    mixed = [pair, (deep, deep)]
    crowding = profiles.fill_crowding(topology, mixed)
    got = profiles.tree_profiles(topology, mixed, [1 << 20] * 2, links_alone,
                                 rates=[1.0] * 2, crowding=crowding)
    assert max(inv for _, inv, _ in got[1]) == pytest.approx(1 / nic)


def test_a_rank_handles_the_chunks_that_reach_it_at_one_step_one_after_another():
    topology = _two_hosts()
    star = (-1, 0, 0, 0, 0, 4, 4, 4)
    pair = (star, star)
    crowding = profiles.fill_crowding(topology, [pair] * 4)
    handling = ab.SoftwareCosts(per_message_s=0.0, per_byte_s=1e-9)  # 1 GB/s
    # ranks 0 and 4 each take in their 3 leaves' chunks of the 4 trees at the first step
    # (rank 4's own goes up at the second): a chunk waits for the 11 others' handling at
    # 1 GB/s, longer than for the NIC's quarter (3.2 ns per byte)
    got = profiles.tree_profiles(topology, [pair] * 4, [1 << 20] * 4, handling,
                                 rates=[1.0] * 4, crowding=crowding)
    assert max(inv for _, inv, _ in got[0]) == pytest.approx(11e-9)
    # never slower than the tree's own rate
    got = profiles.tree_profiles(topology, [pair] * 4, [1 << 20] * 4, handling,
                                 rates=[1 / 6e-9] * 4, crowding=crowding)
    assert max(inv for _, inv, _ in got[0]) == pytest.approx(6e-9)
    # without crowding a hop costs its bottleneck link alone (and each chunk its handling,
    # charged by the hop time besides)
    alone = profiles.tree_profiles(topology, [pair], [1 << 20], handling)
    assert max(inv for _, inv, _ in alone[0]) == pytest.approx(1 / 1.25e9)


def test_a_chunk_never_moves_slower_than_its_tree():
    topology = _two_hosts()
    pair = ((-1, 0, 0, 0, 0, 4, 4, 4),) * 2
    crowding = profiles.fill_crowding(topology, [pair] * 4)
    fast = 1.25e9 / 2  # planned rate above a quarter of the NIC
    got = profiles.tree_profiles(topology, [pair] * 4, [1 << 20] * 4, ab.ENGINE_COSTS,
                                 rates=[fast] * 4, crowding=crowding)
    assert max(inv for _, inv, _ in got[0]) == pytest.approx(1 / fast)


def test_crowding_must_count_every_tree():
    topology = _two_hosts()
    a = (-1, 0, 0, 0, 0, 4, 4, 4)
    b = (-1, 0, 1, 2, 3, 4, 5, 6)
    crowding = profiles.fill_crowding(topology, [(a, a)])
    with pytest.raises(ValueError, match="every tree of the plan"):
        profiles.tree_profiles(topology, [(b, b)], [65536], ab.ENGINE_COSTS, rates=[1.0],
                               crowding=crowding)
    # nor does a rank's count of the chunks it receives at a step that no counted tree has
    # (an arc within a node has no link to be checked against)
    assert crowding.handled_at(np.array([0]), np.array([0]), np.array([1])) == [3]
    with pytest.raises(ValueError, match="every tree of the plan"):
        crowding.handled_at(np.array([2]), np.array([0]), np.array([5]))
    with pytest.raises(ValueError, match="go together"):
        profiles.tree_profiles(topology, [(a, a)], [65536], ab.ENGINE_COSTS, rates=[1.0])


def test_hierarchical_channels_crowd_their_nic():
    """A plan over hosts expands each host tree into one channel per local rank; they cross
    every NIC in step, so each first chunk gets the NIC over the channels."""
    topology = from_dict(generate("racks:hosts_per_rack=2,gpus=4,nic_gbps=10", 16))
    model = HostModel(topology)
    chain = tuple([-1] + list(range(model.n - 1)))
    trees = model.expand([TreeRate(0, chain, chain, 1.0)])
    assert len(trees) == model.channels == 4
    pairs = [(t.reduce_parent, t.bcast_parent) for t in trees]
    crowding = profiles.fill_crowding(topology, pairs)
    got = profiles.tree_profiles(topology, pairs, [1 << 20] * len(pairs), ab.ENGINE_COSTS,
                                 rates=[1.0] * len(pairs), crowding=crowding)
    alone = profiles.tree_profiles(topology, pairs, [1 << 20] * len(pairs), ab.ENGINE_COSTS)
    slow = max(inv for _, inv, _ in got[0])
    assert slow >= 4 * max(inv for _, inv, _ in alone[0]) * (1 - 1e-9)
    assert math.isfinite(slow)


@pytest.mark.xfail(strict=True, reason=(
    "a known miss: planned over hosts with chains inside them, the plan keeps one tree of 8 "
    "channels' rate, simulated 101.8 ms against 74.3 predicted"))
def test_channels_predicted_within_the_simulators_time_at_big_chunks():
    """racks at 64 ranks planned over hosts, 16 MiB in 1 MiB chunks: the plan's prediction,
    the links charged as the flows that cross them at once share them, within 15% of the
    simulated time. Needs the simulator (python3-simgrid)."""
    from horotopo.cli.simulate_cmd import simulate
    from horotopo.plan import make_plan
    from horotopo.transport.simulated import SimulatorMissing, load_simgrid
    try:
        load_simgrid()
    except SimulatorMissing as exc:
        pytest.skip(str(exc))
    topology = from_dict(generate("racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25", 64))
    size, chunk = 16 << 20, 1 << 20
    plan = make_plan(topology, size=size, hierarchy="on")
    assert plan.planner["forest"]["chosen"] == "deep"
    row, = simulate(topology, size, plan=plan, algorithms=["tree"],
                    chunk_bytes=chunk)["rows"]
    assert row["wrong"] == 0
    predicted = plan.predict_time(size, chunk)
    assert abs(predicted / row["time_s"] - 1) < 0.15, (predicted, row["time_s"])
