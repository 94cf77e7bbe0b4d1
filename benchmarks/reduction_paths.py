"""What IEEE min/max cost on the library path: the engine's MPI path for float32 max, with and
without a NaN in the data, against sum and against MPI_Allreduce's own (order-dependent) MAX.

    mpiexec -n 2 python benchmarks/reduction_paths.py [--sizes 8,64K,16M] [--markdown]

Per size: the slowest rank's best of ``--repeats`` calls. "max, no NaN or -0.0" is the check
first (two passes and a one-integer allreduce, then MPI's MAX) from 256 KiB up and the integer
keys below; "max, a NaN on rank 0" always takes the keys. Prints a table on stderr and a JSON
line on stdout; ``--markdown [PATH]`` also writes docs/results/reduction_paths.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

import numpy as np
from mpi4py import MPI

import results as results_doc
from engine_overhead import _best
from horotopo.engine import Engine
from horotopo.params import ENGINE
from horotopo.packing import ring_parents
from horotopo.plan import parse_size, plan_from_trees

CASES = ("sum", "max, no NaN or -0.0", "max, a NaN on rank 0", "MPI_Allreduce MAX (raw)")


def measure(comm: Any, nbytes: int, repeats: int) -> Dict[str, Any]:
    n = comm.size
    x = np.random.default_rng(comm.rank).standard_normal(max(1, nbytes // 4)).astype(np.float32)
    with_nan = x.copy()
    if comm.rank == 0:
        with_nan[0] = np.nan
    out = np.empty_like(x)
    plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)])
    row: Dict[str, Any] = {"bytes": int(x.nbytes)}
    with Engine(comm, plan) as eng:
        row[CASES[0]] = _best(lambda: eng.allreduce(x, out, op="sum", algorithm="mpi"),
                              repeats, comm)
        row[CASES[1]] = _best(lambda: eng.allreduce(x, out, op="max", algorithm="mpi"),
                              repeats, comm)
        row[CASES[2]] = _best(lambda: eng.allreduce(with_nan, out, op="max", algorithm="mpi"),
                              repeats, comm)
    row[CASES[3]] = _best(lambda: comm.Allreduce(x, out, op=MPI.MAX), repeats, comm)
    return row


def markdown(path: str, rows: List[Dict[str, Any]], ranks: int) -> None:
    fmt = results_doc.fmt
    columns: List[results_doc.Column] = [("bytes", lambda r: r["bytes"])]
    for case in CASES:
        columns.append((f"{case} (ms)", lambda r, c=case: fmt(r[c], ".3f", 1e3)))
    results_doc.write(
        path, "reduction_paths: IEEE min/max on the library path",
        [("float32 allreduce through the engine's MPI path", results_doc.md_table(rows, columns))],
        summary=(f"{ranks} ranks, best of the repeats, slowest rank. Max checks for NaN and -0.0 "
                 f"first from {ENGINE.check_first_bytes} bytes up; with one on any rank (or "
                 f"below that "
                 f"size) it reduces order keys (docs/reductions.md)."),
        command=results_doc.command_line(ranks=ranks))


def main() -> int:
    p = argparse.ArgumentParser(description="cost of IEEE min/max on the library path")
    p.add_argument("--sizes", default="8,64K,16M")
    p.add_argument("--repeats", type=int, default=10)
    results_doc.add_markdown_option(p, "reduction_paths")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rows = [measure(comm, parse_size(s), args.repeats) for s in args.sizes.split(",")]
    if comm.rank == 0:
        for r in rows:
            print(f"{r['bytes']:>10} B  " + "  ".join(f"{c}: {r[c] * 1e3:.3f} ms" for c in CASES),
                  file=sys.stderr)
        print(json.dumps({"ranks": comm.size, "rows": rows}))
        if args.markdown:
            markdown(args.markdown, rows, comm.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
