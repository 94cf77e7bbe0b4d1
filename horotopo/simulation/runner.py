"""Run ranks over a simulated topology, one simulation per child process.

SimGrid allows one platform per process (the first run seals it), and an internal SimGrid
error aborts the whole process; a forked child per simulation gives each run a fresh engine,
frees its memory afterwards, and turns a crash into an exception here.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from typing import Any, Callable, Optional, Sequence

from .. import config
from ..topology import Topology
from ..transport.simulated import SimulatedTransport
from .actors import SimRun, Simulation
from .platform import build_platform
from .support import SimCosts, SimulationConfigError, SimulationError, load_simgrid

__all__ = ["run_simulated", "run_here"]


def run_here(topology: Topology, fn: Callable[[SimulatedTransport], Any], *,
             scale: float = 1.0, costs: Optional[SimCosts] = None,
             network_config: Sequence[str] = (),
             progress: Optional[Callable[[str], None]] = None,
             progress_every_s: Optional[float] = None) -> SimRun:
    """Build ``topology`` and run ``fn(transport)`` on every rank, in this process (which can
    hold only this one simulation; see :func:`run_simulated`). ``costs`` None charges the
    active cost profile's (:meth:`SimCosts.active`)."""
    sim = Simulation(SimCosts.active() if costs is None else costs, network_config, progress,
                     progress_every_s)
    platform = build_platform(sim, topology)
    return sim.run(platform.hosts, fn, make_transport=SimulatedTransport, scale=scale,
                   names=platform.names)


def _current_cpu() -> Optional[int]:
    """The CPU this process last ran on (``/proc/self/stat``'s 39th field), None if unknown."""
    try:
        with open("/proc/self/stat") as fh:
            # the command name (2nd field) may hold spaces: count from the ')' closing it
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[36])
    except (OSError, IndexError, ValueError):
        return None


def pin_to_one_cpu() -> Optional[int]:
    """Pin this process to one CPU (``HOROTOPO_SIM_CPU``; default the one it runs on); the
    CPU, or None where it stays unpinned (``-1``, or no ``sched_setaffinity``).

    SimGrid's Python actors are threads of which one runs at a time, handing the CPU to the
    maestro and back at every simcall; on one core a hand-off is a cheap switch, across two
    idle cores a wake-up of the other core, so pinned, a message costs about half the wall
    time it costs unpinned (``benchmarks/simgrid_floor.py`` measures both).

    Raises
    ------
    SimulationConfigError
        ``HOROTOPO_SIM_CPU`` names a CPU this process may not run on.
    """
    choice = config.get("HOROTOPO_SIM_CPU")
    if choice == -1 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if choice is None:
        choice = _current_cpu()
        if choice not in allowed:
            choice = min(allowed)
    elif choice not in allowed:
        raise SimulationConfigError(f"HOROTOPO_SIM_CPU={choice}: not one of the CPUs this "
                                    f"process may run on ({sorted(allowed)})")
    os.sched_setaffinity(0, {choice})
    return choice


def _child(conn: Any, topology: Topology, fn: Callable[[SimulatedTransport], Any],
           scale: float, costs: Optional[SimCosts], network_config: Sequence[str],
           progress: Optional[Callable[[str], None]], progress_every_s: Optional[float]) -> None:
    try:
        pin_to_one_cpu()  # the child only: the caller's process keeps its CPUs
        out: Any = ("ok", run_here(topology, fn, scale=scale, costs=costs,
                                   network_config=network_config, progress=progress,
                                   progress_every_s=progress_every_s))
    except SimulationConfigError as exc:  # the caller's input, not a failure of the run
        out = ("config", f"{exc}", "")
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises
        cause = exc.__cause__ if isinstance(exc, SimulationError) and exc.__cause__ else exc
        out = ("error", f"{exc}", "".join(traceback.format_exception(cause)))
    try:
        conn.send_bytes(pickle.dumps(out))
    except Exception as exc:  # noqa: BLE001 - an unpicklable result
        conn.send_bytes(pickle.dumps(("error", f"the results cannot be sent back: {exc}", "")))
    conn.close()


def _death(exitcode: Optional[int]) -> str:
    """Why the simulation's process ended without a result, from its exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = (" (the kernel's out-of-memory killer sends it: see dmesg; a simulation of "
               "thousands of ranks can take tens of GB)" if -exitcode == signal.SIGKILL else "")
        return f"the simulation process was killed by {name}{why}"
    return (f"the simulation process died (exit code {exitcode}); SimGrid aborts on internal "
            "errors, see its stderr")


def run_simulated(topology: Topology, fn: Callable[[SimulatedTransport], Any], *,
                  scale: float = 1.0, costs: Optional[SimCosts] = None,
                  timeout_s: Optional[float] = None,
                  network_config: Sequence[str] = (),
                  progress: Optional[Callable[[str], None]] = None,
                  progress_every_s: Optional[float] = None) -> SimRun:
    """Run ``fn(transport)`` on every rank of ``topology``, simulated, in a child process.

    Parameters
    ----------
    topology : Topology
        The network (declared or measured form) and where each rank runs.
    fn : callable
        Each rank's body, given its :class:`~horotopo.transport.simulated.SimulatedTransport`;
        its return value (picklable) is the rank's result. The child is forked, so ``fn`` may
        be any callable, a closure included.
    scale : float
        Simulated bytes per real byte of the algorithms' messages.
    costs : SimCosts, optional
        Software costs charged as simulated time; None: the active cost profile's
        (:func:`horotopo.costs.charges`, what the planner charges too).
    timeout_s : float, optional
        Wall-clock limit for the child.
    network_config : sequence of str
        SimGrid settings ``NAME:VALUE`` applied after the simulator's own network model
        (:class:`~horotopo.transport.simulated.Simulation`).
    progress : callable, optional
        Given a line (messages sent, the simulated clock, wall seconds so far) every
        ``progress_every_s`` seconds of wall time while the simulation runs; it is called in
        the child process (printing to stderr works: the child shares it).

    Returns
    -------
    SimRun
        Results per rank, the simulated clock, messages, wall time.

    Raises
    ------
    SimulationError
        A rank raised (the message and the rank's traceback), the ranks deadlocked, or the
        child died (SimGrid aborts on internal errors) or passed ``timeout_s``.
    """
    load_simgrid()  # a missing simulator is said here, in the caller's process
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, topology, fn, scale, costs,
                                            tuple(network_config), progress,
                                            progress_every_s), daemon=True)
    proc.start()
    send.close()
    try:
        if not recv.poll(timeout_s):
            raise SimulationError(f"the simulation did not finish within {timeout_s} s of "
                                  "wall time")
        try:
            out = pickle.loads(recv.recv_bytes())
        except EOFError:
            proc.join()
            raise SimulationError(_death(proc.exitcode)) from None
    finally:
        if proc.is_alive() and timeout_s is not None:
            proc.terminate()
        proc.join()
        recv.close()
    if out[0] == "ok":
        return out[1]
    if out[0] == "config":
        raise SimulationConfigError(out[1])
    raise SimulationError(f"{out[1]}\n--- in the simulation:\n{out[2]}".rstrip())
