"""The runtime's records: what a rank asks for, what it holds while it waits, what it is told.

Plain typed values shared by the parts of the runtime (:mod:`.controller`, :mod:`.fusion`,
:mod:`.executors`, :mod:`.runtime`). A :class:`Signature` travels between ranks (negotiation,
the response cache) and is compared every cycle, so it is a ``NamedTuple``: immutable, compared
and built at tuple speed (a frozen dataclass costs about 3 us to build, which at a few hundred
tensors a step shows in the step time). The other records live on one rank or cross it once
per negotiation; they are slotted dataclasses, and cross as rows of plain values
(:func:`request_rows`, :func:`response_rows`) that the receiver rebuilds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["ALLREDUCE", "REDUCESCATTER", "ALLGATHER", "ALLTOALL", "GATHERS", "BROADCAST",
           "BARRIER", "RETUNE", "JOIN",
           "JOIN_NAME", "PROCESS_SET",
           "BARRIER_NAME",
           "RETUNE_MODES",
           "NATIVE_DTYPES", "WIDENED_DTYPES", "SUPPORTED_DTYPES", "dtype_name", "Signature",
           "Handle", "Entry", "Request", "Response", "request_rows", "requests_from",
           "response_rows", "responses_from"]

ALLREDUCE = "ALLREDUCE"
# A reduce-scatter runs as an allreduce (then each rank keeps its block), under its own kind so
# that rank 0 answers it as Horovod does where the two differ (join, mismatched operations).
REDUCESCATTER = "REDUCESCATTER"
RETUNE = "RETUNE"
ALLGATHER = "ALLGATHER"
# An alltoall runs as two allgathers (its splits, then its rows), under its own kind so that
# rank 0 answers it as Horovod does where they differ (join, mismatched operations).
ALLTOALL = "ALLTOALL"
#: The kinds that gather rows of every rank (first dimensions may differ).
GATHERS = frozenset({ALLGATHER, ALLTOALL})
BROADCAST = "BROADCAST"
BARRIER = "BARRIER"
JOIN = "JOIN"
#: Registers or removes a process set (:mod:`.process_sets`): a negotiated op of the global
#: set, so that every rank changes its table at the same point of the response stream.
PROCESS_SET = "PROCESS_SET"

#: The name of every rank's join request: one name, so that the join response finds each
#: rank's entry (a rank joins once at a time, which the duplicate-name check enforces).
JOIN_NAME = "horotopo.join"

#: The name of every barrier request, fixed as Horovod's BARRIER_TENSOR_NAME: a counted name
#: ("barrier.noname.<k>") drifts apart between ranks as soon as one rank calls barrier() while
#: the others have joined (the joined ranks take part without calling it), and every later
#: barrier then waits for a name that the other ranks never ask for.
BARRIER_NAME = "barrier.noname"

RETUNE_MODES = ("quick", "full")  # retune()'s mode travels as an index in the request

# Dtypes the engine reduces natively; narrower integers and bool are widened to int64 for the
# reduction and narrowed back (sum and product wrap exactly as native arithmetic would).
# bfloat16 arrays are ml_dtypes' (host) or CuPy's (device) and need ml-dtypes to exist at all.
NATIVE_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int32", "int64"})
WIDENED_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "bool"})
SUPPORTED_DTYPES = NATIVE_DTYPES | WIDENED_DTYPES

_DTYPE_NAMES: Dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, memoized: NumPy computes the name in Python on every access, which
    costs more than the rest of an enqueue."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


class Signature(NamedTuple):
    """What one rank asks for under a name; every rank must ask for the same.

    Attributes
    ----------
    kind : str
        ALLREDUCE, REDUCESCATTER, ALLGATHER, ALLTOALL, BROADCAST, BARRIER, RETUNE, JOIN or
        PROCESS_SET.
    dtype : str
        The input's dtype name ("uint8" for the data-less ops).
    shape : tuple of int
        The input's shape (``()`` for the data-less ops).
    op : int
        Horovod's reduction op (:mod:`.ops`).
    prescale, postscale : float
        Allreduce's scale factors.
    root : int
        Broadcast's root rank, or retune's index in :data:`RETUNE_MODES`.
    device : int
        The CUDA device of the tensors, -1 on the host.
    pset : int
        The process set the op runs over (0: every rank; :mod:`.process_sets`).
    """

    kind: str
    dtype: str
    shape: Tuple[int, ...]
    op: int
    prescale: float
    postscale: float
    root: int
    device: int
    pset: int = 0

    @property
    def on_host(self) -> bool:
        return self.device < 0

    @property
    def nbytes(self) -> int:
        # Not np.dtype(name): "bfloat16" is a NumPy dtype name only once ml_dtypes is imported.
        itemsize = 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize
        return int(np.prod(self.shape, dtype=np.int64)) * itemsize


class Handle:
    """Completion state of one enqueued call (one or several tensors)."""

    __slots__ = ("id", "results", "error", "done", "_left")

    def __init__(self, hid: int, count: int) -> None:
        self.id = hid
        self.results: List[Any] = [None] * count
        self.error: Optional[str] = None
        # A plain flag plus the queue's shared condition: a threading.Event per handle costs
        # more than the rest of an enqueue.
        self.done = count == 0
        self._left = count

    def resolve(self, index: int, value: Any = None, error: Optional[str] = None) -> None:
        """Set result ``index`` (or the call's first error); done after the last one.

        Only the background thread resolves; :meth:`.queue.RequestQueue.finish` then notifies
        the waiters.
        """
        if error is not None and self.error is None:
            self.error = error
        self.results[index] = value
        self._left -= 1
        if self._left == 0:
            self.done = True


@dataclass(slots=True, eq=False)
class Entry:
    """One tensor of a request, as this rank holds it while it waits.

    ``ready`` waits for the caller's device stream to finish writing the input; ``t0`` is when
    it was enqueued; ``sent`` is set once its request went to the coordinator (rank 0).
    ``call`` and ``count`` name the user call the tensor belongs to and how many names that
    call submits in all (``""``: the tensor's own name, alone); see :class:`Request`.
    """

    name: str
    sig: Signature
    array: Optional[Any]
    output: Optional[Any]
    handle: Handle
    index: int
    ready: Optional[Callable[[], None]] = None
    t0: float = field(default_factory=time.monotonic)
    sent: bool = False
    call: str = ""
    count: int = 1


@dataclass(slots=True)
class Request:
    """What a rank tells the coordinator about an uncached name: its signature, and how long
    ago it asked (so rank 0 can time stalls and draw each rank's request on the timeline).

    ``call`` is the name of the user call the tensor is part of and ``count`` how many names
    that call submits (a grouped op, alltoall's two allgathers); ``""`` means the tensor's own
    name, alone. Rank 0 compares what the ranks submitted under one call, so that ranks calling
    different collectives at one place (whose tensor names then differ) fail together with
    Horovod's mismatch error instead of waiting for each other.
    """

    name: str
    sig: Signature
    age_s: float
    call: str = ""
    count: int = 1


@dataclass(slots=True)
class Response:
    """What every rank is told to run, in the same order everywhere.

    Attributes
    ----------
    kind, name, sig
        The op, its name and the agreed signature (rank 0's).
    error : str or None
        Horovod's mismatch message when the ranks asked for different things.
    extra : list of int or None
        Allgather's first dimension on each rank, in rank order; join's last rank to join.
    """

    kind: str
    name: str
    error: Optional[str]
    sig: Signature
    extra: Optional[List[int]] = None


# Negotiation's messages in the control plane's plain encoding (horotopo.transport.wire):
# rows of plain values, rebuilt into records on arrival, so that no peer's bytes are unpickled.

def request_rows(requests: List[Request]) -> List[Tuple[Any, ...]]:
    """``requests`` as rows of plain values (:func:`requests_from`)."""
    return [(r.name, tuple(r.sig), r.age_s, r.call, r.count) for r in requests]


def requests_from(rows: Any) -> List[Request]:
    """The requests of :func:`request_rows`' rows; TypeError or ValueError when malformed."""
    return [Request(str(name), _signature(sig), float(age), str(call), int(count))
            for name, sig, age, call, count in rows]


def response_rows(responses: List[Response]) -> List[Tuple[Any, ...]]:
    """``responses`` as rows of plain values (:func:`responses_from`)."""
    return [(r.kind, r.name, r.error, tuple(r.sig), r.extra) for r in responses]


def responses_from(rows: Any) -> List[Response]:
    """The responses of :func:`response_rows`' rows; TypeError or ValueError when malformed."""
    return [Response(str(kind), str(name), None if error is None else str(error),
                     _signature(sig), None if extra is None else [int(v) for v in extra])
            for kind, name, error, sig, extra in rows]


def _signature(row: Any) -> Signature:
    kind, dtype, shape, op, prescale, postscale, root, device, pset = row
    return Signature(str(kind), str(dtype), tuple(int(d) for d in shape), int(op),
                     float(prescale), float(postscale), int(root), int(device), int(pset))
