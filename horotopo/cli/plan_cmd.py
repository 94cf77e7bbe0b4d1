"""``horotopo plan TOPOLOGY``: plan a topology and print or draw the result."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

from ..algorithms.choice import forest_predictor, with_choice
from ..packing import format_percent, plural
from ..packing.forests import FORESTS, check_forest
from ..packing.hierarchy import use_hierarchy
from ..params import PLANNER
from ..plan import Plan, format_size, make_plan, target_size
from ..topology import bundled_names, load
from . import CommandError, positive_size, writable_path, write_text


def add_parser(sub: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan", help="plan reduce/broadcast trees for a topology file",
        description="Load a topology (declared or measured JSON form, see docs/topology.md), "
                    "compute a certified near-optimal packing of reduce/broadcast trees, and "
                    "print the trees (each arc in the direction its data flows), every "
                    "allreduce algorithm's predicted time (the plan's trees, ring, NCCL's "
                    "double binary tree, hierarchical allreduce) with the one the engine runs "
                    "for large allreduces (the fastest), and the certified optimality gap.",
        epilog="Examples:\n  horotopo plan horotopo/data/topologies/racks-2x3.json --size 64M\n"
               "  horotopo plan racks-2x3 --json > plan.json   (bundled names work too)\n"
               "  horotopo plan topo.json --png trees.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", help="topology JSON file, or the name of a bundled one "
                                    f"({', '.join(bundled_names())})")
    p.add_argument("--size", default=None, type=positive_size,
                   help="allreduce size the plan is made for and predicted at: chunk sizes and "
                        "the forest kind are chosen for it (default: "
                        "HOROVOD_FUSION_THRESHOLD, 128M unless set; K, M, G are binary)")
    p.add_argument("--forest", choices=FORESTS, default="auto",
                   help="auto: keep the forest kind predicted fastest for --size: the "
                        "certified deep one, a host forest (rotated binary trees over "
                        "machines, where machines hold several ranks) or ring's chains; a "
                        "kind's name forces it (default auto)")
    p.add_argument("--max-host-trees", type=int, default=None, metavar="K",
                   help="a host forest keeps at most K host-level trees, each as many "
                        "rank-level trees as a host has ranks (default 32): fewer trees, fewer "
                        "and larger messages; recorded in the plan")
    p.add_argument("--json", action="store_true",
                   help="print only the plan's JSON on stdout (progress goes to stderr)")
    p.add_argument("-o", "--output", help="also write the plan's JSON to this file")
    p.add_argument("--png", metavar="FILE",
                   help="draw the plan (needs matplotlib): the network (switches over their "
                        "hosts, or the probe's rank clusters and shared bottlenecks) with its "
                        "link rates and how many tree arcs cross each link, then one panel per "
                        "tree: its root marked, its ranks by depth, reduce arcs up and "
                        "broadcast arcs down")
    p.add_argument("--chunk", type=positive_size, default=None,
                   help="chunk size of the pipeline (default: chosen from the model)")
    p.add_argument("--max-trees-per-root", type=int, default=None,
                   metavar="K", help="pruning keeps at most K reduce and K broadcast trees per "
                                     "root (default HOROTOPO_PLANNER_MAX_TREES_PER_ROOT, else "
                                     f"{PLANNER.max_trees_per_root})")
    p.add_argument("--target-gap", type=float, default=None,
                   help="stop refining once the certified gap is below this (default "
                        f"HOROTOPO_PLANNER_TARGET_GAP, else {PLANNER.target_gap:g})")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    for option, value in (("--max-trees-per-root", args.max_trees_per_root),
                          ("--max-host-trees", args.max_host_trees)):
        if value is not None and value < 1:
            raise CommandError(f"{option} must be at least 1, got {value}")
    if args.target_gap is not None and not 0 < args.target_gap < 1:
        raise CommandError(f"--target-gap must be between 0 and 1, got {args.target_gap}")
    # output paths are checked before the planner runs, so that a typo costs no planning
    if args.output:
        writable_path("-o", args.output)
    if args.png:
        writable_path("--png", args.png)
        try:
            from .draw import draw  # matplotlib is optional: only --png needs it
        except ImportError:
            raise CommandError("--png needs matplotlib (pip install 'horotopo[plot]')") from None
    topology = load(args.topology)
    try:
        check_forest(args.forest, topology, use_hierarchy(topology))
    except ValueError as exc:
        raise CommandError(f"--forest: {exc}") from None

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[plan] {msg}", file=sys.stderr, flush=True)

    progress(f"{topology.name}: {plural(topology.n, 'rank')}, "
             f"{plural(len(topology.resources), 'resource')}")
    start = time.perf_counter()
    size = target_size(args.size)
    plan = make_plan(topology, chunk_bytes=args.chunk, max_trees_per_root=args.max_trees_per_root,
                     target_gap=args.target_gap, progress=progress, size=size,
                     forest=args.forest,
                     max_host_trees=args.max_host_trees,
                     predict=forest_predictor(topology))
    plan = with_choice(plan, topology, size)
    progress(f"planned in {time.perf_counter() - start:.2f} s")
    chosen = plan.planner["algorithm"]
    predicted = plan.planner["predicted_s"]
    speedup = predicted["ring"] / predicted[chosen] if predicted[chosen] > 0 else math.inf
    doc = plan.to_json()
    doc["size"] = size
    doc["predicted_time_s"] = predicted[chosen]
    doc["ring_speedup"] = speedup
    if args.output:
        write_text("-o", args.output, json.dumps(plan.to_json(), indent=1))
        progress(f"wrote {args.output}")
    if args.png:
        try:
            draw(topology, plan, args.png)
        except OSError as exc:
            raise CommandError(f"--png {args.png}: cannot write: {exc.strerror or exc}") from None
        progress(f"drew {args.png}")
    if args.json:
        print(json.dumps(doc))
        return 0
    print(plan.describe())
    print(f"  predicted allreduce of {format_size(size)}: {predicted[chosen] * 1e3:.3f} ms by "
          f"{chosen} (ring {predicted['ring'] * 1e3:.3f} ms)")
    print("  algorithms: " + ", ".join(f"{name} {seconds * 1e3:.3f} ms"
                                      + (" (runs)" if name == chosen else "")
                                      for name, seconds in predicted.items()))
    print(f"verdict: {_versus_ring(speedup)} on the model for {format_size(size)}, "
          f"{_certificate(plan)}")
    return 0


def _versus_ring(speedup: float) -> str:
    """The plan against ring, from ring's predicted time over the plan's."""
    if round(speedup, 2) > 1:
        return f"{speedup:.2f}x faster than ring"
    if round(speedup, 2) < 1:
        return f"slower than ring ({speedup:.2f}x its speed)"
    return "as fast as ring (1.00x)"


def _certificate(plan: Plan) -> str:
    gap = plan.gap
    if gap is None:
        return "no optimality certificate"
    certified = f"certified within {format_percent(gap)} of optimal"
    if plan.throughput_Bps < plan.packed_Bps:
        # the certificate is the LP packing's; fair sharing gives the trees less
        below = 1 - plan.throughput_Bps / plan.upper_bound_Bps
        certified = (f"the LP packing {certified}, the trees' fair-shared rate "
                     f"{format_percent(below)} below the bound")
    return certified
