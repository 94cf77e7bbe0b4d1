"""The library's own MPI_Allreduce: the small-message path and the fallback."""
from __future__ import annotations

from typing import Any, Optional

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
        self.last_messages = 0  # the library's messages are its own; none counted here

    def run(self, src: Any, out: Any, op: str, chunk_elems: Optional[int] = None) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place).

        ``chunk_elems`` is ignored (the library cuts its own messages); it is there so that
        every allreduce runner of the registry is called alike.
        """
        self.transport.allreduce(src, out, op)
