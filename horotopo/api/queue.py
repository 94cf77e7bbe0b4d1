"""The user-thread side of the runtime: the request queue and the handle table.

User calls enqueue here and wait on handles; the background thread takes what was enqueued
once per cycle and resolves the handles. One lock guards what both threads touch.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..params import RUNTIME
from .errors import DUPLICATE_NAME, SHUT_DOWN, HorovodInternalError
from .ops import Average
from .records import BROADCAST, Entry, Handle, Signature, dtype_name

__all__ = ["RequestQueue", "Item"]

#: One tensor of a call: (name, input, output); the data-less ops have neither array.
Item = Tuple[str, Optional[Any], Optional[Any]]


class RequestQueue:
    """Requests waiting for the background thread, and the handles of every call in flight.

    ``check_s`` is how often a waiting handle looks whether the runtime still runs
    (:attr:`horotopo.params.RuntimeParams.handle_check_s`).

    Attributes
    ----------
    size : int
        The number of ranks once set-up has found it (-1 before): broadcast roots are checked
        against it.
    dead : str or None
        Why the runtime ended, once it has (every later call fails with it).
    """

    def __init__(self, check_s: float = RUNTIME.handle_check_s) -> None:
        self.check_s = check_s
        self.size = -1
        self.dead: Optional[str] = None
        self._lock = threading.Lock()
        self._done_cv = threading.Condition(threading.Lock())
        self._incoming: List[Entry] = []
        self._names: Set[str] = set()     # names pending on this rank (duplicate check)
        self._handles: Dict[int, Handle] = {}
        self._ids = itertools.count()
        self._stop_requested = False

    # ---- user threads

    def enqueue(self, kind: str, items: Sequence[Item], op: int = Average,
                prescale: float = 1.0, postscale: float = 1.0, root: int = 0, device: int = -1,
                ready: Optional[Callable[[], None]] = None, pset: int = 0,
                call: Optional[Tuple[str, int]] = None) -> int:
        """Queue ``items`` as one call; return its handle id (see :meth:`.Runtime.enqueue`).

        Raises
        ------
        ValueError
            A name is already pending on this rank (Horovod's duplicate-name error), or a
            broadcast root is out of range.
        HorovodInternalError
            The runtime has shut down.
        """
        with self._lock:
            if self.dead is not None or self._stop_requested:
                raise _error(self.dead or SHUT_DOWN)
            # Each process set has its own names (Horovod's per-set tensor tables): a set's
            # names are kept apart from the global set's and from other sets'.
            names = [name if pset == 0 else f"ps{pset}:{name}" for name, _, _ in items]
            if len(set(names)) != len(names) or any(n in self._names for n in names):
                raise ValueError(DUPLICATE_NAME)
            if pset == 0 and kind == BROADCAST and self.size > 0 and \
                    not 0 <= int(root) < self.size:
                raise ValueError(f"root_rank {root} is out of range: there are {self.size} "
                                 f"ranks")
            hid = next(self._ids)
            handle = Handle(hid, len(items))
            for index, (name, (_, array, output)) in enumerate(zip(names, items)):
                if array is not None:
                    sig = Signature(kind, dtype_name(array.dtype), tuple(map(int, array.shape)),
                                    int(op), float(prescale), float(postscale), int(root),
                                    int(device), pset)
                else:
                    # root carries a data-less op's one parameter (retune's probe mode)
                    sig = Signature(kind, "uint8", (), int(op), 1.0, 1.0, int(root),
                                    int(device), pset)
                entry = Entry(name, sig, array, output, handle, index, ready)
                if call is not None:
                    entry.call, entry.count = call
                self._incoming.append(entry)
                self._names.add(name)
            self._handles[hid] = handle
        return hid

    def next_id(self) -> int:
        """A fresh id from the handle counter (Horovod names unnamed ops after it)."""
        with self._lock:
            return next(self._ids)

    def poll(self, hid: int) -> bool:
        handle = self._handles.get(hid)
        if handle is None or handle.done:
            return True
        # A caller that spins on poll would hold the GIL that the background thread needs
        # to finish the op (Horovod's thread is C++ and needs none): give it up once.
        time.sleep(0)
        return handle.done

    def wait(self, hid: int, alive: Callable[[], bool]) -> List[Any]:
        """Block until ``hid`` completes; return its results and forget the handle.

        ``alive`` says whether the background thread still runs: a wait whose handle can no
        longer complete fails with the reason the runtime ended.
        """
        handle = self._handles.get(hid)
        if handle is None:
            raise ValueError(f"unknown or already synchronized handle {hid!r}")
        if not handle.done:
            with self._done_cv:
                while not handle.done:
                    self._done_cv.wait(self.check_s)
                    if not handle.done and not alive():
                        self._handles.pop(hid, None)
                        raise _error(self.dead or SHUT_DOWN)
        self._handles.pop(hid, None)
        if handle.error is not None:
            raise _error(handle.error)
        return handle.results

    def request_stop(self) -> None:
        """Ask the background thread to stop (it tells every rank at its next cycle)."""
        with self._lock:
            self._stop_requested = True

    # ---- the background thread

    def take(self) -> Tuple[List[Entry], bool]:
        """What was enqueued since the last call, and whether a stop was asked for."""
        with self._lock:
            incoming, self._incoming = self._incoming, []
            return incoming, self._stop_requested

    def close(self, reason: str) -> List[Entry]:
        """Refuse further calls with ``reason``; return what was enqueued and never taken."""
        with self._lock:
            self.dead = reason
            leftovers, self._incoming = self._incoming, []
        return leftovers

    def finish(self, entries: List[Entry], values: Optional[List[Any]] = None,
               error: Optional[str] = None) -> None:
        """Resolve ``entries`` with ``values`` (or ``error``), free their names, wake waiters."""
        with self._lock:
            for e in entries:
                self._names.discard(e.name)
        for k, e in enumerate(entries):
            e.handle.resolve(e.index, None if values is None else values[k], error)
        with self._done_cv:
            self._done_cv.notify_all()

    @property
    def pending_names(self) -> Set[str]:
        """The names enqueued on this rank and not finished yet (a copy)."""
        with self._lock:
            return set(self._names)


def _error(text: str) -> HorovodInternalError:
    """The collective's error; one that ended the job says so (``job_ended``), so the abort
    of a rank that does not catch it does not blame that rank (the text names who did)."""
    exc = HorovodInternalError(text)
    exc.job_ended = text.startswith(SHUT_DOWN)  # type: ignore[attr-defined]
    return exc
