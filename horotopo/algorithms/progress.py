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
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._reqs: List[Any] = []
        self._cbs: List[Callable[[], None]] = []
        self.messages = 0

    def post(self, request: Any, callback: Callable[[], None]) -> None:
        self._reqs.append(request)
        self._cbs.append(callback)

    def isend(self, buf: Any, dest: int, tag: int, callback: Callable[[], None]) -> None:
        self.post(self.transport.isend(buf, dest, tag), callback)

    def irecv(self, buf: Any, source: int, tag: int, callback: Callable[[], None]) -> None:
        self.post(self.transport.irecv(buf, source, tag), callback)

    def run(self) -> None:
        waitsome = self.transport.waitsome
        while self._reqs:
            done = waitsome(self._reqs)
            if len(done) == len(self._reqs):
                cbs = self._cbs
                self._reqs, self._cbs = [], []
            else:
                gone = set(done)
                cbs = [self._cbs[i] for i in sorted(done)]
                self._reqs = [r for i, r in enumerate(self._reqs) if i not in gone]
                self._cbs = [c for i, c in enumerate(self._cbs) if i not in gone]
            self.messages += len(cbs)
            # Callbacks run after the lists are rebuilt: they append new requests.
            for cb in cbs:
                cb()
