#!/usr/bin/env python3
"""The scale table: horotopo against ring, NCCL's double binary tree and Horovod's hierarchical
allreduce on simulated clusters, predicted against simulated, with CPU and GPU ranks.

A row is one cluster generator of :mod:`horotopo.generate` at one rank count, with the software
costs of CPU ranks or of GPU ranks (``horotopo simulate --ranks-are``). Its plan is made here
once, with the choice init records in it (:func:`horotopo.algorithms.choice.with_choice`;
the planner's and the choice's wall times are measured), and every algorithm is one cell: one
``horotopo simulate`` run of that algorithm alone (:func:`horotopo.cli.simulate_cmd.simulate`)
sharing that plan, beside the model's prediction for it
(:func:`horotopo.algorithms.choice.predictions`). The "horotopo" column is the cell of the
algorithm horotopo runs with the plan
(:func:`~horotopo.algorithms.choice.recorded_algorithm`), not another simulation.

The simulation's wall time is what this benchmark is planned around: a cell costs from seconds
(64 ranks) to many minutes (ring at 1024 ranks, ``2 n (n - 1)`` messages). So

- ``--chunk`` sets every algorithm's full-size chunk per rank count (``plan``: the row's
  plan's, as horotopo's engine runs any algorithm; a size: that chunk, fewer messages);
- ``--max-wall`` bounds each cell: a cell past it is a measured limit, shown as such in the
  table, and the same algorithm is not tried at larger rank counts of that generator;
- ``--budget`` bounds the whole run: the cells left when it is spent are listed as not run;
- ``--cache FILE`` keeps every finished cell (and each row's plan) in a JSON file: a later run
  with the same file reuses them and simulates only what is missing, so the table can be
  built across several runs. A cell's record carries the commit it was simulated at, and the
  results file lists them; a row's key carries the software costs its cells were charged, so
  a cell simulated under another cost profile is simulated again, never reused.

Progress goes to stderr, cell by cell with the elapsed time. A cell with wrong results makes
the exit status 1; limits and cells not run do not (they are findings, reported).

Example (docs/results/scale_sim.md; a few minutes here per 256-rank row):
  python benchmarks/scale_sim.py --ranks 64,256 --cache /tmp/scale_sim.json --markdown
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from horotopo import costs as cost_profiles
from horotopo.generate import SCALE_TABLE_SPECS
from horotopo.algorithms.choice import (forest_predictor, predictions, recorded_algorithm,
                                        with_choice)
from horotopo.algorithms.simcheck import measure_network, simulated_costs
from horotopo.cli.simulate_cmd import ALGORITHMS, parse_algorithms, resolve, simulate
from horotopo.algorithms.flows import TCP_NETWORK
from horotopo.packing.alphabeta import IDEAL_NETWORK, NetworkModel
from horotopo.plan import Plan, format_size, make_plan, parse_size
from horotopo.simulation import SimulationError
from horotopo.topology import Topology, TopologyError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

#: The peers' names in the table, after horotopo's.
PEERS = ("ring", "dbtree", "hierarchical")
PLAN_CHUNK = "plan"
#: --predict-on: the network the predictions are made for.
PREDICT_ON = {"simulator": "simulator's", "declared": "declared"}
MEASURED = " (measured from single messages: horotopo.algorithms.simcheck.measure_network)"

T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.0f} s] {msg}", file=sys.stderr, flush=True)


def parse_chunks(text: str) -> Dict[Optional[int], Optional[int]]:
    """``"64=plan,1M"`` -> ``{64: None, None: 1048576}``: the chunk per rank count, the entry
    without a rank count for the others; ``plan`` (None) is the row's plan's chunk."""
    out: Dict[Optional[int], Optional[int]] = {}
    for item in filter(None, (v.strip() for v in text.split(","))):
        ranks, sep, value = item.rpartition("=")
        try:
            key = int(ranks) if sep else None
            out[key] = None if value == PLAN_CHUNK else parse_size(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--chunk: expected [RANKS=]plan|SIZE items, got {item!r}") from None
        if out[key] is not None and out[key] <= 0:
            raise argparse.ArgumentTypeError(f"--chunk: {item!r} is not a positive size")
    return out


def chunk_for(chunks: Dict[Optional[int], Optional[int]], n: int) -> Optional[int]:
    return chunks.get(n, chunks.get(None))


def chunk_name(chunk: Optional[int]) -> str:
    return PLAN_CHUNK if chunk is None else format_size(chunk)


def costs_name(ranks_are: str, cuda_aware: bool) -> str:
    return ranks_are if ranks_are == "cpu" or cuda_aware else f"{ranks_are}-staged"


class CacheError(ValueError):
    """A --cache file this benchmark cannot read."""


class Cache:
    """Finished cells and rows' plans, in a JSON file (or in memory only, without a path)."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.doc: Dict[str, Dict[str, Any]] = {"rows": {}, "cells": {}}
        if path is not None and path.exists():
            try:
                loaded = json.loads(path.read_text())
                self.doc = {"rows": dict(loaded["rows"]), "cells": dict(loaded["cells"])}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CacheError(f"--cache {path}: not a cache this benchmark wrote ({exc}); "
                                 f"remove it or name another file") from None

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.doc))
        os.replace(tmp, self.path)


def charges_name(profile: cost_profiles.CostProfile, ranks_are: str, cuda_aware: bool) -> str:
    """The software costs a row's cells are charged, as its key spells them: a cell simulated
    under other figures (a new built-in profile, another calibration) is not the same cell."""
    per_message, per_byte = profile.charges(ranks_are, cuda_aware)
    return f"{per_message:.6g}s/msg,{per_byte:.6g}s/B"


def row_key(spec: str, n: int, size: int, probe: str, costs: str, charges: str) -> str:
    return f"{spec}|{n}|{size}|{probe}|{costs}|{charges}"


def plan_row(cache: Cache, key: str, spec: str, n: int, size: int, probe: str, ranks_are: str,
             cuda_aware: bool, profile: cost_profiles.CostProfile, chunk: Optional[int],
             replan: bool = False) -> Tuple[Topology, Plan, Dict[str, Any]]:
    """The row's topology, its plan and its record under ``key`` (:func:`row_key`): the
    cached one, or made now."""
    topo = resolve(spec, n)
    rec = cache.doc["rows"].get(key)
    # the forest is chosen for the engine's chunk (each candidate's pipeline fill depends on
    # it), so a row cached at another chunk is planned again
    if rec is not None and not replan and rec.get("plan_chunk") == chunk:
        return topo, Plan.from_json(rec["plan"]), rec
    say(f"{topo.name} ({costs_name(ranks_are, cuda_aware)} ranks): planning")
    w0 = time.perf_counter()
    with cost_profiles.charging(profile, ranks_are, cuda_aware):
        plan = make_plan(topo, size=size, chunk_bytes=chunk, predict=forest_predictor(topo))
        planner_s = time.perf_counter() - w0
        plan = with_choice(plan, topo, size)  # as init records it
    choice_s = time.perf_counter() - w0 - planner_s
    bound = plan.upper_bound_Bps
    rec = {"generator": spec, "topology": topo.name, "ranks": n, "size": size, "probe": probe,
           "ranks_are": ranks_are, "cuda_aware": cuda_aware,
           "charges": list(profile.charges(ranks_are, cuda_aware)), "plan": plan.to_json(),
           "planner_s": planner_s, "choice_s": choice_s,
           "plan_chunk": chunk, "optimum_s": size / bound if bound else None, "predicted": {},
           "commit": results_doc.commit()}
    cache.doc["rows"][key] = rec
    cache.save()
    say(f"  planned in {planner_s:.1f} s, chose {recorded_algorithm(plan)} in {choice_s:.1f} s")
    return topo, plan, rec


@functools.lru_cache(maxsize=None)
def simulator_network() -> NetworkModel:
    """The network the simulator gives, measured once per run from single messages."""
    say("measuring the simulator's network for the predictions")
    return measure_network()


def predicted_for(cache: Cache, rec: Dict[str, Any], topo: Topology, plan: Plan,
                  chunk: Optional[int], profile: cost_profiles.CostProfile,
                  network: str) -> Dict[str, float]:
    """Every algorithm's modelled time at ``chunk`` (None: the plan's) with the software
    costs the simulator charges, on the ``network`` (``"simulator's"``: the one the simulator
    gives, the model's figure for the cell's own conditions; ``"TCP's"``: what TCP makes of the
    declared links, as init predicts (:data:`~horotopo.algorithms.flows.TCP_NETWORK`);
    ``"declared"``: the links as
    declared, as init predicts). The plan's trees are profiled by the current model first
    (:meth:`~horotopo.plan.Plan.profiled_on`: a cached plan keeps the profiles of the planner
    that made it). Kept with the row's plan (``--replan`` makes both again)."""
    name = f"{chunk_name(chunk)} on the {network} network"
    if name not in rec["predicted"]:
        with cost_profiles.charging(profile, rec["ranks_are"], rec["cuda_aware"]):
            rec["predicted"][name] = predictions(
                topo, plan.profiled_on(topo, chunk), rec["size"], chunk, costs=simulated_costs(),
                network={"simulator's": simulator_network, "TCP's": lambda: TCP_NETWORK,
                         "declared": lambda: IDEAL_NETWORK}[network]())
        cache.save()
    return rec["predicted"][name]


def chosen_for(cache: Cache, rec: Dict[str, Any], topo: Topology, plan: Plan,
               chunk: Optional[int], profile: cost_profiles.CostProfile) -> str:
    """What init records for an engine that runs at ``chunk``: at the plan's own chunk the
    plan's record; at a fixed chunk the candidate predicted fastest at that chunk on the
    network init predicts on, TCP's (the recorded choice was weighed at the plan's chunk,
    and an algorithm's rank among the others changes with the chunk)."""
    if chunk is None:
        return recorded_algorithm(plan)
    got = predicted_for(cache, rec, topo, plan, chunk, profile, "TCP's")
    order = list(got)
    return min(order, key=lambda name: (got[name], order.index(name)))


def cell_key(rkey: str, alg: str, chunk: Optional[int], plan: Plan) -> str:
    """A cell's cache key. The tree cells run the plan's trees, and at the plan's chunk every
    algorithm runs at that chunk: those cells belong to the plan they ran with."""
    key = f"{rkey}|{alg}|{chunk_name(chunk)}"
    if alg == "tree" or chunk is None:
        key += f"|{plan.digest}"
    return key


def run_cell(topo: Topology, plan: Plan, rec: Dict[str, Any], alg: str, chunk: Optional[int],
             max_wall: float, profile: cost_profiles.CostProfile,
             source: Optional[str]) -> Dict[str, Any]:
    """One algorithm's simulation on the row's plan: its time, or the limit it met."""
    cell: Dict[str, Any] = {"algorithm": alg, "chunk": chunk_name(chunk),
                            "commit": results_doc.commit(),
                            "load_1min": os.getloadavg()[0]}
    w0 = time.perf_counter()
    try:
        res = simulate(topo, rec["size"], rec["probe"], progress=say, timeout_s=max_wall,
                       algorithms=(alg,), plan=plan, chunk_bytes=chunk,
                       ranks_are=rec["ranks_are"], cuda_aware=rec["cuda_aware"],
                       profile=profile, profile_source=source)
    except SimulationError as exc:
        cell.update(limit=str(exc).splitlines()[0], wall_s=time.perf_counter() - w0)
        return cell
    row = res["rows"][0]
    cell.update(time_s=row["time_s"], wrong=row["wrong"], chunk_bytes=row["chunk_bytes"],
                messages=row["messages"], wall_s=res["wall_s"], cpu_s=res["simulation_cpu_s"],
                init_simulated_s=res["init_simulated_s"])
    return cell


def spent(args: argparse.Namespace) -> bool:
    return args.budget is not None and time.perf_counter() - T0 > args.budget


def budget_spent(args: argparse.Namespace) -> str:
    return (f"no run in --cache simulated it, and this run's --budget of {args.budget:g} s "
            f"was spent")


def unplanned_row(spec: str, n: int, args: argparse.Namespace, ranks_are: str,
                  cuda_aware: bool, chunk: Optional[int]) -> Dict[str, Any]:
    """A row the budget left no time to plan: no plan, no prediction, no cell."""
    return {"generator": spec, "topology": resolve(spec, n).name, "ranks": n,
            "size": args.size, "probe": args.probe, "ranks_are": ranks_are,
            "cuda_aware": cuda_aware, "costs": costs_name(ranks_are, cuda_aware),
            "chunk": chunk_name(chunk), "chosen": None, "predicted": {}, "planner_s": None,
            "choice_s": None, "optimum_s": None,
            "cells": {alg: {"algorithm": alg, "not_run": budget_spent(args)}
                      for alg in args.algorithms}}


def build(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Every row of the table: its record with its cells (simulated, cached, limited or not
    run, each saying so)."""
    cache = Cache(args.cache)
    profile, source = cost_profiles.from_settings()
    specs = [s for s in args.generators.split(";") if s.strip()]
    kinds = [(k, args.cuda_aware == "yes") for k in args.ranks_are]
    total = len(args.ranks) * len(specs) * len(kinds) * len(args.algorithms)
    done = 0
    limited: Dict[Tuple[str, str, str], str] = {}  # (generator, costs, algorithm): why
    rows: List[Dict[str, Any]] = []
    for n in args.ranks:
        chunk = chunk_for(args.chunk, n)
        for spec in specs:
            for ranks_are, cuda_aware in kinds:
                costs = costs_name(ranks_are, cuda_aware)
                rkey = row_key(spec, n, args.size, args.probe, costs,
                               charges_name(profile, ranks_are, cuda_aware))
                if rkey not in cache.doc["rows"] and spent(args):
                    rows.append(unplanned_row(spec, n, args, ranks_are, cuda_aware, chunk))
                    done += len(args.algorithms)
                    say(f"{rows[-1]['topology']} ({costs} ranks): not planned, "
                        f"{rows[-1]['cells'][args.algorithms[0]]['not_run']}")
                    continue
                topo, plan, rec = plan_row(cache, rkey, spec, n, args.size, args.probe, ranks_are,
                                           cuda_aware, profile, chunk, args.replan)
                row = dict(rec, costs=costs, chunk=chunk_name(chunk), cells={},
                           chosen=chosen_for(cache, rec, topo, plan, chunk, profile),
                           predicted=predicted_for(cache, rec, topo, plan, chunk, profile,
                                                   PREDICT_ON[args.predict_on]))
                rows.append(row)
                for alg in args.algorithms:
                    done += 1
                    where = f"{done}/{total} {topo.name} {costs} {alg} at {chunk_name(chunk)}"
                    key = cell_key(rkey, alg, chunk, plan)
                    cell = cache.doc["cells"].get(key)
                    if cell is not None and not ("limit" in cell and args.retry_limits):
                        say(f"{where}: cached")
                    elif (spec, costs, alg) in limited:
                        cell = {"algorithm": alg, "not_run": limited[(spec, costs, alg)]}
                    elif spent(args):
                        cell = {"algorithm": alg, "not_run": budget_spent(args)}
                    else:
                        say(f"{where}: simulating")
                        cell = run_cell(topo, plan, rec, alg, chunk, args.max_wall, profile,
                                        source)
                        cache.doc["cells"][key] = cell
                        cache.save()
                    row["cells"][alg] = cell
                    if "limit" in cell:
                        limited[(spec, costs, alg)] = (
                            f"{alg} at {n} ranks met the limit ({cell['wall_s']:.0f} s of "
                            f"wall time)")
                    say(f"{where}: {describe(cell, row['predicted'].get(alg))}")
    return rows


def describe(cell: Dict[str, Any], predicted: Optional[float]) -> str:
    if "not_run" in cell:
        return f"not run: {cell['not_run']}"
    if "limit" in cell:
        return f"limit: {cell['limit']} ({cell['wall_s']:.0f} s)"
    pred = "" if predicted is None else f" (predicted {predicted * 1e3:.1f})"
    return (f"{cell['time_s'] * 1e3:.1f} ms{pred}, {cell['messages']} messages, "
            f"{cell['wall_s']:.0f} s wall, #wrong {cell['wrong']}, "
            f"load {os.getloadavg()[0]:.1f}")


def horotopo_cell(row: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if row["chosen"] is None:
        return {"not_run": "no plan"}
    return row["cells"].get(row["chosen"])


def _time(cell: Optional[Dict[str, Any]]) -> str:
    if cell is None:
        return "not asked"
    if "limit" in cell:
        return f"limit ({cell['wall_s']:.0f} s)"
    if "not_run" in cell:
        return "not run"
    return f"{cell['time_s'] * 1e3:.1f}"


def _predicted(row: Dict[str, Any], alg: str) -> str:
    value = row["predicted"].get(alg)
    return "-" if value is None else f"{value * 1e3:.1f}"


def _of_optimum(row: Dict[str, Any], cell: Optional[Dict[str, Any]]) -> str:
    """``optimum time / algorithm time``: 1.00 is the best any packing of trees could do."""
    if cell is None or "time_s" not in cell or not row.get("optimum_s"):
        return "-"
    return f"{row['optimum_s'] / cell['time_s']:.2f}"


def _wrong(row: Dict[str, Any]) -> str:
    counts = [c["wrong"] for c in row["cells"].values() if "wrong" in c]
    return str(sum(counts)) if counts else "-"


def columns() -> List[results_doc.Column]:
    cols: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["ranks"]),
        ("ranks are", lambda r: r["costs"]), ("chunk", lambda r: r["chunk"]),
        ("horotopo runs", lambda r: r["chosen"] or "-"),
        ("horotopo (ms)", lambda r: _time(horotopo_cell(r))),
        ("horotopo predicted (ms)", lambda r: _predicted(r, r["chosen"])),
        ("horotopo / optimum", lambda r: _of_optimum(r, horotopo_cell(r))),
        # the plan's own trees beside the choice: a row where the chooser passed over a
        # faster algorithm shows it
        ("tree (ms)", lambda r: _time(r["cells"].get("tree"))),
        ("tree predicted (ms)", lambda r: _predicted(r, "tree"))]
    for alg in PEERS:
        cols += [(f"{alg} (ms)", lambda r, a=alg: _time(r["cells"].get(a))),
                 (f"{alg} predicted (ms)", lambda r, a=alg: _predicted(r, a)),
                 (f"{alg} / optimum", lambda r, a=alg: _of_optimum(r, r["cells"].get(a)))]
    cols += [("optimum (ms)", lambda r: "-" if not r.get("optimum_s")
              else f"{r['optimum_s'] * 1e3:.1f}"),
             ("#wrong", _wrong)]
    return cols


def _wall(cell: Optional[Dict[str, Any]]) -> str:
    if cell is None or "wall_s" not in cell:
        return "-"
    return f"{cell['wall_s']:.0f}" + ("+" if "limit" in cell else "")


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def cost_columns() -> List[results_doc.Column]:
    cols: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["ranks"]),
        ("ranks are", lambda r: r["costs"]),
        ("plan and predictions made at", lambda r: f"`{r['commit']}`" if r.get("commit")
         else "-"),
        ("planner (s, wall)", lambda r: _seconds(r["planner_s"])),
        ("choice (s, wall)", lambda r: _seconds(r["choice_s"])),
        ("init (ms, simulated)", lambda r: next(
            (f"{c['init_simulated_s'] * 1e3:.2f}" for c in r["cells"].values()
             if "init_simulated_s" in c), "-"))]
    for alg in ALGORITHMS:
        cols.append((f"{alg} simulation (s, wall)", lambda r, a=alg: _wall(r["cells"].get(a))))
    cols.append(("messages", lambda r: sum(c.get("messages", 0) for c in r["cells"].values())))
    return cols


def not_run_notes(rows: List[Dict[str, Any]]) -> List[str]:
    """One line per cell without a time: the limit it met, or why it was not run, with the
    measured wall time of the same algorithm's largest finished cell on that generator."""
    notes = []
    for row in rows:
        for alg, cell in row["cells"].items():
            if "time_s" in cell:
                continue
            finished = [(r["ranks"], r["cells"][alg]) for r in rows
                        if r["generator"] == row["generator"] and r["costs"] == row["costs"]
                        and "time_s" in r["cells"].get(alg, {})]
            measured = ""
            if finished:
                ranks, biggest = max(finished, key=lambda rc: rc[0])
                measured = (f"; measured at {ranks} ranks: {biggest['wall_s']:.0f} s of wall "
                            f"time, {biggest['messages']} messages")
            why = (f"met the limit: {cell['limit']} ({cell['wall_s']:.0f} s)" if "limit" in cell
                   else f"not run: {cell['not_run']}")
            notes.append(f"- {row['topology']} ({row['costs']} ranks), {alg}: {why}{measured}")
    return notes


def markdown(args: argparse.Namespace, rows: List[Dict[str, Any]]) -> None:
    """The results file: the scale table, the cells without a time and why, then the planner's,
    the init's and the simulation's own costs."""
    sections = [("Allreduce time", results_doc.md_table(rows, columns()))]
    notes = not_run_notes(rows)
    if notes:
        sections.append(("Cells without a simulated time", "\n".join(notes)))
    sections.append(("Planner, init and simulation cost",
                     results_doc.md_table(rows, cost_columns())))
    commits = Counter(c["commit"] for r in rows for c in r["cells"].values() if "commit" in c)
    made_at = ", ".join(f"`{c}` ({k} cells)" for c, k in commits.most_common())
    loads = [c["load_1min"] for r in rows for c in r["cells"].values() if "load_1min" in c]
    if loads:  # the wall times in the file depend on what else ran on the machine
        made_at += (f"; the machine's load average (1 min) at their start: "
                    f"{min(loads):.1f} to {max(loads):.1f}")
    chunks = "; ".join(f"{n} ranks: {chunk_name(chunk_for(args.chunk, n))}"
                       for n in args.ranks)
    summary = (
        f"One {format_size(args.size)} allreduce per algorithm on simulated clusters (SimGrid; "
        f"every rank runs horotopo's own code), topology from --probe {args.probe}, with the "
        f"software costs of CPU ranks (this machine's profile) and of GPU ranks (the device "
        f"path, `horotopo simulate --ranks-are gpu`). \"horotopo runs\" is the algorithm "
        f"horotopo's plan chooses, and \"horotopo\" is that algorithm's cell. Times are "
        f"simulated; \"predicted\" is the model's time for the same algorithm and chunk with "
        f"the software costs the simulator charges, on the "
        f"{PREDICT_ON[args.predict_on]} network"
        f"{MEASURED if args.predict_on == 'simulator' else ''}, while \"horotopo runs\" is the "
        f"choice init makes on TCP's network (horotopo.algorithms.flows.TCP_NETWORK: the "
        f"declared links as TCP shares them) for an engine at the row's chunk; \"/ optimum\" "
        f"is the optimum's time (the size over the certified "
        f"upper bound on any packing of trees) divided by the algorithm's time. Chunk "
        f"of every algorithm (\"plan\": the row's plan's, as horotopo's engine runs any "
        f"algorithm; a size: that full-size chunk, where the simulator's speed forbids the "
        f"plans' smaller ones): {chunks}; each row's plan is made for its chunk, its forest "
        f"chosen on the flow model as init chooses it. "
        f"\"limit\": the cell's simulation did not finish within --max-wall of wall time. "
        f"Cells simulated at commits {made_at or 'none'} (--cache keeps cells across runs; "
        f"each row's plan, choice and predictions were made at the commit the second table "
        f"gives).")
    results_doc.write(args.markdown, "scale_sim: horotopo, ring, double binary tree and "
                      "hierarchical allreduce on simulated clusters", sections, summary=summary)


#: The scale table's columns that README.md shows (tests/test_readme_results.py checks them).
README_COLUMNS = ("topology", "ranks", "ranks are", "chunk", "horotopo runs", "horotopo (ms)",
                  "horotopo predicted (ms)", "horotopo / optimum", "ring (ms)", "dbtree (ms)",
                  "hierarchical (ms)", "optimum (ms)", "#wrong")


def update_readme(path: Path, rows: List[Dict[str, Any]]) -> None:
    """Replace README.md's results table (the table whose header starts with the row key) by
    :data:`README_COLUMNS` of ``rows``."""
    new = results_doc.md_table(rows, [c for c in columns() if c[0] in README_COLUMNS])
    lines = path.read_text().splitlines()
    head = "| " + " | ".join(README_COLUMNS[:3]) + " |"
    start = next((i for i, ln in enumerate(lines) if ln.startswith(head)), None)
    if start is None:
        raise SystemExit(f"scale_sim: {path} has no table starting with {head!r}")
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    path.write_text("\n".join(lines[:start] + new.strip().splitlines() + lines[end:]) + "\n")


def table(rows: List[Dict[str, Any]]) -> str:
    cols = columns()
    body = [[str(fn(r)) for _, fn in cols] for r in rows]
    heads = [name for name, _ in cols]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generators", default=";".join(SCALE_TABLE_SPECS),
                    help="generator specs separated by ';' (default: %(default)s)")
    ap.add_argument("--ranks", default="64,256",
                    type=lambda v: sorted({int(x) for x in v.split(",") if x.strip()}),
                    help="rank counts (default %(default)s; 1024 ranks cost minutes to tens "
                         "of minutes of wall time per cell here)")
    ap.add_argument("--ranks-are", default="cpu,gpu",
                    type=lambda v: [k for k in ("cpu", "gpu") if k in v.split(",")],
                    help="software costs: cpu (this machine's profile), gpu (the device "
                         "path), or both (default %(default)s)")
    ap.add_argument("--cuda-aware", default="yes", choices=("yes", "no"),
                    help="gpu ranks: MPI takes device buffers, or stages them")
    ap.add_argument("--size", default="64M", type=parse_size, help="allreduce bytes")
    ap.add_argument("--probe", default="declared", choices=["declared", "quick", "full"],
                    help="declared (default: the topology as generated), or init by probing")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS), type=parse_algorithms,
                    help="subset of %(default)s")
    ap.add_argument("--chunk", default="1M", type=parse_chunks,
                    help="[RANKS=]plan|SIZE items: every algorithm's full-size chunk per rank "
                         "count, the item without RANKS for the others; plan: the row's "
                         "plan's (default %(default)s: the plans' chunks are 64 KiB at 256 "
                         "ranks, 16x the messages of 1 MiB)")
    ap.add_argument("--max-wall", type=float, default=900.0,
                    help="wall seconds per cell; past it, a limit in the table, and the "
                         "algorithm is not tried at larger rank counts (default %(default)g)")
    ap.add_argument("--budget", type=float, default=None,
                    help="wall seconds for the whole run: cells left when it is spent are "
                         "listed as not run (rerun with the same --cache to go on)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="JSON file of finished cells and plans: reused when present, "
                         "written as cells finish")
    ap.add_argument("--replan", action="store_true",
                    help="plan every row again, and predict again (cached cells that ran on "
                         "another plan are simulated again: tree's, and all at plan chunks)")
    ap.add_argument("--retry-limits", action="store_true",
                    help="simulate again the cached cells that met a limit")
    ap.add_argument("--predict-on", default="simulator", choices=sorted(PREDICT_ON),
                    help="the network the predictions are made for: the one the simulator "
                         "gives (default; measured once per run, about 10 s of CPU) or the "
                         "links as declared")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "scale_sim")
    ap.add_argument("--readme", action="store_true",
                    help="with --markdown: also put the table's README columns in README.md")
    args = ap.parse_args(argv)
    if args.readme and not args.markdown:
        ap.error("--readme needs --markdown (the README shows the results file's figures)")
    if not args.ranks_are or not args.ranks or min(args.ranks) < 2:
        ap.error("--ranks needs counts of at least 2, --ranks-are cpu and/or gpu")
    try:
        rows = build(args)
    except (CacheError, TopologyError) as exc:
        print(f"scale_sim: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if k != "plan"} for r in rows]}))
    else:
        print(table(rows))
    if args.markdown:
        markdown(args, rows)
    if args.readme:
        update_readme(Path(__file__).resolve().parents[1] / "README.md", rows)
    return 1 if any(c.get("wrong") for r in rows for c in r["cells"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
