"""Predicted against simulated allreduce time, and the deep-or-shallow forest choice.

For each cluster generator and rank count, and each size: ``make_plan(size=...)`` plans the
deep (highest-throughput) forest, a balanced one (packed with each rank's receive CPU as a
resource) and a shallow one (depth-bounded trees) and keeps the one whose alpha-beta
prediction (``Plan.predict_time``) is lower by a margin (on the simulator's network, or with
``--choose-on declared`` on the links as declared). Each is then run in the SimGrid
simulation (horotopo's engine over ``horotopo.simulation.run_simulated``, simulated time, so
the machine's load does not enter) and compared with their prediction.

The prediction is made for the network the simulator really gives: SimGrid's TCP model
multiplies latencies, scales rates and caps a message at its TCP window over the round trip.
Those factors are *measured* first, by timing single messages between two simulated ranks
(:func:`measure_network`), and handed to ``predict_time(network=...)``; the software costs are
the simulator's own (``DEFAULT_COSTS``, the same measurements as the engine's model).

    python benchmarks/predict_check.py --ranks 16,64,256 --sizes 1M,64M [--json]

Prints a Markdown table (or ``--json``); progress on stderr; ``--markdown [PATH]`` also writes
it to docs/results/predict_check.md. Exit status 1 when a prediction is off by more than
``--tolerance`` (default 15%) of the simulated time, listing those rows.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from horotopo.engine import Engine  # noqa: E402
from horotopo.generate import GENERATORS, generate  # noqa: E402
from horotopo.packing.alphabeta import NetworkModel, SoftwareCosts, window_for  # noqa: E402
from horotopo.plan import Plan, format_size, make_plan, parse_size  # noqa: E402
from horotopo.simulation.runner import run_simulated  # noqa: E402
from horotopo.topology import Topology, bundled, from_dict, load  # noqa: E402
from horotopo.transport.simulated import DEFAULT_COSTS, SimCosts  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

CLUSTERS = ("racks:hosts_per_rack=4,gpus=8,oversub=4,slow=0.25",
              "fattree:hosts_per_leaf=8,spines=4,gpus=8",
              "sites:gpus=8,wan_gbps=10")
#: Real float32 elements per rank at most, and over all ranks; the rest of a size is scale.
MAX_ELEMS = 1 << 18
TOTAL_ELEMS = 1 << 24


def software_costs(costs: SimCosts = DEFAULT_COSTS) -> SoftwareCosts:
    """The simulator's software costs in the model's terms."""
    return SoftwareCosts(per_message_s=costs.per_message_s, per_byte_s=costs.recv_s_per_byte)


def _pair(gbps: float, latency_ms: float) -> Topology:
    return from_dict({"name": f"pair-{gbps:g}-{latency_ms:g}", "switches": ["s"],
                      "links": [{"ends": ["a", "s"], "gbps": gbps, "latency_ms": latency_ms},
                                {"ends": ["b", "s"], "gbps": 100 * gbps, "latency_ms": 0.0}],
                      "ranks": ["a", "b"]})


def _one_message(topology: Topology, nbytes: int, both: bool = False) -> float:
    """Simulated seconds of one message of ``nbytes`` from rank 0 to rank 1 (``both``: and
    one from rank 1 to rank 0 at the same time), no CPU cost."""
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


def measure_network() -> NetworkModel:
    """The simulator's network as a :class:`NetworkModel`, from single messages.

    A byte over a 1 ms link gives the latency factor; 64 MiB each way at once over a 1 gbps
    link without latency the bandwidth factor, in the regime of an allreduce, whose reduce and
    broadcast traffic cross most links in both directions (SimGrid charges a flow's
    acknowledgements to the reverse direction); 64 MiB over a 10 gbps link of 5 ms the rate
    cap of one message, read as a TCP window over twice the declared latency.
    """
    lat_factor = _one_message(_pair(1.0, 1.0), 1) / 1e-3
    big = 64 << 20
    bw_factor = big / 125e6 / _one_message(_pair(1.0, 0.0), big, both=True)
    capped = _one_message(_pair(10.0, 5.0), big) - 5e-3 * lat_factor
    rate = big / capped
    window = rate * 2 * 5e-3 / bw_factor if rate < 0.9 * bw_factor * 1.25e9 else None
    # two messages of one stream (same tag) posted together over a link of 5 ms (a 625 KB
    # bandwidth-delay product): on a TCP stream the second follows the first's bytes; shared,
    # both end together; held back, the second leaves when the first has arrived and pays
    # the latency again: always ("serial"), or only past the bandwidth-delay product ("bdp")
    shared = False
    held = []
    for size in (64 << 10, 1 << 20):
        single = _one_message(_pair(1.0, 5.0), size)
        first, second = _two_messages(_pair(1.0, 5.0), size)
        shared = shared or second - first < 0.1 * single
        held.append(second > 1.5 * single)
    streams = "serial" if held[0] else ("bdp" if held[1] else "free")
    return NetworkModel(latency_factor=lat_factor, bandwidth_factor=bw_factor,
                        tcp_window_bytes=window, shared_messages=shared, streams=streams)


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


def simulate_plan(topology: Topology, plan: Plan, size: int,
                  timeout_s: Optional[float] = None) -> Dict[str, Any]:
    """One tree allreduce of ``size`` bytes along ``plan``, simulated: its time (slowest
    rank), the wrong elements (exact small integers) and the simulation's wall time."""
    n = topology.n
    elems = max(1, min(size // 4, MAX_ELEMS, max(n, TOTAL_ELEMS // n)))
    scale = size / (elems * 4)
    # chunks scaled down alike, so each tree keeps the full-size run's chunk count
    chunk = max(4, int(plan.chunk_bytes / scale) // 4 * 4)
    want = np.float32(n * (n - 1) / 2)

    def body(t: Any) -> Dict[str, float]:
        eng = Engine(t, plan, chunk_bytes=chunk, window=window_for(plan.chunk_bytes, len(plan.trees)))
        x = np.full(elems, t.rank, np.float32)
        t.barrier()
        start = t.now()
        got = eng.allreduce(x, algorithm="tree")
        return {"s": t.now() - start, "wrong": int(np.count_nonzero(got != want))}

    run = run_simulated(topology, body, scale=scale, timeout_s=timeout_s)
    return {"time_s": max(r["s"] for r in run.results),
            "wrong": sum(r["wrong"] for r in run.results), "wall_s": run.wall_s,
            "messages": run.messages}


def check(spec: str, ranks: int, sizes: Sequence[int], network: NetworkModel,
          costs: SoftwareCosts, timeout_s: float, on_simulator: bool = True
          ) -> List[Dict[str, Any]]:
    """Rows for one cluster: per size, the chosen forest and both forests' prediction
    against their simulated time. ``on_simulator``: the forest is chosen on the simulator's
    network (else on the network as declared)."""
    topology = (from_dict(generate(spec, ranks)) if spec.partition(":")[0] in GENERATORS
                else load(bundled(spec)))
    rows = []
    for size in sizes:
        w0 = time.perf_counter()
        chosen = make_plan(topology, size=size, network=network if on_simulator else None)
        planner_s = time.perf_counter() - w0
        record = chosen.planner["forest"]
        for forest in ("deep", "hosts", "chains"):
            if forest not in record:
                continue
            plan = chosen if record["chosen"] == forest else make_plan(
                topology, size=size, forest=forest)
            pred = plan.predict_time(size, costs=costs, network=network)
            try:
                sim = simulate_plan(topology, plan, size, timeout_s)
            except Exception as exc:  # noqa: BLE001 - a limit is reported as measured
                sim = {"time_s": None, "error": str(exc).splitlines()[0]}
            row = {"topology": topology.name, "ranks": topology.n, "size": size,
                   "forest": forest, "chosen": record["chosen"] == forest,
                   "trees": len(plan.trees), "max_hops": max(t.depth for t in plan.trees),
                   "throughput_Bps": plan.throughput_Bps,
                   "predicted_s": pred, "predicted_declared_s": plan.predict_time(size),
                   "planner_s": planner_s, **sim}
            if sim["time_s"]:
                row["error_frac"] = pred / sim["time_s"] - 1
            rows.append(row)
            _say(f"{topology.name} {format_size(size)} {forest}"
                 f"{' (chosen)' if row['chosen'] else ''}: predicted {pred * 1e3:.2f} ms, "
                 f"simulated {_ms(sim['time_s'])} ms")
    return rows


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


#: The Markdown table's columns: header, right-aligned, cell of a row.
COLUMNS = (
    ("topology", False, lambda r: r["topology"]),
    ("ranks", True, lambda r: str(r["ranks"])),
    ("size", True, lambda r: format_size(r["size"])),
    ("forest", False, lambda r: r["forest"] + (" **chosen**" if r["chosen"] else "")),
    ("trees", True, lambda r: str(r["trees"])),
    ("max hops", True, lambda r: str(r["max_hops"])),
    ("R MB/s", True, lambda r: f"{r['throughput_Bps'] / 1e6:.1f}"),
    ("predicted ms", True, lambda r: f"{r['predicted_s'] * 1e3:.2f}"),
    ("simulated ms", True, lambda r: _ms(r["time_s"])),
    ("error", True, lambda r: (f"{r['error_frac'] * 100:+.1f}%" if "error_frac" in r
                               else r.get("error", "-"))),
)


def table(rows: Sequence[Dict[str, Any]]) -> str:
    """The rows as a Markdown table (:data:`COLUMNS`)."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    out = [line([c[0] for c in COLUMNS]),
           line(["---:" if c[1] else "---" for c in COLUMNS])]
    out += [line([c[2](r) for c in COLUMNS]) for r in rows]
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", default=";".join(CLUSTERS + ("racks-2x3", "slow-nic")),
                    help="';'-separated generator specs or bundled topology names")
    ap.add_argument("--ranks", default="16,64", help="rank counts (generators only)")
    ap.add_argument("--sizes", default="1M,64M", help="allreduce sizes")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="wall seconds per simulation before it is reported as a limit")
    ap.add_argument("--choose-on", choices=("simulator", "declared"), default="simulator",
                    help="network the deep-or-shallow choice is predicted on (default: the "
                         "simulator's, as measured)")
    ap.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(ap, "predict_check")
    args = ap.parse_args(argv)
    network = measure_network()
    costs = software_costs()
    _say(f"simulator's network: {network}")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows: List[Dict[str, Any]] = []
    for spec in args.clusters.split(";"):
        counts = ([int(k) for k in args.ranks.split(",")]
                  if spec.partition(":")[0] in GENERATORS else [0])
        for n in counts:
            rows += check(spec, n, sizes, network, costs, args.timeout,
                          args.choose_on == "simulator")
    misses = [r for r in rows if "error_frac" in r and abs(r["error_frac"]) > args.tolerance]
    measured = (f"simulator's network: latency x{network.latency_factor:.2f}, rates "
                f"x{network.bandwidth_factor:.3f}, TCP window {network.tcp_window_bytes}")
    missed = [f"MISS: {r['topology']} {format_size(r['size'])} {r['forest']}: predicted "
              f"{r['predicted_s'] * 1e3:.2f} ms vs simulated {r['time_s'] * 1e3:.2f} ms "
              f"({r['error_frac'] * 100:+.1f}%)" for r in misses]
    if args.json:
        print(json.dumps({"network": network.__dict__, "rows": rows}))
    else:
        print(measured)
        print(table(rows))
        print("\n".join(missed))
    if args.markdown:
        verdict = ("Every prediction within " f"{args.tolerance * 100:g}% of the simulated time."
                   if not missed else "\n".join(f"- {m}" for m in missed))
        results_doc.write(args.markdown, "predict_check: predicted against simulated allreduce "
                          "time", [("", table(rows)), ("Verdict", verdict)],
                          summary=f"The {measured}. Forests chosen on the "
                                  f"{args.choose_on} network.")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
