"""``horotopo plan TOPOLOGY.json``: plan a topology and print or draw the result."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..packing import format_percent
from ..packing.depth import FORESTS
from ..plan import format_size, make_plan, parse_size, target_size
from ..topology import Topology, TopologyError, bundled, load


def add_parser(sub: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan", help="plan reduce/broadcast trees for a topology file",
        description="Load a topology (declared or measured JSON form, see DESIGN.md), compute a "
                    "certified near-optimal packing of reduce/broadcast trees, and print the "
                    "trees, the predicted allreduce time, the comparison against ring allreduce "
                    "and the certified optimality gap.",
        epilog="Examples:\n  horotopo plan horotopo/data/topologies/racks-2x3.json --size 64M\n"
               "  horotopo plan racks-2x3 --json > plan.json   (bundled names work too)\n"
               "  horotopo plan topo.json --png trees.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", help="topology JSON file, or the name of a bundled one "
                                    "(racks-2x3, slow-nic, uniform-4)")
    p.add_argument("--size", default=None, type=_size,
                   help="allreduce size the plan is made for and predicted at: chunk sizes and "
                        "the deep-or-shallow forest are chosen for it (default: "
                        "HOROVOD_FUSION_THRESHOLD, 128M unless set; K, M, G are binary)")
    p.add_argument("--forest", choices=FORESTS, default="auto",
                   help="auto: keep the deep (highest-throughput) forest, or the balanced "
                        "(each rank's receive CPU packed as a resource), shallow "
                        "(depth-bounded) or hosts (rotated binary trees over machines, offered "
                        "where machines hold several ranks) one where it predicts less time "
                        "for --size by more than 5%%, or, on a measured topology, the leveled "
                        "one (packed with rates within 10%% of each other taken as equal) "
                        "where it has fewer trees and is predicted at most 10%% slower; deep, "
                        "balanced, shallow, hosts or leveled force one (default auto)")
    p.add_argument("--max-depth", type=int, default=None, metavar="D",
                   help="depth bound of the shallow forest's trees (default ceil(log2 ranks))")
    p.add_argument("--max-host-trees", type=int, default=None, metavar="K",
                   help="a host forest keeps at most K host-level trees, each as many "
                        "rank-level trees as a host has ranks (default 32): fewer trees, fewer "
                        "and larger messages; recorded in the plan")
    p.add_argument("--json", action="store_true",
                   help="print only the plan's JSON on stdout (progress goes to stderr)")
    p.add_argument("-o", "--output", help="also write the plan's JSON to this file")
    p.add_argument("--png", metavar="FILE",
                   help="draw the network (switches over their hosts, or the probe's rank "
                        "clusters and shared bottlenecks), link rates, and each tree's arcs "
                        "over it with how many cross each link (needs matplotlib)")
    p.add_argument("--chunk", type=_size, default=None,
                   help="chunk size of the pipeline (default: chosen from the model)")
    p.add_argument("--max-trees-per-root", type=int, default=4, metavar="K",
                   help="pruning keeps at most K reduce and K broadcast trees per root "
                        "(default 4)")
    p.add_argument("--target-gap", type=float, default=0.01,
                   help="stop refining once the certified gap is below this (default 0.01)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)
    return p


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def _load(spec: str) -> Topology:
    if not spec.endswith(".json") and "/" not in spec:
        try:
            return load(bundled(spec))
        except TopologyError:
            pass
    return load(spec)


def run(args: argparse.Namespace) -> int:
    if args.max_trees_per_root < 1:
        print("horotopo plan: --max-trees-per-root must be at least 1", file=sys.stderr)
        return 2
    if args.max_depth is not None and args.max_depth < 1:
        print("horotopo plan: --max-depth must be at least 1", file=sys.stderr)
        return 2
    if args.max_host_trees is not None and args.max_host_trees < 1:
        print("horotopo plan: --max-host-trees must be at least 1", file=sys.stderr)
        return 2
    if not 0 < args.target_gap < 1:
        print("horotopo plan: --target-gap must be between 0 and 1", file=sys.stderr)
        return 2
    try:
        topology = _load(args.topology)
    except TopologyError as exc:
        print(f"horotopo plan: {exc}", file=sys.stderr)
        return 2

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[plan] {msg}", file=sys.stderr, flush=True)

    progress(f"{topology.name}: {topology.n} ranks, {len(topology.resources)} resources")
    start = time.perf_counter()
    size = target_size(args.size)
    plan = make_plan(topology, chunk_bytes=args.chunk, max_trees_per_root=args.max_trees_per_root,
                     target_gap=args.target_gap, progress=progress, size=size,
                     forest=args.forest, max_depth=args.max_depth,
                     max_host_trees=args.max_host_trees)
    progress(f"planned in {time.perf_counter() - start:.2f} s")
    doc = plan.to_json()
    doc["predicted_time_s"] = plan.predict_time(size)
    doc["size"] = size
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(plan.to_json(), fh, indent=1)
        progress(f"wrote {args.output}")
    if args.png:
        try:
            from .draw import draw  # matplotlib is optional: only --png needs it

            draw(topology, plan, args.png)
        except ImportError:
            print("horotopo plan: --png needs matplotlib (pip install 'horotopo[plot]')",
                  file=sys.stderr)
            return 2
        progress(f"drew {args.png}")
    if args.json:
        print(json.dumps(doc))
    else:
        print(plan.describe(size=size))
        ratio = plan.throughput_Bps / plan.ring_Bps if plan.ring_Bps > 0 else float("inf")
        gap = plan.gap
        certified = ("no optimality certificate" if gap is None
                     else f"certified within {format_percent(gap)} of optimal")
        if gap is not None and plan.throughput_Bps < plan.packed_Bps:
            # the certificate is the LP packing's; fair sharing gives the trees less
            certified = (f"the LP packing {certified}, the trees' fair-shared rate "
                         f"{format_percent(1 - plan.throughput_Bps / plan.upper_bound_Bps)} "
                         f"below the bound")
        print(f"verdict: {ratio:.2f}x ring on the model for {format_size(size)}, "
              f"{certified}")
    return 0

