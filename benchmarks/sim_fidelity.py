#!/usr/bin/env python3
"""Fidelity of the simulator: simulated allreduce times against the emulated cluster.

For each bundled topology, the same plan (``make_plan`` of the topology) and the same engine
settings (the plan's chunk size, the engine's default window) run twice:

- emulated: ``benchmarks/allreduce_perf.py -a tree|ring --topology T`` across the network
  namespaces and shaped links of :class:`horotopo_launch.emulate.EmulatedCluster` (needs root
  and ``ip netns``; the same path as ``benchmarks/emulated_allreduce.py``, whose helpers it
  uses), the mean of ``--iters`` timed iterations after ``--warmup`` (MPI_Allreduce is timed
  alongside, as that benchmark always does, and reported for context);
- simulated: :func:`horotopo.simulation.run_simulated` on the same topology, every rank running
  ``Engine(transport, plan).allreduce(x, algorithm=...)`` on full-size arrays (scale 1: the
  very messages the emulated run sends); one run each, since a simulation has no noise.

Prints per topology, algorithm and size: emulated ms, simulated ms, their ratio
(simulated / emulated), and the load average around each emulated run (the emulated ranks
share this machine's cores with everything else; the simulated times do not depend on load).
``--json`` prints ``{"rows": [...]}`` instead; ``--markdown [PATH]`` also writes the table to
docs/results/sim_fidelity.md. Exit status 1 when a result was wrong.

Example:
  python benchmarks/sim_fidelity.py --sizes 4M,16M
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from emulated_allreduce import BENCH  # noqa: E402
import results as results_doc  # noqa: E402

from horotopo.plan import Plan, format_size, make_plan, parse_size  # noqa: E402
from horotopo.reliability.versus_mpi import benchmark_rows  # noqa: E402
from horotopo.topology import Topology, bundled, load  # noqa: E402

TOPOLOGIES = ("racks-2x3", "slow-nic", "uniform-4")
ALGORITHMS = ("tree", "ring")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def simulated(topology: Topology, plan: Plan, sizes: Sequence[int],
              algorithms: Sequence[str]) -> Dict[Tuple[str, int], Dict[str, float]]:
    """Simulated seconds (slowest rank) and wrong elements per (algorithm, size)."""
    from horotopo.engine import Engine
    from horotopo.simulation.runner import run_simulated

    n = topology.n
    cases = [(alg, size) for size in sizes for alg in algorithms]

    def body(t: Any) -> List[Tuple[float, int]]:
        eng = Engine(t, plan)
        out = []
        for alg, size in cases:
            x = np.full(size // 4, t.rank % 3 + 1, np.float32)
            want = np.float32(sum(r % 3 + 1 for r in range(n)))
            t.barrier()
            s = t.now()
            got = eng.allreduce(x, algorithm=alg)
            out.append((t.now() - s, int(np.count_nonzero(got != want))))
        return out

    run = run_simulated(topology, body)
    return {case: {"time_s": max(r[k][0] for r in run.results),
                   "wrong": sum(r[k][1] for r in run.results)}
            for k, case in enumerate(cases)}


def emulated(path: Path, sizes: Sequence[int], algorithms: Sequence[str], iters: int,
             warmup: int, timeout: float) -> Dict[Tuple[str, int], Dict[str, float]]:
    """Emulated mean seconds, MPI_Allreduce's, wrong elements and load per (algorithm, size)."""
    from horotopo_launch.emulate import EmulatedCluster, available

    ok, why = available()
    if not ok:
        raise SystemExit(f"sim_fidelity: cannot emulate the cluster: {why}")
    out: Dict[Tuple[str, int], Dict[str, float]] = {}
    lo, hi = min(sizes), max(sizes)
    factor = 4 if len(sizes) == 1 else round((hi / lo) ** (1 / (len(sizes) - 1)))
    with EmulatedCluster(path, prefix="htfid") as cluster:
        for alg in algorithms:
            argv = [sys.executable, str(BENCH), "-b", str(lo), "-e", str(hi), "-f", str(factor),
                    "-n", str(iters), "-w", str(warmup), "-c", "1", "-a", alg,
                    "--topology", str(path), "--json"]
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            proc = cluster.run(argv, timeout=timeout)
            load1 = os.getloadavg()[0]
            if proc.returncode != 0:
                raise SystemExit(f"sim_fidelity: the emulated {alg} run on {path.name} failed "
                                 f"({proc.returncode}):\n{proc.stderr[-3000:]}")
            for row in benchmark_rows(proc.stdout):
                if int(row["size"]) in sizes:
                    out[alg, int(row["size"])] = {
                        "time_s": float(row["time_s"]), "mpi_time_s": float(row["mpi_time_s"]),
                        "wrong": int(row.get("wrong", 0)), "load": max(load0, load1)}
            say(f"  emulated {alg}: {time.perf_counter() - t0:.0f} s wall, load "
                f"{load0:.1f} -> {load1:.1f}")
    return out


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def table(rows: List[Dict[str, Any]]) -> str:
    head = (f"{'topology':<10} {'alg':<5} {'size':>6} {'emulated ms':>12} {'simulated ms':>13} "
            f"{'sim/emu':>8} {'MPI emu ms':>11} {'load':>5}")
    lines = [head]
    for r in rows:
        emu, sim, load = r.get("emulated_s"), r.get("simulated_s"), r.get("load")
        ratio = "-" if emu is None or sim is None else f"{sim / emu:.2f}"
        lines.append(f"{r['topology']:<10} {r['algorithm']:<5} {r['size'] >> 20:>5}M "
                     f"{_ms(emu):>12} {_ms(sim):>13} {ratio:>8} "
                     f"{_ms(r.get('mpi_emulated_s')):>11} "
                     f"{'-' if load is None else f'{load:.1f}':>5}")
    return "\n".join(lines)


def markdown(path: str, rows: List[Dict[str, Any]], args: argparse.Namespace) -> None:
    """The results file: the printed table's figures."""
    fmt = results_doc.fmt

    def ratio(r: Dict[str, Any]) -> str:
        emu, sim = r.get("emulated_s"), r.get("simulated_s")
        return "-" if emu is None or sim is None else f"{sim / emu:.2f}"

    columns: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["ranks"]),
        ("algorithm", lambda r: r["algorithm"]), ("size", lambda r: format_size(r["size"])),
        ("emulated (ms)", lambda r: fmt(r.get("emulated_s"), ".1f", 1e3)),
        ("simulated (ms)", lambda r: fmt(r.get("simulated_s"), ".1f", 1e3)),
        ("simulated / emulated", ratio),
        ("MPI_Allreduce emulated (ms)", lambda r: fmt(r.get("mpi_emulated_s"), ".1f", 1e3)),
        ("load", lambda r: fmt(r.get("load"), ".1f")), ("#wrong", lambda r: r["wrong"])]
    summary = (f"The same plan run on the emulated cluster (mean of {args.iters} iterations "
               f"after {args.warmup} warm-up; the load average beside it) and in the "
               f"simulator (one run: a simulation has no noise).")
    results_doc.write_table(path, "sim_fidelity: simulated against emulated allreduce time",
                            rows, columns, summary=summary)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topologies", default=",".join(TOPOLOGIES),
                    help="bundled names or JSON files (default %(default)s)")
    ap.add_argument("--sizes", default="4M,16M", help="allreduce sizes (default %(default)s)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS),
                    help="horotopo's plan (tree) and/or ring (default %(default)s)")
    ap.add_argument("--only", choices=["emulated", "simulated"], default=None,
                    help="run one side only")
    ap.add_argument("--iters", type=int, default=5, help="emulated timed iterations")
    ap.add_argument("--warmup", type=int, default=1, help="emulated warm-up iterations")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per emulated run")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "sim_fidelity")
    args = ap.parse_args(argv)
    sizes = sorted(parse_size(s) for s in args.sizes.split(","))
    algorithms = [a for a in args.algorithms.split(",") if a]
    bad = [a for a in algorithms if a not in ALGORITHMS]
    if bad or not algorithms:
        ap.error(f"--algorithms: a subset of {','.join(ALGORITHMS)}, got {args.algorithms!r}")
    rows: List[Dict[str, Any]] = []
    for name in filter(None, args.topologies.split(",")):
        path = Path(name) if Path(name).exists() else bundled(name)
        topology = load(path)
        plan = make_plan(topology)
        say(f"{topology.name}: {topology.n} ranks, plan {len(plan.trees)} trees, chunk "
            f"{plan.chunk_bytes} B (load {os.getloadavg()[0]:.1f})")
        sim = {} if args.only == "emulated" else simulated(topology, plan, sizes, algorithms)
        emu = {} if args.only == "simulated" else emulated(
            path, sizes, algorithms, args.iters, args.warmup, args.timeout)
        for size in sizes:
            for alg in algorithms:
                s, e = sim.get((alg, size)), emu.get((alg, size))
                rows.append({"topology": topology.name, "ranks": topology.n, "algorithm": alg,
                             "size": size, "chunk_bytes": plan.chunk_bytes,
                             "simulated_s": s and s["time_s"],
                             "emulated_s": e and e["time_s"],
                             "mpi_emulated_s": e and e["mpi_time_s"],
                             "load": e and e["load"],
                             "wrong": (s or {}).get("wrong", 0) + (e or {}).get("wrong", 0)})
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(table(rows))
    if args.markdown:
        markdown(args.markdown, rows, args)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
