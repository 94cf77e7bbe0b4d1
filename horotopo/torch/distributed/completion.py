"""Futures for the runtime's handles: torch.distributed's ``Work`` and DDP's hooks need them.

The runtime resolves a handle on its background thread and has no completion callback, while
DDP's reducer chains work onto ``Work.get_future()`` and waits for it later. One daemon
thread per process (the *completer*) therefore waits for the handles in the order they were
submitted and completes their futures. Every rank submits its collectives in the same order,
so waiting in order only delays a future until the ones before it are done, never forever.

Callbacks chained with ``Future.then`` run on the completer; a callback that itself waits
for a later collective would wait for the completer, so such a callback must chain instead
of wait (as torch's own hooks do).
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional, Tuple

import torch
import torch.distributed as dist

__all__ = ["submit", "HorotopoWork"]

Waiter = Callable[[], Any]

_queue: "queue.SimpleQueue[Tuple[Waiter, torch.futures.Future]]" = queue.SimpleQueue()
_thread: Optional[threading.Thread] = None
_thread_lock = threading.Lock()


def _run() -> None:
    while True:
        wait, future = _queue.get()
        try:
            value = wait()
        except BaseException as exc:  # noqa: BLE001 - the waiter on the future re-raises it
            future.set_exception(exc)
            continue
        future.set_result(value)


def submit(wait: Waiter) -> torch.futures.Future:
    """A future that the completer fills with ``wait()`` (or the exception it raises).

    Parameters
    ----------
    wait : callable
        Blocks until a started collective is done and returns its value (it synchronizes the
        runtime's handles and builds the result).
    """
    global _thread
    future: torch.futures.Future = torch.futures.Future()
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="horotopo-torch-completer",
                                       daemon=True)
            _thread.start()
    _queue.put((wait, future))
    return future


class HorotopoWork(dist.Work):
    """A collective in flight on the horotopo backend.

    ``wait()`` raises the collective's error (torch's ``_create_work_from_future`` would
    report success for a failed future, so the backend has a Work class of its own).
    ``wait``'s timeout is not used: ``HOROTOPO_TIMEOUT_S`` bounds every collective, and the
    runtime's watchdog ends the job naming the ranks it waits for.
    """

    def __init__(self, future: torch.futures.Future) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: Any = None) -> bool:
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - a failed collective is what this answers
            return False
        return True
