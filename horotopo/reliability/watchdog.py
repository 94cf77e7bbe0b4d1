"""The watchdog: a thread that aborts the job when a guarded operation outlives its deadline.

A guarded operation (a collective, a re-plan) that has not finished after ``timeout_s``
(default 60 s, ``HOROTOPO_TIMEOUT_S``, read through :mod:`horotopo.config`) makes the watchdog
print which ranks are at fault and abort the job (:func:`~horotopo.reliability.abort.
abort`). A peer killed by a signal is normally noticed sooner by the launcher (MPICH's hydra
kills the job when one process dies); the watchdog covers the peers that hang, stop or die
where the launcher cannot see them. Whom it blames comes from a ``describe`` callable; the
runtime's is :func:`~horotopo.reliability.liveness.verdict`, which blames only the ranks that
do not answer a liveness ping (who this rank happened to wait for is no evidence: a running
rank may itself wait for the stopped one).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, Mapping, Optional

from .. import config
from ..config import ConfigError
from .abort import abort, who

__all__ = ["Watchdog", "timeout_from_env", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV"]

TIMEOUT_ENV = "HOROTOPO_TIMEOUT_S"
DEFAULT_TIMEOUT_S: float = config.lookup(TIMEOUT_ENV).default


def timeout_from_env(env: Optional[Mapping[str, str]] = None) -> float:
    """The dead-peer deadline in seconds: ``HOROTOPO_TIMEOUT_S`` (> 0), default 60."""
    return float(config.get(TIMEOUT_ENV, env=env))


class Watchdog:
    """A thread that aborts the job when a guarded operation outlives its deadline.

    Use :meth:`guard` around each collective::

        dog = Watchdog(60.0, describe=tracked.describe_wait)
        with dog.guard("allreduce #12 (4 MiB)"):
            engine.allreduce(x)

    When the deadline passes, the message names this rank, the operation, how long it waited
    and ``describe()`` (who is at fault, or whom it was waiting for), then :func:`abort` ends the job. ``on_expire``
    replaces the abort (tests).

    Parameters
    ----------
    timeout_s : float
        Seconds one guarded operation may take (> 0).
    describe : callable, optional
        Returns the "waiting for" part of the message.
    on_expire : callable, optional
        Called with the message instead of :func:`abort`.
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S,
                 describe: Optional[Callable[[], str]] = None,
                 on_expire: Optional[Callable[[str], None]] = None) -> None:
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ConfigError(f"watchdog timeout must be a positive number of seconds, "
                              f"got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.teardown_wait_s = config.reliability_params().teardown_wait_s
        self.describe = describe or (lambda: "no description of the wait")
        self.on_expire = on_expire
        self._cv = threading.Condition()
        self._what: Optional[str] = None
        self._deadline = 0.0
        self._started = 0.0
        self._token = 0
        self._stop = False
        self.fired: Optional[str] = None
        self._thread = threading.Thread(target=self._loop, name="horotopo-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Arm the deadline for the ``with`` body (not reentrant: inner guards are ignored)."""
        with self._cv:
            nested = self._what is not None
            if not nested:
                self._token += 1
                self._what = what
                self._started = time.monotonic()
                self._deadline = self._started + self.timeout_s
                self._cv.notify()
        try:
            yield
        finally:
            if not nested:
                with self._cv:
                    self._what = None
                    self._cv.notify()

    def close(self) -> None:
        """Stop the thread (it is a daemon, so this is only tidiness)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=self.teardown_wait_s)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and self._what is None:
                    self._cv.wait()
                if self._stop:
                    return
                token = self._token
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cv.wait(timeout=left)
                    continue
                if self._what is None or token != self._token:
                    continue
                waited = time.monotonic() - self._started
                what = self._what
            # Outside the lock: the description may ping the other ranks for seconds.
            msg = (f"horotopo: {who()} waited {waited:.1f} s (> {TIMEOUT_ENV}="
                   f"{self.timeout_s:g}) in {what}; {self.describe()}. Aborting the job.")
            with self._cv:
                if self._what is None or token != self._token:
                    continue  # it finished while the others were asked: no fault after all
                self.fired = msg
                self._what = None
            if self.on_expire is not None:
                self.on_expire(msg)
            else:
                abort(msg)
