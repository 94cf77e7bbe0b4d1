#!/usr/bin/env python
"""Adaptivity at scale, simulated: a rack's uplink slows to a quarter mid-run; horotopo's own
detector fires, the ranks re-probe at host level and re-plan over hosts.

    python benchmarks/adapt_sim.py [--generator racks:...] [--ranks 64] [--size 64M]
        [--chunk 1M] [--links tor1->spine,spine->tor1] [--factor 0.25] [--json]

Every rank is a SimGrid actor running horotopo's own code (``horotopo.simulation``), in one
simulation (:mod:`horotopo.adapt.slowdown`, which this script drives):

1. init as ``hvd.init()`` does it (``--init probe``, the default): every rank runs the quick
   probe (by hosts) on the healthy network, rank 0 plans the measured topology over hosts
   (``hierarchy="on"``), and the plan and its model are shared; or (``--init declared``) the
   plan of the declared cluster, made here. Either starts an
   :class:`~horotopo.adapt.AdaptiveEngine` on every rank with that model (the runtime's
   detector and re-plan, unchanged; no watchdog, which is a wall-clock thread);
2. ``--calls`` allreduces of ``--size`` bytes; before call ``--degrade-at`` the ranks meet at a
   barrier and rank 0 sets ``--links`` to ``--factor`` of their rate
   (:func:`horotopo.simulation.platform.set_link_rate`); the engine detects the slowdown from
   its own call times, re-probes its suspect links one pair per pair of hosts, lowers the
   capacities they blame in its model and re-plans over hosts, all inside the simulation;
   the new plan is on trial for its first ``--trial`` calls and is dropped for the old one
   unless it ran faster than the old plan's slow run (:mod:`horotopo.adapt.trial`);
3. then, on the slowed network, a *fresh* plan: every rank runs the quick probe (by hosts),
   rank 0 plans the measured topology over hosts, the plan is shared and timed for
   ``--fresh-calls`` calls on a monitored engine that does not re-plan; and, as a second
   reference, the plan of the declared topology with the links truly slowed (``--reference``),
   and with ``--flat-reference`` that topology's flat plan (``hierarchy="off"``; no hosts).

Times are simulated seconds (the slowest rank's time per call, as the engine agrees it); the
planner runs for real on rank 0 and costs no simulated time. Prints the series, the re-plan
event and a summary (``--json``: one JSON object). The detection delay is simulated time from
the slowdown to the re-plan's start; the re-plan cost is the re-plan's simulated time (its
re-probe, the exchanges and the new engine). The recovered time is the median of the calls
after the re-plan that ran the plan the job ended with (the trial's calls when it kept the new
plan; the calls after the revert when it did not). Exit status 1 when a result is wrong, no re-plan
followed the slowdown, one preceded it, or the recovered time is more than ``--tolerance``
(15%) above the fresh plan's (with ``--no-fresh``: the declared slowed topology's plan's).
``--markdown [PATH]`` also writes the report to docs/results/adapt_sim.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

from horotopo.adapt.slowdown import (SlowdownScenario, run_slowdown, series_lines,
                                     summarize_slowdown)
from horotopo.algorithms.simcheck import SMALL_ELEMS, TOTAL_ELEMS
from horotopo.cli.simulate_cmd import resolve
from horotopo.plan import format_size, parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

DEFAULT_GENERATOR = "racks:hosts_per_rack=2,gpus=8,oversub=2"
DEFAULTS = SlowdownScenario()


def _log(msg: str) -> None:
    print(f"[adapt-sim] {msg}", file=sys.stderr, flush=True)


def scenario_of(args: argparse.Namespace) -> SlowdownScenario:
    """The scenario the command line asks for (ValueError for an impossible one)."""
    return SlowdownScenario(
        size=args.size, chunk=args.chunk, links=tuple(s for s in args.links.split(",") if s),
        factor=args.factor, calls=args.calls, degrade_at=args.degrade_at,
        fresh_calls=args.fresh_calls, init=args.init, fresh=args.fresh,
        reference=args.reference, flat_reference=args.flat_reference,
        threshold=args.threshold, consecutive=args.consecutive, warmup=args.warmup,
        trial=args.trial, tolerance=args.tolerance, forest=args.forest,
        max_host_trees=args.max_host_trees, max_wall_s=args.max_wall)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """The simulation (module docstring): rank 0's record plus the wall figures."""
    topo = resolve(args.generator, args.ranks)
    n = topo.n
    # a rank reduces at most SMALL_ELEMS elements, and the job TOTAL_ELEMS in all (so that
    # thousands of ranks fit in memory); the rest of the size is scale, as `simulate` does
    elements = max(1, min(args.size // 4, SMALL_ELEMS, max(n, TOTAL_ELEMS // n)))
    return run_slowdown(topo, scenario_of(args), elements=elements, log=_log)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generator", default=DEFAULT_GENERATOR,
                    help=f"cluster generator spec (default {DEFAULT_GENERATOR})")
    ap.add_argument("--ranks", type=int, default=64, help="ranks of the simulated job (default 64)")
    ap.add_argument("--init", choices=("probe", "declared"), default=DEFAULTS.init,
                    help="the starting model: the quick probe's (as hvd.init, default) or the "
                         "declared topology")
    ap.add_argument("--size", default=DEFAULTS.size, type=parse_size,
                    help=f"allreduce size per call (default {format_size(DEFAULTS.size)}; K, M, "
                         "G are binary)")
    ap.add_argument("--chunk", default=DEFAULTS.chunk, type=parse_size,
                    help=f"full-size chunk of every plan (default {format_size(DEFAULTS.chunk)}: "
                         "fewer messages to simulate than the plans' own)")
    ap.add_argument("--links", default=",".join(DEFAULTS.links),
                    help="resources to slow, comma-separated (default: rack 1's uplink, both "
                         "directions)")
    ap.add_argument("--factor", type=float, default=DEFAULTS.factor,
                    help="fraction of their rate the slowed links keep (default %(default)s)")
    ap.add_argument("--calls", type=int, default=DEFAULTS.calls,
                    help="allreduce calls of the adaptive run (default %(default)s)")
    ap.add_argument("--degrade-at", type=int, default=DEFAULTS.degrade_at,
                    help="the links slow down before this call (default %(default)s)")
    ap.add_argument("--fresh-calls", type=int, default=DEFAULTS.fresh_calls,
                    help="timed calls of each comparison plan on the slowed network "
                         "(default %(default)s)")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="skip the declared slowed topology's plan")
    ap.add_argument("--flat-reference", action="store_true",
                    help="also time the declared slowed topology's flat plan (hierarchy off; "
                         "its planning grows steeply past 64 ranks)")
    ap.add_argument("--no-fresh", dest="fresh", action="store_false",
                    help="skip the fresh probe and its plan (the verdict then compares with "
                         "the declared slowed topology's plan)")
    ap.add_argument("--threshold", type=float, default=DEFAULTS.threshold,
                    help="a call is slow below (1 - this) of its size's baseline efficiency "
                         "(default %(default)s)")
    ap.add_argument("--consecutive", type=int, default=DEFAULTS.consecutive,
                    help="slow calls in a row before a re-plan (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=DEFAULTS.warmup,
                    help="calls that form the detector's baseline (default %(default)s)")
    ap.add_argument("--trial", type=int, default=DEFAULTS.trial,
                    help="calls a re-plan's new plan is timed for before it is kept or "
                         "dropped for the old one (default %(default)s; 0 keeps every re-plan)")
    ap.add_argument("--tolerance", type=float, default=DEFAULTS.tolerance,
                    help="recovered time may exceed the fresh plan's by this fraction "
                         "(default %(default)s)")
    ap.add_argument("--max-wall", type=float, default=DEFAULTS.max_wall_s,
                    help="wall-clock limit of the simulation, seconds")
    ap.add_argument("--forest", default=DEFAULTS.forest, choices=("auto", "deep", "hosts"),
                    help="the forest of every plan of the run (make_plan's forest; a forced "
                         "forest is forced again in the engine's re-plan; default auto)")
    ap.add_argument("--max-host-trees", type=int, default=None, metavar="K",
                    help="plan host forests of at most K host-level trees (each K times the "
                         "ranks per host rank-level trees) in every plan of the run: the "
                         "planner's own bound is PlannerParams.max_host_trees (32); at 1024 ranks "
                         "its 256 rank-level trees are about 524,000 messages a call, too many "
                         "to simulate a dozen calls here")
    ap.add_argument("--json", action="store_true", help="print the JSON document only")
    results_doc.add_markdown_option(ap, "adapt_sim")
    ap.add_argument("--dump", metavar="PATH",
                    help="also write the JSON document, with the first, final and fresh plans "
                         "and models, to PATH")
    return ap


def main(argv: Any = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not 0 < args.factor <= 1 or not 0 < args.degrade_at < args.calls:
        ap.error("need 0 < --factor <= 1 and 0 < --degrade-at < --calls")
    if args.max_host_trees is not None and args.max_host_trees < 1:
        ap.error("--max-host-trees: need at least 1")
    try:
        res = run(args)
    except ValueError as exc:  # a resource the topology does not have
        ap.error(str(exc))
    summary = summarize_slowdown(res, args.tolerance)
    kept = {key: res.pop(key) for key in ("plans", "models")}  # large: --dump only
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump({**res, **kept, "summary": summary}, f, default=float)
    report = report_lines(res, args)
    if args.json:
        print(json.dumps({**res, "summary": summary}, default=float))
    else:
        print("\n".join(report))
        print("summary: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in summary.items()))
    if args.markdown:
        results_doc.write(
            args.markdown, "adapt_sim: a rack uplink slows mid-run, simulated",
            [("Calls and re-plan", "```\n" + "\n".join(report) + "\n```"),
             ("Summary", results_doc.key_value_table(summary))],
            summary="Times are simulated seconds (the slowest rank's per call); the planner "
                    "runs for real on rank 0. The summary's ok is the benchmark's verdict.")
    return 0 if summary["ok"] else 1


def report_lines(res: Dict[str, Any], args: argparse.Namespace) -> List[str]:
    """The printed report: the run, the series of calls, what the model lowered, the
    comparison plans and the simulation's cost."""
    lines = [f"{res['topology']}: {res['ranks']} ranks on {res['hosts']} hosts, "
             f"{format_size(res['size'])} allreduce, {format_size(res['chunk'])} chunks; "
             f"{'+'.join(res['links'])} to {res['factor']:g} before call {args.degrade_at}"]
    lines += series_lines(res)
    shown = res["lowered_gbps"][:12]
    lines.append(f"lowered in the model ({len(res['lowered_gbps'])} resources): " + "; ".join(
        f"{name} {a:.2f} -> {b:.2f} gbps" for name, a, b in shown)
        + (" ..." if len(res["lowered_gbps"]) > len(shown) else ""))
    if res["init_probe_s"] is not None:
        lines.append(f"init: quick probe {res['init_probe_s']:.2f} s simulated, plan model "
                     f"{res['plan_model_Bps'] * 8e-9:.3f} gbps")
    if res["fresh_s"]:
        lines.append(f"fresh plan (quick probe {res['fresh_probe_s']:.2f} s simulated, model "
                     f"{res['fresh_model_Bps'] * 8e-9:.3f} gbps): "
                     + ", ".join(f"{v * 1e3:.1f}" for v in res["fresh_s"]) + " ms")
    if res["reference_s"]:
        lines.append(f"declared slowed topology's plan (model "
                     f"{res['reference_model_Bps'] * 8e-9:.3f} gbps): "
                     + ", ".join(f"{v * 1e3:.1f}" for v in res["reference_s"]) + " ms")
    if res["flat_reference_s"]:
        lines.append(f"its flat plan (model {res['flat_reference_model_Bps'] * 8e-9:.3f} "
                     f"gbps): " + ", ".join(f"{v * 1e3:.1f}" for v in res["flat_reference_s"])
                     + " ms")
    lines.append(f"simulation: {res['simulation_wall_s']:.1f} s wall, "
                 f"{res['simulation_cpu_s']:.1f} s CPU, {res['messages']} messages; first plan "
                 f"{res['planner_wall_s']:.1f} s wall")
    return lines


if __name__ == "__main__":
    sys.exit(main())
