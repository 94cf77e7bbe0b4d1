"""The small collective steps written once over point-to-point messages.

Any :class:`~horotopo.transport.base.Transport` gets these from its ``isend``/``irecv``/``test``:
the in-process test transport and a simulator's as well as MPI's. They move small payloads
(settings, a Plan's JSON, a probe's timings), so they are flat (the root talks to every rank
directly) and every rank knows exactly which peers it is still waiting for: a deadline that
passes raises :class:`~horotopo.transport.poll.TransportTimeout` naming them.

Every wait goes through ``transport.wait`` (whose default is :func:`wait_requests`), so a
transport that cannot wait in wall-clock time (a simulator's) waits its own way.

Each step takes one tag from ``alloc_tags`` (every rank calls the steps in the same order, as
for any collective) and sends an 8-byte length before each payload on that tag; the
non-overtaking rule keeps the two in order.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..ops import UFUNCS
from ..params import RUNTIME
from .poll import DONE, IDLE, PROGRESS, TransportTimeout, deadline_after, poll
from .types import ControlOp, Describe, PointToPoint

__all__ = ["CollectiveRequest", "wait_requests", "broadcast_bytes", "gather_bytes",
           "allgather_bytes", "allreduce_point_to_point", "iallreduce_point_to_point",
           "barrier_point_to_point"]

# "band" (bitwise AND) is for control vectors of flag bits, such as the runtime's cycle.
_UFUNCS = dict(UFUNCS, band=np.bitwise_and)


class CollectiveRequest:
    """A collective step in flight as point-to-point requests, finished by a local step.

    It has no library request of its own, so ``transport.test`` cannot test it; it tests its
    parts itself, and :func:`wait_requests` (so ``Transport.wait``) takes it beside the
    transport's own requests. On a timeout its :meth:`pending_peers` are the missing ones.

    Parameters
    ----------
    transport : Transport
        Whose ``test`` and ``cancel`` serve the parts.
    parts : list
        The point-to-point requests.
    peers : list of int
        ``peers[k]`` is the rank part ``k`` talks to.
    finish : callable
        Run once, when every part has completed (a fold of received vectors, say).
    """

    __slots__ = ("_transport", "_parts", "_peers", "_done", "_finish", "_complete")

    def __init__(self, transport: PointToPoint, parts: List[Any], peers: List[int],
                 finish: Callable[[], None]) -> None:
        self._transport = transport
        self._parts = parts
        self._peers = peers
        self._done = [False] * len(parts)
        self._finish = finish
        self._complete = False

    def test(self) -> bool:
        """True once every part has completed and ``finish`` has run (idempotent)."""
        if self._complete:
            return True
        test = self._transport.test
        done = self._done
        for k, part in enumerate(self._parts):
            if not done[k] and test(part):
                done[k] = True
        if all(done):
            self._complete = True
            self._finish()
        return self._complete

    def pending_peers(self) -> List[int]:
        """The peers of the parts that have not completed, ascending, once each."""
        return sorted({p for p, ok in zip(self._peers, self._done) if not ok})

    def cancel(self) -> None:
        """Cancel the parts still pending (best effort, as ``transport.cancel``)."""
        for part, ok in zip(self._parts, self._done):
            if not ok:
                self._transport.cancel(part)


def wait_requests(transport: PointToPoint, requests: List[Any], deadline: Optional[float], *,
                  peers: Optional[Sequence[int]] = None, what: Describe = "wait",
                  on_done: Optional[Callable[[int], None]] = None, busy: bool = False,
                  spin_polls: int = 0, nap_s: Tuple[float, float] = RUNTIME.idle_nap_s,
                  clock: Optional[Callable[[], float]] = None) -> None:
    """Wait until every request completes, or raise :class:`TransportTimeout` at ``deadline``.

    Parameters
    ----------
    transport : Transport
        Whose ``test`` and ``cancel`` are used.
    requests : list
        Request handles, or :class:`CollectiveRequest` objects (which test themselves and name
        their own missing peers). ``on_done`` may append to the list while waiting (an
        acknowledgement posted once a transfer ends); appended ones are waited for too.
    deadline : float, optional
        A ``clock()`` value; None waits for ever.
    peers : sequence of int, optional
        ``peers[k]`` is the rank that request ``k`` talks to; the timeout's ``missing`` is the
        set of peers of the requests still pending. Read at the timeout, so the caller may
        append to it alongside ``requests``.
    what : str or callable
        The timeout's message; a callable receives the pending indices.
    on_done : callable, optional
        Called with the index of each request as it completes.
    busy : bool
        Yield instead of sleeping between idle polls (see :func:`~.poll.poll`).
    spin_polls, nap_s
        The poll loop's back-off (see :func:`~.poll.poll`): a latency-bound wait such as a
        control cycle spins a little before its first pause.
    clock : callable, optional
        The clock ``deadline`` is read on: ``transport.now`` by default.
    """
    done: List[bool] = []

    def tested(req: Any) -> bool:
        if isinstance(req, CollectiveRequest):
            return req.test()
        return transport.test(req)

    def step() -> int:
        done.extend([False] * (len(requests) - len(done)))
        state = IDLE
        for k in range(len(done)):
            if not done[k] and tested(requests[k]):
                done[k] = True
                state = PROGRESS
                if on_done is not None:
                    on_done(k)
        if len(done) == len(requests) and all(done):
            return DONE
        return state

    if poll(step, deadline, busy=busy, spin_polls=spin_polls, nap_s=nap_s,
            clock=transport.now if clock is None else clock):
        return
    pending = [k for k in range(len(done)) if not done[k]]
    missing: List[int] = []
    for k in pending:
        # A receive cancels cleanly; a send to a dead peer may not, which is why a job should
        # abort after such an error rather than finalize.
        req = requests[k]
        if isinstance(req, CollectiveRequest):
            req.cancel()
            missing += req.pending_peers()
        else:
            transport.cancel(req)
            if peers is not None:
                missing.append(peers[k])
    raise TransportTimeout(what(pending) if callable(what) else what, missing)


def _named(what: str, timeout_s: float, peers: List[int]) -> Callable[[List[int]], str]:
    def describe(pending: List[int]) -> str:
        missing = sorted({peers[k] for k in pending})
        who = ", ".join(str(p) for p in missing)
        return f"{what}: nothing from rank{'s' if len(missing) > 1 else ''} {who} within " \
               f"{timeout_s:g} s"
    return describe


def _as_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype=np.uint8)


def _receive_sized(transport: PointToPoint, sources: Sequence[int], tag: int, deadline: float,
                   what: str, timeout_s: float, sends: Sequence[Any] = (),
                   send_peers: Sequence[int] = ()) -> Dict[int, bytes]:
    """Receive one length-prefixed payload from each of ``sources`` while ``sends`` finish."""
    lengths = {p: np.zeros(1, dtype=np.int64) for p in sources}
    bodies: Dict[int, np.ndarray] = {}
    requests: List[Any] = [transport.irecv(lengths[p], p, tag) for p in sources]
    peers: List[int] = list(sources)
    headers = len(requests)
    requests += list(sends)
    peers += list(send_peers)

    def on_done(k: int) -> None:
        if k < headers:  # a length arrived: post the payload's receive (none for b"")
            p = peers[k]
            size = int(lengths[p][0])
            bodies[p] = np.empty(size, dtype=np.uint8)
            if size:
                requests.append(transport.irecv(bodies[p], p, tag))
                peers.append(p)

    transport.wait(requests, deadline, peers=peers,
                   what=_named(what, timeout_s, peers), on_done=on_done)
    return {p: bodies[p].tobytes() for p in sources}


def _send_sized(transport: PointToPoint, data: np.ndarray, dests: Sequence[int],
                tag: int) -> List[Any]:
    length = np.array([len(data)], dtype=np.int64)
    requests = []
    for p in dests:
        requests.append(transport.isend(length, p, tag))
        if len(data):
            requests.append(transport.isend(data, p, tag))
    return requests


def _doubled(dests: Sequence[int], data: np.ndarray) -> List[int]:
    # _send_sized's requests: a length, then a payload unless it is empty, per destination
    return [p for p in dests for _ in range(2 if len(data) else 1)]


def broadcast_bytes(transport: PointToPoint, data: Optional[bytes], root: int,
                    timeout_s: float, what: str = "broadcast") -> bytes:
    """``data`` (read on ``root`` only) on every rank; the root sends it to each rank."""
    deadline = deadline_after(timeout_s, transport.now)
    tag = transport.alloc_tags(1)
    if transport.rank == root:
        if data is None:
            raise ValueError("the broadcast root must give the data")
        payload = _as_bytes(data)
        others = [p for p in range(transport.size) if p != root]
        sends = _send_sized(transport, payload, others, tag)
        peers = _doubled(others, payload)
        transport.wait(sends, deadline, peers=peers,
                       what=_named(what, timeout_s, peers))
        return bytes(data)
    return _receive_sized(transport, [root], tag, deadline, what, timeout_s)[root]


def gather_bytes(transport: PointToPoint, data: bytes, root: int, timeout_s: float,
                 what: str = "gather") -> Optional[List[bytes]]:
    """Every rank's ``data`` in rank order on ``root``; None elsewhere."""
    deadline = deadline_after(timeout_s, transport.now)
    tag = transport.alloc_tags(1)
    payload = _as_bytes(data)
    if transport.rank != root:
        sends = _send_sized(transport, payload, [root], tag)
        peers = _doubled([root], payload)
        transport.wait(sends, deadline, peers=peers,
                       what=_named(what, timeout_s, peers))
        return None
    others = [p for p in range(transport.size) if p != root]
    got = _receive_sized(transport, others, tag, deadline, what, timeout_s)
    got[root] = bytes(data)
    return [got[p] for p in range(transport.size)]


def allgather_bytes(transport: PointToPoint, data: bytes, timeout_s: float,
                    what: str = "allgather") -> List[bytes]:
    """Every rank's ``data`` in rank order on every rank; each rank sends to every other.

    ``n - 1`` messages each way per rank, so that every rank can name every peer it misses
    (a gather to a root and a broadcast back would leave the others naming only the root).
    """
    deadline = deadline_after(timeout_s, transport.now)
    tag = transport.alloc_tags(1)
    payload = _as_bytes(data)
    others = [p for p in range(transport.size) if p != transport.rank]
    sends = _send_sized(transport, payload, others, tag)
    got = _receive_sized(transport, others, tag, deadline, what, timeout_s, sends,
                         _doubled(others, payload))
    got[transport.rank] = bytes(data)
    return [got[p] for p in range(transport.size)]


def _post_allreduce(transport: PointToPoint, buf: np.ndarray, op: ControlOp
                    ) -> Tuple[List[Any], List[int], Callable[[], None]]:
    """Post a point-to-point allreduce of ``buf``: its requests, their peers, and the fold that
    writes the result into ``buf`` once they all completed."""
    n, me = transport.size, transport.rank
    fold_op = _UFUNCS.get(op)
    if fold_op is None:  # before posting: an unknown op must not leave messages behind
        raise ValueError(f"op must be one of {sorted(_UFUNCS)}, got {op!r}")
    tag = transport.alloc_tags(1)
    mine = np.ascontiguousarray(buf).copy()
    got = {p: np.empty_like(mine) for p in range(n) if p != me}
    peers = [p for p in got] * 2
    reqs = [transport.irecv(got[p], p, tag) for p in got]
    reqs += [transport.isend(mine, p, tag) for p in got]

    def fold() -> None:
        # In rank order, so the result is bitwise identical everywhere.
        got[me] = mine
        acc = got[0].copy()
        for p in range(1, n):
            fold_op(acc, got[p], out=acc)
        buf[...] = acc

    return reqs, peers, fold


def allreduce_point_to_point(transport: PointToPoint, buf: np.ndarray, op: ControlOp,
                             timeout_s: Optional[float] = None, what: str = "allreduce") -> None:
    """Allreduce the small array ``buf`` in place by sending it to every other rank.

    ``2 (size - 1)`` messages per rank, so only for control vectors on modest rank counts. Each
    rank folds the vectors in rank order, so the result is bitwise identical everywhere.

    Without ``timeout_s`` the wait goes through ``transport.waitsome`` (a wrapper that watches
    its requests, such as :class:`~horotopo.reliability.TrackedTransport`, sees every one);
    with it, a deadline that passes raises :class:`TransportTimeout` naming the missing peers.
    """
    if transport.size == 1:
        return
    reqs, peers, fold = _post_allreduce(transport, buf, op)
    if timeout_s is None:
        while reqs:  # waitsome, not waitall: what stays pending names the peers still missing
            done = set(transport.waitsome(reqs))
            reqs = [r for i, r in enumerate(reqs) if i not in done]
    else:
        transport.wait(reqs, deadline_after(timeout_s, transport.now), peers=peers,
                       what=_named(what, timeout_s, peers))
    fold()


def iallreduce_point_to_point(transport: PointToPoint, buf: np.ndarray, op: ControlOp
                              ) -> CollectiveRequest:
    """Start :func:`allreduce_point_to_point` without waiting: ``buf`` holds the result once the
    returned request has completed (test it, or wait for it with ``transport.wait``)."""
    if transport.size == 1:
        return CollectiveRequest(transport, [], [], lambda: None)
    reqs, peers, fold = _post_allreduce(transport, buf, op)
    return CollectiveRequest(transport, reqs, peers, fold)


def barrier_point_to_point(transport: PointToPoint, timeout_s: Optional[float] = None,
                           what: str = "barrier") -> None:
    """Return once every rank has called this; a deadline names the ranks that did not."""
    allreduce_point_to_point(transport, np.zeros(1, dtype=np.uint8), "max", timeout_s, what)
