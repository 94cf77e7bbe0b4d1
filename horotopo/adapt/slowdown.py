"""A link slowdown in the middle of a simulated job: the adaptive engine detects it, re-probes,
re-plans, and the re-plan is judged against plans made for the slowed network.

Every rank is a SimGrid actor running horotopo's own code (:mod:`horotopo.simulation`), in one
simulation:

1. a starting plan: as ``hvd.init()`` makes it (``init="probe"``: every rank runs the quick
   probe by hosts on the healthy network, rank 0 plans the measured topology over hosts and
   shares it), or the plan of the declared topology (``init="declared"``). Either starts an
   :class:`~horotopo.adapt.AdaptiveEngine` on every rank with that model (no watchdog, which
   is a wall-clock thread);
2. ``calls`` allreduces of ``size`` bytes; before call ``degrade_at`` the ranks meet at a
   barrier and rank 0 sets ``links`` to ``factor`` of their rate
   (:func:`horotopo.simulation.platform.set_link_rate`); the engine detects the slowdown from
   its own call times, re-probes its suspect links, lowers the capacities they blame in its
   model and re-plans over hosts, all inside the simulation; the new plan is on trial for its
   first ``trial`` calls (:mod:`horotopo.adapt.trial`);
3. then, on the slowed network, the comparison plans, each timed for ``fresh_calls`` calls on
   an engine that does not re-plan: a *fresh* plan (a new quick probe, planned over hosts), the
   declared topology's plan with the links truly slowed (``reference``), and that topology's
   flat plan (``flat_reference``).

Times are simulated seconds (the slowest rank's time per call, as the engine agrees it); the
planner runs for real on rank 0 and costs no simulated time. ``benchmarks/adapt_sim.py`` is the
command line over this module.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import config
from ..plan import Plan, make_plan
from ..planning_protocol import share_plan
from ..probe import probe
from ..probe.hostinfer import generated_hosts
from ..schedule import window_for
from ..simulation.platform import set_link_rate
from ..simulation.runner import run_simulated
from ..topology import Topology, from_dict
from .policy import topology_with_capacities
from .runtime import AdaptiveEngine

__all__ = ["SlowdownScenario", "slowed", "run_slowdown", "summarize_slowdown",
           "series_lines"]


@dataclass(frozen=True)
class SlowdownScenario:
    """What the simulated job does and how the adaptive engine is set (module docstring).

    Attributes
    ----------
    size, chunk : int
        Bytes per allreduce call, and the full-size chunk of every plan of the run.
    links : tuple of str
        The topology's resources that slow down.
    factor : float
        The fraction of their rate the slowed links keep.
    calls, degrade_at : int
        Allreduce calls of the adaptive run; the links slow down before call ``degrade_at``.
    fresh_calls : int
        Timed calls of each comparison plan.
    init : {"probe", "declared"}
        The starting model: the quick probe's (as ``hvd.init``) or the declared topology.
    fresh, reference, flat_reference : bool
        Which comparison plans to time (module docstring, step 3).
    threshold, consecutive, warmup, trial : float, int, int, int
        The adaptive engine's detector and trial (:class:`~horotopo.adapt.AdaptiveEngine`).
    tolerance : float
        The recovered time may exceed the fresh plan's (without one: the declared slowed
        topology's plan's) by this fraction.
    forest : {"auto", "deep", "hosts"}
        The forest of every plan of the run (``make_plan``'s; a forced forest is forced again
        in the engine's re-plan).
    max_host_trees : int or None
        A bound on a host forest's host-level trees in every plan of the run.
    max_wall_s : float
        Wall-clock limit of the simulation, seconds.
    """

    size: int = 64 << 20
    chunk: int = 1 << 20
    links: Tuple[str, ...] = ("tor1->spine", "spine->tor1")
    factor: float = 0.25
    calls: int = 12
    degrade_at: int = 4
    fresh_calls: int = 3
    init: str = "probe"
    fresh: bool = True
    reference: bool = True
    flat_reference: bool = False
    threshold: float = 0.3
    consecutive: int = 3
    warmup: int = 3
    trial: int = 3
    tolerance: float = 0.15
    forest: str = "auto"
    max_host_trees: Optional[int] = None
    max_wall_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.factor <= 1 or not 0 < self.degrade_at < self.calls:
            raise ValueError("need 0 < factor <= 1 and 0 < degrade_at < calls, got factor "
                             f"{self.factor}, degrade_at {self.degrade_at}, calls {self.calls}")
        if self.max_host_trees is not None and self.max_host_trees < 1:
            raise ValueError(f"max_host_trees: need at least 1, got {self.max_host_trees}")
        if self.init not in ("probe", "declared"):
            raise ValueError(f"init: 'probe' or 'declared', got {self.init!r}")


def slowed(topology: Topology, links: Sequence[str], factor: float) -> Topology:
    """``topology`` with the resources named in ``links`` at ``factor`` of their rate.

    Raises
    ------
    ValueError
        A name that is no resource of ``topology``.
    """
    caps = list(topology.capacity_Bps)
    for name in links:
        if name not in topology.resources:
            raise ValueError(f"{topology.name} has no resource {name!r} (e.g. "
                             f"{', '.join(r for r in topology.resources if 'spine' in r)[:200]})")
        caps[topology.resources.index(name)] *= factor
    return topology_with_capacities(topology, caps)


def run_slowdown(topology: Topology, scenario: SlowdownScenario, *, elements: int,
                 planner: Optional[Callable[[Topology], Plan]] = None,
                 log: Callable[[str], None] = lambda line: None) -> Dict[str, Any]:
    """Simulate ``scenario`` on ``topology``; rank 0's record plus the run's wall figures.

    ``elements`` float32 elements a rank really reduces per call; the rest of ``size`` is
    simulated by scaling each message. ``planner`` replaces the adaptive engine's re-planner
    (a plan known to be worse, for instance). ``log`` gets one line per call on rank 0.
    """
    sc = scenario
    topo, n = topology, topology.n
    scale = sc.size / (elements * 4)
    engine_kw: Dict[str, Any] = {"chunk_bytes": max(4, int(sc.chunk / scale) // 4 * 4)}
    w0, c0 = time.perf_counter(), time.process_time()
    # Every plan of the run for the size it is timed at (the forest and chunks are chosen for
    # it), with the forest and the bound on host trees asked for (recorded in each plan, so the
    # engine's re-plans keep them).
    plan_kw: Dict[str, Any] = {"chunk_bytes": sc.chunk, "size": sc.size, "forest": sc.forest,
                               "max_host_trees": sc.max_host_trees}
    declared = make_plan(topo, hierarchy="on", **plan_kw)
    # each plan's automatic window at the full-size chunk (the scaled chunk would give
    # another), re-plans included: it depends on the plan's trees
    engine_kw["window"] = lambda plan: window_for(sc.chunk, len(plan.trees))
    planner_s = (time.perf_counter() - w0, time.process_time() - c0)
    log(f"{topo.name}: {n} ranks, plan over hosts in {planner_s[0]:.1f} s "
        f"({len(declared.trees)} trees, model {declared.throughput_Bps * 8e-9:.2f} gbps)")
    links = list(sc.links)
    truth = slowed(topo, links, sc.factor)
    reference = make_plan(truth, hierarchy="on", **plan_kw) if sc.reference else None
    flat = make_plan(
        truth, hierarchy="off", **dict(plan_kw, forest="auto" if sc.forest == "hosts"
                                       else sc.forest)) if sc.flat_reference else None
    hosts = generated_hosts(topo.to_json())
    want = np.float32(n * (n - 1) / 2)

    def calls(eng: AdaptiveEngine, x: np.ndarray, k: int) -> List[float]:
        out = []
        for _ in range(k):
            got = eng.allreduce(x, algorithm="tree")
            out.append(eng.last_seconds if np.array_equal(got, np.full_like(x, want))
                       else -1.0)  # a negative time marks a wrong result
        return out

    def probed_plan(t: Any, label: str) -> Tuple[Plan, Topology, float]:
        """Every rank probes (quick, by hosts), rank 0 plans over hosts; shared."""
        t.barrier()
        p0 = t.now()
        with t.true_size():  # the probe's transfers are sized to be timed, not scaled
            doc = probe(t, "quick", name=f"probed-{topo.name}-{label}", hosts=hosts)
        probe_s = t.now() - p0

        def build() -> Any:
            measured = from_dict(doc)
            return make_plan(measured, hierarchy="on", **plan_kw), measured

        plan, model = share_plan(t, build, what=f"the {label} plan")
        return plan, model, probe_s

    def body(t: Any) -> Optional[Dict[str, Any]]:
        x = np.full(elements, t.rank, np.float32)
        plan0, model0, init_probe_s = declared, topo, None
        if sc.init == "probe":
            plan0, model0, init_probe_s = probed_plan(t, "init")
        eng = AdaptiveEngine(t, plan0, model0, timeout_s=0, threshold=sc.threshold,
                             consecutive=sc.consecutive, warmup=sc.warmup,
                             trial=sc.trial, planner=planner, **engine_kw)
        series: List[Dict[str, Any]] = []
        degraded_at = None
        for step in range(sc.calls):
            if step == sc.degrade_at:
                t.barrier()  # no call in flight: the slowdown starts between two calls
                if t.rank == 0:
                    for name in links:
                        r = topo.resources.index(name)
                        set_link_rate(t, topo, r, topo.capacity_Bps[r] * sc.factor)
                degraded_at = t.now()
            before, ran = len(eng.events), eng.plan.digest[:8]
            [sec] = calls(eng, x, 1)
            verdict = [e.kept for e in eng.events if e.decided_step == eng.step]
            series.append({"step": step, "seconds": sec, "plan": ran,  # the plan it ran
                           "replanned": len(eng.events) > before,
                           "verdict": verdict[0] if verdict else None,
                           "phase": "before" if degraded_at is None else "slowed"})
            if t.rank == 0:
                log(f"call {step}: {sec * 1e3:.1f} ms simulated, plan {eng.plan.digest[:8]}"
                    f"{', re-planned after it' if series[-1]['replanned'] else ''} "
                    f"({time.perf_counter() - w0:.0f} s wall so far)")
        events = [dict(vars(e)) for e in eng.events]
        final_digest = eng.plan.digest[:8]
        eng.close()
        model = (eng.topology.capacity_Bps if eng.topology is not None else None)
        final = eng.topology.name if eng.topology is not None else None
        # what the re-plan lowered in the model (same resources: only capacities change)
        lowered = [] if eng.topology is None else [
            [name, a * 8e-9, b * 8e-9] for name, a, b in zip(
                model0.resources, model0.capacity_Bps, eng.topology.capacity_Bps) if b != a]
        fresh: List[float] = []
        probe_s, fresh_plan, fresh_model = None, None, None
        if sc.fresh:
            fresh_plan, fresh_model, probe_s = probed_plan(t, "fresh")
            with AdaptiveEngine(t, fresh_plan, adapt=False, timeout_s=0, **engine_kw) as plain:
                fresh = calls(plain, x, sc.fresh_calls)
        ref: List[float] = []
        if reference is not None:
            with AdaptiveEngine(t, reference, adapt=False, timeout_s=0, **engine_kw) as plain:
                ref = calls(plain, x, sc.fresh_calls)
        flat_s: List[float] = []
        if flat is not None:
            with AdaptiveEngine(t, flat, adapt=False, timeout_s=0, **engine_kw) as plain:
                flat_s = calls(plain, x, sc.fresh_calls)
        if t.rank != 0:
            return None
        return {"series": series, "events": events, "degraded_at_s": degraded_at,
                "fresh_s": fresh, "reference_s": ref, "flat_reference_s": flat_s,
                "fresh_probe_s": probe_s,
                "fresh_digest": fresh_plan.digest if fresh_plan else None,
                # the plans and models compared, for offline study
                "plans": {"first": plan0.to_json(), "final": eng.plan.to_json(),
                          "fresh": fresh_plan.to_json() if fresh_plan else None},
                "models": {"first": model0.to_json(), "final": eng.topology.to_json()
                           if eng.topology is not None else None,
                           "fresh": fresh_model.to_json() if fresh_model else None},
                "fresh_model_Bps": fresh_plan.throughput_Bps if fresh_plan else None,
                "final_model_Bps": model, "final_digest": final_digest, "final_model": final,
                "init": sc.init,
                "lowered_gbps": lowered,
                "init_probe_s": init_probe_s, "plan_digest": plan0.digest,
                "plan_model_Bps": plan0.throughput_Bps}

    sim = run_simulated(topo, body, scale=scale, timeout_s=sc.max_wall_s)
    res = sim.results[0]
    res.update({"topology": topo.name, "ranks": n, "hosts": len(set(hosts)), "size": sc.size,
                "chunk": sc.chunk, "forest": sc.forest,
                "max_host_trees": sc.max_host_trees or config.planner_params().max_host_trees,
                "links": links, "factor": sc.factor,
                "reference_model_Bps": reference.throughput_Bps if reference else None,
                "flat_reference_model_Bps": flat.throughput_Bps if flat else None,
                "planner_wall_s": planner_s[0], "planner_cpu_s": planner_s[1],
                "simulation_wall_s": sim.wall_s, "simulation_cpu_s": sim.cpu_s,
                "messages": sim.messages})
    return res


def summarize_slowdown(res: Dict[str, Any], tolerance: float, skip: int = 1) -> Dict[str, Any]:
    """Medians per phase and the verdict ``ok`` of a :func:`run_slowdown` record.

    ``ok`` holds when no result was wrong, the job re-planned after the slowdown and not
    before, and the time of the plan it ended with is at most ``1 + tolerance`` times the
    fresh plan's (without one, the declared slowed topology's plan's). Pure: it also serves
    made-up series.
    """
    series = res["series"]
    med = (lambda v: statistics.median(v) if v else float("nan"))  # noqa: E731
    switch = [s["step"] for s in series if s["replanned"] and s["phase"] == "slowed"]
    early = [s["step"] for s in series if s["replanned"] and s["phase"] == "before"]
    first_slow = min((s["step"] for s in series if s["phase"] == "slowed"), default=None)
    before = [s["seconds"] for s in series if s["phase"] == "before"][skip:]
    during = [s["seconds"] for s in series if s["phase"] == "slowed"
              and (not switch or s["step"] <= switch[0])]
    # the plan the job ended with, after the re-plan (the old one again if the trial failed)
    after = [s["seconds"] for s in series if switch and s["step"] > switch[0]
             and s["plan"] == res.get("final_digest", series[-1]["plan"])]
    verdicts = [s["verdict"] for s in series if s.get("verdict") is not None]
    rejected = [s["seconds"] for s in series if switch and s["step"] > switch[0]
                and s["plan"] != series[switch[0]]["plan"] and verdicts and not verdicts[0]]
    fresh, ref = med(res["fresh_s"]), med(res["reference_s"])
    rec = med(after)
    event = next((e for e in res["events"] if switch and e["step"] == switch[0] + 1), None)
    wrong = sum(1 for v in [s["seconds"] for s in series] + res["fresh_s"] + res["reference_s"]
                + res.get("flat_reference_s", []) if v < 0)
    ratio = rec / fresh if after and fresh > 0 else float("nan")
    versus = ratio if res["fresh_s"] else rec / ref if after and ref > 0 else float("nan")
    out = {"before_s": med(before), "slowed_s": med(during), "recovered_s": rec,
           "fresh_s": fresh, "reference_s": ref,
           "flat_reference_s": med(res.get("flat_reference_s", [])),
           "recovered_over_fresh": ratio,
           "recovered_over_reference": rec / ref if after and ref > 0 else float("nan"),
           "calls_to_detect": (switch[0] - first_slow + 1) if switch else None,
           "detect_delay_s": (event["at_s"] - res["degraded_at_s"]) if event else None,
           "replan_s": event["seconds"] if event else None,
           "reprobe_s": event["probe_s"] if event else None,
           "reprobed_pairs": len(event["suspects"]) if event else None,
           "fresh_probe_s": res["fresh_probe_s"], "wrong": wrong,
           "trial_kept": verdicts[0] if verdicts else None,
           "rejected_plan_s": med(rejected) if rejected else None,
           "replans_before": len(early)}
    out["ok"] = bool(wrong == 0 and switch and not early and event and event["switched"]
                     and versus <= 1.0 + tolerance)
    return out


def series_lines(res: Dict[str, Any]) -> List[str]:
    """The time series (one line per call, simulated ms) and the re-plan events, as text."""
    marks = {s["step"]: "re-plan after this call" for s in res["series"] if s["replanned"]}
    marks.update({s["step"]: "trial over: " + ("new plan kept" if s["verdict"] else
                                               "back to the old plan")
                  for s in res["series"] if s.get("verdict") is not None})
    lines = ["call  phase    plan        ms (simulated)"]
    lines += [f"{s['step']:>4}  {s['phase']:<7}  {s['plan']}  {s['seconds'] * 1e3:>10.2f}  "
              f"{marks.get(s['step'], '')}".rstrip() for s in res["series"]]
    for e in res["events"]:
        lines.append(
            f"re-plan at {e['at_s']:.3f} s (after call {e['step'] - 1}), {e['reason']}: "
            f"{len(e['suspects'])} host pairs re-probed in {e['probe_s'] * 1e3:.0f} ms, model "
            f"{e['old_model_Bps'] * 8e-9:.3f} -> {e['new_model_Bps'] * 8e-9:.3f} gbps, "
            f"{e['seconds'] * 1e3:.0f} ms in all {e['note']}".rstrip()
            + ("" if e.get("kept") is None else
               f"; trial: new/old time {e['trial_new'] / e['trial_old']:.3f}"))
    return lines
