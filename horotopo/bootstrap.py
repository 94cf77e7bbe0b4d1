"""The init wiring: where a job's Plan comes from.

:func:`setup` is what ``horotopo.init()`` runs, collectively (:func:`setup_plan` is the same,
returning only the Plan):

1. every rank reads ``HOROTOPO_PROBE`` and ``HOROTOPO_TOPOLOGY``; the ranks compare what they
   read (a bad value, or ranks that disagree, is an error on every rank);
2. the topology: loaded by rank 0 from ``HOROTOPO_TOPOLOGY=path`` if set, else probed by all
   ranks (``HOROTOPO_PROBE=quick``, the default, or ``full``), else (``off``) a uniform model;
3. rank 0 plans it (:func:`horotopo.plan.make_plan`; ring for the uniform model of ``off``),
   records in the plan the allreduce algorithm predicted fastest on it (the sharing protocol
   does, :func:`horotopo.algorithms.choice.with_choice`) and broadcasts the Plan's JSON with
   the topology's (the adaptive engine refreshes that model when the network changes, and
   every rank must know which model it has);
4. every rank rebuilds the Plan and the ranks compare its digest.

Steps 3 and 4 are :func:`horotopo.planning_protocol.share_plan`, the one protocol for sharing
a plan. Everything here speaks to a :class:`~horotopo.transport.base.Transport`, never to MPI.

Any failure on rank 0 (unreadable file, wrong rank count, planner error, or any exception at
all while it loads and plans) is broadcast, so every rank raises the same
:class:`BootstrapError` within a broadcast's time instead of waiting for a plan that never
comes; an unexpected one reads ``rank 0 failed in init: RecursionError: ...``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from . import config
from . import costs as cost_profiles
from .algorithms.choice import forest_predictor, recorded_algorithm
from .params import PLANNER, PROBE, RELIABILITY
from .plan import Plan, make_plan, ring_plan
from .planning_protocol import share_plan
from .probe import ProbeError, probe
from .topology import Topology, TopologyError, from_dict, load_for_job, measured_document
from .transport.base import Transport, TransportTimeout

__all__ = ["setup", "Setup", "setup_plan", "read_env", "uniform_document", "BootstrapError",
           "SettingsError", "ProbeError",
           "PROBE_MODES", "DEFAULT_PROBE"]

PROBE_MODES = config.lookup("HOROTOPO_PROBE").choices
DEFAULT_PROBE = config.lookup("HOROTOPO_PROBE").default  # quick: init() costs about a second


class BootstrapError(RuntimeError):
    """init() cannot produce a Plan; raised on every rank with the same message."""


class SettingsError(BootstrapError, config.ConfigError):
    """A bad or disagreeing HOROTOPO_PROBE / HOROTOPO_TOPOLOGY: a BootstrapError on every rank,
    and a ConfigError (a ValueError), as the runtime's other settings errors are."""


def read_env(env: Optional[Mapping[str, str]] = None) -> Tuple[str, Optional[str]]:
    """``(probe mode, topology path or None)`` from the environment (``os.environ`` if None).

    Raises
    ------
    BootstrapError
        A value that is not allowed, naming the variable and the allowed values.
    """
    try:
        return config.get("HOROTOPO_PROBE", env), config.get("HOROTOPO_TOPOLOGY", env)
    except config.ConfigError as exc:
        raise BootstrapError(str(exc)) from None


def uniform_document(n: int, gbps: float = 1.0) -> Dict[str, Any]:
    """A measured-form model where every pair gets ``gbps``: what ``HOROTOPO_PROBE=off`` plans."""
    bw = [[None if i == j else gbps for j in range(n)] for i in range(n)]
    return measured_document(f"uniform-{n} (HOROTOPO_PROBE=off)", [f"rank{i}" for i in range(n)],
                             bw)


@dataclass(frozen=True)
class Setup:
    """What init() starts from: the Plan, the model it was planned on, and where that came from.

    ``source`` is ``"file"`` (HOROTOPO_TOPOLOGY), ``"probe"`` or ``"uniform"``
    (HOROTOPO_PROBE=off: a made-up model, nothing measured).
    """

    plan: Plan
    topology: Topology
    source: str

    def describe(self) -> str:
        return (f"{self.source} model {self.topology.name!r}: {self.topology.n} ranks; plan "
                f"{self.plan.digest[:12]}, {len(self.plan.trees)} trees")


def setup_plan(transport: Transport, *, env: Optional[Mapping[str, str]] = None,
               log: Optional[Callable[[str], None]] = None,
               probe_options: Optional[Mapping[str, Any]] = None) -> Plan:
    """:func:`setup`, returning only the Plan."""
    return setup(transport, env=env, log=log, probe_options=probe_options).plan


def setup(transport: Transport, *, env: Optional[Mapping[str, str]] = None,
          log: Optional[Callable[[str], None]] = None,
          probe_options: Optional[Mapping[str, Any]] = None) -> Setup:
    """Probe or load the topology, plan on rank 0, broadcast and check the Plan; collective.

    Parameters
    ----------
    transport : Transport
        All its ranks must call this (e.g. ``MPITransport(comm)``).
    env : mapping, optional
        Where ``HOROTOPO_PROBE`` (``off``, ``quick`` (default) or ``full``) and
        ``HOROTOPO_TOPOLOGY`` (a topology file of either form, which wins over probing) are read.
    log : callable, optional
        Receives one-line messages; called on rank 0 only.
    probe_options : mapping, optional
        Settings of :class:`horotopo.probe.ProbeConfig` for the probe (``max_bytes``,
        ``timeout_s``...), the same on every rank.

    Returns
    -------
    Setup
        The same plan (same digest) and topology on every rank.

    Raises
    ------
    BootstrapError
        Bad settings, an unusable topology, a planner failure or a digest mismatch; raised on
        every rank. Also a rank that does not take part in time, named in the message.
    ProbeError
        The probe failed (an unreachable pair, a timeout, a zero measurement), naming the pair.
    """
    rank, size = transport.rank, transport.size
    say: Callable[[str], None] = (log if (log is not None and rank == 0) else (lambda m: None))
    start = time.perf_counter()

    # 1. settings: share them first, so a rank with a bad value cannot leave the others waiting
    # (the planner's parameters too: rank 0 plans with them, after every rank has agreed)
    planner_params, reliability, probe_params = PLANNER, RELIABILITY, PROBE
    try:
        mine: Dict[str, Any] = dict(zip(("mode", "path"), read_env(env)))
        profile, profile_from = cost_profiles.from_settings(env)
        planner_params = config.planner_params(env)
        probe_params = config.probe_params(env)
        reliability = config.reliability_params(env)
    except (BootstrapError, cost_profiles.CostsError, config.ConfigError) as exc:
        mine = {"error": str(exc)}
    try:
        # a rank whose timeouts are refused says so under the default timeout
        everyone = transport.allgather_object(mine, reliability.exchange_timeout_s,
                                              "init: comparing settings")
    except TransportTimeout as exc:
        raise BootstrapError(str(exc)) from exc
    for r, theirs in enumerate(everyone):
        if "error" in theirs:
            raise SettingsError(f"rank {r}: {theirs['error']}")
    for r, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            raise SettingsError(
                f"ranks disagree on HOROTOPO_PROBE/HOROTOPO_TOPOLOGY: rank 0 has "
                f"{_show(everyone[0])}, rank {r} has {_show(theirs)}; give every rank the same")
    mode, path = everyone[0]["mode"], everyone[0]["path"]
    # Every rank's selector charges the costs rank 0 plans with: its own file may differ.
    cost_profiles.activate(cost_profiles.CostProfile.from_json(transport.broadcast_object(
        profile.to_json() if rank == 0 else None, 0, reliability.exchange_timeout_s,
        "init: cost profile")))
    say(f"horotopo: software costs from {profile_from}")

    # 2. a probe is collective (every rank measures); the rest is rank 0's alone: loading the
    # model, checking it and planning it all run inside build(), so that anything raised
    # there (a bad file, a planner bug, a RecursionError or MemoryError) is sent to every rank
    # as rank 0's error instead of leaving them waiting for a plan.
    doc = None
    if path is None and mode != "off":
        doc = probe(transport, mode, progress=say,
                    **dict({"params": probe_params}, **dict(probe_options or {})))
    use_ring = path is None and mode == "off"

    def model() -> Topology:
        if path is not None:
            try:
                topology = load_for_job(path, size)
            except TopologyError as exc:
                raise SettingsError(f"HOROTOPO_TOPOLOGY={path}: {exc}") from exc
            say(f"horotopo: topology from HOROTOPO_TOPOLOGY={path}: {topology.name!r}, "
                f"{topology.n} ranks ({topology.kind})")
        elif use_ring:
            topology = from_dict(uniform_document(size))
            say("horotopo: HOROTOPO_PROBE=off and no HOROTOPO_TOPOLOGY: ring plan over a "
                "uniform model")
        else:
            topology = from_dict(doc)
            say(f"horotopo: probed {topology.n} ranks ({mode}) in "
                f"{doc['probe']['seconds']:.2f} s, {len(doc.get('shared', []))} shared "
                "bottlenecks")
        if topology.n != size:
            raise SettingsError(f"HOROTOPO_TOPOLOGY={path}: the topology has {topology.n} "
                                f"ranks but this job has {size}")
        return topology

    # 3 and 4. rank 0 plans (or says why it cannot), every rank gets the plan, digests compared
    def build() -> Tuple[Plan, Optional[Topology]]:
        topology = model()
        try:
            return (ring_plan(topology, params=planner_params) if use_ring
                    else make_plan(topology, params=planner_params,
                                   predict=forest_predictor(topology))), topology
        except Exception as exc:  # noqa: BLE001 - every rank must learn of the failure
            raise BootstrapError(f"planning {topology.name!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc

    plan, planned_on = share_plan(transport, build, what="init", error=BootstrapError,
                                  settings_error=SettingsError,
                                  failure="rank 0 failed in init",
                                  timeout_s=reliability.plan_timeout_s,
                                  check_timeout_s=reliability.exchange_timeout_s)
    assert planned_on is not None  # build always returns the model it planned on
    say(f"horotopo: plan {plan.digest}: {len(plan.trees)} trees, modelled "
        f"{plan.throughput_Bps / 1e6:.3f} MB/s ({plan.throughput_Bps / plan.ring_Bps:.2f}x ring), "
        f"large allreduces by {recorded_algorithm(plan)}, {time.perf_counter() - start:.2f} s")
    source = "file" if path is not None else ("uniform" if use_ring else "probe")
    return Setup(plan, planned_on, source)


def _show(settings: Mapping[str, Any]) -> str:
    return f"HOROTOPO_PROBE={settings['mode']} HOROTOPO_TOPOLOGY={settings['path']}"
