"""The background runtime behind the Horovod-compatible API: set-up and the thread that cycles.

One daemon thread per process does *all* MPI work: set-up (communicators, host discovery,
planning), the control cycles and the collectives themselves. User calls only enqueue a
request and return a handle, so the ops are asynchronous and MPI needs no more than
``MPI_THREAD_SERIALIZED`` (the MPI bindings ask for ``MPI_THREAD_MULTIPLE`` by default, which
is also what a user needs who makes MPI calls of their own while horotopo runs).

The parts, each with one job:

- :mod:`.queue`: the user-thread side, the request queue and the handle table;
- :mod:`.controller`: the control cycle (response cache, negotiation through rank 0, stall
  inspector) over its own control transport, like Horovod's MPI controller;
- :mod:`.fusion` and :mod:`.executors`: which responses share an engine call, and one executor
  per op kind that runs them through the engine;
- :mod:`.records`, :mod:`.checks`, :mod:`.settings`: the typed records, Horovod's mismatch
  checks and the environment knobs;
- this module: :class:`Runtime`, which sets these up on the background thread and runs one
  cycle after another until every rank stops.

Only the transport (:mod:`horotopo.transport.mpi`) speaks to MPI; this module asks it for the
communicators and the thread level.
"""
from __future__ import annotations

import atexit
import socket
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import config
from .. import timeline
from ..reliability.liveness import faulty
from .controller import Controller
from .errors import SHUT_DOWN
from .executors import Executor
from .ops import Average
from .set_table import SetTable, build_group
from .queue import Item, RequestQueue
from .records import (ALLGATHER, ALLREDUCE, BARRIER, BROADCAST, RETUNE, RETUNE_MODES,
                      SUPPORTED_DTYPES, Entry, Handle, dtype_name)
from .settings import Settings, apply_log_level, env_settings, log

__all__ = ["Runtime", "Handle", "ALLREDUCE", "ALLGATHER", "BROADCAST", "BARRIER", "RETUNE",
           "RETUNE_MODES", "env_settings", "dtype_name", "SUPPORTED_DTYPES"]


class Runtime:
    """The per-process runtime: a background thread, a request queue and a handle table.

    Parameters
    ----------
    comm : MPI communicator, list of int, or None
        The ranks to run over (see :func:`horotopo.init`); the world by default.
    **settings
        Overrides of :func:`env_settings`' values (tests).
    """

    def __init__(self, comm: Any = None, **settings: float) -> None:
        self.settings = Settings.from_env(**settings)
        apply_log_level(config.get("HOROVOD_LOG_LEVEL"))
        self._user_comm = comm
        runtime_params = config.runtime_params()
        self.queue = RequestQueue(runtime_params.handle_check_s)
        self._start_check_s = runtime_params.start_check_s
        self.pending: "OrderedDict[str, Entry]" = OrderedDict()
        self._end_reason: Optional[str] = None
        self._ready = threading.Event()
        self._init_error: Optional[BaseException] = None
        self._tl: Optional[timeline.Timeline] = None  # the timeline of the last cycle
        self.controller: Optional[Controller] = None
        self.executor: Optional[Executor] = None
        self._liveness: Any = None
        self._data: Any = None          # the engine's data transport (opened here)
        self._user: Any = None          # what user_transport() lends (see there)
        self.setup: Any = None          # horotopo.bootstrap.Setup
        self.sets = SetTable(0)         # the process sets, once set up
        self.rank = self.size = -1
        self.local_rank = self.local_size = self.cross_rank = self.cross_size = -1
        self.hosts: Tuple[str, ...] = ()
        self.thread_level = -1
        self.stats = {"cycles": 0, "negotiations": 0, "cache_hits": 0, "engine_allreduces": 0,
                      "fused_tensors": 0}
        self._thread = threading.Thread(target=self._main, name="horotopo-background",
                                        daemon=True)

    # ------------------------------------------------------------------ user-thread side

    def start(self) -> None:
        """Start the background thread and wait until set-up finished on it."""
        global _started
        _started = True
        self._thread.start()
        while not self._ready.wait(self._start_check_s):
            if not self._thread.is_alive():
                break
        if self._init_error is not None:
            raise self._init_error
        if not self._ready.is_set():
            raise RuntimeError("horotopo background thread died during init")

    @property
    def alive(self) -> bool:
        return self.queue.dead is None and self._thread.is_alive()

    @property
    def engine(self) -> Any:
        """The engine the collectives run on (an AdaptiveEngine once set up)."""
        return self.executor.engine if self.executor is not None else None

    @engine.setter
    def engine(self, engine: Any) -> None:
        if self.executor is None:
            raise RuntimeError("the runtime has no engine before set-up")
        self.executor.engine = engine

    @property
    def plan(self) -> Any:
        """The plan the engine runs now (it follows re-plans); None before set-up."""
        return self.executor.plan if self.executor is not None else None

    def user_transport(self) -> Any:
        """The transport for the user's own point-to-point messages (torch.distributed's
        send/recv on the horotopo backend).

        The engine's data transport (its duplicate of the communicator; users' messages keep
        to its :meth:`~horotopo.transport.base.Transport.user_tags`, which no collective
        uses), without the engine's link tracking: a user's messages are not the plan's link
        traffic that the adaptive engine times, as the probe's are not. Where MPI is not
        CUDA-aware and some rank has a device, it is wrapped in a
        :class:`~horotopo.gpu.StagingTransport` of its own (decided at set-up, like the
        engine's), so device buffers move as the collectives' do: directly where MPI takes
        device pointers, else through pinned host memory.

        Returns
        -------
        Transport
            Shared by every caller. A staging wrapper keeps state (its pinned slots, the sends
            waiting for their copies), so callers on several threads must serialize their
            calls on it; MPI itself must be at ``MPI_THREAD_MULTIPLE`` for any use beside the
            background thread.

        Raises
        ------
        RuntimeError
            Before set-up finished, or once the runtime has shut down (the transport is
            closed then).
        """
        if self._user is None or not self.alive:
            raise RuntimeError("horotopo's runtime has no transport for point-to-point "
                               "messages: it has shut down, or never started")
        return self._user

    def enqueue(self, kind: str, items: Sequence[Item], op: int = Average,
                prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
                device: int = -1, ready: Optional[Callable[[], None]] = None, pset: int = 0,
                call: Optional[Tuple[str, int]] = None) -> int:
        """Queue ``items`` (name, input, output) as one call; return its handle id.

        Inputs and outputs are NumPy arrays, or CuPy arrays on ``device`` (>= 0), which the
        engine then reduces on the device. ``ready`` (from :func:`horotopo.gpu.record_ready`)
        blocks until the caller's stream has finished writing the inputs; the background
        thread calls it before the data moves. ``pset`` is the process set's id (0: every
        rank); ``call`` is ``(name of the user call, names it submits in all)`` when the call
        submits several names (see :class:`.records.Request`).

        Raises
        ------
        ValueError
            A name is already pending on this rank (Horovod's duplicate-name error).
        HorovodInternalError
            The runtime has shut down.
        """
        return self.queue.enqueue(kind, items, op, prescale, postscale, root, device, ready,
                                  pset, call)

    def next_id(self) -> int:
        """A fresh id from the handle counter (Horovod names unnamed ops after it)."""
        return self.queue.next_id()

    def poll(self, hid: int) -> bool:
        return self.queue.poll(hid)

    def wait(self, hid: int) -> List[Any]:
        """Block until ``hid`` completes; return its results and forget the handle."""
        return self.queue.wait(hid, self._thread.is_alive)

    def stop(self) -> bool:
        """Ask every rank to stop (Horovod's shutdown); return True if the thread joined."""
        if self.controller is not None and self._end_reason is None:
            # At interpreter exit (shutdown from atexit) the main thread has already ended.
            why = ("its program ended (sys.exit or the end of the script) while the others ran"
                   if not threading.main_thread().is_alive()
                   else "it called shutdown() while the others ran")
            self.controller.leaving = faulty([self.rank], why)
        self.queue.request_stop()
        if not self._thread.is_alive():
            return True
        timeout_s = self.settings.shutdown_timeout_s
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("horotopo: the background thread did not stop within %.0f s (a peer "
                        "rank may have exited without shutdown); continuing without it",
                        timeout_s)
            return False
        return True

    # ------------------------------------------------------------------ background thread

    def _main(self) -> None:
        try:
            self._setup()
        except BaseException as exc:  # reported to init() on the user thread
            self._init_error = exc
            self.queue.close(f"init failed: {exc}")
            self._ready.set()
            return
        self._ready.set()
        reason = SHUT_DOWN
        try:
            self._loop()
        except BaseException as exc:
            log.error("horotopo background thread failed: %s: %s", type(exc).__name__, exc)
            reason = f"{SHUT_DOWN} (background thread failed: {type(exc).__name__}: {exc})"
        finally:
            self._teardown(self._end_reason or reason)

    def _setup(self) -> None:
        from horotopo.gpu.transport import staging_if_needed
        from horotopo.reliability import Watchdog, timeout_from_env
        from horotopo.transport import mpi as door

        self.thread_level = door.checked_thread_level()
        base = self._user_comm
        if base is None:
            base = door.world_comm()
            _wait_for_ranks(base, None)
        elif isinstance(base, (list, tuple, range)):
            ranks = [int(r) for r in base]
            world = door.world_comm()
            if world.Get_rank() not in ranks:
                raise ValueError(f"init(comm={ranks}): this process (world rank "
                                 f"{world.Get_rank()}) is not in the list")
            _wait_for_ranks(world, ranks)
            base = door.group_comm(world, ranks)
        else:
            base = door.as_comm(base, "init(comm=...)", also="a list of ranks")
            _wait_for_ranks(base, None)
        timeout = timeout_from_env()
        # The control cycle's own transport (a Dup of the communicator, like Horovod's MPI
        # controller), so its tags never meet the data's.
        named_max_ranks = config.runtime_params().named_max_ranks
        control = door.MPITransport(base, named_max_ranks=named_max_ranks)
        self.rank, self.size = control.rank, control.size
        self.queue.size = self.size
        self.hosts = tuple(control.allgather_object(socket.gethostname(), 2 * timeout,
                                                    what="init: host names"))
        self.local_rank, self.local_size, self.cross_rank, self.cross_size = \
            _host_ranks(self.hosts, self.rank)
        self.setup = _make_setup(base)
        adapt = config.get("HOROTOPO_ADAPT")
        if adapt is None:
            # A made-up model (HOROTOPO_PROBE=off) is not one to refresh by re-probing links.
            adapt = self.setup.source != "uniform"
        # The data transport is opened here rather than by the engine, so that the runtime can
        # lend it to user point-to-point traffic (user_transport) without reaching into it.
        data = door.MPITransport(base, named_max_ranks=named_max_ranks)
        # Before the engine, whose watchdog asks it who is stopped or dead.
        self._liveness = _liveness(base, self.thread_level)
        try:
            # Collective: every rank decides here; the engine below reuses the decision.
            user = staging_if_needed(data)
            engine = _make_engine(data, self.setup, adapt=adapt, timeout_s=timeout,
                                  liveness=self._liveness)
        except BaseException:
            data.close()
            if self._liveness is not None:
                self._liveness.close()
            raise
        self._data, self._user = data, user
        self.executor = Executor(engine, self.rank, self.size, self.settings.fusion_threshold,
                                 self.stats, self.queue.finish, plan=self.setup.plan)
        watchdog = Watchdog(timeout, describe=self._describe_control_wait)
        self.controller = Controller(control, self.settings, watchdog, self.stats,
                                     self._on_stall)
        self._process_sets(base, timeout)

    def _process_sets(self, base: Any, timeout_s: float) -> None:
        """The process-set table, shared by the user threads (checks), the coordinator (who
        must ask) and the executor (which builds and runs the sets)."""
        assert self.executor is not None and self.controller is not None
        self.sets = SetTable(self.size)
        ring = self.setup.source == "uniform"   # HOROTOPO_PROBE=off plans rings, sets too
        self.executor.sets = self.sets
        self.executor.build_group = lambda ranks: build_group(
            base, ranks, self.rank, self.setup.topology, ring, timeout_s)
        self.controller.coordinator.sets = self.sets.members

    def _describe_control_wait(self) -> str:
        from horotopo.reliability.liveness import verdict

        return verdict(self._liveness, "waiting for the runtime's control exchange with every "
                                       "rank")

    def _on_stall(self, reason: str) -> None:
        # Clearing the running flag in the next cycle stops every rank's loop, and tells every
        # rank the report.
        self._end_reason = f"{SHUT_DOWN} ({reason})"
        if self.controller is not None:
            self.controller.leaving = reason
        self.queue.request_stop()

    def _loop(self) -> None:
        controller, executor = self.controller, self.executor
        assert controller is not None and executor is not None
        while True:
            t_start = time.monotonic()
            incoming, stopping = self.queue.take()
            for entry in incoming:
                self.pending[entry.name] = entry
            tl = self._tl = timeline.active()
            if tl is not None and tl.mark_cycles and self.pending:
                # Horovod marks every cycle; idle ones would bury the ops, so only cycles
                # with work are marked.
                tl.marker(timeline.CYCLE_START, t_start)
            responses = controller.cycle(self.pending, stopping, tl)
            if responses is None:
                if controller.stopped_by is not None and self._end_reason is None:
                    self._end_reason = f"{SHUT_DOWN} ({controller.stopped_by})"
                return
            if responses:
                executor.execute(responses, self.pending, tl, controller.t_resp)
            if tl is not None:
                tl.flush()
            rest = self.settings.cycle_time_s - (time.monotonic() - t_start)
            if rest > 0:
                time.sleep(rest)

    def _teardown(self, reason: str) -> None:
        leftovers = list(self.pending.values()) + self.queue.close(reason)
        self.pending.clear()
        if self.executor is not None:
            self.executor.tl = self._tl
            self.executor.finish(leftovers, error=reason)
        else:
            self.queue.finish(leftovers, error=reason)
        if self.rank == 0:
            # No op can follow: close the timeline, so that its file ends as complete JSON
            # whether or not the program calls shutdown() (Horovod closes it there too).
            timeline.stop()
        self._tl = None
        if self.executor is not None:
            self.executor.tl = None
        set_engines = [getattr(g.engine, "close", None) for g in self.sets.groups.values()]
        # The data transport after the engine that runs on it (the engine does not own it).
        for closer in (*set_engines, getattr(self.engine, "close", None),
                       getattr(self._data, "close", None),
                       getattr(self.controller, "close", None),
                       getattr(self._liveness, "close", None)):
            if closer is not None:
                try:
                    closer()
                except Exception as exc:  # best effort: shutdown must never raise or hang
                    log.debug("horotopo teardown: %s", exc)


def _host_ranks(hosts: Sequence[str], rank: int) -> Tuple[int, int, int, int]:
    """``(local_rank, local_size, cross_rank, cross_size)`` of ``rank`` given each rank's
    host: local among the ranks of its host, cross among the ranks with its local rank."""
    size = len(hosts)
    same = [r for r in range(size) if hosts[r] == hosts[rank]]
    local_rank = same.index(rank)
    peers = [r for r in range(size)
             if [q for q in range(size) if hosts[q] == hosts[r]].index(r) == local_rank]
    return local_rank, len(same), peers.index(rank), len(peers)


def _wait_for_ranks(comm: Any, members: Optional[Sequence[int]]) -> None:
    """Wait at most HOROVOD_START_TIMEOUT for every rank to reach init; else name the others.

    This runs before init's first collective (the ``Dup``), which would otherwise wait forever
    for a rank that never calls init.
    """
    from horotopo.bootstrap import BootstrapError
    from horotopo.transport.mpi import absent_ranks

    timeout_s = config.get("HOROVOD_START_TIMEOUT")
    missing, departed = absent_ranks(comm, timeout_s, members)
    late = [r for r in missing if r not in departed]
    if departed:
        raise BootstrapError(f"init: {faulty(departed, 'the process ended before init')}"
                             + (f"; rank(s) {', '.join(map(str, late))} did not reach init "
                                "either" if late else ""))
    if missing:
        raise BootstrapError(f"init: rank(s) {', '.join(map(str, missing))} did not reach "
                             f"init within {timeout_s:g} s (HOROVOD_START_TIMEOUT, "
                             f"horotopo-run --start-timeout)")


#: Set once this process starts a runtime: from then on its peers learn of its exit through
#: the runtime (the last cycle), not through a departure notice.
_started = False


def _announce_departure_at_exit() -> None:
    """A process of a multi-rank job that ends without ever using MPI tells the others, whose
    init would otherwise wait for it until the start timeout.

    Its peers are held in MPI's own start-up (it waits for every process): starting MPI here
    lets them through, to read the notice. A program that used MPI itself (the command line's
    probe and doctor, a test or benchmark of the engine) is left alone: its peers are not
    waiting in init, and notices nobody reads would stay unmatched at MPI_Finalize.
    """
    import sys

    if _started or "mpi4py.MPI" in sys.modules or config.launcher_size() < 2:
        return
    try:
        from horotopo.transport import mpi as door

        door.announce_departure(config.reliability_params().departure_wait_s)
    except Exception as exc:  # noqa: BLE001 - exiting anyway; the start timeout still ends it
        log.debug("horotopo: could not announce this process's departure: %s", exc)


atexit.register(_announce_departure_at_exit)


def _make_setup(comm: Any) -> Any:
    """Plan and model from the bootstrap: probed links or HOROTOPO_TOPOLOGY, planned on rank 0."""
    from horotopo.bootstrap import setup
    from horotopo.transport import MPITransport

    transport = MPITransport(comm)  # the bootstrap speaks to a transport, not to MPI
    try:
        return setup(transport, log=_say)
    finally:
        transport.close()


def _say(message: str) -> None:
    log.info("%s", message)


def _liveness(comm: Any, thread_level: int) -> Any:
    """A liveness responder where MPI allows one (it pings from the watchdog's thread)."""
    from horotopo.reliability import LivenessResponder
    from horotopo.transport.mpi import supports_threads

    reliability = config.reliability_params()
    return (LivenessResponder(comm, poll_s=reliability.liveness_poll_s,
                              ping_timeout_s=reliability.ping_timeout_s)
            if supports_threads(thread_level) else None)


def _make_engine(transport: Any, setup: Any, *, adapt: bool, timeout_s: float,
                 liveness: Any) -> Any:
    """The adaptive engine on ``transport``, which the caller keeps owning (and closes)."""
    from horotopo.adapt import AdaptiveEngine

    adapt_params = config.adapt_params()
    # The tree-or-MPI choice starts from timings of this job's ranks (a short calibration),
    # not from constants of some other machine; the engine then learns from its own calls.
    return AdaptiveEngine(transport, setup.plan, setup.topology, adapt=adapt,
                          timeout_s=timeout_s, calibrate_s=config.get("HOROTOPO_CALIBRATE_S"),
                          liveness=liveness, params=adapt_params,
                          min_slow_s=adapt_params.runtime_min_slow_s,
                          engine_params=config.engine_params())
