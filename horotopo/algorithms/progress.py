"""The nonblocking progress loop shared by the point-to-point algorithms."""
from __future__ import annotations

from typing import Any, Callable, List

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
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        # Looked up on the class: a wrapper (TrackedTransport...) forwards unknown attributes
        # to its inner transport, whose queue would bypass the wrapper's own waitsome.
        make = getattr(type(transport), "completion_queue", None)
        self._queue: Any = make(transport) if make is not None else None
        self._reqs: List[Any] = []
        self._cbs: List[Callable[[], None]] = []
        self.messages = 0

    def post(self, request: Any, callback: Callable[[], None]) -> None:
        if self._queue is not None:
            self._queue.add(request, callback)
            return
        self._reqs.append(request)
        self._cbs.append(callback)

    def isend(self, buf: Any, dest: int, tag: int, callback: Callable[[], None]) -> None:
        self.post(self.transport.isend(buf, dest, tag), callback)

    def irecv(self, buf: Any, source: int, tag: int, callback: Callable[[], None]) -> None:
        self.post(self.transport.irecv(buf, source, tag), callback)

    def run(self) -> None:
        queue = self._queue
        if queue is not None:
            while queue:
                cb = queue.next()
                self.messages += 1
                cb()
            return
        waitsome = self.transport.waitsome
        reqs, cbs = self._reqs, self._cbs
        while reqs:
            done = waitsome(reqs)
            if len(done) == len(reqs):
                ready = cbs[:]
                reqs.clear()
                cbs.clear()
            else:
                done = sorted(done)
                ready = [cbs[i] for i in done]
                # deleted from the end, in place: each a memmove, not a pass in Python
                for i in reversed(done):
                    del reqs[i]
                    del cbs[i]
            self.messages += len(ready)
            # Callbacks run after the lists are updated: they append new requests.
            for cb in ready:
                cb()
