"""The started runtime of this process, which every front-end module reads.

``init()`` (:mod:`.basics`) publishes the one :class:`~horotopo.api.runtime.Runtime` here once
it runs, and ``shutdown()`` withdraws it. The process sets, the array and object collectives
and the handles read it from here, below :mod:`.basics`, so that none of them imports the
module that starts the job.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Tuple

from .errors import NOT_INITIALIZED
from .runtime import Runtime

__all__ = ["runtime", "current", "publish", "withdraw", "is_initialized", "unnamed"]

_runtime: Optional[Runtime] = None
_counters: Dict[Tuple[str, int], int] = {}
_counters_lock = threading.Lock()  # user threads may name unnamed ops concurrently


def runtime() -> Runtime:
    """The running runtime; ValueError (Horovod's message) before init()."""
    rt = _runtime
    if rt is None:
        raise ValueError(NOT_INITIALIZED)
    return rt


def current() -> Optional[Runtime]:
    """The published runtime, or None: no error, for the callers that start or stop it."""
    return _runtime


def publish(rt: Runtime) -> None:
    """Make ``rt`` the process's runtime; the names of unnamed ops count from 0 again."""
    global _runtime
    with _counters_lock:
        _counters.clear()
    _runtime = rt


def withdraw() -> Optional[Runtime]:
    """Unpublish the runtime and return it (None when none was published)."""
    global _runtime
    rt, _runtime = _runtime, None
    return rt


def is_initialized() -> bool:
    """True between init() and shutdown() while the runtime is running."""
    rt = _runtime
    return rt is not None and rt.alive


def unnamed(kind: str, pset: Any = 0) -> str:
    """Name for an op submitted without one: ``allreduce.noname.<k>``, counted per kind so that
    ranks running the same program agree even if their named ops differ, and per process set
    (``pset``: its id or the ProcessSet), as only a set's members count its ops."""
    runtime()  # Horovod's error before init
    pid = getattr(pset, "process_set_id", pset) or 0
    with _counters_lock:
        k = _counters.get((kind, pid), 0)
        _counters[(kind, pid)] = k + 1
    return f"{kind}.noname.{k}" if not pid else f"{kind}.set{pid}.noname.{k}"
