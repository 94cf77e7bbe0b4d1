#!/usr/bin/env python
"""Steady-state cost of many small gradients: horotopo's runtime against plain MPI.

Each "step" allreduces ``count`` float32 tensors of ``elems`` elements, the way a
DistributedOptimizer does after backward: horotopo enqueues them all (by name, asynchronously)
and synchronizes; ``mpi_each`` calls MPI_Allreduce once per tensor; ``mpi_fused`` packs them
into one buffer for a single MPI_Allreduce (the ideal that tensor fusion aims at). Steps after
the first reuse the same names, so horotopo should serve them from its response cache: the
``negotiations`` column counts trips through rank 0 during the timed steps (expected 0), and
``engine_calls_per_step`` how many fused buffers each step needed.

    mpiexec -n 4 python benchmarks/synthetic_small_tensors.py --json

Prints only JSON on stdout with --json ({"rows": [...]}); progress goes to stderr.
``--markdown [PATH]`` also writes the table to docs/results/synthetic_small_tensors.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
import time
from typing import Any, Callable, Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402


def _median_ms(fn: Callable[[], None], steps: int, comm: Any) -> float:
    times = []
    for _ in range(steps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", default="1,16,64,256", help="tensors per step")
    p.add_argument("--elems", default="64,4096", help="float32 elements per tensor")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(p, "synthetic_small_tensors")
    args = p.parse_args(argv)

    import horotopo as hvd
    from horotopo.api.basics import runtime
    from mpi4py import MPI

    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rows: List[Dict[str, Any]] = []
    for elems in [int(x) for x in args.elems.split(",")]:
        for count in [int(x) for x in args.counts.split(",")]:
            bufs = [np.ones(elems, np.float32) for _ in range(count)]
            names = [f"bench.{elems}.{k}" for k in range(count)]

            def with_horotopo() -> None:
                hs = [hvd.allreduce_async_(b, name=n, op=hvd.Sum) for b, n in zip(bufs, names)]
                for h in hs:
                    hvd.synchronize(h)

            def mpi_each() -> None:
                for b in bufs:
                    comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)

            flat = np.empty(elems * count, np.float32)

            def mpi_fused() -> None:
                np.concatenate(bufs, out=flat)
                comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
                for k, b in enumerate(bufs):
                    b[:] = flat[k * elems:(k + 1) * elems]

            with_horotopo()                           # warm-up: negotiates and fills the cache
            before = dict(runtime().stats)
            t_h = _median_ms(with_horotopo, args.steps, comm)
            after = dict(runtime().stats)
            t_each = _median_ms(mpi_each, args.steps, comm)
            t_fused = _median_ms(mpi_fused, args.steps, comm)
            row = {"count": count, "elems": elems, "bytes_per_step": 4 * elems * count,
                   "horotopo_ms": t_h, "mpi_each_ms": t_each, "mpi_fused_ms": t_fused,
                   "negotiations": after["negotiations"] - before["negotiations"],
                   "engine_calls_per_step": (after["engine_allreduces"]
                                             - before["engine_allreduces"]) / args.steps,
                   "ranks": comm.Get_size()}
            rows.append(row)
            if comm.Get_rank() == 0:
                print(f"{count:5d} x {elems:6d} floats: horotopo {t_h:8.3f} ms  "
                      f"MPI each {t_each:8.3f} ms  MPI fused {t_fused:8.3f} ms  "
                      f"(negotiations {row['negotiations']}, "
                      f"{row['engine_calls_per_step']:.2f} engine calls/step)",
                      file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.json and comm.Get_rank() == 0:
        print(json.dumps({"rows": rows}))
    if args.markdown and comm.Get_rank() == 0:
        columns: List[results_doc.Column] = [
            ("tensors", lambda r: r["count"]), ("floats each", lambda r: r["elems"]),
            ("bytes per step", lambda r: r["bytes_per_step"]),
            ("horotopo (ms)", lambda r: f"{r['horotopo_ms']:.3f}"),
            ("MPI each (ms)", lambda r: f"{r['mpi_each_ms']:.3f}"),
            ("MPI fused (ms)", lambda r: f"{r['mpi_fused_ms']:.3f}"),
            ("negotiations", lambda r: r["negotiations"]),
            ("engine calls per step", lambda r: f"{r['engine_calls_per_step']:.2f}")]
        results_doc.write_table(
            args.markdown, "synthetic_small_tensors: many small gradients, horotopo against MPI",
            rows, columns,
            summary=f"{comm.Get_size()} ranks; median of {args.steps} steps. A step allreduces "
                    f"every tensor: horotopo enqueues them all and synchronizes; MPI each calls "
                    f"MPI_Allreduce per tensor; MPI fused packs them into one buffer. "
                    f"Negotiations (trips through rank 0 in the timed steps) should be 0: the "
                    f"response cache serves repeated names.",
            command=results_doc.command_line(argv, ranks=comm.Get_size()))
    comm.Free()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
