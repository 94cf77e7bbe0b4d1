"""Nonblocking MPI helpers with deadlines, shared by the probe and the init wiring.

Every wait here polls a nonblocking request against a deadline, so a dead or unreachable rank is
a :class:`ProbeError` that names what was being waited for, never a hang. Ranks with nothing to
do sleep between polls (MPICH busy-polls inside blocking calls, which on an oversubscribed
machine would steal the CPU from the ranks that are measuring).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np

__all__ = ["ProbeError", "wait_all", "allgather_json", "bcast_json", "allreduce_max",
           "missing_ranks"]

IDLE_SLEEP_S = (5e-5, 1e-3)  # idle polls back off from 50 us to 1 ms

Label = Union[str, Callable[[List[int]], str]]
# The tag of init's arrival messages on the caller's communicator (before horotopo has a
# duplicate of its own): a user receive with MPI.ANY_TAG posted across init could take them.
ARRIVAL_TAG = 0x6874


class ProbeError(RuntimeError):
    """A measurement that cannot be made: an unreachable pair, a timeout, a zero rate."""


def _cancel(requests: Sequence[Any], pending: Sequence[int]) -> None:
    # Receives can be cancelled cleanly; a send to a dead peer cannot, which is why the CLI
    # aborts the job after an error instead of finalizing.
    for k in pending:
        try:
            requests[k].Cancel()
        except Exception:  # noqa: BLE001 - best effort; the error being raised matters more
            pass


def wait_all(requests: Sequence[Any], deadline: float, what: Label, *, busy: bool = False,
             on_done: Optional[Callable[[int], None]] = None) -> None:
    """Wait until every request completes, or raise ProbeError at ``deadline``.

    Parameters
    ----------
    requests : sequence of mpi4py Request
        May grow while waiting (``on_done`` may append to it, e.g. to send an acknowledgement).
    deadline : float
        ``time.perf_counter()`` value after which the wait fails.
    what : str or callable
        Describes the wait in the error; a callable receives the indices still pending.
    busy : bool
        Poll without sleeping (the ranks moving data); idle ranks sleep between polls.
    on_done : callable, optional
        Called with the index of each request as it completes.
    """
    reqs = requests if isinstance(requests, list) else list(requests)
    done: List[bool] = []
    nap = IDLE_SLEEP_S[0]
    while True:
        done.extend([False] * (len(reqs) - len(done)))  # on_done may have appended requests
        progressed = False
        for k in range(len(done)):
            if not done[k] and reqs[k].Test():
                done[k] = True
                progressed = True
                if on_done is not None:
                    on_done(k)
        if len(done) == len(reqs) and all(done):
            return
        if not progressed:
            if time.perf_counter() > deadline:
                pending = [k for k in range(len(done)) if not done[k]]
                _cancel(reqs, pending)
                raise ProbeError(what(pending) if callable(what) else what)
            if busy:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(2 * nap, IDLE_SLEEP_S[1])
        else:
            nap = IDLE_SLEEP_S[0]


def allreduce_max(comm: Any, values: np.ndarray, timeout_s: float, what: str) -> np.ndarray:
    """Element-wise maximum of ``values`` over all ranks (float64), with a deadline."""
    from mpi4py import MPI

    send = np.ascontiguousarray(values, dtype=np.float64)
    out = np.empty_like(send)
    req = comm.Iallreduce(send, out, op=MPI.MAX)
    wait_all([req], time.perf_counter() + timeout_s,
             f"{what}: not every rank arrived within {timeout_s:g} s")
    return out


def allgather_json(comm: Any, obj: Any, timeout_s: float, what: str) -> List[Any]:
    """Every rank's JSON-serializable ``obj``, in rank order, on every rank."""
    from mpi4py import MPI

    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    n = comm.size
    lens = np.zeros(n, dtype=np.int64)
    deadline = time.perf_counter() + timeout_s
    msg = f"{what}: not every rank arrived within {timeout_s:g} s"
    req = comm.Iallgather(np.array([len(data)], dtype=np.int64), lens)
    wait_all([req], deadline, msg)
    displs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    buf = np.empty(max(int(lens.sum()), 1), dtype=np.uint8)
    req = comm.Iallgatherv([data, MPI.BYTE], [buf, (lens, displs), MPI.BYTE])
    wait_all([req], deadline, msg)
    return [json.loads(buf[displs[r]:displs[r] + lens[r]].tobytes()) for r in range(n)]


def bcast_json(comm: Any, obj: Any, root: int, timeout_s: float, what: str) -> Any:
    """Broadcast ``obj`` (JSON-serializable, only read on ``root``) to every rank."""
    from mpi4py import MPI

    deadline = time.perf_counter() + timeout_s
    msg = f"{what}: nothing from rank {root} within {timeout_s:g} s"
    if comm.rank == root:
        data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
        length = np.array([len(data)], dtype=np.int64)
    else:
        length = np.zeros(1, dtype=np.int64)
    wait_all([comm.Ibcast(length, root=root)], deadline, msg)
    if comm.rank != root:
        data = np.empty(int(length[0]), dtype=np.uint8)
    wait_all([comm.Ibcast([data, MPI.BYTE], root=root)], deadline, msg)
    return json.loads(data.tobytes())


def _poll(request: Any, deadline: float) -> bool:
    """Test ``request`` until it completes (True) or ``deadline`` passes (False; left posted)."""
    nap = IDLE_SLEEP_S[0]
    while not request.Test():
        if time.perf_counter() > deadline:
            return False
        time.sleep(nap)
        nap = min(2 * nap, IDLE_SLEEP_S[1])
    return True


def missing_ranks(comm: Any, timeout_s: float,
                  members: Optional[Sequence[int]] = None) -> List[int]:
    """The ranks of ``comm`` that did not call this within ``timeout_s``; ``[]`` when all did.

    The first member gathers an arrival message from every other member, waits until the
    deadline, then sends each arrived member the list of arrivals, so every rank that arrived
    in time returns the same list. A member that sees no answer from the first returns
    ``[first]``: it has not arrived, or it already gave up before this member came. Only
    point-to-point messages on ``comm`` with :data:`ARRIVAL_TAG`, so nothing blocks past the
    deadline (a collective cannot say who is missing). The arrival send of a member that came
    too late stays posted: init fails there anyway.

    Parameters
    ----------
    comm : mpi4py communicator
    timeout_s : float
        How long the first member waits for the others (the others wait up to twice as long,
        since the first may start its wait after them).
    members : sequence of int, optional
        The ranks of ``comm`` that take part (all by default); the others must not call this.
    """
    ranks = list(range(comm.Get_size())) if members is None else [int(r) for r in members]
    first, others = ranks[0], ranks[1:]
    deadline = time.perf_counter() + timeout_s
    if comm.Get_rank() != first:
        token = np.ones(1, dtype=np.int8)
        # Issend completes only once the first member has received it: proof that it is here.
        if not _poll(comm.Issend(token, dest=first, tag=ARRIVAL_TAG), deadline):
            return [first]
        arrived = np.zeros(len(ranks), dtype=np.int8)
        answer = comm.Irecv(arrived, source=first, tag=ARRIVAL_TAG)
        if not _poll(answer, time.perf_counter() + timeout_s):
            _cancel([answer], [0])
            return [first]
        return [r for r, ok in zip(ranks, arrived) if not ok]
    tokens = [np.zeros(1, dtype=np.int8) for _ in others]
    recvs = [comm.Irecv(t, source=r, tag=ARRIVAL_TAG) for t, r in zip(tokens, others)]
    got = [False] * len(others)

    def seen(k: int) -> None:
        got[k] = True

    try:
        wait_all(recvs, deadline, "arrivals", on_done=seen)
    except ProbeError:
        pass  # wait_all cancelled the receives of the ranks that did not come: named below
    arrived = np.array([1] + [int(g) for g in got], dtype=np.int8)
    sends = [comm.Isend(arrived, dest=r, tag=ARRIVAL_TAG) for r, g in zip(others, got) if g]
    # The arrived ranks are waiting for exactly this message, so it completes at once.
    wait_all(sends, time.perf_counter() + timeout_s, "init: telling the ranks who arrived")
    return [r for r, g in zip(others, got) if not g]
