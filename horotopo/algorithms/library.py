"""The library's own MPI_Allreduce: the small-message path and the fallback."""
from __future__ import annotations

from typing import Any

from ..transport.base import Transport

__all__ = ["MPIAllreduce"]


class MPIAllreduce:
    """One call to the transport's library allreduce (MPI_Allreduce for :class:`MPITransport`).

    Its result is the library's: MPI implementations return identical bits on every rank for
    the built-in reductions, and the metadata check has already made every rank agree on the
    count, dtype and op.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def run(self, src: Any, out: Any, op: str) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place)."""
        self.transport.allreduce(src, out, op)
