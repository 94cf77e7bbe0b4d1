"""broadcast_object / allgather_object: pickled Python objects over byte broadcasts."""
from __future__ import annotations

import io
import pickle
from typing import Any, List, Optional

import numpy as np

from .arrays import set_root
from .process_sets import check_process_set, global_process_set
from .state import runtime, unnamed
from .runtime import ALLGATHER, BROADCAST

__all__ = ["broadcast_object", "allgather_object"]

try:  # cloudpickle also handles lambdas and local classes, as Horovod's does
    import cloudpickle as pickler
except ImportError:
    pickler = pickle


def _dumps(obj: Any) -> np.ndarray:
    buf = io.BytesIO()
    pickler.dump(obj, buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()


def _run(kind: str, name: str, arr: np.ndarray, out: Optional[np.ndarray], root: int = 0,
         pset: int = 0) -> Any:
    rt = runtime()
    hid = rt.enqueue(kind, [(name, arr, out)], root=root, pset=pset)
    return rt.wait(hid)[0]


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> Any:
    """Serialize ``obj`` on ``root_rank`` and return a copy of it on every rank.

    Parameters
    ----------
    obj : any picklable object
        Only the root's value matters.
    root_rank : int
        The rank whose object is sent.
    name : str, optional
        Base name of the two underlying broadcasts (size, then bytes).
    """
    pset, root = set_root(process_set, root_rank)
    # Counted, not typed, default names: non-root ranks often pass None.
    base = name or unnamed("broadcast_object", pset)
    is_root = runtime().rank == root_rank
    payload = _dumps(obj) if is_root else np.zeros(0, dtype=np.uint8)
    length = np.array([payload.size], dtype=np.int64)
    _run(BROADCAST, f"{base}.size", length, length, root, pset)
    if not is_root:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    _run(BROADCAST, f"{base}.data", payload, payload, root, pset)
    if is_root:
        return obj
    return pickle.loads(payload.tobytes())


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> List[Any]:
    """Return the list of every rank's ``obj``, in rank order."""
    pset, ranks = check_process_set(process_set, "Allgather")
    base = name or unnamed("allgather_object", pset)
    payload = _dumps(obj)
    sizes = _run(ALLGATHER, f"{base}.size",
                 np.array([payload.size], dtype=np.int64), None, pset=pset)
    data = _run(ALLGATHER, f"{base}.data", payload, None, pset=pset)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    assert len(out) == len(ranks)
    return out
