"""The tracked transport: who this rank waits for, and how fast its sends went.

:class:`TrackedTransport` wraps the engine's transport and adds no messages. It remembers the
requests outstanding per peer, so the watchdog (:mod:`horotopo.reliability.watchdog`) can name
the ranks a stuck collective waits for, and turns a wait that MPI failed into a
:class:`PeerFailure` naming the dead peers. For the adaptive layer it also measures, per
destination, the bytes sent and the seconds a send was outstanding: the rate the engine's own
traffic achieved on each link.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..transport.base import ReduceOp, Transport, WrappedTransport, allreduce_point_to_point
from ..params import RUNTIME
from .liveness import faulty

__all__ = ["TrackedTransport", "PeerFailure"]


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
    control_p2p_max_ranks : int
        Up to this many ranks the control allreduce runs point to point, so that a timeout
        names the missing peers (:attr:`~horotopo.params.RuntimeParams.control_p2p_max_ranks`).
    """

    def __init__(self, inner: Transport, owns: bool = False,
                 clock: Callable[[], float] = time.perf_counter,
                 control_p2p_max_ranks: int = RUNTIME.control_p2p_max_ranks) -> None:
        super().__init__(inner, owns)
        self.control_p2p_max_ranks = int(control_p2p_max_ranks)
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

    def allreduce_control(self, buf: Any, op: ReduceOp, timeout_s: Optional[float] = None,
                          what: str = "allreduce") -> None:
        # Point to point up to control_p2p_max_ranks (2 (n-1) tiny messages a rank), so that
        # a rank stuck in the engine's metadata check can still name the peer it waits for (a
        # library collective cannot); with a deadline, a timeout names them too
        # (TransportTimeout.missing).
        if self.size <= self.control_p2p_max_ranks:
            self._control = True
            try:
                allreduce_point_to_point(self, buf, op, timeout_s, what)
            finally:
                self._control = False
        elif timeout_s is None:
            self.allreduce(buf, buf, op)
        else:
            self._in_collective = True
            try:
                self.inner.allreduce_control(buf, op, timeout_s, what)
            finally:
                self._in_collective = False

    def cancel(self, request: Any) -> None:
        # A request given up on (a deadline passed) is no longer outstanding; a cancelled send
        # ends its busy period without counting as link traffic.
        self.inner.cancel(request)
        self._forget(id(request))

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
        if not failed:
            return PeerFailure([], f"rank {self.rank}: a wait failed, and no request of it "
                                   f"names the peer: {exc}")
        return PeerFailure(sorted(failed), f"rank {self.rank}: " + faulty(
            failed, f"communication with it failed (the process died or its connection "
                    f"broke): {exc}"))

    def _forget(self, key: int) -> None:
        info = self._pending.pop(key, None)
        if info is None:
            return
        peer, kind, _ = info
        if kind == "send" and key not in self._untimed:
            self._out[peer] -= 1
            if self._out[peer] == 0:
                self.busy_s[peer] += self._clock() - self._since[peer]
        self._untimed.discard(key)

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
            return "waiting in a library collective with every rank"
        if not peers:
            return "waiting for no message (between two steps of the collective)"
        parts = [f"rank {p} ({d['recv']} receive(s), {d['send']} send(s))"
                 for p, d in sorted(peers.items())]
        return ("waiting for ranks " + ", ".join(str(p) for p in sorted(peers)) + ": "
                + "; ".join(parts))

    def take_link_stats(self) -> Tuple[List[int], List[float]]:
        """``(bytes, busy seconds)`` per destination since the last call, then reset.

        Call between collectives (nothing outstanding), so every busy period is closed.
        """
        b, s = self.sent_bytes, self.busy_s
        n = self.inner.size
        self.sent_bytes, self.busy_s = [0] * n, [0.0] * n
        return b, s
