#!/usr/bin/env python
"""Robustness of the tree-or-MPI choice: fresh `hvd` jobs on emulated clusters, repeated.

    python benchmarks/robustness.py [--jobs 5] [--random 2] [--topologies racks-2x3,...] [--json]

Needs root (network namespaces and tc; see horotopo_launch.emulate). For each topology (the
bundled ones in horotopo/data/topologies, plus
``--random`` declared ones from :func:`horotopo.generate.random_declared`) the driver builds the
emulated cluster once and runs ``--jobs`` fresh MPI jobs in it. Each job does what a user's job
does: ``hvd.init()`` with the default probe (``HOROTOPO_PROBE`` unset: the quick probe, the
plan, the engine's calibration), then for each size (4 and 16 MiB float32 by default)
``--warmup`` untimed and ``--iters`` timed ``hvd.allreduce`` calls, each followed by one
``MPI_Allreduce`` of the same buffer in the same job (interleaved, so both see the same load).
A call's time is the slowest rank's (barrier before, max-allreduce of the elapsed times after).

Per job and size the benchmark keeps the median of the timed calls and reports, over the jobs:

- ``fraction of optimum`` = T_opt / T_hvd, where T_opt is the time the plan made from the
  *declared* topology predicts (``make_plan(topology).predict_time(size)``, the same
  "predicted" column as benchmarks/emulated_allreduce.py) and T_hvd the measured median. It is
  independent of the job's own probe, so a job whose probe or choice went wrong scores low;
- ``ratio to MPI`` = T_mpi / T_hvd in the same job (above 1: horotopo is faster);
- which algorithm the engine ran on the timed calls (tree / mpi / ring counts), re-plans.

Each job's log line also gives its own (probed) plan's prediction (``own plan``): a low fraction
is then a worse plan (own plan above the optimum) or a slow run of a good one. The optimum is
an honest yardstick on the emulator: on racks-2x3 at 16 MiB it is 540 ms, within 1% of the
bound that 16 MiB each way over the 0.25 gbps rack link sets (537 ms), and a bare 16 MiB MPI
stream over that emulated link takes about as long.

Targets at 16 MiB, per topology: minimum fraction >= 0.75, median >= 0.85, and no job slower
than MPI_Allreduce by more than 5% (T_hvd <= 1.05 T_mpi). The exit status is 1 when a target is
missed (every miss is listed), a job fails or a result is wrong; 0 otherwise. Without root or
ip netns it says why and exits 2 having measured nothing.

``--markdown [PATH]`` also writes the table and the misses to docs/results/robustness.md.
``--json`` prints only the JSON document ({"config", "load", "topologies": [...], "misses"})
on stdout; progress always goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

from horotopo.reliability.targets import (  # noqa: E402
    MEDIAN_FRACTION, MIN_FRACTION, MPI_SLACK, summarize)

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY_DIRS = (ROOT / "horotopo" / "data" / "topologies",)


def _log(msg: str) -> None:
    print(f"[robustness] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the ranks


def worker(args: argparse.Namespace) -> int:
    import numpy as np
    import horotopo as hvd
    from mpi4py import MPI

    t0 = time.perf_counter()
    hvd.init()
    init_s = time.perf_counter() - t0
    comm = MPI.COMM_WORLD
    me, n = comm.rank, comm.size
    from horotopo.api.basics import runtime

    eng = runtime().engine  # the AdaptiveEngine: which algorithm each call ran
    rows: List[Dict[str, Any]] = []
    wrong = 0
    for size in args.sizes:
        x = np.full(max(1, size // 4), float(me + 1), dtype=np.float32)
        ref = np.empty_like(x)
        want = float(n * (n + 1) // 2)
        name = f"robustness.{size}"
        hvd_s: List[float] = []
        mpi_s: List[float] = []
        algs: List[str] = []
        for it in range(args.warmup + args.iters):
            comm.Barrier()
            s = time.perf_counter()
            out = hvd.allreduce(x, name=name, op=hvd.Sum)
            dt_hvd = comm.allreduce(time.perf_counter() - s, op=MPI.MAX)
            alg = str(getattr(getattr(eng, "engine", eng), "last_algorithm", "?"))
            wrong += int(np.count_nonzero(out != want))
            comm.Barrier()
            s = time.perf_counter()
            comm.Allreduce(x, ref, op=MPI.SUM)
            dt_mpi = comm.allreduce(time.perf_counter() - s, op=MPI.MAX)
            if it >= args.warmup:
                hvd_s.append(dt_hvd)
                mpi_s.append(dt_mpi)
                algs.append(alg)
        rows.append({"size": size, "hvd_s": hvd_s, "mpi_s": mpi_s, "algorithms": algs})
    wrong = comm.allreduce(wrong, op=MPI.SUM)
    model = getattr(eng, "cost_model", None)
    info = {"rows": rows, "wrong": wrong, "init_s": comm.allreduce(init_s, op=MPI.MAX),
            "replans": len(getattr(eng, "events", ())),
            "plan_model_Bps": float(eng.plan.throughput_Bps),
            # the job's own (probed) plan's prediction beside the declared optimum: a low
            # fraction is then either a worse plan (this above the optimum) or a slow run of it
            "plan_predicted_s": {str(s): float(eng.plan.predict_time(s)) for s in args.sizes},
            "cost_model": (model.describe() if hasattr(model, "describe") else repr(model))}
    hvd.shutdown()
    if me == 0:
        print(json.dumps(info), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# the driver


def _topologies(names: Optional[str], n_random: int, random_ranks: int, seed: int
                ) -> List[Tuple[str, Dict[str, Any]]]:
    """``(name, declared document)`` for every topology to run, in a fixed order."""
    from horotopo.generate import random_declared

    found: Dict[str, Dict[str, Any]] = {}
    for d in TOPOLOGY_DIRS:
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.json")):
            doc = json.loads(path.read_text())
            if "links" in doc:  # the emulator builds declared topologies only
                found.setdefault(doc.get("name", path.stem), doc)
    out: List[Tuple[str, Dict[str, Any]]] = []
    if names is not None:
        for name in [s for s in names.split(",") if s]:
            path = Path(name)
            if path.exists():
                doc = json.loads(path.read_text())
                out.append((doc.get("name", path.stem), doc))
            elif name in found:
                out.append((name, found[name]))
            else:
                raise SystemExit(f"unknown topology {name!r}; bundled: {', '.join(found)}")
    else:
        out.extend(sorted(found.items()))
    for k in range(n_random):
        # Rates kept within what a 2-core machine emulates faithfully (about 1 gbps at most).
        doc = random_declared(random_ranks, seed + k, gbps_range=(0.2, 1.0))
        out.append((doc["name"], doc))
    return out


def _load() -> Dict[str, Any]:
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1m": one, "loadavg_5m": five, "loadavg_15m": fifteen,
            "cpus": os.cpu_count()}


def _run_topology(name: str, doc: Dict[str, Any], args: argparse.Namespace
                  ) -> Tuple[Dict[str, Any], List[str]]:
    from horotopo.plan import make_plan
    from horotopo.topology import from_dict
    from horotopo_launch.emulate import EmulatedCluster

    plan = make_plan(from_dict(doc))
    optimum = {size: plan.predict_time(size) for size in args.sizes}
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker",
            "--sizes", ",".join(str(s) for s in args.sizes), "--warmup", str(args.warmup),
            "--iters", str(args.iters)]
    jobs: List[Dict[str, Any]] = []
    misses: List[str] = []
    with EmulatedCluster(doc, prefix=args.prefix) as cluster:
        _log(f"{name}: {len(cluster.ranks)} ranks; optimum "
             + ", ".join(f"{s >> 20} MiB {t * 1e3:.0f} ms" for s, t in optimum.items()))
        for k in range(args.jobs):
            t0 = time.monotonic()
            try:
                proc = cluster.run(argv, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                misses.append(f"{name}: job {k} did not finish within {args.timeout:.0f} s")
                continue
            lines = [ln for ln in (proc.stdout or "").splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                misses.append(f"{name}: job {k} failed (exit {proc.returncode}): "
                              f"{(proc.stderr or proc.stdout or '')[-800:]}")
                continue
            job = json.loads(lines[-1])
            jobs.append(job)
            own = job["plan_predicted_s"]
            desc = "; ".join(
                f"{r['size'] >> 20} MiB {statistics.median(r['hvd_s']) * 1e3:.0f} ms "
                f"(opt {optimum[r['size']] * 1e3:.0f}, own plan "
                f"{own[str(r['size'])] * 1e3:.0f}, MPI "
                f"{statistics.median(r['mpi_s']) * 1e3:.0f}) "
                f"{'/'.join(sorted(set(r['algorithms'])))}" for r in job["rows"])
            _log(f"{name} job {k}: {desc}; init {job['init_s']:.1f} s, "
                 f"{job['replans']} re-plans, {time.monotonic() - t0:.0f} s; "
                 f"load {os.getloadavg()[0]:.1f}")
    if not jobs:
        return {"name": name, "jobs": 0, "sizes": []}, misses
    summary, more = summarize(name, optimum, jobs)
    summary["plan_Bps"] = plan.throughput_Bps
    summary["own_plan_s"] = [j["plan_predicted_s"] for j in jobs]
    summary["ranks"] = plan.n
    return summary, misses + more


def _print_table(results: Sequence[Dict[str, Any]]) -> None:
    print(f"{'topology':<24} {'size':>6} {'jobs':>4}  {'fraction of optimum':>22}  "
          f"{'MPI time / horotopo':>22}  algorithms")
    print(f"{'':<24} {'':>6} {'':>4}  {'min / median / max':>22}  {'min / median / max':>22}")
    for res in results:
        for s in res["sizes"]:
            f, r = s["fraction"], s["ratio_to_mpi"]
            algs = ", ".join(f"{a} {c}" for a, c in sorted(s["algorithms"].items()))
            print(f"{res['name']:<24} {s['size'] >> 20:>4}Mi {res['jobs']:>4}  "
                  f"{f['min']:6.2f} / {f['median']:5.2f} / {f['max']:5.2f}  "
                  f"{r['min']:6.2f} / {r['median']:5.2f} / {r['max']:5.2f}  {algs}")


def markdown(path: str, results: Sequence[Dict[str, Any]], misses: Sequence[str],
             args: argparse.Namespace) -> None:
    """The results file: per topology and size the spread over the jobs, then the misses."""
    def spread(s: Dict[str, float]) -> str:
        return f"{s['min']:.2f} / {s['median']:.2f} / {s['max']:.2f}"

    rows = [{**s, "name": res["name"], "jobs": res["jobs"]}
            for res in results for s in res["sizes"]]
    columns: List[results_doc.Column] = [
        ("topology", lambda r: r["name"]), ("size", lambda r: f"{r['size'] >> 20} MiB"),
        ("jobs", lambda r: r["jobs"]),
        ("fraction of optimum (min / median / max)", lambda r: spread(r["fraction"])),
        ("MPI time / horotopo (min / median / max)", lambda r: spread(r["ratio_to_mpi"])),
        ("algorithms", lambda r: ", ".join(f"{a} {c}" for a, c in
                                           sorted(r["algorithms"].items())))]
    verdict = ("All targets met." if not misses else "\n".join(f"- missed: {m}" for m in misses))
    results_doc.write(
        path, "robustness: fresh jobs on emulated clusters",
        [("", results_doc.md_table(rows, columns)), ("Targets at 16 MiB", verdict)],
        summary=f"{args.jobs} fresh jobs per topology, each with the default init (the quick "
                f"probe, the plan, calibration); per size {args.warmup} untimed and "
                f"{args.iters} timed calls, interleaved with MPI_Allreduce. Targets: minimum "
                f"fraction of the optimum {MIN_FRACTION}, median {MEDIAN_FRACTION}, no job "
                f"slower than {MPI_SLACK}x MPI_Allreduce.")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topologies", default=None,
                   help="comma-separated bundled names or paths (default: every bundled "
                        "declared topology)")
    p.add_argument("--random", type=int, default=2,
                   help="random declared topologies to add (default 2)")
    p.add_argument("--random-ranks", type=int, default=4, help="ranks of each random one")
    p.add_argument("--seed", type=int, default=12, help="seed of the first random topology")
    p.add_argument("--jobs", type=int, default=5, help="fresh jobs per topology (default 5)")
    p.add_argument("--sizes", default="4M,16M", help="comma-separated sizes (default 4M,16M)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default 2)")
    p.add_argument("--iters", type=int, default=5, help="timed calls per size (default 5)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    p.add_argument("--prefix", default="htrob", help="namespace prefix of the cluster")
    p.add_argument("--json", action="store_true", help="print only the JSON document")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    results_doc.add_markdown_option(p, "robustness")
    args = p.parse_args(argv)
    from horotopo.plan import parse_size

    args.sizes = [parse_size(s) for s in str(args.sizes).split(",") if s]
    if args.worker:
        return worker(args)
    from horotopo_launch.emulate import available

    ok, why = available()
    if not ok:
        _log(f"no emulated cluster here ({why}); nothing measured")
        return 2
    for var in ("HOROTOPO_PROBE", "HOROTOPO_TOPOLOGY"):
        # cluster.run passes this environment to the ranks: the jobs must use the default init
        if os.environ.pop(var, None) is not None:
            _log(f"{var} unset for the jobs (they run with the default probe)")
    load_before = _load()
    results: List[Dict[str, Any]] = []
    misses: List[str] = []
    for name, doc in _topologies(args.topologies, args.random, args.random_ranks, args.seed):
        res, miss = _run_topology(name, doc, args)
        results.append(res)
        misses.extend(miss)
        for m in miss:
            _log("MISS " + m)
    report = {"config": {"jobs": args.jobs, "sizes": args.sizes, "warmup": args.warmup,
                         "iters": args.iters, "random": args.random, "seed": args.seed,
                         "targets": {"min_fraction": MIN_FRACTION,
                                     "median_fraction": MEDIAN_FRACTION,
                                     "max_time_over_mpi": MPI_SLACK}},
              "load": {"before": load_before, "after": _load()},
              "topologies": results, "misses": misses}
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(results)
        print(f"load average before {load_before['loadavg_1m']:.1f}, after "
              f"{report['load']['after']['loadavg_1m']:.1f} ({load_before['cpus']} CPUs)")
        print("targets at 16 MiB: " + ("all met" if not misses else "MISSED:"))
        for m in misses:
            print("  " + m)
    if args.markdown:
        markdown(args.markdown, results, misses, args)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
