"""Predicted against simulated allreduce time, for every algorithm the chooser compares.

For each cluster generator, rank count and kind of rank (``--ranks-are``: the cost profile's
CPU path or its device path): rank 0's init is done as ``init()`` does it (``make_plan`` on the
declared topology for ``--size``, then the chooser, :func:`horotopo.algorithms.choice.with_choice`),
and each algorithm (the plan's trees, ring, NCCL's double binary tree, hierarchical allreduce)
runs one allreduce of ``--size`` in the SimGrid simulation (horotopo's engine over the simulated
transport, simulated time, so the machine's load does not enter; every rank starting at one
instant, as ``horotopo simulate`` runs it) at the plan's chunk, the one the engine runs it at.
Each is compared with its prediction (:func:`horotopo.algorithms.choice.predictions`) for the
network the simulator really gives: SimGrid's TCP model scales rates, multiplies latencies,
caps a message at its TCP window and holds a stream's messages back; those figures are
measured first from single messages (:func:`horotopo.algorithms.simcheck.measure_network`).

    python benchmarks/predict_check.py --ranks 64 --ranks-are cpu,gpu [--json] [--markdown]
    python benchmarks/predict_check.py --ranks 256,1024 --cache SCALE_CACHE.json [--markdown PATH]

With ``--cache``, nothing is simulated: the simulated times are the cells that
``benchmarks/scale_sim.py --cache`` kept (each row's plan with them), and every cell is
predicted again with today's model at the chunk it ran at, beside the choice init would make
on that plan at that chunk.

Prints a Markdown table (or ``--json``); progress on stderr; ``--markdown [PATH]`` also writes
it to docs/results/predict_check.md. A simulation past ``--timeout`` is a row with its limit.
Exit status 1 when a prediction is off by more than ``--tolerance`` (default 10%) of the
simulated time, listing those rows.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from horotopo import costs as cost_profiles  # noqa: E402
from horotopo.algorithms.choice import candidates, choose, predictions, with_choice  # noqa: E402
from horotopo.algorithms.simcheck import (measure_network, simulate_allreduce,  # noqa: E402
                                          simulated_costs)
from horotopo.generate import GENERATORS, SCALE_TABLE_SPECS, generate  # noqa: E402
from horotopo.algorithms.flows import FlowNetwork  # noqa: E402
from horotopo.packing.alphabeta import NetworkModel  # noqa: E402
from horotopo.plan import Plan, format_size, make_plan, parse_size  # noqa: E402
from horotopo.topology import Topology, bundled, from_dict, load  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402
from scale_sim import PLAN_CHUNK, cell_key, charges_name  # noqa: E402 - the cache's keys



def _topology(spec: str, ranks: int) -> Topology:
    if spec.partition(":")[0] in GENERATORS:
        return from_dict(generate(spec, ranks))
    return load(bundled(spec))


def check(spec: str, ranks: int, size: int, ranks_are: str, network: NetworkModel,
          algorithms: Sequence[str], timeout_s: float) -> List[Dict[str, Any]]:
    """Rows for one cluster and kind of rank: each algorithm's prediction on the simulator's
    network against its simulated time, with the choice init makes (on TCP's network,
    :data:`~horotopo.algorithms.flows.TCP_NETWORK`)
    and the one the simulator's network would give."""
    topology = _topology(spec, ranks)
    profile, _ = cost_profiles.from_settings()
    rows = []
    with cost_profiles.charging(profile, ranks_are):
        w0 = time.perf_counter()
        plan = with_choice(make_plan(topology, size=size), topology, size)
        planner_s = time.perf_counter() - w0
        costs = simulated_costs()
        predicted = predictions(topology, plan, size, costs=costs, network=network)
        on_simulator, _ = choose(topology, plan, size, costs=costs, network=network)
        for alg in algorithms:
            try:
                sim = simulate_allreduce(topology, plan, alg, size, timeout_s=timeout_s)
            except Exception as exc:  # noqa: BLE001 - a limit is reported as measured
                sim = {"time_s": None, "error": str(exc).splitlines()[0]}
            row = {"topology": topology.name, "ranks": topology.n, "size": size,
                   "ranks_are": ranks_are, "algorithm": alg,
                   "chosen": plan.planner["algorithm"] == alg,
                   "chosen_on_simulator": on_simulator == alg,
                   "chunk_bytes": plan.chunk_bytes, "trees": len(plan.trees),
                   "predicted_s": predicted[alg],
                   "predicted_init_s": plan.planner["predicted_s"][alg],
                   "planner_s": planner_s, **sim}
            if sim["time_s"]:
                row["error_frac"] = predicted[alg] / sim["time_s"] - 1
            rows.append(row)
            wall = sim.get("wall_s")
            _say(f"{topology.name} {ranks_are} {alg}{' (chosen)' if row['chosen'] else ''}: "
                 f"predicted {predicted[alg] * 1e3:.2f} ms, simulated {_ms(sim['time_s'])} ms"
                 + ("" if wall is None else f" ({wall:.0f} s of wall time)"))
    return rows


def cached_rows(path: Path, counts: Sequence[int], kinds: Sequence[str],
                algorithms: Sequence[str], network: NetworkModel) -> List[Dict[str, Any]]:
    """Rows for the cells of a ``scale_sim.py --cache`` file: each simulated cell of the
    rank counts and kinds of rank asked for, predicted now on the simulator's ``network`` at
    the chunk it ran at, on its row's plan."""
    try:
        doc = json.loads(path.read_text())
        recs, cells = doc["rows"], doc["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"predict_check: --cache {path}: not a scale_sim cache ({exc})")
    profile, _ = cost_profiles.from_settings()
    rows = []
    other_costs = 0
    for key, rec in recs.items():
        if rec["ranks"] not in counts or rec["ranks_are"] not in kinds:
            continue
        if not key.endswith("|" + charges_name(profile, rec["ranks_are"],
                                               rec.get("cuda_aware", True))):
            # simulated under other software costs: predicting it with these would compare
            # two different clusters
            other_costs += 1
            continue
        plan = Plan.from_json(rec["plan"])
        # the cells this row's plan ran, by scale_sim's own keys (a cell of an earlier plan
        # of the row stays in the cache under that plan's digest)
        done = {c["algorithm"]: c for k, c in cells.items()
                if k.startswith(key + "|") and c.get("time_s") and k == cell_key(
                    key, c["algorithm"],
                    None if c["chunk"] == PLAN_CHUNK else int(c["chunk_bytes"]), plan)}
        if not any(a in done for a in algorithms):
            continue
        topology = _topology(rec["generator"], rec["ranks"])
        with cost_profiles.charging(profile, rec["ranks_are"], rec.get("cuda_aware", True)):
            costs = simulated_costs()
            # the row's plan profiled by the current model once per chunk its cells ran at
            # (the cached plan keeps its planner's profiles)
            now: Dict[int, Plan] = {}
            for alg in algorithms:
                cell = done.get(alg)
                if cell is None:
                    continue
                chunk = int(cell["chunk_bytes"])
                if chunk not in now:
                    now[chunk] = plan.profiled_on(topology, chunk)
                predicted = predictions(topology, now[chunk], rec["size"], chunk, costs=costs,
                                        network=network)
                chosen, _ = choose(topology, now[chunk], rec["size"], chunk, costs=costs)
                rows.append({"topology": rec["topology"], "ranks": rec["ranks"],
                             "size": rec["size"], "ranks_are": rec["ranks_are"],
                             "algorithm": alg, "chosen": chosen == alg,
                             "chunk_bytes": chunk, "trees": len(plan.trees),
                             "predicted_s": predicted[alg], "time_s": cell["time_s"],
                             "error_frac": predicted[alg] / cell["time_s"] - 1,
                             "simulated_at": cell.get("commit")})
                _say(f"{rec['topology']} {rec['ranks_are']} {alg}: predicted "
                     f"{predicted[alg] * 1e3:.2f} ms, simulated {_ms(cell['time_s'])} ms")
    if other_costs:
        _say(f"{other_costs} row(s) of {path} were simulated under other software costs than "
             "the profile now charged, and are left out")
    return rows


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fastest(rows: Sequence[Dict[str, Any]], r: Dict[str, Any]) -> bool:
    """Whether ``r`` is the simulated fastest of its cluster's rows."""
    peers = [p["time_s"] for p in rows if p["topology"] == r["topology"]
             and p["ranks_are"] == r["ranks_are"] and p["time_s"]]
    return bool(r["time_s"]) and r["time_s"] <= min(peers)


def columns(rows: Sequence[Dict[str, Any]]) -> List[results_doc.Column]:
    """The Markdown table's columns (header, cell of a row)."""
    return [
        ("topology", lambda r: r["topology"]),
        ("ranks", lambda r: str(r["ranks"])),
        ("ranks are", lambda r: r["ranks_are"]),
        ("algorithm", lambda r: r["algorithm"] + (" **chosen**" if r["chosen"] else "")),
        ("chunk", lambda r: format_size(r["chunk_bytes"])),
        ("predicted ms", lambda r: f"{r['predicted_s'] * 1e3:.2f}"),
        ("simulated ms", lambda r: _ms(r["time_s"]) + (" (fastest)" if _fastest(rows, r)
                                                       else "")),
        ("error", lambda r: (f"{r['error_frac'] * 100:+.1f}%" if "error_frac" in r
                             else r.get("error", "-"))),
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", default=";".join(SCALE_TABLE_SPECS),
                    help="';'-separated generator specs or bundled topology names")
    ap.add_argument("--ranks", default="64", help="rank counts (generators only)")
    ap.add_argument("--size", default="64M", help="allreduce size (K, M, G are binary)")
    ap.add_argument("--ranks-are", default="cpu,gpu",
                    help="comma-separated kinds of rank whose software costs are charged and "
                         "predicted: cpu (the cost profile's CPU path), gpu (its device path); "
                         "default both")
    ap.add_argument("--algorithms", default=",".join(candidates()),
                    help="subset of %(default)s")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="wall seconds per simulation before it is reported as a limit")
    ap.add_argument("--cache", type=Path, default=None,
                    help="a benchmarks/scale_sim.py --cache file: predict its simulated cells "
                         "again instead of simulating")
    ap.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(ap, "predict_check")
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size)
        kinds = [k for k in args.ranks_are.split(",") if k]
        algorithms = [a for a in args.algorithms.split(",") if a]
        counts = [int(k) for k in args.ranks.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    bad = ([k for k in kinds if k not in cost_profiles.RANK_KINDS]
           + [a for a in algorithms if a not in candidates()])
    if bad or not kinds or not algorithms or size <= 0 or min(counts) < 2:
        ap.error(f"--ranks-are takes {', '.join(cost_profiles.RANK_KINDS)}, --algorithms "
                 f"{', '.join(candidates())}, --ranks at least 2, --size above 0"
                 + (f"; got {', '.join(bad)}" if bad else ""))
    network = measure_network()
    _say(f"simulator's network: {network}")
    rows: List[Dict[str, Any]] = []
    if args.cache is not None:
        rows = cached_rows(args.cache, counts, kinds, algorithms, network)
    for spec in (args.clusters.split(";") if args.cache is None else []):
        for n in (counts if spec.partition(":")[0] in GENERATORS else [0]):
            for kind in kinds:
                rows += check(spec, n, size, kind, network, algorithms, args.timeout)
    misses = [r for r in rows if "error_frac" in r and abs(r["error_frac"]) > args.tolerance]
    measured = (f"simulator's network: latency x{network.latency_factor:.2f}, rates "
                f"x{network.bandwidth_factor:.3f}, TCP window "
                f"{network.tcp_window_bytes or 0:.0f} B, streams {network.streams}"
                + (f", a tree's flows of unequal weights over one link keeping "
                   f"{network.mixed_efficiency:.3f} of it" if isinstance(network, FlowNetwork)
                   else ""))
    missed = [f"MISS: {r['topology']} {r['ranks_are']} {r['algorithm']}: predicted "
              f"{r['predicted_s'] * 1e3:.2f} ms vs simulated {r['time_s'] * 1e3:.2f} ms "
              f"({r['error_frac'] * 100:+.1f}%)" for r in misses]
    limits = [f"LIMIT: {r['topology']} {r['ranks_are']} {r['algorithm']}: {r['error']}"
              for r in rows if r["time_s"] is None]
    table = results_doc.md_table(rows, columns(rows))
    if args.json:
        print(json.dumps({"network": network.__dict__, "rows": rows}))
    else:
        print(measured)
        print(table)
        print("\n".join(missed + limits))
    if args.markdown:
        verdict = (f"Every prediction within {args.tolerance * 100:g}% of the simulated time."
                   if not missed else "\n".join(f"- {m}" for m in missed))
        if limits:
            verdict += "\n" + "\n".join(f"- {m}" for m in limits)
        results_doc.write(
            args.markdown, "predict_check: every algorithm's predicted against simulated "
            "allreduce time", [("", table), ("Verdict", verdict)],
            summary=f"The {measured}. " + (
                "Each algorithm at the plan's chunk; **chosen**: the algorithm init records "
                "(predicted fastest on TCP's network, flows.TCP_NETWORK)"
                if args.cache is None else
                f"Simulated times: the cells of {args.cache.name} (benchmarks/scale_sim.py "
                "--cache, simulated at commits "
                f"{', '.join(sorted({str(r['simulated_at']) for r in rows}))}), each at the "
                "chunk it ran at, on its row's plan; **chosen**: the algorithm the chooser "
                "picks for that plan at that chunk (on flows.TCP_NETWORK)")
            + "; predictions on the simulator's network as measured.")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
