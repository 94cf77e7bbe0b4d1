"""Predictions against the simulator: the simulator's network measured as a
:class:`~horotopo.packing.alphabeta.NetworkModel`, and one simulated allreduce of any registered
algorithm, timed as ``horotopo simulate`` times it.

SimGrid's TCP model scales rates, multiplies latencies, caps a message at its TCP window over
the round trip and holds a stream's messages back; :func:`measure_network` reads those figures
from single messages between two simulated ranks, without software costs, so that a prediction
(:func:`horotopo.algorithms.choice.predictions`) can be made for the network the simulator
really gives. :func:`simulate_allreduce` then runs the engine's algorithm over the simulated
transport and returns the slowest rank's time, to compare with it
(``benchmarks/predict_check.py``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from ..engine import Engine
from .flows import FlowNetwork
from ..packing.alphabeta import NetworkModel, SoftwareCosts, window_for
from ..params import ENGINE, RUNTIME, EngineParams, RuntimeParams
from ..plan import Plan, plan_from_trees
from ..simulation.runner import run_simulated
from ..simulation.support import SimCosts
from ..topology import Topology, from_dict

__all__ = ["measure_network", "one_message", "pair", "simulated_costs", "simulate_allreduce",
           "timed_allreduce", "SMALL_ELEMS", "TOTAL_ELEMS"]

#: Real float32 elements per rank at most, and over all ranks; the rest of a size is scale
#: (``horotopo simulate``'s figures).
SMALL_ELEMS = 1 << 16
TOTAL_ELEMS = 1 << 24


def pair(gbps: float, latency_ms: float) -> Topology:
    """Two ranks: ``a`` behind one link of ``gbps`` and ``latency_ms``, ``b`` behind a link
    100 times faster without latency."""
    return from_dict({"name": f"pair-{gbps:g}-{latency_ms:g}", "switches": ["s"],
                      "links": [{"ends": ["a", "s"], "gbps": gbps, "latency_ms": latency_ms},
                                {"ends": ["b", "s"], "gbps": 100 * gbps, "latency_ms": 0.0}],
                      "ranks": ["a", "b"]})


def one_message(topology: Topology, nbytes: int, both: bool = False) -> float:
    """Simulated seconds of one message of ``nbytes`` from rank 0 to rank 1 (``both``: and
    one from rank 1 to rank 0 at the same time), no software cost."""
    def body(t: Any) -> float:
        x, y = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
        t.barrier()
        start = t.now()
        reqs = [t.isend(x, 1, 7) if t.rank == 0 else t.irecv(x, 0, 7)]
        if both:
            reqs.append(t.isend(y, 0, 8) if t.rank == 1 else t.irecv(y, 1, 8))
        t.waitall(reqs)
        return t.now() - start

    return max(run_simulated(topology, body, scale=nbytes, costs=SimCosts(0.0, 0.0)).results)


def _two_messages(topology: Topology, nbytes: int) -> Tuple[float, float]:
    """Simulated seconds until the first and the second of two messages of ``nbytes`` on one
    stream (rank 0 to rank 1, one tag), posted together, have arrived."""
    def body(t: Any) -> Tuple[float, float]:
        bufs = [np.zeros(1, np.uint8), np.zeros(1, np.uint8)]
        t.barrier()
        start = t.now()
        reqs = [t.isend(b, 1, 7) if t.rank == 0 else t.irecv(b, 0, 7) for b in bufs]
        t.waitsome(reqs[:1])
        first = t.now() - start
        t.waitall(reqs)
        return first, t.now() - start

    return run_simulated(topology, body, scale=nbytes, costs=SimCosts(0.0, 0.0)).results[1]


def _two_flows(long_ms: float, short_ms: float, nbytes: int) -> Tuple[float, float]:
    """Simulated seconds until the first and the second of two flows of ``nbytes`` into one rank
    over its 1 gbps link have arrived: one from a rank behind a 10 gbps link of ``long_ms``,
    one from a rank behind a 10 gbps link of ``short_ms``."""
    topology = from_dict({"name": "two-flows", "switches": ["s"],
                          "links": [{"ends": ["a", "s"], "gbps": 10.0, "latency_ms": long_ms},
                                    {"ends": ["b", "s"], "gbps": 10.0, "latency_ms": short_ms},
                                    {"ends": ["c", "s"], "gbps": 1.0, "latency_ms": 0.0}],
                          "ranks": ["a", "b", "c"]})

    def body(t: Any) -> Tuple[float, float]:
        bufs = [np.zeros(1, np.uint8), np.zeros(1, np.uint8)]
        t.barrier()
        start = t.now()
        if t.rank < 2:
            t.waitall([t.isend(bufs[0], 2, 7)])
            return 0.0, 0.0
        reqs = [t.irecv(bufs[0], 0, 7), t.irecv(bufs[1], 1, 7)]
        t.waitsome(reqs)
        first = t.now() - start
        t.waitall(reqs)
        return first, t.now() - start

    return run_simulated(topology, body, scale=nbytes, costs=SimCosts(0.0, 0.0)).results[2]


def _chain_time(unequal: bool, size: int) -> float:
    """Simulated seconds of an allreduce of ``size`` bytes, without software costs, down a
    chain of three ranks behind 10 gbps links (rank 2 reduces to rank 1, rank 1 to rank 0,
    and the result comes back): all on one switch, or (``unequal``) rank 2 behind a second
    switch 50 us away, so that rank 1's reduce flow to rank 0 and its broadcast flow to rank 2
    leave it over routes of unequal latency, their weights about 3 times apart (the share
    stops falling past 2: what the model takes as the largest cost of unequal weights)."""
    far = "t" if unequal else "s"
    topology = from_dict({"name": "chain", "switches": ["s", "t"], "ranks": ["a", "b", "c"],
                          "links": [{"ends": ["a", "s"], "gbps": 10.0, "latency_ms": 0.002},
                                    {"ends": ["b", "s"], "gbps": 10.0, "latency_ms": 0.002},
                                    {"ends": ["c", far], "gbps": 10.0, "latency_ms": 0.002},
                                    {"ends": ["s", "t"], "gbps": 10.0, "latency_ms": 0.05}]})
    chain = (-1, 0, 1)
    plan = plan_from_trees(3, [(0, chain, chain, 1.0)], chunk_bytes=128 << 10,
                           topology=topology)
    elems = SMALL_ELEMS
    scale = size / (elems * 4)
    chunk = max(4, int((128 << 10) / scale) // 4 * 4)
    run = run_simulated(topology, timed_allreduce(plan, "tree", elems, chunk, 16), scale=scale,
                        costs=SimCosts(0.0, 0.0))
    return max(r["time_s"] for r in run.results)


def measure_network(params: RuntimeParams = RUNTIME) -> NetworkModel:
    """The simulator's network as a :class:`NetworkModel`, from single messages.

    The long messages are ``params.simulation_probe_bytes`` (64 MiB), the stream's
    ``params.simulation_stream_sizes``, and the thresholds that read them the ``simulation_*``
    fields of :class:`~horotopo.params.RuntimeParams`.

    A byte over a 1 ms link gives the latency factor; 64 MiB each way at once over a 1 gbps
    link without latency the bandwidth factor, in the regime of an allreduce, whose traffic
    crosses most links in both directions (SimGrid charges a flow's acknowledgements to the
    reverse direction); 64 MiB over a 10 gbps link of 5 ms the rate cap of one message, read as
    a TCP window over twice the declared latency. Two messages of one stream posted together
    over a link of 5 ms (a 625 KB bandwidth-delay product) tell how a stream's messages go:
    shared (both end together) or held back, always (``"serial"``) or past the
    bandwidth-delay product (``"bdp"``). How flows share a link
    (:class:`~horotopo.algorithms.flows.FlowNetwork`): a flow alone over the 1 gbps link
    against one with a flow the other way gives the cross traffic, and two flows into one
    1 gbps link over routes of 0.2 ms and 1 us the weight of a link's rate in a flow's
    penalty. A three-rank chain tree with and without a rank whose reduce and broadcast flows
    have unequal weights (:func:`_chain_time`) gives what such flows keep of a link.
    """
    lat_factor = one_message(pair(1.0, 1.0), 1) / 1e-3
    big = params.simulation_probe_bytes
    bw_factor = big / 125e6 / one_message(pair(1.0, 0.0), big, both=True)
    capped = one_message(pair(10.0, 5.0), big) - 5e-3 * lat_factor
    rate = big / capped
    window = (rate * 2 * 5e-3 / bw_factor
              if rate < params.simulation_capped_below * bw_factor * 1.25e9 else None)
    shared = False
    held = []
    for size in params.simulation_stream_sizes:
        single = one_message(pair(1.0, 5.0), size)
        first, second = _two_messages(pair(1.0, 5.0), size)
        shared = shared or second - first < params.simulation_shared_within * single
        held.append(second > params.simulation_held_beyond * single)
    streams = "serial" if held[0] else ("bdp" if held[1] else "free")
    # a flow alone against one with a flow the other way: what its acknowledgements take
    alone = big / 125e6 / one_message(pair(1.0, 0.0), big)
    crosstraffic = max(0.0, alone / bw_factor - 1.0)
    # two flows into one link, over routes of 0.2 ms and 1 us: the link shared in the inverse
    # ratio of their penalties (route latency plus weight_bytes over each link's rate)
    long_s, short_s = 0.2e-3 * lat_factor, 1e-6 * lat_factor
    first, _ = _two_flows(long_s / lat_factor * 1e3, short_s / lat_factor * 1e3, big)
    link = alone * 125e6
    fast = big / first                 # the short route's rate while both flow
    ratio = fast / max(link - fast, 1e-9)
    per_byte = 1 / 1.25e9 + 1 / 125e6  # each route: its 10 gbps link, then the 1 gbps one
    weight = ((long_s - ratio * short_s) / (per_byte * (ratio - 1)) if ratio > 1.001
              else 0.0)
    # one tree's flows of unequal weights over one link: what the chain keeps of its time
    mixed = _chain_time(False, big) / _chain_time(True, big)
    return FlowNetwork(latency_factor=lat_factor, bandwidth_factor=bw_factor,
                       tcp_window_bytes=window, shared_messages=shared, streams=streams,
                       weight_bytes=weight, crosstraffic=crosstraffic, mixed_efficiency=mixed)


def simulated_costs() -> SoftwareCosts:
    """The software costs the simulator charges now (the active cost profile's), in the
    model's terms."""
    costs = SimCosts.active()
    return SoftwareCosts(per_message_s=costs.per_message_s, per_byte_s=costs.recv_s_per_byte)


def timed_allreduce(plan: Plan, algorithm: str, elems: int, chunk_elems_bytes: int,
                    window: int, params: EngineParams = ENGINE
                    ) -> Callable[[Any], Dict[str, Any]]:
    """A simulated rank's body: one allreduce of ``elems`` float32 (each rank's own rank
    number) by ``algorithm``, forced, on an engine bound to ``plan`` in chunks of
    ``chunk_elems_bytes`` real bytes, ``window`` and ``params``; every rank starts at one simulated
    instant, and the call ends once the rank has handled its last receive. Returns the
    rank's ``time_s`` and its ``wrong`` elements."""
    want = np.float32(plan.n * (plan.n - 1) / 2)

    def body(t: Any) -> Dict[str, Any]:
        eng = Engine(t, plan, chunk_bytes=chunk_elems_bytes, window=window, params=params)
        if algorithm == "hierarchical":  # its hosts (an exchange of names) are not timed
            eng.allreduce_algorithms.get(algorithm).runner.layout()
        x = np.full(elems, t.rank, np.float32)
        start = t.start_together()
        got = eng.allreduce(x, algorithm=algorithm)
        t.settle()  # the CPU work still owed for the last receives is part of the call
        return {"time_s": t.now() - start, "wrong": int(np.count_nonzero(got != want))}

    return body


def simulate_allreduce(topology: Topology, plan: Plan, algorithm: str, size: int,
                       chunk_bytes: Optional[int] = None,
                       timeout_s: Optional[float] = None) -> Dict[str, Any]:
    """One allreduce of ``size`` bytes by the registered ``algorithm``, forced, on an engine
    bound to ``plan``, simulated on ``topology`` with the active cost profile's software costs:
    every rank starts at one simulated instant and the call ends when the slowest rank has
    handled its last receive. ``chunk_bytes`` is the full-size chunk (default the plan's);
    the simulation moves fewer real elements in chunks scaled down alike, so the pipeline
    keeps the full-size chunk count. Returns the time, the wrong elements (exact small
    integers), the messages and the simulation's wall time."""
    n = topology.n
    elems = max(1, min(size // 4, SMALL_ELEMS, max(n, TOTAL_ELEMS // n)))
    scale = size / (elems * 4)
    full = int(chunk_bytes or plan.chunk_bytes)
    chunk = max(4, int(full / scale) // 4 * 4)
    # the automatic window of the full-size chunk over the trees that run (dbtree's two),
    # under the parameters the plan was made with, as the engine's tables take it
    window = window_for(full, 2 if algorithm == "dbtree" else len(plan.trees),
                        plan.planner_params)
    run = run_simulated(topology, timed_allreduce(plan, algorithm, elems, chunk, window),
                        scale=scale, timeout_s=timeout_s)
    return {"time_s": max(r["time_s"] for r in run.results),
            "wrong": sum(r["wrong"] for r in run.results), "wall_s": run.wall_s,
            "messages": run.messages, "chunk_bytes": full}
