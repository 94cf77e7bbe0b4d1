"""Tensor fusion: which responses share one engine call, and the buffers they share it in.

Ready allreduces of equal dtype, op and scale factors are packed into one fusion buffer of at
most ``HOROVOD_FUSION_THRESHOLD`` bytes (default 128 MiB) and reduced with one engine call;
broadcasts from the same root are fused the same way (bytes are bytes, so in a uint8 buffer).
Host and device tensors never share a buffer.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import timeline
from ..buffers import array_module
from .records import ALLREDUCE, BROADCAST, REDUCESCATTER, Response

__all__ = ["FusionGroup", "fusion_key", "plan_fusion", "FusionBuffers", "pack", "fuse"]


@dataclass(slots=True)
class FusionGroup:
    """Responses that run as one engine call, in response order, and their bytes."""

    responses: List[Response] = field(default_factory=list)
    nbytes: int = 0

    @property
    def kind(self) -> str:
        return self.responses[0].kind


def fusion_key(resp: Response) -> Optional[Hashable]:
    """What responses must share to be fused with ``resp``; None when it runs alone."""
    if resp.error is not None:
        return None
    sig = resp.sig
    if resp.kind in (ALLREDUCE, REDUCESCATTER):  # both are allreduces to the engine
        return (ALLREDUCE, sig.dtype, sig.op, sig.prescale, sig.postscale, sig.on_host,
                sig.pset)
    if resp.kind == BROADCAST:
        return (BROADCAST, sig.root, sig.on_host, sig.pset)
    return None


def plan_fusion(responses: Sequence[Response], threshold: int
                ) -> List[Union[FusionGroup, Response]]:
    """The responses in execution order, the fusable ones in groups of at most ``threshold``
    bytes (one response alone may be larger). Every rank gets the same groups: the responses
    come in the same order everywhere."""
    buckets: Dict[Hashable, List[FusionGroup]] = OrderedDict()
    order: List[Union[FusionGroup, Response]] = []
    for resp in responses:
        key = fusion_key(resp)
        if key is None:
            order.append(resp)
            continue
        groups = buckets.get(key)
        size = resp.sig.nbytes
        if groups is None or groups[-1].nbytes + size > threshold:
            group = FusionGroup()
            if groups is None:
                groups = buckets[key] = []
            groups.append(group)
            order.append(group)
        group = groups[-1]
        group.responses.append(resp)
        group.nbytes += size
    return order


class FusionBuffers:
    """One reusable fusion buffer per (array module, device, dtype), grown on demand."""

    def __init__(self) -> None:
        self.buffers: Dict[Tuple[str, int, str], Any] = {}

    def get(self, dtype: np.dtype, count: int, like: Any) -> Any:
        """A buffer of ``count`` elements beside ``like`` (host, or ``like``'s device)."""
        xp = array_module(like)
        key = (xp.__name__, int(like.device.id) if xp is not np else -1, dtype.str)
        buf = self.buffers.get(key)
        if buf is None or buf.size < count:
            buf = xp.empty(max(count, 1024), dtype=dtype)
            self.buffers[key] = buf
        return buf[:count]


def pack(buf: Any, arrays: List[Any], into_buffer: bool) -> None:
    """Copy ``arrays`` back to back into ``buf`` (or out of it), casting where dtypes differ.
    ``buf`` and ``arrays`` are all NumPy or all CuPy arrays (on one device)."""
    copyto = array_module(buf).copyto
    offset = 0
    for arr in arrays:
        flat = arr.reshape(-1)
        part = buf[offset:offset + flat.size]
        if into_buffer:
            copyto(part, flat, casting="unsafe")
        else:
            copyto(flat, part, casting="unsafe")
        offset += flat.size


def fuse(tl: Optional[timeline.Timeline], buf: Any, arrays: List[Any], names: List[str],
         into_buffer: bool) -> None:
    """:func:`pack`, shown on the timeline as Horovod's MEMCPY_IN/OUT_FUSION_BUFFER on the
    rows of ``names``."""
    if tl is None:
        pack(buf, arrays, into_buffer)
        return
    tl.begin(names, "MEMCPY_IN_FUSION_BUFFER" if into_buffer else "MEMCPY_OUT_FUSION_BUFFER")
    pack(buf, arrays, into_buffer)
    tl.end(names)
