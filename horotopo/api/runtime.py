"""The background runtime behind the Horovod-compatible API.

One daemon thread per process does *all* MPI work: set-up (communicator duplication, host
discovery, planning), negotiation and the collectives themselves. User calls only enqueue a
request and return a handle, so the ops are asynchronous and MPI needs no more than
``MPI_THREAD_SERIALIZED`` (mpi4py asks for ``MPI_THREAD_MULTIPLE`` by default, which is also
what a user needs who makes MPI calls of their own while horotopo runs).

Every cycle (``HOROVOD_CYCLE_TIME`` ms, default 1):

1. Pending requests are classified against the *response cache*. A request whose name and
   parameters match a cached response sets that response's bit. All ranks then run one tiny
   bitwise-AND allreduce over ``[flags | hit bits | valid bits]``; a bit that survives the AND is
   ready everywhere and runs without asking anybody. In steady state (the same gradients every
   step) this allreduce is the only control traffic. Flags and the "valid" bits are stored
   inverted so that the AND computes an OR: "some rank wants to shut down", "some rank has
   uncached requests", "some rank saw a cached name with different parameters".
2. If any rank has uncached requests, they are negotiated *by name* through rank 0 (a gather of
   request metadata and a broadcast of responses), so ranks may submit in any order. Rank 0
   checks that every rank asked for the same thing and answers with Horovod's mismatch message
   otherwise; the error reaches every rank as ``HorovodInternalError`` and the job carries on.
   New responses enter the cache in the same order on every rank, so the caches (and their bit
   positions) stay identical without further messages.
3. Ready allreduces of equal dtype, op and scale factors are packed into one fusion buffer of
   at most ``HOROVOD_FUSION_THRESHOLD`` bytes (default 128 MiB) and reduced with one call to
   the engine (one tree allreduce per buffer); broadcasts from the same root are fused the same
   way.

This module is the *controller*, like Horovod's MPI controller: its control messages travel on
its own ``Dup`` of the communicator. Tensor data only ever goes through the engine, an
:class:`horotopo.adapt.AdaptiveEngine`: it runs every collective under the dead-peer watchdog
(``HOROTOPO_TIMEOUT_S``), watches its own transfers and re-plans when they stay slower than the
plan (``HOROTOPO_ADAPT``). Re-plans happen between two engine calls, and every rank makes the
same engine calls in the same order (the responses are), so every rank switches at the same
call. ``retune()`` is a negotiated op like ``barrier()``: it runs on the background thread at
the same point of every rank's response stream. The control waits of each cycle run under a
watchdog of their own, so a rank whose background thread stops cycling (killed, stopped, stuck)
ends the job within the timeout instead of hanging it.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math
import socket
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .. import config
from .. import timeline as _timeline
from ..buffers import array_module, device_scope, synchronize
from .errors import DUPLICATE_NAME, SHUT_DOWN, HorovodInternalError
from .ops import OP_NAMES, Average, horovod_dtype_name, shape_string

__all__ = ["Runtime", "Handle", "ALLREDUCE", "ALLGATHER", "BROADCAST", "BARRIER", "RETUNE",
           "env_settings", "dtype_name", "SUPPORTED_DTYPES"]

log = logging.getLogger("horotopo")

ALLREDUCE = "ALLREDUCE"
RETUNE = "RETUNE"
ALLGATHER = "ALLGATHER"
BROADCAST = "BROADCAST"
BARRIER = "BARRIER"

# Dtypes the engine reduces natively; narrower integers and bool are widened to int64 for the
# reduction and narrowed back (sum and product wrap exactly as native arithmetic would).
# bfloat16 arrays are ml_dtypes' (host) or CuPy's (device) and need ml-dtypes to exist at all.
_NATIVE = {"float16", "bfloat16", "float32", "float64", "int32", "int64"}
_WIDENED = {"int8", "uint8", "int16", "uint16", "bool"}
SUPPORTED_DTYPES = _NATIVE | _WIDENED

_DTYPE_NAMES: Dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, memoized: NumPy computes the name in Python on every access, which
    costs more than the rest of an enqueue."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


RETUNE_MODES = ("quick", "full")  # retune()'s mode travels as an index in the request
_FLAG_RUNNING = 1      # cleared by a rank that wants to shut down
_FLAG_ALL_CACHED = 2   # cleared by a rank that has requests to negotiate


def env_settings(env: Optional[Mapping[str, str]] = None) -> Dict[str, float]:
    """The Horovod environment knobs this runtime honours (read through horotopo.config)."""
    def get(name: str) -> Any:
        return config.get(name, env=env)

    return {
        "cycle_time_s": get("HOROVOD_CYCLE_TIME") / 1000.0,
        "fusion_threshold": get("HOROVOD_FUSION_THRESHOLD"),
        "cache_capacity": get("HOROVOD_CACHE_CAPACITY"),
        "stall_check_s": get("HOROVOD_STALL_CHECK_TIME_SECONDS"),
        "stall_check": 0.0 if get("HOROVOD_STALL_CHECK_DISABLE") else 1.0,
        "stall_shutdown_s": get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"),
        "shutdown_timeout_s": get("HOROTOPO_SHUTDOWN_TIMEOUT"),
    }


_LOG_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
               "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}


def apply_log_level(level: Optional[str]) -> None:
    """Set the ``horotopo`` logger to ``level`` (HOROVOD_LOG_LEVEL; None leaves it alone).

    Without any handler configured (neither on this logger nor on the root), Python prints only
    warnings and worse; a level asked for explicitly must show its messages, so a stderr handler
    is added then (once).
    """
    if level is None:
        return
    log.setLevel(_LOG_LEVELS[level])
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
        log.addHandler(handler)


class Handle:
    """Completion state of one enqueued call (one or several tensors)."""

    __slots__ = ("id", "results", "error", "done", "_left")

    def __init__(self, hid: int, count: int) -> None:
        self.id = hid
        self.results: List[Any] = [None] * count
        self.error: Optional[str] = None
        # A plain flag plus the runtime's shared condition: a threading.Event per handle costs
        # more than the rest of an enqueue.
        self.done = count == 0
        self._left = count

    def _resolve(self, index: int, value: Any = None, error: Optional[str] = None) -> None:
        # Only the background thread resolves; Runtime._finish then notifies the waiters.
        if error is not None and self.error is None:
            self.error = error
        self.results[index] = value
        self._left -= 1
        if self._left == 0:
            self.done = True


class _Entry:
    """One tensor of a request, as this rank holds it while it waits."""

    __slots__ = ("name", "sig", "array", "output", "handle", "index", "t0", "sent", "ready")

    def __init__(self, name: str, sig: tuple, array: Optional[np.ndarray],
                 output: Optional[np.ndarray], handle: Handle, index: int,
                 ready: Optional[Callable[[], None]] = None) -> None:
        self.name = name
        self.ready = ready      # waits for the caller's device stream to finish the input
        self.sig = sig          # (kind, dtype, shape, op, prescale, postscale, root, device)
        self.array = array
        self.output = output
        self.handle = handle
        self.index = index
        self.t0 = time.monotonic()
        self.sent = False       # metadata already sent to the coordinator


class _ResponseCache:
    """Name -> (bit, signature), LRU-ordered, identical on every rank.

    Every mutation is driven by data that all ranks share (the AND result and rank 0's
    responses, applied in the same order), so bit assignments agree everywhere.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._by_name: "OrderedDict[str, Tuple[int, tuple]]" = OrderedDict()
        self._by_bit: Dict[int, str] = {}
        self._free = list(range(self.capacity))

    def get(self, name: str) -> Optional[Tuple[int, tuple]]:
        return self._by_name.get(name)

    def entry_at(self, bit: int) -> Tuple[str, tuple]:
        name = self._by_bit[bit]
        return name, self._by_name[name][1]

    def touch(self, name: str) -> None:
        if name in self._by_name:
            self._by_name.move_to_end(name)

    def put(self, name: str, sig: tuple) -> None:
        if self.capacity == 0:
            return
        if name in self._by_name:
            bit = self._by_name[name][0]
            self._by_name[name] = (bit, sig)
            self._by_name.move_to_end(name)
            return
        if not self._free:
            old, (old_bit, _) = self._by_name.popitem(last=False)
            del self._by_bit[old_bit]
            heapq.heappush(self._free, old_bit)
        bit = heapq.heappop(self._free)
        self._by_name[name] = (bit, sig)
        self._by_bit[bit] = name

    def erase_bit(self, bit: int) -> None:
        name = self._by_bit.pop(bit, None)
        if name is not None:
            del self._by_name[name]
            heapq.heappush(self._free, bit)

    def __len__(self) -> int:
        return len(self._by_name)


def _bits_of(words: np.ndarray) -> List[int]:
    """Indices of the set bits of a uint64 word vector, ascending."""
    out: List[int] = []
    for w, word in enumerate(words.tolist()):
        while word:
            low = word & -word
            out.append(w * 64 + low.bit_length() - 1)
            word ^= low
    return out


def _nbytes(sig: tuple) -> int:
    # Not np.dtype(name): "bfloat16" is a NumPy dtype name only once ml_dtypes is imported.
    itemsize = 2 if sig[1] == "bfloat16" else np.dtype(sig[1]).itemsize
    return int(np.prod(sig[2], dtype=np.int64)) * itemsize


class Runtime:
    """The per-process runtime: a background thread, a request queue and a handle table."""

    def __init__(self, comm: Any = None, **settings: float) -> None:
        cfg = env_settings()
        cfg.update(settings)
        self.cycle_time_s = max(0.0, float(cfg["cycle_time_s"]))
        self.fusion_threshold = max(0, int(cfg["fusion_threshold"]))
        self.stall_check_s = float(cfg["stall_check_s"])
        self.stall_check = bool(cfg["stall_check"]) and self.stall_check_s > 0
        # Horovod's stall shutdown: 0 never; else rank 0 ends the job when a tensor has waited
        # this long for the other ranks (it runs with the stall check, as in Horovod).
        self.stall_shutdown_s = float(cfg["stall_shutdown_s"])
        self._stall_reason: Optional[str] = None
        self.shutdown_timeout_s = float(cfg["shutdown_timeout_s"])
        apply_log_level(config.get("HOROVOD_LOG_LEVEL"))
        # A cached request that waits this long is re-routed through rank 0 so that its
        # stall can be reported with the names of the missing ranks.
        self._reroute_s = min(5.0, self.stall_check_s / 2) if self.stall_check else math.inf
        self._cache = _ResponseCache(int(cfg["cache_capacity"]))
        self._words = max(1, (self._cache.capacity + 63) // 64)
        self._user_comm = comm

        self._lock = threading.Lock()
        self._done_cv = threading.Condition(threading.Lock())
        self._incoming: List[_Entry] = []
        self._names: set = set()            # names pending on this rank (duplicate check)
        self._handles: Dict[int, Handle] = {}
        self._ids = itertools.count()
        self._stop_requested = False
        self._dead: Optional[str] = None    # reason, once the loop has ended
        self._ready = threading.Event()
        self._init_error: Optional[BaseException] = None
        self._pending: "OrderedDict[str, _Entry]" = OrderedDict()
        self._table: "OrderedDict[str, Dict[str, Any]]" = OrderedDict()  # rank 0 only
        self._last_stall_check = 0.0
        self._fusion: Dict[tuple, Any] = {}  # (module, device, dtype) -> fusion buffer
        # The timeline this cycle writes to (rank 0 while one is started, else None), the
        # time this cycle's responses became known, and (rank 0) when each rank asked for a
        # negotiated name, for the per-rank ticks.
        self._tl: Optional[_timeline.Timeline] = None
        self._t_resp = 0.0
        self._ready_times: Dict[str, Dict[int, float]] = {}
        self._engine: Any = None
        self._ctrl: Any = None
        self._ctrl_dog: Any = None
        self._liveness: Any = None
        self.setup: Any = None          # horotopo.bootstrap.Setup
        self._events_seen = 0
        self.rank = self.size = -1
        self.local_rank = self.local_size = self.cross_rank = self.cross_size = -1
        self.hosts: Tuple[str, ...] = ()
        self.plan: Any = None
        self.thread_level = -1
        self.stats = {"cycles": 0, "negotiations": 0, "cache_hits": 0, "engine_allreduces": 0,
                      "fused_tensors": 0}
        self._thread = threading.Thread(target=self._main, name="horotopo-background",
                                        daemon=True)

    # ------------------------------------------------------------------ user-thread side

    def start(self) -> None:
        """Start the background thread and wait until set-up finished on it."""
        self._thread.start()
        while not self._ready.wait(0.1):
            if not self._thread.is_alive():
                break
        if self._init_error is not None:
            raise self._init_error
        if not self._ready.is_set():
            raise RuntimeError("horotopo background thread died during init")

    @property
    def alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    def enqueue(self, kind: str, items: Sequence[Tuple[str, Optional[np.ndarray],
                                                       Optional[np.ndarray]]],
                op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
                root: int = 0, device: int = -1,
                ready: Optional[Callable[[], None]] = None) -> int:
        """Queue ``items`` (name, input, output) as one call; return its handle id.

        Inputs and outputs are NumPy arrays, or CuPy arrays on ``device`` (>= 0), which the
        engine then reduces on the device. ``ready`` (from :func:`horotopo.gpu.record_ready`)
        blocks until the caller's stream has finished writing the inputs; the background
        thread calls it before the data moves.

        Raises
        ------
        ValueError
            A name is already pending on this rank (Horovod's duplicate-name error).
        HorovodInternalError
            The runtime has shut down.
        """
        with self._lock:
            if self._dead is not None or self._stop_requested:
                raise HorovodInternalError(SHUT_DOWN)
            names = [name for name, _, _ in items]
            if len(set(names)) != len(names) or any(n in self._names for n in names):
                raise ValueError(DUPLICATE_NAME)
            if kind == BROADCAST and self.size > 0 and not 0 <= int(root) < self.size:
                raise ValueError(f"root_rank {root} is out of range: there are {self.size} "
                                 f"ranks")
            hid = next(self._ids)
            handle = Handle(hid, len(items))
            for index, (name, array, output) in enumerate(items):
                if array is not None:
                    sig = (kind, dtype_name(array.dtype), tuple(map(int, array.shape)), int(op),
                           float(prescale), float(postscale), int(root), int(device))
                else:
                    # root carries a data-less op's one parameter (retune's probe mode)
                    sig = (kind, "uint8", (), int(op), 1.0, 1.0, int(root), int(device))
                self._incoming.append(_Entry(name, sig, array, output, handle, index, ready))
                self._names.add(name)
            self._handles[hid] = handle
        return hid

    def next_id(self) -> int:
        """A fresh id from the handle counter (Horovod names unnamed ops after it)."""
        with self._lock:
            return next(self._ids)

    def poll(self, hid: int) -> bool:
        handle = self._handles.get(hid)
        return True if handle is None else handle.done

    def wait(self, hid: int) -> List[Any]:
        """Block until ``hid`` completes; return its results and forget the handle."""
        handle = self._handles.get(hid)
        if handle is None:
            raise ValueError(f"unknown or already synchronized handle {hid!r}")
        if not handle.done:
            with self._done_cv:
                while not handle.done:
                    self._done_cv.wait(0.2)
                    if not handle.done and not self._thread.is_alive():
                        self._handles.pop(hid, None)
                        raise HorovodInternalError(self._dead or SHUT_DOWN)
        self._handles.pop(hid, None)
        if handle.error is not None:
            raise HorovodInternalError(handle.error)
        return handle.results

    def stop(self) -> bool:
        """Ask every rank to stop (Horovod's shutdown); return True if the thread joined."""
        with self._lock:
            self._stop_requested = True
        if not self._thread.is_alive():
            return True
        self._thread.join(self.shutdown_timeout_s)
        if self._thread.is_alive():
            log.warning("horotopo: the background thread did not stop within %.0f s (a peer "
                        "rank may have exited without shutdown); continuing without it",
                        self.shutdown_timeout_s)
            return False
        return True

    # ------------------------------------------------------------------ background thread

    def _main(self) -> None:
        try:
            self._setup()
        except BaseException as exc:  # reported to init() on the user thread
            self._init_error = exc
            self._dead = f"init failed: {exc}"
            self._ready.set()
            return
        self._ready.set()
        reason = SHUT_DOWN
        try:
            self._loop()
        except BaseException as exc:
            log.error("horotopo background thread failed: %s: %s", type(exc).__name__, exc)
            reason = f"{SHUT_DOWN} (background thread failed: {type(exc).__name__}: {exc})"
        finally:
            self._teardown(self._stall_reason or reason)

    def _setup(self) -> None:
        from mpi4py import MPI

        self.thread_level = MPI.Query_thread()
        if self.thread_level < MPI.THREAD_SERIALIZED:
            raise RuntimeError("horotopo needs MPI initialized with at least "
                               "MPI_THREAD_SERIALIZED (a background thread makes every MPI "
                               "call); set mpi4py.rc.thread_level = 'multiple' before importing "
                               "mpi4py.MPI")
        base = self._user_comm
        if base is None:
            base = MPI.COMM_WORLD
            _wait_for_ranks(base, None)
        elif isinstance(base, (list, tuple, range)):
            ranks = [int(r) for r in base]
            world = MPI.COMM_WORLD
            if world.Get_rank() not in ranks:
                raise ValueError(f"init(comm={ranks}): this process (world rank "
                                 f"{world.Get_rank()}) is not in the list")
            _wait_for_ranks(world, ranks)
            group = world.Get_group().Incl(ranks)
            base = world.Create_group(group)
            group.Free()
        elif not isinstance(base, MPI.Comm):
            raise TypeError(f"init(comm=...) takes an mpi4py communicator or a list of ranks, "
                            f"got {type(base).__name__}")
        else:
            _wait_for_ranks(base, None)
        self._ctrl = base.Dup()
        self.rank, self.size = self._ctrl.Get_rank(), self._ctrl.Get_size()
        self.hosts = tuple(self._ctrl.allgather(socket.gethostname()))
        mine = self.hosts[self.rank]
        same = [r for r in range(self.size) if self.hosts[r] == mine]
        self.local_rank, self.local_size = same.index(self.rank), len(same)
        peers = [r for r in range(self.size)
                 if [q for q in range(self.size) if self.hosts[q] == self.hosts[r]].index(r)
                 == self.local_rank]
        self.cross_rank, self.cross_size = peers.index(self.rank), len(peers)
        from horotopo.reliability import Watchdog, timeout_from_env

        timeout = timeout_from_env()
        self.setup = _make_setup(base)
        self.plan = self.setup.plan
        adapt = config.get("HOROTOPO_ADAPT")
        if adapt is None:
            # A made-up model (HOROTOPO_PROBE=off) is not one to refresh by re-probing links.
            adapt = self.setup.source != "uniform"
        self._engine = _make_engine(base, self.setup, adapt=adapt, timeout_s=timeout)
        self._liveness = _liveness(base, self.thread_level)
        self._ctrl_dog = Watchdog(timeout, describe=self._describe_control_wait)

    def _describe_control_wait(self) -> str:
        what = ("the runtime's control exchange with every rank (some rank's background "
                "thread stopped cycling)")
        if self._liveness is None:
            return what + "; no liveness ping (MPI is not MPI_THREAD_MULTIPLE)"
        return f"{what}; {self._liveness.describe()}"

    def _loop(self) -> None:
        from mpi4py import MPI

        words = self._words
        nbytes = 8 * words
        everything = (1 << (64 * words)) - 1
        vec = np.empty(1 + 2 * words, dtype=np.uint64)
        out = np.empty_like(vec)
        while True:
            t_start = time.monotonic()
            with self._lock:
                incoming, self._incoming = self._incoming, []
                stopping = self._stop_requested
            for entry in incoming:
                self._pending[entry.name] = entry
            tl = self._tl = _timeline.active()
            if tl is not None and tl.mark_cycles and self._pending:
                # Horovod marks every cycle; idle ones would bury the ops, so only cycles
                # with work are marked.
                tl.marker(_timeline.CYCLE_START, t_start)

            # Bits are gathered in Python ints (numpy scalar ops cost ~1 us each).
            hits = invalid = 0
            to_send: List[_Entry] = []
            for entry in self._pending.values():
                if entry.sent:
                    continue
                cached = self._cache.get(entry.name)
                if cached is None:
                    to_send.append(entry)
                    continue
                bit, sig = cached
                if sig == entry.sig and t_start - entry.t0 < self._reroute_s:
                    hits |= 1 << bit
                else:
                    # Different parameters (or a stall): drop the entry everywhere and let
                    # rank 0 look at this request.
                    invalid |= 1 << bit
                    to_send.append(entry)
            flags = _FLAG_RUNNING | _FLAG_ALL_CACHED
            if stopping:
                flags &= ~_FLAG_RUNNING
            if to_send:
                flags &= ~_FLAG_ALL_CACHED
            vec[0] = flags
            vec[1:1 + words] = np.frombuffer(hits.to_bytes(nbytes, "little"), dtype="<u8")
            vec[1 + words:] = np.frombuffer((everything & ~invalid).to_bytes(nbytes, "little"),
                                            dtype="<u8")

            with self._ctrl_dog.guard(f"cycle {self.stats['cycles']}"):
                self._wait(self._ctrl.Iallreduce(vec, out, op=MPI.BAND))
            self.stats["cycles"] += 1
            flags = int(out[0])
            if not flags & _FLAG_RUNNING:
                return

            for bit in _bits_of(~out[1 + words:]):
                if bit < self._cache.capacity:
                    self._cache.erase_bit(bit)
            responses: List[tuple] = []
            for bit in _bits_of(out[1:1 + words]):
                name, sig = self._cache.entry_at(bit)
                self._cache.touch(name)
                responses.append((sig[0], name, None, sig, None))
            self.stats["cache_hits"] += len(responses)

            if not flags & _FLAG_ALL_CACHED:
                with self._ctrl_dog.guard(f"negotiation in cycle {self.stats['cycles']}"):
                    negotiated = self._negotiate(to_send)
                self.stats["negotiations"] += 1
                for resp in negotiated:
                    if resp[2] is None and resp[0] in (ALLREDUCE, BROADCAST):
                        self._cache.put(resp[1], resp[3])
                responses.extend(negotiated)
            if self.rank == 0 and self.stall_check:
                self._check_stalls()
            if tl is not None and responses:
                self._trace_negotiations(tl, responses)
            if responses:
                self._execute(responses)
            if tl is not None:
                tl.flush()

            rest = self.cycle_time_s - (time.monotonic() - t_start)
            if rest > 0:
                time.sleep(rest)

    @staticmethod
    def _wait(req: Any) -> None:
        # Poll instead of blocking: MPICH spins inside blocking calls, and on an oversubscribed
        # host that spin starves the very rank everybody is waiting for.
        spins = 0
        while not req.Test():
            spins += 1
            if spins > 50:
                time.sleep(min(1e-3, 2e-5 * (spins - 50)))

    def _negotiate(self, to_send: List[_Entry]) -> List[tuple]:
        now = time.monotonic()
        msgs = [(e.name, e.sig, now - e.t0) for e in to_send]
        for e in to_send:
            e.sent = True
        gathered = self._ctrl.gather(msgs, root=0)
        responses = None
        if self.rank == 0:
            now = time.monotonic()
            for r, lst in enumerate(gathered):
                for name, sig, age in lst:
                    slot = self._table.get(name)
                    if slot is None:
                        slot = self._table[name] = {"reqs": {}, "t0": now - age, "warned": 0.0,
                                                    "ready": {}}
                    slot["reqs"][r] = sig
                    slot["ready"][r] = now - age
                    slot["t0"] = min(slot["t0"], now - age)
            ready = [n for n, slot in self._table.items() if len(slot["reqs"]) == self.size]
            slots = [(n, self._table.pop(n)) for n in ready]
            if self._tl is not None:
                self._ready_times.update((n, slot["ready"]) for n, slot in slots)
            responses = [self._construct(n, slot["reqs"]) for n, slot in slots]
        return self._ctrl.bcast(responses, root=0)

    def _construct(self, name: str, reqs: Dict[int, tuple]) -> tuple:
        """Rank 0: one response for ``name`` from every rank's request, or Horovod's error."""
        sigs = [reqs[r] for r in sorted(reqs)]
        first = sigs[0]
        kind = first[0]
        error = None
        for check in _CHECKS:
            error = check(kind, sigs)
            if error is not None:
                break
        extra = [s[2][0] for s in sigs] if error is None and kind == ALLGATHER else None
        return (kind, name, error, first, extra)

    def _check_stalls(self) -> None:
        now = time.monotonic()
        if now - self._last_stall_check < min(1.0, self.stall_check_s):
            return
        self._last_stall_check = now
        missing: Dict[int, List[str]] = {}
        for name, slot in self._table.items():
            if now - slot["t0"] > self.stall_check_s and now - slot["warned"] > self.stall_check_s:
                slot["warned"] = now
                for r in range(self.size):
                    if r not in slot["reqs"]:
                        missing.setdefault(r, []).append(name)
        if missing:
            lines = [f"{r}: [{', '.join(sorted(names))}]" for r, names in sorted(missing.items())]
            log.warning("One or more tensors were submitted to be reduced, gathered or "
                        "broadcasted by subset of ranks and are waiting for remainder of ranks "
                        "for more than %g seconds. This may indicate that different ranks are "
                        "trying to submit different tensors or that only subset of ranks is "
                        "submitting tensors, which will cause deadlock. \nMissing ranks:\n%s",
                        self.stall_check_s, "\n".join(lines))
        if self.stall_shutdown_s > 0 and self._stall_reason is None:
            late = {name: sorted(set(range(self.size)) - set(slot["reqs"]))
                    for name, slot in self._table.items()
                    if now - slot["t0"] > self.stall_shutdown_s}
            if late:
                what = "; ".join(f"{name} (missing ranks {', '.join(map(str, ranks))})"
                                 for name, ranks in sorted(late.items()))
                self._stall_reason = (f"{SHUT_DOWN} (stalled for more than "
                                      f"{self.stall_shutdown_s:g} s, "
                                      f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: {what})")
                log.error("horotopo: %s", self._stall_reason)
                # Clearing the running flag in the next cycle stops every rank's loop.
                with self._lock:
                    self._stop_requested = True

    # ------------------------------------------------------------------ execution

    def _take(self, name: str) -> _Entry:
        entry = self._pending.pop(name)
        return entry

    def _finish(self, entries: List[_Entry], values: Optional[List[Any]] = None,
                error: Optional[str] = None) -> None:
        if self._tl is not None:
            self._trace_end(self._tl, entries, error)
        with self._lock:
            for e in entries:
                self._names.discard(e.name)
        for k, e in enumerate(entries):
            e.handle._resolve(e.index, None if values is None else values[k], error)
        with self._done_cv:
            self._done_cv.notify_all()

    def _execute(self, responses: List[tuple]) -> None:
        """Run responses in their (rank-identical) order, fusing what can be fused."""
        buckets: "OrderedDict[tuple, List[List[tuple]]]" = OrderedDict()
        order: List[Any] = []
        for resp in responses:
            kind, _, error, sig, _ = resp
            if error is None and kind in (ALLREDUCE, BROADCAST):
                # Host and device tensors never share a fusion buffer (sig[7]: the device, -1
                # on the host; every rank agrees on the host/device side of each name).
                key = (kind, sig[1], sig[3], sig[4], sig[5], sig[7] < 0) if kind == ALLREDUCE \
                    else (kind, sig[6], sig[7] < 0)
                groups = buckets.get(key)
                size = _nbytes(sig)
                if groups is None or groups[-1][1] + size > self.fusion_threshold:
                    group = [[], 0]
                    if groups is None:
                        groups = buckets[key] = []
                    groups.append(group)
                    order.append(group)
                group = groups[-1]
                group[0].append(resp)
                group[1] += size
            else:
                order.append(resp)
        for item in order:
            if isinstance(item, list):
                resps = item[0]
                entries = [self._take(r[1]) for r in resps]
                if self._tl is not None:
                    self._trace_begin(self._tl, resps[0][0], entries)
                try:
                    with _OnDevice(entries):
                        if resps[0][0] == ALLREDUCE:
                            values = self._allreduce(entries, resps[0][3])
                        else:
                            values = self._broadcast(entries, resps[0][3][6])
                except Exception as exc:
                    self._finish(entries, error=f"{type(exc).__name__}: {exc}")
                else:
                    self._finish(entries, values)
                continue
            kind, name, error, sig, extra = item
            entry = self._take(name)
            if self._tl is not None:
                self._trace_begin(self._tl, kind, [entry])
            if error is not None:
                self._finish([entry], error=error)
            elif kind == BARRIER:
                self._finish([entry], [None])
            elif kind == RETUNE:
                try:
                    event = self._engine.retune(RETUNE_MODES[sig[6]])
                except Exception as exc:
                    self._finish([entry], error=f"{type(exc).__name__}: {exc}")
                else:
                    self._note_replans()
                    self._finish([entry], [event])
            elif kind == ALLGATHER:
                try:
                    with _OnDevice([entry]):
                        value = self._allgather(entry, extra)
                except Exception as exc:
                    self._finish([entry], error=f"{type(exc).__name__}: {exc}")
                else:
                    self._finish([entry], [value])

    def _buffer(self, dtype: np.dtype, count: int, like: Any) -> Any:
        """A fusion buffer of ``count`` elements beside ``like`` (host, or ``like``'s device)."""
        xp = array_module(like)
        key = (xp.__name__, int(like.device.id) if xp is not np else -1, dtype.str)
        buf = self._fusion.get(key)
        if buf is None or buf.size < count:
            buf = xp.empty(max(count, 1024), dtype=dtype)
            self._fusion[key] = buf
        return buf[:count]

    def _allreduce(self, entries: List[_Entry], sig: tuple) -> List[np.ndarray]:
        dtype = entries[0].array.dtype  # not np.dtype(sig[1]): see _nbytes
        op = sig[3]
        prescale, postscale = sig[4], sig[5]
        if op == Average:
            postscale = postscale / self.size
        work = dtype if dtype.name in _NATIVE else np.dtype(np.int64)
        self.stats["engine_allreduces"] += 1
        self.stats["fused_tensors"] += len(entries)
        if len(entries) == 1 and work == dtype:
            e = entries[0]
            self._engine.allreduce(e.array, e.output, op=OP_NAMES[op],
                                   prescale_factor=prescale, postscale_factor=postscale)
            self._note_replans()
            return [e.output]
        buf = self._buffer(work, sum(e.array.size for e in entries), entries[0].array)
        self._fuse(buf, [e.array for e in entries], entries, into_buffer=True)
        self._engine.allreduce(buf, buf, op=OP_NAMES[op], prescale_factor=prescale,
                               postscale_factor=postscale)
        self._fuse(buf, [e.output for e in entries], entries, into_buffer=False)
        self._note_replans()
        return [e.output for e in entries]

    def _fuse(self, buf: Any, arrays: List[Any], entries: List[_Entry],
              into_buffer: bool) -> None:
        """:func:`_pack`, shown on the timeline as Horovod's MEMCPY_IN/OUT_FUSION_BUFFER."""
        tl = self._tl
        if tl is None:
            _pack(buf, arrays, into_buffer)
            return
        names = [e.name for e in entries]
        tl.begin(names, "MEMCPY_IN_FUSION_BUFFER" if into_buffer
                 else "MEMCPY_OUT_FUSION_BUFFER")
        _pack(buf, arrays, into_buffer)
        tl.end(names)

    # ------------------------------------------------------------------ timeline (rank 0)

    def _trace_negotiations(self, tl: _timeline.Timeline, responses: List[tuple]) -> None:
        """Each response's NEGOTIATE_<KIND> span: from the first request for it (this rank's
        enqueue, or an earlier rank's) until now, when every rank knows it is ready; with a
        tick per rank at its request, for names negotiated through rank 0 (a cached name's
        requests never reach rank 0, so it has no ticks)."""
        now = self._t_resp = time.monotonic()
        for kind, name, error, _, _ in responses:
            entry = self._pending.get(name)
            asked = self._ready_times.pop(name, None)
            start = entry.t0 if entry is not None else now
            if asked:
                start = min(start, min(asked.values()))
            args: Dict[str, Any] = {"cached": asked is None}
            if error is not None:
                args["error"] = error
            tl.complete(name, f"NEGOTIATE_{kind}", start, now, args)
            for r, at in sorted((asked or {}).items()):
                tl.complete(name, str(r), at, at)

    def _trace_begin(self, tl: _timeline.Timeline, kind: str, entries: List[_Entry]) -> None:
        """Open the op's span on each tensor's row from the end of its negotiation, show the
        wait behind earlier ops of this cycle as QUEUE, and point the engine's spans (the
        algorithm, the trees' phases) at these rows."""
        names = [e.name for e in entries]
        tl.begin(names, kind, ts=self._t_resp,
                 args={"fused_tensors": len(names)} if len(names) > 1 else None)
        tl.complete(names, "QUEUE", self._t_resp, time.monotonic())
        tl.set_rows(names)

    def _trace_end(self, tl: _timeline.Timeline, entries: List[_Entry],
                   error: Optional[str]) -> None:
        for e in entries:
            args: Dict[str, Any] = {"dtype": e.sig[1], "shape": list(e.sig[2])}
            if error is not None:
                args["error"] = error
            tl.end(e.name, args=args)
        tl.set_rows(None)

    def _note_replans(self) -> None:
        """Take up the plan the adaptive engine switched to, and say so on rank 0."""
        events = getattr(self._engine, "events", ())
        for event in events[self._events_seen:]:
            if self.rank == 0:
                log.warning("horotopo: re-planned at engine call %d (%s): plan %s -> %s, "
                            "modelled %.1f -> %.1f MB/s, %.2f s%s", event.step, event.reason,
                            event.old_digest[:8], event.new_digest[:8],
                            event.old_model_Bps / 1e6, event.new_model_Bps / 1e6,
                            event.seconds, f" ({event.note})" if event.note else "")
        self._events_seen = len(events)
        self.plan = getattr(self._engine, "plan", self.plan)

    def _broadcast(self, entries: List[_Entry], root: int) -> List[np.ndarray]:
        # Bytes are bytes: broadcasts of any dtypes from one root share a uint8 buffer.
        if self.rank == root:
            for e in entries:
                if e.output is not e.array:
                    array_module(e.output).copyto(e.output, e.array)
        if len(entries) == 1:
            out = entries[0].output
            if out.nbytes:
                self._engine.broadcast(out.reshape(-1).view(np.uint8), root)
            return [out]
        total = sum(e.output.nbytes for e in entries)
        buf = self._buffer(np.dtype(np.uint8), total, entries[0].output)
        views = [e.output.reshape(-1).view(np.uint8) for e in entries]
        if self.rank == root:
            self._fuse(buf, views, entries, into_buffer=True)
        if total:
            self._engine.broadcast(buf, root)
        if self.rank != root:
            self._fuse(buf, views, entries, into_buffer=False)
        return [e.output for e in entries]

    def _allgather(self, entry: _Entry, firsts: List[int]) -> np.ndarray:
        arr = entry.array
        rest = arr.shape[1:]
        xp = array_module(arr)
        out = xp.empty((sum(firsts),) + rest, dtype=arr.dtype)
        row = int(np.prod(rest, dtype=np.int64)) * arr.dtype.itemsize
        offset = 0
        for r, count in enumerate(firsts):
            part = out[offset:offset + count]
            if r == self.rank:
                xp.copyto(part, arr)
            if count and row:
                self._engine.broadcast(part.reshape(-1).view(np.uint8), r)
            offset += count
        return out

    def _teardown(self, reason: str) -> None:
        with self._lock:
            self._dead = reason
            leftovers = list(self._pending.values()) + self._incoming
            self._incoming = []
        self._pending.clear()
        self._finish(leftovers, error=reason)
        if self.rank == 0:
            # No op can follow: close the timeline, so that its file ends as complete JSON
            # whether or not the program calls shutdown() (Horovod closes it there too).
            _timeline.stop()
        self._tl = None
        for closer in (getattr(self._engine, "close", None),
                       getattr(self._ctrl, "Free", None),
                       getattr(self._ctrl_dog, "close", None),
                       getattr(self._liveness, "close", None)):
            if closer is not None:
                try:
                    closer()
                except Exception as exc:  # best effort: shutdown must never raise or hang
                    log.debug("horotopo teardown: %s", exc)


def _field_check(kinds: Optional[Sequence[str]], field: Any, message: Any) -> Any:
    """A check that every rank's ``field(sig)`` equals rank 0's, for requests of ``kinds``."""
    def check(kind: str, sigs: List[tuple]) -> Optional[str]:
        if kinds is not None and kind not in kinds:
            return None
        mine = field(sigs[0])
        return next((message(kind, mine, field(s)) for s in sigs[1:] if field(s) != mine),
                    None)
    return check


def _device_kind(on_cpu: bool) -> str:
    return "CPU" if on_cpu else "GPU"


# Horovod's checks, in its order, with its messages
_CHECKS: List[Any] = [
    _field_check(None, lambda s: s[1], lambda k, a, b: (
        f"Mismatched data types: One rank had type {horovod_dtype_name(a)}, but another rank "
        f"had type {horovod_dtype_name(b)}.")),
    _field_check(None, lambda s: s[0], lambda k, a, b: (
        f"Mismatched operations: One rank did an {a}, but another rank did an {b}.")),
    _field_check((ALLREDUCE, BROADCAST), lambda s: s[2], lambda k, a, b: (
        f"Mismatched {k} tensor shapes: One rank sent a tensor of shape {shape_string(a)}, "
        f"but another rank sent a tensor of shape {shape_string(b)}.")),
    _field_check((ALLREDUCE,), lambda s: (s[4], s[5]), lambda k, a, b: (
        f"Mismatched prescale and/or postscale factors: One rank sent factors ({a[0]:g}, "
        f"{a[1]:g}), but another rank sent factors ({b[0]:g}, {b[1]:g}).")),
    _field_check((ALLREDUCE,), lambda s: s[3], lambda k, a, b: (
        f"Mismatched reduction operation: One rank sent reduction op {a}, but another rank "
        f"sent reduction op {b}.")),
    lambda k, sigs: _check_gather_shapes(k, sigs) if k == ALLGATHER else None,
    _field_check((BROADCAST,), lambda s: s[6], lambda k, a, b: (
        f"Mismatched {k} root ranks: One rank specified root rank {a}, but another rank "
        f"specified root rank {b}.")),
    _field_check((RETUNE,), lambda s: s[6], lambda k, a, b: (
        f"Mismatched retune modes: One rank asked for {RETUNE_MODES[a]}, but another rank "
        f"asked for {RETUNE_MODES[b]}.")),
    _field_check(None, lambda s: s[7] < 0, lambda k, a, b: (
        f"Mismatched {k} CPU/GPU device selection: One rank specified device "
        f"{_device_kind(a)}, but another rank specified device {_device_kind(b)}.")),
]


def _pack(buf: Any, arrays: List[Any], into_buffer: bool) -> None:
    """Copy ``arrays`` back to back into ``buf`` (or out of it), casting where dtypes differ.
    ``buf`` and ``arrays`` are all NumPy or all CuPy arrays (on one device)."""
    copyto = array_module(buf).copyto
    offset = 0
    for arr in arrays:
        flat = arr.reshape(-1)
        part = buf[offset:offset + flat.size]
        if into_buffer:
            copyto(part, flat, casting="unsafe")
        else:
            copyto(flat, part, casting="unsafe")
        offset += flat.size


class _OnDevice:
    """Runs a fused group on its tensors' device: waits for the callers' streams first (their
    ``ready`` events), makes the group's device current on this thread, and finishes the
    device work before the handles resolve, so a caller sees complete results.

    A no-op for host tensors. Every tensor of a group must be on one device: a process drives
    one GPU, as with Horovod."""

    def __init__(self, entries: List[_Entry]) -> None:
        self.entries = entries
        first = entries[0]
        self.like = first.array if first.array is not None else first.output
        self.scope: Any = None

    def __enter__(self) -> "_OnDevice":
        if self.entries[0].sig[7] < 0:
            return self
        devices = {e.sig[7] for e in self.entries}
        if len(devices) > 1:
            raise ValueError(f"tensors fused into one collective are on devices "
                             f"{sorted(devices)}: use one GPU per process")
        waited = set()
        for e in self.entries:
            if e.ready is not None and id(e.ready) not in waited:
                waited.add(id(e.ready))
                e.ready()
        self.scope = device_scope(self.like)
        self.scope.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.scope is not None:
            try:
                if exc[0] is None:
                    synchronize(self.like)
            finally:
                self.scope.__exit__(*exc)


def _check_gather_shapes(kind: str, sigs: List[tuple]) -> Optional[str]:
    first = sigs[0][2]
    if len(first) == 0:
        return f"Rank zero tried to {kind} a rank-zero tensor."
    for s in sigs[1:]:
        shape = s[2]
        if len(shape) != len(first):
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of rank "
                    f"{len(first)}, but another rank sent a tensor of rank {len(shape)}.")
        for dim in range(1, len(first)):
            if shape[dim] != first[dim]:
                return (f"Mismatched {kind} tensor shapes: One rank sent a tensor with "
                        f"dimension {dim} equal to {first[dim]}, but another rank sent a tensor "
                        f"with dimension {dim} equal to {shape[dim]}.")
    return None


def _wait_for_ranks(comm: Any, members: Optional[Sequence[int]]) -> None:
    """Wait at most HOROVOD_START_TIMEOUT for every rank to reach init; else name the others.

    This runs before init's first collective (the ``Dup``), which would otherwise wait forever
    for a rank that never calls init.
    """
    from horotopo.bootstrap import BootstrapError
    from horotopo.transport.mpi import missing_ranks

    timeout_s = config.get("HOROVOD_START_TIMEOUT")
    missing = missing_ranks(comm, timeout_s, members)
    if missing:
        raise BootstrapError(f"init: rank(s) {', '.join(map(str, missing))} did not reach "
                             f"init within {timeout_s:g} s (HOROVOD_START_TIMEOUT, "
                             f"horotopo-run --start-timeout)")


def _make_setup(comm: Any) -> Any:
    """Plan and model from the bootstrap: probed links or HOROTOPO_TOPOLOGY, planned on rank 0."""
    from horotopo.bootstrap import setup
    from horotopo.transport import MPITransport

    transport = MPITransport(comm)  # the bootstrap speaks to a transport, not to MPI
    try:
        return setup(transport, log=_say)
    finally:
        transport.close()


def _say(message: str) -> None:
    log.info("%s", message)


def _liveness(comm: Any, thread_level: int) -> Any:
    """A liveness responder where MPI allows one (it pings from the watchdog's thread)."""
    from mpi4py import MPI

    from horotopo.reliability import LivenessResponder

    return LivenessResponder(comm) if thread_level >= MPI.THREAD_MULTIPLE else None


def _make_engine(comm: Any, setup: Any, *, adapt: bool, timeout_s: float) -> Any:
    from horotopo import config
    from horotopo.adapt import AdaptiveEngine
    from horotopo.adapt.runtime import RUNTIME_DEFAULTS

    # The tree-or-MPI choice starts from timings of this job's ranks (a short calibration),
    # not from constants of some other machine; the engine then learns from its own calls.
    return AdaptiveEngine(comm, setup.plan, setup.topology, adapt=adapt, timeout_s=timeout_s,
                          calibrate_s=config.get("HOROTOPO_CALIBRATE_S"), **RUNTIME_DEFAULTS)
