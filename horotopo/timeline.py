"""Horovod's timeline: a Chrome-trace JSON file of what the runtime did, written on rank 0.

The file loads in ``chrome://tracing`` and in Perfetto (https://ui.perfetto.dev). As in
Horovod, each tensor name is a *process* row (``"M"`` metadata events name it), and each op on
it shows as nested spans on that row's main track:

- ``NEGOTIATE_<KIND>`` (``X``): from the op's enqueue until every rank had asked for it, with a
  zero-length tick per rank (named by the rank) at the moment that rank's request was made;
- ``<KIND>`` (``B``/``E``), the op itself, from the end of negotiation until it completed; inside
  it ``QUEUE`` (waiting behind ops executed earlier in the same cycle),
  ``MEMCPY_IN_FUSION_BUFFER`` / ``MEMCPY_OUT_FUSION_BUFFER`` and the collective, named by the
  algorithm that ran it (``TREE_ALLREDUCE``, ``MPI_ALLREDUCE``, ``RING_ALLREDUCE``,
  ``TREE_BROADCAST``);
- for tree collectives, one extra track per tree and phase (``tree 0 reduce``,
  ``tree 0 broadcast``, ...) with that tree's ``TREE_REDUCE`` and ``TREE_BCAST`` spans. The
  phases of a tree overlap (the pipeline broadcasts chunk k while it reduces chunk k+1), so
  they cannot share a track.

Only rank 0 writes, so everything on the file is rank 0's view: the per-tree phases are when
*rank 0* finished reducing and broadcasting its chunks of each tree, not when the whole tree did.

This module is the bottom layer: it imports nothing from the rest of horotopo. The runtime,
the engine and the tree algorithm call :func:`active` and do nothing more when it returns None,
so a job without a timeline pays one ``is None`` check per hook.

The file stays valid JSON between writes: events are buffered and written in batches
(:meth:`Timeline.flush`, once per runtime cycle), each batch followed by the closing ``]}``,
which the next batch overwrites. A job that dies leaves a file that still loads, up to its last
flush; :meth:`Timeline.close` (``stop_timeline``, ``shutdown``, interpreter exit) writes the
rest and ends any span still open.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import config

__all__ = ["Timeline", "TreePhases", "active", "start", "stop", "tree_phases", "clock",
           "ENGINE_ROW", "CYCLE_START"]

#: The clock of every timestamp handed to a Timeline (seconds); the runtime's enqueue times
#: use the same one.
clock = time.monotonic

#: Row of engine calls made outside any runtime op (a program driving the Engine directly).
ENGINE_ROW = "horotopo engine"
#: Name of the cycle markers (``mark_cycles``), as in Horovod.
CYCLE_START = "CYCLE_START"

_TAIL = b"\n]}\n"

Rows = Union[str, Sequence[str]]


class Timeline:
    """One timeline file: thread-safe writers of Chrome trace events.

    Timestamps are :data:`clock` readings (seconds); the file holds microseconds since the
    timeline started. Every method is a no-op once the timeline is closed, so a thread that
    still holds it after :func:`stop` cannot corrupt the file.

    Parameters
    ----------
    path : str
        The file to write (truncated).
    mark_cycles : bool
        Whether the runtime marks its cycles (Horovod's ``HOROVOD_TIMELINE_MARK_CYCLES``).
    label : str
        Name of the job's own row (process 0), which carries the cycle markers.
    info : dict, optional
        JSON-able facts about the job, stored in the file's ``otherData``.

    Raises
    ------
    OSError
        The file cannot be created.
    """

    def __init__(self, path: str, mark_cycles: bool = False, label: str = "horotopo",
                 info: Optional[Dict[str, Any]] = None) -> None:
        self.path = os.fspath(path)
        self.mark_cycles = bool(mark_cycles)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._t0 = clock()
        self._file = open(self.path, "wb")
        self._closed = False
        self._pending: List[str] = []
        self._flush_events = config.runtime_params().timeline_flush_events
        self._written = 0           # events already in the file
        self._end = 0               # file offset where the closing tail starts
        self._pids: Dict[str, int] = {}
        self._tids: Dict[Tuple[int, str], int] = {}
        self._open: Dict[Tuple[int, int], int] = {}  # track -> depth of open B spans
        other = {"producer": "horotopo",
                 "start_time_since_epoch_in_micros": int(time.time() * 1e6), **(info or {})}
        head = ('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other) +
                ', "traceEvents": [\n')
        self._file.write(head.encode())
        self._end = self._file.tell()
        with self._lock:
            self._pids[label] = 0
            self._meta(0, 0, "process_name", {"name": label})
            self._meta(0, 0, "process_sort_index", {"sort_index": 0})
            self._flush_locked()

    # ------------------------------------------------------------------ event writers

    @property
    def closed(self) -> bool:
        return self._closed

    def begin(self, rows: Rows, name: str, ts: Optional[float] = None,
              args: Optional[Dict[str, Any]] = None, lane: str = "") -> None:
        """Open span ``name`` on ``lane`` of each row (``B``), at ``ts`` (default now)."""
        at = self._us(ts)
        with self._lock:
            if self._closed:
                return
            for row in _as_rows(rows):
                track = self._track(row, lane)
                self._open[track] = self._open.get(track, 0) + 1
                self._emit({"ph": "B", "name": name, "ts": at, "pid": track[0],
                            "tid": track[1]}, args)

    def end(self, rows: Rows, ts: Optional[float] = None,
            args: Optional[Dict[str, Any]] = None, lane: str = "") -> None:
        """Close the innermost open span on ``lane`` of each row (``E``).

        A row with no open span there is skipped: its op began before this timeline started,
        and an unmatched ``E`` would unbalance the file.
        """
        at = self._us(ts)
        with self._lock:
            if self._closed:
                return
            for row in _as_rows(rows):
                track = self._track(row, lane)
                depth = self._open.get(track, 0)
                if depth == 0:
                    continue
                self._open[track] = depth - 1
                self._emit({"ph": "E", "ts": at, "pid": track[0], "tid": track[1]}, args)

    def complete(self, rows: Rows, name: str, start: float, end: float,
                 args: Optional[Dict[str, Any]] = None, lane: str = "") -> None:
        """A finished span ``[start, end]`` on ``lane`` of each row (``X``)."""
        at, stop_at = self._us(start), self._us(end)
        with self._lock:
            if self._closed:
                return
            for row in _as_rows(rows):
                pid, tid = self._track(row, lane)
                self._emit({"ph": "X", "name": name, "ts": at,
                            "dur": round(max(0.0, stop_at - at), 3), "pid": pid, "tid": tid},
                           args)

    def marker(self, name: str, ts: Optional[float] = None) -> None:
        """A global instant event (Horovod's cycle markers)."""
        at = self._us(ts)
        with self._lock:
            if not self._closed:
                self._emit({"ph": "i", "s": "g", "name": name, "ts": at, "pid": 0, "tid": 0},
                           None)

    # ------------------------------------------------------------------ engine-side context

    def set_rows(self, rows: Optional[Sequence[str]]) -> None:
        """The tensor rows that engine activity on *this thread* belongs to (None: none)."""
        self._local.rows = None if rows is None else tuple(rows)

    def rows(self) -> Tuple[str, ...]:
        """This thread's current rows, or the engine's own row outside any op."""
        return getattr(self._local, "rows", None) or (ENGINE_ROW,)

    def activity(self, name: str, start: float, end: Optional[float] = None,
                 args: Optional[Dict[str, Any]] = None, lane: str = "") -> None:
        """A finished span on this thread's current rows (see :meth:`set_rows`)."""
        self.complete(self.rows(), name, start, clock() if end is None else end, args, lane)

    # ------------------------------------------------------------------ file

    def flush(self) -> None:
        """Write the buffered events; the file is complete JSON afterwards."""
        with self._lock:
            if not self._closed and self._pending:
                self._flush_locked()

    def close(self) -> None:
        """End every open span now, write everything and close the file. Idempotent."""
        at = self._us(None)
        with self._lock:
            if self._closed:
                return
            for (pid, tid), depth in self._open.items():
                for _ in range(depth):
                    self._emit({"ph": "E", "ts": at, "pid": pid, "tid": tid},
                               {"unfinished": True})
            self._open.clear()
            self._flush_locked()
            self._file.truncate()
            self._file.close()
            self._closed = True

    # ------------------------------------------------------------------ internals (lock held)

    def _us(self, ts: Optional[float]) -> float:
        # An op enqueued before the timeline started has its negotiation start at 0.
        return round(max(0.0, (clock() if ts is None else ts) - self._t0) * 1e6, 3)

    def _emit(self, event: Dict[str, Any], args: Optional[Dict[str, Any]]) -> None:
        if args:
            event["args"] = args
        # default=str: an argument the caller did not make JSON-able (a NumPy scalar, a
        # dtype) is written as text rather than losing the whole batch.
        self._pending.append(json.dumps(event, default=str))
        # a program that drives the engine directly never flushes at the end of a cycle
        if len(self._pending) >= self._flush_events:
            self._flush_locked()

    def _meta(self, pid: int, tid: int, what: str, args: Dict[str, Any]) -> None:
        self._emit({"ph": "M", "name": what, "pid": pid, "tid": tid}, args)

    def _track(self, row: str, lane: str) -> Tuple[int, int]:
        pid = self._pids.get(row)
        if pid is None:
            pid = self._pids[row] = len(self._pids)
            self._meta(pid, 0, "process_name", {"name": row})
            self._meta(pid, 0, "process_sort_index", {"sort_index": pid})
        if not lane:
            return pid, 0
        tid = self._tids.get((pid, lane))
        if tid is None:
            tid = self._tids[(pid, lane)] = 1 + sum(1 for p, _ in self._tids if p == pid)
            self._meta(pid, tid, "thread_name", {"name": lane})
            self._meta(pid, tid, "thread_sort_index", {"sort_index": tid})
        return pid, tid

    def _flush_locked(self) -> None:
        f = self._file
        f.seek(self._end)
        if self._pending:
            body = ",\n".join(self._pending)
            if self._written:
                body = ",\n" + body
            f.write(body.encode())
            self._written += len(self._pending)
            self._pending.clear()
        self._end = f.tell()
        f.write(_TAIL)
        f.flush()


def _as_rows(rows: Rows) -> Sequence[str]:
    return (rows,) if isinstance(rows, str) else rows


class TreePhases:
    """When each tree of one tree collective changed phase at this rank.

    The tree algorithm calls :meth:`reduced`, :meth:`final` and :meth:`done` as a tree's
    chunks move (the first call per tree counts), then :meth:`emit`, which writes per tree a
    ``TREE_REDUCE`` span (allreduce only: from the call's start until this rank had reduced, or
    handed up, its last chunk) and a ``TREE_BCAST`` span (from this rank's first final
    chunk until its last chunk was received and forwarded) on the current rows.
    """

    __slots__ = ("timeline", "allreduce", "start", "trees", "_reduced", "_final", "_done")

    def __init__(self, timeline: Timeline, allreduce: bool) -> None:
        self.timeline = timeline
        self.allreduce = allreduce
        self.start = clock()
        self.trees: Dict[int, Dict[str, Any]] = {}
        self._reduced: Dict[int, float] = {}
        self._final: Dict[int, float] = {}
        self._done: Dict[int, float] = {}

    def add(self, tree: int, **facts: Any) -> None:
        """Declare plan tree ``tree`` as part of this call, with facts for the spans' args."""
        self.trees[tree] = {"tree": tree, **facts}

    def reduced(self, tree: int) -> None:
        self._reduced.setdefault(tree, clock())

    def final(self, tree: int) -> None:
        self._final.setdefault(tree, clock())

    def done(self, tree: int) -> None:
        self._done.setdefault(tree, clock())

    def emit(self) -> None:
        tl = self.timeline
        rows = tl.rows()
        for tree, facts in self.trees.items():
            if self.allreduce and tree in self._reduced:
                tl.complete(rows, "TREE_REDUCE", self.start, self._reduced[tree], facts,
                            lane=f"tree {tree} reduce")
            if tree in self._final and tree in self._done:
                tl.complete(rows, "TREE_BCAST", self._final[tree], self._done[tree], facts,
                            lane=f"tree {tree} broadcast")


_active: Optional[Timeline] = None
_module_lock = threading.Lock()
_atexit_registered = False


def active() -> Optional[Timeline]:
    """The timeline being written in this process, or None (then hooks do nothing)."""
    return _active


def tree_phases(allreduce: bool) -> Optional[TreePhases]:
    """A phase recorder for one tree collective, or None when no timeline is being written."""
    tl = _active
    return None if tl is None else TreePhases(tl, allreduce)


def start(path: str, mark_cycles: bool = False, label: str = "horotopo",
          info: Optional[Dict[str, Any]] = None) -> Timeline:
    """Start writing ``path`` (Horovod's ``start_timeline`` on the coordinator).

    As in Horovod, starting again with the same file keeps writing it (with the new
    ``mark_cycles``), and a different file closes the current one first. The new file is
    opened before the old one closes, so a path that cannot be written raises OSError and
    leaves the current timeline running.
    """
    global _active, _atexit_registered
    with _module_lock:
        current = _active
        if current is not None and not current.closed and \
                os.path.abspath(current.path) == os.path.abspath(os.fspath(path)):
            current.mark_cycles = bool(mark_cycles)
            return current
        new = Timeline(path, mark_cycles, label, info)
        _active = new
        if not _atexit_registered:
            # A program that never shuts down still leaves every event on the file.
            atexit.register(stop)
            _atexit_registered = True
    if current is not None:
        current.close()
    return new


def stop() -> None:
    """Close the current timeline, if any (Horovod's ``stop_timeline``)."""
    global _active
    with _module_lock:
        current, _active = _active, None
    if current is not None:
        current.close()
