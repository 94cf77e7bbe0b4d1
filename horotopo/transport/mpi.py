"""The mpi4py transport, on a duplicated communicator so that its tags never meet the user's."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .. import config
from ..ops import ReduceOp as _Op
from ..params import RELIABILITY, RUNTIME
from .base import ControlOp, ReduceOp, TagAllocator, Transport, TransportError
from .poll import DONE, IDLE, TransportTimeout, deadline_after, poll
from .wire import wire_view

__all__ = ["MPITransport", "as_transport", "supports_threads", "thread_multiple", "missing_ranks",
           "ARRIVAL_TAG", "DEPARTURE_TAG", "absent_ranks",
           "announce_departure", "world_rank_size", "abort_world",
           "checked_thread_level", "world_comm", "as_comm", "group_comm"]

# The library's op per horotopo.ops.ReduceOp, keyed by the members' plain names (a member
# finds its entry too: it is its name).
_OPS = {_Op.SUM.value: MPI.SUM, _Op.MIN.value: MPI.MIN, _Op.MAX.value: MPI.MAX,
        _Op.PRODUCT.value: MPI.PROD}
_CONTROL_OPS = dict(_OPS, band=MPI.BAND)  # the control steps' ops (base.ControlOp)
_TYPES: Dict[np.dtype, Any] = {np.dtype(k): v for k, v in (
    ("float32", MPI.FLOAT), ("float64", MPI.DOUBLE), ("int32", MPI.INT32_T),
    ("int64", MPI.INT64_T), ("uint8", MPI.UINT8_T), ("int8", MPI.INT8_T),
    ("uint32", MPI.UINT32_T), ("uint64", MPI.UINT64_T))}
_HALF = np.dtype(np.float16)

def _wire(buf: Any) -> Any:
    """``buf`` as MPI can take it: mpi4py cannot always export ml_dtypes' bfloat16 through the
    buffer protocol, so its raw 16-bit words travel as uint16. Testing the kind first keeps
    the per-message cost at one attribute read; bfloat16 is the only 'V' dtype sent here."""
    return wire_view(buf) if buf.dtype.kind == "V" else buf


class MPITransport(Transport):
    """:class:`Transport` over an mpi4py communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator to run on. It is ``Dup()``-ed, so traffic never matches the caller's
        own messages; :meth:`close` frees the duplicate.
    """

    def __init__(self, comm: "MPI.Comm", poll_sleep_s: Optional[float] = None,
                 spin_polls: Optional[int] = None,
                 named_max_ranks: int = RUNTIME.named_max_ranks,
                 idle_nap_s: Optional[Tuple[float, float]] = None) -> None:
        # Waiting polls with Testsome and, after `spin_polls` empty polls, sleeps
        # `poll_sleep_s` between polls instead of spinning inside MPI_Waitsome: on a node
        # with more ranks than cores (and on emulated networks, where the kernel moves the
        # bytes) spinning ranks take the CPU from the ranks and the kernel that have work.
        # poll_sleep_s=0 spins in MPI_Waitsome as MPI would.
        self.poll_sleep_s = (poll_sleep_s if poll_sleep_s is not None
                             else config.get("HOROTOPO_POLL_SLEEP_US") * 1e-6)
        self.spin_polls = (spin_polls if spin_polls is not None
                           else config.get("HOROTOPO_SPIN_POLLS"))
        self.named_max_ranks = named_max_ranks
        self.idle_nap_s = (idle_nap_s if idle_nap_s is not None
                           else config.runtime_params().idle_nap_s)
        self._comm: Optional[MPI.Comm] = comm.Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        upper = int(self._comm.Get_attr(MPI.TAG_UB) or 32767)
        # The upper half of the tags is the users' (user_tags): collectives never take them.
        self._tags = TagAllocator(upper // 2)
        self._user_tags = range(upper // 2 + 1, upper + 1)

    @classmethod
    def world(cls, **kwargs: Any) -> "MPITransport":
        """A transport over ``MPI.COMM_WORLD`` (for entry points that own the whole job)."""
        return cls(MPI.COMM_WORLD, **kwargs)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job (after an error a peer may never recover from)."""
        MPI.COMM_WORLD.Abort(code)

    @property
    def comm(self) -> "MPI.Comm":
        if self._comm is None:
            raise TransportError("the transport is closed")
        return self._comm

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        return self.comm.Isend([_wire(buf), MPI.BYTE], dest, tag)

    def irecv(self, buf: Any, source: int, tag: int) -> Any:
        return self.comm.Irecv([_wire(buf), MPI.BYTE], source, tag)

    def irecv_any(self, buf: Any, tag: int) -> Any:
        return self.comm.Irecv([_wire(buf), MPI.BYTE], MPI.ANY_SOURCE, tag)

    def test(self, request: Any) -> bool:
        return bool(request.Test())

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        if self.poll_sleep_s <= 0:
            done = MPI.Request.Waitsome(requests)
        else:
            testsome = MPI.Request.Testsome
            found: List[Any] = []

            def step() -> int:
                got = testsome(requests)
                if got or got is None:
                    found.append(got)
                    return DONE
                return IDLE

            # The one poll loop, with a constant pause (both ends of nap_s equal): the
            # engine's chunks complete within the pause of each other, so no back-off.
            poll(step, spin_polls=self.spin_polls,
                 nap_s=(self.poll_sleep_s, self.poll_sleep_s))
            done = found[0]
        if done is None:
            raise TransportError("waitsome on requests that have all completed already")
        return done

    def waitsome_until(self, requests: Sequence[Any], deadline: float) -> List[int]:
        testsome = MPI.Request.Testsome
        found: List[Any] = []

        def step() -> int:
            if not requests:
                return IDLE
            got = testsome(requests)
            if got is None:
                raise TransportError("waitsome on requests that have all completed already")
            found.extend(got)
            return DONE if got else IDLE

        poll(step, deadline, busy=True)
        return found

    def cancel(self, request: Any) -> None:
        try:
            request.Cancel()
        except Exception:  # noqa: BLE001 - best effort after a timeout; that error matters more
            pass

    @property
    def processor_name(self) -> str:
        return MPI.Get_processor_name()

    def waitall(self, requests: Sequence[Any]) -> None:
        if requests:
            MPI.Request.Waitall(requests)

    def alloc_tags(self, count: int) -> int:
        return self._tags.alloc(count)

    def user_tags(self) -> range:
        return self._user_tags

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        """MPI_Allreduce on flat arrays of one dtype; float16 and bfloat16 are reduced in
        float32 (see below)."""
        mop = _OPS.get(op)
        if mop is None:
            raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
        dtype = _TYPES.get(recvbuf.dtype)
        if dtype is None:
            if recvbuf.dtype != _HALF and recvbuf.dtype.name != "bfloat16":
                raise TransportError(f"no MPI datatype for {recvbuf.dtype}")
            # MPI has no portable half or bfloat16 type (MPIX_C_FLOAT16 is optional, bfloat16
            # has none): reduce in float32 (exact widening for both) and round once at the end,
            # which is also the more accurate answer. MPI's float32 result is the same on every
            # rank, so the rounded one is too.
            wide = sendbuf.astype(np.float32)  # a copy, NumPy or CuPy alike
            self.comm.Allreduce(MPI.IN_PLACE, [wide, MPI.FLOAT], op=mop)
            recvbuf[...] = wide
            return
        if sendbuf is recvbuf:
            self.comm.Allreduce(MPI.IN_PLACE, [recvbuf, dtype], op=mop)
        else:
            self.comm.Allreduce([sendbuf, dtype], [recvbuf, dtype], op=mop)

    # ---- the small collective steps: point to point up to named_max_ranks (the base class's,
    # naming missing peers), MPI's nonblocking collectives above, all through the poll loop.

    def _named(self) -> bool:
        return self._size <= self.named_max_ranks

    def _finish(self, request: Any, deadline: Optional[float], what: str,
                timeout_s: Optional[float], missing: Sequence[int] = ()) -> None:
        """Poll one nonblocking collective to completion or raise at ``deadline``."""
        if not poll(lambda: DONE if request.Test() else IDLE, deadline, nap_s=self.idle_nap_s):
            self.cancel(request)
            who = (f"nothing from rank {missing[0]}" if len(missing) == 1
                   else "not every rank arrived")
            raise TransportTimeout(f"{what}: {who} within {timeout_s:g} s (MPI's collective "
                                   f"cannot tell which rank it waits for)", missing)

    def barrier(self, timeout_s: Optional[float] = None, what: str = "barrier") -> None:
        if timeout_s is not None and self._named():
            super().barrier(timeout_s, what)
        else:
            self._finish(self.comm.Ibarrier(), deadline_after(timeout_s), what, timeout_s)

    def allreduce_control(self, buf: Any, op: ReduceOp, timeout_s: Optional[float] = None,
                          what: str = "allreduce") -> None:
        dtype = _TYPES.get(buf.dtype)
        if timeout_s is None or self._named() or dtype is None:
            super().allreduce_control(buf, op, timeout_s, what)
            return
        if op not in _OPS:
            raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
        out = np.empty_like(buf)
        req = self.comm.Iallreduce([np.ascontiguousarray(buf), dtype], [out, dtype],
                                   op=_OPS[op])
        self._finish(req, deadline_after(timeout_s), what, timeout_s)
        buf[...] = out

    def iallreduce_control(self, buf: Any, op: ControlOp) -> Any:
        """``MPI_Iallreduce`` in place on ``buf``, at every rank count: the runtime runs one
        per cycle, and the library's log-depth collective beats ``2 (size - 1)`` messages.
        A stuck cycle is named by the runtime's watchdog and liveness pings instead."""
        mop = _CONTROL_OPS.get(op)
        if mop is None:
            raise ValueError(f"op must be one of {sorted(_CONTROL_OPS)}, got {op!r}")
        dtype = _TYPES.get(buf.dtype)
        if dtype is None:
            raise TransportError(f"no MPI datatype for a control vector of {buf.dtype}")
        return self.comm.Iallreduce(MPI.IN_PLACE, [buf, dtype], op=mop)

    def broadcast_bytes(self, data: Optional[bytes], root: int, timeout_s: float,
                        what: str = "broadcast") -> bytes:
        if self._named():
            return super().broadcast_bytes(data, root, timeout_s, what)
        deadline = deadline_after(timeout_s)
        if self._rank == root:
            if data is None:
                raise ValueError("the broadcast root must give the data")
            buf = np.frombuffer(bytes(data), dtype=np.uint8).copy()
            missing: Sequence[int] = ()
        else:
            buf = np.zeros(0, dtype=np.uint8)
            missing = (root,)
        length = np.array([len(buf)], dtype=np.int64)
        self._finish(self.comm.Ibcast(length, root=root), deadline, what, timeout_s, missing)
        if self._rank != root:
            buf = np.empty(int(length[0]), dtype=np.uint8)
        if len(buf):
            self._finish(self.comm.Ibcast([buf, MPI.BYTE], root=root), deadline, what,
                         timeout_s, missing)
        return buf.tobytes()

    def gather_bytes(self, data: bytes, root: int, timeout_s: float, what: str = "gather"
                     ) -> Optional[List[bytes]]:
        if self._named():
            return super().gather_bytes(data, root, timeout_s, what)
        deadline = deadline_after(timeout_s)
        mine = np.frombuffer(bytes(data), dtype=np.uint8)
        count = np.array([len(mine)], dtype=np.int64)
        if self._rank != root:
            self._finish(self.comm.Igather(count, None, root=root), deadline, what, timeout_s)
            self._finish(self.comm.Igatherv([mine, MPI.BYTE], None, root=root), deadline,
                         what, timeout_s)
            return None
        lens = np.zeros(self._size, dtype=np.int64)
        self._finish(self.comm.Igather(count, lens, root=root), deadline, what, timeout_s)
        buf, displs = _spread(lens)
        self._finish(self.comm.Igatherv([mine, MPI.BYTE], [buf, (lens, displs), MPI.BYTE],
                                        root=root), deadline, what, timeout_s)
        return [buf[displs[r]:displs[r] + lens[r]].tobytes() for r in range(self._size)]

    def allgather_bytes(self, data: bytes, timeout_s: float, what: str = "allgather"
                        ) -> List[bytes]:
        if self._named():
            return super().allgather_bytes(data, timeout_s, what)
        deadline = deadline_after(timeout_s)
        mine = np.frombuffer(bytes(data), dtype=np.uint8)
        lens = np.zeros(self._size, dtype=np.int64)
        self._finish(self.comm.Iallgather(np.array([len(mine)], dtype=np.int64), lens),
                     deadline, what, timeout_s)
        buf, displs = _spread(lens)
        self._finish(self.comm.Iallgatherv([mine, MPI.BYTE], [buf, (lens, displs), MPI.BYTE]),
                     deadline, what, timeout_s)
        return [buf[displs[r]:displs[r] + lens[r]].tobytes() for r in range(self._size)]

    def close(self) -> None:
        if self._comm is not None:
            comm, self._comm = self._comm, None
            if not MPI.Is_finalized():
                comm.Free()


def as_transport(comm: Any) -> Transport:
    """A :class:`Transport` from a transport (returned as is) or an mpi4py communicator."""
    if isinstance(comm, Transport):
        return comm
    if isinstance(comm, MPI.Comm):
        return MPITransport(comm)
    raise TypeError(f"expected an mpi4py communicator or a Transport, got {type(comm).__name__}")


def _spread(lens: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """A receive buffer for payloads of ``lens`` bytes laid end to end, and their offsets."""
    displs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return np.empty(max(int(lens.sum()), 1), dtype=np.uint8), displs


def checked_thread_level() -> int:
    """MPI's thread level (``MPI_Query_thread``), checked to allow a background thread.

    Raises
    ------
    RuntimeError
        Below ``MPI_THREAD_SERIALIZED``: horotopo's background thread makes every MPI call.
    """
    level = MPI.Query_thread()
    if level < MPI.THREAD_SERIALIZED:
        raise RuntimeError("horotopo needs MPI initialized with at least "
                           "MPI_THREAD_SERIALIZED (a background thread makes every MPI "
                           "call); set mpi4py.rc.thread_level = 'multiple' before importing "
                           "mpi4py.MPI")
    return level


def world_comm() -> "MPI.Comm":
    """``MPI.COMM_WORLD`` (initializing MPI if nothing has yet)."""
    return MPI.COMM_WORLD


def as_comm(obj: Any, where: str, also: str = "") -> "MPI.Comm":
    """``obj``, checked to be an mpi4py communicator.

    Raises
    ------
    TypeError
        Naming ``where`` (the call that was given ``obj``), what it takes (a communicator, or
        ``also``) and what it got.
    """
    if not isinstance(obj, MPI.Comm):
        alternative = f" or {also}" if also else ""
        raise TypeError(f"{where} takes an mpi4py communicator{alternative}, got "
                        f"{type(obj).__name__}")
    return obj


def group_comm(comm: "MPI.Comm", ranks: Sequence[int]) -> "MPI.Comm":
    """A new communicator over ``ranks`` of ``comm``, in that order.

    Collective over ``ranks`` only (``MPI_Comm_create_group``): the other ranks of ``comm``
    need not take part.
    """
    group = comm.Get_group().Incl([int(r) for r in ranks])
    try:
        return comm.Create_group(group)
    finally:
        group.Free()


def member_ranks(comm: Any, job_rank: int) -> Tuple[int, ...]:
    """The job ranks of ``comm``'s members, sorted, each member passing its own ``job_rank``.

    Collective over ``comm`` (a user's communicator, which need not span the job).
    """
    return tuple(sorted(int(r) for r in comm.allgather(int(job_rank))))


def supports_threads(thread_level: int) -> bool:
    """True if ``thread_level`` (what ``MPI_Query_thread`` returned) is MPI_THREAD_MULTIPLE.

    The levels' numeric values are the MPI library's own, so only this module compares them.
    """
    return thread_level >= MPI.THREAD_MULTIPLE


def thread_multiple() -> bool:
    """True when this process's MPI runs at MPI_THREAD_MULTIPLE (threads may call it at once)."""
    return supports_threads(MPI.Query_thread())


def world_rank_size() -> Optional[Tuple[int, int]]:
    """``(rank, size)`` in ``COMM_WORLD`` while MPI is up (initialized, not finalized), else
    None. Never initializes MPI: for the abort path, which must work before and after."""
    try:
        if not MPI.Is_initialized() or MPI.Is_finalized():
            return None
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    except Exception:  # noqa: BLE001 - a broken MPI must not hide the error being reported
        return None


def abort_world(code: int) -> None:
    """``MPI_Abort(COMM_WORLD, code)``: the launcher ends every rank of the job."""
    MPI.COMM_WORLD.Abort(code)


#: The tag of init's arrival messages on the caller's communicator (before horotopo has a
#: duplicate of its own): a user receive with MPI.ANY_TAG posted across init could take them.
ARRIVAL_TAG = 0x6874


def _done_by(request: Any, deadline: float, nap_s: Tuple[float, float]) -> bool:
    """Poll ``request`` until it completes (True) or ``deadline`` passes (False; left posted)."""
    return poll(lambda: DONE if request.Test() else IDLE, deadline, nap_s=nap_s)


def missing_ranks(comm: "MPI.Comm", timeout_s: float,
                  members: Optional[Sequence[int]] = None) -> List[int]:
    """The ranks of ``comm`` that did not call this within ``timeout_s``; ``[]`` when all did.

    :func:`absent_ranks`' first answer, for the callers that do not ask why.
    """
    return absent_ranks(comm, timeout_s, members)[0]


def absent_ranks(comm: "MPI.Comm", timeout_s: float,
                 members: Optional[Sequence[int]] = None) -> Tuple[List[int], List[int]]:
    """``(missing, departed)``: the ranks of ``comm`` that did not call this within
    ``timeout_s``, and those of them that are known to have left (their process announced its
    exit: :func:`announce_departure`); ``([], [])`` when all came.

    Runs on the caller's communicator before any :class:`MPITransport` exists (its ``Dup`` is
    a collective that would wait for ever for a rank that never comes), hence a function of
    the MPI door rather than a transport step.

    The first member gathers an arrival message from every other member, waits until the
    deadline or until every member has arrived or left, then sends each arrived member the
    outcome, so every rank that arrived in time returns the same lists. A member that sees no
    answer from the first returns ``[first]``: it has not arrived, or it already gave up before
    this member came. Only point-to-point messages with :data:`ARRIVAL_TAG` (on ``comm``) and
    :data:`DEPARTURE_TAG` (on ``COMM_WORLD``, the only communicator a leaving process knows),
    so nothing blocks past the deadline (a collective cannot say who is missing). The arrival
    send of a member that came too late stays posted: init fails there anyway.

    Parameters
    ----------
    comm : mpi4py communicator
    timeout_s : float
        How long the first member waits for the others (the others wait up to twice as long,
        since the first may start its wait after them).
    members : sequence of int, optional
        The ranks of ``comm`` that take part (all by default); the others must not call this.

    Raises
    ------
    TransportTimeout
        The first member could not tell an arrived rank the outcome within ``timeout_s``.
    """
    ranks = list(range(comm.Get_size())) if members is None else [int(r) for r in members]
    first, others = ranks[0], ranks[1:]
    deadline = time.perf_counter() + timeout_s
    # read here, once per job: this runs before any transport (and its parameters) exists
    nap_s = config.runtime_params().idle_nap_s
    gone = _Departures(comm)
    try:
        if comm.Get_rank() != first:
            return _arrive(comm, ranks, gone, deadline, timeout_s, nap_s)
        return _gather_arrivals(comm, ranks, gone, deadline, timeout_s, nap_s)
    finally:
        gone.close()


#: The tag of the notices that a process leaving before init sends on ``COMM_WORLD``.
DEPARTURE_TAG = ARRIVAL_TAG + 1
# What an arrival answer says of each member.
_MISSING, _ARRIVED, _DEPARTED = 0, 1, 2


class _Departures:
    """The departure notices that reach this rank while it waits for the others at init."""

    def __init__(self, comm: "MPI.Comm") -> None:
        self._world = MPI.COMM_WORLD
        self._to_comm = (self._world.Get_group(), comm.Get_group())
        self._buf = np.zeros(1, dtype=np.int32)
        self._req = self._world.Irecv(self._buf, source=MPI.ANY_SOURCE, tag=DEPARTURE_TAG)
        self.ranks: List[int] = []  # ranks of comm that left

    def poll(self) -> None:
        while self._req.Test():
            mine = MPI.Group.Translate_ranks(self._to_comm[0], [int(self._buf[0])],
                                             self._to_comm[1])[0]
            if mine != MPI.UNDEFINED and mine not in self.ranks:
                self.ranks.append(mine)
            self._req = self._world.Irecv(self._buf, source=MPI.ANY_SOURCE, tag=DEPARTURE_TAG)

    def close(self) -> None:
        try:
            self._req.Cancel()
            self._req.Wait()
        except Exception:  # noqa: BLE001 - best effort: a receive cancels cleanly
            pass
        for group in self._to_comm:
            group.Free()


def _arrive(comm: "MPI.Comm", ranks: List[int], gone: _Departures, deadline: float,
            timeout_s: float, nap_s: Tuple[float, float]) -> Tuple[List[int], List[int]]:
    """A member other than the first: say it arrived, then take the first member's outcome."""
    first = ranks[0]
    outcome = np.zeros(len(ranks), dtype=np.int8)
    answer = comm.Irecv(outcome, source=first, tag=ARRIVAL_TAG)
    # Issend completes only once the first member has received it: proof that it is here.
    hello = comm.Issend(np.ones(1, dtype=np.int8), dest=first, tag=ARRIVAL_TAG)
    state = {"hello": False}

    def step() -> int:
        gone.poll()
        if first in gone.ranks:
            return DONE
        if not state["hello"]:
            state["hello"] = bool(hello.Test())
        return DONE if state["hello"] and answer.Test() else IDLE

    poll(step, deadline + timeout_s, nap_s=nap_s)
    if first in gone.ranks:
        return [first], [first]
    if not state["hello"] or not answer.Test():
        try:
            answer.Cancel()
        except Exception:  # noqa: BLE001 - best effort; the missing rank is what matters
            pass
        return [first], []
    missing = [r for r, said in zip(ranks, outcome) if said != _ARRIVED]
    return missing, [r for r, said in zip(ranks, outcome) if said == _DEPARTED]


def _gather_arrivals(comm: "MPI.Comm", ranks: List[int], gone: _Departures,
                     deadline: float, timeout_s: float,
                     nap_s: Tuple[float, float]) -> Tuple[List[int], List[int]]:
    """The first member: take the arrivals until every member came or left, or the deadline."""
    others = ranks[1:]
    tokens = [np.zeros(1, dtype=np.int8) for _ in others]
    recvs = [comm.Irecv(t, source=r, tag=ARRIVAL_TAG) for t, r in zip(tokens, others)]
    got = [False] * len(others)

    def step() -> int:
        gone.poll()
        for k, req in enumerate(recvs):
            if not got[k] and req.Test():
                got[k] = True
        return DONE if all(g or r in gone.ranks for g, r in zip(got, others)) else IDLE

    poll(step, deadline, nap_s=nap_s)
    for k, req in enumerate(recvs):
        if not got[k]:  # named below; a receive cancels cleanly
            try:
                req.Cancel()
            except Exception:  # noqa: BLE001 - best effort
                pass
    outcome = np.array([_ARRIVED] + [_ARRIVED if g else _DEPARTED if r in gone.ranks
                                     else _MISSING for g, r in zip(got, others)], dtype=np.int8)
    to = [r for r, g in zip(others, got) if g]
    sends = [comm.Isend(outcome, dest=r, tag=ARRIVAL_TAG) for r in to]
    # The arrived ranks are waiting for exactly this message, so it completes at once.
    left = time.perf_counter() + timeout_s
    for r, req in zip(to, sends):
        if not _done_by(req, left, nap_s):
            raise TransportTimeout(f"init: telling the ranks who arrived: rank {r} took no "
                                   f"answer within {timeout_s:g} s", [r])
    missing = [r for r, g in zip(others, got) if not g]
    return missing, [r for r in missing if r in gone.ranks]


def announce_departure(wait_s: float = RELIABILITY.departure_wait_s) -> None:
    """Tell every other rank of ``COMM_WORLD`` that this process leaves before init, so that
    their init fails at once naming it (:func:`absent_ranks`) instead of at the start timeout.

    For a process's exit path: does nothing unless MPI is up (initialized, not finalized) with
    more than one rank. For ``wait_s`` seconds at most, the sends complete and the notices of
    peers that leave the same way are taken in, so that no notice is left unmatched when every
    rank leaves (a script that fails before init on all of them).
    """
    place = world_rank_size()
    if place is None or place[1] < 2:
        return
    me, size = place
    world = MPI.COMM_WORLD
    notice = np.array([me], dtype=np.int32)
    sends = [world.Isend(notice, dest=r, tag=DEPARTURE_TAG) for r in range(size) if r != me]
    heard = set()
    theirs = np.empty(1, dtype=np.int32)

    def step() -> Any:
        while True:
            message = world.improbe(source=MPI.ANY_SOURCE, tag=DEPARTURE_TAG)
            if message is None:
                break
            message.Recv(theirs)
            heard.add(int(theirs[0]))
        return DONE if MPI.Request.Testall(sends) and len(heard) == size - 1 else IDLE

    poll(step, time.perf_counter() + wait_s, nap_s=config.runtime_params().idle_nap_s)
