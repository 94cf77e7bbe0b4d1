"""Transports: the thin message layer that the collective algorithms are written against.

An algorithm sees only :class:`Transport`: ``rank``, ``size``, ``isend``/``irecv`` returning
opaque request handles, ``waitsome``/``waitall``/``test`` for progress, and ``alloc_tags`` for
a private block of tags per collective call. The layers that must agree on something (the
probe, the bootstrap, the plan protocol) use its small collective steps with deadlines
(``broadcast_bytes``, ``gather_bytes``, ``allgather_bytes``, ``allreduce_control``,
``barrier``), which raise :class:`TransportTimeout` naming the missing peers.

:class:`~horotopo.transport.mpi.MPITransport` is the only code in horotopo that touches MPI
(with launch/ and the CUDA-awareness query). It is imported on first use, so importing this
package (or :mod:`horotopo.transport.base`) never imports mpi4py: a simulator's transport and
the pure layers run without MPI.
"""
import sys
from types import ModuleType
from typing import Any, Optional

from .base import ReduceOp, Transport, TransportError, TransportTimeout, WrappedTransport

__all__ = ["Transport", "TransportError", "TransportTimeout", "ReduceOp", "WrappedTransport",
           "MPITransport", "as_transport", "loaded_mpi"]


def loaded_mpi() -> Optional[ModuleType]:
    """:mod:`horotopo.transport.mpi` when this process has already imported mpi4py, else None.

    For the paths that must reach MPI without ever starting it (the abort, which runs before
    init, after finalize and in processes without MPI): importing mpi4py initializes MPI.
    """
    if sys.modules.get("mpi4py.MPI") is None:
        return None
    from . import mpi

    return mpi


def __getattr__(name: str) -> Any:
    if name in ("MPITransport", "as_transport"):
        from . import mpi

        return getattr(mpi, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
