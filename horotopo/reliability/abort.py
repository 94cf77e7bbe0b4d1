"""The abort path: an unhandled exception on any rank, or a watchdog that fired, ends the job.

Like MPI's own ``-m`` runner: :func:`install_excepthook` makes an unhandled exception print its
traceback under a line naming the rank, then call ``MPI_Abort`` on ``COMM_WORLD``, so the
launcher tears the whole job down with a non-zero exit instead of the other ranks waiting
forever in their next collective. :func:`abort` is the one way out, used by the hook and by
:class:`~horotopo.reliability.watchdog.Watchdog`.

MPI is reached only through its door, :mod:`horotopo.transport.mpi`, and only when this
process has already loaded MPI: importing MPI's binding here would initialize MPI, which the
abort path must never do (it runs before init, after finalize, and in processes without MPI).
This module touches the OS on purpose (``os._exit``, a timer thread): it is the process-level
safety net.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from types import ModuleType
from typing import Any, Callable, Optional, Tuple

from .. import config
from ..transport import loaded_mpi
from .liveness import FAULTY, faulty

__all__ = ["abort", "install_excepthook", "uninstall_excepthook", "who", "ABORT_EXIT_CODE"]

ABORT_EXIT_CODE = 1


def _door() -> Optional[ModuleType]:
    """The MPI door when this process has loaded MPI, else None (then there is no MPI job to
    abort); importing the door then costs nothing that has not happened already."""
    try:
        return loaded_mpi()
    except Exception:  # noqa: BLE001 - a broken MPI module must not hide the real error
        return None


def _world() -> Optional[Tuple[ModuleType, int, int]]:
    """``(door, rank, size)`` while MPI is up (not finalized); never initializes MPI."""
    door = _door()
    if door is None:
        return None
    place = door.world_rank_size()
    return None if place is None else (door, place[0], place[1])


def who() -> str:
    """This process in words: ``rank R of N (host, pid P)``, or ``process (host, pid P)``."""
    world = _world()
    where = f"{socket.gethostname()}, pid {os.getpid()}"
    if world is None:
        return f"process ({where})"
    return f"rank {world[1]} of {world[2]} ({where})"


def abort(message: str, code: int = ABORT_EXIT_CODE) -> None:
    """Print ``message`` to stderr and end the whole job: ``MPI_Abort`` on ``COMM_WORLD``
    (``abort_flush_s`` later, so that the launcher forwards the message first).

    Without MPI (or after MPI_Finalize) the process alone exits with ``code``. If MPI_Abort has
    not ended the process after ``abort_grace_s`` (:class:`~horotopo.params.ReliabilityParams`),
    ``os._exit(code)`` does; the launcher then sees a failed process and ends the others.
    """
    try:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not stop the abort
        pass
    world = _world()
    if world is None:
        os._exit(code)
    reliability = config.reliability_params_or_defaults()
    time.sleep(reliability.abort_flush_s)
    grace = threading.Timer(reliability.abort_grace_s, os._exit, args=(code,))
    grace.daemon = True
    grace.start()
    world[0].abort_world(code)
    os._exit(code)  # Abort does not return; this is for a runtime that does


_previous_hook: Optional[Callable[..., Any]] = None


def abort_excepthook(etype: type, value: BaseException, tb: Any) -> None:
    exit_quietly = getattr(value, "exit_quietly", None)
    if callable(exit_quietly):  # a user error that ends the job in one line (init's settings)
        exit_quietly()
    text = "".join(traceback.format_exception(etype, value, tb))
    world = _world()
    if world is None or world[2] == 1:
        # One process: nobody waits for it; behave like plain Python (traceback, exit 1).
        (_previous_hook or sys.__excepthook__)(etype, value, tb)
        return
    last = f"horotopo: rank {world[1]} called MPI_Abort after an unhandled {etype.__name__}"
    if FAULTY not in text and not getattr(value, "job_ended", False):
        # An error that blames other ranks (a peer left), or that ended every rank's job (a
        # stall), does not make this one faulty.
        last += f" ({faulty([world[1]], 'its unhandled exception ends the job')})"
    abort(f"horotopo: unhandled exception on {who()}; aborting the job\n{text}{last}")


def install_excepthook() -> None:
    """Make an unhandled exception on any rank abort the whole MPI job (idempotent).

    The hook prints ``horotopo: unhandled exception on rank R of N (host, pid P)`` and the
    traceback, then calls ``MPI_Abort(COMM_WORLD, 1)``. With one rank, or before MPI is
    initialized, it is plain Python's behaviour.
    """
    global _previous_hook
    if sys.excepthook is not abort_excepthook:
        _previous_hook = sys.excepthook
        sys.excepthook = abort_excepthook


def uninstall_excepthook() -> None:
    """Restore the hook that :func:`install_excepthook` replaced."""
    global _previous_hook
    if sys.excepthook is abort_excepthook:
        sys.excepthook = _previous_hook or sys.__excepthook__
        _previous_hook = None
