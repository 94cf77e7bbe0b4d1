"""The simulated transport's requests and its completion queue: the requests of one progress
loop, kept between its calls, so that a completion costs time in proportion to the messages
that *can* complete next, not to every message posted.

:class:`~horotopo.algorithms.progress.Progress` takes one from
:meth:`SimulatedTransport.completion_queue <horotopo.transport.simulated.SimulatedTransport>`
instead of handing its whole list to ``waitsome`` on every completion. With the plan's own
chunks at 1024 ranks a rank has hundreds of receives posted ahead (a window of chunks per tree
and child), and three passes over them per completion (the loop's list rebuilt, the scan for an
arrived message, SimGrid's ``wait_any`` converting the list) were most of the simulation's CPU.

What can complete next (the *candidates*): every send that is on the network (``put_async``
issued), and, per receive stream, the receives that a send may already be matched to. A
stream's sender puts its next message only while the messages ahead of it that are not done
hold less than the route's bandwidth-delay product (``SimulatedTransport._may_start``); so a
receive whose not-done predecessors on its stream already hold that many bytes cannot be
matched before one of them completes, and each of those is a candidate (or, in turn, waits on
one). The first message to complete is therefore always a candidate, and ``wait_any`` over the
candidates wakes exactly when ``wait_any`` over everything would. Among messages found complete
the one posted first is taken, one per call, as ``waitsome`` does over the progress loop's
list: the simulated times are those of the list-based loop.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Optional, Tuple

from ..transport.poll import TransportError

if TYPE_CHECKING:
    from ..transport.simulated import SimulatedTransport

__all__ = ["CompletionQueue", "Request"]


class Request:
    """One posted message of the simulated transport. Posting is deferred to the rank's next
    wait or test (see ``SimulatedTransport.flush``), so that the CPU work charged before it
    delays it."""

    __slots__ = ("kind", "buf", "mailbox", "payload", "charged", "comm", "handle", "done",
                 "peer", "behind", "next", "queued", "stream", "watch", "cb", "seq", "est")

    def __init__(self, kind: str, buf: Any, mailbox: Any, peer: int,
                 payload: Any = None, charged: int = 0) -> None:
        self.kind = kind
        self.buf = buf
        self.mailbox = mailbox  # its stream's (source, destination, tag): see Simulation.acquire
        self.peer = peer
        self.payload = payload
        self.charged = charged
        self.comm: Any = None
        self.handle: Any = None
        self.done = False
        self.behind: Optional[Request] = None  # the send before it on its stream
        self.next: Optional[Request] = None    # the send after it on its stream
        self.queued = True                      # not yet through flush
        self.stream: Tuple[int, int] = (peer, -1)  # a send's (dest, tag)
        # set while in a CompletionQueue: the queue, the callback, the posting number and a
        # receive's bytes as its sender charges them
        self.watch: Optional[CompletionQueue] = None
        self.cb: Any = None
        self.seq: Tuple[bool, int] = (True, 0)
        self.est = 0


class CompletionQueue:
    """Requests of one progress loop with a callback each; :meth:`next` hands out the callback
    of the next request to complete, in the order the list-based ``waitsome`` loop would.

    Made by ``SimulatedTransport.completion_queue()``. Requests are this transport's own
    point-to-point requests; the transport tells the queue when one of them is put on the
    network (:meth:`posted`) and when it completes or is cancelled (:meth:`finished`).
    """

    def __init__(self, transport: "SimulatedTransport") -> None:
        self._t = transport
        self._seq = 0
        self._open = 0  # requests added whose callbacks next() has not handed out yet
        self._ready: Deque[Callable[[], None]] = deque()
        # posted and not done, possibly next to complete: request -> its posting number
        self._candidates: Dict[Request, Tuple[bool, int]] = {}
        # per receive stream (source, destination, tag): its posted receives not done, in
        # SimGrid's matching order (a mailbox matches FIFO)
        self._streams: Dict[Tuple[int, int, int], Deque[Request]] = {}

    def __len__(self) -> int:
        """Requests added whose callbacks have not been handed out."""
        return self._open

    def add(self, request: Any, callback: Callable[[], None], urgent: bool = False) -> None:
        """Watch ``request`` (an ``isend``/``irecv`` of this transport); :meth:`next` hands out
        ``callback`` once it has completed. Of the requests found complete at once, the
        ``urgent`` ones go first (``Progress.post``), each group in posting order."""

        if not isinstance(request, Request) or request.buf is None and request.kind == "recv":
            raise TransportError(f"a completion queue takes the transport's isend and irecv "
                                 f"requests, not {type(request).__name__}")
        if request.watch is not None:
            raise TransportError("a request is already in a completion queue")
        ahead = request.behind
        if request.kind == "send" and not request.done and ahead is not None \
                and not ahead.done and ahead.watch is not self:
            # its stream moves only when that send completes, which this queue cannot see
            raise TransportError(
                f"rank {self._t.rank}: a send to rank {request.peer} queued behind one that "
                "is not in this completion queue (same destination and tag)")
        self._open += 1
        if request.done:
            self._ready.append(callback)
            return
        request.watch = self
        request.cb = callback
        # the order next() takes completed requests in: urgent ones first, then by posting
        request.seq = (not urgent, self._seq)
        self._seq += 1
        if request.kind == "recv":
            scale = 1.0 if self._t.unscaled else self._t.scale
            request.est = int(round(request.buf.nbytes * scale))  # as its sender charges it
        if not request.queued and request.comm is not None:
            self.posted(request)

    def posted(self, request: Request) -> None:
        """``request`` (watched) was just put on the network (``put_async``/``get_async``)."""
        if request.kind == "send":
            self._candidates[request] = request.seq
            return
        key = request.mailbox
        queue = self._streams.get(key)
        if queue is None:
            queue = self._streams[key] = deque()
        queue.append(request)
        self._list(key, queue)

    def _list(self, key: Tuple[int, int, int], queue: Deque[Request]) -> None:
        """Make candidates of the stream's receives that a send may be matched to."""
        pipe = self._t.sim.pipe_bytes(key[0], key[1])
        ahead = 0
        candidates = self._candidates
        for r in queue:
            if ahead and ahead >= pipe:
                break
            if r not in candidates:
                candidates[r] = r.seq
            ahead += r.est

    def finished(self, request: Request, charged: int = -1) -> None:
        """``request`` (watched) completed or was cancelled; ``charged``: a receive's bytes as
        its sender charged them (-1 when cancelled)."""
        self._candidates.pop(request, None)
        if request.kind == "recv":
            key = request.mailbox
            queue = self._streams.get(key)
            if queue is not None and request in queue:
                if queue[0] is request:
                    queue.popleft()
                else:
                    queue.remove(request)  # one that overtook its predecessor: rare
                if queue:
                    self._list(key, queue)
                else:
                    del self._streams[key]
            if 0 <= charged < request.est:
                # the candidates assumed the sender charged at least request.est
                raise TransportError(
                    f"rank {self._t.rank}: a message from rank {request.peer} charged "
                    f"{charged} bytes where the receive expected {request.est} (one end "
                    "inside true_size(), the other not)")
        self._ready.append(request.cb)
        request.watch = request.cb = None

    def next(self, deadline: Optional[float] = None) -> Optional[Callable[[], None]]:
        """Block (in simulated time) until a watched request has completed; its callback.
        With a ``deadline`` (simulated seconds), None once the clock reaches it first.

        Raises
        ------
        TransportError
            Nothing is watched, or nothing watched is on the network (an engine bug: it
            would wait forever).
        """
        if not self._open:
            raise TransportError("next() on an empty completion queue")
        t = self._t
        t.flush()
        ready = self._ready
        while not ready:
            candidates = self._candidates
            if not candidates:
                raise TransportError(f"rank {t.rank}: {self._open} requests watched, none of "
                                     "them on the network (posted out of order?)")
            # The first posted of those complete (the urgent first), as the list-based loop
            # takes them; read from finish_time without a simcall (see
            # SimulatedTransport._finished).
            best, first = None, (True, self._seq)
            for r, seq in candidates.items():
                if seq < first and r.comm.finish_time >= 0:
                    best, first = r, seq
            if best is None:
                reqs = list(candidates)
                comms = [r.comm for r in reqs]
                if deadline is None:
                    got = t.sg.Comm.wait_any(comms)
                else:
                    left = deadline - t.now()
                    got = t.sg.Comm.wait_any_for(comms, left) if left > 0 else -1
                    if got < 0:
                        return None
                t.complete(reqs[got], waited=True)
            else:
                t.complete(best)
        self._open -= 1
        return ready.popleft()
