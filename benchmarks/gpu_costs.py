#!/usr/bin/env python
"""The device path's software costs on one GPU: the figures of the cost profile that the
simulator's ``--ranks-are gpu`` charges (``horotopo/costs.py``), measured rather than assumed.

One process, one GPU, no MPI:

- ``device_reduce_Bps``: received bytes per second of one reduce step (float32 sum, the native
  kernel through ``gpu.reduce_into``, timed on the device with CUDA events), fitted as ``time
  = launch + bytes / rate`` over chunk sizes 64 KiB..64 MiB. A step reads two buffers and
  writes one, so this rate is a third of the memory traffic ``kernel_bench.py`` reports.
- ``staging_copy_Bps`` and ``staging_copy_s``: the pinned device<->host copies of the staging
  transport (``CupyCopier``, its own stream, waited for with its event), fitted as ``time =
  fixed + bytes / rate`` over 4 KiB..256 MiB in each direction; the profile takes the slower
  direction's rate and the larger fixed cost.
- ``device_per_message_s``: the tree engine's allreduce runner on CuPy buffers against a
  mirrored peer (``horotopo calibrate``'s ``MirrorPeer``: sends complete as posted, receives
  are zero-filled on the device, the fill's host time taken off), wall time per call with the
  device synchronized, fitted as
  ``wall = messages * per_message + received_bytes * per_byte`` over ring chains at 4 KiB..1
  MiB chunks, once with device pointers (CUDA-aware MPI) and once through the staging transport.

    python benchmarks/gpu_costs.py [--repeats 7] [--json] [--markdown [PATH]] [--profile PATH]

``--profile PATH`` writes a cost profile (``horotopo-costs/1``) with these device figures and
the built-in CPU figures, for ``HOROTOPO_COSTS``. Exit status 2 without a device.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from horotopo import costs as cost_profiles
from horotopo import gpu
from horotopo.algorithms.tree import TreeAllreduce
from horotopo.algorithms.cost import fit_line
from horotopo.cli.calibrate_cmd import MirrorPeer, fit_costs
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402
from kernel_bench import device_seconds  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
REDUCE_SIZES = [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
COPY_SIZES = [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB]
CHAIN_CHUNKS = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB]
CHAIN_MESSAGES = 512  # messages per row, as horotopo calibrate sizes its rows


def _median_s(cp: Any, fn: Callable[[], Any], repeats: int,
              less: Callable[[], float] = lambda: 0.0) -> float:
    """Median wall seconds of ``fn`` with the device idle before and synchronized after, each
    call less what ``less()`` says after it."""
    for _ in range(2):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0 - less())
    return statistics.median(times)


def reduce_rows(cp: Any, repeats: int) -> List[Dict[str, Any]]:
    rows = []
    for nbytes in REDUCE_SIZES:
        n = nbytes // 4
        dst, src = cp.ones(n, cp.float32), cp.ones(n, cp.float32)
        t = device_seconds(cp, lambda: gpu.reduce_into(dst, src, "sum"), repeats)
        rows.append({"what": "reduce", "direction": "float32 sum", "bytes": nbytes, "time_s": t})
        say(f"reduce {nbytes:>10} B: {t * 1e6:9.1f} us ({nbytes / t / 1e9:7.1f} GB/s received)")
    return rows


def copy_rows(cp: Any, repeats: int) -> List[Dict[str, Any]]:
    from horotopo.gpu.staging import CupyCopier

    copier = CupyCopier()
    rows = []
    for nbytes in COPY_SIZES:
        dev = cp.zeros(nbytes, cp.uint8)
        host = copier.pinned(nbytes)
        for direction, copy in (("device-to-host", lambda: copier.d2h(host, dev)),
                                ("host-to-device", lambda: copier.h2d(dev, host))):
            t = _median_s(cp, lambda: copier.wait(copy()), repeats)
            rows.append({"what": "staging copy", "direction": direction, "bytes": nbytes,
                         "time_s": t})
            say(f"{direction} {nbytes:>10} B: {t * 1e6:9.1f} us ({nbytes / t / 1e9:6.1f} GB/s)")
        del dev, host
    return rows


def chain_rows(cp: Any, repeats: int, staged: bool) -> List[Dict[str, Any]]:
    rows = []
    path = "staged" if staged else "direct"
    for chunk in CHAIN_CHUNKS:
        mirror = MirrorPeer()
        transport = gpu.StagingTransport(mirror) if staged else mirror
        # a ring chain of two: each rank receives the whole buffer once up and once down
        elems = max(chunk * CHAIN_MESSAGES // 2, chunk) // 4
        plan = plan_from_trees(2, [(r, *ring_parents(2, r), 1.0) for r in range(2)],
                               chunk_bytes=chunk)
        runner = TreeAllreduce(transport, plan)
        src = cp.ones(elems, cp.float32)
        out = cp.empty_like(src)

        def call() -> None:
            mirror.received, mirror.transport_cpu_s = 0, 0.0
            runner.run(src, out, "sum", chunk // 4)

        # The mirror's zero fill of each receive (a kernel launch on device buffers) stands in
        # for MPI filling it, which is the network's part, not the engine's: its host time is
        # taken off, as horotopo calibrate takes off the transport's own calls.
        t = _median_s(cp, call, repeats, less=lambda: mirror.transport_cpu_s)
        rows.append({"what": "engine chain", "direction": path, "bytes": chunk,
                     "messages": runner.last_messages, "received_bytes": mirror.received,
                     "time_s": t, "mirror_fill_s": mirror.transport_cpu_s})
        say(f"engine chain {path} chunk {chunk:>8} B: {runner.last_messages:>5} messages, "
            f"{t * 1e3:8.3f} ms ({t / max(runner.last_messages, 1) * 1e6:6.2f} us/message)")
    return rows


def figures(rows: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    """The profile's device figures from the measured rows (see the module docstring)."""
    out: Dict[str, float] = {}

    def line(what: str, direction: Optional[str] = None) -> Tuple[float, float]:
        """``(fixed seconds, bytes per second)`` of the rows' ``time = fixed + bytes / rate``."""
        return fit_line([(r["bytes"], r["time_s"]) for r in rows if r["what"] == what
                         and direction in (None, r["direction"])])

    # Only sections that ran give figures; a missing one makes its figures missing.
    if any(r["what"] == "reduce" for r in rows):
        out["reduce_launch_s"], out["device_reduce_Bps"] = line("reduce")
    if any(r["what"] == "staging copy" for r in rows):
        for direction in ("device-to-host", "host-to-device"):
            out[f"{direction}_s"], out[f"{direction}_Bps"] = line("staging copy", direction)
        out["staging_copy_s"] = max(out["device-to-host_s"], out["host-to-device_s"])
        out["staging_copy_Bps"] = min(out["device-to-host_Bps"], out["host-to-device_Bps"])
    for path in ("direct", "staged"):
        sel = [r for r in rows if r["what"] == "engine chain" and r["direction"] == path]
        if sel:
            # the fit horotopo calibrate makes of the CPU path, on wall time here
            out[f"{path}_per_message_s"], out[f"{path}_per_byte_s"] = fit_costs(
                [dict(r, cpu_s=r["time_s"]) for r in sel])
    if "direct_per_message_s" in out:
        out["device_per_message_s"] = out["direct_per_message_s"]
    return out


def say(msg: str) -> None:
    print(f"[gpu_costs] {msg}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per row, median kept")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    ap.add_argument("--profile", metavar="PATH", default=None,
                    help="also write a cost profile with the measured device figures")
    results_doc.add_markdown_option(ap, "gpu_costs")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    ok, why = gpu.device_status()
    if not ok:
        print(f"gpu_costs: no CUDA device: {why}", file=sys.stderr)
        return 2
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    rows: List[Dict[str, Any]] = []
    errors: List[str] = []
    sections = [("reduce", lambda: reduce_rows(cp, args.repeats)),
                ("staging copies", lambda: copy_rows(cp, args.repeats)),
                ("engine chain, direct", lambda: chain_rows(cp, args.repeats, staged=False)),
                ("engine chain, staged", lambda: chain_rows(cp, args.repeats, staged=True))]
    for title, section in sections:
        # One broken section must not cost the others' figures on a device lent for minutes;
        # its error is reported and the exit status says it failed.
        try:
            rows += section()
        except Exception as exc:  # noqa: BLE001 - reported below, and the run fails
            errors.append(f"{title}: {type(exc).__name__}: {exc}")
            say(f"{title} FAILED: {type(exc).__name__}: {exc}")
    fig = figures(rows)
    for key, value in fig.items():
        bad = not np.isfinite(value) or value <= 0
        say(f"{key:<24} {value:.4g}{'  NOT POSITIVE: noise swamped the fit' if bad else ''}")
    when = time.strftime("%Y-%m-%d", time.gmtime())
    source = f"benchmarks/gpu_costs.py on {name}, {when}"
    doc = {"device": name, "date": when, "figures": fig, "rows": rows, "errors": errors}
    if args.json:
        print(json.dumps(doc))
    needed = ("device_reduce_Bps", "device_per_message_s", "staging_copy_Bps", "staging_copy_s")
    failed = [k for k in needed if not (k in fig and np.isfinite(fig[k]) and fig[k] > 0)]
    if args.profile and not failed:
        profile = cost_profiles.DEFAULT_PROFILE.replace(
            device_reduce_Bps=fig["device_reduce_Bps"],
            device_reduce_Bps_source=f"{source}: float32 sum, received bytes per second",
            device_per_message_s=fig["device_per_message_s"],
            device_per_message_s_source=f"{source}: engine chain on device pointers",
            staging_copy_Bps=fig["staging_copy_Bps"],
            staging_copy_Bps_source=f"{source}: pinned copies, the slower direction",
            staging_copy_s=fig["staging_copy_s"],
            staging_copy_s_source=f"{source}: pinned copies, the larger fixed cost",
            machine=f"{name} (device figures); CPU figures of the built-in profile")
        cost_profiles.save(profile, args.profile)
    if args.markdown:
        columns: List[results_doc.Column] = [
            ("what", lambda r: r["what"]), ("path / direction", lambda r: r["direction"]),
            ("bytes", lambda r: r["bytes"]), ("messages", lambda r: r.get("messages", "")),
            ("time (us)", lambda r: f"{r['time_s'] * 1e6:.1f}")]
        fig_rows = [{"figure": k, "value": f"{v:.4g}"} for k, v in fig.items()]
        results_doc.write(
            args.markdown, f"gpu_costs: the device path's cost figures ({name}, {when})",
            [("Fitted figures", results_doc.md_table(
                fig_rows, [("figure", lambda r: r["figure"]), ("value", lambda r: r["value"])])),
             ("Measured rows", results_doc.md_table(rows, columns))],
            summary=f"{name}, one process. Rates in bytes per second (the reduce's per "
                    f"received byte), times in seconds; median of {args.repeats} calls per "
                    f"row, the reduce timed on the device with CUDA events, the rest by the "
                    f"host clock with the device synchronized. `device_per_message_s` is the "
                    f"engine chain's per-message time on "
                    f"device pointers; `staging_copy_*` the slower direction's rate and the "
                    f"larger fixed cost of the pinned copies.")
    if failed or errors:
        print(f"gpu_costs: no positive {', '.join(failed) or 'figure missing'}; "
              f"{len(errors)} section(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
