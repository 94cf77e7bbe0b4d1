"""Staging device chunks through pinned host memory, for MPI libraries that are not CUDA-aware.

A :class:`Stager` owns a few pinned host slots (two by default: double buffering) and a copy
stream. Each slot is reused only when the MPI request that reads or fills it has completed and
its copy has finished, so a chunk in flight is never overwritten.

The engine itself needs none of this: it wraps its transport in
:class:`horotopo.gpu.StagingTransport` (horotopo/gpu/transport.py), which stages every device
message. A Stager is for code that moves a linear stream of chunks itself; ``wait`` completes
one request of whatever transport posts them::

    st = Stager(max_chunk_bytes, wait=lambda req: transport.waitall([req]))

    # Sending device chunks: the device-to-host copy of chunk k+1 runs while chunk k is sent.
    reqs = st.send(dev_chunks, lambda k, host: transport.isend(wire_view(host), peer, tag + k))
    ...                                    # other work; the slots stay busy until then
    st.drain()                             # before the device chunks or the stager are reused

    # Receiving into device chunks: the receive of chunk k+1 is posted while chunk k is copied
    # to the device. Each k is yielded once its host-to-device copy is queued on the copy
    # stream, ordered before later work on the current stream, so a reduce launched there
    # sees the data.
    for k in st.receive(scratch_chunks, lambda k, host: transport.irecv(wire_view(host), peer,
                                                                           tag + k)):
        reduce_into(dst_chunks[k], scratch_chunks[k], op)
    st.drain()

The lower-level :meth:`to_host`, :meth:`host`, :meth:`hold`, :meth:`recv_slot` and
:meth:`to_device` build other schedules (a rank that receives from one peer while it sends to
another). Device chunks must be contiguous. The copies need no extra synchronize: they are
ordered after the work already queued on the current stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence

import numpy as np

from .. import config
from .env import cupy_module

_H2D = 1  # cudaMemcpyHostToDevice
_D2H = 2  # cudaMemcpyDeviceToHost


class CupyCopier:
    """Pinned allocation and asynchronous copies with CuPy, on a private non-blocking stream."""

    def __init__(self) -> None:
        self.cp = cupy_module()
        self.stream = self.cp.cuda.Stream(non_blocking=True)

    def pinned(self, nbytes: int) -> np.ndarray:
        try:
            import cupyx

            return cupyx.empty_pinned((max(nbytes, 1),), dtype=np.uint8)
        except (ImportError, AttributeError):
            mem = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1))
            # np.frombuffer keeps `mem` alive through the array's base.
            return np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 1))

    @staticmethod
    def _check(dev: Any, host: np.ndarray) -> None:
        # A raw memcpy of a strided view would move the wrong bytes: refuse, never guess.
        if not dev.flags.c_contiguous or not host.flags.c_contiguous:
            raise ValueError("staged device chunks must be C-contiguous")
        if host.nbytes < dev.nbytes:
            raise ValueError(f"host slot of {host.nbytes} bytes for {dev.nbytes} bytes of data")

    def _after_current(self) -> None:
        # The copy must see every kernel already queued on the caller's stream.
        self.stream.wait_event(self.cp.cuda.get_current_stream().record())

    def d2h(self, host: np.ndarray, dev: Any) -> Any:
        self._check(dev, host)
        self._after_current()
        self.cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, dev.nbytes, _D2H,
                                         self.stream.ptr)
        return self.stream.record()

    def h2d(self, dev: Any, host: np.ndarray) -> Any:
        self._check(dev, host)
        self._after_current()
        self.cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, dev.nbytes, _H2D,
                                         self.stream.ptr)
        event = self.stream.record()
        # Later work on the caller's stream (the reduce) waits for the data, not the host.
        self.cp.cuda.get_current_stream().wait_event(event)
        return event

    def wait(self, event: Any) -> None:
        event.synchronize()

    def done(self, event: Any) -> bool:
        return bool(event.done)

    def to_numpy(self, dev: Any) -> np.ndarray:
        self.cp.cuda.get_current_stream().synchronize()
        return self.cp.asnumpy(dev)

    def from_numpy(self, dev: Any, host: np.ndarray) -> None:
        dev.set(host)
        self.cp.cuda.get_current_stream().synchronize()


def _default_wait(request: Any) -> None:
    if hasattr(request, "Wait"):
        request.Wait()
    else:
        request.wait()


@dataclass
class _Slot:
    host: np.ndarray
    event: Any = None
    request: Any = None
    #: A receive landed (or will land) here and has not been copied to the device yet.
    loaded: bool = False


@dataclass
class Staged:
    """One chunk in a pinned slot: ``view`` is its host image (valid after :meth:`Stager.host`)."""

    slot: _Slot
    view: np.ndarray


class Stager:
    """Pinned host slots for staging device chunks.

    Parameters
    ----------
    chunk_bytes : int
        The largest chunk, in bytes, that will pass through a slot.
    slots : int
        Number of pinned slots (default :attr:`horotopo.params.EngineParams.staging_slots` as
        the environment sets it: 2, double buffering).
    wait : callable, optional
        Completes one MPI request (default: ``request.Wait()`` or ``request.wait()``).
    copier : object, optional
        Provides pinned(), d2h(), h2d(), wait(); default :class:`CupyCopier`. Tests pass a fake.
    """

    def __init__(self, chunk_bytes: int, slots: Optional[int] = None,
                 wait: Optional[Callable] = None,
                 copier: Optional[Any] = None) -> None:
        if slots is None:
            slots = config.engine_params().staging_slots
        if chunk_bytes < 0 or slots < 1:
            raise ValueError(f"need chunk_bytes >= 0 and slots >= 1, got {chunk_bytes}, {slots}")
        self.chunk_bytes = int(chunk_bytes)
        self.copier = copier if copier is not None else CupyCopier()
        self._wait = wait or _default_wait
        self._slots = [_Slot(self.copier.pinned(self.chunk_bytes)) for _ in range(slots)]
        self._next = 0

    def _free(self, slot: _Slot) -> None:
        if slot.request is not None:
            self._wait(slot.request)
            slot.request = None
        if slot.event is not None:
            self.copier.wait(slot.event)
            slot.event = None

    def _acquire(self, dev: Any) -> Staged:
        if dev.nbytes > self.chunk_bytes:
            raise ValueError(f"chunk of {dev.nbytes} bytes exceeds the stager's slot size "
                             f"{self.chunk_bytes}")
        slot = self._slots[self._next]
        if slot.loaded:
            # Reusing it would drop a received chunk: the caller interleaved schedules on one
            # stager in an order it cannot serve. Use one stager per stream of chunks.
            raise RuntimeError("stager slot still holds a received chunk that was not copied "
                               "to the device (call to_device first)")
        self._next = (self._next + 1) % len(self._slots)
        self._free(slot)
        view = slot.host[:dev.nbytes].view(np.dtype(dev.dtype)).reshape(dev.shape)
        return Staged(slot, view)

    def to_host(self, dev: Any) -> Staged:
        """Start copying a device chunk into the next free slot; returns without waiting."""
        staged = self._acquire(dev)
        staged.slot.event = self.copier.d2h(staged.view, dev)
        return staged

    def host(self, staged: Staged) -> np.ndarray:
        """The host copy of a chunk from :meth:`to_host`, once its copy has finished."""
        if staged.slot.event is not None:
            self.copier.wait(staged.slot.event)
            staged.slot.event = None
        return staged.view

    def hold(self, staged: Staged, request: Any) -> None:
        """Mark the slot busy until ``request`` (the send or receive using it) completes."""
        staged.slot.request = request

    def recv_slot(self, dev: Any) -> Staged:
        """A free slot shaped like ``dev``, for a receive that :meth:`to_device` will unload."""
        staged = self._acquire(dev)
        staged.slot.loaded = True
        return staged

    def to_device(self, staged: Staged, dev: Any) -> None:
        """Wait for the slot's receive, then queue its copy into ``dev`` (asynchronous)."""
        if staged.slot.request is not None:
            self._wait(staged.slot.request)
            staged.slot.request = None
        staged.slot.event = self.copier.h2d(dev, staged.view)
        staged.slot.loaded = False

    def send(self, dev_chunks: Sequence[Any], isend: Callable[[int, np.ndarray], Any]) -> List:
        """Send device chunks in order through the slots; returns the requests, still pending.

        ``isend(k, host_view)`` posts the send of chunk k. The copy of chunk k+1 to the host is
        started right after chunk k's send is posted, so the two overlap.
        """
        requests: List[Any] = []
        if not dev_chunks:
            return requests
        nxt = self.to_host(dev_chunks[0])
        for k in range(len(dev_chunks)):
            cur = nxt
            req = isend(k, self.host(cur))
            self.hold(cur, req)
            requests.append(req)
            if k + 1 < len(dev_chunks):
                nxt = self.to_host(dev_chunks[k + 1])
        return requests

    def receive(self, dev_chunks: Sequence[Any],
                irecv: Callable[[int, np.ndarray], Any]) -> Iterator[int]:
        """Receive chunks into device arrays; yields k once chunk k's device copy is queued.

        ``irecv(k, host_view)`` posts the receive of chunk k. Up to one receive per slot is
        posted ahead, so chunk k+1 arrives while chunk k is copied to the device and reduced.
        """
        n = len(dev_chunks)
        posted: List[Staged] = []
        ahead = min(len(self._slots), n)
        for k in range(ahead):
            staged = self.recv_slot(dev_chunks[k])
            self.hold(staged, irecv(k, staged.view))
            posted.append(staged)
        for k in range(n):
            staged = posted[k]
            self.to_device(staged, dev_chunks[k])
            yield k
            nxt = k + ahead
            if nxt < n:
                staged = self.recv_slot(dev_chunks[nxt])
                self.hold(staged, irecv(nxt, staged.view))
                posted.append(staged)

    def drain(self) -> None:
        """Complete every pending request and copy; afterwards every slot is free."""
        for slot in self._slots:
            self._free(slot)
            slot.loaded = False

