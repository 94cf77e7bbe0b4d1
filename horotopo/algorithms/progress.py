"""The nonblocking progress loop shared by the point-to-point algorithms."""
from __future__ import annotations

import bisect
import heapq
from typing import Any, Callable, List, Optional, Tuple

from ..transport.base import Transport

__all__ = ["Progress"]


class Progress:
    """Outstanding requests with a completion callback each; :meth:`run` drives them all.

    Callbacks may post further requests. The loop ends when nothing is outstanding, so a
    schedule that forgets to post a matching message shows up as a hang of the peer, never as
    a silent early return here; :attr:`messages` counts completed requests (for overhead
    measurements).

    A transport with a ``completion_queue()`` (the simulated one) keeps the requests itself
    between waits, so that a completion does not cost a pass over every outstanding request;
    others get the list through ``waitsome`` on every wait.

    A request posted ``urgent`` has its callback run before those of requests that completed
    with it or before it and are still waiting: the receives that carry a tree's final chunks
    down, so that a rank forwards the broadcast before it reduces the chunks queued behind it
    (each rank's CPU serves one callback at a time; first come first served, the window's next
    reduce chunks ran ahead of every broadcast chunk at each hop of a chain).

    A ``timed`` loop also runs timers (:meth:`at`): callbacks due at a time of the transport's
    clock (``transport.now()``); it waits on the requests only up to the next timer
    (``waitsome_until``, or the completion queue's ``next(deadline)``). An untimed loop never
    reads the clock.
    """

    def __init__(self, transport: Transport, timed: bool = False) -> None:
        self.transport = transport
        # Looked up on the class: a wrapper (TrackedTransport...) forwards unknown attributes
        # to its inner transport, whose queue would bypass the wrapper's own waitsome.
        make = getattr(type(transport), "completion_queue", None)
        self._queue: Any = make(transport) if make is not None else None
        # the urgent requests first (the first _urgent of the lists), each group in posting
        # order: the waits report completions in list order, and callbacks run in it
        self._reqs: List[Any] = []
        self._cbs: List[Callable[[], None]] = []
        self._urgent = 0
        self.messages = 0
        self.timed = timed
        self._timers: List[Tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = 0  # equal times fire in the order they were set

    def at(self, due: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` from the loop once ``transport.now()`` reaches ``due``."""
        if not self.timed:
            raise RuntimeError("timers need a Progress made with timed=True")
        heapq.heappush(self._timers, (due, self._timer_seq, callback))
        self._timer_seq += 1

    def now(self) -> float:
        """The transport's clock, which timers are due on."""
        return self.transport.now()

    def post(self, request: Any, callback: Callable[[], None], urgent: bool = False) -> None:
        """Watch ``request``; ``callback`` runs once it completes (``urgent``: before the
        callbacks of the non-urgent requests complete with it)."""
        if self._queue is not None:
            self._queue.add(request, callback, urgent)
            return
        if urgent:
            self._reqs.insert(self._urgent, request)
            self._cbs.insert(self._urgent, callback)
            self._urgent += 1
        else:
            self._reqs.append(request)
            self._cbs.append(callback)

    def isend(self, buf: Any, dest: int, tag: int, callback: Callable[[], None]) -> None:
        self.post(self.transport.isend(buf, dest, tag), callback)

    def irecv(self, buf: Any, source: int, tag: int, callback: Callable[[], None],
              urgent: bool = False) -> None:
        self.post(self.transport.irecv(buf, source, tag), callback, urgent)

    def run(self) -> None:
        if self.timed:
            self._run_timed()
            return
        queue = self._queue
        if queue is not None:
            while queue:
                cb = queue.next()
                self.messages += 1
                cb()
            return
        waitsome = self.transport.waitsome
        reqs = self._reqs
        while reqs:
            self._completed(waitsome(reqs))

    def _completed(self, done: List[int]) -> None:
        """Run the callbacks of the listed requests at ``done`` (indices), after dropping
        them from the lists."""
        reqs, cbs = self._reqs, self._cbs
        if len(done) == len(reqs):
            ready = cbs[:]
            reqs.clear()
            cbs.clear()
            self._urgent = 0
        else:
            done = sorted(done)
            ready = [cbs[i] for i in done]
            if self._urgent:
                self._urgent -= bisect.bisect_left(done, self._urgent)
            # deleted from the end, in place: each a memmove, not a pass in Python
            for i in reversed(done):
                del reqs[i]
                del cbs[i]
        self.messages += len(ready)
        # Callbacks run after the lists are updated: they append new requests.
        for cb in ready:
            cb()

    def _run_timed(self) -> None:
        timers, queue, transport = self._timers, self._queue, self.transport
        expired = False  # a timed wait ended at the first timer's time
        while True:
            if timers:
                # the first timer is due when its wait timed out, even if the clock reads a
                # rounding error short of its time
                if expired:
                    heapq.heappop(timers)[2]()
                now = transport.now()
                while timers and timers[0][0] <= now:
                    heapq.heappop(timers)[2]()
            pending = len(queue) if queue is not None else len(self._reqs)
            if not pending:
                if not timers:
                    return
                expired = not transport.waitsome_until([], timers[0][0])
                continue
            deadline: Optional[float] = timers[0][0] if timers else None
            if queue is not None:
                cb = queue.next(deadline)
                expired = cb is None
                if cb is not None:
                    self.messages += 1
                    cb()
                continue
            if deadline is None:
                done = transport.waitsome(self._reqs)
            else:
                done = transport.waitsome_until(self._reqs, deadline)
            expired = not done
            if done:
                self._completed(done)
