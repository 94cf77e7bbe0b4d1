#!/usr/bin/env python
"""Per-message Python overhead of the tree engine, and the fixed costs the cost model uses.

Run under mpiexec, e.g. ``mpiexec -n 4 python benchmarks/engine_overhead.py``. It times the
tree allreduce of ``--bytes`` (default 256 KiB float32) at chunk sizes from 64 B up, counts the
messages the busiest rank completes per call, and fits ``time = fixed + messages * per_message``
over the tiny-chunk runs (where moving the bytes costs next to nothing). It also times an
8-byte MPI_Allreduce and an 8-byte tree allreduce: those are ``mpi_latency_s`` and
``tree_latency_s`` of :class:`horotopo.algorithms.CostModel`. Prints JSON on stdout (rank 0),
a table on stderr; ``--markdown [PATH]`` also writes docs/results/engine_overhead.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
import time
from typing import Any, Dict, List

import numpy as np
from mpi4py import MPI

from horotopo.algorithms.cost import fit_line
from horotopo.engine import Engine
from horotopo.packing import ring_parents
from horotopo.plan import parse_size, plan_from_trees
from horotopo.transport import MPITransport

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402


class TimedTransport(MPITransport):
    """The MPI transport, with the CPU time spent inside MPI's waitsome counted apart, so that
    the Python cost per message can be told from MPI's own polling and from time the process
    spends descheduled (this box runs many processes on 2 cores)."""

    def __init__(self, comm):
        super().__init__(comm)
        self.mpi_cpu = 0.0

    def _timed(self, fn, *args):
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.mpi_cpu += time.thread_time() - t0

    def waitsome(self, requests):
        return self._timed(super().waitsome, requests)

    def isend(self, buf, dest, tag):
        return self._timed(super().isend, buf, dest, tag)

    def irecv(self, buf, source, tag):
        return self._timed(super().irecv, buf, source, tag)

def _best(fn, repeats: int, comm: "MPI.Comm") -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return comm.allreduce(best, op=MPI.MAX)


def markdown(path: str, summary: Dict[str, Any]) -> None:
    """The results file: time and messages per chunk size, then the fitted fixed costs."""
    fmt = results_doc.fmt
    columns: List[results_doc.Column] = [
        ("chunk (B)", lambda r: r["chunk_bytes"]),
        ("time (ms)", lambda r: fmt(r["time_s"], ".3f", 1e3)),
        ("messages (busiest rank)", lambda r: r["messages"]),
        ("wall per message (us)", lambda r: fmt(r["s_per_message"], ".2f", 1e6)),
        ("Python CPU per message (us)", lambda r: fmt(r["python_cpu_s_per_message"], ".2f", 1e6))]
    costs = [("Python CPU per message (least over chunks <= 4 KiB)",
              summary["python_cpu_s_per_message"]),
             ("wall per message (fit over chunks <= 4 KiB)", summary["per_message_s"]),
             ("fixed cost per call (same fit)", summary["fixed_s"]),
             ("8-byte tree allreduce (tree_latency_s)", summary["tree_latency_s"]),
             ("8-byte allreduce, engine's MPI path", summary["engine_mpi_latency_s"]),
             ("8-byte MPI_Allreduce (mpi_latency_s)", summary["mpi_latency_s"])]
    cost_rows = [{"what": w, "us": v} for w, v in costs]
    text = (f"Tree allreduce of {summary['bytes']} B float32 over {summary['ranks']} ranks (ring "
            f"chains), best of the repeats, slowest rank.")
    results_doc.write(
        path, "engine_overhead: per-message cost of the tree engine",
        [("Per chunk size", results_doc.md_table(summary["rows"], columns)),
         ("Fixed costs (the cost model's constants)", results_doc.md_table(
             cost_rows, [("constant", lambda r: r["what"]),
                         ("us", lambda r: fmt(r["us"], ".2f", 1e6))]))],
        summary=text, command=results_doc.command_line(ranks=summary["ranks"]))


def main() -> int:
    p = argparse.ArgumentParser(description="tree engine per-message overhead")
    p.add_argument("--bytes", default="256K")
    p.add_argument("--repeats", type=int, default=5)
    results_doc.add_markdown_option(p, "engine_overhead")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    n = comm.size
    nbytes = parse_size(args.bytes)
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    rows = []
    chunk = 64
    while chunk <= nbytes:
        plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                               chunk_bytes=chunk)
        tr = TimedTransport(comm)
        with Engine(tr, plan) as eng:
            t = _best(lambda: eng.allreduce(x, out, algorithm="tree"), args.repeats, comm)
            msgs = comm.allreduce(eng.last_messages, op=MPI.MAX)
            tr.mpi_cpu = 0.0
            c0 = time.thread_time()
            for _ in range(args.repeats):
                eng.allreduce(x, out, algorithm="tree")
            py = (time.thread_time() - c0 - tr.mpi_cpu) / args.repeats
        tr.close()
        py = comm.allreduce(py, op=MPI.MAX)
        rows.append({"chunk_bytes": chunk, "time_s": t, "messages": msgs,
                     "s_per_message": t / msgs if msgs else None,
                     "python_cpu_s": py,
                     "python_cpu_s_per_message": py / msgs if msgs else None})
        if comm.rank == 0:
            print(f"chunk {chunk:>9} B  {t * 1e3:9.3f} ms  {msgs:>7} msgs  "
                  f"{(t / msgs * 1e6) if msgs else 0:8.2f} us/msg wall  "
                  f"{(py / msgs * 1e6) if msgs else 0:6.2f} us/msg Python CPU",
                  file=sys.stderr, flush=True)
        chunk *= 4
    tiny = [(r["messages"], r["time_s"]) for r in rows if r["chunk_bytes"] <= 4096]
    fixed, rate = fit_line(tiny) if len(tiny) >= 2 else (0.0, float("inf"))
    eight = np.ones(2, np.float32)
    res = np.empty_like(eight)
    plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)])
    with Engine(comm, plan) as eng:
        t_tree8 = _best(lambda: eng.allreduce(eight, res, algorithm="tree"), 50, comm)
        t_eng_mpi8 = _best(lambda: eng.allreduce(eight, res, algorithm="mpi"), 50, comm)
    t_mpi8 = _best(lambda: comm.Allreduce(eight, res), 50, comm)
    py_tiny = [r["python_cpu_s_per_message"] for r in rows
               if r["chunk_bytes"] <= 4096 and r["messages"]]
    summary = {"ranks": n, "bytes": nbytes, "rows": rows,
               "python_cpu_s_per_message": min(py_tiny) if py_tiny else None,
               "per_message_s": 1.0 / rate if rate else None, "fixed_s": fixed,
               "tree_latency_s": t_tree8, "engine_mpi_latency_s": t_eng_mpi8,
               "mpi_latency_s": t_mpi8}
    if comm.rank == 0:
        print(f"Python CPU per message {(summary['python_cpu_s_per_message'] or 0) * 1e6:.2f} us; "
              f"wall per message {summary['per_message_s'] * 1e6:.2f} us (fit over chunks <= 4 KiB); "
              f"8-byte allreduce: tree {t_tree8 * 1e6:.1f} us, engine MPI path "
              f"{t_eng_mpi8 * 1e6:.1f} us, raw MPI_Allreduce {t_mpi8 * 1e6:.1f} us",
              file=sys.stderr)
        print(json.dumps(summary))
        if args.markdown:
            markdown(args.markdown, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
