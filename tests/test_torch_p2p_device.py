"""CUDA tensors through the horotopo backend's send/recv, on the CPU, with a fake device.

A tensor subclass poses as a CUDA tensor (``is_cuda``, ``device``) and fails any host copy
(``numpy``, ``cpu``, ``tolist``, ``to``, ``item``); test_device_plumbing's fake CuPy stands in for
the CuPy view the collectives take of a CUDA tensor, and a recording loop transport stands in
for the runtime's :meth:`~horotopo.api.runtime.Runtime.user_transport`. The tests fail if
send/recv refuse a CUDA tensor, copy it to the host, hand MPI something other than the device
view (CUDA-aware MPI), or skip the staging transport (MPI that is not CUDA-aware); and they
check the stream order: torch's stream finished before the payload is posted, the device's
stream finished before a receive's work is done.

The real thing runs in tests/mpi/test_torch_distributed.py (skipped with "no CUDA device").
"""
import sys
import time
from typing import Any, List

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="horotopo.torch needs torch (the [torch] extra)")

import horotopo.gpu as gpu  # noqa: E402
from horotopo.torch.distributed import p2p  # noqa: E402
from loop_transport import LoopTransport, LoopWorld  # noqa: E402
from test_device_plumbing import LOG, _fake_cupy, ndarray  # noqa: E402


class FakeCuda(torch.Tensor):
    """CPU memory that says it lives on cuda:1 and refuses to be copied to the host."""

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def device(self) -> "torch.device":
        return torch.device("cuda", 1)

    def _host(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a CUDA tensor was copied to the host")

    numpy = cpu = tolist = to = item = _host


def cuda(t: torch.Tensor) -> FakeCuda:
    return torch.Tensor._make_subclass(FakeCuda, t)


def host(t: torch.Tensor) -> torch.Tensor:
    """The values of a fake CUDA tensor, read by the test (not by the code under test)."""
    return t.as_subclass(torch.Tensor).clone()


class RecordingLoop(LoopTransport):
    """A one-rank loop transport that records the array module of every buffer it is given."""

    def __init__(self) -> None:
        super().__init__(LoopWorld(1), 0)
        self.seen: List[tuple] = []

    def user_tags(self) -> range:
        return range(1 << 15, 1 << 20)

    def isend(self, buf, dest, tag):
        self.seen.append(("send", type(buf).__module__))
        LOG.append(("isend", type(buf).__module__))
        return super().isend(buf, dest, tag)

    def irecv(self, buf, source, tag):
        self.seen.append(("recv", type(buf).__module__))
        return super().irecv(buf, source, tag)


class Copier:
    """The staging copies, done at once and logged (the device is NumPy memory here)."""

    def pinned(self, nbytes):
        return np.zeros(nbytes, np.uint8)

    def d2h(self, host_view, dev):
        LOG.append(("d2h", dev.nbytes))
        host_view[...] = np.asarray(dev).view(np.uint8).reshape(-1)

    def h2d(self, dev, host_view):
        LOG.append(("h2d", dev.nbytes))
        np.asarray(dev).view(np.uint8).reshape(-1)[...] = host_view

    def done(self, event):
        return True


class TorchStream:
    def synchronize(self):
        LOG.append(("torch-stream-sync",))


class Runtime:
    def __init__(self, transport):
        self.transport = transport

    def user_transport(self):
        return self.transport


@pytest.fixture
def fake_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    views = []

    def as_cupy_array(x):
        # the zero-copy view of a CUDA tensor: its own memory, typed as a CuPy array
        assert x.is_cuda, "a host tensor was handed over as a device array"
        view = torch.Tensor.numpy(x.as_subclass(torch.Tensor)).view(ndarray)
        views.append(view)
        return view

    monkeypatch.setattr(gpu, "as_cupy_array", as_cupy_array)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: TorchStream())
    monkeypatch.setattr(p2p, "mpi_threads_supported", lambda: True)
    LOG.clear()
    yield views


def _group(monkeypatch, transport, index):
    monkeypatch.setattr(p2p, "runtime", lambda: Runtime(transport))
    return p2p.PointToPoint(index, 0, 1, timeout_s=10.0)


def _wait(work):
    deadline = time.monotonic() + 10
    while not work.is_completed():
        assert time.monotonic() < deadline, "the work did not complete"
        time.sleep(0.001)
    work.wait()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_cuda_aware_send_and_recv_hand_mpi_the_device_memory(fake_device, monkeypatch, dtype):
    loop = RecordingLoop()
    pg = _group(monkeypatch, loop, 0)
    sent = cuda((torch.arange(6) % 3 + 1).to(dtype))
    got = cuda(torch.zeros(6, dtype=dtype))
    recv = pg.recv([got], 0, 5)
    send = pg.send([sent], 0, 5)
    _wait(send)
    _wait(recv)
    assert torch.equal(host(got), host(sent))
    # headers are host int64s; both payloads are the tensors' own memory as CuPy views
    assert loop.seen == [("recv", "numpy"), ("send", "numpy"), ("send", "cupy"),
                         ("recv", "cupy")]
    assert [v.ctypes.data for v in fake_device] == [got.data_ptr(), sent.data_ptr()]
    # torch's stream finishes the tensor before its payload is posted; the receive finishes
    # the device's stream before its work is done; both on the tensors' device
    events = [e for e in LOG if e[0] in ("torch-stream-sync", "isend", "stream-sync")]
    assert events == [("torch-stream-sync",), ("isend", "numpy"), ("isend", "cupy"),
                      ("stream-sync",)]
    assert ("device", 1) in LOG and LOG.count(("device", 1)) == LOG.count(("device-exit", 1))


def test_staged_send_and_recv_copy_through_pinned_memory_only(fake_device, monkeypatch):
    loop = RecordingLoop()
    staged = gpu.StagingTransport(loop, copier=Copier())
    pg = _group(monkeypatch, staged, 1)
    sent = cuda(torch.arange(12, dtype=torch.float64).reshape(3, 4))
    got = cuda(torch.zeros(4, 3, dtype=torch.float64))
    recv = pg.recv([got.t()], 0, 0)  # not contiguous: received into a device copy first
    send = pg.send([sent], 0, 0)
    _wait(send)
    _wait(recv)
    assert torch.equal(host(got).t(), host(sent))
    # MPI (the inner transport) only ever sees pinned host slots; the device memory moves
    # by the staging copies, one each way
    assert [m for _, m in loop.seen] == ["numpy"] * 4
    assert [e for e in LOG if e[0] in ("d2h", "h2d")] == [("d2h", 96), ("h2d", 96)]
    # the receive's staging copy, then the copy into the non-contiguous tensor, are finished
    # before the work is done
    syncs = [e for e in LOG if e[0] in ("h2d", "stream-sync", "torch-stream-sync")]
    assert syncs[-3:] == [("h2d", 96), ("stream-sync",), ("torch-stream-sync",)]


def test_staged_recv_from_any_rank(fake_device, monkeypatch):
    loop = RecordingLoop()
    pg = _group(monkeypatch, gpu.StagingTransport(loop, copier=Copier()), 3)
    sent, got = cuda(torch.arange(3, dtype=torch.int32)), cuda(torch.zeros(3, dtype=torch.int32))
    recv = pg.recv([got], None, 2)  # its header's request is the staging transport's too
    _wait(pg.send([sent], 0, 2))
    _wait(recv)
    assert recv._source_rank() == 0 and torch.equal(host(got), host(sent))
    assert [m for _, m in loop.seen] == ["numpy"] * 3  # irecv_any is not recorded


def test_staged_send_still_waiting_for_its_copy_is_cancelled_without_posting(fake_device):
    class Late(Copier):
        def d2h(self, host_view, dev):
            super().d2h(host_view, dev)
            return "copy in flight"

        def done(self, event):
            return False

    loop = RecordingLoop()
    staged = gpu.StagingTransport(loop, copier=Late())
    req = staged.isend(np.ones(2).view(ndarray), 0, 3)
    assert loop.seen == [] and not staged.test(req)
    staged.cancel(req)
    assert not staged.test(req) and loop.seen == []  # dropped: never posted


def test_only_cpu_and_cuda_tensors_travel(fake_device, monkeypatch):
    pg = _group(monkeypatch, RecordingLoop(), 2)
    with pytest.raises(NotImplementedError, match="send of a meta tensor: .*CPU and CUDA"):
        pg.send([torch.ones(1, device="meta")], 0, 0)


def test_a_runtime_that_has_not_started_lends_no_transport(monkeypatch):
    from horotopo.api.runtime import Runtime

    rt = Runtime()  # its background thread never started: no set-up, no transport
    monkeypatch.setattr(p2p, "runtime", lambda: rt)
    monkeypatch.setattr(p2p, "mpi_threads_supported", lambda: True)
    with pytest.raises(RuntimeError, match="send on the horotopo backend: .*shut down, or "
                                           "never started"):
        p2p.PointToPoint(4, 0, 1, 1.0).send([torch.ones(1)], 0, 0)
