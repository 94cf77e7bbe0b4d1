"""DDP communication hooks that reduce DDP's gradient buckets along horotopo's trees.

For jobs that keep gloo or NCCL as their process group::

    model.register_comm_hook(hook_state(), allreduce_hook)

DDP hands each bucket to the hook; the hook averages it over horotopo's ranks with an
asynchronous horotopo allreduce and returns a future of the averaged bucket. As torch's own
``allreduce_hook``, it divides by the number of ranks before it sums, which is also what
DDP does without a hook, so the hook's gradients are the process group's (bit for bit where
the sums are exact). The compressing variants reduce a float16 or bfloat16 copy of the
bucket, as torch's ``fp16_compress_hook`` and ``bf16_compress_hook`` do; their names differ
from torch's because DDP refuses any hook named ``bf16_compress_hook`` without NCCL.
"""
# No ``from __future__ import annotations`` here: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and torch.futures.Future[torch.Tensor] themselves, which a
# string annotation never equals.
import itertools
import threading
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from ...api.basics import is_initialized, size as hvd_size
from ...api.ops import Sum
from .. import collectives as hvd_ops
from .completion import submit

__all__ = ["HookState", "hook_state", "allreduce_hook", "float16_compress_hook",
           "bfloat16_compress_hook"]

_state_ids = itertools.count()


@dataclass
class HookState:
    """What the hooks of one DDP model share: the prefix of their collectives' names and the
    count that orders them (every rank reduces the buckets in the same order)."""

    prefix: str
    _seq: Iterator[int] = field(default_factory=itertools.count, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_name(self, bucket: dist.GradBucket) -> str:
        with self._lock:
            return f"{self.prefix}.{next(self._seq)}.bucket{bucket.index()}"


def hook_state(process_group: Optional[dist.ProcessGroup] = None) -> HookState:
    """The state for :func:`allreduce_hook` and the compressing hooks of one DDP model.

    Starts horotopo if it does not run yet (collective over the MPI job).

    Parameters
    ----------
    process_group : ProcessGroup, optional
        The DDP model's group, checked to span horotopo's ranks: the hooks reduce over all of
        them (horotopo has no process sets).

    Raises
    ------
    ValueError
        ``process_group`` has another number of ranks than horotopo.
    """
    from ... import torch as hvd

    if not is_initialized():
        hvd.init()
    if process_group is not None and process_group.size() != hvd_size():
        raise ValueError(f"the DDP model's process group has {process_group.size()} ranks, "
                         f"horotopo runs on {hvd_size()}: horotopo's hooks reduce over all "
                         f"of its ranks")
    return HookState(prefix=f"torch.ddp{next(_state_ids)}")


def _average(state: HookState, bucket: dist.GradBucket,
             tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    # Divide first, then sum: the order DDP uses without a hook, and torch's hooks too.
    tensor.div_(hvd_size())
    handle = hvd_ops.allreduce_async_(tensor, name=state.next_name(bucket), op=Sum)
    return submit(lambda: hvd_ops.synchronize(handle))


def allreduce_hook(state: HookState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over horotopo's ranks, in place; a future of the bucket's buffer."""
    return _average(state, bucket, bucket.buffer())


def _compressed(state: HookState, bucket: dist.GradBucket,
                dtype: torch.dtype) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    compressed = buffer.to(dtype)
    reduced = _average(state, bucket, compressed)

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value())
        return buffer
    return reduced.then(decompress)


def float16_compress_hook(state: HookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`allreduce_hook` on a float16 copy of the bucket (half the bytes on the wire)."""
    return _compressed(state, bucket, torch.float16)


def bfloat16_compress_hook(state: HookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`allreduce_hook` on a bfloat16 copy of the bucket (float32's range, half its
    bytes)."""
    return _compressed(state, bucket, torch.bfloat16)
