"""Micro-benchmark of the reduce step on one GPU: native kernels and the CuPy fallback, in GB/s,
against the device-to-device copy bandwidth measured in the same run.

A reduce step reads two buffers and writes one (3 x bytes moved); a copy reads one and writes
one (2 x bytes). ``fraction_of_copy`` = step GB/s / copy GB/s: 1.0 means the step runs at the
memory speed the device shows for a plain copy.

    python benchmarks/kernel_bench.py [--size 256M] [--repeats 20] [--json]

With --json only JSON goes to stdout: {"device": ..., "copy_GBps": ..., "rows": [...]}; each row
holds dtype, op, path, bytes, time_s, GBps, fraction_of_copy, and ``wrong``, the number of
elements where the native and fallback results differ (they must be bit-equal).
``--markdown [PATH]`` also writes the table to docs/results/kernel_bench.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import List

import numpy as np

from horotopo import gpu
from horotopo.gpu import elementwise as ew
from horotopo.gpu import kernels
from horotopo.plan import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

DTYPES = ["float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "min", "max", "product"]
_D2D = 3  # cudaMemcpyDeviceToDevice


def device_seconds(cp, fn, repeats: int) -> float:
    """Median seconds per call of the device work ``fn`` queues, timed with CUDA events on the
    current stream (a host synchronize on a virtual machine would swamp a small kernel)."""
    for _ in range(3):
        fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def _data(cp, dtype: str, n: int, seed: int):
    vals = cp.random.RandomState(seed).standard_normal(n, dtype=cp.float32)
    if dtype == "bfloat16":
        return ew.float32_to_bf16_bits(cp, vals)
    return vals.astype(dtype)


def _copy_seconds(cp, nbytes: int, repeats: int) -> float:
    src = cp.zeros(nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    stream = cp.cuda.get_current_stream()
    return device_seconds(cp, lambda: cp.cuda.runtime.memcpyAsync(
        dst.data.ptr, src.data.ptr, nbytes, _D2D, stream.ptr), repeats)


def _step(cp, a0, b, op: str, bf, repeats: int):
    """(seconds per reduce step, the result of one step from a0) on the current path."""
    once = a0.copy()
    gpu.reduce_into(once, b, op, 1.0, 1.0, dtype=bf)
    work = a0.copy()
    step = device_seconds(cp, lambda: gpu.reduce_into(work, b, op, 1.0, 1.0, dtype=bf), repeats)
    return step, once


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256M", help="bytes per buffer (default 256M)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "kernel_bench")
    args = ap.parse_args(argv)
    ok, why = gpu.device_status()
    if not ok:
        print(f"kernel_bench: no CUDA device: {why}", file=sys.stderr)
        return 2
    import cupy as cp

    nbytes = parse_size(args.size)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    copy_gbps = 2 * nbytes / _copy_seconds(cp, nbytes, args.repeats) / 1e9
    cp.get_default_memory_pool().free_all_blocks()
    print(f"device {name}: copy {copy_gbps:.1f} GB/s ({nbytes} bytes per buffer)",
          file=sys.stderr)
    rows = []
    for dtype in DTYPES:
        itemsize = 2 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize
        n = nbytes // itemsize
        bf = "bfloat16" if dtype == "bfloat16" else None
        a0, b = _data(cp, dtype, n, 1), _data(cp, dtype, n, 2)
        for op in OPS:
            results = {}
            for path in ("native", "fallback"):
                os.environ[kernels.KERNELS_ENV] = path
                t, results[path] = _step(cp, a0, b, op, bf, args.repeats)
                gbps = 3 * n * itemsize / t / 1e9
                rows.append({"dtype": dtype, "op": op, "path": path, "bytes": n * itemsize,
                             "time_s": t, "GBps": gbps, "fraction_of_copy": gbps / copy_gbps})
            wrong = int((results["native"].view(f"uint{8 * itemsize}")
                         != results["fallback"].view(f"uint{8 * itemsize}")).sum())
            for row in rows[-2:]:
                row["wrong"] = wrong
            print(f"{dtype:>9} {op:>8}: native {rows[-2]['GBps']:8.1f} GB/s "
                  f"({rows[-2]['fraction_of_copy']:.2f} of copy), fallback "
                  f"{rows[-1]['GBps']:8.1f} GB/s, native != fallback: {wrong}",
                  file=sys.stderr)
        del a0, b
        cp.get_default_memory_pool().free_all_blocks()
    os.environ.pop(kernels.KERNELS_ENV, None)
    doc = {"device": name, "copy_GBps": copy_gbps, "bytes_per_buffer": nbytes, "rows": rows}
    if args.json:
        print(json.dumps(doc))
    if args.markdown:
        columns: List[results_doc.Column] = [
            ("dtype", lambda r: r["dtype"]), ("op", lambda r: r["op"]),
            ("path", lambda r: r["path"]), ("GB/s", lambda r: f"{r['GBps']:.1f}"),
            ("of copy", lambda r: f"{r['fraction_of_copy']:.2f}"),
            ("native != fallback", lambda r: r["wrong"])]
        results_doc.write_table(
            args.markdown, "kernel_bench: the reduce step on one GPU", rows, columns,
            summary=f"{name}: device-to-device copy {copy_gbps:.1f} GB/s; {nbytes} bytes per "
                    f"buffer, median of {args.repeats} calls. A reduce step moves 3 x the "
                    f"bytes, a copy 2 x; \"of copy\" 1.00 is the copy's memory speed.")
    bad = sum(r["wrong"] for r in rows)
    if bad:
        print(f"kernel_bench: native and fallback disagree on {bad} elements", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
