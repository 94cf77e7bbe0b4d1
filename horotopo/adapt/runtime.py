"""The adaptive layer around the Engine: monitor, detect, re-plan, switch at a step boundary.

:class:`AdaptiveEngine` owns an :class:`~horotopo.engine.Engine` that runs over a
:class:`~horotopo.reliability.TrackedTransport`. Per allreduce it:

1. runs the call under the watchdog (a dead or hung peer aborts the job, naming the ranks);
2. reads the in-band figures: per destination, the bytes this rank's sends carried and the
   seconds a send was outstanding (no extra traffic);
3. agrees the call's time with the other ranks (one 8-byte max-allreduce; the slowest rank's
   time is the collective's time) and records it in the self-tuner
   (:class:`~horotopo.adapt.tuner.SelfTuner`), whose selector and detector read the same
   record, so every rank takes the same decisions at the same call;
4. on a detection, re-plans collectively (:meth:`AdaptiveEngine.replan`): rank 0 gathers the
   ranks' in-band rates and picks the suspect pairs, at host level (one rank pair per pair of
   machines, :func:`~horotopo.adapt.policy.host_pairs`), all ranks re-probe just those pairs,
   rank 0 lowers the blamed capacities of its model and plans again (over hosts when the
   current plan was, :mod:`horotopo.packing.hierarchy`), and
   :func:`~horotopo.planning_protocol.share_plan` gives every rank the Plan (digests checked);
   every rank then builds the new Engine before the next call starts. So the switch happens
   between two calls, at the same call on every rank, and no allreduce ever mixes two plans;
5. on trial (:mod:`~horotopo.adapt.trial`): the new plan's first ``trial`` calls are timed
   against the old plan's slow run; unless the new plan was faster, every rank goes back to
   the old plan (rank 0's verdict from the agreed times, broadcast) and keeps the refreshed
   model. A re-plan is a prediction, and a wrong one must not make the job slower.

Every exchange goes through the transport's collective steps, with deadlines that name the
ranks missing (:class:`~horotopo.transport.base.TransportTimeout`); nothing here touches MPI.
Times are read on the transport's clock (:meth:`~horotopo.transport.base.Transport.now`:
``time.perf_counter`` over MPI, simulated seconds over the simulated transport), so the same
detector runs a job on a simulated cluster (``benchmarks/adapt_sim.py``; give it
``timeout_s=0`` there, the watchdog being a wall-clock thread).

:meth:`AdaptiveEngine.retune` re-probes the whole network (the ``quick`` probe) and re-plans:
what ``horotopo.retune()`` should call.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from .. import config
from ..params import ADAPT, RELIABILITY, AdaptParams, EngineParams
from ..algorithms.choice import forest_predictor
from ..algorithms.cost import TREE, Selector, TopologySide, agree_max
from ..engine import Engine
from ..packing.hierarchy import machines
from ..plan import Plan, make_plan
from ..planning_protocol import share_plan
from ..reliability import TrackedTransport, Watchdog, timeout_from_env
from ..reliability.liveness import verdict
from ..topology import Topology, from_dict
from ..transport.base import Transport
from .policy import (Detector, host_pairs, plan_arcs, refresh_capacities, split_pairs,
                     suspects, topology_with_capacities)
from .reprobe import probe_pairs, true_size
from .trial import Trial
from .tuner import SelfTuner

__all__ = ["AdaptiveEngine", "ReplanEvent", "ReplanError", "retune", "RUNTIME_DEFAULTS",
           "slowdown_notice"]

log = logging.getLogger("horotopo")

#: What the hvd runtime adds to the AdaptiveEngine's defaults: a slow run must also last
#: :attr:`AdaptParams.runtime_min_slow_s <horotopo.params.AdaptParams.runtime_min_slow_s>`.
RUNTIME_DEFAULTS: Dict[str, Any] = {"min_slow_s": ADAPT.runtime_min_slow_s}


class ReplanError(RuntimeError):
    """A re-plan failed on every rank: rank 0 could not plan, the ranks did not answer in
    time, or their plans differ (the text says which, the same on every rank but a timeout)."""


@dataclass
class ReplanEvent:
    """One re-plan: at which call, why, what was measured and what changed."""

    step: int
    reason: str
    old_digest: str
    new_digest: str
    suspects: List[Tuple[int, int]] = field(default_factory=list)
    probed_gbps: Dict[str, float] = field(default_factory=dict)
    old_model_Bps: float = 0.0
    new_model_Bps: float = 0.0
    seconds: float = 0.0
    note: str = ""
    switched: bool = False  # a new Engine was installed (its plan may equal the old one)
    at_s: float = 0.0  # the transport's clock when the re-plan started
    probe_s: float = 0.0  # of ``seconds``, the re-probe's
    kept: Optional[bool] = None  # the trial's verdict (None: no trial, or not over yet)
    trial_old: float = 0.0  # old plan's median time over its own prediction (slow run)
    trial_new: float = 0.0  # the same for the new plan's trial calls
    decided_step: int = -1  # the call after which the trial's verdict was applied


class AdaptiveEngine:
    """An Engine that re-plans when its transfers stay slower than its plan (module docstring).

    Parameters
    ----------
    comm : Transport or mpi4py.MPI.Comm
        The ranks. A transport stays the caller's; a communicator is opened as an
        :class:`~horotopo.transport.mpi.MPITransport` (a ``Dup``) that :meth:`close` frees.
        The engine's traffic and the control exchanges share it (tags come in blocks that every
        rank allocates in the same order).
    plan : Plan
        The starting plan (every rank passes the same one).
    topology : Topology, optional
        The model ``plan`` came from (what rank 0 refreshes). Without one, a detection runs
        the full quick probe instead (:meth:`retune`).
    params : AdaptParams, optional
        The detector's, the re-probe's and the trial's parameters; default the environment's
        (:func:`horotopo.config.adapt_params`: the defaults of :class:`horotopo.params.AdaptParams`
        with the ``HOROTOPO_ADAPT_*`` variables applied).
    threshold, consecutive, warmup, min_seconds : optional
        Override the fields of ``params`` of the same names (see
        :class:`~horotopo.adapt.policy.Detector`).
    max_suspects : int, optional
        Pairs re-probed per re-plan, at most one per pair of machines (default: the number
        of machines of ``topology``, or of ranks without one: linear in the hosts).
    timeout_s : float, optional
        The watchdog's deadline per call (default ``HOROTOPO_TIMEOUT_S`` or 60 s); ``0``
        turns the watchdog off. Also the deadline of the re-plan's exchanges (60 s without a
        watchdog).
    planner : callable, optional
        ``Topology -> Plan``, run on rank 0 (default :func:`horotopo.plan.make_plan` at the
        current plan's chunk size, over hosts when the current plan is hierarchical).
    adapt : bool
        False monitors only (never re-plans on its own; :meth:`replan` still works).
    calibrate_s : float
        Seconds the start may spend timing the tree and MPI_Allreduce on these ranks
        (:meth:`horotopo.engine.Engine.calibrate`, collective); 0 starts the choice from the
        engine's cost model as given.
    min_slow_s : float, optional
        Seconds a slow run must last before it triggers a re-plan
        (:class:`~horotopo.adapt.policy.Detector`); overrides ``params.min_slow_s``.
    trial : int, optional
        Tree calls the new plan of a re-plan is timed for before it is kept; unless it ran
        faster than the old plan's slow run, the ranks go back to the old plan (with the
        refreshed model, and a doubled back-off of the detector). 0 keeps every re-plan.
        Overrides ``params.trial_calls``.
    engine_params : EngineParams, optional
        The engine's parameters (:class:`~horotopo.engine.Engine`'s ``params``), for this
        engine and every engine a re-plan starts.
    liveness : LivenessResponder, optional
        Where the watchdog asks which ranks are stopped or dead before it aborts
        (:func:`~horotopo.reliability.liveness.verdict`), so that it blames those and not the
        ranks this one happened to wait for; without it, the message says whom it waited for.

    Calls that leave ``algorithm`` to the engine get it from the self-tuner
    (:class:`~horotopo.adapt.tuner.SelfTuner`): the calibrated model, refined per size from the
    agreed times of the job's own calls, which the contention detector reads too. Every input
    is agreed (the call's size by the engine's metadata check, its time by a max-allreduce),
    so every rank chooses the same algorithm at the same call without sending the choice.
    Where the plan records a peer algorithm (``plan.planner["algorithm"]``), that peer is
    what calibration times, what runs for "tree", and what the record and the detector watch.
    """

    def __init__(self, comm: Any, plan: Plan, topology: Optional[Topology] = None, *,
                 params: Optional[AdaptParams] = None,
                 threshold: Optional[float] = None, consecutive: Optional[int] = None,
                 warmup: Optional[int] = None, min_seconds: Optional[float] = None,
                 max_suspects: Optional[int] = None,
                 timeout_s: Optional[float] = None,
                 planner: Optional[Callable[[Topology], Plan]] = None,
                 adapt: bool = True, calibrate_s: float = 0.0,
                 min_slow_s: Optional[float] = None, trial: Optional[int] = None,
                 liveness: Any = None, engine_params: Optional[EngineParams] = None,
                 **engine_kwargs: Any) -> None:
        overrides = {"threshold": threshold, "consecutive": consecutive, "warmup": warmup,
                     "min_seconds": min_seconds, "min_slow_s": min_slow_s,
                     "trial_calls": trial}
        self.params = replace(config.adapt_params() if params is None else params,
                              **{k: v for k, v in overrides.items() if v is not None})
        p = self.params
        if isinstance(comm, Transport):
            transport, owns = comm, False
        else:
            from ..transport import as_transport  # the MPI door, opened only for a communicator

            transport, owns = as_transport(comm), True
        # The transport's clock: a simulated transport's sends take simulated seconds.
        self.tracked = TrackedTransport(
            transport, owns=owns, clock=transport.now,
            control_p2p_max_ranks=config.runtime_params().control_p2p_max_ranks)
        self.rank, self.size = self.tracked.rank, self.tracked.size
        self.topology = topology
        self.max_suspects = int(max_suspects or (len(set(machines(topology)))
                                                 if topology is not None else self.size))
        self.planner = planner
        self.adapt = adapt
        self.trial_calls = int(p.trial_calls)
        self.trial: Optional[Trial] = None  # the re-plan on trial, if any
        self._trial_event: Optional[ReplanEvent] = None
        if engine_params is not None:
            engine_kwargs = dict(engine_kwargs, params=engine_params)
        self._engine_kwargs = engine_kwargs
        #: What every allreduce left to the engine runs instead of the selector's choice:
        #: ``hierarchical`` under HOROVOD_HIERARCHICAL_ALLREDUCE, as in Horovod; else None.
        self.forced_allreduce: Optional[str] = (
            "hierarchical" if config.get("HOROVOD_HIERARCHICAL_ALLREDUCE") else None)
        self.step = 0
        self.last_seconds = 0.0  # the agreed (slowest rank's) time of the last monitored call
        self._last_call = (0, 0.0, 0.0)  # (bytes, predicted s, agreed s) of the last tree call
        #: The sustained slowdown that no plan could help, in words, once told (every rank
        #: keeps it; rank 0 logs it); cleared when a re-plan is kept.
        self.slowdown: Optional[str] = None
        self.events: List[ReplanEvent] = []
        timeout = timeout_from_env() if timeout_s is None else float(timeout_s)
        self.exchange_timeout_s = timeout if timeout > 0 else RELIABILITY.exchange_timeout_s
        describe = self.tracked.describe_wait
        if liveness is not None:
            def describe() -> str:
                return verdict(liveness, self.tracked.describe_wait())
        self.watchdog = Watchdog(timeout, describe=describe) if timeout > 0 else None
        self.engine = self._guarded("the adaptive engine's start",
                                    lambda: Engine(self.tracked, plan, topology=topology,
                                                   **engine_kwargs))
        if calibrate_s > 0 and self.size > 1:
            self._guarded("the engine's calibration",
                          lambda: self.engine.calibrate(budget_s=float(calibrate_s)))
        self.tuner = SelfTuner(self.engine.cost_model.with_(side=self._watched(self.engine)), p)
        self._reset_windows()
        self.algorithms: Dict[str, int] = {}  # calls per algorithm run

    @property
    def cost_model(self) -> Any:
        """The model the selector starts from (calibrated when ``calibrate_s`` was given)."""
        return self.tuner.model

    @property
    def selector(self) -> Selector:
        """The self-tuner's tree-or-library choice."""
        return self.tuner.selector

    @property
    def detector(self) -> Detector:
        """The self-tuner's contention detector."""
        return self.tuner.detector

    # -------------------------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self.engine.plan

    def allreduce(self, sendbuf: Any, recvbuf: Any = None, **kwargs: Any) -> Any:
        """:meth:`horotopo.engine.Engine.allreduce`, monitored; may switch plans *after* it."""
        nbytes = _nbytes(sendbuf)
        saved = None
        if kwargs.get("algorithm") is None and self.forced_allreduce is not None:
            kwargs["algorithm"] = self.forced_allreduce
        elif kwargs.get("algorithm") is None and self.size > 1:
            saved = self.selector.snapshot()
            kwargs["algorithm"] = self.tuner.choose(self.plan, nbytes, self.engine.chunk_bytes)
        t0 = self.tracked.now()
        try:
            out = self._guarded(f"allreduce #{self.step} ({nbytes} bytes, plan "
                                f"{self.plan.digest[:8]})",
                                lambda: self.engine.allreduce(sendbuf, recvbuf, **kwargs))
        except Exception:
            if saved is not None:
                # The call raised on every rank (the metadata check): take the choice back so
                # the selectors stay equal even if ranks passed different sizes.
                self.selector.restore(saved)
            raise
        elapsed = self.tracked.now() - t0
        self._after(nbytes, elapsed)
        return out

    def broadcast(self, buf: Any, root: int) -> Any:
        """:meth:`horotopo.engine.Engine.broadcast` under the watchdog (not monitored)."""
        out = self._guarded(f"broadcast from {root}", lambda: self.engine.broadcast(buf, root))
        self.tracked.take_link_stats()
        return out

    def close(self) -> None:
        """Stop the watchdog; close the engine, and the transport when this engine opened it."""
        if self.watchdog is not None:
            self.watchdog.close()
        self.engine.close()
        self.tracked.close()

    def __enter__(self) -> "AdaptiveEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------------------------
    def _guarded(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.watchdog is None:
            return fn()
        with self.watchdog.guard(what):
            return fn()

    def _reset_windows(self) -> None:
        n = self.size
        self._base_bytes = np.zeros(n)
        self._base_busy = np.zeros(n)
        self._recent: Deque[Tuple[np.ndarray, np.ndarray]] = deque(
            maxlen=self.detector.consecutive)
        # The current plan's timed tree calls (bytes, agreed seconds): a trial's yardstick.
        self._timed: Deque[Tuple[int, float]] = deque(
            maxlen=self.detector.consecutive * self.detector.max_backoff)

    def _after(self, nbytes: int, elapsed: float) -> None:
        """Book-keeping between calls: in-band figures, the agreed time, the decision."""
        self.step += 1
        sent, busy = self.tracked.take_link_stats()
        row = (np.asarray(sent, dtype=float), np.asarray(busy, dtype=float))
        alg = self.engine.last_algorithm or "?"
        self.algorithms[alg] = self.algorithms.get(alg, 0) + 1
        if self.size == 1:
            return
        # Calls the record predicts (the topology side, whichever algorithm the plan records,
        # the plan's trees or ring when forced) feed the selector and the detector; MPI calls
        # only the selector, and only when large enough to say something about bandwidth (the
        # decision is agreed, so every rank makes the same number of these allreduces).
        if not self.tuner.times(alg, nbytes):
            return
        self.last_seconds = agree_max(
            [elapsed], lambda v: self._guarded(
                f"the time agreement after allreduce #{self.step - 1}",
                lambda: self.tracked.inner.allreduce(v, v, "max")))[0]
        sample = self.tuner.observe(self.plan, alg, nbytes, self.last_seconds,
                                    self.engine.chunk_bytes)
        if sample is None or sample.predicted_s is None:
            return  # MPI's own algorithm: no topology model predicts it
        # A plan's trial times the plan on its topology side (forced trees count as well).
        if (alg in (TREE, self.tuner.topology_algorithm)
                and self.last_seconds >= self.detector.min_seconds):
            if self.trial is not None:
                if self.trial.add(nbytes, self.last_seconds) and not self._guarded(
                        f"the re-plan's trial after call {self.step - 1}", self._verdict):
                    return  # back on the old plan: this call says nothing about it
            else:
                self._timed.append((nbytes, self.last_seconds))
        if self.detector.baseline is None:
            self._base_bytes += row[0]
            self._base_busy += row[1]
        self._recent.append(row)
        self._last_call = (nbytes, sample.predicted_s, self.last_seconds)
        if not self.tuner.slowed(sample, alg):
            return
        if not self.adapt:
            self._tell_slowdown(None, "re-planning is off (HOROTOPO_ADAPT)")
            return
        event = self.replan(f"slower than the plan for {self.detector.needed} calls "
                            f"({self.detector.min_slow_s * self.detector.factor:g} s or more) "
                            f"in a row")
        if not event.switched:
            self._tell_slowdown(event, event.note)

    def _verdict(self) -> bool:
        """End the trial: rank 0's verdict from the agreed times, broadcast (so every rank
        keeps or reverts at the same call); on a revert, re-install the old plan. Collective."""
        trial, event = self.trial, self._trial_event
        assert trial is not None and event is not None
        self.trial = self._trial_event = None
        keep = self.tracked.inner.broadcast_object(
            trial.keep_new() if self.rank == 0 else None, 0, *self._exchange("trial verdict"))
        event.kept, event.decided_step = bool(keep), self.step
        event.trial_old, event.trial_new = trial.old_s, trial.new_s
        if keep:
            self.slowdown = None  # a faster plan: a later slowdown is news again
        else:
            self._tell_slowdown(event, f"the re-plan ran {trial.new_s / trial.old_s:.2f}x the "
                                       f"old plan's time on trial, so no plan is faster")
            factor = self.detector.factor
            self._install(trial.old_plan, self.topology)  # the refreshed model stays
            self.detector.factor = factor
            self.detector.backoff()  # the old plan's slowed speed is the new normal
            event.note = (f"{event.note}; the new plan ran {trial.new_s / trial.old_s:.3f}x "
                          f"the old plan's time on trial: back to the old plan").lstrip("; ")
        return bool(keep)

    def _tell_slowdown(self, event: Optional["ReplanEvent"], why: str) -> None:
        """Say once that calls stay slower than predicted and no plan helps: which link, the
        predicted and the observed time (rank 0 logs it; every rank keeps it)."""
        if self.slowdown is not None:
            return
        nbytes, predicted, observed = self._last_call
        self.slowdown = slowdown_notice(self.plan, self.topology, event, nbytes, predicted,
                                        observed, why)
        if self.rank == 0:
            log.warning("%s", self.slowdown)

    def _watched(self, engine: Engine) -> TopologySide:
        """What the record predicts and the detector watches on the topology side: the
        algorithm forced for every allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE), by its own
        model on this topology, where it is not the plan's; else ``engine``'s side (the plan's
        recorded algorithm, or its trees)."""
        forced = self.forced_allreduce
        if forced is None or forced == engine.topology_side.algorithm:
            return engine.topology_side
        return TopologySide(forced, engine.allreduce_algorithms.get(forced).candidate.predict,
                            self.topology, kept=engine.params.kept_predictions)

    def _install(self, plan: Plan, topology: Optional[Topology]) -> None:
        """Swap in the engine for ``plan`` (collective; the constructor checks the digest)."""
        new = Engine(self.tracked, plan, topology=topology, **self._engine_kwargs)
        old, self.engine = self.engine, new
        old.close()
        self.topology = topology
        # Another plan (perhaps recording another algorithm): the calibrated figures carry
        # over, its topology side's timings are still to be made.
        self.tuner.switched(self.tuner.model.with_(side=self._watched(new)))
        self._reset_windows()

    def _share_plan(self, topo: Optional[Topology]) -> Tuple[Plan, Optional[Topology]]:
        """Plan ``topo`` (given on rank 0 only) there, give every rank the Plan; collective."""
        # A plan made over hosts is re-made over hosts (else the default setting decides).
        over_hosts = "on" if self.plan.planner.get("model") == "hierarchical" else None
        # ... and for the size the plan was made for: the forest and its chunks are chosen for
        # it, and the planner's default (the fusion threshold) can pick another forest (at
        # 1024 ranks with 4 MiB chunks, 512 trees for 128 MiB where 64 MiB keeps 32).
        # A forest that was forced is forced again, and a bound on host trees kept, and the
        # planner parameters the plan was made with (the engine runs their windows).
        record = self.plan.planner.get("forest")
        record = record if isinstance(record, dict) else {}
        size = record.get("size")
        forest = str(record["chosen"]) if record.get("forced") else "auto"
        planner = self.planner or (lambda t: make_plan(
            t, chunk_bytes=self.plan.chunk_bytes, size=size, forest=forest,
            hierarchy=over_hosts, max_host_trees=record.get("max_host_trees"),
            params=self.plan.planner_params, predict=forest_predictor(t)))

        def build() -> Tuple[Plan, Optional[Topology]]:
            assert topo is not None  # share_plan calls build on rank 0, which has the model
            return planner(topo), topo

        return share_plan(self.tracked, build, what=f"re-plan at call {self.step}",
                          error=ReplanError, failure="rank 0 could not re-plan",
                          check_timeout_s=self.exchange_timeout_s)

    def _exchange(self, step: str) -> Tuple[float, str]:
        """The deadline and the name of one of the re-plan's exchanges (for its timeout)."""
        return self.exchange_timeout_s, f"re-plan at call {self.step}: {step}"

    # -------------------------------------------------------------------------------------
    def replan(self, reason: str = "explicit") -> ReplanEvent:
        """Refresh the model from in-band figures plus a targeted re-probe; switch plans.

        Collective: every rank calls it at the same point (the automatic path guarantees this).
        Returns the event (also appended to :attr:`events`).
        """
        return self._guarded(f"re-plan at call {self.step}", lambda: self._replan(reason))

    def _inband(self) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
        """Rank 0 gathers the in-band figures and picks the suspects at host level (on the
        other ranks: empty lists). Each rank sends only the peers it sent to (a plan's few
        arcs per rank, not ``4 n`` numbers: at 1024 ranks a dense exchange is 4 M values)."""
        recent_b = np.sum([r[0] for r in self._recent], axis=0) if self._recent else \
            np.zeros(self.size)
        recent_s = np.sum([r[1] for r in self._recent], axis=0) if self._recent else \
            np.zeros(self.size)
        cols = (self._base_bytes, self._base_busy, recent_b, recent_s)
        peers = np.flatnonzero(np.any([c != 0 for c in cols], axis=0))
        rows = self.tracked.gather_object(
            (peers.tolist(), [c[peers].tolist() for c in cols]), 0,
            *self._exchange("in-band rates"))
        if self.rank != 0:
            return [], []
        assert rows is not None
        mats = [np.zeros((self.size, self.size)) for _ in range(4)]
        for i, (js, vals) in enumerate(rows):
            for m, v in zip(mats, vals):
                m[i, js] = v
        sus, healthy = suspects(*mats, threshold=self.detector.threshold,
                                limit=self.size * self.size)
        if not sus:
            # No link fell more than the others in-band (sends that complete into socket
            # buffers hide a slow link): re-probe the plan's own arcs, most loaded first.
            sus = plan_arcs(self.plan)
        by_host = machines(self.topology) if self.topology is not None else range(self.size)
        return host_pairs(sus, by_host)[:self.max_suspects], healthy

    def _split(self, probed: Dict[Tuple[int, int], float]) -> List[Tuple[int, int]]:
        """Rank 0: the second round's pairs for the re-probed pairs found degraded."""
        assert self.topology is not None
        topo, floor = self.topology, 1.0 - self.detector.threshold
        bad = [p for p, v in probed.items() if v < floor * topo.pair_capacity_Bps(*p)]
        return split_pairs(topo, machines(topo), bad, list(probed))[:self.max_suspects]

    def _replan(self, reason: str) -> ReplanEvent:
        t0 = self.tracked.now()
        self.trial = self._trial_event = None  # a plan on trial when asked again: kept
        if self.topology is None:
            return self._retune(reason + "; no model, so a full quick probe")
        sus, healthy = self._inband()
        sus = self.tracked.broadcast_object(sus if self.rank == 0 else None, 0,
                                            *self._exchange("the suspect links"))
        old = self.plan
        event = ReplanEvent(step=self.step, reason=reason, old_digest=old.digest,
                            new_digest=old.digest, suspects=[tuple(p) for p in sus],
                            old_model_Bps=old.throughput_Bps, new_model_Bps=old.throughput_Bps)
        if not sus:
            event.note = "no link to re-probe (one rank); re-baselined, plan kept"
            self.detector.backoff()
            self._reset_windows()
        else:
            # Over the untracked transport: the probe's bytes are not the engine's link traffic.
            p0 = self.tracked.now()
            probed = probe_pairs(self.tracked.inner, sus, params=self.params)
            # A second round tells the ends of the degraded pairs' routes apart (split_pairs).
            extra = self.tracked.broadcast_object(
                self._split(probed) if self.rank == 0 else None, 0,
                *self._exchange("the pairs that split the degraded routes"))
            if extra:
                probed.update(probe_pairs(self.tracked.inner, extra, params=self.params))
                event.suspects += [tuple(p) for p in extra]
            event.probe_s = self.tracked.now() - p0
            event.probed_gbps = {f"{a}->{b}": round(v * 8 / 1e9, 4) for (a, b), v in probed.items()}
            topo = None
            if self.rank == 0:
                caps = refresh_capacities(self.topology, probed, healthy,
                                          threshold=self.detector.threshold)
                if caps != list(self.topology.capacity_Bps):
                    topo = topology_with_capacities(self.topology, caps)
            changed = self.tracked.broadcast_object(topo is not None if self.rank == 0 else None,
                                                    0, *self._exchange("did the model change"))
            if changed:
                plan, model = self._share_plan(topo)
                timed = list(self._timed)[-self.detector.needed:]  # the old plan's slow run
                if self.trial_calls and timed:
                    self.trial = Trial(old, timed, calls=self.trial_calls,
                                       chunk_bytes=self.engine.chunk_bytes)
                    self._trial_event = event
                self._install(plan, model)
                event.new_digest, event.new_model_Bps = plan.digest, plan.throughput_Bps
                event.switched = True
            else:
                # Slower, but not the links (a busy CPU, a late rank): the new normal.
                self.detector.backoff()
                self._reset_windows()
                event.note = ("the re-probe found the suspects at their modelled rates; "
                              f"the next re-plan needs {self.detector.needed} slow calls in "
                              f"a row")
        event.seconds = self.tracked.now() - t0
        event.at_s = t0
        self.events.append(event)
        return event

    def retune(self, mode: str = "quick") -> ReplanEvent:
        """Re-probe the whole network (``quick`` or ``full``) and re-plan; collective."""
        return self._guarded(f"retune at call {self.step}",
                             lambda: self._retune("explicit retune", mode))

    def _retune(self, reason: str, mode: str = "quick") -> ReplanEvent:
        from ..probe import probe

        t0 = self.tracked.now()
        old = self.plan
        self.trial = self._trial_event = None  # an explicit retune is not put on trial
        with true_size(self.tracked.inner):  # untracked, as the re-probe in _replan
            doc = probe(self.tracked.inner, mode)
        plan, topo = self._share_plan(from_dict(doc) if self.rank == 0 else None)
        self._install(plan, topo)
        event = ReplanEvent(step=self.step, reason=reason, old_digest=old.digest,
                            new_digest=plan.digest, old_model_Bps=old.throughput_Bps,
                            new_model_Bps=plan.throughput_Bps,
                            seconds=self.tracked.now() - t0, note=f"{mode} probe",
                            switched=True, at_s=t0)
        self.events.append(event)
        return event


def retune(engine: AdaptiveEngine, mode: str = "quick") -> ReplanEvent:
    """Explicit re-probe and re-plan of ``engine`` (collective); see
    :meth:`AdaptiveEngine.retune`."""
    return engine.retune(mode)


def slowdown_notice(plan: Plan, topology: Optional[Topology], event: Optional[ReplanEvent],
                    nbytes: int, predicted_s: float, observed_s: float, why: str) -> str:
    """The words for a sustained slowdown that no plan helps.

    The link named is the worst re-probed pair of ``event`` (its measured rate against the
    model's), or without a re-probe the plan's most loaded tree edge.
    """
    ratio = observed_s / predicted_s if predicted_s > 0 else float("inf")
    head = (f"horotopo: allreduce calls stay slower than the plan predicts: {nbytes} bytes "
            f"took {observed_s:.4g} s against {predicted_s:.4g} s predicted ({ratio:.1f}x)")
    link = ""
    probed = event.probed_gbps if event is not None else {}
    if probed:
        key = min(probed, key=lambda k: (probed[k], k))
        a, b = (int(v) for v in key.split("->"))
        link = f"; the slowest link re-probed is rank {a} -> rank {b} at {probed[key]:g} Gbit/s"
        if topology is not None:
            link += f" (the plan was made for {topology.pair_capacity_Bps(a, b) * 8 / 1e9:g})"
    else:
        arcs = plan_arcs(plan)
        if arcs:
            link = (f"; the plan's most loaded tree edge is rank {arcs[0][0]} -> rank "
                    f"{arcs[0][1]}")
    return f"{head}{link}. No re-plan: {why}. Running on with the current plan."


def _nbytes(buf: Any) -> int:
    """Bytes of an array or tensor (the same on every rank whenever the call is valid)."""
    n = getattr(buf, "nbytes", None)
    if n is None and hasattr(buf, "element_size") and hasattr(buf, "numel"):
        n = int(buf.numel()) * int(buf.element_size())
    if n is None:
        n = np.asarray(buf).nbytes
    return int(n)
