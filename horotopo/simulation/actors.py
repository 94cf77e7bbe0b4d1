"""A SimGrid simulation of ranks: the engine, the mailboxes and the run that collects results.

This module owns SimGrid's engine and the actors; :mod:`horotopo.transport.simulated` owns
what a rank sees, the Transport, and is handed to :meth:`Simulation.run` to make one per rank.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import config
from .support import (DEFAULT_COSTS, NETWORK_CONFIG, SimCosts, SimulationConfigError,
                              SimulationError, load_simgrid)

if TYPE_CHECKING:
    from ..transport.simulated import SimulatedTransport

__all__ = ["Simulation", "SimRun"]

@dataclass
class SimRun:
    """What :func:`run_simulated` returns.

    Attributes
    ----------
    results : list
        ``fn(transport)``'s value per rank.
    clock_s : float
        Simulated seconds from the start to the last rank's return.
    finish_s : list of float
        Simulated seconds at which each rank returned.
    messages : int
        Messages sent, all ranks together.
    wall_s : float
        Wall-clock seconds the simulation took here.
    cpu_s : float
        CPU seconds this process spent on it, all threads (what load from other processes
        does not inflate, unlike ``wall_s``).
    """

    results: List[Any]
    clock_s: float
    finish_s: List[float]
    messages: int
    wall_s: float
    cpu_s: float = 0.0


_USED = False



def _engine(sg: ModuleType, extra_config: Sequence[str] = ()) -> Any:
    """SimGrid's engine, for the one simulation this process may hold, configured with
    :data:`NETWORK_CONFIG` and then ``extra_config`` (``NAME:VALUE`` settings, later ones
    winning).

    SimGrid keeps one engine and one platform per process, sealed by the first run: a second
    platform cannot join it. :func:`horotopo.simulation.run_simulated` therefore runs each
    simulation in a child process of its own.
    """
    global _USED
    if _USED:
        raise SimulationError("this process already holds a simulation (SimGrid allows one per "
                              "process); use horotopo.simulation.run_simulated, which runs each "
                              "in a child process")
    _USED = True
    settings = [f"--cfg={item}" for item in extra_config]
    try:
        return sg.Engine(["horotopo", "--log=root.thres:critical", *NETWORK_CONFIG, *settings])
    except (IndexError, ValueError) as exc:
        # SimGrid lists every key it knows after a bad one: the first line says which
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SimulationConfigError(f"SimGrid refused the configuration "
                                    f"{list(extra_config)}: {first}") from None


class Simulation:
    """One simulated platform in the process's SimGrid engine.

    Build the platform on :attr:`zone` (:mod:`horotopo.simulation.platform` does it from a
    topology), then :meth:`run` ranks on its hosts (once: the run seals the platform). One per
    process (see :func:`_engine`).

    Parameters
    ----------
    costs : SimCosts
        The software costs charged as simulated time.
    network_config : sequence of str
        SimGrid settings ``NAME:VALUE`` after :data:`NETWORK_CONFIG` (``network/crosstraffic:0``
        to leave out the acknowledgements' reverse traffic, say): what-if runs that tell what
        each of the model's effects costs.
    """

    def __init__(self, costs: SimCosts = DEFAULT_COSTS,
                 network_config: Sequence[str] = (),
                 progress: Optional[Callable[[str], None]] = None,
                 progress_every_s: Optional[float] = None) -> None:
        runtime = config.runtime_params()
        self.sg = load_simgrid()
        self.engine = _engine(self.sg, network_config)
        self.costs = costs
        # The first zone is the platform's root; routes are listed pair by pair (full zone).
        self.zone = self.sg.NetZone.create_full_zone("horotopo")
        self._streams: Dict[Tuple[int, int, int], List[Any]] = {}  # key: [mailbox, posted]
        self._free: List[Any] = []  # empty mailboxes, for any stream
        self.mailboxes_made = 0
        self.hosts: List[Any] = []  # set by run(): hosts[i] is where rank i runs
        self._pipes: Dict[Tuple[int, int], float] = {}  # (source, dest): see pipe_bytes
        self.messages = 0
        # progress: a line every progress_every_s of wall time, checked every few thousand
        # messages (when to check is counted, not timed: the per-message path stays cheap)
        self._progress = progress
        self._progress_every_s = (runtime.simulation_progress_s if progress_every_s is None
                                  else progress_every_s)
        self._progress_check = runtime.simulation_progress_messages
        self.next_report = self._progress_check if progress is not None else float("inf")
        self._reported_at = time.perf_counter()
        self._run_started = self._reported_at

    def acquire(self, key: Tuple[int, int, int]) -> Any:
        """The mailbox of stream ``key`` = (source, destination, tag), for one message posted
        on it (:meth:`release` it once that message is done or cancelled).

        A stream keeps its mailbox while any message of it is posted and not done, so SimGrid
        matches its messages in FIFO order, as MPI does one (source, tag) stream; then the
        mailbox, empty, goes back to a pool for any other stream. Creating a mailbox from an
        actor is a simcall (two thread switches, as costly as a message's own), and the engine
        opens new streams on every call (new tags): at 1024 ranks with 192 trees, one per
        message. The pool starts with :meth:`run`'s ``mailboxes``, made before the actors
        start, where no thread switch is needed.
        """
        got = self._streams.get(key)
        if got is None:
            if self._free:
                got = self._streams[key] = [self._free.pop(), 0]
            else:
                box = self._new_mailbox()
                # that simcall let other actors run: the peer may have opened the stream
                got = self._streams.get(key)
                if got is None:
                    got = self._streams[key] = [box, 0]
                else:
                    self._free.append(box)
        got[1] += 1
        return got[0]

    def release(self, key: Tuple[int, int, int]) -> None:
        """One message of stream ``key`` is done (see :meth:`acquire`)."""
        got = self._streams[key]
        got[1] -= 1
        if got[1] == 0:
            del self._streams[key]
            self._free.append(got[0])

    def report(self) -> None:
        """Called by the transports when :attr:`messages` reaches :attr:`next_report`: one
        progress line if ``progress_every_s`` of wall time have passed since the last."""
        self.next_report = self.messages + self._progress_check
        now = time.perf_counter()
        if self._progress is None or now - self._reported_at < self._progress_every_s:
            return
        self._reported_at = now
        self._progress(f"{self.messages} messages sent, simulated clock "
                       f"{float(self.sg.Engine.clock):.6f} s, {now - self._run_started:.0f} s "
                       "of wall time")

    def pipe_bytes(self, source: int, dest: int) -> float:
        """Bytes in flight that fill the route from rank ``source`` to rank ``dest``: its
        latency times its bottleneck rate (a stream keeps that many on the network; see
        ``SimulatedTransport._may_start``, and the receive side in
        :mod:`horotopo.simulation.pending`, which must agree with it)."""
        key = (source, dest)
        got = self._pipes.get(key)
        if got is None:
            links, latency = self.hosts[source].route_to(self.hosts[dest])
            got = self._pipes[key] = latency * min((link.bandwidth for link in links),
                                                   default=0.0)
        return got

    def _new_mailbox(self) -> Any:
        self.mailboxes_made += 1
        return self.sg.Mailbox.by_name(f"box{self.mailboxes_made}")

    def run(self, hosts: Sequence[Any], fn: Callable[["SimulatedTransport"], Any], *,
            make_transport: Callable[["Simulation", int, int, float, str], "SimulatedTransport"],
            scale: float = 1.0, names: Optional[Sequence[str]] = None,
            mailboxes: Optional[int] = None) -> SimRun:
        """Run ``fn(transport)`` as one actor per rank; rank ``i`` on ``hosts[i]``.

        Parameters
        ----------
        hosts : sequence of simgrid.Host
            One per rank (ranks may share a host).
        fn : callable
            The rank's body; its return value is the rank's result.
        make_transport : callable
            ``make_transport(simulation, rank, size, scale, name)``: the rank's transport
            (:class:`~horotopo.transport.simulated.SimulatedTransport`, which stands on this
            module, so it is handed in rather than imported).
        scale : float
            Simulated bytes per real byte of the point-to-point data messages.
        names : sequence of str, optional
            Each rank's ``processor_name`` (default: its host's name).
        mailboxes : int, optional
            Mailboxes made before the actors start (default ``64`` per rank, about 0.4 KB
            each, ~1 us each): streams take theirs from this pool (:meth:`acquire`) and make
            more, at a simcall each, only when it runs dry.

        Raises
        ------
        SimulationError
            A rank raised (the first error, by rank, is the cause), or ranks deadlocked.
        """
        sg = self.sg
        n = len(hosts)
        if n < 1:
            raise ValueError("a simulation needs at least one rank")
        if not scale > 0:
            raise ValueError(f"scale must be positive, got {scale!r}")
        results: List[Any] = [None] * n
        finish: List[Optional[float]] = [None] * n
        errors: Dict[int, BaseException] = {}
        start = sg.Engine.clock
        sent0 = self.messages
        labels = list(names) if names is not None else [h.name for h in hosts]

        def actor(rank: int) -> Callable[[], None]:
            def body() -> None:
                transport = make_transport(self, rank, n, scale, labels[rank])
                try:
                    results[rank] = fn(transport)
                    transport.flush(settle=True)  # unwaited sends go out; the CPU finishes
                except sg.ActorKilled:
                    raise  # a deadlock: SimGrid kills the blocked actors; let it
                except BaseException as exc:  # noqa: BLE001 - re-raised by run()
                    errors[rank] = exc
                finish[rank] = sg.Engine.clock - start
            return body

        self.hosts = list(hosts)  # where each rank runs: the transports read their routes
        # made here, in maestro's thread, they cost no thread switch (see acquire)
        self._free.extend(self._new_mailbox() for _ in range(
            64 * n if mailboxes is None else mailboxes))
        for rank in range(n):
            sg.Actor.create(f"rank{rank}", hosts[rank], actor(rank))
        t0, c0 = time.perf_counter(), time.process_time()
        self._reported_at = self._run_started = t0
        # The cyclic collector walks every live object each time it runs, and a simulation of
        # hundreds of actors holds many (their frames, requests, buffers), and walking them
        # costs a good share of the simulation's CPU. The run's cycles are few (callbacks bound
        # to their runs) and die with the child process that holds the simulation.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.engine.run()
        finally:
            if collecting:
                gc.enable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if errors:
            first = min(errors)
            raise SimulationError(f"rank {first} raised {type(errors[first]).__name__}: "
                                  f"{errors[first]}") from errors[first]
        stuck = [r for r in range(n) if finish[r] is None]
        if stuck:
            raise SimulationError(
                f"deadlock: rank{'s' if len(stuck) > 1 else ''} "
                f"{', '.join(map(str, stuck[:16]))}{' ...' if len(stuck) > 16 else ''} never "
                f"returned (simulated clock {sg.Engine.clock - start:.6f} s)")
        done = [float(f) for f in finish]  # type: ignore[arg-type]
        return SimRun(results=results, clock_s=max(done), finish_s=done,
                      messages=self.messages - sent0, wall_s=wall, cpu_s=cpu)
