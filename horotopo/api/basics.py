"""init/shutdown and the rank/size queries, as in ``horovod.common.basics``; the runtime
they start is published in :mod:`.state`, which the other front-end modules read."""
from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import sys
import threading
import time
from typing import Any, Dict, Sequence, Union

from .. import config
from .. import timeline
from ..reliability.abort import abort
from . import state
from .objects import allgather_object
from .process_sets import (ProcessSet, add_process_set, allow_dynamic, check_duplicates,
                           global_process_set, register, remove_process_set)
from .runtime import RETUNE, RETUNE_MODES, Runtime
from .state import is_initialized, runtime, unnamed

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
           "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
           "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
           "cuda_built", "rocm_built", "start_timeline", "stop_timeline", "runtime", "retune",
           "unnamed", "ProcessSet", "global_process_set", "add_process_set",
           "remove_process_set"]

_atexit_done = False
_init_lock = threading.Lock()

def init(comm: Any = None, process_sets: Union[None, str, Sequence[Any]] = None) -> None:
    """Start horotopo on ``comm`` (an MPI communicator or a list of world ranks).

    Collective over ``comm``: every rank plans the allreduce trees together (probing the
    links or reading ``HOROTOPO_TOPOLOGY``). Calling it again while running is a no-op.

    Parameters
    ----------
    comm : MPI communicator (``MPI.Comm``) or list of int, optional
        The ranks to run over; ``MPI.COMM_WORLD`` by default.
    process_sets : list of ProcessSet, or "dynamic", optional
        Sets to register now (ids 1, 2, ... in this order; every rank passes the same), or
        ``"dynamic"``: none now, and :func:`add_process_set` / :func:`remove_process_set`
        allowed later (as ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).

    Raises
    ------
    ValueError
        A process set repeats another's ranks (Horovod's message); horotopo is then not
        initialized.
    horotopo.config.ConfigError
        A setting with a bad value (``HOROVOD_CYCLE_TIME=abc``), naming the variable, the value
        and what is allowed; a ValueError, as Horovod's own. Caught, it is an ordinary
        exception. Left uncaught, it does not print a traceback on every rank: the job prints
        the one line ``horotopo: HOROVOD_CYCLE_TIME='abc': must be a number >= 0`` once
        (rank 0's; a rank other than 0 whose setting alone is bad prints its own, naming
        itself, after ``ReliabilityParams.settings_error_grace_s``) and exits with status 2,
        upon which the launcher ends the job.
    """
    global _atexit_done
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"process_sets must be a list of hvd.ProcessSet or 'dynamic', got "
                             f"{process_sets!r}")
        allow_dynamic()
        process_sets = []
    # Entries that repeat each other fail before the job starts (the global set's ranks are
    # known only once it has).
    check_duplicates(list(process_sets or []))
    with _init_lock:
        if is_initialized():
            return
        from horotopo.reliability import install_excepthook

        # An exception that kills one rank's script must end the job, not leave the other
        # ranks waiting for it in their next collective.
        install_excepthook()
        try:
            _check_settings()
            rt = Runtime(comm)
            rt.start()
        except config.ConfigError as exc:
            # The hook above ends the job through exc.exit_quietly when nothing catches it.
            exc.exit_quietly = functools.partial(  # type: ignore[attr-defined]
                _exit_on_settings_error, exc)
            raise
        # Published once started, before the process sets are registered: registering the
        # communicator sets gathers through hvd's own allgather_object, which finds the
        # runtime here. A failure unpublishes it.
        state.publish(rt)
        try:
            _timeline_from_env(rt)
            global_process_set.ranks = list(range(rt.size))
            _register_process_sets(rt, list(process_sets or []))
        except BaseException:
            state.withdraw()
            rt.stop()  # the other ranks learn of it at their next cycle, instead of hanging
            raise
        if not _atexit_done:
            atexit.register(_atexit)
            _atexit_done = True


def _check_settings() -> None:
    """Every declared setting's value, checked before anything starts: a bad one is reported
    by init(), not by whichever later step would read it first (the planner, the first GPU
    reduce). Several are reported together, on one line.

    Raises
    ------
    horotopo.config.ConfigError
        Naming each bad variable, its value and what is allowed.
    """
    problems = [row.error for row in config.effective() if row.error]
    if problems:
        raise config.ConfigError("; ".join(problems))


SETTINGS_ERROR_EXIT = 2


def _exit_on_settings_error(exc: BaseException) -> None:
    """End the job for a settings error from init() that nothing caught: one line, exit 2.

    Every rank reads the same environment as a rule, so every rank fails alike: rank 0 says
    the line and exits, and the launcher (mpiexec, mpirun) ends the others, which wait for
    that. A rank still running after the grace failed alone: it names itself and aborts the
    job. The settings are read before MPI starts; in a job of several processes MPI is started
    here, since a launcher ends the job on one process's failure only once it has.
    """
    door = _mpi_door() if config.launcher_size() > 1 else None
    place = door.world_rank_size() if door is not None else None
    if place is not None and place[0] != 0 and place[1] > 1:
        time.sleep(config.reliability_params_or_defaults().settings_error_grace_s)
        # the one abort path: the line, then a pause for the launcher to forward it before
        # MPI_Abort's clean-up ends the launcher's proxy (which lost the line now and then)
        abort(f"horotopo: rank {place[0]}: {exc}", SETTINGS_ERROR_EXIT)
    else:
        _say(f"horotopo: {exc}")
    os._exit(SETTINGS_ERROR_EXIT)


def _mpi_door() -> Any:
    """The MPI door, MPI started; None when MPI cannot start (then this process is alone)."""
    try:
        from horotopo.transport import mpi as door

        return door
    except Exception:  # noqa: BLE001 - a broken MPI must not hide the setting's message
        return None


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not stop the exit
        pass


def shutdown() -> None:
    """Stop the background thread on every rank. Never hangs: it gives up after a timeout
    (``HOROTOPO_SHUTDOWN_TIMEOUT`` seconds, default 15) if a peer is gone."""
    with _init_lock:
        rt = state.withdraw()
    if rt is not None:
        rt.stop()
        if rt.rank == 0:
            # The background thread closes the timeline when it ends; this covers a thread
            # that did not stop within the timeout.
            timeline.stop()


def retune(mode: str = "quick") -> Dict[str, Any]:
    """Re-probe the links now and switch every rank to a plan for what was measured.

    Collective, like ``barrier()``: every rank must call it (with the same ``mode``). The
    runtime also re-plans on its own when its transfers stay slower than the plan; this is the
    explicit form, for when the caller knows the network changed.

    Parameters
    ----------
    mode : {"quick", "full"}
        The probe to run (see ``HOROTOPO_PROBE``).

    Returns
    -------
    dict
        What happened: old and new plan digests, modelled throughputs (bytes/s), seconds.
    """
    if mode not in RETUNE_MODES:
        raise ValueError(f"retune(mode={mode!r}): mode must be one of {', '.join(RETUNE_MODES)}")
    rt = runtime()
    event = rt.wait(rt.enqueue(RETUNE, [(unnamed("retune"), None, None)],
                               root=RETUNE_MODES.index(mode)))[0]
    return dataclasses.asdict(event)


def _atexit() -> None:
    try:
        shutdown()
    except Exception:  # interpreter exit: nothing useful left to report to
        pass


def size() -> int:
    """Number of ranks."""
    return runtime().size


def rank() -> int:
    """This process's rank, 0 .. size()-1."""
    return runtime().rank


def local_size() -> int:
    """Number of ranks on this host (hosts are told apart by hostname)."""
    return runtime().local_size


def local_rank() -> int:
    """This process's index among the ranks on its host."""
    return runtime().local_rank


def cross_size() -> int:
    """Number of hosts that have a rank with this local rank."""
    return runtime().cross_size


def cross_rank() -> int:
    """This host's index among the hosts that have a rank with this local rank."""
    return runtime().cross_rank


def is_homogeneous() -> bool:
    """True if every host runs the same number of ranks."""
    rt = runtime()
    counts = {h: rt.hosts.count(h) for h in rt.hosts}
    return len(set(counts.values())) == 1


def mpi_threads_supported() -> bool:
    """True if MPI runs with MPI_THREAD_MULTIPLE."""
    from horotopo.transport.mpi import supports_threads

    return supports_threads(runtime().thread_level)


def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """True when CuPy is importable (CUDA buffers go through CuPy, not a compiled extension)."""
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


def rocm_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Create a Chrome-trace timeline at ``file_path`` and record every op into it.

    As in Horovod, only rank 0 (the coordinator) writes the file; the call is accepted on every
    rank and does nothing elsewhere. Starting again with the same path keeps writing that
    file; another path closes the current one first. Unlike Horovod, the job need not have
    been started with ``HOROVOD_TIMELINE=DYNAMIC`` (a timeline costs nothing while off).

    Parameters
    ----------
    file_path : str
        The timeline file (JSON; open it in chrome://tracing or https://ui.perfetto.dev).
    mark_cycles : bool
        Mark each runtime cycle that has work (Horovod's ``HOROVOD_TIMELINE_MARK_CYCLES``).

    Raises
    ------
    ValueError
        Before init() (Horovod's message).
    OSError
        On rank 0, when the file cannot be created.
    """
    _start_timeline(runtime(), file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording and close the timeline file (a no-op when none is being written).

    Raises ValueError before init(), as Horovod does.
    """
    if runtime().rank == 0:
        timeline.stop()


def _start_timeline(rt: Runtime, file_path: str, mark_cycles: bool) -> None:
    if rt.rank != 0:
        return
    plan = rt.plan
    timeline.start(file_path, mark_cycles,
                    label=f"horotopo job: {rt.size} ranks, as rank 0 saw it",
                    info={"size": rt.size, "hosts": list(rt.hosts), "plan": plan.digest,
                          "trees": [{"root": t.root, "share": t.share} for t in plan.trees]})


def _timeline_from_env(rt: Runtime) -> None:
    """Start the timeline that HOROVOD_TIMELINE names (``horotopo-run --timeline-filename``).

    ``DYNAMIC`` is Horovod's "no file yet, start_timeline() will come", so it starts nothing.
    """
    path = config.get("HOROVOD_TIMELINE")
    if path is None or path.strip().upper() == "DYNAMIC":
        return
    try:
        _start_timeline(rt, path, bool(config.get("HOROVOD_TIMELINE_MARK_CYCLES")))
    except OSError as exc:
        raise OSError(exc.errno, f"HOROVOD_TIMELINE={path!r}: cannot write the timeline "
                                 f"({exc.strerror})") from exc


def _register_process_sets(rt: Any, process_sets: Sequence[ProcessSet]) -> None:
    """Register ``hvd.init(process_sets=[...])``'s sets in order (ids 1, 2, ...), once none
    repeats another or the global set (:func:`check_duplicates`)."""
    check_duplicates(process_sets, rt.size)
    for ps in process_sets:
        if ps.mpi_comm is None:
            register(rt, ps)
    if process_sets:
        taken = {0} | {ps.process_set_id for ps in process_sets if ps.mpi_comm is None}
        _init_communicator_sets(rt, [ps for ps in process_sets if ps.mpi_comm is not None],
                                taken)


def _init_communicator_sets(rt: Any, comm_sets: Sequence[ProcessSet], taken: set) -> None:
    """Register the sets of ``init(process_sets=[ProcessSet(comm), ...])``.

    A rank knows only its own communicators' members, so every rank's lists are gathered and
    each distinct one is registered, entry by entry, in the order of its sorted ranks: the
    same sets under the same ids everywhere. A communicator that repeats a set registered
    before keeps no id (Horovod invalidates such duplicates too). Runs inside ``init()``,
    which has published the runtime by then, so hvd's own ``allgather_object`` serves.
    """
    from horotopo.transport.mpi import member_ranks

    mine = [member_ranks(ps.mpi_comm, rt.rank) for ps in comm_sets]
    everyone = allgather_object(mine, name="process_set.communicators")
    counts = [len(lists) for lists in everyone]
    if len(set(counts)) != 1:
        raise ValueError("hvd.init(process_sets=...): every rank must pass the same number of "
                         f"communicator process sets; ranks passed {counts}")
    if not mine:
        return
    for k in range(len(mine)):
        # Checked on every rank from the same gathered lists, so all raise together.
        for r, lists in enumerate(everyone):
            if any(everyone[q][k] != lists[k] for q in lists[k]):
                raise ValueError(f"hvd.init(process_sets=...): entry {k} is a communicator "
                                 f"of ranks {list(lists[k])} on rank {r}, but its members "
                                 "passed other communicators there")
        for ranks in sorted({lists[k] for lists in everyone}):
            if rt.sets.find(ranks) is None:
                register(rt, ProcessSet(ranks))
    for ps, ranks in zip(comm_sets, mine):
        ps.ranks = list(ranks)
        pid = rt.sets.find(ranks)
        ps.process_set_id = None if pid in taken else pid
        taken.add(pid)
