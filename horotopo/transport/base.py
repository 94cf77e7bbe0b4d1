"""The transport interface (no MPI here).

Two kinds of calls: the point-to-point messages the collective algorithms are written against
(``isend``/``irecv``/``test``/``waitsome``), and the few small collective steps the layers
above need to agree on things (settings, a Plan, a probe's timings): ``broadcast_bytes``,
``gather_bytes``, ``allgather_bytes`` (and their ``*_object`` forms for plain values, in the
control plane's encoding: :mod:`horotopo.transport.wire`), the control
allreduce and ``barrier``. Each step takes a deadline in seconds; one that passes raises
:class:`TransportTimeout` naming the peers still missing. The steps are written once over
point-to-point (:mod:`horotopo.transport.p2p`), so every transport has them; a transport may
override them with its library's own collectives.
"""
from __future__ import annotations

import socket
import time
from typing import Any, List, Optional, Sequence, Tuple

from ..params import RUNTIME
from . import p2p, wire
from .p2p import allreduce_point_to_point
from .poll import DONE, IDLE, TransportError, TransportTimeout, poll
from .types import ControlOp, Describe, ReduceOp

__all__ = ["Transport", "TransportError", "TransportTimeout", "ReduceOp", "ControlOp",
           "WrappedTransport", "allreduce_point_to_point"]


class Transport:
    """Point-to-point messages between ``size`` ranks, with nonblocking progress.

    Buffers are contiguous one-dimensional arrays (NumPy, or CuPy where the implementation is
    CUDA-aware); they move as raw bytes, so both ends must agree on the byte count. Messages
    between one pair of ranks with one tag are delivered in the order they were posted (MPI's
    non-overtaking rule); the algorithms rely on this to reuse a tag for every chunk of a stream.
    """

    #: The first and longest pause between idle polls of :meth:`wait` when the caller names
    #: none; a transport that the runtime builds holds the environment's
    #: (:attr:`horotopo.params.RuntimeParams.idle_nap_s`), read once at its construction.
    idle_nap_s: Tuple[float, float] = RUNTIME.idle_nap_s

    #: Bytes the network carries per byte of a point-to-point buffer: 1, except for a
    #: simulated transport whose small buffers stand for full-size ones. A rate in bytes per
    #: second of the network is ``scale`` times the buffer's.
    scale: float = 1.0

    @property
    def rank(self) -> int:
        raise NotImplementedError

    @property
    def size(self) -> int:
        raise NotImplementedError

    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        """Start sending ``buf`` to ``dest``; return a request handle."""
        raise NotImplementedError

    def irecv(self, buf: Any, source: int, tag: int) -> Any:
        """Start receiving into ``buf`` from ``source``; return a request handle."""
        raise NotImplementedError

    def irecv_any(self, buf: Any, tag: int) -> Any:
        """Start receiving into ``buf`` the next message with ``tag`` from whichever rank.

        For services that answer requests from any peer (the liveness ping): the request does
        not say who sent the message, so such a protocol puts the sender's rank in the payload.
        Optional: a transport without it raises :class:`TransportError`.
        """
        raise TransportError(f"{type(self).__name__} cannot receive from any source")

    def test(self, request: Any) -> bool:
        """True when ``request`` has completed (then it must not be tested again)."""
        raise NotImplementedError

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        """Block until at least one of ``requests`` completes; return the completed indices."""
        raise NotImplementedError

    def waitall(self, requests: Sequence[Any]) -> None:
        """Block until every request in ``requests`` has completed."""
        raise NotImplementedError

    def waitsome_until(self, requests: Sequence[Any], deadline: float) -> List[int]:
        """:meth:`waitsome` that gives up at ``deadline`` (a :meth:`now` value): the completed
        indices, or an empty list once the deadline has passed with none completed. With no
        requests it only waits for the deadline.

        Polls, yielding the CPU between polls rather than sleeping: the caller has something
        due at the deadline (a paced send), and a nap would make it late.
        """
        found: List[int] = []

        def step() -> int:
            found.extend([k for k, r in enumerate(requests) if self.test(r)])
            return DONE if found else IDLE

        poll(step, deadline, busy=True, clock=self.now)
        return found

    def alloc_tags(self, count: int) -> int:
        """Reserve ``count`` consecutive tags for one collective call; return the first.

        Every rank must call this in the same order with the same ``count`` (collectives are
        called in the same order everywhere), so the blocks agree without communication.
        """
        raise NotImplementedError

    def user_tags(self) -> range:
        """Tags that :meth:`alloc_tags` never hands out, for the transport's users' own
        point-to-point messages (torch.distributed's send/recv on the horotopo backend), so
        that they cannot match the collectives' traffic. Empty where the transport has none.
        """
        return range(0)

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        """Library allreduce (``sendbuf is recvbuf`` means in place). Optional."""
        raise TransportError(f"{type(self).__name__} has no library allreduce")

    @property
    def has_library_allreduce(self) -> bool:
        """Whether :meth:`allreduce` is implemented (the engine's library algorithm needs it)."""
        return type(self).allreduce is not Transport.allreduce

    def cancel(self, request: Any) -> None:
        """Give up on a pending request after a timeout (best effort; a no-op by default)."""

    @property
    def processor_name(self) -> str:
        """The name of the host this rank runs on (what the probe's document lists)."""
        return socket.gethostname()

    def now(self) -> float:
        """This transport's clock, in seconds: what :meth:`wait`'s deadlines and the probe's
        timings are read in.

        ``time.perf_counter()`` by default; a simulated transport returns its simulated clock,
        so the probe times simulated transfers and deadlines count simulated seconds.
        """
        return time.perf_counter()

    def wait(self, requests: List[Any], deadline: Optional[float], *,
             peers: Optional[Sequence[int]] = None, what: Describe = "wait",
             on_done: Any = None, busy: bool = False, spin_polls: int = 0,
             nap_s: Optional[Tuple[float, float]] = None) -> None:
        """Wait for every request, or raise :class:`TransportTimeout` at ``deadline`` (a
        :meth:`now` value; None waits for ever).

        The transport's one poll loop with back-off (see :func:`horotopo.transport.p2p.
        wait_requests` for the parameters): ``peers[k]`` names request ``k``'s peer in the
        timeout, and ``on_done(k)`` may append requests while waiting. The requests may also
        be those of :meth:`iallreduce_control`. ``nap_s`` None pauses by :attr:`idle_nap_s`.
        """
        p2p.wait_requests(self, requests, deadline, peers=peers, what=what, on_done=on_done,
                          busy=busy, spin_polls=spin_polls,
                          nap_s=self.idle_nap_s if nap_s is None else nap_s, clock=self.now)

    # ---- the small collective steps (every rank calls them, in the same order) -------------

    def allreduce_control(self, buf: Any, op: ReduceOp, timeout_s: Optional[float] = None,
                          what: str = "allreduce") -> None:
        """In-place allreduce of a small host control vector (the engine's metadata check).

        Without ``timeout_s``: the library allreduce; a transport that must be able to say
        which peer a stuck wait is waiting for (:class:`~horotopo.reliability.TrackedTransport`)
        overrides it with :func:`allreduce_point_to_point`. With ``timeout_s``: point to point,
        raising :class:`TransportTimeout` naming the missing peers when it passes.
        """
        if timeout_s is None:
            self.allreduce(buf, buf, op)
        else:
            allreduce_point_to_point(self, buf, op, timeout_s, what)

    def iallreduce_control(self, buf: Any, op: ControlOp) -> Any:
        """Start an in-place allreduce of the small host vector ``buf``; return its request.

        The nonblocking control step of a cycle that must not block inside the library (the
        runtime's background thread: see :mod:`horotopo.api.controller`). Wait for the request
        with :meth:`wait`; ``buf`` holds the result once it has completed and must not be
        touched before. Every rank calls it in the same order, like the other steps. Here it
        runs point to point (:func:`~horotopo.transport.p2p.iallreduce_point_to_point`), and a
        timeout names the peers still missing; MPI's transport uses ``MPI_Iallreduce``.
        """
        return p2p.iallreduce_point_to_point(self, buf, op)

    def barrier(self, timeout_s: Optional[float] = None, what: str = "barrier") -> None:
        """Return once every rank has called it; a deadline names the ranks that did not."""
        p2p.barrier_point_to_point(self, timeout_s, what)

    def broadcast_bytes(self, data: Optional[bytes], root: int, timeout_s: float,
                        what: str = "broadcast") -> bytes:
        """``data`` (given on ``root`` only) on every rank. ``what`` names the step in errors."""
        return p2p.broadcast_bytes(self, data, root, timeout_s, what)

    def gather_bytes(self, data: bytes, root: int, timeout_s: float, what: str = "gather"
                     ) -> Optional[List[bytes]]:
        """Every rank's ``data``, in rank order, on ``root``; None on the other ranks."""
        return p2p.gather_bytes(self, data, root, timeout_s, what)

    def allgather_bytes(self, data: bytes, timeout_s: float, what: str = "allgather"
                        ) -> List[bytes]:
        """Every rank's ``data``, in rank order, on every rank."""
        return p2p.allgather_bytes(self, data, timeout_s, what)

    # The same for plain values (numbers, strings, lists, tuples, dicts, numeric arrays) in
    # the control plane's encoding (:mod:`.wire`): a peer's message is read as data, never
    # unpickled, and within a size limit.

    def broadcast_object(self, obj: Any, root: int, timeout_s: float,
                         what: str = "broadcast") -> Any:
        """:meth:`broadcast_bytes` of a plain value ``obj`` (read on ``root`` only)."""
        data = wire.encode(obj) if self.rank == root else None
        return wire.decode(self.broadcast_bytes(data, root, timeout_s, what))

    def gather_object(self, obj: Any, root: int, timeout_s: float, what: str = "gather"
                      ) -> Optional[List[Any]]:
        """:meth:`gather_bytes` of a plain value ``obj``."""
        got = self.gather_bytes(wire.encode(obj), root, timeout_s, what)
        return None if got is None else [wire.decode(b) for b in got]

    def allgather_object(self, obj: Any, timeout_s: float, what: str = "allgather"
                         ) -> List[Any]:
        """:meth:`allgather_bytes` of a plain value ``obj``."""
        return [wire.decode(b) for b in self.allgather_bytes(wire.encode(obj), timeout_s,
                                                             what)]

    def close(self) -> None:
        """Release the transport's resources; further calls fail."""


class WrappedTransport(Transport):
    """A transport that adds behaviour around ``inner`` and delegates the rest to it.

    Subclasses override the message calls they change; rank, size, tags, the control
    allreduce and the inner transport's extras (``comm``, ``barrier``...) pass through.
    ``close`` closes ``inner`` only when the wrapper ``owns`` it.
    """

    def __init__(self, inner: Transport, owns: bool = True) -> None:
        self.inner = inner
        self._owns = owns

    @property
    def idle_nap_s(self) -> Tuple[float, float]:  # type: ignore[override]
        return self.inner.idle_nap_s

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def size(self) -> int:
        return self.inner.size

    def alloc_tags(self, count: int) -> int:
        return self.inner.alloc_tags(count)

    @property
    def has_library_allreduce(self) -> bool:
        # A wrapper's allreduce delegates to the inner one, so both must have it.
        return type(self).allreduce is not Transport.allreduce \
            and self.inner.has_library_allreduce

    def irecv_any(self, buf: Any, tag: int) -> Any:
        return self.inner.irecv_any(buf, tag)

    def user_tags(self) -> range:
        return self.inner.user_tags()

    def allreduce_control(self, buf: Any, op: ReduceOp, timeout_s: Optional[float] = None,
                          what: str = "allreduce") -> None:
        if timeout_s is None:  # the engine's call, which wrappers such as TrackedTransport take
            self.inner.allreduce_control(buf, op)
        else:
            self.inner.allreduce_control(buf, op, timeout_s, what)

    # The collective steps move host bytes only, so the inner transport's own (possibly its
    # library's collectives) serve unchanged.

    def cancel(self, request: Any) -> None:
        self.inner.cancel(request)

    @property
    def processor_name(self) -> str:
        return self.inner.processor_name

    def now(self) -> float:
        # Deadlines handed to the inner transport's wait are read on its clock.
        return self.inner.now()

    def waitsome_until(self, requests: Sequence[Any], deadline: float) -> List[int]:
        if type(self.inner).waitsome_until is not Transport.waitsome_until:
            # the inner transport's own timed wait takes its own requests, not the wrapper's,
            # and a poll loop here would never let a simulated clock reach the deadline
            raise TransportError(f"{type(self).__name__} cannot wait with a deadline over "
                                 f"{type(self.inner).__name__}")
        return super().waitsome_until(requests, deadline)

    def barrier(self, timeout_s: Optional[float] = None, what: str = "barrier") -> None:
        self.inner.barrier(timeout_s, what)

    def broadcast_bytes(self, data: Optional[bytes], root: int, timeout_s: float,
                        what: str = "broadcast") -> bytes:
        return self.inner.broadcast_bytes(data, root, timeout_s, what)

    def gather_bytes(self, data: bytes, root: int, timeout_s: float, what: str = "gather"
                     ) -> Optional[List[bytes]]:
        return self.inner.gather_bytes(data, root, timeout_s, what)

    def allgather_bytes(self, data: bytes, timeout_s: float, what: str = "allgather"
                        ) -> List[bytes]:
        return self.inner.allgather_bytes(data, timeout_s, what)

    def close(self) -> None:
        if self._owns:
            self.inner.close()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during unpickling or a failed __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)


class TagAllocator:
    """Round-robin blocks of tags in ``[first, upper]``, identical on every rank."""

    def __init__(self, upper: int, first: int = 1) -> None:
        if upper - first < 64:
            raise TransportError(f"only {upper - first + 1} tags available; need at least 65")
        self._first = first
        self._upper = upper
        self._next = first

    def alloc(self, count: int) -> int:
        if count < 1:
            raise ValueError(f"tag count must be positive, got {count}")
        span = self._upper - self._first + 1
        if count > span:
            raise TransportError(f"a collective asked for {count} tags; only {span} exist")
        if self._next + count - 1 > self._upper:
            # Wrapping is safe: the block used `span` tags ago belongs to a collective that every
            # rank finished long since (each rank completes a collective before starting the next).
            self._next = self._first
        base = self._next
        self._next += count
        return base
