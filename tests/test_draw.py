"""The plan picture: layout as data (positions, rates, arcs crossing each link) and the PNG."""
import subprocess
import sys

import pytest

from horotopo.cli.draw import MAX_TREE_PANELS, layout, render
from horotopo.plan import make_plan
from horotopo.probe.infer import cluster_ranks
from horotopo.topology import bundled, from_dict, load, measured_document

def _rack(host):
    return "tor0" if host.startswith("p") else "tor1"


def test_racks_layout_counts_the_uplink_crossings_the_trees_imply():
    topology = load(bundled("racks-2x3"))
    plan = make_plan(topology)
    picture = layout(topology, plan)
    # counted here from the trees and host names alone: an arc between racks crosses the
    # uplink once, from its sender's rack to its receiver's
    want = {("tor0", "tor1"): 0, ("tor1", "tor0"): 0}
    for t in plan.trees:
        arcs = [(v, p) for v, p in enumerate(t.reduce_parent) if p >= 0] + \
               [(p, v) for v, p in enumerate(t.bcast_parent) if p >= 0]
        for s, d in arcs:
            a, b = _rack(topology.hosts[s]), _rack(topology.hosts[d])
            if a != b:
                want[a, b] += 1
    uplink = picture.link("tor0", "tor1")
    got = dict(zip(((uplink.a, uplink.b), (uplink.b, uplink.a)), uplink.crossings))
    assert got == want and min(want.values()) >= len(plan.trees)
    # the plan runs at the uplink's rate: the uplink is full both ways, and drawn so
    assert uplink.load == pytest.approx((1.0, 1.0), rel=1e-6) and uplink.binding
    assert uplink.gbps == (0.25, 0.25) and "0.25 gbps" in uplink.label
    host_link = picture.link("p0", "tor0")
    assert host_link.gbps == (1.0, 1.0) and not host_link.binding
    # switches above their hosts, each host under its own switch's group
    for h in ("p0", "p1", "p2", "q0", "q1", "q2"):
        node, switch = picture.node(h), picture.node(_rack(h))
        assert switch.y > node.y
        assert dict(picture.groups)[_rack(h)].count(h) == 1
    assert picture.node("p1").label == "p1\nrank 2"
    # every tree arc is drawn along its physical route, host -> switch(es) -> host
    assert len(picture.arcs) == 2 * 5 * len(plan.trees)
    for arc in picture.arcs:
        ends = (topology.hosts[arc.src], topology.hosts[arc.dst])
        assert (arc.path[0], arc.path[-1]) == ends
        assert len(arc.path) == (3 if _rack(ends[0]) == _rack(ends[1]) else 4)


def test_asymmetric_link_shows_both_rates():
    doc = {"name": "asym", "switches": ["s", "t"],
           "links": [{"ends": ["a", "s"], "gbps": 1.0}, {"ends": ["b", "t"], "gbps": 1.0},
                     {"ends": ["s", "t"], "gbps": [0.2, 0.3]}], "ranks": ["a", "b"]}
    topology = from_dict(doc)
    link = layout(topology, make_plan(topology)).link("s", "t")
    assert link.gbps == (0.2, 0.3) and link.label.startswith("0.2/0.3 gbps")


def _measured_racks():
    a, b = [0, 2, 4], [1, 3, 5]
    bw = [[None if i == j else (1.0 if (i in a) == (j in a) else 0.3) for j in range(6)]
          for i in range(6)]
    shared = [{"pairs": [[i, j] for i in a for j in b], "gbps": 0.3, "label": "uplink a->b"},
              {"pairs": [[j, i] for i in a for j in b], "gbps": 0.3, "label": "uplink b->a"}]
    return measured_document("measured-racks", [f"m{i}" for i in range(6)], bw,
                             egress_gbps=[1.0] * 6, shared=shared)


def test_measured_layout_groups_by_the_probe_clusters_and_draws_the_bottlenecks():
    doc = _measured_racks()
    topology = from_dict(doc)
    plan = make_plan(topology)
    picture = layout(topology, plan)
    clusters = cluster_ranks(doc["bandwidth_gbps"])
    assert clusters == [[0, 2, 4], [1, 3, 5]]
    assert [members for _, members in picture.groups] == \
        [tuple(f"rank {i}" for i in c) for c in clusters]
    a = {0, 2, 4}
    for label, one_way in (("uplink a->b", lambda s, d: s in a and d not in a),
                           ("uplink b->a", lambda s, d: s not in a and d in a)):
        node = next(n for n in picture.nodes if n.kind == "bottleneck" and label in n.label)
        link = next(k for k in picture.links if k.b == node.name)
        crossing = [arc for arc in picture.arcs if one_way(arc.src, arc.dst)]
        assert link.crossings == (len(crossing),) and len(crossing) >= 1
        assert all(node.name in arc.path for arc in crossing)
        assert link.binding  # the plan runs at the shared uplinks' rate
    caps = [k for k in picture.links if k.a == k.b]
    assert len(caps) == 6 and all(k.label.startswith("egress 1 gbps") for k in caps)


def test_png_for_declared_and_measured(tmp_path):
    pytest.importorskip("matplotlib")  # the plot extra; only drawing needs it
    topology = from_dict(_measured_racks())
    render(layout(topology, make_plan(topology)), str(tmp_path / "m.png"))
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = subprocess.run([sys.executable, "-m", "horotopo", "plan", "racks-2x3", "-q",
                          "--png", str(tmp_path / "r.png")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "r.png").stat().st_size > 10_000


@pytest.mark.parametrize("name, size", [("racks-2x3", "128M"), ("uniform-4", "4K")])
def test_each_tree_is_laid_out_by_depth_with_arcs_the_way_data_flows(name, size):
    from horotopo.plan import parse_size

    topology = load(bundled(name))
    plan = make_plan(topology, size=parse_size(size))
    picture = layout(topology, plan)
    assert "1 trees" not in picture.title
    assert [v.tree for v in picture.trees] == list(range(len(plan.trees)))
    for view, tree in zip(picture.trees, plan.trees):
        assert view.root == tree.root and view.share == tree.share
        assert set(view.reduce) == {(v, p) for v, p in enumerate(tree.reduce_parent) if p >= 0}
        assert set(view.bcast) == {(p, v) for v, p in enumerate(tree.bcast_parent) if p >= 0}
        for at, arcs, up in ((view.reduce_at, view.reduce, True),
                             (view.bcast_at, view.bcast, False)):
            assert at[tree.root][1] == 0 and len(at) == topology.n
            # data moves one row at a time: up into the root, down from it
            for src, dst in arcs:
                assert at[src][1] - at[dst][1] == (1 if up else -1)
            # no two ranks share a place
            assert len(set(at)) == topology.n
        assert view.depth == max(d for _, d in view.reduce_at + view.bcast_at)


def test_the_png_has_a_panel_row_per_tree(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from horotopo.plan import plan_from_trees

    topology = load(bundled("uniform-4"))
    stars = [(r, tuple(-1 if v == r else r for v in range(4)),
              tuple(-1 if v == r else r for v in range(4)), 1.0) for r in range(4)]
    heights = {}
    for count in (1, 3):
        assert count <= MAX_TREE_PANELS
        plan = plan_from_trees(4, stars[:count], topology=topology)
        render(layout(topology, plan), str(tmp_path / f"{count}.png"))
        heights[count] = imread(str(tmp_path / f"{count}.png")).shape[0]
    assert heights[3] > heights[1]  # each tree drawn in a row of its own


def test_lower_layers_do_not_import_the_drawing():
    out = subprocess.run([sys.executable, "-c",
                          "import sys, horotopo, horotopo.plan, horotopo.cli.plan_cmd; "
                          "print('horotopo.cli.draw' in sys.modules, 'matplotlib' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr
