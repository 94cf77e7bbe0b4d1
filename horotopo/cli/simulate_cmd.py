"""``horotopo simulate TOPOLOGY.json|NAME|GENERATOR``: horotopo's init path and allreduce over a
simulated network (SimGrid), before booking the cluster.

Every rank is a SimGrid actor running horotopo's own code over
:class:`~horotopo.transport.simulated.SimulatedTransport`: with ``--probe quick|full`` the
ranks run the real probe (:func:`horotopo.probe.probe`, timing simulated transfers on the
transport's clock), rank 0 infers the measured topology from it and plans; with ``--probe
declared`` rank 0 plans the topology given. Then the plan protocol
(:func:`~horotopo.planning_protocol.share_plan`: broadcast, digest check) runs between the
simulated ranks, and the engine runs one allreduce with the plan's trees, one with ring, one
with NCCL's double binary tree and one with Horovod's hierarchical allreduce, each rank holding
a small float32 array while the network carries ``--size`` bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple


from .. import costs as cost_profiles
from ..costs import RANK_KINDS, CostProfile
from ..generate import GENERATORS, describe_generators, generate
from ..params import ENGINE, EngineParams
from ..plan import Plan, format_size, make_plan, ring_plan
from ..topology import Topology, TopologyError, from_dict, load, plural
from . import CommandError, positive_size

__all__ = ["add_parser", "simulate", "resolve", "ALGORITHMS", "PROBES"]

#: The rows, in order: horotopo's plan, then the peers as the libraries run them.
ALGORITHMS = ("tree", "ring", "dbtree", "hierarchical")
#: --probe: run the probe (quick, full), plan the topology given (declared), or ring (off).
PROBES = ("declared", "quick", "full", "off")


def add_parser(sub: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "simulate", help="run the init path and allreduce over a simulated network (SimGrid)",
        description="Probe (or take the declared topology), plan on rank 0 and choose the "
                    "algorithm predicted fastest, share and check the plan, then time "
                    "horotopo's trees, ring, NCCL's double binary tree and Horovod's "
                    "hierarchical allreduce, each beside its prediction (the chosen one "
                    "starred), over a SimGrid network built from the topology: each algorithm "
                    "in a simulation of its own, every rank starting at one simulated instant. "
                    "Progress (messages, simulated clock) goes to stderr once a minute. Needs "
                    "python3-simgrid (apt-get install -y python3-simgrid).",
        epilog="TOPOLOGY is a topology JSON file, a bundled topology's name, or a cluster "
               "generator as NAME[:KEY=VALUE,...] with --ranks N. Generators and their "
               "parameters (defaults shown; rates in gbps):\n"
               f"{describe_generators()}\n\n"
               "Examples:\n"
               "  horotopo simulate racks-2x3 --size 16M --probe quick\n"
               "  horotopo simulate racks:hosts_per_rack=4,gpus=8,oversub=4 --ranks 64\n"
               "  horotopo simulate sites:wan_gbps=1,gpus=4 --ranks 32 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", help="topology JSON file, bundled name, or GENERATOR spec")
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks of a generated cluster (required with a generator)")
    p.add_argument("--size", default="64M", type=positive_size,
                   help="allreduce size in bytes (default 64M; K, M, G are binary)")
    p.add_argument("--probe", default="declared", choices=PROBES,
                   help="quick or full: run horotopo's probe in the simulation and plan the "
                        "measured topology (what init() does; a generated cluster's GPU ranks "
                        "are named by their host, so past 16 ranks the probe works by hosts); "
                        "declared: plan the topology as given (default; the probe adds about 3 "
                        "minutes of wall time at 1024 ranks on 128 hosts); off: plan ring")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS), type=parse_algorithms,
                   help="comma-separated subset of %(default)s to run (ring's 2 n (n - 1) "
                        "messages dominate a simulation of thousands of ranks)")
    p.add_argument("--chunk", default=None, type=positive_size,
                   help="full-size chunk for every algorithm instead of the plans' (fewer, "
                        "larger messages: a faster simulation of a different engine setting); "
                        "the plan is made for it")
    p.add_argument("--plan", default=None,
                   help="plan JSON to share instead of planning (python -m horotopo plan ... "
                        "--json, or a previous simulation's 'plan'); needs --probe declared")
    p.add_argument("--no-software-costs", dest="software_costs", action="store_false",
                   help="charge no software cost (the per-message and per-byte receive CPU "
                        "measured on this machine, charged as simulated time by default): the "
                        "network alone, to tell what the costs take from a result")
    p.add_argument("--ranks-are", default="cpu", choices=RANK_KINDS,
                   help="what the ranks are, for the software costs charged and planned with: "
                        "cpu (default) charges the CPU path of the cost profile (HOROTOPO_COSTS "
                        "or horotopo calibrate's file, else the built-in profile); gpu charges "
                        "the device path: the reduce kernel's rate and the device path's "
                        "per-message cost (the built-in figures measured on an H100), and with --cuda-aware no the host "
                        "staging copies")
    p.add_argument("--cuda-aware", default="yes", choices=("yes", "no"),
                   help="with --ranks-are gpu: whether MPI takes device buffers (yes, default) "
                        "or every message is staged through host memory (no)")
    p.add_argument("--costs", default=None, metavar="PROFILE.json",
                   help="the cost profile to charge (horotopo calibrate's output) instead of "
                        "HOROTOPO_COSTS or the default calibration file")
    p.add_argument("--max-host-trees", type=int, default=None, metavar="K",
                   help="plan host forests of at most K host-level trees (make_plan's bound, "
                        "default 32; each is as many trees as a host has ranks): fewer, larger "
                        "messages, a faster simulation of another plan")
    p.add_argument("--simgrid-cfg", action="append", default=[], metavar="NAME:VALUE",
                   type=_simgrid_setting,
                   help="a SimGrid setting over the simulator's network model (LV08 without "
                        "its latency factor), repeatable: what-if runs that tell what one of "
                        "the model's effects costs, e.g. network/crosstraffic:0 (no reverse "
                        "traffic for acknowledgements) or network/bandwidth-factor:1 (no "
                        "0.97 for TCP/IP headers); recorded in the JSON")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="chunks of scratch per tree and reduce child for every algorithm, "
                        "instead of each one's automatic window (window_for of its full-size "
                        "chunk and its trees): what-if runs of the engine's window; recorded "
                        "in the JSON")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout")
    p.set_defaults(func=run)
    return p


def _simgrid_setting(text: str) -> str:
    """``NAME:VALUE`` as SimGrid's ``--cfg`` takes it (whether SimGrid knows the name and takes
    the value, the simulation says)."""
    name, sep, value = text.partition(":")
    if not (sep and name.strip() and value.strip()) or " " in text:
        raise argparse.ArgumentTypeError(f"expected NAME:VALUE (network/crosstraffic:0), "
                                         f"got {text!r}")
    return text


def parse_algorithms(text: str) -> Tuple[str, ...]:
    """``"tree,dbtree"`` -> ``("tree", "dbtree")``, in :data:`ALGORITHMS`' order.

    Raises
    ------
    argparse.ArgumentTypeError
        An unknown name, or none.
    """
    names = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in names if a not in ALGORITHMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"algorithms must be a non-empty subset of "
                                         f"{','.join(ALGORITHMS)}, got {text!r}")
    return tuple(a for a in ALGORITHMS if a in names)


def resolve(text: str, ranks: Optional[int] = None) -> Topology:
    """The topology ``text`` names: a file, a bundled topology, or a generator spec (which
    needs ``ranks``).

    Raises
    ------
    TopologyError
        None of them, or a generator spec without ``ranks`` or with a bad parameter.
    """
    if text.partition(":")[0] in GENERATORS:
        if ranks is None or ranks < 1:
            raise TopologyError(f"{text}: a generated cluster needs --ranks N (N >= 1)")
        try:
            return from_dict(generate(text, ranks))
        except ValueError as exc:
            raise TopologyError(str(exc)) from None
    topology = load(text)
    if ranks is not None and ranks != topology.n:
        raise TopologyError(f"{text} has {plural(topology.n, 'rank')}, not --ranks {ranks}")
    return topology


def simulate(topology: Topology, size: int, probe: str = "declared",
             progress: Any = None, timeout_s: Optional[float] = None,
             algorithms: Sequence[str] = ALGORITHMS, plan: Optional[Plan] = None,
             chunk_bytes: Optional[int] = None, software_costs: bool = True,
             simgrid_config: Sequence[str] = (),
             max_host_trees: Optional[int] = None,
             window: Optional[int] = None, ranks_are: str = "cpu", cuda_aware: bool = True,
             profile: Optional[CostProfile] = None,
             profile_source: Optional[str] = None,
             engine_params: Optional[EngineParams] = None) -> Dict[str, Any]:
    """Run the simulation; the result as a JSON-ready dict (see :func:`run`).

    ``software_costs`` False charges no per-message or per-byte receive cost (the network
    alone); otherwise ``profile`` (None: :func:`horotopo.costs.from_settings`'s, with
    ``profile_source`` saying where it came from) charged for ranks of kind ``ranks_are``
    (``"cpu"`` or ``"gpu"``, the latter staged through host memory unless ``cuda_aware``): the
    planner and the predictions charge the same figures (:func:`horotopo.costs.charging`).
    ``simgrid_config``: SimGrid settings ``NAME:VALUE`` over the simulator's network model
    (``network/crosstraffic:0``, ``network/bandwidth-factor:1``...), recorded in the result.
    ``max_host_trees``: the planner's bound on a host forest's trees (``make_plan``'s).
    ``window``: the engine's window for every algorithm (None: each one's automatic window at
    its full-size chunk), recorded in the result. ``engine_params``: the engine's parameters
    (None: the defaults, :data:`horotopo.params.ENGINE`), its pace factor recorded.

    ``probe`` is one of :data:`PROBES`. ``progress`` receives one-line messages (rank 0's
    probe progress, in simulated seconds; each simulation's messages and clock once a minute
    of wall time). ``timeout_s`` bounds the wall time of the whole
    simulation, planner included (:class:`~horotopo.simulation.SimulationError` past it).
    ``algorithms`` is the subset of :data:`ALGORITHMS` to run, one row each. The init (probe,
    plan, its broadcast) is simulated once; then each algorithm runs in a simulation of its
    own, every rank starting at one simulated instant
    (:meth:`~horotopo.transport.simulated.SimulatedTransport.start_together`), so that a row
    does not depend on the rows beside it. Each row has its own ``messages`` and
    ``simulation_wall_s``; the top-level ones add up every simulation, the init's included.

    ``plan`` (with ``probe="declared"``): rank 0 shares this plan instead of planning (a plan
    made earlier for the same topology: the planner's time is then not part of this run, and
    ``planner_s`` is None). ``chunk_bytes`` replaces every algorithm's full-size chunk: the
    engine's message count is ``size / chunk`` per tree edge and direction, and a simulation's
    wall time is about proportional to messages, so larger chunks make big clusters
    affordable, at the price of a longer pipeline fill than the plan's chunk would give (the
    result is a different engine setting, reported as such). The plan made here is made for
    that chunk (``make_plan(chunk_bytes=...)``, as ``horotopo plan --chunk``): its forest is
    the one predicted fastest at that chunk, whose pipeline fill it sets.

    Every algorithm runs as horotopo's engine runs it when its plan's choice names it: over
    an engine bound to the shared plan, at the plan's chunk unless ``chunk_bytes`` is given.
    The plan carries the choice (:func:`horotopo.algorithms.choice.with_choice`, made for
    ``size`` as init makes it): ``chosen`` in the result; ``predicted_s`` holds every
    algorithm's modelled time at the rows' chunk
    (:func:`horotopo.algorithms.choice.predictions`).
    """
    if profile is None:
        profile, profile_source = cost_profiles.from_settings()
    with cost_profiles.charging(profile, ranks_are, cuda_aware):
        out = _simulate(topology, size, probe, progress, timeout_s, algorithms, plan,
                        chunk_bytes, software_costs, simgrid_config, max_host_trees, window,
                        engine_params or ENGINE)
    out["cost_profile"] = {"ranks_are": ranks_are, "cuda_aware": bool(cuda_aware),
                           "source": profile_source or "given", "profile": profile.to_json()}
    return out


def _simulate(topology: Topology, size: int, probe: str, progress: Any,
              timeout_s: Optional[float], algorithms: Sequence[str], plan: Optional[Plan],
              chunk_bytes: Optional[int], software_costs: bool, simgrid_config: Sequence[str],
              max_host_trees: Optional[int], window: Optional[int],
              engine_params: EngineParams) -> Dict[str, Any]:
    from ..algorithms.choice import (forest_predictor, predictions, recorded_algorithm,
                                     with_choice)
    from ..algorithms.simcheck import timed_allreduce
    from ..planning_protocol import share_plan
    from ..probe import probe as run_probe
    from ..params import PlannerParams
    from ..schedule import window_for
    from ..simulation import SimCosts, SimulationError
    from ..simulation.runner import run_simulated

    if probe not in PROBES:
        raise ValueError(f"probe must be one of {', '.join(PROBES)}, got {probe!r}")
    algorithms = parse_algorithms(",".join(algorithms))
    if plan is not None and (probe != "declared" or plan.n != topology.n):
        raise ValueError(f"a given plan needs --probe declared and {topology.n} ranks (it has "
                         f"{plan.n}; probe {probe!r})")
    if max_host_trees is not None and (max_host_trees < 1 or plan is not None):
        raise ValueError(f"--max-host-trees {max_host_trees}: needs at least 1, and a plan to "
                         "make (not --plan)")
    if window is not None and window < 1:
        raise ValueError(f"--window {window}: needs at least 1 chunk")
    from ..algorithms.simcheck import SMALL_ELEMS, TOTAL_ELEMS

    n = topology.n
    # thousands of ranks must fit in memory; the rest of --size is scale
    elems = max(1, min(size // 4, SMALL_ELEMS, max(n, TOTAL_ELEMS // n)))
    scale = size / (elems * 4)
    planner: Dict[str, Optional[float]] = {}

    costs = SimCosts.active() if software_costs else SimCosts(0.0, 0.0)
    t0 = time.perf_counter()
    def simulated(fn: Any, what: str) -> Any:
        left = None if timeout_s is None else timeout_s - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            raise SimulationError(f"the simulation did not finish within {timeout_s} s of "
                                  "wall time")
        return run_simulated(topology, fn, scale=scale, timeout_s=left, costs=costs,
                             network_config=simgrid_config,
                             progress=None if progress is None
                             else lambda line: progress(f"  {what}: {line}"))

    def init(t: Any) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        t0 = t.now()
        doc: Optional[Dict[str, Any]] = None
        if probe in ("quick", "full"):
            # The probe's transfers are sized to be timed: charged their true size.
            with t.true_size():
                doc = run_probe(t, probe, name=f"probed-{topology.name}",
                                progress=progress if t.rank == 0 else None)
            out["probe_s"] = t.now() - t0

        def build() -> Tuple[Plan, Topology]:
            if plan is not None:
                planner["s"] = None
                # init records the choice in every plan it makes; a plan saved without one
                # gets it here, as init would have given it
                return (plan if "algorithm" in plan.planner
                        else with_choice(plan, topology, size)), topology
            w0 = time.perf_counter()
            model = from_dict(doc) if doc is not None else topology
            # planned for this run's size, as `horotopo plan --size` (chunks and forest)
            made = (ring_plan(model, size=size) if probe == "off"
                    else make_plan(model, size=size, chunk_bytes=chunk_bytes,
                                   max_host_trees=max_host_trees,
                                   predict=forest_predictor(model)))
            made = with_choice(made, model, size)
            planner["s"] = time.perf_counter() - w0
            return made, model

        shared, _ = share_plan(t, build, what="init")
        out["init_s"] = t.now() - t0
        if t.rank == 0:
            out["plan"] = shared.to_json()
            out["planner_s"] = planner["s"]
            out["probed"] = doc
        return out

    # The init (probe, plan, its broadcast) runs once; then each algorithm runs in a
    # simulation of its own, from the same quiet start: in one simulation, a call's time
    # depended on the calls before it (SimGrid's order among simultaneous events carries
    # history), so a row would depend on the rows asked for beside it.
    sim = simulated(init, "init")
    first = sim.results[0]
    doc = first["plan"]
    made = Plan.from_json(doc)
    timed: Dict[str, Any] = {}  # algorithm: its SimRun
    for alg in algorithms:
        full = chunk_bytes or made.chunk_bytes
        # chunks scaled down alike, so the pipeline has the full-size run's chunk count
        chunk = max(4, int(full / scale) // 4 * 4)
        # ... and each algorithm's automatic window is the full-size run's: the scaled chunk
        # would give another, and it depends on the algorithm's trees (dbtree's 2) and on the
        # planner parameters the plan was made with
        win = window or window_for(full, 2 if alg == "dbtree" else len(made.trees),
                                   PlannerParams.recorded(made.planner.get("params", {})))
        body = timed_allreduce(made, alg, elems, chunk, win, engine_params)
        if progress is not None:
            progress(f"{alg}: simulating one {format_size(size)} allreduce")
        timed[alg] = simulated(body, alg)

    recorded = made.planner.get("predicted_s")
    if chunk_bytes is None and recorded and made.planner.get("algorithm_size") == size:
        predicted = dict(recorded)  # the choice's own figures: the same model, size and chunk
    else:
        predicted = predictions(topology, made, size, chunk_bytes)
    rows: List[Dict[str, Any]] = []
    for alg, run in timed.items():
        results = run.results
        t_s = max(r["time_s"] for r in results)
        algbw = size / t_s / 1e9
        rows.append({"algorithm": alg, "size": size, "time_s": t_s, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * 2 * (n - 1) / n,
                     "wrong": sum(r["wrong"] for r in results),
                     "predicted_s": predicted.get(alg),
                     "chunk_bytes": chunk_bytes or made.chunk_bytes,
                     "messages": run.messages, "simulation_wall_s": run.wall_s})
    runs = [sim, *timed.values()]
    bound = doc.get("upper_bound_Bps")
    out: Dict[str, Any] = {
        "topology": topology.name, "ranks": n, "size": size, "scale": scale, "probe": probe,
        "probe_simulated_s": first.get("probe_s"),
        "init_simulated_s": max(r["init_s"] for r in sim.results),
        "planner_s": first["planner_s"],
        "throughput_Bps": doc.get("throughput_Bps"), "upper_bound_Bps": bound,
        "optimum_s": size / bound if bound else None, "rows": rows,
        "predicted_s": predicted, "chosen": recorded_algorithm(made),
        "wall_s": time.perf_counter() - t0,
        "simulation_wall_s": sum(r.wall_s for r in runs),
        "simulation_cpu_s": sum(r.cpu_s for r in runs),
        "messages": sum(r.messages for r in runs), "plan": doc,
        "software_costs": {"per_message_s": costs.per_message_s,
                           "recv_s_per_byte": costs.recv_s_per_byte},
        "simgrid_config": list(simgrid_config), "window": window,
        "pace_factor": engine_params.pace_factor}
    if first["probed"] is not None:
        out["probed_topology"] = first["probed"]
    return out


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _given_plan(path: str) -> Plan:
    """A plan JSON file: ``horotopo plan --json`` or ``-o``, or a simulation's ``--json``."""
    try:
        doc = json.loads(Path(path).read_text())
        return Plan.from_json(doc["plan"] if "rows" in doc else doc)
    except OSError as exc:
        raise CommandError(f"--plan {path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CommandError(f"--plan {path}: not valid JSON: {exc.msg} at line {exc.lineno}") \
            from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandError(f"--plan {path}: not a plan: {exc}") from None


def run(args: argparse.Namespace) -> int:
    topology = resolve(args.topology, args.ranks)
    given = _given_plan(args.plan) if args.plan else None
    from ..transport.simulated import SimulatorMissing

    try:
        profile, source = (cost_profiles.from_settings() if args.costs is None
                           else (cost_profiles.load(args.costs), f"--costs {args.costs}"))
    except cost_profiles.CostsError as exc:
        raise CommandError(str(exc)) from None
    _say(f"simulating {topology.name!r}: {plural(topology.n, 'rank')}, "
         f"{format_size(args.size)}, probe {args.probe}")
    try:
        res = simulate(topology, args.size, args.probe, progress=_say,
                       algorithms=args.algorithms, plan=given, chunk_bytes=args.chunk,
                       software_costs=args.software_costs, simgrid_config=args.simgrid_cfg,
                       max_host_trees=args.max_host_trees, window=args.window,
                       ranks_are=args.ranks_are, cuda_aware=args.cuda_aware == "yes",
                       profile=profile, profile_source=source)
    except (SimulatorMissing, ValueError) as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(json.dumps(res))
        return 0
    probe = ("" if res["probe_simulated_s"] is None
             else f"probe ({res['probe']}, simulated): {res['probe_simulated_s']:.3f} s; ")
    planner = ("given (--plan)" if res["planner_s"] is None
               else f"{res['planner_s']:.2f} s")
    print(f"{probe}init (simulated): {res['init_simulated_s'] * 1e3:.2f} ms; planner (this "
          f"machine): {planner}; simulation took {res['wall_s']:.1f} s wall "
          f"({res['simulation_cpu_s']:.1f} s CPU), {plural(res['messages'], 'message')}")
    if not args.software_costs:
        print("software costs: none (--no-software-costs: the network alone)")
    else:
        per = res["software_costs"]
        staged = ("" if args.ranks_are == "cpu" else
                  ", CUDA-aware MPI" if args.cuda_aware == "yes" else ", staged through the host")
        print(f"software costs ({args.ranks_are} ranks{staged}, from {source}): "
              f"{per['per_message_s'] * 1e6:.2f} us per message, "
              f"{per['recv_s_per_byte'] * 1e9:.3g} ns per received byte")
    if args.simgrid_cfg:
        print(f"SimGrid settings over the network model: {' '.join(args.simgrid_cfg)}")
    if args.window is not None:
        print(f"engine window: {plural(args.window, 'chunk')} for every algorithm (--window)")
    if res["optimum_s"] is not None:
        print(f"model optimum: {res['optimum_s'] * 1e6:.1f} us (the packing's certified "
              f"upper bound {res['upper_bound_Bps'] / 1e6:.3f} MB/s)")
    print(f"horotopo runs {res['chosen']} (the plan's choice; marked *)")
    print(f"{'algorithm':>13} {'size':>12} {'time(us)':>12} {'predicted(us)':>14} "
          f"{'time/pred':>9} {'algbw':>8} {'busbw':>8} {'#wrong':>6}")
    for r in res["rows"]:
        pred, ratio = "-", "-"
        if r["predicted_s"]:
            pred = f"{r['predicted_s'] * 1e6:.1f}"
            ratio = f"{r['time_s'] / r['predicted_s']:.2f}"
        name = r["algorithm"] + ("*" if r["algorithm"] == res["chosen"] else "")
        print(f"{name:>13} {r['size']:>12} {r['time_s'] * 1e6:>12.1f} {pred:>14} {ratio:>9} "
              f"{r['algbw_GBps']:>8.3f} {r['busbw_GBps']:>8.3f} {r['wrong']:>6}")
    return 0
