"""``horotopo calibrate``: measure the engine's software costs on this machine and write the cost
profile that ``init()`` plans with and ``horotopo simulate`` charges.

The figures are the tree engine's own: its allreduce runner (:class:`~horotopo.algorithms.tree.
TreeAllreduce`) runs ring chains at chunk sizes from 256 B to 1 MiB, and the Python CPU the
rank spends (thread CPU, less what the transport's own calls take: MPI's copies and polling)
is fitted as ``messages * per_message + received_bytes * per_byte`` by least squares.

Under ``mpiexec -n N`` (N >= 2) the chains run between the job's ranks over the real MPI
transport, and the profile takes the largest figure over the ranks (the busiest rank sets the
pace). Run alone, this process is rank 0 of two and a mirror stands in for the peer: every
receive completes at once with a buffer of zeros and every send completes as it is posted, so
the engine's posting, completion handling, reduce and copy run exactly as in a job, without a
network to wait for.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import costs as cost_profiles
from ..algorithms.tree import TreeAllreduce
from ..packing import ring_parents
from .. import config
from ..params import ENGINE, EngineParams
from ..plan import plan_from_trees
from ..transport.base import TagAllocator, Transport
from . import CommandError

__all__ = ["add_parser", "run", "measure", "fit_costs", "MirrorPeer"]



def add_parser(sub: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "calibrate", help="measure the engine's per-message and per-byte software costs",
        description="Measure the tree engine's Python CPU per message and per received byte "
                    "on this machine, with the engine's own allreduce runner, and write the "
                    "cost profile that init() plans with (HOROTOPO_COSTS, or the default "
                    "path) and horotopo simulate charges. Alone it takes a few seconds on one "
                    "process (a mirror stands in for the peer); under mpiexec -n N it measures "
                    "the exchange between the job's ranks over MPI.",
        epilog="Examples:\n  horotopo calibrate\n  mpiexec -n 2 python -m horotopo calibrate "
               "-o costs.json\n  HOROTOPO_COSTS=costs.json horotopo simulate racks-2x3",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", default=None, metavar="PATH",
                   help=f"where to write the profile (default {cost_profiles.default_path()})")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed calls per chunk size, the least CPU kept (default "
                        f"HOROTOPO_ENGINE_COST_REPEATS, else {ENGINE.cost_repeats})")
    p.add_argument("--json", action="store_true", help="print the profile as JSON on stdout")
    p.add_argument("--show", action="store_true",
                   help="measure nothing: print the profile init() would use and where it "
                        "comes from (HOROTOPO_COSTS, the default file, or the built-in one)")
    p.set_defaults(func=run)
    return p


class _Done:
    __slots__ = ()


_DONE = _Done()


class MirrorPeer(Transport):
    """Rank 0 of two, with the peer mirrored in this process: a send completes as it is
    posted, a receive completes at once filled with zeros, one request per wait. Counts the
    bytes received and the CPU its own calls take (the part of a message's cost that is the
    transport's, not the engine's)."""

    def __init__(self) -> None:
        self._tags = TagAllocator(1 << 15)
        self.received = 0
        self.transport_cpu_s = 0.0

    rank = property(lambda self: 0)
    size = property(lambda self: 2)

    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        return _DONE

    def irecv(self, buf: Any, source: int, tag: int) -> Any:
        t0 = time.thread_time()
        buf[...] = 0
        self.received += buf.nbytes
        self.transport_cpu_s += time.thread_time() - t0
        return _DONE

    def test(self, request: Any) -> bool:
        return True

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        # One completion per wait, as messages that arrive one at a time complete over a
        # network: all of them at once would take the progress loop's cheapest path only.
        return [0]

    def waitall(self, requests: Sequence[Any]) -> None:
        return None

    def alloc_tags(self, count: int) -> int:
        return self._tags.alloc(count)


class _TimedTransport(Transport):
    """A real transport with the CPU of its own calls and the bytes received counted."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.received = 0
        self.transport_cpu_s = 0.0

    rank = property(lambda self: self.inner.rank)
    size = property(lambda self: self.inner.size)

    def _timed(self, fn: Any, *args: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.transport_cpu_s += time.thread_time() - t0

    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        return self._timed(self.inner.isend, buf, dest, tag)

    def irecv(self, buf: Any, source: int, tag: int) -> Any:
        self.received += buf.nbytes
        return self._timed(self.inner.irecv, buf, source, tag)

    def test(self, request: Any) -> bool:
        return self._timed(self.inner.test, request)

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        return self._timed(self.inner.waitsome, requests)

    def waitall(self, requests: Sequence[Any]) -> None:
        return self._timed(self.inner.waitall, requests)

    def alloc_tags(self, count: int) -> int:
        return self.inner.alloc_tags(count)


def measure(transport: Transport, repeats: Optional[int] = None,
            chunks: Optional[Sequence[int]] = None, progress: Any = None,
            params: EngineParams = ENGINE) -> List[Dict[str, float]]:
    """One row per chunk size: ``chunk_bytes``, ``messages`` and ``received_bytes`` of one
    allreduce on this rank, and ``cpu_s``, the least over ``repeats`` calls of the rank's
    thread CPU outside the transport's calls. Collective when ``transport`` is a real one.
    ``repeats`` and ``chunks`` default to ``params.cost_repeats`` and ``params.cost_chunks``."""
    repeats = params.cost_repeats if repeats is None else repeats
    chunks = params.cost_chunks if chunks is None else chunks
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    timed = transport if isinstance(transport, MirrorPeer) else _TimedTransport(transport)
    n = timed.size
    rows: List[Dict[str, float]] = []
    for chunk in chunks:
        # ring chains: a rank receives 2 (n - 1) / n of the buffer and sends as much
        nbytes = params.cost_row_messages * chunk * n // (4 * (n - 1))
        elems = max(params.cost_min_buffer_bytes,
                    min(params.cost_max_buffer_bytes, nbytes)) // 4
        plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                               chunk_bytes=chunk)
        runner = TreeAllreduce(timed, plan)
        src = np.ones(elems, np.float32)
        out = np.empty_like(src)
        runner.run(src, out, "sum", chunk // 4)  # warm: schedules compiled, scratch held
        best = float("inf")
        for _ in range(repeats):
            timed.received, timed.transport_cpu_s = 0, 0.0
            c0 = time.thread_time()
            runner.run(src, out, "sum", chunk // 4)
            best = min(best, time.thread_time() - c0 - timed.transport_cpu_s)
        rows.append({"chunk_bytes": chunk, "messages": runner.last_messages,
                     "received_bytes": timed.received, "cpu_s": best})
        if progress is not None:
            progress(f"chunk {chunk:>8} B: {runner.last_messages:>5} messages, "
                     f"{timed.received / 1e6:7.2f} MB received, {best * 1e3:8.3f} ms CPU")
    return rows


def fit_costs(rows: Sequence[Dict[str, float]]) -> Tuple[float, float]:
    """``(seconds per message, seconds per received byte)``: the least-squares fit of ``cpu_s =
    messages * a + received_bytes * b`` over ``rows``, each row weighted by its CPU so that
    the small and the large rows count alike."""
    a = np.array([[r["messages"], r["received_bytes"]] for r in rows], float)
    y = np.array([r["cpu_s"] for r in rows], float)
    weight = 1.0 / np.maximum(y, 1e-9)
    solution, *_ = np.linalg.lstsq(a * weight[:, None], y * weight, rcond=None)
    return float(solution[0]), float(solution[1])


def _say(msg: str) -> None:
    print(f"[calibrate] {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Handler of ``horotopo calibrate``; collective under mpiexec."""
    if args.show:
        try:
            profile, source = cost_profiles.from_settings()
        except cost_profiles.CostsError as exc:
            raise CommandError(str(exc)) from None
        print(json.dumps(profile.to_json()) if args.json
              else f"from {source}\n{profile.describe()}")
        return 0
    output = args.output or str(cost_profiles.default_path())
    try:
        params = config.engine_params()
        reliability = config.reliability_params()
    except config.ConfigError as exc:
        raise CommandError(str(exc)) from None
    repeats = params.cost_repeats if args.repeats is None else args.repeats
    if repeats < 1:
        raise CommandError(f"--repeats must be at least 1, got {repeats}")
    transport: Transport = MirrorPeer()
    where = "one process, a mirror for the peer"
    try:
        from ..transport import MPITransport
    except ImportError:  # no mpi4py: a single process is all there is to measure
        pass
    else:
        world = MPITransport.world()
        if world.size > 1:
            transport, where = world, f"{world.size} ranks over MPI"
        else:
            world.close()
    rank = transport.rank if not isinstance(transport, MirrorPeer) else 0
    say = _say if rank == 0 else (lambda msg: None)
    say(f"measuring the tree engine's software costs ({where}), "
        f"{len(params.cost_chunks)} chunk sizes")
    t0 = time.perf_counter()
    rows = measure(transport, repeats, progress=say, params=params)
    per_message, per_byte = fit_costs(rows)
    if not isinstance(transport, MirrorPeer):
        everyone = transport.allgather_object((per_message, per_byte),
                                              reliability.exchange_timeout_s,
                                              "calibrate: gathering the figures")
        transport.close()
        if rank != 0:
            return 0
        per_message = max(f[0] for f in everyone)
        per_byte = max(f[1] for f in everyone)
    wall = time.perf_counter() - t0
    for name, value in (("per-message", per_message), ("per-byte", per_byte)):
        if not value > 0:
            raise CommandError(f"the measured {name} cost is {value:.3g} s, not positive: the "
                               "machine was too busy to tell it from noise; run it again")
    machine = f"{platform.node()} ({platform.processor() or platform.machine()}, " \
              f"{os.cpu_count()} cores)"
    source = (f"horotopo calibrate on {machine}, {where}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    try:
        profile = cost_profiles.DEFAULT_PROFILE.replace(
            cpu_per_message_s=per_message, cpu_per_message_s_source=source,
            cpu_per_byte_s=per_byte, cpu_per_byte_s_source=source,
            device_per_message_s=per_message,
            device_per_message_s_source=f"the CPU path's per-message figure (the device path "
                                        f"posts its messages with the same Python code): "
                                        f"{source}",
            machine=machine)
        cost_profiles.save(profile, output)
    except cost_profiles.CostsError as exc:
        raise CommandError(str(exc)) from None
    say(f"measured in {wall:.2f} s: {per_message * 1e6:.2f} us per message, "
        f"{per_byte * 1e9:.4f} ns per received byte; wrote {output}")
    if args.json:
        print(json.dumps(profile.to_json()))
    else:
        print(profile.describe())
    return 0
