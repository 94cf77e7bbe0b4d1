#!/usr/bin/env python
"""Adaptivity on the emulated cluster: a link slows down mid-run; the runtime re-plans.

    python benchmarks/adapt_emulated.py [--topology slow-nic] [--link n0,sw] [--size 4M] [--json]

Needs root (network namespaces and tc; see horotopo_launch.emulate); without it, it says why and
exits 0 having measured nothing. The driver (this process, outside the ranks):

1. plans the topology and builds it as an emulated cluster;
2. runs the job: every rank loops over allreduces of ``--size`` bytes on an
   :class:`~horotopo.adapt.AdaptiveEngine` started from that plan;
3. halfway through, rank 0 stops at a step boundary and writes a file; the driver then reshapes
   one direction of ``--link`` to ``--factor`` (a quarter) of its rate with ``tc change``
   (``EmulatedCluster.set_rate``) and answers with a file; the ranks go on;
4. after the adaptive phase, the same job times a *fresh* plan made from the truly degraded
   topology (the one the driver now emulates), on the same monitored engine with re-planning
   off, for comparison.

It prints the time series (the slowest rank's time per call): the time degrades after the
reshape, the runtime re-plans, and the time should recover to within ``--tolerance`` (15%) of
the fresh plan. ``--json`` prints {"series", "events", "fresh_s", "summary"} on stdout;
``--markdown [PATH]`` also writes the series and the summary to docs/results/adapt_emulated.md.
Exit status: 1 when a result is wrong, no re-plan happened, or the recovery misses the target.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

from horotopo.adapt.recovery import summarize_recovery  # noqa: E402


def _log(msg: str) -> None:
    print(f"[adapt] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the ranks


def _wait_file(path: Path, timeout_s: float) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"no {path.name} from the driver within {timeout_s:g} s")
        time.sleep(0.02)


def worker(args: argparse.Namespace) -> int:
    import numpy as np
    from mpi4py import MPI

    from horotopo.adapt import AdaptiveEngine
    from horotopo.plan import make_plan
    from horotopo.reliability import install_excepthook
    from horotopo.topology import load

    install_excepthook()
    comm = MPI.COMM_WORLD
    me, n = comm.rank, comm.size
    work = Path(args.dir)
    topo = load(args.topology)
    eng = AdaptiveEngine(comm, make_plan(topo), topo, threshold=args.threshold,
                         consecutive=args.consecutive, warmup=args.warmup)
    x = np.ones(args.size // 4, dtype=np.float32)
    out = np.empty_like(x)
    wrong = 0
    series: List[Dict[str, Any]] = []
    half = args.steps // 2
    for step in range(args.steps):
        if step == half:
            if me == 0:
                (work / "ready").touch()
                _wait_file(work / "degraded", 120.0)
            comm.Barrier()
        events_before = len(eng.events)
        eng.allreduce(x, out, algorithm="tree")
        wrong += int(np.count_nonzero(out != n))
        series.append({"step": step, "phase": "before" if step < half else "after",
                       "seconds": round(eng.last_seconds, 5), "plan": eng.plan.digest[:8],
                       "replanned": len(eng.events) > events_before})
        if me == 0:
            _log(f"step {step:3d} {series[-1]['phase']:<6} {eng.last_seconds * 1e3:8.1f} ms "
                 f"plan {eng.plan.digest[:8]}"
                 + ("  <- re-planned" if series[-1]["replanned"] else ""))
    events = [dict(vars(e)) for e in eng.events]
    adapted_digest = eng.plan.digest
    eng.close()
    # The fresh plan on the new network, run and timed the same way (the same monitored
    # engine, never re-planning; the slowest rank's time per call).
    new_topo = load(work / "degraded.json")
    fresh_plan = make_plan(new_topo)
    fresh: List[float] = []
    with AdaptiveEngine(comm, fresh_plan, new_topo, adapt=False) as plain:
        for _ in range(args.fresh_steps):
            plain.allreduce(x, out, algorithm="tree")
            fresh.append(plain.last_seconds)
            wrong += int(np.count_nonzero(out != n))
    wrong = comm.allreduce(wrong, MPI.SUM)
    if me == 0:
        print(json.dumps({"series": series, "events": events, "fresh_s": fresh,
                          "wrong": wrong, "adapted_digest": adapted_digest,
                          "fresh_digest": fresh_plan.digest,
                          "fresh_model_Bps": fresh_plan.throughput_Bps}))
    return 0


# ---------------------------------------------------------------------------------------------
# the driver


def _degraded_doc(doc: Dict[str, Any], a: str, b: str, factor: float) -> Dict[str, Any]:
    """``doc`` with direction ``a -> b`` of the link between them at ``factor`` of its rate."""
    out = json.loads(json.dumps(doc))
    for link in out["links"]:
        ends = link["ends"]
        if set(ends) != {a, b}:
            continue
        g = link["gbps"] if isinstance(link["gbps"], list) else [link["gbps"]] * 2
        k = 0 if ends == [a, b] else 1
        g[k] = g[k] * factor
        link["gbps"] = g
        return out
    raise SystemExit(f"no link between {a!r} and {b!r} in the topology")


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="slow-nic",
                    help="bundled name or path of a declared topology (default slow-nic)")
    ap.add_argument("--link", default="n0,sw", help="A,B: reshape direction A -> B")
    ap.add_argument("--factor", type=float, default=0.25)
    ap.add_argument("--size", default="4M")
    ap.add_argument("--steps", type=int, default=60, help="adaptive calls, half before")
    ap.add_argument("--fresh-steps", type=int, default=12)
    ap.add_argument("--threshold", type=float, default=0.3)
    ap.add_argument("--consecutive", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--prefix", default="htadp")
    ap.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(ap, "adapt_emulated")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from horotopo.plan import parse_size
    args.size = parse_size(args.size)
    if args.worker:
        return worker(args)

    from horotopo.topology import bundled

    path = Path(args.topology)
    if not path.exists():
        path = bundled(args.topology)
    try:
        from horotopo_launch.emulate import EmulatedCluster, available
    except ImportError as exc:
        _log(f"horotopo_launch is not installed ({exc}); pip install -e . first")
        return 1
    ok, why = available()
    if not ok:
        _log(f"skipped: no emulated cluster here ({why})")
        return 0
    a, b = args.link.split(",")
    doc = json.loads(path.read_text())
    work = Path(tempfile.mkdtemp(prefix="horotopo-adapt-"))
    degraded = _degraded_doc(doc, a, b, args.factor)
    (work / "degraded.json").write_text(json.dumps(degraded))
    argv_job = [sys.executable, str(Path(__file__).resolve()), "--worker", "--dir", str(work),
                "--topology", str(path), "--size", str(args.size), "--steps", str(args.steps),
                "--fresh-steps", str(args.fresh_steps), "--threshold", str(args.threshold),
                "--consecutive", str(args.consecutive), "--warmup", str(args.warmup)]
    result: Dict[str, Any] = {}
    with EmulatedCluster(doc, prefix=args.prefix) as cluster:
        def job() -> None:
            result["proc"] = cluster.run(argv_job, timeout=600)

        th = threading.Thread(target=job, daemon=True)
        t0 = time.monotonic()
        th.start()
        while th.is_alive() and not (work / "ready").exists():
            time.sleep(0.05)
        if (work / "ready").exists():
            old = cluster.rates[a, b]
            cluster.set_rate(a, b, old * args.factor)
            _log(f"reshaped {a} -> {b}: {old:g} -> {old * args.factor:g} gbps "
                 f"({time.monotonic() - t0:.1f} s into the job)")
            (work / "degraded").touch()
        th.join()
    proc = result.get("proc")
    if proc is None:
        _log("the job did not run")
        return 1
    sys.stderr.write(proc.stderr or "")
    lines = [ln for ln in (proc.stdout or "").splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        _log(f"the job failed (exit {proc.returncode}):\n{(proc.stdout or '')[-3000:]}")
        return 1
    res = json.loads(lines[-1])
    summary = summarize_recovery(res, args.tolerance, skip=1)
    summary.update({"topology": doc.get("name"), "link": f"{a}->{b}", "factor": args.factor,
                    "size": args.size, "ranks": len(doc["ranks"])})
    if args.json:
        print(json.dumps({**res, "summary": summary}))
    else:
        print(f"{'step':>4} {'phase':<7} {'ms':>9}  plan")
        for s in res["series"]:
            print(f"{s['step']:4d} {s['phase']:<7} {s['seconds'] * 1e3:9.1f}  {s['plan']}"
                  + ("  <- re-planned" if s["replanned"] else ""))
        for e in res["events"]:
            print(f"re-plan after call {e['step']}: {e['reason']}; suspects {e['suspects']}; "
                  f"probed {e['probed_gbps']} gbps; model {e['old_model_Bps'] * 8e-9:.3f} -> "
                  f"{e['new_model_Bps'] * 8e-9:.3f} gbps; {e['seconds']:.2f} s {e['note']}")
        print(f"fresh plan on the new network: {statistics.median(res['fresh_s']) * 1e3:.1f} ms "
              f"(model {res['fresh_model_Bps'] * 8e-9:.3f} gbps; adapted plan "
              f"{'=' if res['adapted_digest'] == res['fresh_digest'] else '!='} fresh plan)")
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in summary.items()))
    if args.markdown:
        markdown(args.markdown, res, summary)
    return 0 if summary["ok"] else 1


def markdown(path: str, res: Dict[str, Any], summary: Dict[str, Any]) -> None:
    """The results file: each call's time and plan, the re-plans, and the summary."""
    columns: List[results_doc.Column] = [
        ("call", lambda s: s["step"]), ("phase", lambda s: s["phase"]),
        ("time (ms)", lambda s: f"{s['seconds'] * 1e3:.1f}"),
        ("plan", lambda s: s["plan"] + (" (re-planned)" if s["replanned"] else ""))]
    events = "\n".join(
        f"- after call {e['step']}: {e['reason']}; suspects {e['suspects']}; probed "
        f"{e['probed_gbps']} gbps; model {e['old_model_Bps'] * 8e-9:.3f} -> "
        f"{e['new_model_Bps'] * 8e-9:.3f} gbps; {e['seconds']:.2f} s {e['note']}"
        for e in res["events"]) or "None."
    fresh = (f"Fresh plan on the new network: {statistics.median(res['fresh_s']) * 1e3:.1f} ms "
             f"(model {res['fresh_model_Bps'] * 8e-9:.3f} gbps; the adapted plan "
             f"{'is' if res['adapted_digest'] == res['fresh_digest'] else 'is not'} the fresh "
             f"plan).")
    results_doc.write(
        path, "adapt_emulated: a link slows mid-job on an emulated cluster",
        [("Calls", results_doc.md_table(res["series"], columns)), ("Re-plans", events),
         ("Summary", fresh + "\n\n" + results_doc.key_value_table(summary))],
        summary=f"{summary['topology']}, {summary['ranks']} ranks, {summary['size']} bytes per "
                f"allreduce; {summary['link']} reshaped to {summary['factor']:g} of its rate "
                f"half-way. Times are the slowest rank's per call, on this machine.")


if __name__ == "__main__":
    sys.exit(main())
