"""MPI job: allreduce throughput of several plans, interleaved in one run (for probe_accuracy).

    mpiexec -n N python benchmarks/probe_allreduce.py PLAN.json [PLAN.json ...] [--size 8M]
        [--iters 5] [--warmup 1]

Every plan gets its own engine; each timed iteration runs every plan once, in turn, starting at
a barrier, so that load from other processes falls on all plans alike. Rank 0 prints one JSON
object: {"size": bytes, "plans": [{"path", "digest", "time_s", "algbw_GBps", "wrong"}, ...]},
where time_s is the mean over iterations of the slowest rank's time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from horotopo.engine import Engine
from horotopo.plan import Plan, parse_size


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plans", nargs="+", help="Plan JSON files")
    p.add_argument("--size", default="8M", help="bytes per allreduce (default 8M)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    plans = []
    for path in args.plans:
        with open(path) as fh:
            plans.append(Plan.from_json(json.load(fh)))
    engines = [Engine(comm, plan) for plan in plans]
    count = parse_size(args.size) // 4
    x = np.full(count, comm.rank + 1, dtype=np.float32)
    want = comm.size * (comm.size + 1) / 2
    outs = [np.empty_like(x) for _ in engines]
    spent = np.zeros(len(engines))
    for it in range(args.warmup + args.iters):
        for k, eng in enumerate(engines):
            comm.Barrier()
            t0 = time.perf_counter()
            eng.allreduce(x, outs[k], op="sum", algorithm="tree")
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if it >= args.warmup:
                spent[k] += dt
    wrong = [comm.allreduce(int(np.count_nonzero(o != want)), op=MPI.SUM) for o in outs]
    for eng in engines:
        eng.close()
    if comm.rank == 0:
        rows = []
        for path, plan, total, bad in zip(args.plans, plans, spent, wrong):
            t = total / args.iters
            rows.append({"path": path, "digest": plan.digest, "time_s": t,
                         "algbw_GBps": count * 4 / t / 1e9, "wrong": bad})
        print(json.dumps({"size": count * 4, "plans": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
