"""The library's own MPI_Allreduce: the small-message path and the fallback."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..buffers import ScratchPool, from_order_keys, has_nan_or_negative_zero, order_keys
from ..ops import EXTREMES, is_float_dtype
from ..params import ENGINE, EngineParams
from ..transport.base import Transport

__all__ = ["MPIAllreduce"]


class MPIAllreduce:
    """One call to the transport's library allreduce (MPI_Allreduce for :class:`MPITransport`).

    Its result is the library's: MPI implementations return identical bits on every rank for
    the built-in reductions, and the metadata check has already made every rank agree on the
    count, dtype and op.

    Float min and max do not go to the library as floats: MPI's built-in MIN and MAX compare
    with ``<``, so a NaN wins or loses depending on which rank's operand comes first, and -0.0
    against +0.0 likewise. They go as integer keys that order as IEEE 754-2019's minimum and
    maximum do (:func:`horotopo.buffers.order_keys`), which the library reduces exactly, and
    come back as the same numbers the tree and ring paths give (the engine then makes every
    NaN the canonical one, on every path).

    Only NaN and -0.0 make the library's float answer depend on the operand order; without
    them (on every rank) MAX and MIN are exact. From ``params.check_first_bytes`` up
    (:class:`~horotopo.params.EngineParams`), one
    one-integer allreduce first asks whether any rank holds either, and the floats go to the
    library as they are when none does: that costs two passes over the buffer and a latency,
    where the keys cost about six passes (16 MiB of float32 at 2 ranks: see
    docs/reductions.md). Below it the keys are cheaper than the extra round trip.
    """

    def __init__(self, transport: Transport, pool: Optional[ScratchPool] = None,
                 params: EngineParams = ENGINE) -> None:
        self.transport = transport
        self.check_first_bytes = params.check_first_bytes
        self.pool = pool or ScratchPool()  # the keys of float min and max
        self.last_messages = 0  # the library's messages are its own; none counted here

    def run(self, src: Any, out: Any, op: str, chunk_elems: Optional[int] = None) -> None:
        """Reduce flat ``src`` into flat ``out`` (``src is out`` for in place).

        ``chunk_elems`` is ignored (the library cuts its own messages); it is there so that
        every allreduce runner of the registry is called alike.
        """
        if op in EXTREMES and is_float_dtype(out.dtype):
            if src.nbytes >= self.check_first_bytes:
                flag = np.array([1 if has_nan_or_negative_zero(src) else 0], dtype=np.int32)
                self.transport.allreduce(flag, flag, "max")
                if not flag[0]:
                    self.transport.allreduce(src, out, op)
                    return
            keys = order_keys(src, op, self.pool)
            self.transport.allreduce(keys, keys, op)
            from_order_keys(keys, out, op)  # the engine makes the NaN canonical
            return
        self.transport.allreduce(src, out, op)
