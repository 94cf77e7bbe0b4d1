"""torch.distributed's ``send``/``recv`` on the horotopo backend, over the runtime's transport.

The messages travel on the transport of horotopo's engine (the one the collectives use), with
tags from its :meth:`~horotopo.transport.base.Transport.user_tags`, a range that
``alloc_tags`` never hands out, so a user's message can never match a collective's. The range
is cut into one block per process group (groups are created in the same order on every rank,
as their collective names already assume) and, in a block, two tags per torch tag:

- the *header* (int64: sender's rank, byte count, dtype code), posted when ``send`` is called,
  and received by a receive posted when ``recv`` is called, so receives match messages in the
  order they were posted, as MPI's (and gloo's) do;
- the *payload* (the tensor's bytes, sent from the tensor itself), received once the header
  has come: from the header's sender, so ``recv`` from any source learns who sent (torch's
  ``recv(src=None)`` returns it), and into the tensor only after the byte count and dtype
  were checked (a mismatch is an error naming both sides, not a truncated or reinterpreted
  tensor). For one sender the payload receives are posted in the order in which that
  sender's headers matched the receives, so every payload meets its own header
  (:mod:`.p2p_progress`, whose thread completes these works in any order).

The transport is the runtime's :meth:`~horotopo.api.runtime.Runtime.user_transport`: the
engine's, below its link tracking. CPU tensors travel from their own memory; CUDA tensors take
the collectives' device path: the payload is a CuPy view of the tensor
(:func:`horotopo.torch.tensors.array_of`, never a host copy), handed to MPI directly where MPI
is CUDA-aware and staged through pinned host memory by the runtime's
:class:`~horotopo.gpu.StagingTransport` where it is not. A send waits for torch's stream to
finish the tensor before MPI or the staging copy reads it; a receive finishes the device's
stream work (the staging copy, a copy into a non-contiguous tensor) before its work is done.

The messages are posted from the user's thread and the progress thread, beside the runtime's
background thread, so MPI must be at ``MPI_THREAD_MULTIPLE`` (mpi4py's default). Each wait
ends at the process group's timeout (``init_process_group(timeout=...)``) with an error that
names the peer.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np
import torch

from ...api.basics import mpi_threads_supported, runtime
from ...buffers import device_scope, synchronize
from ...transport.base import Transport
from ..tensors import array_of, settled
from .completion import HorotopoWork
from .p2p_progress import RecvOp, SendOp, posting, start

__all__ = ["PointToPoint", "DTYPES", "TAGS_PER_GROUP"]

#: The dtypes a message may carry; a header names one by its place here (every rank runs the
#: same code, so the places agree).
DTYPES: Tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.uint16, torch.uint32,
    torch.uint64)
_CODE = {d: k for k, d in enumerate(DTYPES)}

#: torch tags per process group (0 .. TAGS_PER_GROUP - 1); fewer where the transport's user
#: tag range is small (MPI guarantees only 32767 tags, half of which are the users').
TAGS_PER_GROUP = 1 << 16
_HEADER = 3  # int64s: sender, nbytes, dtype code

#: The devices whose tensors travel (on the collectives' path; see the module's notes).
DEVICES = ("cpu", "cuda")


def _p2p_error(what: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"the horotopo backend cannot run {what}: {why}")


def _bytes_of(tensor: torch.Tensor) -> Any:
    """The bytes of a contiguous tensor as the runtime's array, a view and never a copy: NumPy
    for a CPU tensor, CuPy for a CUDA one (as the collectives hand tensors to the engine)."""
    return array_of(tensor.detach().reshape(-1).view(torch.uint8), reduced=False)


def _describe(nbytes: int, code: int) -> str:
    name = str(DTYPES[code]).replace("torch.", "") if 0 <= code < len(DTYPES) else "?"
    size = torch.empty((), dtype=DTYPES[code]).element_size() if name != "?" else 1
    return f"{nbytes // size} {name} elements ({nbytes} bytes)"


class PointToPoint:
    """One process group's send and recv (see the module's notes for the wire protocol).

    Parameters
    ----------
    group_index : int
        The group's place in the order of horotopo groups (the same on every rank).
    rank, size : int
        This rank and the group's size (the job's: horotopo groups span every rank).
    timeout_s : float
        How long a send or receive may wait for its peer.
    """

    def __init__(self, group_index: int, rank: int, size: int, timeout_s: float) -> None:
        self.group_index, self.rank, self.size = group_index, rank, size
        self.timeout_s = float(timeout_s)
        self._transport: Optional[Transport] = None
        self._base = 0
        self.tags = 0

    # ------------------------------------------------------------------ set-up

    def _open(self, what: str) -> Transport:
        """The engine's transport and this group's tag block (found at the first message)."""
        if self._transport is not None:
            return self._transport
        if not mpi_threads_supported():
            raise _p2p_error(what, "MPI is not at MPI_THREAD_MULTIPLE, and point-to-point "
                                   "messages are sent beside the runtime's background thread "
                                   "(mpi4py asks for MPI_THREAD_MULTIPLE unless "
                                   "mpi4py.rc.thread_level says otherwise)")
        try:
            transport = runtime().user_transport()
        except RuntimeError as exc:
            raise RuntimeError(f"{what} on the horotopo backend: {exc}") from None
        space = transport.user_tags()
        per_group = min(TAGS_PER_GROUP, len(space) // 32)  # >= 16 groups of tags
        if per_group < 1:
            raise _p2p_error(what, f"its transport ({type(transport).__name__}) has no tags "
                                   f"for users' messages")
        groups = len(space) // (2 * per_group)
        if self.group_index >= groups:
            raise _p2p_error(what, f"this is horotopo process group #{self.group_index}, and "
                                   f"the transport's tags suffice for send/recv on the first "
                                   f"{groups} groups only")
        self._base = space.start + self.group_index * 2 * per_group
        self.tags = per_group
        self._transport = transport
        return transport

    def _wire_tags(self, tag: int, what: str) -> Tuple[int, int]:
        if not 0 <= int(tag) < self.tags:
            raise ValueError(f"{what}: tag {tag} is out of range; the horotopo backend takes "
                             f"tags 0..{self.tags - 1}")
        header = self._base + 2 * int(tag)
        return header, header + 1

    def _check_call(self, tensors: List[torch.Tensor], peer: Optional[int],
                    what: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"the horotopo backend's {what} takes one tensor, got "
                             f"{len(tensors)}")
        tensor = tensors[0]
        if tensor.device.type not in DEVICES:
            raise _p2p_error(f"{what} of a {tensor.device.type} tensor",
                             "its point-to-point messages carry CPU and CUDA tensors only")
        if tensor.dtype not in _CODE:
            raise _p2p_error(f"{what} of {tensor.dtype}",
                             f"messages carry {', '.join(str(d) for d in DTYPES)}")
        if peer is not None and not 0 <= peer < self.size:
            raise ValueError(f"{what}: rank {peer} is not in the group of {self.size} ranks")
        return tensor

    # ------------------------------------------------------------------ send

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> HorotopoWork:
        """Start sending ``tensors[0]`` to ``dst`` with ``tag``; the work ends when it is sent.

        Raises
        ------
        ValueError
            More than one tensor, a rank outside the group or a tag outside the range.
        NotImplementedError
            A tensor on neither the CPU nor a CUDA device, a dtype without a code, or MPI
            below ``MPI_THREAD_MULTIPLE``.
        """
        what = f"send to rank {dst} (tag {tag})"
        tensor = self._check_call(list(tensors), dst, "send")
        t = self._open("send")
        header_tag, payload_tag = self._wire_tags(tag, what)
        # A copy only if it is not contiguous (on the tensor's device), kept alive until sent.
        data = tensor.detach().contiguous()
        # torch's stream finishes writing the tensor before MPI or the staging copy reads it.
        payload = settled(_bytes_of(data), data)
        header = np.array([self.rank, payload.nbytes, _CODE[data.dtype]], dtype=np.int64)
        like = payload if data.is_cuda else None
        # Posting and submitting are one step, so that threads calling send or recv at once
        # cannot split a send's header from its payload or post receives in an order the
        # progress thread does not follow.
        with posting, device_scope(like):
            requests = [t.isend(header, dst, header_tag), t.isend(payload, dst, payload_tag)]
            op = SendOp(t, t.now() + self.timeout_s, self._late(what), dst, requests,
                        keep=(header, payload, data), value=[tensor], like=like)
            return HorotopoWork(start(op))

    # ------------------------------------------------------------------ recv

    def recv(self, tensors: List[torch.Tensor], src: Optional[int], tag: int) -> HorotopoWork:
        """Start receiving into ``tensors[0]`` from ``src`` (None: from any rank) with ``tag``.

        The work's ``_source_rank()`` is the sender's rank once it is done.

        Raises
        ------
        ValueError
            As :meth:`send`; and, from ``wait()``, a message whose byte count or dtype is not
            the tensor's (naming both).
        NotImplementedError
            As :meth:`send`.
        """
        what = (f"recv from rank {src}" if src is not None else "recv from any rank") + \
            f" (tag {tag})"
        tensor = self._check_call(list(tensors), src, "recv")
        t = self._open("recv")
        header_tag, payload_tag = self._wire_tags(tag, what)
        header = np.zeros(_HEADER, dtype=np.int64)
        into = tensor if tensor.is_contiguous() else torch.empty_like(
            tensor, memory_format=torch.contiguous_format)
        want = _bytes_of(into)
        like = want if tensor.is_cuda else None
        code = _CODE[tensor.dtype]
        work = _RecvWork()
        errors: List[str] = []

        def payload_buffer(sender: int, nbytes: int, sent_code: int) -> Any:
            work.source = sender
            if nbytes == want.nbytes and sent_code == code:
                return want
            # A payload of another size still has to be taken off the wire (into a scratch
            # buffer), or it would meet the next receive from that sender.
            errors.append(f"{what}: rank {sender} sent {_describe(nbytes, sent_code)}, the "
                          f"receiving tensor holds {_describe(want.nbytes, code)}")
            return np.empty(nbytes, dtype=np.uint8)

        def done() -> List[torch.Tensor]:
            # Runs on the progress thread with the tensor's device current.
            if errors:
                raise ValueError(errors[0])
            # The payload is in device memory only once the stream that the staging copy was
            # queued on has run it (the runtime finishes a collective's stream work likewise).
            synchronize(want)
            if into is not tensor:
                with torch.no_grad():
                    tensor.copy_(into)
                settled(None, tensor)  # the copy, on this thread's stream, before wait() ends
            return [tensor]

        with posting, device_scope(like):
            first = (t.irecv(header, src, header_tag) if src is not None
                     else t.irecv_any(header, header_tag))
            work.attach(start(RecvOp(t, t.now() + self.timeout_s, self._late(what), src, first,
                                     header, payload_tag, header_tag, payload_buffer, done,
                                     like=like)))
        return work

    def _late(self, what: str) -> str:
        return (f"torch.distributed {what} on the horotopo backend: the peer did not match it "
                f"within the process group's timeout of {self.timeout_s:g} s")


class _RecvWork(HorotopoWork):
    """A receive's work: knows its sender once done (torch's ``recv(src=None)`` asks)."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # attached right after
        self.source = -1

    def attach(self, future: torch.futures.Future) -> None:
        self._future = future

    def _source_rank(self) -> int:
        self.wait()
        return self.source
