"""The transport interface (no MPI here)."""
from __future__ import annotations

from typing import Any, List, Literal, Sequence

import numpy as np

__all__ = ["Transport", "TransportError", "ReduceOp", "WrappedTransport",
           "allreduce_point_to_point"]

ReduceOp = Literal["sum", "min", "max", "product"]


class TransportError(RuntimeError):
    """The transport cannot do what was asked (closed, unsupported buffer, no tags left)."""


class Transport:
    """Point-to-point messages between ``size`` ranks, with nonblocking progress.

    Buffers are contiguous one-dimensional arrays (NumPy, or CuPy where the implementation is
    CUDA-aware); they move as raw bytes, so both ends must agree on the byte count. Messages
    between one pair of ranks with one tag are delivered in the order they were posted (MPI's
    non-overtaking rule); the algorithms rely on this to reuse a tag for every chunk of a stream.
    """

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

    def test(self, request: Any) -> bool:
        """True when ``request`` has completed (then it must not be tested again)."""
        raise NotImplementedError

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        """Block until at least one of ``requests`` completes; return the completed indices."""
        raise NotImplementedError

    def waitall(self, requests: Sequence[Any]) -> None:
        """Block until every request in ``requests`` has completed."""
        raise NotImplementedError

    def alloc_tags(self, count: int) -> int:
        """Reserve ``count`` consecutive tags for one collective call; return the first.

        Every rank must call this in the same order with the same ``count`` (collectives are
        called in the same order everywhere), so the blocks agree without communication.
        """
        raise NotImplementedError

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        """Library allreduce (``sendbuf is recvbuf`` means in place). Optional."""
        raise TransportError(f"{type(self).__name__} has no library allreduce")

    def allreduce_control(self, buf: Any, op: ReduceOp) -> None:
        """In-place allreduce of a small host control vector (the engine's metadata check).

        The library allreduce by default; a transport that must be able to say which peer a
        stuck wait is waiting for (:class:`~horotopo.reliability.TrackedTransport`) overrides
        it with :func:`allreduce_point_to_point`.
        """
        self.allreduce(buf, buf, op)

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
    def rank(self) -> int:
        return self.inner.rank

    @property
    def size(self) -> int:
        return self.inner.size

    def alloc_tags(self, count: int) -> int:
        return self.inner.alloc_tags(count)

    def allreduce_control(self, buf: Any, op: ReduceOp) -> None:
        self.inner.allreduce_control(buf, op)

    def close(self) -> None:
        if self._owns:
            self.inner.close()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during unpickling or a failed __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)


_UFUNCS = {"sum": np.add, "min": np.minimum, "max": np.maximum, "product": np.multiply}


def allreduce_point_to_point(transport: Transport, buf: np.ndarray, op: ReduceOp) -> None:
    """Allreduce the small array ``buf`` in place by sending it to every other rank.

    ``2 (size - 1)`` messages per rank, so only for control vectors on modest rank counts. Each
    rank folds the vectors in rank order, so the result is bitwise identical everywhere.
    """
    n, me = transport.size, transport.rank
    if n == 1:
        return
    tag = transport.alloc_tags(1)
    mine = np.ascontiguousarray(buf).copy()
    got = {p: np.empty_like(mine) for p in range(n) if p != me}
    reqs = [transport.irecv(got[p], p, tag) for p in got]
    reqs += [transport.isend(mine, p, tag) for p in got]
    while reqs:  # waitsome, not waitall: what stays pending names the peers still missing
        done = set(transport.waitsome(reqs))
        reqs = [r for i, r in enumerate(reqs) if i not in done]
    got[me] = mine
    fold = _UFUNCS[op]
    acc = got[0].copy()
    for p in range(1, n):
        fold(acc, got[p], out=acc)
    buf[...] = acc


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
