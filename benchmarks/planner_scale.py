#!/usr/bin/env python3
"""Planner at scale: the hierarchical planner on generated clusters of 8-GPU hosts, and on
measured topologies.

For each generator and rank count (and each ``--topology`` file: a probe's measured
topology, which stays outside the repository and is named in the results by its SHA-256) it
prints: the wall time to load the topology (for a file: read, check and build, apart from the
planning), to plan it
(``make_plan(topology, hierarchy=..., predict=forest_predictor(topology))``: what ``init``
does, the forest chosen on the flow model, the packing, the flat bound, every
rank-level tree's critical-path profile and chunk size and the plan's checks), the CPU time of
that (this process's, so other load on the machine does not count), and of the wall time the
packing alone; the wall and CPU time of the algorithm choice that ``init`` then makes on the
plan (:func:`horotopo.algorithms.choice.with_choice`: every registered algorithm predicted) and
which algorithm it keeps; the hierarchical plan's throughput,
the hierarchical model's certified bound and gap, the flat model's bound (priced at the
hierarchical dual), ring's throughput on the flat model, and the number of host-level and
rank-level trees. The load average is printed beside every row: wall times depend on it.

Targets: 1024 ranks planned in at most 2 s, 4096 in at most 20 s (wall), certified gap at
most 2% against the hierarchical bound. Exit status 1 when one is missed (each miss listed).
``--markdown [PATH]`` also writes the table to docs/results/planner_scale.md.

Example: python benchmarks/planner_scale.py --ranks 1024,4096 --json
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path
import time
from typing import Any, Dict, List, Optional

from horotopo.algorithms.choice import forest_predictor, with_choice
from horotopo.generate import SCALE_TABLE_SPECS, generate
from horotopo.packing.hierarchy import pack_hierarchical, ring_throughput
from horotopo.plan import make_plan
from horotopo.topology import Topology, from_dict, load

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

TIME_TARGET_S = {1024: 2.0, 4096: 20.0}
GAP_TARGET = 0.02


def _load_file(path: str) -> Topology:
    """A topology file, gzipped (``.gz``, as tests/data keeps probed ones) or not."""
    if path.endswith(".gz"):
        with gzip.open(path, "rt") as fh:
            return from_dict(json.load(fh))
    return load(path)


def row(spec: str, n: int, hierarchy: str, stage: str) -> Dict[str, Any]:
    """Plan one generated cluster (``n`` ranks of generator ``spec``) or, with ``n`` 0, the
    topology file ``spec``, and return the figures (see module docstring).

    ``stage="packing"`` times the hierarchical packing alone (what ``make_plan`` calls before
    it builds the Plan's per-tree profiles and chunks); ``plan_s`` is then None.
    """
    load_before = os.getloadavg()[0]
    sha256 = None if n else hashlib.sha256(Path(spec).read_bytes()).hexdigest()
    start = time.perf_counter()
    topology = _load_file(spec) if not n else from_dict(generate(spec, n))
    n = topology.n
    loaded = time.perf_counter() - start
    start, cpu = time.perf_counter(), time.process_time()
    if stage == "plan":
        plan = make_plan(topology, hierarchy=hierarchy, predict=forest_predictor(topology))
        p, rate, bound, gap = plan.planner, plan.throughput_Bps, plan.upper_bound_Bps, plan.gap
        ring, trees = plan.ring_Bps, len(plan.trees)
    else:
        packing = pack_hierarchical(topology)
        p, rate, bound, gap = packing.stats(), packing.throughput, packing.upper_bound, \
            packing.gap
        ring, trees = ring_throughput(topology), len(packing.trees)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    choice = choice_cpu = algorithm = None
    if stage == "plan":
        start, choice_cpu = time.perf_counter(), time.process_time()
        algorithm = with_choice(plan, topology).planner["algorithm"]
        choice, choice_cpu = time.perf_counter() - start, time.process_time() - choice_cpu
    flat = p.get("flat_upper_bound_Bps")
    return {"generator": spec, "topology": topology.name, "n": n, "stage": stage,
            "kind": topology.kind, "machines": p.get("machines"), "load_s": round(loaded, 3),
            "file": None if sha256 is None else os.path.basename(spec), "sha256": sha256,
            "plan_s": round(seconds, 3) if stage == "plan" else None,
            "cpu_s": round(cpu, 3),
            "choice_s": None if choice is None else round(choice, 3),
            "choice_cpu_s": None if choice_cpu is None else round(choice_cpu, 3),
            "algorithm": algorithm,
            "packing_s": p.get("seconds"), "flat_bound_s": p.get("flat_bound_seconds"),
            "R_MBps": rate / 1e6, "bound_MBps": None if bound is None else bound / 1e6,
            "gap": gap, "flat_bound_MBps": None if flat is None else float(flat) / 1e6,
            "flat_bound_method": p.get("flat_bound_method"),
            "ring_MBps": ring / 1e6, "host_trees": p.get("host_trees"), "trees": trees,
            "bound_phase": p.get("bound_phase"),
            "loadavg": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_row(r: Dict[str, Any]) -> None:
    gap = None if r["gap"] is None else r["gap"] * 100
    print(f"{r['topology'][:30]:<30} {r['n']:>5} {r['machines'] or '-':>4} "
          f"{_fmt(r['plan_s'], '7.2f'):>7} {r['cpu_s']:>7.2f} {_fmt(r['packing_s'], '7.2f'):>7} "
          f"{_fmt(r['choice_s'], '7.2f'):>7} {_fmt(r['choice_cpu_s'], '7.2f'):>7} "
          f"{r['R_MBps']:>9.1f} "
          f"{_fmt(r['bound_MBps'], '9.1f'):>9} {_fmt(gap, '6.2f'):>6} "
          f"{_fmt(r['flat_bound_MBps'], '9.1f'):>9} {r['ring_MBps']:>8.1f} "
          f"{r['host_trees'] or '-':>5} {r['trees']:>5} {r['loadavg'][0]:>5.1f}", flush=True)


def markdown(path: str, rows: List[Dict[str, Any]], misses: List[str], stage: str) -> None:
    """The results file: the printed table's figures, and the targets missed."""
    fmt = results_doc.fmt
    columns: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["n"]),
        ("kind", lambda r: r.get("kind", "-")),
        ("hosts", lambda r: r["machines"] or "-"),
        ("load (s, wall)", lambda r: fmt(r.get("load_s"), ".2f")),
        ("plan (s, wall)", lambda r: fmt(r["plan_s"], ".2f")),
        ("CPU (s)", lambda r: fmt(r["cpu_s"], ".2f")),
        ("packing (s)", lambda r: fmt(r["packing_s"], ".2f")),
        ("choice (s, wall)", lambda r: fmt(r["choice_s"], ".2f")),
        ("choice CPU (s)", lambda r: fmt(r["choice_cpu_s"], ".2f")),
        ("runs", lambda r: r["algorithm"] or "-"),
        ("throughput (MB/s)", lambda r: fmt(r["R_MBps"], ".1f")),
        ("bound (MB/s)", lambda r: fmt(r["bound_MBps"], ".1f")),
        ("gap %", lambda r: fmt(r["gap"], ".2f", 100)),
        ("flat bound (MB/s)", lambda r: fmt(r["flat_bound_MBps"], ".1f")),
        ("ring (MB/s)", lambda r: fmt(r["ring_MBps"], ".1f")),
        ("host trees", lambda r: r["host_trees"] or "-"), ("trees", lambda r: r["trees"]),
        ("load", lambda r: f"{r['loadavg'][0]:.1f}")]
    verdict = "All targets met." if not misses else "\n".join(f"- missed: {m}" for m in misses)
    summary = (f"Stage timed: {stage}. Targets: 1024 ranks planned in at most "
               f"{TIME_TARGET_S[1024]:g} s, 4096 in at most {TIME_TARGET_S[4096]:g} s, certified "
               f"gap at most {GAP_TARGET * 100:g}% against the hierarchical bound. The targets "
               f"are on make_plan; the algorithm choice that init makes after it is timed "
               f"beside it. Wall times depend on the machine's load, shown per row (1-minute "
               f"load average); CPU times are this process's.")
    files = [r for r in rows if r.get("sha256")]
    sections = [("", results_doc.md_table(rows, columns))]
    if files:
        sections.append(("Topology files", "Kept outside the repository; each is named by its "
                         "SHA-256.\n\n" + results_doc.md_table(files, [
                             ("topology", lambda r: r["topology"]),
                             ("file", lambda r: r["file"]), ("sha256", lambda r: r["sha256"])])))
    results_doc.write(path, "planner_scale: the hierarchical planner on generated clusters",
                      sections + [("Verdict", verdict)], summary=summary)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1024,4096", help="comma list of rank counts")
    ap.add_argument("--generators", default=";".join(SCALE_TABLE_SPECS),
                    help="semicolon list of generator specs (horotopo.generate)")
    ap.add_argument("--topology", action="append", default=[], metavar="FILE",
                    help="also plan this topology file (a probe's measured one; repeatable)")
    ap.add_argument("--hierarchy", default="on", choices=("auto", "on", "off"))
    ap.add_argument("--stage", default="plan", choices=("plan", "packing"),
                    help="time make_plan (default) or the hierarchical packing alone")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "planner_scale")
    args = ap.parse_args(argv)
    rows: List[Dict[str, Any]] = []
    misses: List[str] = []
    if not args.json:
        print(f"{'topology':<30} {'ranks':>5} {'hosts':>4} {'plan s':>7} {'cpu s':>7} "
              f"{'pack s':>7} {'choice':>7} {'ch cpu':>7} "
              f"{'R MB/s':>9} {'bound':>9} {'gap %':>6} {'flat bnd':>9} {'ring':>8} "
              f"{'htree':>5} {'trees':>5} {'load':>5}")
    points = [(spec, int(x)) for spec in filter(None, args.generators.split(";"))
              for x in args.ranks.split(",")] + [(path, 0) for path in args.topology]
    for spec, n in points:
        print(f"planning {spec}" + (f" at {n} ranks" if n else ""), file=sys.stderr,
              flush=True)
        r = row(spec, n, args.hierarchy, args.stage)
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)  # kept if a later row is cut off
        if not args.json:
            print_row(r)
        limit = TIME_TARGET_S.get(r["n"])
        took = r["plan_s"] if r["plan_s"] is not None else r["packing_s"]
        if limit is not None and took > limit:
            misses.append(f"{r['topology']}: {args.stage} took {took:.1f} s, target "
                          f"{limit:g} s (CPU {r['cpu_s']:.1f} s, load "
                          f"{r['loadavg'][0]:.1f})")
        if r["gap"] is None or r["gap"] > GAP_TARGET:
            misses.append(f"{r['topology']}: gap {_fmt(r['gap'], '.4f')}, target "
                          f"{GAP_TARGET}")
    if args.markdown:
        markdown(args.markdown, rows, misses, args.stage)
    if args.json:
        print(json.dumps({"rows": rows, "misses": misses}, indent=1))
    else:
        for m in misses:
            print(f"MISSED {m}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
