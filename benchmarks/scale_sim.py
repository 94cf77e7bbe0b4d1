#!/usr/bin/env python3
"""Simulated clusters at scale: allreduce time and init time against ranks, horotopo's plan
against ring and NCCL's double binary tree, on the cluster generators of horotopo.generate.

Each point is one ``horotopo simulate`` run (:func:`horotopo.cli.simulate_cmd.simulate`): the
init path (probe or declared topology, the plan on rank 0, ``share_plan``), then one allreduce
of ``--size`` bytes per algorithm, every rank a SimGrid actor running horotopo's own code.
Times of the allreduces and of the init are simulated seconds; the planner's time is wall time
on this machine (it runs for real on rank 0), and so is each point's total wall time.

A point that does not finish within ``--max-wall`` seconds (planner included) is a measured
limit: it is reported as such, larger rank counts of that generator are not tried, and the
exit status is 0 (a limit is a finding, not a failure); a point with wrong results exits 1.

Prints a table (or JSON with ``--json``: ``{"rows": [...]}``), progress on stderr, and draws
allreduce time and init time against ranks into ``--png``.

Example (the README's figures):
  python benchmarks/scale_sim.py --ranks 16,64,256 --size 16M --png benchmarks/scale_sim.png
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional

from horotopo.cli.simulate_cmd import ALGORITHMS, resolve, simulate
from horotopo.plan import parse_size
from horotopo.simulation import SimulationError

DEFAULT_GENERATORS = ["racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25",
                      "fattree:hosts_per_leaf=8,spines=4,gpus=8",
                      "sites:gpus=8,wan_gbps=10"]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def point(spec: str, n: int, size: int, probe: str, max_wall: float) -> Dict[str, Any]:
    """One generator at one rank count: the simulate result flattened, or the limit met."""
    topo = resolve(spec, n)
    row: Dict[str, Any] = {"generator": spec, "topology": topo.name, "ranks": n, "size": size,
                           "probe": probe}
    t0 = time.perf_counter()
    try:
        res = simulate(topo, size, probe, timeout_s=max_wall)
    except SimulationError as exc:
        row.update(limit=str(exc).splitlines()[0], wall_s=time.perf_counter() - t0)
        return row
    by = {r["algorithm"]: r for r in res["rows"]}
    row.update({f"{alg}_s": by[alg]["time_s"] for alg in ALGORITHMS})
    row.update(wrong=sum(by[alg]["wrong"] for alg in ALGORITHMS),
               predicted_tree_s=by["tree"]["predicted_s"], optimum_s=res["optimum_s"],
               init_simulated_s=res["init_simulated_s"],
               probe_simulated_s=res["probe_simulated_s"], planner_s=res["planner_s"],
               messages=res["messages"], wall_s=res["wall_s"])
    return row


def table(rows: List[Dict[str, Any]]) -> str:
    head = (f"{'topology':<30} {'ranks':>5} {'tree ms':>9} {'ring ms':>9} {'dbtree ms':>9} "
            f"{'optimum ms':>10} {'init ms':>8} {'planner s':>9} {'messages':>9} {'wall s':>7}")
    lines = [head]
    for r in rows:
        if "limit" in r:
            lines.append(f"{r['topology'][:30]:<30} {r['ranks']:>5}  limit: {r['limit']}")
            continue
        opt = "-" if r["optimum_s"] is None else f"{r['optimum_s'] * 1e3:.1f}"
        lines.append(
            f"{r['topology'][:30]:<30} {r['ranks']:>5} {r['tree_s'] * 1e3:>9.1f} "
            f"{r['ring_s'] * 1e3:>9.1f} {r['dbtree_s'] * 1e3:>9.1f} {opt:>10} "
            f"{r['init_simulated_s'] * 1e3:>8.2f} {r['planner_s']:>9.2f} {r['messages']:>9} "
            f"{r['wall_s']:>7.1f}")
    return "\n".join(lines)


def plot(rows: List[Dict[str, Any]], path: str) -> None:
    """Allreduce time per algorithm, and init time (simulated init plus the planner's wall
    time), against ranks; one colour per generator."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_i) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"tree": "-o", "ring": "--s", "dbtree": ":^"}
    gens = list(dict.fromkeys(r["generator"] for r in rows))
    for k, gen in enumerate(gens):
        done = [r for r in rows if r["generator"] == gen and "limit" not in r]
        if not done:
            continue
        xs = [r["ranks"] for r in done]
        colour = f"C{k}"
        label = gen.split(":")[0]
        for alg in ALGORITHMS:
            ax_t.plot(xs, [r[f"{alg}_s"] * 1e3 for r in done], styles[alg], color=colour,
                      label=f"{label} {alg}")
        ax_i.plot(xs, [r["init_simulated_s"] + r["planner_s"] for r in done], "-o",
                  color=colour, label=f"{label}: init + planner")
        ax_i.plot(xs, [r["planner_s"] for r in done], ":", color=colour,
                  label=f"{label}: planner (wall)")
    size = rows[0]["size"] if rows else 0
    ax_t.set(xscale="log", yscale="log", xlabel="ranks", ylabel="allreduce time (ms, simulated)",
             title=f"{size / 2 ** 20:g} MiB allreduce")
    ax_i.set(xscale="log", yscale="log", xlabel="ranks", ylabel="seconds",
             title="init: simulated init + planner wall time")
    ticks = sorted({r["ranks"] for r in rows})
    for ax in (ax_t, ax_i):
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generators", default=";".join(DEFAULT_GENERATORS),
                    help="generator specs separated by ';' (default: %(default)s)")
    ap.add_argument("--ranks", default="16,64,256", help="rank counts (default %(default)s)")
    ap.add_argument("--size", default="16M", type=parse_size, help="allreduce bytes")
    ap.add_argument("--probe", default="declared", choices=["declared", "quick", "full", "off"],
                    help="declared (default: the probe's n(n-1) pair tests are slow to "
                         "simulate at hundreds of ranks), or the probe's modes")
    ap.add_argument("--max-wall", type=float, default=600.0,
                    help="wall seconds per point, planner included; past it, a measured limit")
    ap.add_argument("--png", default=None, help="draw the figure here")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    args = ap.parse_args(argv)
    ranks = sorted(int(v) for v in args.ranks.split(","))
    rows: List[Dict[str, Any]] = []
    for spec in filter(None, args.generators.split(";")):
        for n in ranks:
            say(f"{spec} at {n} ranks ...")
            row = point(spec, n, args.size, args.probe, args.max_wall)
            rows.append(row)
            if "limit" in row:
                say(f"  limit: {row['limit']} ({row['wall_s']:.0f} s); larger sizes skipped")
                break
            say(f"  tree {row['tree_s'] * 1e3:.1f} ms, ring {row['ring_s'] * 1e3:.1f} ms, "
                f"dbtree {row['dbtree_s'] * 1e3:.1f} ms; planner {row['planner_s']:.2f} s; "
                f"{row['wall_s']:.0f} s wall")
    if args.png:
        plot(rows, args.png)
        say(f"figure: {args.png}")
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(table(rows))
    return 1 if any(r.get("wrong") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
