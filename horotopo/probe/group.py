"""A subset of a transport's ranks seen as a transport of its own: the probe's phases that only
some ranks take part in (the host leaders, the ranks of one host).

:class:`GroupTransport` renumbers ``members`` (world ranks) as ``0..len(members) - 1``, takes
its tags from a block that every world rank reserved beforehand (so the world's tag counters
stay in step while only the members talk), and runs its control allreduce as recursive
doubling between the members only: ``log2`` of the group's size in message steps, where the
world's control allreduce would make every world rank take part. The probe's
:class:`~horotopo.probe.flows.Prober` runs over it unchanged.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..ops import UFUNCS
from ..transport.base import TagAllocator, Transport, WrappedTransport
from ..transport.poll import TransportTimeout

__all__ = ["GroupTransport", "TAG_BLOCK"]

#: Tags each group takes from the world (every world rank reserves the block, in step).
TAG_BLOCK = 1024


def _schedule(n: int, me: int) -> List[Tuple[str, int, bool]]:
    """Group rank ``me``'s steps of recursive doubling over ``n`` ranks: ``(kind, peer,
    peer's operand first)``. With ``p`` the largest power of two up to ``n`` and ``r = n - p``,
    the first ``2 r`` ranks pair up: the even one hands its vector over ("hand") and the odd
    one folds it in ("take") and returns the result at the end ("give"); the ``p`` ranks left
    exchange with the partner at each distance ("swap")."""
    p = 1 << (n.bit_length() - 1)
    r = n - p
    if me < 2 * r and me % 2 == 0:
        return [("hand", me + 1, False)]
    steps: List[Tuple[str, int, bool]] = []
    if me < 2 * r:
        steps.append(("take", me - 1, True))
    virtual = me // 2 if me < 2 * r else me - r
    distance = 1
    while distance < p:
        other = virtual ^ distance
        steps.append(("swap", 2 * other + 1 if other < r else other + r, other < virtual))
        distance <<= 1
    if me < 2 * r:
        steps.append(("give", me - 1, False))
    return steps


class GroupTransport(WrappedTransport):
    """The ranks ``members`` of ``inner`` as a transport of ``len(members)`` ranks.

    Parameters
    ----------
    inner : Transport
        The world transport; this rank must be one of ``members``.
    members : sequence of int
        World ranks, in the order that gives their group ranks.
    tag_base : int
        First tag of a block of ``tags`` tags that every world rank reserved with
        ``inner.alloc_tags`` (the members use it; the others just skip it).
    tags : int
        The block's size (:data:`TAG_BLOCK` by default).
    """

    def __init__(self, inner: Transport, members: Sequence[int], tag_base: int,
                 tags: int = TAG_BLOCK) -> None:
        super().__init__(inner, owns=False)
        self.members = [int(m) for m in members]
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"group members must be distinct, got {self.members}")
        if inner.rank not in self.members:
            raise ValueError(f"rank {inner.rank} is not in the group {self.members}")
        self._rank = self.members.index(inner.rank)
        self._tags = TagAllocator(tag_base + tags - 1, tag_base)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return len(self.members)

    def alloc_tags(self, count: int) -> int:
        return self._tags.alloc(count)

    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        return self.inner.isend(buf, self.members[dest], tag)

    def irecv(self, buf: Any, source: int, tag: int) -> Any:
        return self.inner.irecv(buf, self.members[source], tag)

    def test(self, request: Any) -> bool:
        return self.inner.test(request)

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        return self.inner.waitsome(requests)

    def waitall(self, requests: Sequence[Any]) -> None:
        self.inner.waitall(requests)

    def wait(self, requests: List[Any], deadline: Optional[float], *,
             peers: Optional[Sequence[int]] = None, what: Any = "wait", on_done: Any = None,
             busy: bool = False, spin_polls: int = 0, nap_s: Any = None) -> None:
        # The inner wait names world ranks in its timeout; ``peers`` may grow while waiting
        # (on_done appends), so it is translated at the timeout, not now.
        try:
            kwargs = {} if nap_s is None else {"nap_s": nap_s}
            self.inner.wait(requests, deadline, what=what, on_done=on_done, busy=busy,
                            spin_polls=spin_polls, **kwargs)
        except TransportTimeout as exc:
            pending = sorted({self.members[p] for p in peers}) if peers is not None else []
            raise TransportTimeout(f"{exc} (group ranks are world ranks {self.members}; "
                                   f"peers of this wait: {pending})",
                                   tuple(exc.missing) or pending) from exc

    def allreduce_control(self, buf: Any, op: Any, timeout_s: Optional[float] = None,
                          what: str = "allreduce") -> None:
        """Recursive doubling between the members (``op`` one of the package's reductions):
        each fold puts the lower rank's operand first, so every member ends with the same
        bits. With a group size that is not a power of two, the first ``2 r`` ranks pair up
        first (the even one hands its vector to the odd one and gets the result back)."""
        fold = UFUNCS.get(op)
        if fold is None:
            raise ValueError(f"op must be one of {sorted(UFUNCS)}, got {op!r}")
        n, me = self.size, self._rank
        if n == 1:
            return
        tag = self.alloc_tags(1)
        deadline = None if timeout_s is None else self.now() + timeout_s
        flat = np.asarray(buf).reshape(-1)
        acc = flat.copy()
        got = np.empty_like(acc)

        def step(reqs: List[Any], peer: int) -> None:
            self.wait(reqs, deadline, peers=[peer] * len(reqs),
                      what=f"{what}: group rank {peer} (world rank {self.members[peer]}) "
                           f"did not answer within {timeout_s} s")

        for kind, peer, first in _schedule(n, me):
            if kind == "hand":  # an extra rank: its vector to its partner, the result back
                step([self.isend(acc, peer, tag)], peer)
                step([self.irecv(got, peer, tag)], peer)
                flat[...] = got
                return
            if kind == "take":
                step([self.irecv(got, peer, tag)], peer)
            elif kind == "give":
                step([self.isend(acc, peer, tag)], peer)
                continue
            else:
                send = acc.copy()
                step([self.isend(send, peer, tag), self.irecv(got, peer, tag)], peer)
            acc = fold(got, acc) if first else fold(acc, got)
        flat[...] = acc

    def barrier(self, timeout_s: Optional[float] = None, what: str = "barrier") -> None:
        self.allreduce_control(np.zeros(1), "max", timeout_s, what)

    # The byte collectives and the non-blocking control allreduce run point to point over
    # this transport's own messages (the WrappedTransport's would hand them to the world; the
    # probe itself uses the blocking control step above).
    broadcast_bytes = Transport.broadcast_bytes
    gather_bytes = Transport.gather_bytes
    allgather_bytes = Transport.allgather_bytes
    iallreduce_control = Transport.iallreduce_control
