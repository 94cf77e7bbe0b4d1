#!/usr/bin/env python3
"""Execution variants of a plan's trees in the simulator: which change to how the trees run
brings the simulated allreduce closer to the optimum and to the flow model's prediction.

A row is one cluster generator of :mod:`horotopo.generate` at one rank count and chunk. Its
plan is made once, as init makes it (:func:`horotopo.plan.make_plan`, the choice recorded
with :func:`horotopo.algorithms.choice.with_choice`); then each variant runs the plan's trees
in one ``horotopo simulate`` run of the tree algorithm alone
(:func:`horotopo.cli.simulate_cmd.simulate`, SimGrid running horotopo's own engine), beside
the flow model's prediction for the same trees, chunk and window
(:func:`horotopo.algorithms.flows.plan_time` on the simulator's network as
:func:`horotopo.algorithms.simcheck.measure_network` reads it, with the software costs the
simulator charges). The variants:

- ``baseline``: the plan at the engine's automatic window (:func:`horotopo.schedule.window_for`);
- ``bdp``: a window of at least every tree's bandwidth-delay product in chunks: the tree's
  planned rate times the round trip of its slowest arc (route latency on the simulator's
  network), over the tree's chunk; the engine takes one window for all trees, so the largest
  tree's product is every tree's window (never below the automatic one);
- ``window-x2``, ``window-x4``: twice and four times the automatic window;
- ``window=2``: a window of 2 chunks, below the automatic window's least
  (:attr:`~horotopo.params.PlannerParams.min_window`);
- ``hosts-1``, ``hosts-2``, ``hosts-4``: fewer flows per NIC, the host forest
  (``make_plan(forest="hosts", max_host_trees=K)``) of at most K host-level trees, where the
  topology offers host forests, at its own automatic window;
- ``pace-x1.0``, ``pace-x1.1``: the plan at the automatic window, every tree's sends held to
  1.0 and 1.1 times its planned rate (:attr:`~horotopo.params.EngineParams.pace_factor`); the
  flow model does not model pacing, so their prediction is the baseline's;
- ``links-x2``, ``links-x3``: fewer of a tree's flows per link, the other way: the plan made
  as init makes it on the topology with every link's capacity capped at 2 or 3 times the
  row's plan's rate (a fast NIC that four flows of a one-tree plan crossed takes at most two
  or three), then profiled and run on the real topology; where no link is above the cap the
  variant is the baseline's plan.

Fractions of the optimum are the row's plan's bound over the simulated time (the optimum is
``size / plan.upper_bound_Bps``, the certified bound of the topology, the same for every
variant). The error is the prediction against the simulated time. Progress goes to stderr,
cell by cell; a cell with wrong results makes the exit status 1, a cell past ``--max-wall``
is reported as such.

Example (docs/results/execution_sim.md; about 20 minutes here):
  python benchmarks/execution_sim.py --markdown
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from horotopo import costs as cost_profiles
from horotopo.algorithms.choice import forest_predictor, recorded_algorithm, with_choice
from horotopo.algorithms.flows import plan_time
from horotopo.algorithms.simcheck import measure_network, simulated_costs
from horotopo.cli.simulate_cmd import resolve, simulate
from horotopo.costs import RANK_KINDS
from horotopo.generate import SCALE_TABLE_SPECS
from horotopo.packing.alphabeta import NetworkModel
from horotopo.packing.forests import kind_names
from horotopo.params import EngineParams, PlannerParams
from horotopo.plan import Plan, format_size, make_plan, parse_size
from horotopo.schedule import window_for
from horotopo.simulation import SimulationError
from horotopo.topology import Topology, TopologyError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

BASELINE = "baseline"
BDP = "bdp"
#: Fixed multiples of the automatic window.
WINDOW_FACTORS = (2, 4)
#: A fixed window below the automatic one's least (PlannerParams.min_window).
SMALL_WINDOW = 2
#: Host-level tree bounds of the host-forest variants.
HOST_TREES = (1, 2, 4)
#: Multiples of each tree's planned rate that the pace variants hold its sends to.
PACE_FACTORS = (1.0, 1.1)
PACE = "pace-x"
#: Multiples of the plan's rate that the capped-link variants cap every link's capacity at.
LINK_CAPS = (2, 3)
LINKS = "links-x"
VARIANTS: Tuple[str, ...] = ((BASELINE, BDP) + tuple(f"window-x{f}" for f in WINDOW_FACTORS)
                             + (f"window={SMALL_WINDOW}",)
                             + tuple(f"hosts-{k}" for k in HOST_TREES)
                             + tuple(f"{PACE}{f:.1f}" for f in PACE_FACTORS)
                             + tuple(f"{LINKS}{m}" for m in LINK_CAPS))
PLAN_CHUNK = "plan"
HOST_FOREST = "hosts"
#: The default rows: every scale-table generator at 64 ranks at its plan's chunk, and two
#: sites at 256 ranks at 1 MiB chunks (the plan's chunk there costs several times the wall).
DEFAULT_ROWS: Tuple[str, ...] = (tuple(f"{spec}@64" for spec in SCALE_TABLE_SPECS)
                                 + ("sites:gpus=8,wan_gbps=10@256@1M",))

T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.0f} s] {msg}", file=sys.stderr, flush=True)


def parse_row(text: str) -> Tuple[str, int, Optional[int]]:
    """``"GENERATOR@RANKS[@CHUNK]"`` -> ``(generator, ranks, chunk)``, the chunk None for
    ``plan`` or when left out (the row's plan's chunk)."""
    parts = text.split("@")
    if len(parts) not in (2, 3) or not parts[0]:
        raise argparse.ArgumentTypeError(f"--row: expected GENERATOR@RANKS[@CHUNK], got {text!r}")
    try:
        ranks = int(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"--row {text!r}: ranks {parts[1]!r} is not a "
                                         "whole number") from None
    if ranks < 2:
        raise argparse.ArgumentTypeError(f"--row {text!r}: needs at least 2 ranks")
    chunk = None
    if len(parts) == 3 and parts[2] != PLAN_CHUNK:
        try:
            chunk = parse_size(parts[2])
        except ValueError:
            chunk = 0
        if chunk <= 0:
            raise argparse.ArgumentTypeError(f"--row {text!r}: chunk {parts[2]!r} is neither "
                                             f"{PLAN_CHUNK} nor a positive size")
    return parts[0], ranks, chunk


def parse_variants(text: str) -> Tuple[str, ...]:
    """``"baseline,bdp"`` -> the named variants, in :data:`VARIANTS`' order."""
    names = {v.strip() for v in text.split(",")} - {""}
    if not names or not names <= set(VARIANTS):
        raise argparse.ArgumentTypeError(f"--variants must be a non-empty subset of "
                                         f"{','.join(VARIANTS)}, got {text!r}")
    return tuple(v for v in VARIANTS if v in names)


def parse_rank_kinds(text: str) -> Tuple[str, ...]:
    """``"cpu,gpu"`` -> ``("cpu", "gpu")``: the kinds of ranks whose costs each row is run
    with, in the order given."""
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not kinds or any(k not in RANK_KINDS for k in kinds):
        raise argparse.ArgumentTypeError(f"--ranks-are: expected {' or '.join(RANK_KINDS)}, "
                                         f"comma-separated, got {text!r}")
    return kinds


def automatic_window(plan: Plan, chunk: Optional[int]) -> int:
    """The window ``horotopo simulate`` gives the plan's trees at ``chunk`` (None: the plan's)."""
    return window_for(chunk or plan.chunk_bytes, len(plan.trees),
                      PlannerParams.recorded(plan.planner.get("params", {})))


def bdp_chunks(topology: Topology, plan: Plan, chunk: Optional[int],
               network: NetworkModel) -> int:
    """The largest tree's bandwidth-delay product in its own chunks: its planned rate times
    the round trip of its slowest arc, up or down, on ``network``'s latencies."""
    factor = network.latency_factor
    most = 0
    for tree, tree_chunk in zip(plan.trees, plan.tree_chunks(chunk)):
        arcs = {(v, p) for v, p in enumerate(tree.reduce_parent) if p >= 0}
        arcs |= {(p, v) for v, p in enumerate(tree.bcast_parent) if p >= 0}
        slowest = max((topology.latency(u, v) for u, v in arcs), default=0.0)
        most = max(most, math.ceil(tree.rate_Bps * 2 * slowest * factor / tree_chunk))
    return most


def host_plan(topology: Topology, size: int, chunk: Optional[int], host_trees: int) -> Plan:
    """The host forest of at most ``host_trees`` host-level trees, with init's choice."""
    plan = make_plan(topology, size=size, chunk_bytes=chunk, forest=HOST_FOREST,
                     max_host_trees=host_trees)
    return with_choice(plan, topology, size)


def capped_plan(topology: Topology, plan: Plan, size: int, chunk: Optional[int],
                times: float) -> Plan:
    """The plan init makes on ``topology`` with every link's capacity capped at ``times``
    the rate of ``plan``, profiled on the real topology (its certificate is the capped
    topology's: a packing there is one here, at the same rates)."""
    cap = times * plan.throughput_Bps
    capped = dataclasses.replace(topology, capacity_Bps=tuple(
        min(c, cap) for c in topology.capacity_Bps))
    made = make_plan(capped, size=size, chunk_bytes=chunk, predict=forest_predictor(capped))
    return with_choice(made.profiled_on(topology, chunk), topology, size)


def run_cell(topology: Topology, plan: Plan, size: int, chunk: Optional[int], window: int,
             pace: float, ranks_are: str, args: argparse.Namespace,
             profile: cost_profiles.CostProfile, source: Optional[str]) -> Dict[str, Any]:
    """The plan's trees simulated once at ``window`` and pace factor ``pace`` (0: unpaced):
    the time, or the limit met."""
    w0 = time.perf_counter()
    try:
        res = simulate(topology, size, "declared", timeout_s=args.max_wall, algorithms=("tree",),
                       plan=plan, chunk_bytes=chunk, window=window, ranks_are=ranks_are,
                       cuda_aware=args.cuda_aware == "yes", profile=profile,
                       profile_source=source, engine_params=EngineParams(pace_factor=pace))
    except SimulationError as exc:
        return {"limit": str(exc).splitlines()[0], "wall_s": time.perf_counter() - w0}
    row = res["rows"][0]
    return {"time_s": row["time_s"], "wrong": row["wrong"], "messages": row["messages"],
            "wall_s": res["wall_s"]}


def variant_plans(topology: Topology, plan: Plan, size: int, chunk: Optional[int],
                  variants: Sequence[str], network: NetworkModel
                  ) -> List[Tuple[str, Optional[Plan], Optional[int], float, str]]:
    """``(variant, plan, window, pace factor, note)`` per variant; a variant the row cannot
    run has no plan and says why in its note."""
    auto = automatic_window(plan, chunk)
    out: List[Tuple[str, Optional[Plan], Optional[int], float, str]] = []
    offers_hosts = HOST_FOREST in kind_names() and HOST_FOREST in plan.planner.get("forest", {})
    for name in variants:
        if name == BASELINE:
            out.append((name, plan, auto, 0.0,
                        f"forest {plan.planner.get('forest', {}).get('chosen')}"))
        elif name == BDP:
            product = bdp_chunks(topology, plan, chunk, network)
            out.append((name, plan, max(auto, product), 0.0,
                        f"largest tree product {product} chunks"))
        elif name.startswith("window-x"):
            out.append((name, plan, auto * int(name[len("window-x"):]), 0.0, ""))
        elif name.startswith("window="):
            out.append((name, plan, int(name[len("window="):]), 0.0, ""))
        elif name.startswith(PACE):
            out.append((name, plan, auto, float(name[len(PACE):]), ""))
        elif name.startswith(LINKS):
            times = float(name[len(LINKS):])
            if max(topology.capacity_Bps) <= times * plan.throughput_Bps:
                out.append((name, plan, auto, 0.0, "no link above the cap"))
                continue
            made = capped_plan(topology, plan, size, chunk, times)
            out.append((name, made, automatic_window(made, chunk), 0.0,
                        f"{len(made.trees)} trees, forest "
                        f"{made.planner.get('forest', {}).get('chosen')}"))
        else:
            k = int(name[len("hosts-"):])
            if not offers_hosts:
                out.append((name, None, None, 0.0, "the topology offers no host forest"))
                continue
            made = host_plan(topology, size, chunk, k)
            out.append((name, made, automatic_window(made, chunk), 0.0,
                        f"{len(made.trees)} trees"))
    return out


def run_row(spec: str, topology: Topology, chunk: Optional[int], ranks_are: str,
            args: argparse.Namespace, profile: cost_profiles.CostProfile,
            source: Optional[str], network: NetworkModel) -> List[Dict[str, Any]]:
    """Every variant of one row, as table rows."""
    n = topology.n
    size = args.size
    say(f"{topology.name} at {format_size(chunk) if chunk else 'the plan'}'s chunk, "
        f"{ranks_are} ranks: planning")
    cuda_aware = args.cuda_aware == "yes"
    with cost_profiles.charging(profile, ranks_are, cuda_aware):
        plan = with_choice(make_plan(topology, size=size, chunk_bytes=chunk,
                                     predict=forest_predictor(topology)), topology, size)
        variants = variant_plans(topology, plan, size, chunk, args.variants, network)
        costs = simulated_costs()
    bound = plan.upper_bound_Bps
    optimum = size / bound if bound else None
    rows: List[Dict[str, Any]] = []
    # the simulator is deterministic: a variant that runs the same trees at the same window as
    # an earlier one (the bdp window where no tree's product passes the automatic window, the
    # host forest where it is the plan) has that one's cell
    cells: Dict[Tuple[str, int, float], Tuple[str, Dict[str, Any]]] = {}
    for name, made, window, pace, note in variants:
        row: Dict[str, Any] = {"generator": spec, "topology": topology.name, "ranks": n,
                               "ranks_are": ranks_are, "chunk": chunk or plan.chunk_bytes,
                               "variant": name,
                               "window": window, "note": note, "optimum_s": optimum,
                               "chosen": recorded_algorithm(plan)}
        rows.append(row)
        if made is None:
            say(f"  {name}: not run ({note})")
            continue
        with cost_profiles.charging(profile, ranks_are, cuda_aware):
            row["predicted_s"] = plan_time(topology, made, size, chunk, costs, network,
                                           window=window)
        row["trees"] = len(made.trees)
        row["chunks_per_tree"] = max(math.ceil(t.share * size / c)
                                     for t, c in zip(made.trees, made.tree_chunks(chunk)))
        key = (made.digest, int(window or 0), pace)
        if key in cells:
            same, cell = cells[key]
            row.update(cell)
            row["note"] = "; ".join(filter(None, (note, f"the cell of {same}")))
            say(f"  {name}: the same trees and window as {same}")
            continue
        say(f"  {name}: {len(made.trees)} trees, window {window}: simulating")
        cell = run_cell(topology, made, size, chunk, window, pace, ranks_are, args, profile,
                        source)
        cells[key] = (name, cell)
        row.update(cell)
        say(f"  {name}: {describe(row)}")
    base = next((r for r in rows if r["variant"] == BASELINE and "time_s" in r), None)
    for r in rows:
        if base is not None and "time_s" in r:
            r["vs_baseline"] = base["time_s"] / r["time_s"]
    return rows


def describe(row: Dict[str, Any]) -> str:
    if "limit" in row:
        return f"limit: {row['limit']}"
    return (f"{row['time_s'] * 1e3:.1f} ms simulated, {row['predicted_s'] * 1e3:.1f} ms "
            f"predicted, {row['wall_s']:.0f} s wall")


def error(row: Dict[str, Any]) -> Optional[float]:
    """The prediction's error against the simulated time (negative: it underestimates)."""
    if "time_s" not in row or row.get("predicted_s") is None:
        return None
    return row["predicted_s"] / row["time_s"] - 1.0


def _ms(value: Optional[float]) -> str:
    return results_doc.fmt(value, ".1f", 1e3)


def columns() -> List[results_doc.Column]:
    return [("row", lambda r: f"{r['topology']} @{format_size(r['chunk'])}"),
            ("ranks are", lambda r: r["ranks_are"]),
            ("variant", lambda r: r["variant"]),
            ("trees", lambda r: r.get("trees", "-")),
            ("chunks per tree", lambda r: r.get("chunks_per_tree", "-")),
            ("window", lambda r: r["window"] if r["window"] is not None else "-"),
            ("simulated ms", lambda r: r["limit"] if "limit" in r else _ms(r.get("time_s"))),
            ("predicted ms", lambda r: _ms(r.get("predicted_s"))),
            ("error", lambda r: results_doc.fmt(error(r), "+.0%")),
            ("of optimum", lambda r: results_doc.fmt(
                r["optimum_s"] / r["time_s"] if r.get("optimum_s") and "time_s" in r
                else None, ".2f")),
            ("vs baseline", lambda r: results_doc.fmt(r.get("vs_baseline"), ".2f") + "x"
             if r.get("vs_baseline") else "-"),
            ("note", lambda r: r["note"]),
            ("wall s", lambda r: results_doc.fmt(r.get("wall_s"), ".0f"))]


def verdicts(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per variant: on how many rows it ran, ran faster than the baseline, and was predicted
    closer than the baseline (absolute error)."""
    def row_of(r: Dict[str, Any]) -> Tuple[str, int, str]:
        return r["topology"], r["chunk"], r["ranks_are"]

    base = {row_of(r): r for r in rows if r["variant"] == BASELINE}
    out = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        if name == BASELINE:
            continue
        ran = faster = closer = 0
        gains: List[float] = []
        for r in rows:
            b = base.get(row_of(r))
            if r["variant"] != name or b is None or error(r) is None or error(b) is None:
                continue
            ran += 1
            faster += r["time_s"] < b["time_s"]
            closer += abs(error(r)) < abs(error(b))
            gains.append(r["vs_baseline"])
        out.append({"variant": name, "rows": ran, "faster": faster, "closer": closer,
                    "best": max(gains) if gains else None,
                    "worst": min(gains) if gains else None})
    return out


def network_summary(network: NetworkModel) -> str:
    """The measured figures of the simulator's network that the windows depend on."""
    figures = {"latency factor": network.latency_factor,
               "bandwidth factor": network.bandwidth_factor,
               "TCP window bytes": network.tcp_window_bytes, "streams": network.streams}
    return "measured from single messages: " + ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())


def markdown(args: argparse.Namespace, rows: List[Dict[str, Any]],
             network: NetworkModel) -> None:
    summary = (f"{format_size(args.size)} allreduce of each row's plan's trees, simulated once "
               f"per variant with the software costs of {' and of '.join(args.ranks_are)} "
               f"ranks; predicted by "
               f"the flow model at the variant's window on the simulator's network "
               f"({network_summary(network)}). Error: predicted over simulated, minus one. Of "
               f"optimum: the topology's bound (size / plan.upper_bound_Bps) over the "
               f"simulated time. vs baseline: the baseline's time over the variant's.")
    verdict = results_doc.md_table(verdicts(rows), [
        ("variant", lambda v: v["variant"]), ("rows run", lambda v: v["rows"]),
        ("faster than baseline", lambda v: v["faster"]),
        ("predicted closer than baseline", lambda v: v["closer"]),
        ("best vs baseline", lambda v: results_doc.fmt(v["best"], ".2f")),
        ("worst vs baseline", lambda v: results_doc.fmt(v["worst"], ".2f"))])
    notes = ("Chunks per tree: the largest tree's; a window of that many chunks or more holds "
             "no chunk back, so the window variants of such a row run the same schedule.\n\n"
             "Pace variants: every tree's sends up and down at every rank held to the factor "
             "times the tree's planned rate (EngineParams.pace_factor); predicted as the "
             "baseline, since the flow model has no pacing. A tree's first chunk sets the "
             "start of its pace, so a tree of one chunk is not held at all.\n\n"
             "The bdp window is one window for every tree (the engine takes one), the largest "
             "tree's product, at least the automatic window.")
    results_doc.write(args.markdown, "Execution variants of the plan's trees (SimGrid)",
                      [("Cells", results_doc.md_table(rows, columns())),
                       ("Per variant", verdict), ("Notes", notes)], summary=summary)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Variants: " + ", ".join(VARIANTS) + " (see the module docstring). Each cell "
               "is one simulation of the tree algorithm; a 64-rank cell takes seconds to a "
               "minute, a 256-rank cell at 1 MiB chunks a few minutes.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--row", action="append", type=parse_row, default=None,
                    metavar="GENERATOR@RANKS[@CHUNK]",
                    help="a row, repeatable: a cluster generator spec, its rank count and the "
                         "engine's chunk (plan, the default: the plan's own; or a size, which "
                         "the plan is also made for). Default: "
                         + "; ".join(DEFAULT_ROWS))
    ap.add_argument("--variants", default=",".join(VARIANTS), type=parse_variants,
                    help="comma-separated subset of %(default)s")
    ap.add_argument("--size", default="64M", type=parse_size,
                    help="allreduce size in bytes (default 64M; K, M, G are binary)")
    ap.add_argument("--ranks-are", default=("cpu",), type=parse_rank_kinds,
                    metavar="|".join(RANK_KINDS) + "[,...]",
                    help="the software costs charged and planned with, each row once per "
                         "kind (horotopo simulate's --ranks-are; default cpu)")
    ap.add_argument("--cuda-aware", default="yes", choices=("yes", "no"),
                    help="with --ranks-are gpu: whether MPI takes device buffers")
    ap.add_argument("--max-wall", type=float, default=900.0, metavar="SECONDS",
                    help="wall-time limit of one cell (default %(default)s); a cell past it is "
                         "reported as a limit")
    ap.add_argument("--json", action="store_true", help="print the cells as JSON on stdout")
    results_doc.add_markdown_option(ap, "execution_sim")
    args = ap.parse_args(argv)
    if args.size <= 0:
        ap.error(f"--size must be positive, got {args.size}")
    rows_wanted = args.row or [parse_row(r) for r in DEFAULT_ROWS]
    try:
        profile, source = cost_profiles.from_settings()
    except cost_profiles.CostsError as exc:
        print(f"execution_sim: {exc}", file=sys.stderr)
        return 2
    try:  # every row's cluster before the first simulation
        topologies = [(spec, resolve(spec, n), chunk) for spec, n, chunk in rows_wanted]
    except TopologyError as exc:
        print(f"execution_sim: {exc}", file=sys.stderr)
        return 2
    say("measuring the simulator's network for the predictions")
    network = measure_network()
    rows: List[Dict[str, Any]] = []
    for ranks_are in args.ranks_are:
        for spec, topology, chunk in topologies:
            rows += run_row(spec, topology, chunk, ranks_are, args, profile, source, network)
    if args.json:
        print(json.dumps(rows, indent=1))
    if args.markdown:
        markdown(args, rows, network)
    wrong = [r for r in rows if r.get("wrong")]
    for r in wrong:
        say(f"WRONG results: {r['topology']} {r['variant']}: {r['wrong']} elements")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
