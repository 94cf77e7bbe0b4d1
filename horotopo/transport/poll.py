"""The one poll loop of horotopo: progress by polling, back off while idle, stop at a deadline.

Every wait in the package that cannot block inside the library (a blocking MPI call cannot be
given up on, and MPICH busy-polls inside it, which on an oversubscribed machine takes the CPU
from the ranks that have work) goes through :func:`poll`. The transport's ``waitsome``, its
deadline-bounded ``wait`` and the small collective steps built on them all use it, so there is
one place that decides how a waiting rank spends its time.

This module is the bottom of the transport package: it imports nothing from horotopo.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Optional, Tuple

from ..params import RUNTIME

__all__ = ["IDLE", "PROGRESS", "DONE", "TransportError", "TransportTimeout",
           "poll", "deadline_after"]

#: What one call of a poll step reports (see :func:`poll`).
IDLE, PROGRESS, DONE = 0, 1, 2



class TransportError(RuntimeError):
    """The transport cannot do what was asked (closed, unsupported buffer, no tags left)."""


class TransportTimeout(TransportError):
    """A wait passed its deadline.

    Attributes
    ----------
    missing : tuple of int
        The peers whose messages had not arrived (or whose sends had not completed) when the
        deadline passed, in increasing order; empty when the transport cannot tell (a library
        collective does not say which rank it waits for).
    """

    def __init__(self, message: str, missing: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.missing: Tuple[int, ...] = tuple(sorted({int(p) for p in missing}))


def deadline_after(timeout_s: Optional[float],
                   clock: Callable[[], float] = time.perf_counter) -> Optional[float]:
    """The ``clock()`` value ``timeout_s`` from now, or None for no deadline.

    ``clock`` is ``time.perf_counter`` by default; pass a transport's ``now`` where the
    deadline goes to that transport's ``wait`` (a simulated transport counts simulated time).
    """
    if timeout_s is None:
        return None
    if not timeout_s > 0:
        raise ValueError(f"a timeout must be positive seconds, got {timeout_s!r}")
    return clock() + timeout_s


def poll(step: Callable[[], int], deadline: Optional[float] = None, *, spin_polls: int = 0,
         nap_s: Tuple[float, float] = RUNTIME.idle_nap_s, busy: bool = False,
         clock: Callable[[], float] = time.perf_counter) -> bool:
    """Call ``step`` until it reports :data:`DONE`; back off while it reports :data:`IDLE`.

    Parameters
    ----------
    step : callable
        One poll: returns :data:`DONE` when the wait is over, :data:`PROGRESS` when something
        completed but the wait goes on (the back-off restarts: more is likely soon), or
        :data:`IDLE`.
    deadline : float, optional
        ``clock()`` value after which an idle poll ends the wait. None waits for ever. Checked
        only after idle polls, so a wait that keeps progressing is never cut.
    spin_polls : int
        Idle polls made back to back before the first pause (latency-bound waits: the engine's
        chunks complete within microseconds of each other).
    nap_s : (float, float)
        The first and the longest pause; each idle pause doubles up to the longest. Equal
        values give a constant pause.
    busy : bool
        Pause with ``sched_yield`` instead of sleeping: for ranks timing a transfer, which
        must notice its end at once but should let the kernel and other ranks run.
    clock : callable
        The clock ``deadline`` is read on (``time.perf_counter`` by default; a transport's
        ``now``).

    Returns
    -------
    bool
        True when ``step`` reported DONE, False when the deadline passed first.
    """
    idle = 0
    nap = nap_s[0]
    while True:
        state = step()
        if state == DONE:
            return True
        if state == PROGRESS:
            idle, nap = 0, nap_s[0]
            continue
        if deadline is not None and clock() > deadline:
            return False
        idle += 1
        if idle <= spin_polls:
            continue
        if busy:
            os.sched_yield()
        else:
            time.sleep(nap)
            nap = min(2 * nap, nap_s[1])
