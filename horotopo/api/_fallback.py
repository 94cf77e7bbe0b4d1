"""Stand-in for :class:`horotopo.engine.Engine` while that module does not exist.

It has the Engine's interface and reduces with plain ``MPI_Allreduce``/``MPI_Bcast`` on its own
``Dup`` of the communicator. The runtime only imports it when ``horotopo.engine`` is missing.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["FallbackEngine"]


def _scale(buf: np.ndarray, factor: float) -> None:
    # Floats scale in their own precision; integers in float64, truncated back (Horovod).
    if factor != 1.0:
        np.multiply(buf, factor, out=buf, casting="unsafe")


class FallbackEngine:
    """MPI_Allreduce / MPI_Bcast with the Engine's call signature."""

    def __init__(self, comm: Any, plan: Any) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = comm.Dup()
        self._ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "product": MPI.PROD}
        self.plan = plan

    def allreduce(self, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray] = None,
                  op: str = "sum", prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
        name = op.lower()
        if name == "average":
            name = "sum"
            postscale_factor = postscale_factor / self._comm.Get_size()
        if recvbuf is None:
            recvbuf = np.empty_like(sendbuf)
        src = sendbuf
        if prescale_factor != 1.0:
            src = sendbuf.copy()
            _scale(src, prescale_factor)
        if src is recvbuf:
            self._comm.Allreduce(self._mpi.IN_PLACE, recvbuf, op=self._ops[name])
        else:
            self._comm.Allreduce(src, recvbuf, op=self._ops[name])
        _scale(recvbuf, postscale_factor)
        return recvbuf

    def broadcast(self, buf: np.ndarray, root: int) -> np.ndarray:
        self._comm.Bcast(buf, root=root)
        return buf

    def close(self) -> None:
        if self._comm is not None:
            self._comm.Free()
            self._comm = None
