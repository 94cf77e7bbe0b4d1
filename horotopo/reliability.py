"""Never hang, never die quietly: abort on unhandled exceptions, a watchdog for dead peers, and
validated environment values.

Three pieces, usable separately:

- :func:`install_excepthook`: ``python -m mpi4py`` style. An unhandled exception on any rank
  prints its traceback under a line naming the rank, then calls ``MPI_Abort`` on
  ``COMM_WORLD``, so the launcher tears the whole job down with a non-zero exit instead of the
  other ranks waiting forever in their next collective.
- :class:`TrackedTransport` and :class:`Watchdog`: the transport wrapper remembers which peers
  this rank has messages outstanding with (and, for the adaptive layer, how fast its sends to
  each peer went). The watchdog is a thread: a guarded operation that has not finished after
  ``timeout_s`` (default 60 s, ``HOROTOPO_TIMEOUT_S``) prints the ranks it was waiting for and
  aborts the job. A peer killed by a signal is normally noticed sooner by the launcher (MPICH's
  hydra kills the job when one process dies); the watchdog covers the peers that hang, stop or
  die where the launcher cannot see them.
- :class:`LivenessResponder`: a thread that answers liveness pings on a communicator of its
  own, so a watchdog that fired inside a *library* collective (where no request names a peer)
  can still find which ranks are dead or stopped: those that do not answer.
- :func:`timeout_from_env`: the watchdog's deadline, read through :mod:`horotopo.config`
  (whose :class:`ConfigError` this module re-exports).

This module touches MPI (``Abort``) and the OS (threads, ``os._exit``) on purpose: it is the
process-level safety net.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import config
from .config import ConfigError
from .transport.base import Transport, WrappedTransport, allreduce_point_to_point

__all__ = ["ConfigError", "timeout_from_env",
           "install_excepthook", "uninstall_excepthook", "abort", "TrackedTransport",
           "Watchdog", "PeerFailure", "LivenessResponder", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV",
           "ABORT_EXIT_CODE"]

TIMEOUT_ENV = "HOROTOPO_TIMEOUT_S"
DEFAULT_TIMEOUT_S: float = config.lookup(TIMEOUT_ENV).default
# Up to this many ranks the engine's metadata check runs point to point (2 (n-1) tiny messages
# per rank), so a stuck check names its peer; above it, one library allreduce.
CONTROL_P2P_MAX_RANKS = 64
ABORT_EXIT_CODE = 1
# If MPI_Abort itself does not end the process (a runtime that never returns from it while
# another thread holds its lock), the process exits on its own after this long.
ABORT_GRACE_S = 10.0


# ---------------------------------------------------------------------------------------------
# environment values (parsed and checked by horotopo.config, which also owns ConfigError)


def timeout_from_env(env: Optional[Mapping[str, str]] = None) -> float:
    """The dead-peer deadline in seconds: ``HOROTOPO_TIMEOUT_S`` (> 0), default 60."""
    return float(config.get(TIMEOUT_ENV, env=env))


# ---------------------------------------------------------------------------------------------
# abort


def _world() -> Any:
    """COMM_WORLD when MPI is up (and not finalized), else None; never initializes MPI."""
    mpi_mod = sys.modules.get("mpi4py.MPI")
    if mpi_mod is None:
        return None
    try:
        if not mpi_mod.Is_initialized() or mpi_mod.Is_finalized():
            return None
    except Exception:  # noqa: BLE001 - a broken MPI module must not hide the real error
        return None
    return mpi_mod.COMM_WORLD


def _who() -> str:
    world = _world()
    where = f"{socket.gethostname()}, pid {os.getpid()}"
    if world is None:
        return f"process ({where})"
    return f"rank {world.Get_rank()} of {world.Get_size()} ({where})"


def abort(message: str, code: int = ABORT_EXIT_CODE) -> None:
    """Print ``message`` to stderr and end the whole job: ``MPI_Abort`` on ``COMM_WORLD``.

    Without MPI (or after MPI_Finalize) the process alone exits with ``code``. If MPI_Abort has
    not ended the process after :data:`ABORT_GRACE_S`, ``os._exit(code)`` does; the launcher
    then sees a failed process and ends the others.
    """
    try:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not stop the abort
        pass
    world = _world()
    if world is None:
        os._exit(code)
    grace = threading.Timer(ABORT_GRACE_S, os._exit, args=(code,))
    grace.daemon = True
    grace.start()
    world.Abort(code)
    os._exit(code)  # Abort does not return; this is for a runtime that does


_previous_hook: Optional[Callable[..., Any]] = None


def _excepthook(etype: type, value: BaseException, tb: Any) -> None:
    text = "".join(traceback.format_exception(etype, value, tb))
    world = _world()
    if world is None or world.Get_size() == 1:
        # One process: nobody waits for it; behave like plain Python (traceback, exit 1).
        (_previous_hook or sys.__excepthook__)(etype, value, tb)
        return
    abort(f"horotopo: unhandled exception on {_who()}; aborting the job\n{text}"
          f"horotopo: rank {world.Get_rank()} called MPI_Abort after an unhandled "
          f"{etype.__name__}")


def install_excepthook() -> None:
    """Make an unhandled exception on any rank abort the whole MPI job (idempotent).

    The hook prints ``horotopo: unhandled exception on rank R of N (host, pid P)`` and the
    traceback, then calls ``MPI_Abort(COMM_WORLD, 1)``. With one rank, or before MPI is
    initialized, it is plain Python's behaviour.
    """
    global _previous_hook
    if sys.excepthook is not _excepthook:
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook


def uninstall_excepthook() -> None:
    """Restore the hook that :func:`install_excepthook` replaced."""
    global _previous_hook
    if sys.excepthook is _excepthook:
        sys.excepthook = _previous_hook or sys.__excepthook__
        _previous_hook = None


# ---------------------------------------------------------------------------------------------
# the tracked transport


class PeerFailure(RuntimeError):
    """MPI failed a request with ``peers``: those ranks died or their connection broke."""

    def __init__(self, peers: Sequence[int], message: str) -> None:
        super().__init__(message)
        self.peers = list(peers)


class TrackedTransport(WrappedTransport):
    """A :class:`Transport` that remembers its outstanding requests and times its sends.

    It adds no messages. For each request it keeps ``(peer, kind, nbytes)`` until the request
    is seen complete in :meth:`waitsome`/:meth:`waitall`/:meth:`test`. For sends it also keeps,
    per destination, the bytes sent and the *busy* seconds (time during which at least one send
    to that peer was outstanding): bytes over busy time is the rate the engine's own traffic
    achieved on that link, a lower bound on what the link can do that equals it when the link
    is the bottleneck.

    Parameters
    ----------
    inner : Transport
        The transport to wrap; it stays the caller's (``close`` closes it only when
        ``owns=True``).
    """

    def __init__(self, inner: Transport, owns: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(inner, owns)
        self._clock = clock
        self._pending: Dict[int, Tuple[int, str, int]] = {}
        self._in_collective = False
        self._control = False       # inside allreduce_control: its sends are not link traffic
        self._untimed: set = set()  # ids of pending control sends
        n = inner.size
        self.sent_bytes = [0] * n
        self.busy_s = [0.0] * n
        self._out = [0] * n
        self._since = [0.0] * n
        self.posted = 0
        self.completed = 0

    # -- Transport ------------------------------------------------------------------------------
    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        req = self.inner.isend(buf, dest, tag)
        nbytes = int(getattr(buf, "nbytes", 0))
        self._pending[id(req)] = (dest, "send", nbytes)
        self.posted += 1
        if self._control:
            self._untimed.add(id(req))
            return req
        if self._out[dest] == 0:
            self._since[dest] = self._clock()
        self._out[dest] += 1
        return req

    def irecv(self, buf: Any, source: int, tag: int) -> Any:
        req = self.inner.irecv(buf, source, tag)
        self._pending[id(req)] = (source, "recv", int(getattr(buf, "nbytes", 0)))
        self.posted += 1
        return req

    def test(self, request: Any) -> bool:
        key = id(request)
        done = self.inner.test(request)
        if done:
            self._finish(key, self._clock())
        return done

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        keys = [id(r) for r in requests]  # before: mpi4py nulls completed requests in place
        try:
            done = self.inner.waitsome(requests)
        except Exception as exc:  # noqa: BLE001 - re-raised, naming the failed peers
            raise self._failure(requests, exc) from exc
        now = self._clock()
        for i in done:
            self._finish(keys[i], now)
        return done

    def waitall(self, requests: Sequence[Any]) -> None:
        keys = [id(r) for r in requests]
        try:
            self.inner.waitall(requests)
        except Exception as exc:  # noqa: BLE001 - re-raised, naming the failed peers
            raise self._failure(requests, exc) from exc
        now = self._clock()
        for key in keys:
            self._finish(key, now)

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: Any) -> None:
        self._in_collective = True
        try:
            self.inner.allreduce(sendbuf, recvbuf, op)
        finally:
            self._in_collective = False

    def allreduce_control(self, buf: Any, op: Any) -> None:
        # Point to point up to CONTROL_P2P_MAX_RANKS, so that a rank stuck in the engine's
        # metadata check can still name the peer it waits for (a library collective cannot).
        if self.size <= CONTROL_P2P_MAX_RANKS:
            self._control = True
            try:
                allreduce_point_to_point(self, buf, op)
            finally:
                self._control = False
        else:
            self.allreduce(buf, buf, op)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _failure(self, requests: Sequence[Any], exc: BaseException) -> "PeerFailure":
        """The error for a wait that MPI failed: test each request to find the failed peers.

        MPICH reports a dead process as an error on the requests that involve it (when the
        launcher has not killed the job first: ``mpiexec -disable-auto-cleanup``).
        """
        failed = set()
        for req in requests:
            info = self._pending.get(id(req))
            if info is None:
                continue
            # The wait completed the failed requests (an mpi4py request is falsy once null),
            # or testing one raises again.
            try:
                gone = not bool(req) or self.inner.test(req)
            except Exception:  # noqa: BLE001 - this request is one that failed
                gone = True
            if gone:
                failed.add(info[0])
                self._pending.pop(id(req), None)
                self._untimed.discard(id(req))
        names = ", ".join(str(p) for p in sorted(failed)) or "unknown"
        return PeerFailure(sorted(failed),
                           f"rank {self.rank}: communication with rank(s) {names} failed "
                           f"(the process died or its connection broke): {exc}")

    def _finish(self, key: int, now: float) -> None:
        info = self._pending.pop(key, None)
        if info is None:
            return
        self.completed += 1
        peer, kind, nbytes = info
        if kind == "send" and key in self._untimed:
            self._untimed.discard(key)
        elif kind == "send":
            self.sent_bytes[peer] += nbytes
            self._out[peer] -= 1
            if self._out[peer] == 0:
                self.busy_s[peer] += now - self._since[peer]

    @property
    def outstanding(self) -> int:
        """Requests posted and not yet seen complete (0 between collectives: no leaks)."""
        return len(self._pending)

    def waiting_on(self) -> Dict[int, Dict[str, int]]:
        """``{peer: {"send": k, "recv": m}}`` over the outstanding requests."""
        out: Dict[int, Dict[str, int]] = {}
        for peer, kind, _ in list(self._pending.values()):
            d = out.setdefault(peer, {"send": 0, "recv": 0})
            d[kind] += 1
        return out

    def describe_wait(self) -> str:
        """Whom this rank waits for, in words (for the watchdog's message)."""
        peers = self.waiting_on()
        if self._in_collective and not peers:
            return "a library collective with every rank (the slowest or a dead rank is there)"
        if not peers:
            return "nothing outstanding (stuck outside the transport)"
        parts = [f"rank {p} ({d['recv']} receive(s), {d['send']} send(s))"
                 for p, d in sorted(peers.items())]
        return "ranks " + ", ".join(str(p) for p in sorted(peers)) + ": " + "; ".join(parts)

    def take_link_stats(self) -> Tuple[List[int], List[float]]:
        """``(bytes, busy seconds)`` per destination since the last call, then reset.

        Call between collectives (nothing outstanding), so every busy period is closed.
        """
        b, s = self.sent_bytes, self.busy_s
        n = self.inner.size
        self.sent_bytes, self.busy_s = [0] * n, [0.0] * n
        return b, s


# ---------------------------------------------------------------------------------------------
# the watchdog


class Watchdog:
    """A thread that aborts the job when a guarded operation outlives its deadline.

    Use :meth:`guard` around each collective::

        dog = Watchdog(60.0, describe=tracked.describe_wait)
        with dog.guard("allreduce #12 (4 MiB)"):
            engine.allreduce(x)

    When the deadline passes, the message names this rank, the operation, how long it waited
    and ``describe()`` (whom it was waiting for), then :func:`abort` ends the job. ``on_expire``
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
        self.describe = describe or (lambda: "unknown peers")
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
        self._thread.join(timeout=5)

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
                msg = (f"horotopo: {_who()} waited {waited:.1f} s (> {TIMEOUT_ENV}="
                       f"{self.timeout_s:g}) in {self._what}; waiting for "
                       f"{self.describe()}. A peer has died or hung; aborting the job.")
                self.fired = msg
                self._what = None
            if self.on_expire is not None:
                self.on_expire(msg)
            else:
                abort(msg)


# ---------------------------------------------------------------------------------------------
# liveness pings


_PING, _PONG = 1, 2


class LivenessResponder:
    """Answers liveness pings from the other ranks; :meth:`silent_ranks` sends them.

    A daemon thread keeps one receive posted on a ``Dup`` of ``comm`` and answers each ping,
    whatever the rest of the process is doing, so only a process that is dead, stopped
    (SIGSTOP) or frozen as a whole stays silent. The thread polls every ``poll_s`` seconds
    rather than blocking, because MPICH spins inside blocking calls and would take a core.

    Collective to create (the ``Dup``) and to :meth:`close`. Needs ``MPI_THREAD_MULTIPLE``:
    the pings run on the watchdog's thread while other threads make MPI calls.
    """

    def __init__(self, comm: Any, poll_s: float = 0.01) -> None:
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RuntimeError("liveness pings need MPI_THREAD_MULTIPLE")
        self._mpi = MPI
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._poll_s = float(poll_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="horotopo-liveness",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import numpy as np

        inbox = np.zeros(1, dtype=np.int64)
        status = self._mpi.Status()
        req = self.comm.Irecv(inbox, source=self._mpi.ANY_SOURCE, tag=_PING)
        replies: List[Tuple[Any, Any]] = []  # (request, buffer): the buffer must outlive it
        try:
            while not self._stop.is_set():
                replies = [(r, b) for r, b in replies if not r.Test()]
                if req.Test(status):
                    answer = inbox.copy()
                    replies.append((self.comm.Isend(answer, dest=status.Get_source(),
                                                    tag=_PONG), answer))
                    req = self.comm.Irecv(inbox, source=self._mpi.ANY_SOURCE, tag=_PING)
                else:
                    self._stop.wait(self._poll_s)
        finally:
            req.Cancel()
            req.Wait()

    def silent_ranks(self, wait_s: float = 2.0) -> List[int]:
        """The other ranks that do not answer a ping within ``wait_s`` seconds."""
        import numpy as np

        others = [r for r in range(self.size) if r != self.rank]
        token = np.full(1, self.rank, dtype=np.int64)
        answers = {r: np.zeros(1, dtype=np.int64) for r in others}
        recvs = {r: self.comm.Irecv(answers[r], source=r, tag=_PONG) for r in others}
        sends = [self.comm.Isend(token, dest=r, tag=_PING) for r in others]
        deadline = time.monotonic() + wait_s
        waiting = set(others)
        while waiting and time.monotonic() < deadline:
            waiting = {r for r in waiting if not recvs[r].Test()}
            if waiting:
                time.sleep(0.01)
        # Leave the rest posted: the process is about to abort, and cancelling a send to a
        # stopped peer could block.
        del sends
        return sorted(waiting)

    def describe(self, wait_s: float = 2.0) -> str:
        """The ping's verdict in words (for the watchdog's message)."""
        silent = self.silent_ranks(wait_s)
        if silent:
            return (f"liveness ping: rank(s) {', '.join(map(str, silent))} did not answer "
                    f"within {wait_s:g} s (dead or stopped)")
        return ("liveness ping: every rank answered, so the ranks are alive and one is stuck "
                "outside horotopo's collectives (or holds the others up from its own code)")

    def close(self) -> None:
        """Stop the thread and free the communicator."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.comm.Free()
        except Exception:  # noqa: BLE001 - at teardown after a failure the comm may be gone
            pass
