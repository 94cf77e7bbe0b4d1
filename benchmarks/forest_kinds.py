#!/usr/bin/env python3
"""Which forest kind the planner keeps on each row of the scale table, and by how much.

For each generator, rank count and kind of rank (cpu or gpu costs, :mod:`horotopo.costs`), it
plans the generated cluster for one allreduce size and the chunk its engine runs
(``make_plan(topology, size=..., chunk_bytes=...)``, what ``init`` does at the plan's own chunk,
and what ``benchmarks/scale_sim.py`` does at its rows' chunks; ``--chunk`` takes the same
items) and reads the planner's own record (``plan.planner["forest"]``): every kind it
packed with its predicted time, and the one it chose. A row lists each kind's predicted time,
the winner, the runner-up and how much slower it is predicted; a runner-up within
``--close`` of the winner is where a simulation should confirm the choice
(``horotopo simulate SPEC --size 64M``). The wall time of the whole ``make_plan`` is printed
beside it.

The last section counts the rows each kind wins: a kind that wins none has no place in the
planner.

``--markdown [PATH]`` also writes the table to docs/results/forest_kinds.md.

Example: python benchmarks/forest_kinds.py --ranks 64,256 --json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from horotopo import costs as cost_profiles
from horotopo.generate import SCALE_TABLE_SPECS, generate
from horotopo.algorithms.choice import forest_predictor
from horotopo.packing.forests import kind_names
from horotopo.plan import make_plan, parse_size
from horotopo.topology import from_dict

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402
from scale_sim import chunk_for, chunk_name, parse_chunks  # noqa: E402

CLOSE = 0.10


def row(spec: str, n: int, ranks_are: str, size: int, chunk: Optional[int],
        profile: cost_profiles.CostProfile) -> Dict[str, Any]:
    """Plan one generated cluster with ``profile`` charged for ``ranks_are`` ranks; the
    planner's record of the forest choice, and its wall time."""
    topology = from_dict(generate(spec, n))
    load = os.getloadavg()[0]
    with cost_profiles.charging(profile, ranks_are):
        start = time.perf_counter()
        plan = make_plan(topology, size=size, chunk_bytes=chunk,
                         predict=forest_predictor(topology))
        seconds = time.perf_counter() - start
    record = plan.planner["forest"]
    predicted = {k: record[k]["predicted_s"] for k in kind_names() if k in record}
    ranked = sorted(predicted, key=predicted.get)
    runner = ranked[1] if len(ranked) > 1 else None
    return {"generator": spec, "topology": topology.name, "n": n, "ranks_are": ranks_are,
            "size": size, "chunk": chunk_name(chunk), "chosen": record["chosen"],
            "predicted_s": predicted, "trees": len(plan.trees),
            "fastest": ranked[0], "runner_up": runner,
            "runner_up_slower": (None if runner is None
                                 else predicted[runner] / predicted[ranked[0]] - 1),
            "host_trees": record.get("hosts", {}).get("host_trees"),
            "host_trees_tried": record.get("hosts", {}).get("tried"),
            "deep_tried": record.get("deep", {}).get("tried"),
            "kind_seconds": {k: record[k].get("seconds") for k in predicted},
            "plan_s": round(seconds, 3), "load": round(load, 2)}


def _ms(r: Dict[str, Any], kind: str) -> str:
    got = r["predicted_s"].get(kind)
    return "-" if got is None else f"{got * 1e3:.2f}"


def _host_trees(r: Dict[str, Any]) -> str:
    """The host forest's count of host trees, and the counts weighed."""
    if not r["host_trees"]:
        return "-"
    tried = r["host_trees_tried"] or {str(r["host_trees"]): None}
    return f"{r['host_trees']} (of {', '.join(tried)})"


def _deep_trees(r: Dict[str, Any]) -> str:
    """The deep candidates weighed: all the packing's trees, and the fewest that carry as
    much where fewer (predicted ms each)."""
    tried = r["deep_tried"]
    return "-" if not tried else ", ".join(f"{k}: {v * 1e3:.2f}" for k, v in tried.items())


def wins(rows: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """Kind -> the rows (topology, ranks are) where the planner chose it."""
    out: Dict[str, List[str]] = {k: [] for k in kind_names()}
    for r in rows:
        out.setdefault(r["chosen"], []).append(f"{r['topology']} ({r['ranks_are']})")
    return out


def markdown(path: str, rows: List[Dict[str, Any]], close: float) -> None:
    fmt = results_doc.fmt
    kinds = [k for k in kind_names() if any(k in r["predicted_s"] for r in rows)]
    columns: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["n"]),
        ("ranks are", lambda r: r["ranks_are"]), ("chunk", lambda r: r["chunk"])]
    columns += [(f"{k} (ms, predicted)", lambda r, k=k: _ms(r, k)) for k in kinds]
    columns += [("deep trees weighed (ms)", _deep_trees),
                ("host trees (of tried)", _host_trees), ("trees", lambda r: r["trees"]),
                ("chosen", lambda r: r["chosen"]),
                ("runner-up", lambda r: r["runner_up"] or "-"),
                ("runner-up slower %", lambda r: fmt(r["runner_up_slower"], ".1f", 100)),
                ("plan (s, wall)", lambda r: f"{r['plan_s']:.2f}"),
                ("load", lambda r: f"{r['load']:.1f}")]
    won = wins(rows)
    tally = "\n".join(f"- {k}: {len(v)} row{'s' if len(v) != 1 else ''}"
                      + (f" ({', '.join(v)})" if v else "") for k, v in won.items())
    close_rows = [r for r in rows if r["runner_up_slower"] is not None
                  and r["runner_up_slower"] < close]
    near = "\n".join(f"- {r['topology']} ({r['ranks_are']}): {r['chosen']} against "
                     f"{r['runner_up']}, {r['runner_up_slower'] * 100:.1f}% apart"
                     for r in close_rows) or "- none"
    summary = (f"Allreduce size {rows[0]['size'] >> 20} MiB, planned for each row's chunk "
               f"(\"plan\": the plan's own). Each kind's time is the planner's "
               f"own prediction (`plan.planner[\"forest\"]`); the chosen kind is the one with "
               f"the lowest. Rows where the runner-up is predicted within {close * 100:g}% "
               f"are listed below: there the choice rests on the model's accuracy. Plan wall "
               f"times depend on the machine's load, shown per row (1-minute load average).")
    results_doc.write(path, "forest_kinds: the forest kind the planner keeps on each row",
                      [("", results_doc.md_table(rows, columns)),
                       ("Rows won by each kind", tally),
                       (f"Runner-up within {close * 100:g}%", near)], summary=summary)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="64,256,1024", help="comma list of rank counts")
    ap.add_argument("--generators", default=";".join(SCALE_TABLE_SPECS),
                    help="semicolon list of generator specs (horotopo.generate)")
    ap.add_argument("--ranks-are", default="cpu,gpu",
                    help="comma list of the kinds of rank whose costs are charged")
    ap.add_argument("--size", default="64M", help="allreduce size the plans are made for")
    ap.add_argument("--chunk", default="64=plan,1M", type=parse_chunks,
                    help="[RANKS=]plan|SIZE items: the chunk the engine runs per rank count, "
                         "the item without RANKS for the others (default: the scale table's)")
    ap.add_argument("--close", type=float, default=CLOSE,
                    help="a runner-up predicted within this fraction is listed")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "forest_kinds")
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size)
        ranks = [int(x) for x in args.ranks.split(",")]
        kinds = [k for k in args.ranks_are.split(",") if k]
        for kind in kinds:
            if kind not in cost_profiles.RANK_KINDS:
                raise ValueError(f"--ranks-are: one of {', '.join(cost_profiles.RANK_KINDS)}, "
                                 f"got {kind!r}")
        profile, _ = cost_profiles.from_settings()
    except (ValueError, cost_profiles.CostsError) as exc:
        print(f"forest_kinds: {exc}", file=sys.stderr)
        return 2
    rows: List[Dict[str, Any]] = []
    for spec in filter(None, args.generators.split(";")):
        for n in ranks:
            for kind in kinds:
                print(f"planning {spec} at {n} ranks, {kind} costs", file=sys.stderr,
                      flush=True)
                r = row(spec, n, kind, size, chunk_for(args.chunk, n), profile)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)  # kept if a later row fails
                if not args.json:
                    print(f"{r['topology'][:30]:<30} {n:>5} {kind:>3} chosen {r['chosen']:<8} "
                          + " ".join(f"{k} {_ms(r, k)}" for k in r["predicted_s"])
                          + f"  plan {r['plan_s']:.2f} s", flush=True)
    if args.markdown:
        markdown(args.markdown, rows, args.close)
    if args.json:
        print(json.dumps({"rows": rows, "wins": wins(rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
