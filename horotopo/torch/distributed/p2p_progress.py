"""The progress thread of the horotopo backend's send/recv: it completes their works in any
order.

Collectives' works are completed in submission order (:mod:`.completion`), which is safe
because every rank submits them in the same order. Point-to-point works are not: a rank may
post a receive, run a collective and only then send what its peer's receive waits for, so a
receive must not hold up the collectives behind it (nor they it). One daemon thread therefore
tests every pending send and receive in turn, completes each future as its messages arrive and
ends a wait that passes its deadline with :class:`~horotopo.transport.base.TransportTimeout`
naming the peer.

A receive moves in two steps (see :mod:`.p2p`): its header, then its payload, posted from the
header's sender. For one sender and tag, the payload receives must be posted in the order in
which that sender's headers matched the receives, which is their posting order. The thread
keeps the operations in posting order and, while an earlier receive that could take a message
of that sender and tag still lacks its header, a later one waits before posting its payload.

Every call on the transport, the user's thread's posts and this thread's tests, is made under
:data:`posting`: the transport of a job whose MPI is not CUDA-aware stages device buffers
(:class:`~horotopo.gpu.StagingTransport`), and that keeps state shared by both threads. An
operation on a device buffer advances with its device current
(:func:`horotopo.buffers.device_scope`), as the runtime runs the collectives, so that staging
copies and stream waits happen on that device.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Set, Tuple

import numpy as np
import torch

from ... import config
from ...buffers import device_scope
from ...transport.base import Transport, TransportTimeout
from ...transport.poll import DONE, IDLE, PROGRESS, poll

__all__ = ["SendOp", "RecvOp", "start", "posting"]

#: Held for every call on a point-to-point transport (see the module's notes); the user's
#: thread also holds it while it posts a message and submits its work, as one step.
posting = threading.Lock()

#: (header tag, sender) pairs, and header tags of receives from any rank, that an earlier
#: receive still waits for the header of (see the module's notes).
Waiting = Tuple[Set[Tuple[int, int]], Set[int]]


class _Op:
    """A posted send or receive: its future, deadline, what a timeout says, and its payload's
    buffer (``like``: a device array makes its device current while the op advances)."""

    def __init__(self, transport: Transport, deadline: float, what: str, peer: int,
                 like: Any = None) -> None:
        self.transport, self.deadline, self.what, self.peer = transport, deadline, what, peer
        self.like = like
        self.future: torch.futures.Future = torch.futures.Future()
        self.pending: List[Any] = []  # requests not yet complete

    def _tested(self) -> bool:
        """Test the pending requests; True once none is left."""
        self.pending = [r for r in self.pending if not self.transport.test(r)]
        return not self.pending

    def expire(self) -> None:
        for request in self.pending:
            self.transport.cancel(request)
        raise TransportTimeout(self.what, [self.peer] if self.peer >= 0 else [])

    def advance(self, waiting: Waiting) -> Optional[Any]:
        """One test; the work's value once it is done, else None."""
        raise NotImplementedError


class SendOp(_Op):
    """A header and a payload on their way to ``peer``; ``keep`` holds the buffers they read."""

    def __init__(self, transport: Transport, deadline: float, what: str, peer: int,
                 requests: List[Any], keep: Any, value: Any, like: Any = None) -> None:
        super().__init__(transport, deadline, what, peer, like)
        self.pending, self._keep, self._value = list(requests), keep, value

    def advance(self, waiting: Waiting) -> Optional[Any]:
        return self._value if self._tested() else None


class RecvOp(_Op):
    """A receive whose header request is posted; the payload follows from the header's sender.

    ``into(sender, nbytes, code)`` returns the buffer to receive the payload into (checking
    the header first); ``done()`` returns the work's value once the payload is in.
    """

    def __init__(self, transport: Transport, deadline: float, what: str, src: Optional[int],
                 header_request: Any, header: np.ndarray, payload_tag: int, header_tag: int,
                 into: Callable[[int, int, int], Any], done: Callable[[], Any],
                 like: Any = None) -> None:
        super().__init__(transport, deadline, what, -1 if src is None else src, like)
        self.src, self.header, self.header_tag, self.payload_tag = src, header, header_tag, \
            payload_tag
        self.pending = [header_request]
        self._into, self._done = into, done
        self._stage = "header"

    def advance(self, waiting: Waiting) -> Optional[Any]:
        by_sender, by_any = waiting
        if self._stage == "header":
            if not self._tested():
                if self.src is None:
                    by_any.add(self.header_tag)
                else:
                    by_sender.add((self.header_tag, self.src))
                return None
            self._stage = "headed"
        sender = int(self.header[0])
        if self._stage == "headed":
            key = (self.header_tag, sender)
            if key in by_sender or self.header_tag in by_any:
                by_sender.add(key)  # and so must every later receive from this sender
                return None
            self.peer = sender
            buf = self._into(sender, int(self.header[1]), int(self.header[2]))
            self.pending = [self.transport.irecv(buf, sender, self.payload_tag)]
            self._stage = "payload"
        return self._done() if self._tested() else None


class _Progress:
    """The one thread per process that advances every pending send and receive."""

    def __init__(self) -> None:
        self._ops: List[_Op] = []
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def add(self, op: _Op) -> torch.futures.Future:
        with self._cond:
            self._ops.append(op)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="horotopo-torch-p2p",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return op.future

    def _run(self) -> None:
        nap_s = config.runtime_params().idle_nap_s  # once: the thread lives as long as the job
        while True:
            with self._cond:
                while not self._ops:
                    self._cond.wait()
            poll(self._sweep, nap_s=nap_s)

    def _sweep(self) -> int:
        with self._cond:
            ops = list(self._ops)
        if not ops:
            return DONE
        waiting: Waiting = (set(), set())
        finished: List[_Op] = []
        for op in ops:  # in posting order (see the module's notes)
            try:
                with posting, device_scope(op.like):
                    value = op.advance(waiting)
                    if value is None and op.transport.now() > op.deadline:
                        op.expire()
            except BaseException as exc:  # noqa: BLE001 - the work's wait() re-raises it
                finished.append(op)
                op.future.set_exception(exc)
                continue
            if value is not None:
                finished.append(op)
                op.future.set_result(value)
        with self._cond:
            for op in finished:
                self._ops.remove(op)
        return PROGRESS if finished else IDLE


_progress = _Progress()


def start(op: _Op) -> torch.futures.Future:
    """Hand a posted ``op`` to the progress thread (in posting order); return its future."""
    return _progress.add(op)
