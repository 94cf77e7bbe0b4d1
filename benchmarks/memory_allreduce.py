#!/usr/bin/env python
"""Peak memory of one allreduce of M bytes, per rank, against M.

Run under mpiexec, e.g. ``mpiexec -n 4 python benchmarks/memory_allreduce.py``. For each
algorithm (tree, ring, mpi) and size M (``--sizes``, default 1M..64M), every rank holds its
float32 input of M bytes and (out of place) an output of M bytes, both touched; a fresh Engine
(so its scratch pool starts empty) then runs one allreduce while the kernel tracks the peak
resident set (``/proc/self/status`` VmHWM, reset through ``/proc/self/clear_refs`` just
before; the script re-executes itself with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed
blocks leave the resident set). ``extra`` is the peak minus the resident set just before the call: the memory the
allreduce itself needed beyond its buffers. The target is "M plus a bounded scratch
window": for the tree that window is ``window_for(chunk) x chunk_bytes`` (about 2 MiB) per
reduce child per tree, so
``extra`` should stay flat as M grows.

Prints JSON ``{"rows": [...]}`` on stdout with ``--json`` (rank 0), a table otherwise. Each row
holds ``alg, size, in_place, extra_bytes`` (max over ranks), ``extra_over_M`` and the bound
the plan implies for the tree (``tree_window_bytes``). A throwaway run per algorithm first
warms MPI's own once-per-process pools, so the rows are a running job's steady state.
``--markdown [PATH]`` also writes the table to docs/results/memory_allreduce.md.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path
from typing import List

if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
    # Large blocks from mmap go back to the kernel when freed; otherwise the heap keeps the
    # pages of earlier measurements resident, a later call reuses them, and its peak hides.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np  # noqa: E402 - after the re-exec above
from mpi4py import MPI  # noqa: E402

from horotopo.algorithms import tree as _tree
from horotopo.engine import Engine
from horotopo.packing import ring_parents
from horotopo.plan import format_size, parse_size, plan_from_trees

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(comm, plan, alg: str, nbytes: int, in_place: bool) -> int:
    """Peak extra resident bytes of one allreduce on this rank."""
    x = np.ones(nbytes // 4, dtype=np.float32)
    out = x if in_place else np.zeros_like(x)
    engine = Engine(comm, plan)
    try:
        engine.allreduce(np.ones(16, np.float32), algorithm=alg)  # set-up outside the window
        gc.collect()
        comm.Barrier()
        reset_peak()
        before = _status("VmRSS")
        engine.allreduce(x, out, algorithm=alg)
        peak = _status("VmHWM")
        ok = bool(np.all(out == comm.size))
    finally:
        engine.close()
    if not ok:
        raise RuntimeError(f"{alg} allreduce of {nbytes} bytes gave a wrong result")
    return peak - before


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--algs", default="tree,ring,mpi")
    ap.add_argument("--chunk", default="1M", help="plan chunk size (default 1M)")
    ap.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(ap, "memory_allreduce")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = comm.size
    chunk = parse_size(args.chunk)
    plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                           chunk_bytes=chunk)
    # the tree's receive scratch: window chunks per reduce child, per tree this rank is in
    children = max(sum(1 for p in t.reduce_parent if p == v) for t in plan.trees
                   for v in range(n)) if n > 1 else 0
    # chunks of scratch per reduce child and tree (the automatic window)
    per_child = _tree.window_for(chunk, len(plan.trees))
    window = per_child * chunk * children * len(plan.trees)
    rows = []
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    for alg in args.algs.split(","):
        # MPI's own first-use pools (shared-memory cells, rendezvous buffers) are allocated
        # once per process; warm them with a throwaway engine so the rows show the steady
        # state of a job, and the measured engine's own scratch pool still starts empty.
        measure(comm, plan, alg, max(sizes), False)
        for size in sizes:
            for in_place in (False, True):
                extra = comm.allreduce(measure(comm, plan, alg, size, in_place), MPI.MAX)
                rows.append({"alg": alg, "size": size, "in_place": in_place, "ranks": n,
                             "chunk_bytes": chunk, "extra_bytes": int(extra),
                             "extra_over_M": round(extra / size, 4),
                             "tree_window_bytes": int(window)})
                if comm.rank == 0:
                    print(f"[memory] {alg:<5} {format_size(size):>8} "
                          f"{'in place' if in_place else 'out of place':<12} extra "
                          f"{extra / 2**20:8.2f} MiB ({extra / size:6.1%} of M)",
                          file=sys.stderr, flush=True)
    if comm.rank == 0:
        if args.json:
            print(json.dumps({"rows": rows}))
        else:
            print(f"{'alg':<5} {'M':>8} {'mode':<12} {'extra MiB':>10} {'extra/M':>8}  "
                  f"(tree scratch bound {window / 2**20:.1f} MiB)")
            for r in rows:
                print(f"{r['alg']:<5} {format_size(r['size']):>8} "
                      f"{'in place' if r['in_place'] else 'out':<12} "
                      f"{r['extra_bytes'] / 2**20:10.2f} {r['extra_over_M']:8.3f}")
        if args.markdown:
            columns: List[results_doc.Column] = [
                ("algorithm", lambda r: r["alg"]), ("M", lambda r: format_size(r["size"])),
                ("mode", lambda r: "in place" if r["in_place"] else "out of place"),
                ("extra (MiB)", lambda r: f"{r['extra_bytes'] / 2**20:.2f}"),
                ("extra / M", lambda r: f"{r['extra_over_M']:.3f}")]
            results_doc.write_table(
                args.markdown, "memory_allreduce: memory an allreduce needs beyond its buffers",
                rows, columns,
                summary=f"{n} ranks, ring chains in {format_size(chunk)} chunks. Extra: the "
                        f"peak resident set during one allreduce minus the resident set just "
                        f"before it, the most over the ranks. The tree's scratch bound here is "
                        f"{window / 2**20:.1f} MiB.",
                command=results_doc.command_line(argv, ranks=n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
