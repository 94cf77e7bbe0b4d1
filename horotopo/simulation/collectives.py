"""The simulated transport's collective steps: the control steps (the engine's metadata
check, a barrier, a plan's broadcast and digest check) and the MPI library's allreduce.

They run as MPI runs them, in ``log2 n`` rounds: recursive doubling for the allreduces,
binomial trees for the broadcast and for the allgather's gather (MPICH's algorithms for short
messages), where the generic steps of :mod:`horotopo.transport.p2p` are ``n``-way (a root that
sends to every rank, an all-to-all exchange) and would swamp a simulation of thousands of
ranks. A broadcast's bytes (or an allgather's list of them) reach every rank *by reference*:
the ranks live in one process and the object is immutable, so the simulation charges each
message its length without a copy per rank (4096 copies of a 11 MB plan would not fit in
memory), and every rank gets the same object, which lets the plan protocol decode it once.
:class:`~horotopo.transport.simulated.SimulatedTransport` mixes this class in.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..ops import UFUNCS
from .pending import Request

__all__ = ["SimCollectives", "RoundsRequest"]

# The control steps fold with these, "band" for vectors of flag bits (as in p2p).
_UFUNCS = dict(UFUNCS, band=np.bitwise_and)


class RoundsRequest:
    """A collective step in flight as rounds of point-to-point requests (a generator yields
    each round's requests once the previous round has completed; its return ends it)."""

    __slots__ = ("gen", "current", "done")

    def __init__(self, gen: Iterator[List[Request]]) -> None:
        self.gen = gen
        self.current: List[Request] = []
        self.done = False
        self.advance()

    def advance(self) -> None:
        while not self.done and all(r.done for r in self.current):
            try:
                self.current = next(self.gen)
            except StopIteration:
                self.done = True
                self.current = []

    def pending(self) -> List[Request]:
        return [r for r in self.current if not r.done]


class SimCollectives:
    """The collective steps of :class:`~horotopo.transport.simulated.SimulatedTransport`,
    over its point-to-point messages (``_isend``, ``irecv``, ``_isend_ref``, ``_irecv_ref``)
    and its simulated-time :meth:`wait`."""

    _size: int
    _rank: int
    unscaled: int
    isend: Callable[..., Any]
    irecv: Callable[..., Any]
    _isend: Callable[..., Any]
    _isend_ref: Callable[..., Any]
    _irecv_ref: Callable[..., Any]
    wait: Callable[..., None]
    now: Callable[[], float]
    alloc_tags: Callable[[int], int]

    @contextmanager
    def true_size(self) -> Iterator[None]:
        """Charge the messages posted inside at their true size, not ``scale`` times it: the
        control steps, and the probe (its transfers are sized to be timed, not scaled)."""
        self.unscaled += 1
        try:
            yield
        finally:
            self.unscaled -= 1

    def iallreduce_control(self, buf: Any, op: Any) -> RoundsRequest:
        """Start a recursive-doubling allreduce of the small vector ``buf`` (``log2 n`` rounds
        instead of the generic step's ``n``-way exchange); wait for it with :meth:`wait`."""
        fold = _UFUNCS.get(op)
        if fold is None:
            raise ValueError(f"op must be one of {sorted(_UFUNCS)}, got {op!r}")
        return RoundsRequest(self._doubling(np.asarray(buf), fold, self.alloc_tags(1), False))

    def _doubling(self, buf: np.ndarray, fold: Any, tag: int, scaled: bool
                  ) -> Iterator[List[Request]]:
        """Recursive doubling; with ``n`` not a power of two, the first ``2 r`` ranks pair up
        first (the even one hands its vector to the odd one and gets the result back). Every
        fold puts the lower rank's operand first, so every rank ends with the same bits."""
        n, me = self._size, self._rank
        if n == 1:
            return
        acc = buf.reshape(-1).copy()
        got = np.empty_like(acc)
        p = 1 << (n.bit_length() - 1)
        r = n - p
        if me < 2 * r and me % 2 == 0:
            yield [self._isend(acc, me + 1, tag, scaled)]
            yield [self.irecv(got, me + 1, tag)]
            buf.reshape(-1)[...] = got
            return
        if me < 2 * r:
            yield [self.irecv(got, me - 1, tag)]
            acc = fold(got, acc)
            vr = me // 2
        else:
            vr = me - r
        mask = 1
        while mask < p:
            partner_v = vr ^ mask
            partner = 2 * partner_v + 1 if partner_v < r else partner_v + r
            send = acc.copy()
            yield [self._isend(send, partner, tag, scaled), self.irecv(got, partner, tag)]
            acc = fold(got, acc) if partner_v < vr else fold(acc, got)
            mask <<= 1
        if me < 2 * r:
            yield [self._isend(acc, me - 1, tag, scaled)]
        buf.reshape(-1)[...] = acc

    def allreduce_control(self, buf: Any, op: Any, timeout_s: Optional[float] = None,
                          what: str = "allreduce") -> None:
        req = self.iallreduce_control(buf, op)
        deadline = None if timeout_s is None else self.now() + timeout_s
        self.wait([req], deadline, what=f"{what}: nothing within {timeout_s} s (simulated)")

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: Any) -> None:
        """The simulated MPI library's allreduce: recursive doubling, charged at ``scale``
        (a data allreduce, unlike the control steps)."""
        if recvbuf is not sendbuf:
            recvbuf[...] = sendbuf
        fold = _UFUNCS.get(op)
        if fold is None:
            raise ValueError(f"op must be one of {sorted(_UFUNCS)}, got {op!r}")
        self.wait([RoundsRequest(self._doubling(np.asarray(recvbuf), fold, self.alloc_tags(1),
                                          True))], None)

    def barrier(self, timeout_s: Optional[float] = None, what: str = "barrier") -> None:
        self.allreduce_control(np.zeros(1, dtype=np.uint8), "max", timeout_s, what)

    def broadcast_bytes(self, data: Optional[bytes], root: int, timeout_s: float,
                        what: str = "broadcast") -> bytes:
        """``data`` from ``root`` on every rank, down a binomial tree (``MPI_Bcast``'s for
        short messages), each message charged ``len(data)`` bytes; every rank gets the root's
        bytes object itself (see the module docstring)."""
        if self._rank == root:
            if data is None:
                raise ValueError("the broadcast root must give the data")
            data = bytes(data)
        got = self._bcast_ref(data, len(data) if data is not None else 0, root,
                              self.now() + timeout_s, what, timeout_s)
        return got

    def gather_bytes(self, data: bytes, root: int, timeout_s: float, what: str = "gather"
                     ) -> Optional[List[bytes]]:
        with self.true_size():
            return super().gather_bytes(data, root, timeout_s, what)  # type: ignore[misc]

    def allgather_bytes(self, data: bytes, timeout_s: float, what: str = "allgather"
                        ) -> List[bytes]:
        """A binomial-tree gather to rank 0 and a broadcast of the list back: ``2 (n - 1)``
        messages in ``2 log2 n`` rounds, where the generic all-to-all's ``n (n - 1)`` would
        swamp a simulation of thousands of ranks. Each message is charged the bytes it
        carries; the ranks share one tuple of the gathered objects."""
        deadline = self.now() + timeout_s
        mine = bytes(data)
        parts = self._gather_ref(mine, deadline, what, timeout_s)
        if parts is not None:
            parts = tuple(parts)
        every = self._bcast_ref(parts, sum(map(len, parts)) if parts is not None else 0, 0,
                                deadline, what, timeout_s)
        return list(every)

    # ---- binomial trees over rank order relative to the root (MPICH's) ------------------------
    def _subtree(self, vr: int) -> Tuple[int, List[int]]:
        """``(parent, children)`` of relative rank ``vr`` in the binomial tree over
        ``0..n-1`` rooted at 0 (parent -1 at the root): ``vr``'s lowest set bit ``b``, parent
        ``vr - b``, children ``vr + m`` for each power of two ``m < b`` (every ``m`` below
        ``n`` at the root) within range, largest first; child ``vr + m`` spans ``m`` ranks."""
        n = self._size
        low = vr & -vr if vr else 1 << max(0, (n - 1).bit_length())
        kids = []
        m = low >> 1
        while m:
            if vr + m < n:
                kids.append(vr + m)
            m >>= 1
        return (vr - low if vr else -1), kids

    def _bcast_ref(self, obj: Any, nbytes: int, root: int, deadline: float, what: str,
                   timeout_s: float) -> Any:
        """``obj`` (given on ``root``) on every rank down the binomial tree, each message
        charged ``nbytes`` (its true size: a control step)."""
        n = self._size
        tag = self.alloc_tags(1)
        vr = (self._rank - root) % n
        parent, kids = self._subtree(vr)
        if parent >= 0:
            src = (parent + root) % n
            req = self._irecv_ref(src, tag)
            self.wait([req], deadline, peers=[src], what=_named(what, timeout_s, [src]))
            obj, nbytes = req.payload, req.charged
        dests = [(k + root) % n for k in kids]
        sends = [self._isend_ref(obj, nbytes, d, tag) for d in dests]
        self.wait(sends, deadline, peers=dests, what=_named(what, timeout_s, dests))
        return obj

    def _gather_ref(self, mine: bytes, deadline: float, what: str, timeout_s: float
                    ) -> Optional[List[bytes]]:
        """Every rank's ``mine`` in rank order on rank 0 (None elsewhere), up the binomial
        tree: each rank sends its subtree's objects, charged their total length."""
        parent, kids = self._subtree(self._rank)
        tag = self.alloc_tags(1)
        reqs = [self._irecv_ref(k, tag) for k in kids]
        self.wait(reqs, deadline, peers=kids, what=_named(what, timeout_s, kids))
        parts = [mine]
        for req in reversed(reqs):  # the smallest child first: its ranks come next in order
            parts.extend(req.payload)
        if parent < 0:
            return parts
        send = self._isend_ref(tuple(parts), sum(map(len, parts)), parent, tag)
        self.wait([send], deadline, peers=[parent], what=_named(what, timeout_s, [parent]))
        return None


def _named(what: str, timeout_s: float, peers: Sequence[int]) -> Callable[[List[int]], str]:
    """A timeout's message naming the peers of the pending requests."""
    def describe(pending: List[int]) -> str:
        missing = sorted({peers[k] for k in pending})
        return (f"{what}: nothing from rank{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(str, missing))} within {timeout_s:g} s (simulated)")
    return describe
