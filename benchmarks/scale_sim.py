#!/usr/bin/env python3
"""Simulated clusters at scale: allreduce time and init time against ranks, horotopo's plan
against ring, NCCL's double binary tree and Horovod's hierarchical allreduce, on the cluster
generators of horotopo.generate.

Each point is one ``horotopo simulate`` run (:func:`horotopo.cli.simulate_cmd.simulate`): the
init path (probe or declared topology, the plan on rank 0, ``share_plan``), then one allreduce
of ``--size`` bytes per algorithm, every rank a SimGrid actor running horotopo's own code.
Times of the allreduces and of the init are simulated seconds; the planner's time is wall time
on this machine (it runs for real on rank 0), and so is each point's total wall time.

A point that does not finish within ``--max-wall`` seconds (planner included) is a measured
limit: it is reported as such, larger rank counts of that generator are not tried, and the
exit status is 0 (a limit is a finding, not a failure); a point with wrong results exits 1.

Prints a table (or JSON with ``--json``: ``{"rows": [...]}``), progress on stderr, and draws
allreduce time and init time against ranks into ``--png``. ``--markdown [PATH]`` also writes
docs/results/scale_sim.md: horotopo against ring and the double binary tree, each as a
fraction of the optimum (the certified bound's time), and the init costs.

Example (docs/results/scale_sim.md):
  python benchmarks/scale_sim.py --ranks 16,64 --size 64M --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from horotopo.cli.simulate_cmd import ALGORITHMS, parse_algorithms, resolve, simulate
from horotopo.plan import Plan, parse_size
from horotopo.simulation import SimulationError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

DEFAULT_GENERATORS = ["racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25",
                      "fattree:hosts_per_leaf=8,spines=4,gpus=8",
                      "sites:gpus=8,wan_gbps=10"]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cached(plans: Optional[Path], name: str) -> Tuple[Optional[Plan], Optional[float]]:
    """A plan saved for topology ``name`` under ``plans`` and the planner's time then."""
    path = plans / f"{name}.json" if plans else None
    if path is None or not path.exists():
        return None, None
    doc = json.loads(path.read_text())
    return Plan.from_json(doc["plan"]), doc.get("planner_s")


def point(spec: str, n: int, size: int, probe: str, max_wall: float,
          algorithms: Sequence[str] = ALGORITHMS, chunk: Optional[int] = None,
          plans: Optional[Path] = None, ranks_are: str = "cpu",
          cuda_aware: bool = True) -> Dict[str, Any]:
    """One generator at one rank count: the simulate result flattened, or the limit met.

    ``ranks_are`` and ``cuda_aware`` choose the software costs charged and planned with
    (``horotopo simulate --ranks-are``); plans are saved per kind of rank.

    With ``plans`` (a folder), a plan saved there for the topology is shared instead of
    planning (the row keeps the planner time saved with it, ``planner`` "cached"), and a plan
    made here is saved there."""
    topo = resolve(spec, n)
    row: Dict[str, Any] = {"generator": spec, "topology": topo.name, "ranks": n, "size": size,
                           "probe": probe, "chunk_bytes": chunk, "ranks_are": ranks_are,
                           "cuda_aware": cuda_aware}
    saved_as = topo.name if ranks_are == "cpu" else \
        f"{topo.name}-gpu{'' if cuda_aware else '-staged'}"
    given, planner_s = _cached(plans, saved_as)
    t0 = time.perf_counter()
    try:
        res = simulate(topo, size, probe, timeout_s=max_wall, algorithms=algorithms,
                       plan=given, chunk_bytes=chunk, progress=say,
                       ranks_are=ranks_are, cuda_aware=cuda_aware)
    except SimulationError as exc:
        row.update(limit=str(exc).splitlines()[0], wall_s=time.perf_counter() - t0)
        return row
    if given is None and plans is not None:
        plans.mkdir(parents=True, exist_ok=True)
        (plans / f"{saved_as}.json").write_text(json.dumps(
            {"plan": res["plan"], "planner_s": res["planner_s"]}))
    by = {r["algorithm"]: r for r in res["rows"]}
    row.update({f"{alg}_s": by[alg]["time_s"] if alg in by else None for alg in ALGORITHMS})
    row.update(wrong=sum(r["wrong"] for r in res["rows"]),
               predicted_tree_s=by["tree"]["predicted_s"] if "tree" in by else None,
               predicted_hierarchical_s=(by["hierarchical"]["predicted_s"]
                                         if "hierarchical" in by else None),
               optimum_s=res["optimum_s"], init_simulated_s=res["init_simulated_s"],
               probe_simulated_s=res["probe_simulated_s"],
               planner_s=res["planner_s"] if given is None else planner_s,
               planner="cached" if given is not None else "run",
               chunks={r["algorithm"]: r["chunk_bytes"] for r in res["rows"]},
               messages=res["messages"], wall_s=res["wall_s"],
               cpu_s=res["simulation_cpu_s"])
    return row


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def table(rows: List[Dict[str, Any]]) -> str:
    head = (f"{'topology':<30} {'ranks':>5} {'tree ms':>9} {'predicted':>9} {'ring ms':>9} "
            f"{'dbtree ms':>9} {'hier. ms':>9} "
            f"{'optimum ms':>10} {'init ms':>8} {'planner s':>9} {'chunk':>6} {'messages':>9} "
            f"{'wall s':>7} {'cpu s':>6}")
    lines = [head]
    for r in rows:
        if "limit" in r:
            lines.append(f"{r['topology'][:30]:<30} {r['ranks']:>5}  limit: {r['limit']}")
            continue
        planner = "-" if r["planner_s"] is None else f"{r['planner_s']:.2f}"
        if r["planner"] == "cached":
            planner += "*"
        chunk = "plan" if r["chunk_bytes"] is None else f"{r['chunk_bytes'] >> 10}K"
        lines.append(
            f"{r['topology'][:30]:<30} {r['ranks']:>5} {_ms(r['tree_s']):>9} "
            f"{_ms(r['predicted_tree_s']):>9} {_ms(r['ring_s']):>9} {_ms(r['dbtree_s']):>9} "
            f"{_ms(r['hierarchical_s']):>9} {_ms(r['optimum_s']):>10} "
            f"{r['init_simulated_s'] * 1e3:>8.2f} {planner:>9} {chunk:>6} {r['messages']:>9} "
            f"{r['wall_s']:>7.1f} {r['cpu_s']:>6.1f}")
    if any(r.get("planner") == "cached" for r in rows):
        lines.append("* planner time saved with a cached plan (--plans), not run here")
    return "\n".join(lines)


def _of_optimum(r: Dict[str, Any], alg: str) -> str:
    """``optimum time / algorithm time``: 1.0 is the best any packing could do."""
    t = r.get(f"{alg}_s")
    if t is None or not r.get("optimum_s"):
        return "-"
    return f"{r['optimum_s'] / t:.2f}"


def markdown(args: argparse.Namespace, rows: List[Dict[str, Any]]) -> None:
    """The results file: allreduce times per algorithm with their fraction of the optimum,
    then the init costs and the simulation's own cost."""
    fmt = results_doc.fmt
    done = [r for r in rows if "limit" not in r]
    speed: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["ranks"]),
        ("horotopo (ms)", lambda r: fmt(r["tree_s"], ".1f", 1e3)),
        ("horotopo / optimum", lambda r: _of_optimum(r, "tree")),
        ("ring (ms)", lambda r: fmt(r["ring_s"], ".1f", 1e3)),
        ("ring / optimum", lambda r: _of_optimum(r, "ring")),
        ("dbtree (ms)", lambda r: fmt(r["dbtree_s"], ".1f", 1e3)),
        ("dbtree / optimum", lambda r: _of_optimum(r, "dbtree")),
        ("hierarchical (ms)", lambda r: fmt(r["hierarchical_s"], ".1f", 1e3)),
        ("hierarchical / optimum", lambda r: _of_optimum(r, "hierarchical")),
        ("hierarchical predicted (ms)",
         lambda r: fmt(r.get("predicted_hierarchical_s"), ".1f", 1e3)),
        ("optimum (ms)", lambda r: fmt(r["optimum_s"], ".1f", 1e3)),
        ("predicted (ms)", lambda r: fmt(r["predicted_tree_s"], ".1f", 1e3)),
        ("#wrong", lambda r: r["wrong"])]
    cost: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["ranks"]),
        ("init (ms, simulated)", lambda r: fmt(r["init_simulated_s"], ".2f", 1e3)),
        ("planner (s, wall)", lambda r: fmt(r["planner_s"], ".2f")
         + ("*" if r["planner"] == "cached" else "")),
        ("chunk", lambda r: "plan's" if r["chunk_bytes"] is None
         else f"{r['chunk_bytes'] >> 10} KiB"),
        ("messages", lambda r: r["messages"]),
        ("simulation wall (s)", lambda r: fmt(r["wall_s"], ".1f")),
        ("simulation CPU (s)", lambda r: fmt(r["cpu_s"], ".1f"))]
    sections = [("Allreduce time", results_doc.md_table(done, speed)),
                ("Init and simulation cost", results_doc.md_table(done, cost))]
    limits = [r for r in rows if "limit" in r]
    if limits:
        sections.append(("Limits met", "\n".join(
            f"- {r['topology']} at {r['ranks']} ranks: {r['limit']} after {r['wall_s']:.0f} s"
            for r in limits)))
    if any(r.get("planner") == "cached" for r in done):
        sections.append(("", "\\* planner time saved with a cached plan (`--plans`), not run "
                             "here."))
    summary = (f"One {args.size / 2 ** 20:g} MiB allreduce per algorithm on simulated clusters "
               f"(SimGrid; every rank runs horotopo's own code), topology from --probe "
               f"{args.probe}. Times are simulated. \"/ optimum\" is the optimum's time (the "
               f"size over the certified upper bound on any tree packing's throughput) divided "
               f"by the algorithm's time: 1.00 would be the best possible. The planner's time "
               f"is wall time on this machine.")
    results_doc.write(args.markdown, "scale_sim: horotopo, ring, double binary tree and "
                      "hierarchical allreduce on simulated clusters", sections, summary=summary)


def plot(rows: List[Dict[str, Any]], path: str) -> None:
    """Allreduce time per algorithm, and init time (simulated init plus the planner's wall
    time), against ranks; one colour per generator."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_i) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"tree": "-o", "ring": "--s", "dbtree": ":^", "hierarchical": "-.d"}
    gens = list(dict.fromkeys(r["generator"] for r in rows))
    for k, gen in enumerate(gens):
        done = [r for r in rows if r["generator"] == gen and "limit" not in r]
        if not done:
            continue
        xs = [r["ranks"] for r in done]
        colour = f"C{k}"
        label = gen.split(":")[0]
        for alg in ALGORITHMS:
            pts = [(r["ranks"], r[f"{alg}_s"] * 1e3) for r in done if r[f"{alg}_s"] is not None]
            if pts:
                ax_t.plot(*zip(*pts), styles[alg], color=colour, label=f"{label} {alg}")
        timed = [r for r in done if r["planner_s"] is not None]
        ax_i.plot([r["ranks"] for r in timed],
                  [r["init_simulated_s"] + r["planner_s"] for r in timed], "-o",
                  color=colour, label=f"{label}: init + planner")
        ax_i.plot([r["ranks"] for r in timed], [r["planner_s"] for r in timed], ":",
                  color=colour, label=f"{label}: planner (wall)")
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
                    help="declared (default: the topology as generated), or the probe's "
                         "modes: init by probing, as init() does (the probe by hosts adds about "
                         "3 minutes of wall time at 1024 ranks on 128 hosts)")
    ap.add_argument("--max-wall", type=float, default=600.0,
                    help="wall seconds per point, planner included; past it, a measured limit "
                         "(default %(default)g: a 1024-rank point of tree and dbtree at 256 KiB "
                         "chunks takes 6-15 minutes here, 4096 ranks longer)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS),
                    help="subset of %(default)s (ring's 2 n (n - 1) messages dominate at "
                         "thousands of ranks)")
    ap.add_argument("--chunk", default=None, type=parse_size,
                    help="full-size chunk for every algorithm instead of the plans' (fewer "
                         "messages: a faster simulation of a different engine setting)")
    ap.add_argument("--plans", default=None, type=Path,
                    help="folder of plans per topology name: reused when present (the "
                         "planner's saved time is shown, starred), saved when made here")
    ap.add_argument("--ranks-are", default="cpu", choices=("cpu", "gpu"),
                    help="software costs of CPU ranks (this machine's profile) or of GPU ranks "
                         "(the device path), as horotopo simulate --ranks-are")
    ap.add_argument("--cuda-aware", default="yes", choices=("yes", "no"),
                    help="with --ranks-are gpu: MPI takes device buffers, or stages them")
    ap.add_argument("--png", default=None, help="draw the figure here")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "scale_sim")
    args = ap.parse_args(argv)
    ranks = sorted(int(v) for v in args.ranks.split(","))
    rows: List[Dict[str, Any]] = []
    for spec in filter(None, args.generators.split(";")):
        for n in ranks:
            say(f"{spec} at {n} ranks ...")
            row = point(spec, n, args.size, args.probe, args.max_wall,
                        parse_algorithms(args.algorithms), args.chunk, args.plans,
                        args.ranks_are, args.cuda_aware == "yes")
            rows.append(row)
            if "limit" in row:
                say(f"  limit: {row['limit']} ({row['wall_s']:.0f} s); larger sizes skipped")
                break
            say(f"  tree {_ms(row['tree_s'])} ms, ring {_ms(row['ring_s'])} ms, dbtree "
                f"{_ms(row['dbtree_s'])} ms, hierarchical {_ms(row['hierarchical_s'])} ms; "
                f"planner {row['planner_s']} s "
                f"({row['planner']}); {row['wall_s']:.0f} s wall, {row['cpu_s']:.0f} s CPU, "
                f"load {os.getloadavg()[0]:.1f}")
    if args.png:
        plot(rows, args.png)
        say(f"figure: {args.png}")
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(table(rows))
    if args.markdown:
        markdown(args, rows)
    return 1 if any(r.get("wrong") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
