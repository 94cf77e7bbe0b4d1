"""The plan picture (``horotopo plan --png``): the network, then one panel per tree.

Two steps, so that what the picture says can be tested without looking at pixels:

- :func:`layout` is pure: from a topology and a plan it returns a :class:`Picture` of nodes
  with positions, physical links (or, for a measured topology, resources) with their rates,
  for every resource how many tree arcs cross it and what fraction of its capacity the plan
  uses, and for every tree a :class:`TreeView`: its reduce and its broadcast arborescence laid
  out by depth, root on top.
- :func:`render` draws a :class:`Picture` with matplotlib (the ``plot`` extra): the network
  panel with the rates and crossings, then for each tree (the largest shares first, at most
  :data:`MAX_TREE_PANELS`) its reduce, arrows up into the root, beside its broadcast, arrows
  down from the root, each rank on the row of its depth.

Declared topologies are drawn as the switch tree: hosts on the bottom row under the switch they
hang from, switches above them by their distance from the hosts. Measured topologies have no
switches: the ranks are grouped by the probe's clusters (:func:`horotopo.probe.infer.
cluster_ranks`) and each shared bottleneck is a node that the arcs crossing it pass through.

Only the CLI imports this module; nothing below it does.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ..packing import ArcModel, format_percent, plural
from ..plan import Plan
from ..probe.infer import cluster_ranks
from ..topology import GBPS_TO_BPS, Topology

__all__ = ["Node", "Link", "Arc", "TreeView", "Picture", "layout", "render", "draw",
           "MAX_TREE_PANELS"]

ROW = 1.6  # vertical distance between the rows of switch levels and hosts

# A resource whose plan load is at least this fraction of its capacity is drawn as binding.
BINDING = 0.999

#: Trees drawn in panels of their own; the title says how many more the plan has.
MAX_TREE_PANELS = 8


@dataclass(frozen=True)
class Node:
    """A box in the picture: ``kind`` is ``"switch"``, ``"host"``, ``"rank"`` or
    ``"bottleneck"`` (a measured shared resource)."""

    name: str
    kind: str
    x: float
    y: float
    label: str


@dataclass(frozen=True)
class Link:
    """A drawn connection between nodes ``a`` and ``b`` and the resources it stands for.

    ``resources``, ``gbps``, ``crossings`` and ``load`` are per direction, ``a -> b`` first;
    a one-way resource (a measured bottleneck) has one entry. ``crossings`` counts tree arcs
    (reduce and broadcast, over all trees) whose route uses the resource; ``load`` is the
    plan's rate on it over its capacity.
    """

    a: str
    b: str
    resources: Tuple[int, ...]
    gbps: Tuple[float, ...]
    crossings: Tuple[int, ...]
    load: Tuple[float, ...]
    label: str

    @property
    def binding(self) -> bool:
        return max(self.load, default=0.0) >= BINDING


@dataclass(frozen=True)
class Arc:
    """One arc of tree ``tree``: rank ``src`` sends to rank ``dst`` along ``path`` (nodes)."""

    tree: int
    kind: str  # "reduce" or "bcast"
    src: int
    dst: int
    path: Tuple[str, ...]


@dataclass(frozen=True)
class TreeView:
    """Tree ``tree`` of the plan as its panel draws it.

    ``reduce`` lists its arcs ``(child, parent)`` and ``bcast`` its arcs ``(parent, child)``:
    each in the direction its data flows. ``reduce_at[v]`` and ``bcast_at[v]`` are rank
    ``v``'s ``(x, depth)`` in the two drawings: depth is its hops from the root (the row it is
    drawn on, root at 0), x its place in the row, children in their parents' order.
    """

    tree: int
    root: int
    share: float
    rate_Bps: float
    reduce: Tuple[Tuple[int, int], ...]
    bcast: Tuple[Tuple[int, int], ...]
    reduce_at: Tuple[Tuple[float, int], ...]
    bcast_at: Tuple[Tuple[float, int], ...]

    @property
    def depth(self) -> int:
        """Rows below the root in the deeper of the two arborescences."""
        return max(d for _, d in self.reduce_at + self.bcast_at)


@dataclass(frozen=True)
class Picture:
    """Everything :func:`render` draws (see module docstring)."""

    title: str
    nodes: Tuple[Node, ...]
    links: Tuple[Link, ...]
    arcs: Tuple[Arc, ...]
    groups: Tuple[Tuple[str, Tuple[str, ...]], ...]  # (label, member node names)
    trees: Tuple[TreeView, ...] = ()

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def link(self, a: str, b: str) -> Link:
        """The link between ``a`` and ``b``, oriented as stored (check ``link.a``)."""
        return next(k for k in self.links if {k.a, k.b} == {a, b})


def _crossings(topology: Topology, plan: Plan) -> Tuple[np.ndarray, np.ndarray]:
    """Per resource: tree arcs crossing it, and the plan's load over its capacity."""
    model = ArcModel(topology)
    count = np.zeros(len(model.capacity))
    used = np.zeros(len(model.capacity))
    for t in plan.trees:
        load = model.load(t.root, t.reduce_parent, t.bcast_parent)
        count += load
        used += t.rate_Bps * load
    return count.astype(int), used / model.capacity


def _tree_arcs(plan: Plan) -> List[Tuple[int, str, int, int]]:
    out = []
    for k, t in enumerate(plan.trees):
        out += [(k, "reduce", v, p) for v, p in enumerate(t.reduce_parent) if p >= 0]
        out += [(k, "bcast", p, v) for v, p in enumerate(t.bcast_parent) if p >= 0]
    return out


def _title(topology: Topology, plan: Plan) -> str:
    gap = plan.gap
    cert = "no certificate" if gap is None else f"packing gap {format_percent(gap)}"
    return (f"{topology.name}: {plural(len(plan.trees), 'tree')}, "
            f"R {plan.throughput_Bps / 1e6:.2f} MB/s, ring {plan.ring_Bps / 1e6:.2f} MB/s, {cert}")


def _rows(parent: Sequence[int], root: int) -> Tuple[Tuple[float, int], ...]:
    """``(x, depth)`` of every rank of the arborescence ``parent``: depth by breadth-first
    search from ``root``, each row's ranks in the order of their parents, then by rank."""
    children: Dict[int, List[int]] = {}
    for v, p in enumerate(parent):
        if p >= 0:
            children.setdefault(p, []).append(v)
    at: Dict[int, Tuple[float, int]] = {root: (0.0, 0)}
    row = [root]
    depth = 0
    while row:
        depth += 1
        row = [c for v in row for c in sorted(children.get(v, []))]
        at.update((c, (float(k), depth)) for k, c in enumerate(row))
    # centre each row under the widest, so that a chain runs down the middle
    width = max(Counter(d for _, d in at.values()).values())
    count = Counter(d for _, d in at.values())
    return tuple((at[v][0] + (width - count[at[v][1]]) / 2, at[v][1]) for v in range(len(parent)))


def _tree_views(plan: Plan) -> Tuple[TreeView, ...]:
    views = []
    for k, t in enumerate(plan.trees):
        views.append(TreeView(
            k, t.root, t.share, t.rate_Bps,
            tuple((v, p) for v, p in enumerate(t.reduce_parent) if p >= 0),
            tuple((p, v) for v, p in enumerate(t.bcast_parent) if p >= 0),
            _rows(t.reduce_parent, t.root), _rows(t.bcast_parent, t.root)))
    return tuple(views)


def _gbps(value: float) -> str:
    return f"{value:.3g}"


def layout(topology: Topology, plan: Plan) -> Picture:
    """The picture of ``plan`` over ``topology`` as data (see module docstring).

    Parameters
    ----------
    topology : Topology
        Declared or measured; the plan must be over its ranks.
    plan : Plan

    Returns
    -------
    Picture
    """
    if plan.n != topology.n:
        raise ValueError(f"the plan has {plan.n} ranks, the topology {topology.n}")
    if topology.kind == "declared":
        return _declared(topology, plan)
    return _measured(topology, plan)


def _declared(topology: Topology, plan: Plan) -> Picture:
    doc = topology.to_json()
    switches: List[str] = list(doc.get("switches", []))
    links = [tuple(link["ends"]) for link in doc["links"]]
    # topology._declared makes resources 2k (a->b) and 2k+1 (b->a) for links[k]; the picture
    # relies on that, so check it rather than assume it.
    expected = [f"{u}->{v}" for a, b in links for u, v in ((a, b), (b, a))]
    if list(topology.resources) != expected:
        raise ValueError("declared topology resources are not two per link in link order")
    crossings, load = _crossings(topology, plan)

    neighbours: Dict[str, List[str]] = {}
    for a, b in links:
        neighbours.setdefault(a, []).append(b)
        neighbours.setdefault(b, []).append(a)
    switch_set = set(switches)
    hosts = [h for h in neighbours if h not in switch_set]
    # each host sits under the first switch it is linked to (in file order)
    home = {h: next((s for s in neighbours[h] if s in switch_set), None) for h in hosts}
    # switch levels: 1 for switches with hosts, one more per hop away from them
    level: Dict[str, int] = {s: 1 for s in switches if s in home.values()}
    frontier = list(level)
    while frontier:
        nxt = []
        for s in frontier:
            for t in neighbours.get(s, []):
                if t in switch_set and t not in level:
                    level[t] = level[s] + 1
                    nxt.append(t)
        frontier = nxt
    for s in switches:
        level.setdefault(s, 1)  # a switch with no host anywhere below it

    x: Dict[str, float] = {}
    order = [s for s in switches if level[s] == 1] + [None]  # None: hosts without a switch
    for group in order:
        for h in sorted((h for h in hosts if home[h] == group), key=hosts.index):
            x[h] = float(len(x))
    for depth in sorted(set(level.values())):
        row = [s for s in switches if level[s] == depth]
        for s in row:
            below = [x[t] for t in neighbours.get(s, []) if t in x
                     and (t not in switch_set or level[t] < depth)]
            x[s] = float(np.mean(below)) if below else float(len(hosts) + row.index(s))

    ranks_on: Dict[str, List[int]] = {}
    for i, h in enumerate(topology.hosts):
        ranks_on.setdefault(h, []).append(i)
    nodes = [Node(s, "switch", x[s], ROW * level[s], s) for s in switches]
    for h in hosts:
        on = ranks_on.get(h, [])
        label = h + (f"\nrank {', '.join(map(str, on))}" if on else "")
        nodes.append(Node(h, "host", x[h], 0.0, label))

    drawn: List[Link] = []
    for k, (a, b) in enumerate(links):
        res = (2 * k, 2 * k + 1)
        gbps = tuple(topology.capacity_Bps[r] / GBPS_TO_BPS for r in res)
        rate = _gbps(gbps[0]) if gbps[0] == gbps[1] else f"{_gbps(gbps[0])}/{_gbps(gbps[1])}"
        use = "\n".join(f"{u}>{v} {int(crossings[r])}x {load[r]:.0%}"
                        for (u, v), r in zip(((a, b), (b, a)), res) if crossings[r])
        drawn.append(Link(a, b, res, gbps, tuple(int(crossings[r]) for r in res),
                          tuple(float(load[r]) for r in res),
                          f"{rate} gbps" + (f"\n{use}" if use else "")))

    head = {r: expected[r].split("->")[1] for r in range(len(expected))}
    arcs = [Arc(k, kind, s, d, (topology.hosts[s],
                                *(head[r] for r in topology.routes[s][d])))
            for k, kind, s, d in _tree_arcs(plan)]
    groups = tuple((s, (s, *(h for h in hosts if home[h] == s)))
                   for s in switches if level[s] == 1)
    return Picture(_title(topology, plan), tuple(nodes), tuple(drawn), tuple(arcs), groups,
                   _tree_views(plan))


def _measured(topology: Topology, plan: Plan) -> Picture:
    doc = topology.to_json()
    n = topology.n
    clusters = cluster_ranks(doc["bandwidth_gbps"])
    crossings, load = _crossings(topology, plan)
    name = [f"rank {i}" for i in range(n)]
    nodes: List[Node] = []
    slot = 0.0
    for c, members in enumerate(clusters):
        for i in members:
            nodes.append(Node(name[i], "rank", slot, 0.0, f"{i}\n{topology.hosts[i]}"))
            slot += 1.0
        slot += 1.0  # a gap between clusters
    at = {nd.name: nd.x for nd in nodes}
    cluster_of = {i: c for c, members in enumerate(clusters) for i in members}

    # Resources beyond the pair rates, in the order topology._measured appends them after the
    # n(n-1) pair resources: egress caps, ingress caps (non-null entries), shared bottlenecks.
    caps = [(kind, k) for key, kind in (("egress_gbps", "egress"), ("ingress_gbps", "ingress"))
            for k, v in enumerate(doc.get(key) or []) if v is not None]
    drawn: List[Link] = []
    bottleneck: Dict[int, str] = {}
    for r in range(n * (n - 1), len(topology.resources)):
        label = topology.resources[r]
        gbps = topology.capacity_Bps[r] / GBPS_TO_BPS
        users = {(i, j) for i in range(n) for j in range(n) if r in topology.routes[i][j]}
        use = f"{int(crossings[r])}x, load {load[r]:.0%}"
        if r - n * (n - 1) < len(caps):
            # a host cap: drawn as a note under its rank
            kind, rank = caps[r - n * (n - 1)]
            me = name[rank]
            drawn.append(Link(me, me, (r,), (gbps,), (int(crossings[r]),), (float(load[r]),),
                              f"{kind} {_gbps(gbps)} gbps\n{use}"))
            continue
        srcs = sorted({i for i, _ in users})
        dsts = sorted({j for _, j in users})
        node = f"bottleneck {r}"
        bottleneck[r] = node
        nodes.append(Node(node, "bottleneck",
                          float(np.mean([at[name[i]] for i in srcs + dsts])),
                          ROW * (0.6 + 0.4 * len(bottleneck)), f"{label}\n{_gbps(gbps)} gbps"))
        src_groups = sorted({cluster_of[i] for i in srcs})
        dst_groups = sorted({cluster_of[j] for j in dsts})
        drawn.append(Link(f"clusters {src_groups}", node, (r,), (gbps,), (int(crossings[r]),),
                          (float(load[r]),),
                          f"ranks {srcs} -> {dsts}: {use}"))
    arcs = [Arc(k, kind, s, d, (name[s],
                                *(bottleneck[r] for r in topology.routes[s][d] if r in bottleneck),
                                name[d]))
            for k, kind, s, d in _tree_arcs(plan)]
    groups = tuple((f"cluster {c}", tuple(name[i] for i in members))
                   for c, members in enumerate(clusters))
    return Picture(_title(topology, plan), tuple(nodes), tuple(drawn), tuple(arcs), groups,
                   _tree_views(plan))


def render(picture: Picture, path: str) -> None:
    """Draw ``picture`` to the image file ``path`` (needs matplotlib): the network on top, then
    a row per tree, its reduce on the left and its broadcast on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = sorted(picture.trees, key=lambda v: (-v.share, v.tree))[:MAX_TREE_PANELS]
    width = max((nd.x for nd in picture.nodes), default=1.0) + 2
    ranks = max((len(v.reduce_at) for v in shown), default=1)
    fig_width = max(7.0, 1.4 * width, 1.1 * ranks)
    heights = [6.0] + [1.3 + 0.9 * v.depth for v in shown]
    fig = plt.figure(figsize=(fig_width, sum(heights)))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights, hspace=0.35, wspace=0.08)
    colours = plt.get_cmap("tab10")
    _draw_network(fig.add_subplot(grid[0, :]), picture, len(shown))
    for row, view in enumerate(shown, start=1):
        colour = colours(view.tree % 10)
        head = (f"tree {view.tree}: root {view.root}, share {view.share:.3f}, "
                f"rate {view.rate_Bps / 1e6:.2f} MB/s")
        _draw_tree(fig.add_subplot(grid[row, 0]), view.reduce, view.reduce_at, view.root,
                   view.depth, colour, f"{head}\nreduce: each rank sends up to its parent")
        _draw_tree(fig.add_subplot(grid[row, 1]), view.bcast, view.bcast_at, view.root,
                   view.depth, colour, "broadcast: the root sends down, each rank to its "
                                       "children")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _draw_network(ax: Any, picture: Picture, shown: int) -> None:
    from matplotlib.patches import FancyBboxPatch

    pos = {nd.name: (nd.x, nd.y) for nd in picture.nodes}
    for label, members in picture.groups:
        xs = [pos[m][0] for m in members]
        ys = [pos[m][1] for m in members]
        if not xs:
            continue
        ax.add_patch(FancyBboxPatch((min(xs) - 0.45, min(ys) - 0.3), max(xs) - min(xs) + 0.9,
                                    max(ys) - min(ys) + 0.6, boxstyle="round,pad=0.05",
                                    facecolor="#f3f3f3", edgecolor="#bbbbbb", zorder=0))
        ax.text(min(xs) - 0.4, max(ys) + 0.4, label, fontsize=7, color="#777777")

    top = max((g for ln in picture.links for g in ln.gbps), default=1.0)
    for ln in picture.links:
        colour = "#d62728" if ln.binding else "#888888"
        if ln.a == ln.b:  # a host cap (measured): a note under the rank
            xa, ya = pos[ln.a]
            ax.text(xa, ya - 0.42 - 0.22 * ln.label.startswith("ingress"), ln.label, fontsize=5,
                    ha="center", color=colour)
            continue
        if ln.a not in pos:  # measured bottleneck: from the clusters it joins
            xb, yb = pos[ln.b]
            ax.text(xb, yb + 0.22, ln.label, fontsize=6, ha="center", color=colour)
            continue
        (xa, ya), (xb, yb) = pos[ln.a], pos[ln.b]
        ax.plot([xa, xb], [ya, yb], color=colour, zorder=1,
                linewidth=1.0 + 5.0 * max(ln.gbps) / top, alpha=0.5)
        # label a third of the way up from the lower end: the links under one switch spread
        # apart there, while their midpoints crowd together
        low, high = ((xa, ya), (xb, yb)) if ya <= yb else ((xb, yb), (xa, ya))
        f = 0.5 if ya == yb else 0.33
        ax.text(low[0] + f * (high[0] - low[0]), low[1] + f * (high[1] - low[1]), ln.label,
                fontsize=5.5, ha="center", va="center", color=colour, zorder=4,
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.7, pad=0.5))

    style = {"switch": ("s", "#c6dbef"), "host": ("o", "#e5e5e5"), "rank": ("o", "#e5e5e5"),
             "bottleneck": ("D", "#fdd0a2")}
    for nd in picture.nodes:
        marker, face = style[nd.kind]
        ax.scatter([nd.x], [nd.y], s=700, marker=marker, color=face, edgecolors="#555555",
                   zorder=3)
        ax.text(nd.x, nd.y, nd.label, fontsize=6.5, ha="center", va="center", zorder=5)
    more = len(picture.trees) - shown
    trees = (f"each tree below ({shown} with the largest shares; {more} more not drawn)"
             if more > 0 else "each tree below")
    ax.set_title(f"{picture.title}\nred: a resource the plan fills; 'u>v kx p%': k tree arcs "
                 f"cross u->v, using p% of its rate; {trees}", fontsize=8)
    ax.margins(0.08)
    ax.axis("off")


def _draw_tree(ax: Any, arcs: Sequence[Tuple[int, int]], at: Sequence[Tuple[float, int]],
               root: int, deepest: int, colour: Any, title: str) -> None:
    """One arborescence, ranks on the rows of their depth (``deepest`` rows below the root, so
    that a tree's two drawings share their rows), root on top, each arc an arrow in the
    direction its data flows."""
    for src, dst in arcs:
        (xs, ds), (xd, dd) = at[src], at[dst]
        ax.annotate("", xy=(xd, -dd), xytext=(xs, -ds), zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color=colour, linewidth=1.2,
                                    shrinkA=9, shrinkB=9))
    for v, (x, d) in enumerate(at):
        is_root = v == root
        ax.scatter([x], [-d], s=330 if is_root else 220, marker="*" if is_root else "o",
                   color="#fdd0a2" if is_root else "#e5e5e5",
                   edgecolors="#d62728" if is_root else "#555555", zorder=3)
        ax.text(x, -d, str(v), fontsize=7, ha="center", va="center", zorder=4)
    ax.set_yticks([-d for d in range(deepest + 1)])
    ax.set_yticklabels(["root"] + [f"depth {d}" for d in range(1, deepest + 1)], fontsize=6)
    ax.set_xticks([])
    ax.set_ylim(-deepest - 0.5, 0.5)
    ax.set_xlim(-0.7, max(x for x, _ in at) + 0.7)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=7, loc="left")


def draw(topology: Topology, plan: Plan, path: str) -> Picture:
    """Lay out and render ``plan`` over ``topology`` into ``path``; returns the layout."""
    picture = layout(topology, plan)
    render(picture, path)
    return picture
