"""Handle bookkeeping shared by the NumPy/CuPy and torch front ends."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .state import runtime
from .errors import HorovodInternalError

__all__ = ["HandleTable"]


class HandleTable:
    """Maps a user handle to runtime handles and the function that builds the answer.

    The function runs on the caller's thread at ``synchronize`` time, which is where
    framework conversions (NumPy -> torch, host -> device) belong. A user handle usually is
    the runtime handle itself; composite ops (alltoall) wait on several runtime handles.
    """

    def __init__(self) -> None:
        self._entries: Dict[int, Tuple[Sequence[int], Callable[..., Any]]] = {}
        self._lock = threading.Lock()

    def add(self, hid: int, finish: Callable[[List[Any]], Any],
            waits: Optional[Sequence[int]] = None) -> int:
        """Register ``hid``; ``finish`` gets one result list per waited runtime handle."""
        with self._lock:
            self._entries[hid] = (tuple(waits) if waits is not None else (hid,), finish)
        return hid

    def take(self, handle: int) -> Tuple[Sequence[int], Callable[..., Any]]:
        """Remove ``handle`` and return its runtime handles and finishing function, for a
        front end that registers the same op under its own table with its own conversion.

        Raises
        ------
        KeyError
            ``handle`` is not in the table.
        """
        with self._lock:
            return self._entries.pop(handle)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def poll(self, handle: int) -> bool:
        """True once ``handle`` completed; synchronize() then returns without blocking."""
        with self._lock:
            entry = self._entries.get(handle)
        if entry is None:
            return True
        rt = runtime()
        return all(rt.poll(h) for h in entry[0])

    def synchronize(self, handle: int) -> Any:
        """Wait for ``handle`` and return its result; None for an unknown handle (as Horovod).

        Raises
        ------
        HorovodInternalError
            The collective failed on every rank (mismatch) or the runtime shut down.
        """
        with self._lock:
            entry = self._entries.pop(handle, None)
        if entry is None:
            return None
        rt = runtime()
        results, error = [], None
        for h in entry[0]:
            try:
                results.append(rt.wait(h))
            except HorovodInternalError as exc:  # still drain the others
                error = error or exc
        if error is not None:
            raise error
        return entry[1](*results)
