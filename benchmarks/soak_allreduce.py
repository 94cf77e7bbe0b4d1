#!/usr/bin/env python
"""Soak: many consecutive mixed-size allreduces, every result verified, memory and requests
watched.

Run under mpiexec, e.g. ``mpiexec -n 4 python benchmarks/soak_allreduce.py`` (10,000 calls by
default; ``--iters 300`` is the short version that tests/test_soak.py runs). Each call draws,
from a seeded generator that is the same on every rank, a size (mostly small, sometimes up to
``--max-elems``), a dtype, an op, an algorithm (tree, ring, mpi or the cost model's choice) and
in place or not. The inputs are small integers that depend on the rank and the call, so the
expected result is computed exactly on every rank and compared element for element.

Checked on every rank, and agreed across ranks at the end:

- ``wrong``: mismatched elements over the whole run (must be 0);
- ``leaked_requests``: requests posted but never seen complete, after every call (must be 0;
  counted by :class:`horotopo.reliability.TrackedTransport`, which wraps the engine's
  transport);
- ``rss_growth_MiB``: resident memory at the end minus after the first 10% of the calls, the
  max over ranks (a warm-up at the largest size of every dtype and algorithm first fills the
  scratch pool and MPI's buffers).

Prints one JSON object on stdout (rank 0) with ``--json``, else a summary; progress on stderr.
``--markdown [PATH]`` also writes the summary to docs/results/soak_allreduce.md. Exit status 1
when a check fails (``--max-growth-mib``, default 16).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
import time

import numpy as np
from mpi4py import MPI

from horotopo.engine import Engine
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from horotopo.reliability import TrackedTransport
from horotopo.transport import as_transport

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

DTYPES = ("float32", "float64", "int32", "int64", "float16")
OPS = ("sum", "min", "max", "average")
ALGS = (None, "tree", "ring", "mpi")
# sums of small integers are exact; only averages round (relative error of the dtype)
_TOL = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-12, "int32": 0.0, "int64": 0.0}


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource
    return pages * resource.getpagesize()


def expected(count: int, dtype: str, op: str, n: int, seed: int) -> np.ndarray:
    """The exact allreduce of :func:`inputs` over ``n`` ranks."""
    stack = np.stack([inputs(count, dtype, r, seed) for r in range(n)]).astype(np.float64)
    if op in ("sum", "average"):
        out = stack.sum(axis=0)
        if op == "average":
            # the engine folds 1/n into a postscale; integers are scaled in float64, truncated
            out = out * (1.0 / n)
            if dtype.startswith("int"):
                out = np.trunc(out)
    elif op == "min":
        out = stack.min(axis=0)
    else:
        out = stack.max(axis=0)
    return out


def inputs(count: int, dtype: str, rank: int, seed: int) -> np.ndarray:
    # Values 0..6: sums over <= 8 ranks are exact in float16, averages round the same way
    # in the check (compared with a dtype-aware tolerance below).
    return ((np.arange(count, dtype=np.int64) * (rank + 3) + seed) % 7).astype(dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=10000)
    ap.add_argument("--max-elems", type=int, default=1 << 18,
                    help="largest call, in elements (default 262144)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-growth-mib", type=float, default=16.0)
    ap.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(ap, "soak_allreduce")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    n, me = comm.size, comm.rank
    plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                           chunk_bytes=64 << 10)
    tracked = TrackedTransport(as_transport(comm), owns=True)
    engine = Engine(tracked, plan)
    # Warm-up at the largest size for every dtype and algorithm, so the scratch pool and MPI's
    # buffers reach their final size before memory is watched.
    for dtype in DTYPES:
        for alg in ALGS[1:]:
            engine.allreduce(inputs(args.max_elems, dtype, me, 0), algorithm=alg)
    rng = np.random.default_rng(args.seed)  # same stream on every rank: same calls everywhere
    wrong = leaked = 0
    first_bad = ""
    warm = max(1, args.iters // 10)
    rss_warm = rss_bytes()
    objs_warm = 0
    t0 = time.perf_counter()
    algs_used = {str(a): 0 for a in ALGS}
    for i in range(args.iters):
        big = rng.random() < 0.05
        count = int(rng.integers(1, args.max_elems + 1) if big else rng.integers(0, 4097))
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        op = OPS[int(rng.integers(len(OPS)))]
        alg = ALGS[int(rng.integers(len(ALGS)))]
        in_place = bool(rng.integers(2))
        x = inputs(count, dtype, me, i)
        out = engine.allreduce(x, x if in_place else None, op=op, algorithm=alg)
        algs_used[str(alg)] += 1
        want = expected(count, dtype, op, n, i)
        got = np.asarray(out, dtype=np.float64)
        tol = _TOL[dtype] * np.maximum(1.0, np.abs(want))
        bad = int(np.count_nonzero(np.abs(got - want) > tol))
        if bad and not first_bad:
            first_bad = f"call {i}: {count} x {dtype} {op} alg={alg}: {bad} wrong"
        wrong += bad
        if tracked.outstanding:
            leaked += tracked.outstanding
        if i + 1 == warm:
            gc.collect()
            rss_warm = rss_bytes()
            objs_warm = len(gc.get_objects())
        if me == 0 and (i + 1) % max(1, args.iters // 10) == 0:
            print(f"[soak] {i + 1}/{args.iters} calls, {time.perf_counter() - t0:.1f} s, "
                  f"rss {rss_bytes() / 2**20:.1f} MiB", file=sys.stderr, flush=True)
    gc.collect()
    growth = (rss_bytes() - rss_warm) / 2**20
    obj_growth = len(gc.get_objects()) - objs_warm
    elapsed = time.perf_counter() - t0
    tot = comm.allreduce(np.array([wrong, leaked, tracked.posted - tracked.completed]), MPI.SUM)
    max_growth = comm.allreduce(growth, MPI.MAX)
    max_obj = comm.allreduce(obj_growth, MPI.MAX)
    bad_msgs = [m for m in comm.allgather(first_bad) if m]
    engine.close()
    result = {"ranks": n, "iters": args.iters, "seconds": round(elapsed, 2),
              "calls_per_s": round(args.iters / elapsed, 1), "wrong": int(tot[0]),
              "leaked_requests": int(tot[1]), "unfinished_requests": int(tot[2]),
              "rss_growth_MiB": round(max_growth, 2), "gc_object_growth": int(max_obj),
              "algorithms": algs_used, "first_wrong": bad_msgs[:3]}
    ok = (result["wrong"] == 0 and result["leaked_requests"] == 0
          and result["unfinished_requests"] == 0 and max_growth <= args.max_growth_mib)
    result["ok"] = ok
    if me == 0:
        if args.json:
            print(json.dumps(result))
        else:
            print(" ".join(f"{k}={v}" for k, v in result.items()))
        if args.markdown:
            results_doc.write(
                args.markdown, "soak_allreduce: many mixed allreduces, every result verified",
                [("", results_doc.key_value_table(result))],
                summary=f"{n} ranks, {args.iters} calls of random size, dtype, op, algorithm "
                        f"and placement (seed {args.seed}); ok requires no wrong element, no "
                        f"leaked or unfinished request and resident memory growth of at most "
                        f"{args.max_growth_mib:g} MiB.",
                command=results_doc.command_line(argv, ranks=n))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
