"""The main job: horotopo against MPI_Allreduce on an emulated heterogeneous cluster.

    python benchmarks/emulated_allreduce.py [TOPOLOGY.json] [--sizes -b 1M -e 16M -f 4 ...]

It plans the topology (the trees, the predicted time), builds the topology as an emulated
cluster (network namespaces and shaped links; needs root) and runs
``benchmarks/allreduce_perf.py --topology TOPOLOGY.json --json`` across the namespaces, rank i
on host ``ranks[i]``. It prints, per size, horotopo's time, MPI_Allreduce's time measured in the
same run, the plan's prediction, and a one-line verdict.

Without root (or without ip netns / tc) it says so and runs the same benchmark on plain local
ranks; the links are then not the topology's, so the prediction does not apply.

``--markdown [PATH]`` also writes the table and the verdict to docs/results/emulated_allreduce.md.

Exit status: 0 when every row has zero mismatched elements; 1 otherwise, or when the planner or
the benchmark fails (there is no fallback plan: a planner error is the job's error).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOPOLOGY = ROOT / "horotopo" / "data" / "topologies" / "racks-2x3.json"
BENCH = ROOT / "benchmarks" / "allreduce_perf.py"

from horotopo.plan import format_size
from horotopo.reliability.versus_mpi import benchmark_rows, versus_mpi_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results as results_doc  # noqa: E402


def _log(msg: str) -> None:
    sys.stdout.flush()  # keep the log in order with the report when both go to a terminal
    print(f"[main] {msg}", file=sys.stderr, flush=True)


def _plan(topology_path: Path) -> Any:
    """The plan the benchmark runs: the packing planner's, with no fallback (a ring in its place
    would report a benchmark of something other than horotopo's plan as the main job's result)."""
    from horotopo.plan import make_plan
    from horotopo.topology import load

    return make_plan(load(topology_path))


def _run_emulated(topology: Path, argv: List[str], timeout: float) -> subprocess.CompletedProcess:
    from horotopo_launch.emulate import EmulatedCluster
    from horotopo_launch.mpi import format_command

    # A prefix of its own, so the main job neither waits for nor disturbs a user's `ht` cluster.
    with EmulatedCluster(topology, prefix="htmain") as cluster:
        _log(f"emulated {len(cluster.nodes)} namespaces, {len(cluster.links)} shaped links; "
             f"running {len(cluster.ranks)} ranks across them")
        _log("command: " + format_command(*cluster.command(argv)))
        return cluster.run(argv, timeout=timeout)


def _run_local(np: int, argv: List[str], timeout: float) -> subprocess.CompletedProcess:
    from horotopo_launch.mpi import Job, command_line, detect, format_command

    cmd, launcher_env = command_line(detect(), Job(np=np, command=argv))
    _log("command: " + format_command(cmd, launcher_env))
    env = dict(os.environ)
    env.update(launcher_env)
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)


def markdown(path: str, rows: Sequence[Dict[str, Any]], plan: Any, emulated: bool,
             verdict: str, where: str) -> None:
    """The results file: per size horotopo, MPI_Allreduce and the prediction, then the
    verdict."""
    fmt = results_doc.fmt
    columns: List[results_doc.Column] = [
        ("size", lambda r: format_size(int(r["size"]))),
        ("horotopo (ms)", lambda r: fmt(r["time_s"], ".1f", 1e3)),
        ("MPI_Allreduce (ms)", lambda r: fmt(r["mpi_time_s"], ".1f", 1e3)),
        ("MPI / horotopo", lambda r: fmt(r["ratio"], ".2f")),
        ("predicted (ms)", lambda r: fmt(plan.predict_time(int(r["size"])), ".1f", 1e3)
         if emulated else "-"),
        ("#wrong", lambda r: int(r.get("wrong", 0)))]
    summary = (f"Allreduce of float32 on {plan.n} ranks, {where}. Both timed in the same run, "
               f"interleaved; MPI / horotopo above 1 means horotopo was faster."
               + ("" if emulated else " The ranks were plain local ones, not the topology's "
                  "links, so the plan's prediction does not apply."))
    results_doc.write(path, "emulated_allreduce: horotopo against MPI_Allreduce on an emulated "
                      "cluster", [("", results_doc.md_table(rows, columns)),
                                  ("Verdict", verdict)], summary=summary)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", nargs="?", default=str(DEFAULT_TOPOLOGY),
                   help="declared topology to emulate (default: the bundled racks-2x3)")
    p.add_argument("-b", "--minbytes", default="1M")
    p.add_argument("-e", "--maxbytes", default="16M")
    p.add_argument("-f", "--stepfactor", default="4")
    p.add_argument("-n", "--iters", default="3")
    p.add_argument("-w", "--warmup-iters", default="1")
    p.add_argument("--bench", default=str(BENCH), help=argparse.SUPPRESS)
    p.add_argument("--local", action="store_true",
                   help="skip the emulation and run on plain local ranks")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    p.add_argument("--window", type=int, default=None,
                   help="chunks of scratch per tree and reduce child (they bound the chunks "
                        "in flight too); default: the engine's automatic window "
                        "(horotopo.schedule.window_for: 32 at 64 KiB chunks)")
    results_doc.add_markdown_option(p, "emulated_allreduce")
    args = p.parse_args(argv)

    topology = Path(args.topology).resolve()
    bench = Path(args.bench)
    if not bench.exists():
        _log(f"{bench.relative_to(ROOT) if bench.is_relative_to(ROOT) else bench} does not "
             f"exist yet: the allreduce benchmark is needed for the main job")
        return 1
    try:
        plan = _plan(topology)
    except Exception as exc:  # not swallowed: reported with its traceback, and the job fails
        _log(f"the planner failed on {topology}: {type(exc).__name__}: {exc}\n"
             + traceback.format_exc())
        return 1
    print(plan.describe(_parse_size(args.maxbytes)))

    bench_argv = [sys.executable, str(bench), "-b", args.minbytes, "-e", args.maxbytes,
                  "-f", args.stepfactor, "-n", args.iters, "-w", args.warmup_iters, "-c", "1",
                  "--topology", str(topology), "--json"]
    if args.window is not None:
        if args.window < 1:
            p.error(f"--window must be >= 1 chunk, got {args.window}")
        bench_argv += ["--window", str(args.window)]
    from horotopo_launch.emulate import available
    ok, why = available()
    emulated = ok and not args.local
    try:
        if emulated:
            proc = _run_emulated(topology, bench_argv, args.timeout)
        else:
            reason = "--local was given" if args.local else why
            _log(f"NOT emulating the topology ({reason}): falling back to plain local ranks, "
                 f"which share this machine's memory instead of the topology's links")
            proc = _run_local(plan.n, bench_argv, args.timeout)
    except subprocess.TimeoutExpired:
        _log(f"the benchmark did not finish within {args.timeout:.0f}s")
        return 1
    sys.stderr.write(proc.stderr or "")
    if proc.returncode != 0:
        _log(f"the benchmark failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
        return 1
    try:
        rows = benchmark_rows(proc.stdout)
    except RuntimeError as exc:
        _log(f"{exc}; its output was:\n{proc.stdout[-4000:]}")
        return 1
    where = "emulated cluster" if emulated else "plain local ranks"
    print(f"\nallreduce on {plan.n} ranks, {where} ({topology.name}):")
    text, good = versus_mpi_report(rows, plan, emulated)
    print(text)
    if args.markdown:
        verdict = text.splitlines()[-1] if rows else "the benchmark returned no rows"
        markdown(args.markdown, rows, plan, emulated, verdict, f"{where} ({topology.name})")
    return 0 if good else 1


def _parse_size(text: str) -> int:
    from horotopo.plan import parse_size
    return parse_size(text)


if __name__ == "__main__":
    sys.exit(main())
