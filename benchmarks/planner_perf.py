#!/usr/bin/env python3
"""Planner benchmark: certified gap, pruning loss and planning time.

Three parts, each printed as a table (or JSON with --json):

- ``gap``: every bundled topology (horotopo/data/topologies) plus random families
  (switch trees with heterogeneous NICs, racks behind uplinks, measured matrices with host caps
  and a shared bottleneck) at several sizes and seeds. Target: certified gap <= 2% on each.
- ``time``: planning time at 16 and 64 ranks. Targets on a 2-core machine: <= 2 s and <= 30 s.
- ``scaling``: time and gap from 8 up to ``--max-ranks`` (default 256).

Exit status 1 when a target is missed (so a regression is visible), 0 otherwise.
``--markdown [PATH]`` also writes the tables to docs/results/planner_perf.md.

Example: python benchmarks/planner_perf.py --parts gap,time --seeds 3
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from horotopo import generate
from horotopo.plan import make_plan
from horotopo.topology import Topology, bundled, from_dict, load

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def families(n: int, seed: int) -> Dict[str, Dict[str, Any]]:
    racks = max(2, min(4, n // 4))
    sizes = [n // racks] * (racks - 1) + [n - (racks - 1) * (n // racks)]
    return {
        "declared": generate.random_declared(n, seed),
        "racks": generate.racks(sizes, uplink_gbps=round(0.3 + 0.5 * (seed % 4), 2)),
        "measured": generate.random_measured(n, seed),
    }


def plan_row(kind: str, topology: Topology) -> Dict[str, Any]:
    start = time.perf_counter()
    plan = make_plan(topology)
    seconds = time.perf_counter() - start
    return {"kind": kind, "name": topology.name, "n": topology.n, "seconds": round(seconds, 3),
            "R_MBps": plan.throughput_Bps / 1e6, "ring_MBps": plan.ring_Bps / 1e6,
            "bound_MBps": plan.upper_bound_Bps / 1e6, "gap": plan.gap,
            "pruning_loss": plan.pruning_loss, "trees": len(plan.trees)}


def print_rows(title: str, rows: List[Dict[str, Any]]) -> None:
    print(f"\n# {title}")
    print(f"{'kind':<10} {'name':<28} {'n':>4} {'R MB/s':>10} {'ring MB/s':>10} "
          f"{'vs ring':>8} {'bound':>10} {'gap %':>7} {'prune %':>8} {'trees':>6} {'time s':>8}")
    for r in rows:
        print(f"{r['kind']:<10} {r['name'][:28]:<28} {r['n']:>4} {r['R_MBps']:>10.3f} "
              f"{r['ring_MBps']:>10.3f} {r['R_MBps'] / r['ring_MBps']:>7.2f}x "
              f"{r['bound_MBps']:>10.3f} {r['gap'] * 100:>7.3f} {r['pruning_loss'] * 100:>8.3f} "
              f"{r['trees']:>6} {r['seconds']:>8.2f}", flush=True)


PLAN_COLUMNS: List[results_doc.Column] = [
    ("kind", lambda r: r["kind"]), ("topology", lambda r: r["name"]), ("ranks", lambda r: r["n"]),
    ("throughput (MB/s)", lambda r: f"{r['R_MBps']:.3f}"),
    ("ring (MB/s)", lambda r: f"{r['ring_MBps']:.3f}"),
    ("vs ring", lambda r: f"{r['R_MBps'] / r['ring_MBps']:.2f}x"),
    ("bound (MB/s)", lambda r: f"{r['bound_MBps']:.3f}"),
    ("gap %", lambda r: f"{r['gap'] * 100:.3f}"),
    ("pruning loss %", lambda r: f"{r['pruning_loss'] * 100:.3f}"),
    ("trees", lambda r: r["trees"]), ("planning (s)", lambda r: f"{r['seconds']:.2f}")]

TITLES = {"gap": "Certified gap", "time": "Planning time", "scaling": "Scaling"}


def markdown(path: str, out: Dict[str, Any], max_gap: float) -> None:
    """The results file: one table per part run, and the targets missed."""
    sections = [(TITLES[part], results_doc.md_table(out[part], PLAN_COLUMNS))
                for part in ("gap", "time", "scaling") if part in out]
    missed = out["failures"]
    sections.append(("Verdict", "All targets met." if not missed else
                     "\n".join(f"- missed: {m}" for m in missed)))
    summary = (f"Targets: certified gap at most {max_gap * 100:g}% on every topology; planning "
               f"at most 2 s at 16 ranks and 30 s at 64 ranks. Planning time is wall time on "
               f"this machine; the gap is the plan's throughput against the certified upper "
               f"bound on any tree packing.")
    results_doc.write(path, "planner_perf: certified gap, pruning loss and planning time",
                      sections, summary=summary)


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="gap,time,scaling",
                    help="comma list of gap, time, scaling (default all)")
    ap.add_argument("--seeds", type=int, default=3, help="random seeds per family and size")
    ap.add_argument("--sizes", default="4,8,16,32", help="rank counts for the gap part")
    ap.add_argument("--max-ranks", type=int, default=256, help="largest size in scaling")
    ap.add_argument("--max-gap", type=float, default=0.02, help="gap target (default 0.02)")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "planner_perf")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    out: Dict[str, Any] = {}
    failures: List[str] = []

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if "gap" in parts:
        rows = []
        files = sorted((ROOT / "horotopo" / "data" / "topologies").glob("*.json"))
        for f in files:
            rows.append(plan_row("file", load(f)))
        for n in [int(s) for s in args.sizes.split(",")]:
            for seed in range(args.seeds):
                for kind, doc in families(n, seed).items():
                    log(f"[gap] {kind} n={n} seed={seed}")
                    rows.append(plan_row(kind, from_dict(doc)))
        out["gap"] = rows
        bad = [r for r in rows if r["gap"] > args.max_gap]
        failures += [f"gap {r['gap'] * 100:.2f}% on {r['name']}" for r in bad]
        if not args.json:
            print_rows(f"certified gap (target <= {args.max_gap * 100:.0f}%): "
                       f"{len(rows) - len(bad)}/{len(rows)} within, worst "
                       f"{max(r['gap'] for r in rows) * 100:.3f}%", rows)

    if "time" in parts:
        rows = []
        for n, limit in ((16, 2.0), (64, 30.0)):
            for seed in range(args.seeds):
                for kind, doc in families(n, seed).items():
                    log(f"[time] {kind} n={n} seed={seed}")
                    row = plan_row(kind, from_dict(doc))
                    row["limit_s"] = limit
                    rows.append(row)
                    if row["seconds"] > limit:
                        failures.append(f"{row['seconds']:.1f} s > {limit} s on {row['name']}")
        out["time"] = rows
        if not args.json:
            print_rows("planning time (targets: 16 ranks <= 2 s, 64 ranks <= 30 s)", rows)

    if "scaling" in parts:
        rows = []
        n = 8
        while n <= args.max_ranks:
            for kind, doc in families(n, 0).items():
                if kind == "measured" and n > 128:
                    continue  # n^2 pair resources; the LP alone outgrows this machine
                log(f"[scaling] {kind} n={n}")
                rows.append(plan_row(kind, from_dict(doc)))
            n *= 2
        out["scaling"] = rows
        if not args.json:
            print_rows("scaling", rows)

    for part in ("time", "scaling"):
        for r in out.get(part, []):
            if r["gap"] > args.max_gap:
                failures.append(f"gap {r['gap'] * 100:.2f}% on {r['name']} ({part})")
    out["failures"] = failures
    if args.markdown:
        markdown(args.markdown, out, args.max_gap)
    if args.json:
        print(json.dumps(out))
    else:
        print("\nverdict: " + ("all targets met" if not failures else
                               f"{len(failures)} missed: " + "; ".join(failures[:10])))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
