#!/usr/bin/env python
"""nccl-tests style allreduce benchmark: horotopo's engine and MPI_Allreduce in the same run.

Run under mpiexec, e.g.::

    mpiexec -n 4 python benchmarks/allreduce_perf.py -b 1M -e 64M -f 4 -a tree

Rows: size, count, type, redop, time, algbw, busbw, #wrong for horotopo, the same for
MPI_Allreduce, their ratio (MPI time / horotopo time) and the plan's predicted time (tree rows
only; "-" on the others). ``--json`` prints only ``{"rows": [...]}`` on stdout; progress
always goes to stderr. ``#wrong`` counts elements that differ from the exact answer on
small-integer inputs (on any rank).
``--markdown [PATH]`` also writes the table to docs/results/allreduce_perf.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
import time
from typing import Any, Dict, List, Optional

import numpy as np
from mpi4py import MPI

from horotopo.buffers import scale_into
from horotopo.engine import Engine
from horotopo.ops import ALLREDUCE_DTYPES, OPS, check_dtype
from horotopo.packing import ring_parents
from horotopo.plan import Plan, parse_size, plan_from_trees
from horotopo.topology import plural

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402


def _args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier (default 2)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations")
    p.add_argument("-c", "--check", type=int, default=1, help="1: count wrong elements")
    p.add_argument("-d", "--datatype", default="float32", choices=ALLREDUCE_DTYPES,
                   help="element type (bfloat16 needs ml-dtypes)")
    p.add_argument("-o", "--op", default="sum", choices=OPS)
    p.add_argument("-a", "--algorithm", default="auto",
                   choices=["auto", "tree", "ring", "mpi", "dbtree", "hierarchical"],
                   help="horotopo algorithm (auto: the cost model picks per size; dbtree and "
                        "hierarchical are peers, run only when named)")
    p.add_argument("--chunk-bytes", default=None, help="override the plan's chunk size")
    p.add_argument("--window", type=int, default=None,
                   help="chunks per tree that may hold receive scratch (engine default 4)")
    p.add_argument("--calibrate", action="store_true",
                   help="run Engine.calibrate() first, so that -a auto uses measured costs")
    p.add_argument("--plan", help="Plan JSON (python -m horotopo plan TOPO --json)")
    p.add_argument("--topology", help="topology JSON; rank 0 plans it with make_plan")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(p, "allreduce_perf")
    args = p.parse_args(argv)
    if args.stepfactor < 2:
        p.error("-f must be at least 2")
    if args.iters < 1 or args.warmup_iters < 0:
        p.error("-n must be >= 1 and -w >= 0")
    return args


def _log(msg: str) -> None:
    if MPI.COMM_WORLD.rank == 0:
        print(msg, file=sys.stderr, flush=True)


def load_plan(args: argparse.Namespace, comm: "MPI.Comm") -> Plan:
    """Rank 0 reads or makes the plan; every rank gets rank 0's JSON, so all agree."""
    doc = note = None
    if comm.rank == 0:
        try:
            if args.plan:
                with open(args.plan) as fh:
                    doc = json.load(fh)
            elif args.topology:
                from horotopo import topology as topo_mod
                from horotopo.plan import make_plan

                # No ring fallback: a planner error fails the run (below), it is not benchmarked
                # as if it were the plan.
                doc = make_plan(topo_mod.load_for_job(args.topology, comm.size)).to_json()
            else:
                n = comm.size
                doc = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                                      chunk_bytes=1 << 20).to_json()
                note = "no --plan/--topology: ring chains at equal rates, 1 MiB chunks"
        except Exception as exc:  # shared with every rank so nobody waits forever
            doc = {"error": f"{type(exc).__name__}: {exc}"}
    doc = comm.bcast(doc, root=0)
    note = comm.bcast(note, root=0)
    if "error" in doc:
        raise SystemExit(f"allreduce_perf: cannot load the plan: {doc['error']}")
    if note:
        _log(f"# note: {note}")
    plan = Plan.from_json(doc)
    if plan.n != comm.size:
        raise SystemExit(f"allreduce_perf: the plan is for {plan.n} ranks but this job has "
                         f"{comm.size}")
    return plan


def _inputs(count: int, dtype: np.dtype, op: str, rank: int, size: int):
    """Small integers whose reduction is exact in every dtype; returns (input, expected)."""
    i = np.arange(count, dtype=np.int64)
    if op == "product":
        # at most one 2 per element over all ranks: the product is 1 or 2
        x = np.where((i % (size + 1)) == rank, 2, 1)
        expect = np.where((i % (size + 1)) < size, 2, 1)
    else:
        x = (i + rank) % 3 + 1
        allx = np.stack([(i + r) % 3 + 1 for r in range(size)]) if count else np.zeros((size, 0))
        if op in ("sum", "average"):
            expect = allx.sum(axis=0)
        elif op == "min":
            expect = allx.min(axis=0)
        else:
            expect = allx.max(axis=0)
    expect = np.asarray(expect).astype(dtype)
    if op == "average":
        # the exact sum, scaled by 1/size with the engine's (Horovod's) rule for this dtype
        scale_into(expect, expect, 1.0 / size)
    return x.astype(dtype), expect


def _time_pair(fa, fb, iters: int, warmup: int, comm: "MPI.Comm"):
    """Mean seconds of ``fa`` and ``fb``, interleaved iteration by iteration so that load from
    other processes hits both alike; each iteration starts at a barrier, and each rank's mean
    is reduced with MAX (the slowest rank is the collective's time)."""
    for _ in range(warmup):
        fa()
        fb()
    ta = tb = 0.0
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        fa()
        ta += time.perf_counter() - t0
        comm.Barrier()
        t0 = time.perf_counter()
        fb()
        tb += time.perf_counter() - t0
    both = comm.allreduce((ta / iters, tb / iters), op=_MAX_PAIR)
    return both


def _max_pair(a, b, _dt=None):
    return (max(a[0], b[0]), max(a[1], b[1]))


_MAX_PAIR = MPI.Op.Create(_max_pair, commute=True)


_MPI_OPS = {"sum": MPI.SUM, "average": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX,
            "product": MPI.PROD}


def _us(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def run(args: argparse.Namespace) -> List[Dict[str, Any]]:
    comm = MPI.COMM_WORLD
    plan = load_plan(args, comm)
    modelled = bool(args.plan or args.topology)  # the default ring plan has made-up rates
    chunk = parse_size(args.chunk_bytes) if args.chunk_bytes else None
    extra = {"window": args.window} if args.window else {}
    eng = Engine(comm, plan, chunk_bytes=chunk, **extra)
    dtype = check_dtype(args.datatype)  # not np.dtype: "bfloat16" needs ml_dtypes loaded
    n = comm.size
    if args.calibrate:
        model = eng.calibrate()
        cut = model.cutover_bytes(plan, eng.chunk_bytes)
        _log(f"# calibrated: MPI {model.mpi_latency_s * 1e6:.1f} us + bytes / "
             f"{model.mpi_Bps / 1e9:.3f} GB/s; tree {model.tree_latency_s * 1e6:.1f} us + "
             f"bytes / {model.tree_Bps / 1e9:.3f} GB/s; tree from "
             f"{cut if cut is not None else 'never'} bytes")
    alg = None if args.algorithm == "auto" else args.algorithm
    rows = []
    size = max(dtype.itemsize, parse_size(args.minbytes))
    top = parse_size(args.maxbytes)
    _log(f"# horotopo allreduce_perf: {n} ranks, {dtype.name} {args.op}, "
         f"algorithm {args.algorithm}, chunk {eng.chunk_bytes} B, plan {plan.digest} "
         f"({plural(len(plan.trees), 'tree')})")
    _log(f"# {'size':>12} {'count':>10} {'alg':>5} {'time_us':>10} {'algbw':>7} {'busbw':>7} "
         f"{'#wrong':>6} {'mpi_us':>10} {'mpi_bw':>7} {'ratio':>6} {'pred_us':>10}")
    while size <= top:
        count = size // dtype.itemsize
        nbytes = count * dtype.itemsize
        x, expect = _inputs(count, dtype, args.op, comm.rank, n)
        out = np.empty_like(x)
        out2 = np.empty_like(x)
        if dtype.itemsize == 2:  # float16, bfloat16: MPI has no such type, so the baseline
            # is the engine's MPI path (float32 inside)
            mpi_fn = lambda: eng.allreduce(x, out2, op=args.op, algorithm="mpi")  # noqa: E731
        else:
            mop = _MPI_OPS[args.op]
            mpi_fn = lambda: comm.Allreduce(x, out2, op=mop)  # noqa: E731
        t, tm = _time_pair(lambda: eng.allreduce(x, out, op=args.op, algorithm=alg), mpi_fn,
                           args.iters, args.warmup_iters, comm)
        used = alg or eng.choose(nbytes)  # not last_algorithm: 16-bit baselines use the engine
        wrong = 0
        if args.check:
            out[...] = 0
            eng.allreduce(x, out, op=args.op, algorithm=alg)
            wrong = comm.allreduce(int(np.count_nonzero(out != expect)), op=MPI.SUM)
        algbw = nbytes / t / 1e9 if t > 0 else 0.0
        mbw = nbytes / tm / 1e9 if tm > 0 else 0.0
        bus = 2.0 * (n - 1) / n if n > 1 else 1.0
        row = {"size": nbytes, "count": count, "type": dtype.name, "redop": args.op,
               "algorithm": used, "time_s": t, "algbw_GBps": algbw, "busbw_GBps": algbw * bus,
               "mpi_time_s": tm, "mpi_algbw_GBps": mbw, "mpi_busbw_GBps": mbw * bus,
               "wrong": wrong, "ratio": tm / t if t > 0 else 0.0,
               # the plan's prediction is the tree's: no other algorithm's row gets it
               "predicted_time_s": (plan.predict_time(nbytes, eng.chunk_bytes)
                                    if modelled and used == "tree" else None),
               "chunk_bytes": eng.chunk_bytes, "ranks": n}
        rows.append(row)
        _log(f"  {nbytes:>12} {count:>10} {used:>5} {t * 1e6:>10.1f} {algbw:>7.3f} "
             f"{algbw * bus:>7.3f} {wrong:>6} {tm * 1e6:>10.1f} {mbw:>7.3f} "
             f"{row['ratio']:>6.2f} {_us(row['predicted_time_s']):>10}")
        size *= args.stepfactor
    eng.close()
    return rows


def markdown(args: argparse.Namespace, rows: List[Dict[str, Any]], argv: Optional[List[str]],
             ranks: int) -> None:
    """The results file: the nccl-tests columns for horotopo and MPI_Allreduce side by side."""
    fmt = results_doc.fmt
    columns: List[results_doc.Column] = [
        ("size (B)", lambda r: r["size"]), ("count", lambda r: r["count"]),
        ("type", lambda r: r["type"]), ("redop", lambda r: r["redop"]),
        ("alg", lambda r: r["algorithm"]),
        ("time (us)", lambda r: fmt(r["time_s"], ".1f", 1e6)),
        ("algbw (GB/s)", lambda r: fmt(r["algbw_GBps"], ".3f")),
        ("busbw (GB/s)", lambda r: fmt(r["busbw_GBps"], ".3f")),
        ("#wrong", lambda r: r["wrong"]),
        ("MPI time (us)", lambda r: fmt(r["mpi_time_s"], ".1f", 1e6)),
        ("MPI busbw (GB/s)", lambda r: fmt(r["mpi_busbw_GBps"], ".3f")),
        ("MPI / horotopo time", lambda r: fmt(r["ratio"], ".2f")),
        ("predicted (us)", lambda r: fmt(r["predicted_time_s"], ".1f", 1e6))]
    chunk = rows[0]["chunk_bytes"] if rows else None
    plan = (f"the plan of {args.plan}" if args.plan else f"planned from {args.topology}"
            if args.topology else "no plan given: ring chains at equal rates")
    summary = (f"{ranks} ranks, {plan}, {args.datatype} {args.op}, horotopo algorithm "
               f"{args.algorithm}, chunk {chunk} B, {args.iters} timed iterations after "
               f"{args.warmup_iters} warm-up (mean of each rank, slowest rank). "
               f"MPI / horotopo above 1 means horotopo was faster. The predicted column is "
               f"the plan's model, shown only for a plan made from a topology.")
    results_doc.write_table(args.markdown, "allreduce_perf: horotopo against MPI_Allreduce",
                            rows, columns, summary=summary,
                            command=results_doc.command_line(argv, ranks=ranks))


def main(argv: Optional[List[str]] = None) -> int:
    args = _args(argv)
    rows = run(args)
    if MPI.COMM_WORLD.rank == 0:
        if args.markdown:
            markdown(args, rows, argv, MPI.COMM_WORLD.size)
        if args.json:
            print(json.dumps({"rows": rows}))
        else:
            print("# size count type redop alg time_us algbw busbw #wrong mpi_time_us "
                  "mpi_algbw ratio")
            for r in rows:
                print(f"{r['size']} {r['count']} {r['type']} {r['redop']} {r['algorithm']} "
                      f"{r['time_s'] * 1e6:.1f} {r['algbw_GBps']:.3f} {r['busbw_GBps']:.3f} "
                      f"{r['wrong']} {r['mpi_time_s'] * 1e6:.1f} {r['mpi_algbw_GBps']:.3f} "
                      f"{r['ratio']:.2f}")
    wrong = sum(r["wrong"] for r in rows)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
