"""Loading both topology forms, routes, and the errors for bad files."""
import json

import numpy as np
import pytest

from horotopo import generate
from horotopo.topology import GBPS_TO_BPS, TopologyError, bundled, from_dict, load


def declared(**over):
    doc = {"name": "t", "switches": ["sw"],
           "links": [{"ends": ["a", "sw"], "gbps": 1.0}, {"ends": ["b", "sw"], "gbps": [0.5, 0.25]}],
           "ranks": ["a", "b"]}
    doc.update(over)
    return doc


def test_bundled_files_load():
    for name in ("racks-2x3", "slow-nic", "uniform-4"):
        t = load(bundled(name))
        assert t.n == len(t.hosts) and t.kind == "declared"


def test_declared_routes_cross_the_physical_links():
    t = from_dict(declared())
    names = [t.resources[r] for r in t.routes[0][1]]
    assert names == ["a->sw", "sw->b"]
    assert [t.resources[r] for r in t.routes[1][0]] == ["b->sw", "sw->a"]
    # asymmetric link [b->sw, sw->b] = [0.5, 0.25]
    assert t.pair_capacity_Bps(1, 0) == pytest.approx(0.5 * GBPS_TO_BPS)
    assert t.pair_capacity_Bps(0, 1) == pytest.approx(0.25 * GBPS_TO_BPS)


def test_racks_route_over_the_uplink_once():
    t = load(bundled("racks-2x3"))
    p0, q0 = 0, 1
    assert [t.resources[r] for r in t.routes[p0][q0]] == ["p0->tor0", "tor0->tor1", "tor1->q0"]


def test_same_host_ranks_are_unconstrained():
    t = from_dict(declared(ranks=["a", "a", "b"]))
    assert t.routes[0][1] == () and t.routes[1][0] == ()
    assert t.routes[0][2] != ()


def test_measured_form_routes_pair_host_and_shared_resources():
    doc = {"name": "m", "ranks": ["x", "y", "z"],
           "bandwidth_gbps": [[None, 1, 2], [3, None, 4], [5, 6, None]],
           "egress_gbps": [1, None, 1], "ingress_gbps": [None, 2, None],
           "shared": [{"pairs": [[0, 1], [2, 1]], "gbps": 0.5}]}
    t = from_dict(doc)
    route = [t.resources[r] for r in t.routes[0][1]]
    assert route == ["pair 0->1", "egress 0", "ingress 1", "shared 0"]
    assert [t.resources[r] for r in t.routes[1][0]] == ["pair 1->0"]
    assert t.pair_capacity_Bps(0, 1) == pytest.approx(0.5 * GBPS_TO_BPS)
    assert from_dict(t.to_json()).source == t.source


def _routes_of(t, keys):
    ptr, res = t.arc_routes(np.asarray(keys, dtype=np.int64))
    return [tuple(res[ptr[a]:ptr[a + 1]].tolist()) for a in range(len(keys))]


@pytest.mark.parametrize("kind", ["measured", "declared"])
def test_arc_routes_and_latencies_read_every_arc_as_route_and_latency_do(kind):
    """Looked up in batches that repeat, reorder and add arcs (a measured topology keeps
    what it read): every arc's route and latency are the single-arc lookups'."""
    if kind == "measured":
        n = 6
        rng = np.random.default_rng(3)
        t = from_dict({"name": "m", "ranks": [f"r{i}" for i in range(n)],
                       "bandwidth_gbps": [[None if i == j else float(rng.uniform(1, 9))
                                           for j in range(n)] for i in range(n)],
                       "latency_ms": [[0 if i == j else float(rng.uniform(0.001, 0.05))
                                       for j in range(n)] for i in range(n)],
                       "egress_gbps": [2.0] * n,
                       "shared": [{"pairs": [[0, 1], [2, 3], [4, 5]], "gbps": 0.5}]})
    else:
        t = from_dict(generate.generate("racks:hosts_per_rack=2,gpus=2,oversub=2", 16))
    n = t.n
    rng = np.random.default_rng(7)
    arcs = [(i, j) for i in range(n) for j in range(n) if i != j]
    for _ in range(4):
        pick = rng.choice(len(arcs), size=min(len(arcs), 12))
        keys = [arcs[a][0] * n + arcs[a][1] for a in pick]
        assert _routes_of(t, keys) == [t.route(k // n, k % n) for k in keys]
        assert t.arc_latencies(np.asarray(keys)).tolist() == [t.latency(k // n, k % n)
                                                              for k in keys]
    every = [i * n + j for i, j in arcs][::-1]
    assert _routes_of(t, every) == [t.route(k // n, k % n) for k in every]


@pytest.mark.parametrize("doc, field", [
    (declared(ranks=["a", "ghost"]), "/ranks/1: host 'ghost' is not an end of any link"),
    (declared(links=[{"ends": ["a", "sw"], "gbps": -1}, {"ends": ["b", "sw"], "gbps": 1}]),
     "/links/0/gbps: must be positive"),
    (declared(links=[{"ends": ["a", "sw"], "gbps": 0}, {"ends": ["b", "sw"], "gbps": 1}]),
     "/links/0/gbps: must be positive"),
    (declared(links=[{"ends": ["a", "sw"], "gbps": 1}, {"ends": ["b", "c"], "gbps": 1}]),
     "the graph is disconnected"),
    (declared(links=[{"ends": ["a", "sw"], "gbps": 1}, {"ends": ["b", "sw"], "gbps": [1, 2, 3]}]),
     "/links/1/gbps: an asymmetric link takes [a->b, b->a]"),
    (declared(links=[{"ends": ["a", "sw"], "gbps": "fast"}, {"ends": ["b", "sw"], "gbps": 1}]),
     "/links/0/gbps: must be a positive finite number"),
    (declared(links=[{"ends": ["a", "sw"], "gbps": 1, "speed": 2}, {"ends": ["b", "sw"], "gbps": 1}]),
     "/links/0/speed: unknown field"),
    (declared(ranks=["sw"]), "/ranks/0: 'sw' is a switch"),
    (declared(colour="red"), "/colour: unknown field"),
    (declared(ranks=[]), "/ranks: must list at least one rank"),
    ({"name": "m", "ranks": ["x", "y"], "bandwidth_gbps": [[None, 1]]},
     "/bandwidth_gbps: must have 2 entries"),
    ({"name": "m", "ranks": ["x", "y"], "bandwidth_gbps": [[None, 1], [1]]},
     "/bandwidth_gbps/1: must have 2 entries"),
    ({"name": "m", "ranks": ["x", "y"], "bandwidth_gbps": [[None, 1], [0, None]]},
     "/bandwidth_gbps/1/0: must be positive"),
    ({"name": "m", "ranks": ["x", "y"], "bandwidth_gbps": [[None, 1], [1, None]],
      "shared": [{"pairs": [[0, 7]], "gbps": 1}]}, "/shared/0/pairs/0: rank index out of range"),
    ({"name": "m", "ranks": ["x", "y"], "bandwidth_gbps": [[None, 1], [1, None]],
      "egress_gbps": [1]}, "/egress_gbps: must have 2 entries"),
    ([1, 2], "top level: must be a JSON object"),
    ({"name": "x"}, "neither a declared topology"),
])
def test_bad_documents_name_the_field(doc, field):
    with pytest.raises(TopologyError) as err:
        from_dict(doc)
    assert field in str(err.value)


def test_bad_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="bad.json: not valid JSON"):
        load(bad)
    with pytest.raises(TopologyError, match="missing.json: cannot read"):
        load(tmp_path / "missing.json")
    with pytest.raises(TopologyError, match="no bundled topology 'nope'"):
        bundled("nope")


@pytest.mark.parametrize("seed", range(5))
def test_generated_documents_load(seed):
    for doc in (generate.random_declared(7, seed), generate.random_measured(5, seed),
                generate.racks([2, 3]), generate.uniform_star(4)):
        t = from_dict(json.loads(json.dumps(doc)))
        assert all(t.routes[i][j] or t.hosts[i] == t.hosts[j]
                   for i in range(t.n) for j in range(t.n) if i != j)
