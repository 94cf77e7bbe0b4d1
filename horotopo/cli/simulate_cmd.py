"""``horotopo simulate TOPOLOGY.json``: horotopo's init path and allreduce over a simulated
network (SimGrid), before booking the cluster.

Every rank is a SimGrid actor running horotopo's own code over
:class:`~horotopo.transport.simulated.SimulatedTransport`: rank 0 plans the topology and the
plan protocol (:func:`~horotopo.planning_protocol.share_plan`: broadcast, digest check) runs
between the simulated ranks; then the engine runs one allreduce with the plan's trees and one
with ring, each rank holding a small float32 array while the network carries ``--size`` bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List

import numpy as np

from ..plan import format_size, make_plan, parse_size, ring_plan
from ..topology import Topology, TopologyError, bundled, load

# Each rank holds at most this many float32 elements; the rest of --size is scale.
SMALL_ELEMS = 1 << 16


def add_parser(sub: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "simulate", help="run the init path and allreduce over a simulated network (SimGrid)",
        description="Plan on rank 0, share and check the plan, then time horotopo's trees and "
                    "ring allreduce, all over a SimGrid network built from the topology. Needs "
                    "python3-simgrid (apt-get install -y python3-simgrid).",
        epilog="Example:\n  horotopo simulate racks-2x3 --size 64M",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", help="topology JSON file, or the name of a bundled one")
    p.add_argument("--size", default="64M", type=parse_size,
                   help="allreduce size in bytes (default 64M; K, M, G are binary)")
    p.add_argument("--probe", default="declared", choices=["declared", "off"],
                   help="declared: plan the topology file (default); off: plan ring on a uniform "
                        "model. The probe's own modes (quick, full) need a simulated clock in "
                        "the probe and are not available yet")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout")
    p.set_defaults(func=run)
    return p


def _load(text: str) -> Topology:
    try:
        return load(text)
    except (OSError, TopologyError):
        return load(bundled(text))


def simulate(topology: Topology, size: int, probe: str = "declared") -> Dict[str, Any]:
    """Run the simulation; the result as a JSON-ready dict (see :func:`run`)."""
    from ..algorithms.tree import window_for
    from ..engine import Engine
    from ..planning_protocol import share_plan
    from ..simulation import run_simulated

    elems = max(1, min(size // 4, SMALL_ELEMS))
    scale = size / (elems * 4)
    n = topology.n

    def build() -> Any:
        t0 = time.perf_counter()
        plan = make_plan(topology) if probe == "declared" else ring_plan(topology)
        build.seconds = time.perf_counter() - t0  # type: ignore[attr-defined]
        return plan, topology

    def body(t: Any) -> Dict[str, Any]:
        t0 = t.now()
        plan, _ = share_plan(t, build, what="init")
        out: Dict[str, Any] = {"init_s": t.now() - t0,
                               "planner_s": getattr(build, "seconds", None),
                               "plan": plan.to_json() if t.rank == 0 else None}
        want = np.float32(n * (n - 1) / 2)
        for alg, p in (("tree", plan), ("ring", ring_plan(topology))):
            chunk = max(4, int(p.chunk_bytes / scale) // 4 * 4)
            eng = Engine(t, p, chunk_bytes=chunk, window=window_for(p.chunk_bytes))
            x = np.full(elems, t.rank, np.float32)
            t.barrier()
            s = t.now()
            got = eng.allreduce(x, algorithm=alg)
            out[alg] = {"time_s": t.now() - s, "wrong": int(np.count_nonzero(got != want)),
                        "predicted_s": p.predict_time(size)}
        return out

    t0 = time.perf_counter()
    sim = run_simulated(topology, body, scale=scale)
    plan = sim.results[0]["plan"]
    rows: List[Dict[str, Any]] = []
    for alg in ("tree", "ring"):
        t_s = max(r[alg]["time_s"] for r in sim.results)
        algbw = size / t_s / 1e9
        rows.append({"algorithm": alg, "size": size, "time_s": t_s, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * 2 * (n - 1) / n,
                     "wrong": sum(r[alg]["wrong"] for r in sim.results),
                     "predicted_s": sim.results[0][alg]["predicted_s"]})
    return {"topology": topology.name, "ranks": n, "size": size, "scale": scale,
            "init_simulated_s": max(r["init_s"] for r in sim.results),
            "planner_s": sim.results[0]["planner_s"],
            "throughput_Bps": plan.get("throughput_Bps"),
            "upper_bound_Bps": plan.get("upper_bound_Bps"),
            "rows": rows, "wall_s": time.perf_counter() - t0, "messages": sim.messages}


def run(args: argparse.Namespace) -> int:
    try:
        topology = _load(args.topology)
    except (OSError, TopologyError) as exc:
        print(f"horotopo simulate: {exc}", file=sys.stderr)
        return 2
    from ..transport.simulated import SimulatorMissing

    print(f"simulating {topology.name!r}: {topology.n} ranks, {format_size(args.size)}",
          file=sys.stderr, flush=True)
    try:
        res = simulate(topology, args.size, args.probe)
    except SimulatorMissing as exc:
        print(f"horotopo simulate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"init (simulated): {res['init_simulated_s'] * 1e3:.2f} ms; planner (this machine): "
          f"{res['planner_s']:.2f} s; simulation took {res['wall_s']:.1f} s wall, "
          f"{res['messages']} messages")
    print(f"{'algorithm':>9} {'size':>12} {'time(us)':>12} {'algbw':>8} {'busbw':>8} "
          f"{'#wrong':>6} {'predicted(us)':>14}")
    for r in res["rows"]:
        print(f"{r['algorithm']:>9} {r['size']:>12} {r['time_s'] * 1e6:>12.1f} "
              f"{r['algbw_GBps']:>8.3f} {r['busbw_GBps']:>8.3f} {r['wrong']:>6} "
              f"{r['predicted_s'] * 1e6:>14.1f}")
    return 0
