"""StagingTransport: the engine's transport for device buffers when MPI is not CUDA-aware.

A transport decorator: the GPU package sits above the transport (it imports
:mod:`horotopo.transport.base`, never the other way). Kept apart from staging.py so that
``import horotopo.gpu`` does not load the transport; ``horotopo.gpu.StagingTransport`` imports
this lazily.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..transport.base import Transport, WrappedTransport
from .staging import CupyCopier


class _Staged:
    """A request of :class:`StagingTransport`: a plain inner request, or a staged one."""

    __slots__ = ("inner", "kind", "event", "host", "view", "dev", "post", "done")

    def __init__(self, kind: str, inner: Any = None, event: Any = None, host: Any = None,
                 view: Any = None, dev: Any = None, post: Optional[Callable[[], Any]] = None):
        self.kind, self.inner, self.event = kind, inner, event
        self.host, self.view, self.dev, self.post = host, view, dev, post
        self.done = False


def _size_class(nbytes: int) -> int:
    # Power-of-two slot sizes (at least 64 KiB) let chunks of slightly different sizes share.
    return max(1 << 16, 1 << max(0, int(nbytes - 1).bit_length()))


class StagingTransport(WrappedTransport):
    """A transport that stages device buffers through pinned host memory; host buffers pass.

    Wraps any :class:`horotopo.transport.Transport` (``inner``) for an MPI that is not
    CUDA-aware, so the engine and the algorithms run unchanged on CuPy buffers::

        transport = as_transport(comm)
        if not gpu.cuda_aware(comm):
            transport = gpu.StagingTransport(transport)
        engine = Engine(transport, plan)

    - ``isend(device_buf)`` queues the device-to-host copy into a pinned slot on a copy stream
      (ordered after the work already queued on the current stream) and returns at once; the
      MPI send is posted when the copy has finished, noticed by ``test``/``waitsome``. So the
      copy of chunk k+1 runs while MPI moves chunk k. Sends are posted in the order they were
      made, which keeps MPI's non-overtaking order per (peer, tag).
    - ``irecv(device_buf)`` receives into a pinned slot; on completion the host-to-device copy
      is queued and the current stream is made to wait for it, so a reduce launched after the
      completion is reported sees the data without a host synchronize.
    - Pinned slots are pooled by size class and reused once their send completed or their copy
      to the device finished. The pool grows instead of blocking (a blocked isend could wait on
      a peer that waits on us), bounded by the engine's window of chunks in flight.

    Parameters
    ----------
    inner : Transport
        The transport that moves host bytes.
    copier : object, optional
        As for :class:`Stager`; the default :class:`CupyCopier` is made on the first device
        buffer, so a CPU-only run never imports cupy.
    is_device : callable, optional
        Which buffers to stage; default :func:`horotopo.gpu.is_gpu_buffer`.
    """

    def __init__(self, inner: Any, copier: Optional[Any] = None,
                 is_device: Optional[Callable[[Any], bool]] = None) -> None:
        from .env import is_gpu_buffer

        super().__init__(inner, owns=True)
        self._copier = copier
        self._is_device = is_device or is_gpu_buffer
        self._free: dict = {}
        self._unloading: List[tuple] = []  # (event, slot) for host-to-device copies in flight
        self._deferred: List[_Staged] = []  # sends in posting order, waiting for their copy
        self.staged_bytes = 0

    # -- pinned slots -------------------------------------------------------------------------
    @property
    def copier(self) -> Any:
        if self._copier is None:
            self._copier = CupyCopier()
        return self._copier

    def _slot(self, nbytes: int) -> np.ndarray:
        still = []
        for event, slot in self._unloading:
            if self.copier.done(event):
                self._free.setdefault(slot.size, []).append(slot)
            else:
                still.append((event, slot))
        self._unloading = still
        size = _size_class(nbytes)
        pool = self._free.get(size)
        return pool.pop() if pool else self.copier.pinned(size)

    def _release(self, slot: np.ndarray) -> None:
        self._free.setdefault(slot.size, []).append(slot)

    # -- messages -----------------------------------------------------------------------------
    def isend(self, buf: Any, dest: int, tag: int) -> _Staged:
        if not self._is_device(buf):
            req = _Staged("send", post=lambda: self.inner.isend(buf, dest, tag))
        else:
            host = self._slot(buf.nbytes)
            view = host[:buf.nbytes]
            event = self.copier.d2h(view, buf)
            self.staged_bytes += buf.nbytes
            req = _Staged("send", event=event, host=host, view=view,
                          post=lambda: self.inner.isend(view, dest, tag))
        if not self._deferred and req.event is None:
            req.inner, req.post = req.post(), None
        else:
            self._deferred.append(req)
        self._post_ready()
        return req

    def irecv(self, buf: Any, source: int, tag: int) -> _Staged:
        return self._recv(buf, lambda into: self.inner.irecv(into, source, tag))

    def irecv_any(self, buf: Any, tag: int) -> _Staged:
        # Wrapped like irecv: test, waitsome and cancel take this transport's requests only.
        return self._recv(buf, lambda into: self.inner.irecv_any(into, tag))

    def _recv(self, buf: Any, post: Callable[[Any], Any]) -> _Staged:
        if not self._is_device(buf):
            return _Staged("plain", inner=post(buf))
        host = self._slot(buf.nbytes)
        view = host[:buf.nbytes]
        self.staged_bytes += buf.nbytes
        return _Staged("recv", inner=post(view), host=host, view=view, dev=buf)

    def _post_ready(self) -> None:
        # Post deferred sends strictly in order: a later one never overtakes an earlier one.
        while self._deferred:
            req = self._deferred[0]
            if req.event is not None:
                if not self.copier.done(req.event):
                    return
                req.event = None
            req.inner, req.post = req.post(), None
            self._deferred.pop(0)

    def _finish(self, req: _Staged) -> None:
        # The inner request has completed.
        req.done = True
        if req.kind == "recv":
            event = self.copier.h2d(req.dev, req.view)
            self._unloading.append((event, req.host))
        elif req.host is not None:
            self._release(req.host)
        req.host = req.view = req.dev = None

    def test(self, request: _Staged) -> bool:
        if request.done:
            return True
        self._post_ready()
        if request.inner is None or not self.inner.test(request.inner):
            return False
        self._finish(request)
        return True

    def cancel(self, request: _Staged) -> None:
        """Give up on ``request`` after a timeout: cancel it in the inner transport once
        posted; a send still waiting for its copy is never posted (the inner transport would
        not know its wrapper, so the inherited cancel could not reach it)."""
        if request.done:
            return
        if request.inner is not None:
            self.inner.cancel(request.inner)
        elif request in self._deferred:
            self._deferred.remove(request)

    def waitsome(self, requests: Sequence[_Staged]) -> List[int]:
        while True:
            self._post_ready()
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            posted = [i for i, r in enumerate(requests) if r.inner is not None]
            if len(posted) == len(requests) and not self._deferred:
                # Nothing waits on a copy: block in the inner transport.
                idx = self.inner.waitsome([requests[i].inner for i in posted])
                for j in idx:
                    self._finish(requests[posted[j]])
                return sorted(posted[j] for j in idx)
            # Some send waits for its copy: poll MPI (which drives its progress) and the copy.
            for i in posted:
                if self.inner.test(requests[i].inner):
                    self._finish(requests[i])
            if not any(r.done for r in requests) and self._deferred and not posted:
                self.copier.wait(self._deferred[0].event)

    def waitall(self, requests: Sequence[_Staged]) -> None:
        pending = [r for r in requests if not r.done]
        while pending:
            self.waitsome(pending)
            pending = [r for r in pending if not r.done]

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: str) -> None:
        """The inner library allreduce, through host copies when the buffers are on a device."""
        if not self._is_device(recvbuf):
            self.inner.allreduce(sendbuf, recvbuf, op)
            return
        host_recv = self.copier.to_numpy(recvbuf)
        host_send = host_recv if sendbuf is recvbuf else self.copier.to_numpy(sendbuf)
        self.inner.allreduce(host_send, host_recv, op)
        self.copier.from_numpy(recvbuf, host_recv)


def staging_if_needed(transport: Any) -> Any:
    """``transport``, wrapped in :class:`StagingTransport` when device buffers need staging.

    Collective over the transport's communicator. One tiny allreduce decides whether any rank
    has a CUDA device; only then is CUDA-awareness asked (:func:`cuda_aware`, itself collective),
    so CPU-only jobs pay one 4-byte allreduce and never import cupy where it is absent.
    """
    comm = getattr(transport, "comm", None)
    if comm is None or isinstance(transport, StagingTransport):
        return transport
    needs = _STAGING_DECIDED.get(transport)
    if needs is None:
        needs = _needs_staging(transport, comm)
        _STAGING_DECIDED[transport] = needs
    # A fresh wrapper per caller: a StagingTransport keeps per-call state (its pinned slots),
    # and the runtime lends the engine's transport to user threads as well.
    return StagingTransport(transport) if needs else transport


# The decision per transport, so that a second caller on the same transport (the runtime
# decides for user point-to-point traffic, then its engine asks again) costs no collective.
# Every rank makes its first call on a transport at the same point, so every rank caches the
# same answer and later calls stay in step without communicating.
_STAGING_DECIDED: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _needs_staging(transport: Any, comm: Any) -> bool:
    from .env import device_status
    from .awareness import cuda_aware

    any_device = np.array([1 if device_status()[0] else 0], dtype=np.int32)
    transport.allreduce_control(any_device, "max")
    return bool(any_device[0]) and not cuda_aware(comm)


def transport_for(comm_or_transport: Any) -> Tuple[Transport, bool]:
    """The transport an engine runs on, chosen once at its set-up; and whether it owns it.

    A communicator becomes an :class:`~horotopo.transport.MPITransport` on a duplicate (owned:
    the engine closes it); a :class:`~horotopo.transport.Transport` is used as given (the
    caller keeps owning it). Either is then wrapped in :class:`StagingTransport` when device
    buffers need staging (:func:`staging_if_needed`, collective), so the engine's per-call
    code never asks. Every rank must call it, in the same order as its other collectives.

    Returns
    -------
    (Transport, bool)
        The transport, and True when the caller must close it (it made the duplicate).
    """
    owns = not isinstance(comm_or_transport, Transport)
    if owns:
        # Only a communicator needs the MPI door; a given Transport (a simulator's) does not.
        from ..transport.mpi import as_transport

        transport = as_transport(comm_or_transport)
    else:
        transport = comm_or_transport
    try:
        return staging_if_needed(transport), owns
    except Exception:
        if owns:
            transport.close()
        raise
