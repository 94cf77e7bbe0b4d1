"""Liveness pings: which ranks are dead or stopped, asked over the transport.

A watchdog that fired inside a *library* collective (where no request names a peer) can still
find the ranks that are dead or stopped: those that do not answer a ping. Every rank runs a
:class:`LivenessResponder`, a daemon thread that answers pings from any peer whatever the rest
of the process is doing, so only a process that is dead, stopped (SIGSTOP) or frozen as a
whole stays silent.

The protocol uses two tags of its own (a block from ``alloc_tags``) and int64 pairs
``[sender, round]``: the responder receives pings from any source (``irecv_any``) and learns
the sender from the payload; it echoes the pair back. A pinger waits for this round's echoes
through the transport's one poll loop, with a deadline that names the ranks still silent
(:class:`~horotopo.transport.base.TransportTimeout`), and takes a late echo of an earlier
round for what it is.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from .. import config
from ..transport.base import Transport, TransportTimeout
from ..params import RELIABILITY
from ..transport.poll import DONE, IDLE, PROGRESS, deadline_after, poll

__all__ = ["LivenessResponder", "FAULTY", "faulty", "verdict"]

#: The words that introduce the ranks a fault is blamed on, in every message that blames one:
#: a reader (or a log filter) finds the culprits by this phrase, and no other rank number
#: follows it.
FAULTY = "faulty rank(s)"


def faulty(ranks: Iterable[int], evidence: str) -> str:
    """``faulty rank(s) 1, 3: <evidence>``: the one way a message blames ranks."""
    return f"{FAULTY} {', '.join(str(r) for r in sorted(set(ranks)))}: {evidence}"


def verdict(liveness: Optional["LivenessResponder"], waiting: str,
            wait_s: Optional[float] = None) -> str:
    """Whom a stuck wait should blame, from evidence: the ranks that do not answer a ping
    within ``wait_s`` seconds (default the responder's ``ping_timeout_s``).

    Who this rank happened to wait for proves nothing (a running rank may itself wait for the
    stopped one), so ``waiting`` is only reported, never blamed; with no responder (MPI below
    ``MPI_THREAD_MULTIPLE``) nobody is blamed.
    """
    if liveness is None:
        return (f"{waiting}; no rank is blamed: liveness pings need MPI_THREAD_MULTIPLE, and "
                f"who this rank waits for does not show who stopped")
    wait_s = liveness.ping_timeout_s if wait_s is None else wait_s
    silent = liveness.silent_ranks(wait_s)
    if silent:
        return faulty(silent, f"no answer to a liveness ping within {wait_s:g} s (the process "
                              f"is stopped, frozen or dead)")
    return (f"every rank answered a liveness ping within {wait_s:g} s, so none is stopped or "
            f"dead; one is stuck in its own code outside horotopo's collectives ({waiting})")


class LivenessResponder:
    """Answers liveness pings from the other ranks; :meth:`ping` sends them.

    Collective to create (every rank, at the same point of the transport's collective order:
    the tags come from ``alloc_tags``) and to :meth:`close`. The transport is used from two
    threads at once (the responder's and the pinger's, usually the watchdog's), so it must
    allow that: MPI needs ``MPI_THREAD_MULTIPLE``.

    Parameters
    ----------
    link : Transport or MPI communicator
        A transport of its own (the responder's messages then never meet anyone else's); it
        stays the caller's. A communicator is opened as an
        :class:`~horotopo.transport.mpi.MPITransport` (a ``Dup``), which :meth:`close` frees.
    poll_s : float
        The longest pause of the responder's idle polls: a ping is answered within about this
        long. The thread polls rather than blocks because MPICH spins inside blocking calls
        and would take a core.
    ping_timeout_s : float
        How long a ping (:meth:`ping`, :func:`verdict`) waits for the answers by default.

    Raises
    ------
    RuntimeError
        ``link`` is a communicator and MPI is not at ``MPI_THREAD_MULTIPLE``.
    """

    def __init__(self, link: Any, poll_s: float = RELIABILITY.liveness_poll_s,
                 ping_timeout_s: float = RELIABILITY.ping_timeout_s) -> None:
        self.ping_timeout_s = float(ping_timeout_s)
        self.teardown_wait_s = config.reliability_params().teardown_wait_s
        self.transport, self._owns = _opened(link)
        self.rank, self.size = self.transport.rank, self.transport.size
        base = self.transport.alloc_tags(2)
        self._ping_tag, self._pong_tag = base, base + 1
        self._poll_s = float(poll_s)
        self._round = 0
        self._ping_lock = threading.Lock()   # two pingers at once would take each other's echoes
        self._unsent: List[Tuple[Any, np.ndarray]] = []  # (send, buffer): see ping()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="horotopo-liveness",
                                        daemon=True)
        self._thread.start()

    # -- the responder -------------------------------------------------------------------------
    def _serve(self) -> None:
        t = self.transport
        inbox = np.zeros(2, dtype=np.int64)
        pending = [t.irecv_any(inbox, self._ping_tag)]
        replies: List[Tuple[Any, np.ndarray]] = []  # (request, buffer): the buffer outlives it

        def step() -> int:
            nonlocal replies
            if self._stop.is_set():
                return DONE
            replies = [(r, b) for r, b in replies if not t.test(r)]
            if not t.test(pending[0]):
                return IDLE
            sender = int(inbox[0])
            if 0 <= sender < self.size and sender != self.rank:  # else not a ping: drop it
                answer = inbox.copy()
                replies.append((t.isend(answer, sender, self._pong_tag), answer))
            pending[0] = t.irecv_any(inbox, self._ping_tag)
            return PROGRESS

        try:
            # Back off from the poll loop's shortest pause to poll_s: a ping is answered within
            # poll_s, and an idle responder costs about nothing.
            poll(step, nap_s=(min(t.idle_nap_s[0], self._poll_s), self._poll_s))
        finally:
            t.cancel(pending[0])
            try:
                t.wait(pending, deadline_after(self.teardown_wait_s),
                       what="liveness responder: cancelling")
            except TransportTimeout:
                pass  # at teardown after a failure; the transport is closed next anyway

    # -- the pinger ----------------------------------------------------------------------------
    def ping(self, wait_s: Optional[float] = None) -> None:
        """Ping every other rank; return once each has answered.

        Raises
        ------
        TransportTimeout
            Some ranks did not answer within ``wait_s`` seconds (default
            :attr:`ping_timeout_s`); ``missing`` lists them.
        """
        wait_s = self.ping_timeout_s if wait_s is None else wait_s
        others = [r for r in range(self.size) if r != self.rank]
        if not others:
            return
        t = self.transport
        with self._ping_lock:
            self._round += 1
            this = self._round
            token = np.array([self.rank, this], dtype=np.int64)
            echoes: Dict[int, np.ndarray] = {r: np.zeros(2, dtype=np.int64) for r in others}
            requests = [t.irecv(echoes[r], r, self._pong_tag) for r in others]
            peers = list(others)
            # The sends stay out of the wait: cancelling a send to a stopped peer could block,
            # and the process is usually about to abort. They (and their buffer) are kept until
            # they complete.
            self._unsent = [(s, b) for s, b in self._unsent if not t.test(s)]
            self._unsent += [(t.isend(token, r, self._ping_tag), token) for r in others]

            def on_done(k: int) -> None:
                rank = peers[k]
                if int(echoes[rank][1]) != this:
                    # A late echo of an earlier round proves nothing about now: wait again.
                    requests.append(t.irecv(echoes[rank], rank, self._pong_tag))
                    peers.append(rank)

            def describe(pending: List[int]) -> str:
                silent = sorted({peers[k] for k in pending})
                return (f"liveness ping from rank {self.rank}: no answer from rank(s) "
                        f"{', '.join(map(str, silent))} within {wait_s:g} s")

            t.wait(requests, deadline_after(wait_s), peers=peers, what=describe,
                   on_done=on_done)

    def silent_ranks(self, wait_s: Optional[float] = None) -> List[int]:
        """The other ranks that do not answer a ping within ``wait_s`` seconds (default
        :attr:`ping_timeout_s`)."""
        try:
            self.ping(wait_s)
        except TransportTimeout as exc:
            return list(exc.missing)
        return []

    def describe(self, waiting: str = "waiting for the others",
                 wait_s: Optional[float] = None) -> str:
        """The ping's :func:`verdict` in words (for the watchdog's message)."""
        return verdict(self, waiting, wait_s)

    def close(self) -> None:
        """Stop the thread; close the transport when the responder opened it."""
        self._stop.set()
        self._thread.join(timeout=self.teardown_wait_s)
        if self._owns:
            try:
                self.transport.close()
            except Exception:  # noqa: BLE001 - at teardown after a failure MPI may be gone
                pass


def _opened(link: Any) -> Tuple[Transport, bool]:
    """``(transport, owned)``: a Transport as it is; a communicator through the MPI door."""
    if isinstance(link, Transport):
        return link, False
    from ..transport import mpi  # the door to MPI, opened only for a communicator

    if not mpi.thread_multiple():
        raise RuntimeError("liveness pings need MPI_THREAD_MULTIPLE")
    return mpi.MPITransport(link), True
