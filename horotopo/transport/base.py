"""The transport interface (no MPI here)."""
from __future__ import annotations

from typing import Any, List, Literal, Sequence

__all__ = ["Transport", "TransportError", "ReduceOp"]

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

    def close(self) -> None:
        """Release the transport's resources; further calls fail."""


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
