"""Transports: the thin message layer that the collective algorithms are written against.

An algorithm sees only :class:`Transport`: ``rank``, ``size``, ``isend``/``irecv`` returning
opaque request handles, ``waitsome``/``waitall``/``test`` for progress, and ``alloc_tags`` for
a private block of tags per collective call. :class:`~horotopo.transport.mpi.MPITransport` is
the only implementation that touches MPI; the algorithms never import mpi4py.
"""
from .base import ReduceOp, Transport, TransportError
from .mpi import MPITransport, as_transport

__all__ = ["Transport", "TransportError", "ReduceOp", "MPITransport", "as_transport"]
