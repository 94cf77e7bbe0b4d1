"""Allreduce of CuPy buffers through the horotopo engine, checked against MPI on host copies.

Run under mpiexec (ranks share the GPUs round-robin):

    mpiexec -n 4 python benchmarks/gpu_allreduce.py [--sizes 1M,16M,64M] [--repeats 5] [--json]

For each size and transport ("staged" through pinned host memory always; "direct" device
pointers too when MPI is CUDA-aware) it times ``Engine.allreduce`` (tree algorithm, a plan of
two trees) on float32 CuPy buffers and, as the baseline, MPI_Allreduce of host copies including
the device<->host copies. With --json rank 0 prints only {"cuda_aware": ..., "rows": [...]} on
stdout; each row: size, type, redop, transport, time_s, algbw_GBps, baseline_time_s, ratio
(baseline over horotopo), wrong (elements that differ from the host reference on any rank).
``--markdown [PATH]`` also writes the table to docs/results/gpu_allreduce.md. Exit status 1
when any element is wrong.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List

import numpy as np
from mpi4py import MPI

from horotopo import gpu
from horotopo.engine import Engine
from horotopo.plan import parse_size
from horotopo.transport import MPITransport

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
# the plan the GPU tests run too
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import results as results_doc  # noqa: E402
from gpu_plans import two_tree_plan  # noqa: E402


def _timed(comm, fn, repeats: int) -> float:
    """Best over ``repeats`` of the slowest rank's time for one call (after one warm-up)."""
    fn()
    times = np.empty(repeats)
    for k in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times[k] = time.perf_counter() - t0
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return float(times.min())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(ap, "gpu_allreduce")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    ok, why = gpu.device_status()
    if not all(comm.allgather(ok)):
        if comm.rank == 0:
            print(f"gpu_allreduce: no CUDA device on some rank: {why}", file=sys.stderr)
        return 2
    import cupy as cp

    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    aware = gpu.cuda_aware(comm)
    transports = {"staged": gpu.StagingTransport(MPITransport(comm))}
    if aware:
        transports["direct"] = MPITransport(comm)
    engines = {k: Engine(t, two_tree_plan(comm.size, 1 << 20)) for k, t in transports.items()}
    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        n = size // 4
        rng = np.random.default_rng(comm.rank)
        host = (rng.integers(-512, 512, n) / 4).astype(np.float32)  # exact sums in any order
        ref = np.empty_like(host)
        comm.Allreduce(host, ref, op=MPI.SUM)
        dev = cp.asarray(host)
        out = cp.empty_like(dev)

        def baseline():
            h = cp.asnumpy(dev)
            comm.Allreduce(MPI.IN_PLACE, h, op=MPI.SUM)
            out.set(h)
            cp.cuda.get_current_stream().synchronize()

        base_t = _timed(comm, baseline, args.repeats)
        for name, eng in engines.items():
            def run():
                eng.allreduce(dev, out, op="sum", algorithm="tree")
                cp.cuda.get_current_stream().synchronize()

            t = _timed(comm, run, args.repeats)
            wrong = comm.allreduce(int((cp.asnumpy(out) != ref).sum()), op=MPI.SUM)
            rows.append({"size": size, "count": n, "type": "float32", "redop": "sum",
                         "transport": name, "ranks": comm.size, "time_s": t,
                         "algbw_GBps": size / t / 1e9, "baseline_time_s": base_t,
                         "ratio": base_t / t, "wrong": wrong})
            if comm.rank == 0:
                print(f"{size:>11} B {name:>6}: {t * 1e3:9.3f} ms  {size / t / 1e9:7.2f} GB/s  "
                      f"host-MPI baseline {base_t * 1e3:9.3f} ms  wrong={wrong}",
                      file=sys.stderr)
    for eng in engines.values():
        eng.close()
    for t in transports.values():
        t.close()
    if comm.rank == 0 and args.json:
        print(json.dumps({"cuda_aware": aware, "ranks": comm.size, "rows": rows}))
    if comm.rank == 0 and args.markdown:
        columns: List[results_doc.Column] = [
            ("size (B)", lambda r: r["size"]), ("count", lambda r: r["count"]),
            ("type", lambda r: r["type"]), ("redop", lambda r: r["redop"]),
            ("transport", lambda r: r["transport"]),
            ("time (ms)", lambda r: f"{r['time_s'] * 1e3:.3f}"),
            ("algbw (GB/s)", lambda r: f"{r['algbw_GBps']:.2f}"),
            ("host-MPI baseline (ms)", lambda r: f"{r['baseline_time_s'] * 1e3:.3f}"),
            ("baseline / horotopo", lambda r: f"{r['ratio']:.2f}"),
            ("#wrong", lambda r: r["wrong"])]
        results_doc.write_table(
            args.markdown, "gpu_allreduce: CuPy buffers through the engine", rows, columns,
            summary=f"{comm.size} ranks sharing the GPUs round-robin; CUDA-aware MPI: "
                    f"{'yes' if aware else 'no'}. Tree algorithm over a plan of two trees; the "
                    f"baseline is MPI_Allreduce of host copies, device copies included. Best "
                    f"of {args.repeats} calls, slowest rank.",
            command=results_doc.command_line(argv, ranks=comm.size))
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
