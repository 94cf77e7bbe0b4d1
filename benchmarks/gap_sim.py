#!/usr/bin/env python3
"""Where a simulated allreduce loses to the model optimum: the simulator's effects taken away
one at a time.

The model optimum (``size / upper_bound``) charges every link its declared rate and nothing
else. The simulation charges more: the software costs (per message and per received byte,
measured on this machine), and SimGrid's TCP model (LV08): acknowledgements as reverse cross
traffic, 0.97 of a link's rate for TCP/IP headers, and the sharing of a link among flows in
inverse proportion to their route latency. This benchmark plans each cluster once
(``make_plan(size=...)``), then runs that same plan (and NCCL's double binary tree at the same
chunk) under four settings, each removing one more effect:

1. ``full``: the simulator as ``horotopo simulate`` runs it;
2. ``no costs``: ``--no-software-costs``;
3. ``no acks``: also ``network/crosstraffic:0``;
4. ``no headers``: also ``network/bandwidth-factor:1`` (what is left: the pipeline's fill and
   the latency-weighted sharing, which SimGrid's flow models cannot turn off).

Each row gives the simulated times and their share of the optimum (optimum / time), so the
drop from one setting to the next is what that effect costs, where the effects are
independent. They are not always: on a large cluster the software costs pace the sends, and
the plan can run slower without them. Simulated times do not depend on the machine's load.

    python benchmarks/gap_sim.py --ranks 64 --chunk 256K [--json]

Prints a Markdown table (or JSON), progress on stderr; ``--markdown [PATH]`` also writes it to
docs/results/gap_sim.md. Exit status 1 if any run gave a wrong result.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from horotopo.cli.simulate_cmd import resolve, simulate  # noqa: E402
from horotopo.plan import format_size, make_plan, parse_size  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

CLUSTERS = ("racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25",
            "fattree:hosts_per_leaf=8,spines=4,gpus=8",
            "sites:gpus=8,wan_gbps=10")

#: (name, software costs charged, SimGrid settings): each removes one more effect.
SETTINGS = (("full", True, ()),
            ("no costs", False, ()),
            ("no acks", False, ("network/crosstraffic:0",)),
            ("no headers", False, ("network/crosstraffic:0", "network/bandwidth-factor:1")))


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cluster_rows(spec: str, ranks: int, size: int, chunk: Optional[int],
                 algorithms: Sequence[str]) -> List[Dict[str, Any]]:
    """One row per setting for ``spec`` at ``ranks``: the same plan throughout."""
    topo = resolve(spec, ranks)
    w0 = time.perf_counter()
    plan = make_plan(topo, size=size)
    say(f"{topo.name}: planned in {time.perf_counter() - w0:.1f} s ({len(plan.trees)} trees, "
        f"forest {plan.planner.get('forest', {}).get('chosen')})")
    rows = []
    for name, costs, cfg in SETTINGS:
        w0 = time.perf_counter()
        res = simulate(topo, size, "declared", algorithms=algorithms, plan=plan,
                       chunk_bytes=chunk, software_costs=costs, simgrid_config=cfg)
        times = {r["algorithm"]: r["time_s"] for r in res["rows"]}
        wrong = sum(r["wrong"] for r in res["rows"])
        row = {"topology": topo.name, "ranks": topo.n, "size": size, "setting": name,
               "software_costs": costs, "simgrid_config": list(cfg),
               "chunk": chunk or plan.chunk_bytes, "optimum_s": res["optimum_s"],
               "predicted_s": res["rows"][0]["predicted_s"], "wrong": wrong,
               "wall_s": time.perf_counter() - w0, **{f"{a}_s": times[a] for a in times}}
        rows.append(row)
        say(f"  {name:<10} " + ", ".join(f"{a} {t * 1e3:.1f} ms" for a, t in times.items())
            + f" ({row['wall_s']:.0f} s wall)")
    return rows


def table(rows: Sequence[Dict[str, Any]], algorithms: Sequence[str]) -> str:
    head = ["topology", "setting"] + [f"{a} ms" for a in algorithms] + \
        [f"{a} of optimum" for a in algorithms] + ["optimum ms", "predicted ms"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in rows:
        cells = [r["topology"], r["setting"]]
        cells += [f"{r[a + '_s'] * 1e3:.1f}" for a in algorithms]
        cells += [f"{r['optimum_s'] / r[a + '_s']:.2f}" for a in algorithms]
        cells += [f"{r['optimum_s'] * 1e3:.1f}", f"{r['predicted_s'] * 1e3:.1f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default=";".join(CLUSTERS),
                    help="';'-separated generator specs (default: the scale table's three)")
    ap.add_argument("--ranks", type=int, default=64, help="ranks of each cluster (default 64)")
    ap.add_argument("--size", type=parse_size, default=parse_size("64M"),
                    help="allreduce size, planned for and timed (default 64M)")
    ap.add_argument("--chunk", type=parse_size, default=None,
                    help="full-size chunk for both algorithms (default: the plan's own)")
    ap.add_argument("--algorithms", default="tree,dbtree",
                    help="tree, dbtree or both (default both)")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "gap_sim")
    args = ap.parse_args(argv)
    algorithms = [a for a in args.algorithms.split(",") if a]
    if not algorithms or any(a not in ("tree", "dbtree") for a in algorithms):
        ap.error("--algorithms: tree, dbtree or both")
    rows: List[Dict[str, Any]] = []
    for spec in [s for s in args.clusters.split(";") if s]:
        rows += cluster_rows(spec, args.ranks, args.size, args.chunk, algorithms)
    chunk = format_size(args.chunk) if args.chunk else "the plan's own"
    heading = f"{format_size(args.size)} allreduce, chunk {chunk}; simulated"
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(heading)
        print(table(rows, algorithms))
    if args.markdown:
        results_doc.write(args.markdown, "gap_sim: where a simulated allreduce loses to the "
                          "optimum", [("", table(rows, algorithms))],
                          summary=f"{heading}, {args.ranks} ranks per cluster. Settings, each "
                                  f"removing one more effect: full; no costs (no software "
                                  f"costs); no acks (no TCP acknowledgements either); no "
                                  f"headers (no TCP/IP header overhead either). \"of optimum\" "
                                  f"is the optimum's time over the algorithm's.")
    bad = [r for r in rows if r["wrong"]]
    for r in bad:
        say(f"WRONG: {r['topology']} {r['setting']}: {r['wrong']} wrong elements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
