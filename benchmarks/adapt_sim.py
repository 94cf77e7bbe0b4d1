#!/usr/bin/env python
"""Adaptivity at scale, simulated: a rack's uplink slows to a quarter mid-run; horotopo's own
detector fires, the ranks re-probe at host level and re-plan over hosts.

    python benchmarks/adapt_sim.py [--generator racks:...] [--ranks 64] [--size 64M]
        [--chunk 1M] [--links tor1->spine,spine->tor1] [--factor 0.25] [--json]

Every rank is a SimGrid actor running horotopo's own code (``horotopo.simulation``), in one
simulation:

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
import statistics
import sys
from pathlib import Path
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from horotopo.adapt import AdaptiveEngine
from horotopo.cli.simulate_cmd import SMALL_ELEMS, TOTAL_ELEMS, resolve
from horotopo.packing import hostforest
from horotopo.plan import Plan, format_size, make_plan, parse_size
from horotopo.planning_protocol import share_plan
from horotopo.probe import probe
from horotopo.probe.hostinfer import generated_hosts
from horotopo.schedule import window_for
from horotopo.simulation.runner import run_simulated
from horotopo.simulation.platform import set_link_rate

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402
from horotopo.topology import Topology, from_dict

DEFAULT_GENERATOR = "racks:hosts_per_rack=2,gpus=8,oversub=2"


def _log(msg: str) -> None:
    print(f"[adapt-sim] {msg}", file=sys.stderr, flush=True)


def slowed(topology: Topology, links: List[str], factor: float) -> Topology:
    """``topology`` with the resources named in ``links`` at ``factor`` of their rate."""
    from horotopo.adapt import topology_with_capacities

    caps = list(topology.capacity_Bps)
    for name in links:
        if name not in topology.resources:
            raise SystemExit(f"{topology.name} has no resource {name!r} (e.g. "
                             f"{', '.join(r for r in topology.resources if 'spine' in r)[:200]})")
        caps[topology.resources.index(name)] *= factor
    return topology_with_capacities(topology, caps)


def run(args: argparse.Namespace,
        planner: Optional[Callable[[Topology], Plan]] = None) -> Dict[str, Any]:
    """The simulation (module docstring); the raw result (rank 0's) plus wall figures.

    ``planner`` replaces the adaptive engine's re-planner (tests: a plan known to be worse).
    """
    topo = resolve(args.generator, args.ranks)
    n = topo.n
    size, chunk = args.size, args.chunk
    elems = max(1, min(size // 4, SMALL_ELEMS, max(n, TOTAL_ELEMS // n)))
    scale = size / (elems * 4)
    engine_kw: Dict[str, Any] = {"chunk_bytes": max(4, int(chunk / scale) // 4 * 4)}
    w0, c0 = time.perf_counter(), time.process_time()
    # Every plan of the run for the size it is timed at (the forest and chunks are chosen for
    # it), with the forest and the bound on host trees asked for (recorded in each plan, so the
    # engine's re-plans keep them).
    plan_kw: Dict[str, Any] = {"chunk_bytes": chunk, "size": size, "forest": args.forest,
                               "max_host_trees": args.max_host_trees}
    declared = make_plan(topo, hierarchy="on", **plan_kw)
    # each plan's automatic window at the full-size chunk (the scaled chunk would give
    # another), re-plans included: it depends on the plan's trees
    engine_kw["window"] = lambda plan: window_for(chunk, len(plan.trees))
    planner_s = (time.perf_counter() - w0, time.process_time() - c0)
    _log(f"{topo.name}: {n} ranks, plan over hosts in {planner_s[0]:.1f} s "
         f"({len(declared.trees)} trees, model {declared.throughput_Bps * 8e-9:.2f} gbps)")
    links = [s for s in args.links.split(",") if s]
    truth = slowed(topo, links, args.factor)
    reference = make_plan(truth, hierarchy="on", **plan_kw) if args.reference else None
    flat = make_plan(
        truth, hierarchy="off", **dict(plan_kw, forest="auto" if args.forest == "hosts"
                                       else args.forest)) if args.flat_reference else None
    hosts = generated_hosts(topo.to_json())
    want = np.float32(n * (n - 1) / 2)

    def calls(eng: AdaptiveEngine, x: np.ndarray, k: int) -> List[float]:
        out = []
        for _ in range(k):
            got = eng.allreduce(x, algorithm="tree")
            out.append(eng.last_seconds if np.array_equal(got, np.full_like(x, want))
                       else -1.0)  # a negative time marks a wrong result
        return out

    def probed_plan(t: Any, label: str) -> Tuple[Plan, Topology, float]:
        """Every rank probes (quick, by hosts), rank 0 plans over hosts; shared."""
        t.barrier()
        p0 = t.now()
        with t.true_size():  # the probe's transfers are sized to be timed, not scaled
            doc = probe(t, "quick", name=f"probed-{topo.name}-{label}", hosts=hosts)
        probe_s = t.now() - p0

        def build() -> Any:
            measured = from_dict(doc)
            return make_plan(measured, hierarchy="on", **plan_kw), measured

        plan, model = share_plan(t, build, what=f"the {label} plan")
        return plan, model, probe_s

    def body(t: Any) -> Optional[Dict[str, Any]]:
        x = np.full(elems, t.rank, np.float32)
        plan0, model0, init_probe_s = declared, topo, None
        if args.init == "probe":
            plan0, model0, init_probe_s = probed_plan(t, "init")
        eng = AdaptiveEngine(t, plan0, model0, timeout_s=0, threshold=args.threshold,
                             consecutive=args.consecutive, warmup=args.warmup,
                             trial=args.trial, planner=planner, **engine_kw)
        series: List[Dict[str, Any]] = []
        degraded_at = None
        for step in range(args.calls):
            if step == args.degrade_at:
                t.barrier()  # no call in flight: the slowdown starts between two calls
                if t.rank == 0:
                    for name in links:
                        r = topo.resources.index(name)
                        set_link_rate(t, topo, r, topo.capacity_Bps[r] * args.factor)
                degraded_at = t.now()
            before, ran = len(eng.events), eng.plan.digest[:8]
            [sec] = calls(eng, x, 1)
            verdict = [e.kept for e in eng.events if e.decided_step == eng.step]
            series.append({"step": step, "seconds": sec, "plan": ran,  # the plan it ran
                           "replanned": len(eng.events) > before,
                           "verdict": verdict[0] if verdict else None,
                           "phase": "before" if degraded_at is None else "slowed"})
            if t.rank == 0:
                _log(f"call {step}: {sec * 1e3:.1f} ms simulated, plan {eng.plan.digest[:8]}"
                     f"{', re-planned after it' if series[-1]['replanned'] else ''} "
                     f"({time.perf_counter() - w0:.0f} s wall so far)")
        events = [dict(vars(e)) for e in eng.events]
        final_digest = eng.plan.digest[:8]
        eng.close()
        model = (eng.topology.capacity_Bps if eng.topology is not None else None)
        final = eng.topology.name if eng.topology is not None else None
        # what the re-plan lowered in the model (same resources: only capacities change)
        lowered = [] if eng.topology is None else [
            [name, a * 8e-9, b * 8e-9] for name, a, b in zip(
                model0.resources, model0.capacity_Bps, eng.topology.capacity_Bps) if b != a]
        fresh: List[float] = []
        probe_s, fresh_plan, fresh_model = None, None, None
        if args.fresh:
            fresh_plan, fresh_model, probe_s = probed_plan(t, "fresh")
            with AdaptiveEngine(t, fresh_plan, adapt=False, timeout_s=0, **engine_kw) as plain:
                fresh = calls(plain, x, args.fresh_calls)
        ref: List[float] = []
        if reference is not None:
            with AdaptiveEngine(t, reference, adapt=False, timeout_s=0, **engine_kw) as plain:
                ref = calls(plain, x, args.fresh_calls)
        flat_s: List[float] = []
        if flat is not None:
            with AdaptiveEngine(t, flat, adapt=False, timeout_s=0, **engine_kw) as plain:
                flat_s = calls(plain, x, args.fresh_calls)
        if t.rank != 0:
            return None
        return {"series": series, "events": events, "degraded_at_s": degraded_at,
                "fresh_s": fresh, "reference_s": ref, "flat_reference_s": flat_s,
                "fresh_probe_s": probe_s,
                "fresh_digest": fresh_plan.digest if fresh_plan else None,
                # what --dump writes: the plans and models compared, for offline study
                "plans": {"first": plan0.to_json(), "final": eng.plan.to_json(),
                          "fresh": fresh_plan.to_json() if fresh_plan else None},
                "models": {"first": model0.to_json(), "final": eng.topology.to_json()
                           if eng.topology is not None else None,
                           "fresh": fresh_model.to_json() if fresh_model else None},
                "fresh_model_Bps": fresh_plan.throughput_Bps if fresh_plan else None,
                "final_model_Bps": model, "final_digest": final_digest, "final_model": final,
                "init": args.init,
                "lowered_gbps": lowered,
                "init_probe_s": init_probe_s, "plan_digest": plan0.digest,
                "plan_model_Bps": plan0.throughput_Bps}

    sim = run_simulated(topo, body, scale=scale, timeout_s=args.max_wall)
    res = sim.results[0]
    res.update({"topology": topo.name, "ranks": n, "hosts": len(set(hosts)), "size": size,
                "chunk": chunk, "forest": args.forest,
                "max_host_trees": args.max_host_trees or hostforest.MAX_HOST_TREES,
                "links": links, "factor": args.factor,
                "reference_model_Bps": reference.throughput_Bps if reference else None,
                "flat_reference_model_Bps": flat.throughput_Bps if flat else None,
                "planner_wall_s": planner_s[0], "planner_cpu_s": planner_s[1],
                "simulation_wall_s": sim.wall_s, "simulation_cpu_s": sim.cpu_s,
                "messages": sim.messages})
    return res


def summarize(res: Dict[str, Any], tolerance: float, skip: int = 1) -> Dict[str, Any]:
    """Medians per phase and the verdict (pure: a test calls it on made-up series)."""
    series = res["series"]
    med = (lambda v: statistics.median(v) if v else float("nan"))  # noqa: E731
    switch = [s["step"] for s in series if s["replanned"] and s["phase"] == "slowed"]
    early = [s["step"] for s in series if s["replanned"] and s["phase"] == "before"]
    first_slow = min((s["step"] for s in series if s["phase"] == "slowed"), default=None)
    before = [s["seconds"] for s in series if s["phase"] == "before"][skip:]
    during = [s["seconds"] for s in series if s["phase"] == "slowed"
              and (not switch or s["step"] <= switch[0])]
    # the plan the job ended with, after the re-plan (the old one again if the trial failed)
    after = [s["seconds"] for s in series if switch and s["step"] > switch[0]
             and s["plan"] == res.get("final_digest", series[-1]["plan"])]
    verdicts = [s["verdict"] for s in series if s.get("verdict") is not None]
    rejected = [s["seconds"] for s in series if switch and s["step"] > switch[0]
                and s["plan"] != series[switch[0]]["plan"] and verdicts and not verdicts[0]]
    fresh, ref = med(res["fresh_s"]), med(res["reference_s"])
    rec = med(after)
    event = next((e for e in res["events"] if switch and e["step"] == switch[0] + 1), None)
    wrong = sum(1 for v in [s["seconds"] for s in series] + res["fresh_s"] + res["reference_s"]
                + res.get("flat_reference_s", []) if v < 0)
    ratio = rec / fresh if after and fresh > 0 else float("nan")
    versus = ratio if res["fresh_s"] else rec / ref if after and ref > 0 else float("nan")
    out = {"before_s": med(before), "slowed_s": med(during), "recovered_s": rec,
           "fresh_s": fresh, "reference_s": ref,
           "flat_reference_s": med(res.get("flat_reference_s", [])),
           "recovered_over_fresh": ratio,
           "recovered_over_reference": rec / ref if after and ref > 0 else float("nan"),
           "calls_to_detect": (switch[0] - first_slow + 1) if switch else None,
           "detect_delay_s": (event["at_s"] - res["degraded_at_s"]) if event else None,
           "replan_s": event["seconds"] if event else None,
           "reprobe_s": event["probe_s"] if event else None,
           "reprobed_pairs": len(event["suspects"]) if event else None,
           "fresh_probe_s": res["fresh_probe_s"], "wrong": wrong,
           "trial_kept": verdicts[0] if verdicts else None,
           "rejected_plan_s": med(rejected) if rejected else None,
           "replans_before": len(early)}
    out["ok"] = bool(wrong == 0 and switch and not early and event and event["switched"]
                     and versus <= 1.0 + tolerance)
    return out


def series_lines(res: Dict[str, Any]) -> List[str]:
    """The time series (one line per call, simulated ms) and the re-plan events, as text."""
    marks = {s["step"]: "re-plan after this call" for s in res["series"] if s["replanned"]}
    marks.update({s["step"]: "trial over: " + ("new plan kept" if s["verdict"] else
                                               "back to the old plan")
                  for s in res["series"] if s.get("verdict") is not None})
    lines = ["call  phase    plan        ms (simulated)"]
    lines += [f"{s['step']:>4}  {s['phase']:<7}  {s['plan']}  {s['seconds'] * 1e3:>10.2f}  "
              f"{marks.get(s['step'], '')}".rstrip() for s in res["series"]]
    for e in res["events"]:
        lines.append(
            f"re-plan at {e['at_s']:.3f} s (after call {e['step'] - 1}), {e['reason']}: "
            f"{len(e['suspects'])} host pairs re-probed in {e['probe_s'] * 1e3:.0f} ms, model "
            f"{e['old_model_Bps'] * 8e-9:.3f} -> {e['new_model_Bps'] * 8e-9:.3f} gbps, "
            f"{e['seconds'] * 1e3:.0f} ms in all {e['note']}".rstrip()
            + ("" if e.get("kept") is None else
               f"; trial: new/old time {e['trial_new'] / e['trial_old']:.3f}"))
    return lines


def parser() -> argparse.ArgumentParser:
    """The command line (tests build their arguments with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generator", default=DEFAULT_GENERATOR,
                    help=f"cluster generator spec (default {DEFAULT_GENERATOR})")
    ap.add_argument("--ranks", type=int, default=64, help="ranks of the simulated job (default 64)")
    ap.add_argument("--init", choices=("probe", "declared"), default="probe",
                    help="the starting model: the quick probe's (as hvd.init, default) or the "
                         "declared topology")
    ap.add_argument("--size", default="64M", type=parse_size,
                    help="allreduce size per call (default 64M; K, M, G are binary)")
    ap.add_argument("--chunk", default="1M", type=parse_size,
                    help="full-size chunk of every plan (default 1M: fewer messages to "
                         "simulate than the plans' own)")
    ap.add_argument("--links", default="tor1->spine,spine->tor1",
                    help="resources to slow, comma-separated (default: rack 1's uplink, both "
                         "directions)")
    ap.add_argument("--factor", type=float, default=0.25,
                    help="fraction of their rate the slowed links keep (default 0.25)")
    ap.add_argument("--calls", type=int, default=12,
                    help="allreduce calls of the adaptive run (default 12)")
    ap.add_argument("--degrade-at", type=int, default=4,
                    help="the links slow down before this call (default 4)")
    ap.add_argument("--fresh-calls", type=int, default=3,
                    help="timed calls of each comparison plan on the slowed network (default 3)")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="skip the declared slowed topology's plan")
    ap.add_argument("--flat-reference", action="store_true",
                    help="also time the declared slowed topology's flat plan (hierarchy off; "
                         "its planning grows steeply past 64 ranks)")
    ap.add_argument("--no-fresh", dest="fresh", action="store_false",
                    help="skip the fresh probe and its plan (the verdict then compares with "
                         "the declared slowed topology's plan)")
    ap.add_argument("--threshold", type=float, default=0.3,
                    help="a call is slow below (1 - this) of its size's baseline efficiency (default 0.3)")
    ap.add_argument("--consecutive", type=int, default=3,
                    help="slow calls in a row before a re-plan (default 3)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="calls that form the detector's baseline (default 3)")
    ap.add_argument("--trial", type=int, default=3,
                    help="calls a re-plan's new plan is timed for before it is kept or "
                         "dropped for the old one (default 3; 0 keeps every re-plan)")
    ap.add_argument("--tolerance", type=float, default=0.15,
                    help="recovered time may exceed the fresh plan's by this fraction (default 0.15)")
    ap.add_argument("--max-wall", type=float, default=3600.0,
                    help="wall-clock limit of the simulation, seconds")
    ap.add_argument("--forest", default="auto", choices=("auto", "deep", "hosts"),
                    help="the forest of every plan of the run (make_plan's forest; a forced "
                         "forest is forced again in the engine's re-plan; default auto)")
    ap.add_argument("--max-host-trees", type=int, default=None, metavar="K",
                    help="plan host forests of at most K host-level trees (each K times the "
                         "ranks per host rank-level trees) in every plan of the run: the "
                         "planner's own bound is hostforest.MAX_HOST_TREES (32); at 1024 ranks "
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
    res = run(args)
    summary = summarize(res, args.tolerance)
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
