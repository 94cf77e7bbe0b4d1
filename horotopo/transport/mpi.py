"""The mpi4py transport, on a duplicated communicator so that its tags never meet the user's."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import time

import numpy as np
from mpi4py import MPI

from .. import config
from ..gpu.elementwise import wire_view
from .base import ReduceOp, TagAllocator, Transport, TransportError

__all__ = ["MPITransport", "as_transport"]

_OPS = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "product": MPI.PROD}
_TYPES: Dict[np.dtype, Any] = {np.dtype(k): v for k, v in (
    ("float32", MPI.FLOAT), ("float64", MPI.DOUBLE), ("int32", MPI.INT32_T),
    ("int64", MPI.INT64_T), ("uint8", MPI.UINT8_T), ("int8", MPI.INT8_T),
    ("uint32", MPI.UINT32_T), ("uint64", MPI.UINT64_T))}
_HALF = np.dtype(np.float16)


def _wire(buf: Any) -> Any:
    """``buf`` as MPI can take it: mpi4py cannot always export ml_dtypes' bfloat16 through the
    buffer protocol, so its raw 16-bit words travel as uint16. Testing the kind first keeps
    the per-message cost at one attribute read; bfloat16 is the only 'V' dtype sent here."""
    return wire_view(buf) if buf.dtype.kind == "V" else buf


class MPITransport(Transport):
    """:class:`Transport` over an mpi4py communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator to run on. It is ``Dup()``-ed, so traffic never matches the caller's
        own messages; :meth:`close` frees the duplicate.
    """

    def __init__(self, comm: "MPI.Comm", poll_sleep_s: Optional[float] = None,
                 spin_polls: Optional[int] = None) -> None:
        # Waiting polls with Testsome and, after `spin_polls` empty polls, sleeps
        # `poll_sleep_s` between polls instead of spinning inside MPI_Waitsome: on a node
        # with more ranks than cores (and on emulated networks, where the kernel moves the
        # bytes) spinning ranks take the CPU from the ranks and the kernel that have work.
        # poll_sleep_s=0 spins in MPI_Waitsome as MPI would.
        self.poll_sleep_s = (poll_sleep_s if poll_sleep_s is not None
                             else config.get("HOROTOPO_POLL_SLEEP_US") * 1e-6)
        self.spin_polls = (spin_polls if spin_polls is not None
                           else config.get("HOROTOPO_SPIN_POLLS"))
        self._comm: Optional[MPI.Comm] = comm.Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        upper = self._comm.Get_attr(MPI.TAG_UB)
        self._tags = TagAllocator(int(upper) if upper else 32767)

    @property
    def comm(self) -> "MPI.Comm":
        if self._comm is None:
            raise TransportError("the transport is closed")
        return self._comm

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def isend(self, buf: Any, dest: int, tag: int) -> Any:
        return self.comm.Isend([_wire(buf), MPI.BYTE], dest, tag)

    def irecv(self, buf: Any, source: int, tag: int) -> Any:
        return self.comm.Irecv([_wire(buf), MPI.BYTE], source, tag)

    def test(self, request: Any) -> bool:
        return bool(request.Test())

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        if self.poll_sleep_s <= 0:
            done = MPI.Request.Waitsome(requests)
        else:
            testsome = MPI.Request.Testsome
            polls = 0
            while True:
                done = testsome(requests)
                if done or done is None:
                    break
                polls += 1
                if polls > self.spin_polls:
                    time.sleep(self.poll_sleep_s)
        if done is None:
            raise TransportError("waitsome on requests that have all completed already")
        return done

    def waitall(self, requests: Sequence[Any]) -> None:
        if requests:
            MPI.Request.Waitall(requests)

    def alloc_tags(self, count: int) -> int:
        return self._tags.alloc(count)

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        """MPI_Allreduce on flat arrays of one dtype; float16 and bfloat16 are reduced in
        float32 (see below)."""
        mop = _OPS.get(op)
        if mop is None:
            raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
        dtype = _TYPES.get(recvbuf.dtype)
        if dtype is None:
            if recvbuf.dtype != _HALF and recvbuf.dtype.name != "bfloat16":
                raise TransportError(f"no MPI datatype for {recvbuf.dtype}")
            # MPI has no portable half or bfloat16 type (MPIX_C_FLOAT16 is optional, bfloat16
            # has none): reduce in float32 (exact widening for both) and round once at the end,
            # which is also the more accurate answer. MPI's float32 result is the same on every
            # rank, so the rounded one is too.
            wide = sendbuf.astype(np.float32)  # a copy, NumPy or CuPy alike
            self.comm.Allreduce(MPI.IN_PLACE, [wide, MPI.FLOAT], op=mop)
            recvbuf[...] = wide
            return
        if sendbuf is recvbuf:
            self.comm.Allreduce(MPI.IN_PLACE, [recvbuf, dtype], op=mop)
        else:
            self.comm.Allreduce([sendbuf, dtype], [recvbuf, dtype], op=mop)

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        if self._comm is not None:
            comm, self._comm = self._comm, None
            if not MPI.Is_finalized():
                comm.Free()


def as_transport(comm: Any) -> Transport:
    """A :class:`Transport` from a transport (returned as is) or an mpi4py communicator."""
    if isinstance(comm, Transport):
        return comm
    if isinstance(comm, MPI.Comm):
        return MPITransport(comm)
    raise TypeError(f"expected an mpi4py communicator or a Transport, got {type(comm).__name__}")
