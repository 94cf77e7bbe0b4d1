"""The controller: one control cycle per runtime cycle, through the transport.

Every cycle (``HOROVOD_CYCLE_TIME`` ms, default 1):

1. Pending requests are classified against the *response cache*. A request whose name and
   signature match a cached response sets that response's bit. All ranks then run one tiny
   bitwise-AND allreduce (the transport's ``iallreduce_control``) over
   ``[flags | hit bits | valid bits]``; a bit that survives the AND is ready everywhere and
   runs without asking anybody. In steady state (the same gradients every step) this
   allreduce is the only control traffic. Flags and the "valid" bits are stored inverted so
   that the AND computes an OR: "some rank wants to shut down", "some rank has uncached
   requests", "some rank saw a cached name with different parameters".
2. If any rank has uncached requests, they are negotiated *by name* through rank 0 (the
   transport's gather and broadcast of plain values: :mod:`horotopo.transport.wire`), so
   ranks may submit in any order. Rank 0
   (:class:`Coordinator`) checks that every rank asked for the same thing and answers with
   Horovod's mismatch message otherwise (:mod:`.checks`). New responses enter the cache in the
   same order on every rank, so the caches (and their bit positions) stay identical without
   further messages.
3. Rank 0 inspects stalls: names that only some ranks asked for are reported with the missing
   ranks, and end the job after ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``.

The waits of a cycle run under a watchdog of their own (the runtime's), so a rank whose
background thread stops cycling (killed, stopped, stuck) ends the job within the timeout
instead of hanging it.
"""
from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from .. import timeline
from .. import config
from ..reliability.liveness import faulty
from ..transport.base import TransportTimeout
from .checks import first_mismatch
from .records import (ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, GATHERS, JOIN, JOIN_NAME,
                      REDUCESCATTER, Entry, Request, Response, Signature, request_rows,
                      requests_from, response_rows, responses_from)
from .settings import Settings, log

__all__ = ["ResponseCache", "bits_of", "Coordinator", "Controller", "trace_negotiations"]

_FLAG_RUNNING = 1      # cleared by a rank that wants to shut down
_FLAG_ALL_CACHED = 2   # cleared by a rank that has requests to negotiate
_FLAG_NONE_JOINED = 4  # cleared by a rank that has joined (hvd.join) and waits for the rest

#: The longest reason for stopping that a rank tells the others.
MAX_REASON_BYTES = 512

#: Horovod's errors for the collectives that cannot run while some rank has joined. The others
#: run: an allreduce with zeros from the joined ranks, a barrier (or retune) with the joined
#: ranks' background threads taking part as they take part in every response.
JOIN_ERRORS: Dict[str, str] = {
    ALLGATHER: "Allgather is not supported with Join at this time. Specify sparse_to_dense=True "
               "if using DistributedOptimizer",
    ALLTOALL: "Alltoall is not supported with Join at this time.",
    BROADCAST: "Broadcast is not supported with Join at this time.",
    REDUCESCATTER: "Reducescatter is not supported with Join at this time.",
}



class ResponseCache:
    """Name -> (bit, signature), LRU-ordered, identical on every rank.

    Every mutation is driven by data that all ranks share (the AND result and rank 0's
    responses, applied in the same order), so bit assignments agree everywhere.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._by_name: "OrderedDict[str, Tuple[int, Signature]]" = OrderedDict()
        self._by_bit: Dict[int, str] = {}
        self._free = list(range(self.capacity))

    def get(self, name: str) -> Optional[Tuple[int, Signature]]:
        return self._by_name.get(name)

    def entry_at(self, bit: int) -> Tuple[str, Signature]:
        name = self._by_bit[bit]
        return name, self._by_name[name][1]

    def touch(self, name: str) -> None:
        if name in self._by_name:
            self._by_name.move_to_end(name)

    def put(self, name: str, sig: Signature) -> None:
        if self.capacity == 0:
            return
        if name in self._by_name:
            bit = self._by_name[name][0]
            self._by_name[name] = (bit, sig)
            self._by_name.move_to_end(name)
            return
        if not self._free:
            _, (old_bit, _) = self._by_name.popitem(last=False)
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


def bits_of(words: np.ndarray) -> List[int]:
    """Indices of the set bits of a uint64 word vector, ascending."""
    out: List[int] = []
    for w, word in enumerate(words.tolist()):
        while word:
            low = word & -word
            out.append(w * 64 + low.bit_length() - 1)
            word ^= low
    return out


@dataclass(slots=True)
class _Slot:
    """Rank 0's record of one name under negotiation."""

    t0: float                                      # the earliest request for it
    reqs: Dict[int, Signature] = field(default_factory=dict)
    ready: Dict[int, float] = field(default_factory=dict)  # when each rank asked
    warned: float = 0.0                            # the last stall warning naming it
    calls: Set[Tuple[int, str]] = field(default_factory=set)  # the calls it was asked under


class Coordinator:
    """Rank 0's side of negotiation: which rank asked for what, the responses, the stalls.

    Parameters
    ----------
    size : int
        The number of ranks: a name is ready once this many have asked for it.
    settings : Settings
        The stall check's settings, read at every inspection.
    """

    def __init__(self, size: int, settings: Settings) -> None:
        self.size = size
        self.settings = settings
        self.table: "OrderedDict[str, _Slot]" = OrderedDict()
        # When each rank asked for a negotiated name, kept for the timeline's per-rank ticks.
        self.ready_times: Dict[str, Dict[int, float]] = {}
        # The ranks that have joined, in the order they did (Horovod's join returns the last).
        self.joined: List[int] = []
        self._join_sig: Optional[Signature] = None
        self.stall_reason: Optional[str] = None
        self._last_stall_check = 0.0
        #: Each process set's ranks by id (0: every rank); the runtime keeps it up to date, at
        #: the same point of the response stream on every rank.
        self.sets: Dict[int, Tuple[int, ...]] = {0: tuple(range(size))}
        #: (process set, call) -> rank -> [names that call submits, names seen so far]
        self._calls: Dict[Tuple[int, str], Dict[int, List[Any]]] = {}

    def expected(self, pset: int) -> Tuple[int, ...]:
        """The ranks that must ask for a name of process set ``pset``."""
        return self.sets.get(pset, ())

    def respond(self, gathered: List[List[Request]], keep_ready_times: bool) -> List[Response]:
        """Take every rank's new requests (rank order); answer the names all ranks asked for."""
        now = time.monotonic()
        touched: Set[Tuple[int, str]] = set()
        for r, lst in enumerate(gathered):
            for req in lst:
                if req.sig.kind == JOIN:
                    if r not in self.joined:
                        self.joined.append(r)
                    self._join_sig = req.sig
                    continue
                asked = now - req.age_s
                key = (req.sig.pset, req.call or req.name)
                seen = self._calls.setdefault(key, {}).setdefault(r, [req.count, []])
                seen[1].append(req.name)
                touched.add(key)
                slot = self.table.get(req.name)
                if slot is None:
                    slot = self.table[req.name] = _Slot(t0=asked)
                slot.reqs[r] = req.sig
                slot.calls.add(key)
                slot.ready[r] = asked
                slot.t0 = min(slot.t0, asked)
        joined = set(self.joined)
        responses = self._mismatched_calls(touched, joined)
        # A joined rank counts as having asked for every name of the global set (it will send
        # zeros); a process set's name is ready once the set's ranks have asked.
        # While a rank is joined, a global collective of JOIN_ERRORS can only fail: each request
        # is answered at once, as ranks whose unnamed calls were numbered apart (one of them sat
        # in join) would otherwise wait for each other's names.
        ready = [n for n, slot in self.table.items()
                 if self._complete(slot.reqs, next(iter(slot.reqs.values())).pset, joined)
                 or (joined and self._fails_with_join(slot))]
        slots = [(n, self.table.pop(n)) for n in ready]
        for _, slot in slots:
            # Answered (every rank asked for it, or a joined rank stands in): its calls are
            # no mismatch, and their records must not outlive it (the name may come again).
            for key in slot.calls:
                self._calls.pop(key, None)
        if keep_ready_times:
            self.ready_times.update((n, slot.ready) for n, slot in slots)
        responses += [self.construct(n, slot.reqs, bool(joined)) for n, slot in slots]
        if len(joined) == self.size:
            # Every rank has joined: the names above were the last that any rank asked for.
            assert self._join_sig is not None
            responses.append(Response(JOIN, JOIN_NAME, None, self._join_sig, [self.joined[-1]]))
            self.joined = []
            self._join_sig = None
        return responses

    @staticmethod
    def _fails_with_join(slot: _Slot) -> bool:
        sig = next(iter(slot.reqs.values()))
        return sig.pset == 0 and sig.kind in JOIN_ERRORS

    def _members_of(self, slot: _Slot) -> Tuple[int, ...]:
        return self.expected(next(iter(slot.reqs.values())).pset)

    def _complete(self, asked: Mapping[int, Any], pset: int, joined: Set[int]) -> bool:
        """Whether every rank that must ask (a set's members; joined ranks count as asking
        for the global set's names) has asked."""
        if pset == 0:
            return len(asked) + len(joined.difference(asked)) == self.size
        return all(r in asked for r in self.expected(pset))

    def _mismatched_calls(self, touched: Set[Tuple[int, str]],
                          joined: Set[int]) -> List[Response]:
        """Horovod's "Mismatched operations" error for the calls that every rank has submitted
        in full, under different collectives (hence, often, different tensor names: a grouped
        op's ``name.0of2`` or alltoall's ``name.splits`` against an allreduce's ``name``); the
        call's names leave the table. A call whose ranks all submitted one kind is left to the
        names' own checks. Only names that share the call's name meet here: two calls named
        apart (``name.0`` against ``name``) wait for each other (the stall warning names them)."""
        out: List[Response] = []
        for key in touched:
            seen = self._calls.get(key)
            if seen is None or not self._complete(seen, key[0], joined) or \
                    any(len(names) < count for count, names in seen.values()):
                continue
            del self._calls[key]
            ranks = sorted(seen)
            if all(seen[r][1] == seen[ranks[0]][1] for r in ranks):
                continue   # one set of names: their own checks (Horovod's order) answer them
            kinds = {}
            for r in ranks:
                slot = self.table.get(seen[r][1][0])
                sig = slot.reqs.get(r) if slot is not None else None
                kinds[r] = sig.kind if sig is not None else None
            first = kinds[ranks[0]]
            other = next((kinds[r] for r in ranks[1:] if kinds[r] != first), None)
            if first is None or other is None:
                continue
            error = (f"Mismatched operations: One rank did an {first}, but another rank did an "
                     f"{other}.")
            for name in dict.fromkeys(n for r in ranks for n in seen[r][1]):
                slot = self.table.pop(name, None)
                if slot is not None:
                    for other_key in slot.calls - {key}:
                        self._calls.pop(other_key, None)
                    sig = next(iter(slot.reqs.values()))
                    out.append(Response(sig.kind, name, error, sig))
        return out

    def construct(self, name: str, reqs: Dict[int, Signature],
                  some_joined: bool = False) -> Response:
        """One response for ``name`` from every rank's request, or Horovod's error (for a
        mismatch, or for a collective of :data:`JOIN_ERRORS` while ``some_joined``)."""
        sigs = [reqs[r] for r in sorted(reqs)]
        first = sigs[0]
        error = first_mismatch(first.kind, sigs)
        if error is None and some_joined:
            error = JOIN_ERRORS.get(first.kind)
        extra = [s.shape[0] for s in sigs] if error is None and first.kind in GATHERS \
            else None
        return Response(first.kind, name, error, first, extra)

    def stall_report(self) -> str:
        """Every name still waiting: which ranks submitted it, as what, and which did not."""
        parts = []
        for name, slot in sorted(self.table.items()):
            asked = ", ".join(f"{r} as {sig.kind}" for r, sig in sorted(slot.reqs.items()))
            parts.append(f"{name} submitted by rank(s) {asked}")
        return "; ".join(parts)

    def inspect_stalls(self, now: float) -> Optional[str]:
        """Warn about names that wait for some ranks; return the stall-shutdown reason the
        first time a name has waited longer than ``stall_shutdown_s`` (else None)."""
        cfg = self.settings
        if now - self._last_stall_check < min(1.0, cfg.stall_check_s):
            return None
        self._last_stall_check = now
        missing: Dict[int, List[str]] = {}
        for name, slot in self.table.items():
            if now - slot.t0 > cfg.stall_check_s and now - slot.warned > cfg.stall_check_s:
                slot.warned = now
                for r in self._members_of(slot):
                    if r not in slot.reqs and r not in self.joined:
                        missing.setdefault(r, []).append(name)
        if missing:
            lines = [f"{r}: [{', '.join(sorted(names))}]" for r, names in sorted(missing.items())]
            log.warning("One or more tensors were submitted to be reduced, gathered or "
                        "broadcasted by subset of ranks and are waiting for remainder of ranks "
                        "for more than %g seconds. This may indicate that different ranks are "
                        "trying to submit different tensors or that only subset of ranks is "
                        "submitting tensors, which will cause deadlock. \nMissing ranks:\n%s",
                        cfg.stall_check_s, "\n".join(lines))
        if cfg.stall_shutdown_s > 0 and self.stall_reason is None:
            late = {name: sorted(set(self._members_of(slot)) - set(slot.reqs) - set(self.joined))
                    for name, slot in self.table.items()
                    if now - slot.t0 > cfg.stall_shutdown_s}
            if late:
                what = "; ".join(f"{name} (missing ranks {', '.join(map(str, ranks))})"
                                 for name, ranks in sorted(late.items()))
                self.stall_reason = (f"stalled for more than {cfg.stall_shutdown_s:g} s, "
                                     f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: {what}. Waiting: "
                                     f"{self.stall_report()}")
                log.error("horotopo: %s", self.stall_reason)
                return self.stall_reason
        return None


def trace_negotiations(tl: timeline.Timeline, responses: List[Response],
                       pending: Mapping[str, Entry],
                       ready_times: Dict[str, Dict[int, float]]) -> float:
    """Draw each response's NEGOTIATE_<KIND> span; return now, when the responses are known.

    The span runs from the first request for the name (this rank's enqueue, or an earlier
    rank's) until now, when every rank knows it is ready; with a tick per rank at its request,
    for names negotiated through rank 0 (a cached name's requests never reach rank 0, so it
    has no ticks). ``ready_times`` entries are consumed.
    """
    now = time.monotonic()
    for resp in responses:
        name = resp.name
        entry = pending.get(name)
        asked = ready_times.pop(name, None)
        start = entry.t0 if entry is not None else now
        if asked:
            start = min(start, min(asked.values()))
        args: Dict[str, Any] = {"cached": asked is None}
        if resp.error is not None:
            args["error"] = resp.error
        tl.complete(name, f"NEGOTIATE_{resp.kind}", start, now, args)
        for r, at in sorted((asked or {}).items()):
            tl.complete(name, str(r), at, at)
    return now


class Controller:
    """This rank's control cycle over a control transport (its own, so no tag meets data).

    Parameters
    ----------
    transport : Transport
        The control transport: ``iallreduce_control``, ``wait``, ``gather_object`` and
        ``broadcast_object`` are all the controller uses.
    settings : Settings
        Cache capacity, re-route and stall settings.
    watchdog : Watchdog
        Guards each wait of a cycle (:class:`horotopo.reliability.Watchdog`: ``guard(what)``
        and ``timeout_s``); the controller owns it and closes it.
    stats : dict
        Counters the controller adds to: ``cycles``, ``negotiations``, ``cache_hits``.
    on_stall : callable
        Called (on rank 0) with the reason when the stall shutdown ends the job.
    """

    def __init__(self, transport: Any, settings: Settings, watchdog: Any,
                 stats: Dict[str, int], on_stall: Callable[[str], None]) -> None:
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.settings = settings
        self.runtime = config.runtime_params()
        self.watchdog = watchdog
        self.guard: Callable[[str], ContextManager[None]] = watchdog.guard
        # The transport's own deadline on each wait is a backstop behind the watchdog, which
        # names the stuck rank (with the liveness pings) and ends the job first; this ends
        # only a wait that it could not (an abort that failed), with TransportTimeout.
        self.backstop_s = 2 * float(watchdog.timeout_s)
        self.stats = stats
        self.on_stall = on_stall
        self.cache = ResponseCache(settings.cache_capacity)
        self.coordinator = Coordinator(self.size, settings)
        self.t_resp = 0.0  # when this cycle's responses became known (timeline)
        self._words = max(1, (self.cache.capacity + 63) // 64)
        self._everything = (1 << (64 * self._words)) - 1
        self._vec = np.empty(1 + 2 * self._words, dtype=np.uint64)
        # This rank has sent its join request and waits for the join response.
        self.joined = False
        #: Why this rank asks to stop, in words the others print (the runtime sets it with
        #: the request).
        self.leaving = faulty([self.rank], "it called shutdown() while the others ran")
        #: Once some rank has asked to stop: which ranks did, and why, in words (None when
        #: they could not be asked).
        self.stopped_by: Optional[str] = None

    def cycle(self, pending: Mapping[str, Entry], stopping: bool,
              tl: Optional[timeline.Timeline]) -> Optional[List[Response]]:
        """One control cycle; the responses to run now, in the same order on every rank, or
        None once some rank has asked to stop."""
        now = time.monotonic()
        words = self._words
        nbytes = 8 * words
        reroute_s = self.settings.reroute_s
        # Bits are gathered in Python ints (numpy scalar ops cost ~1 us each).
        hits = invalid = 0
        to_send: List[Entry] = []
        hit_entries: List[Entry] = []
        for entry in pending.values():
            if entry.sent:
                continue
            cached = self.cache.get(entry.name)
            if cached is None:
                if entry.sig.kind == JOIN:
                    self.joined = True
                to_send.append(entry)
                continue
            bit, sig = cached
            if sig == entry.sig and now - entry.t0 < reroute_s:
                hits |= 1 << bit
                hit_entries.append(entry)
            else:
                # Different parameters (or a stall): drop the entry everywhere and let
                # rank 0 look at this request.
                invalid |= 1 << bit
                to_send.append(entry)
        flags = _FLAG_RUNNING | _FLAG_ALL_CACHED | _FLAG_NONE_JOINED
        if stopping:
            flags &= ~_FLAG_RUNNING
        if to_send:
            flags &= ~_FLAG_ALL_CACHED
        if self.joined:
            # A joined rank has no entries to match cache bits with: the others' requests go
            # to rank 0 instead, every cycle, until every rank has joined.
            flags &= ~(_FLAG_ALL_CACHED | _FLAG_NONE_JOINED)
        vec = self._vec
        vec[0] = flags
        vec[1:1 + words] = np.frombuffer(hits.to_bytes(nbytes, "little"), dtype="<u8")
        vec[1 + words:] = np.frombuffer((self._everything & ~invalid).to_bytes(nbytes, "little"),
                                        dtype="<u8")

        what = f"cycle {self.stats['cycles']}"
        with self.guard(what):
            request = self.transport.iallreduce_control(vec, "band")
            self.transport.wait([request], self._deadline(), what=f"control {what}",
                                spin_polls=self.runtime.control_spin_polls,
                                nap_s=self.runtime.control_nap_s)
        self.stats["cycles"] += 1
        flags = int(vec[0])
        if not flags & _FLAG_RUNNING:
            self.stopped_by = self._who_stopped(stopping)
            return None

        for bit in bits_of(~vec[1 + words:]):
            if bit < self.cache.capacity:
                self.cache.erase_bit(bit)
        responses: List[Response] = []
        if flags & _FLAG_NONE_JOINED:
            for bit in bits_of(vec[1:1 + words]):
                name, sig = self.cache.entry_at(bit)
                self.cache.touch(name)
                responses.append(Response(sig.kind, name, None, sig))
            self.stats["cache_hits"] += len(responses)
        else:
            # Some rank has joined (every rank sees the flag): cached requests are negotiated,
            # so that rank 0 can answer them with the joined ranks counted in.
            to_send.extend(hit_entries)

        if not flags & _FLAG_ALL_CACHED:
            with self.guard(f"negotiation in cycle {self.stats['cycles']}"):
                negotiated = self._negotiate(to_send, keep_ready_times=tl is not None)
            self.stats["negotiations"] += 1
            for resp in negotiated:
                # A process set's names are not cached: the cache bits are ANDed over every
                # rank, and the set's non-members never hit them.
                if resp.error is None and resp.kind in (ALLREDUCE, REDUCESCATTER, BROADCAST) \
                        and resp.sig.pset == 0:
                    self.cache.put(resp.name, resp.sig)
                elif resp.kind == JOIN:
                    self.joined = False
            responses.extend(negotiated)
        if self.rank == 0 and self.settings.stall_check:
            reason = self.coordinator.inspect_stalls(time.monotonic())
            if reason is not None:
                self.on_stall(reason)
        if tl is not None and responses:
            self.t_resp = trace_negotiations(tl, responses, pending,
                                             self.coordinator.ready_times)
        return responses

    def _who_stopped(self, stopping: bool) -> Optional[str]:
        """The ranks that asked to stop and why, from every rank's own word (one allgather in
        the last cycle, which every rank reaches: they all saw the same flags)."""
        mine = self.leaving.encode()[:MAX_REASON_BYTES] if stopping else b""
        try:
            with self.guard("the last cycle: which ranks stop"):
                told = self.transport.allgather_bytes(mine, self.backstop_s,
                                                      what="the last cycle: which ranks stop")
        except TransportTimeout:
            return None
        reasons = [said[:MAX_REASON_BYTES].decode("utf-8", "replace") for said in told if said]
        if not reasons or len(reasons) == self.size:
            return None  # every rank stopped: nobody is left to be told why
        return "; ".join(dict.fromkeys(reasons))

    def close(self) -> None:
        """Stop the watchdog and free the control transport (after the last cycle)."""
        self.watchdog.close()
        self.transport.close()

    def _deadline(self) -> float:
        return time.perf_counter() + self.backstop_s

    def _negotiate(self, to_send: List[Entry], keep_ready_times: bool) -> List[Response]:
        now = time.monotonic()
        msgs = [Request(e.name, e.sig, now - e.t0, e.call, e.count) for e in to_send]
        for e in to_send:
            e.sent = True
        gathered = self.transport.gather_object(request_rows(msgs), 0, self.backstop_s,
                                                what="negotiation (gather to rank 0)")
        rows = None
        if self.rank == 0:
            assert gathered is not None
            rows = response_rows(self.coordinator.respond(
                [requests_from(got) for got in gathered], keep_ready_times))
        return responses_from(self.transport.broadcast_object(
            rows, 0, self.backstop_s, what="negotiation (rank 0's responses)"))
