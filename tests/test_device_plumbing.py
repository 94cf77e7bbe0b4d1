"""Device arrays through the API front end and the runtime, on the CPU, with a fake CuPy.

The fake ("cupy" in sys.modules) is NumPy memory in an ndarray subclass whose type says cupy,
a device that records when it is made current, and a stream and events that record waits. It
checks the plumbing that a GPU run relies on and that CPU-only CI can still break:

- a CuPy array reaches the engine as a device array, never as a host copy (the fake has no
  ``asnumpy`` and ``get``: any host staging raises);
- fusion buffers are allocated by the array's own module, one per device, never shared with
  host tensors;
- the caller's ready event is waited on before the engine sees the data, the device is current
  while the engine runs, and the stream is synchronized before the handle resolves.

The real thing runs in tests/mpi/test_gpu_api_mpi.py (skipped with "no CUDA device" here).
"""
import sys
import types

import numpy as np
import pytest

import horotopo.gpu as gpu
from horotopo.api import arrays, process_sets
from horotopo.api.process_sets import SetTable
from horotopo.api.records import Response
from horotopo.api.runtime import ALLGATHER, ALLREDUCE, BROADCAST
from test_api import Harness, RecordingEngine

LOG = []


class FakeDevice:
    def __init__(self, id):
        self.id = id

    def __enter__(self):
        LOG.append(("device", self.id))
        return self

    def __exit__(self, *exc):
        LOG.append(("device-exit", self.id))


class ndarray(np.ndarray):
    """NumPy memory posing as a CuPy array (its type's module is "cupy")."""

    device = FakeDevice(1)

    def get(self):
        raise AssertionError("a device array was copied to the host")


ndarray.__module__ = "cupy"


def _dev(a):
    return np.asarray(a).view(ndarray)


class FakeStream:
    def synchronize(self):
        LOG.append(("stream-sync",))


class FakeEvent:
    def __init__(self, disable_timing=False):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True
        LOG.append(("event-record",))

    def synchronize(self):
        assert self.recorded
        LOG.append(("event-wait",))


def _fake_cupy():
    cp = types.ModuleType("cupy")
    cp.ndarray = ndarray
    cp.empty = lambda shape, dtype=float: _dev(np.empty(shape, dtype))
    cp.empty_like = lambda a: _dev(np.empty_like(np.asarray(a)))
    cp.copyto = lambda dst, src, casting="same_kind": np.copyto(dst, src, casting=casting)
    cp.concatenate = lambda parts, axis=0: _dev(np.concatenate([np.asarray(p) for p in parts],
                                                               axis))
    cp.cuda = types.SimpleNamespace(get_current_stream=FakeStream, Event=FakeEvent,
                                    Device=FakeDevice)
    return cp


@pytest.fixture(autouse=True)
def fake_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    LOG.clear()
    yield


class DeviceRecordingEngine(RecordingEngine):
    """test_api's engine double, also recording the array module of what it is handed and
    when (in LOG)."""

    def __init__(self, size):
        super().__init__(size)
        self.modules = []

    def allreduce(self, sendbuf, recvbuf=None, **kw):
        self.modules.append((type(sendbuf).__module__, type(recvbuf).__module__))
        LOG.append(("engine",))
        return super().allreduce(sendbuf, recvbuf, **kw)

    def broadcast(self, buf, root):
        self.modules.append((type(buf).__module__,))
        LOG.append(("engine",))
        return super().broadcast(buf, root)


def _runtime(size=4, threshold=1 << 20):
    rt = Harness(size, threshold)
    rt.engine = rt.executor.engine = DeviceRecordingEngine(size)
    return rt


def _run(rt, kind, items, **kw):
    hid = rt.enqueue(kind, items, **kw)
    entries = rt.admit()
    rt.execute([Response(kind, e.name, None, e.sig) for e in entries])
    return rt.wait(hid)


def test_fused_device_allreduce_stays_on_the_device_in_order():
    rt = _runtime()
    ins = [_dev(np.arange(5, dtype=np.float32)), _dev(np.ones(3, np.float32))]
    outs = [_dev(np.empty(5, np.float32)), _dev(np.empty(3, np.float32))]
    ready = FakeEvent()
    ready.record()
    LOG.clear()
    got = _run(rt, ALLREDUCE, [("a", ins[0], outs[0]), ("b", ins[1], outs[1])], op=1,
               device=1, ready=ready.synchronize)
    assert rt.engine.calls == [("allreduce", "float32", 8, "sum", 1.0, 1.0)]
    assert rt.engine.modules == [("cupy", "cupy")]
    # The ready event once (one per call), then the device made current, the engine, and the
    # stream synced (on the array's device) before the device is left.
    assert LOG == [("event-wait",), ("device", 1), ("engine",), ("device", 1),
                   ("stream-sync",), ("device-exit", 1), ("device-exit", 1)]
    assert got[0] is outs[0] and got[1] is outs[1]
    assert np.asarray(got[0]).tolist() == [0, 4, 8, 12, 16] and np.asarray(got[1]).tolist() \
        == [4, 4, 4]
    ((key, buf),) = rt.executor.buffers.buffers.items()
    assert key[:2] == ("cupy", 1) and isinstance(buf, ndarray)


def test_host_and_device_tensors_never_share_a_fusion_buffer():
    rt = _runtime()
    host_in, dev_in = np.ones(4, np.float32), _dev(np.ones(4, np.float32))
    hid_h = rt.enqueue(ALLREDUCE, [("h", host_in, np.empty(4, np.float32))], op=1)
    hid_d = rt.enqueue(ALLREDUCE, [("d", dev_in, _dev(np.empty(4, np.float32)))], op=1,
                       device=0)
    rt.admit()
    rt.execute([Response(ALLREDUCE, n, None, rt.pending[n].sig) for n in ("h", "d")])
    assert rt.engine.modules == [("numpy", "numpy"), ("cupy", "cupy")]
    assert rt.wait(hid_h)[0].tolist() == [4.0] * 4
    assert np.asarray(rt.wait(hid_d)[0]).tolist() == [4.0] * 4


def test_narrow_device_integers_widen_in_a_device_buffer():
    rt = _runtime(size=2)
    x = _dev(np.array([100, -3], np.int8))
    out = _dev(np.empty(2, np.int8))
    got = _run(rt, ALLREDUCE, [("i8", x, out)], op=1, device=1)
    assert rt.engine.calls[0][1:3] == ("int64", 2)
    assert rt.engine.modules == [("cupy", "cupy")]
    assert np.asarray(got[0]).tolist() == [-56, -6]


def test_device_broadcast_and_allgather_use_device_buffers():
    rt = _runtime()
    a, b = _dev(np.arange(3, dtype=np.float64)), _dev(np.arange(2, dtype=np.int16))
    _run(rt, BROADCAST, [("x", a, a), ("y", b, b)], root=0, device=1)
    assert rt.engine.calls == [("broadcast", "uint8", 28, 0)]
    assert rt.engine.modules == [("cupy",)]
    rt.engine.modules.clear()
    x = _dev(np.arange(6, dtype=np.float32).reshape(2, 3))
    hid = rt.enqueue(ALLGATHER, [("g", x, None)], device=1)
    (e,) = rt.admit()
    rt.execute([Response(ALLGATHER, "g", None, e.sig, [2, 1, 0, 2])])
    out = rt.wait(hid)[0]
    assert isinstance(out, ndarray) and out.shape == (5, 3)
    assert rt.engine.modules == [("cupy",)] * 3   # ranks with rows: 0, 1 and 3
    assert np.asarray(out[:2]).tolist() == np.asarray(x).tolist()


def test_device_error_still_resolves_the_handle_and_leaves_the_device():
    rt = _runtime()

    def boom(*a, **k):
        raise RuntimeError("kernel failed")

    rt.engine.allreduce = boom
    x = _dev(np.ones(2, np.float32))
    hid = rt.enqueue(ALLREDUCE, [("e", x, x)], op=1, device=1)
    (e,) = rt.admit()
    rt.execute([Response(ALLREDUCE, "e", None, e.sig)])
    with pytest.raises(Exception, match="kernel failed"):
        rt.wait(hid)
    assert LOG[-1] == ("device-exit", 1) and ("stream-sync",) not in LOG


class FakeRuntime:
    size = 2  # the front end reads the job's size (Adasum's power-of-two check)
    rank = 0

    def __init__(self):
        self.calls = []
        self.sets = SetTable(self.size)  # the front end resolves the (global) process set

    def enqueue(self, kind, items, **kw):
        self.calls.append((kind, items, kw))
        return len(self.calls)


@pytest.fixture
def front_end(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(arrays, "runtime", lambda: rt)
    monkeypatch.setattr(process_sets, "runtime", lambda: rt)
    monkeypatch.setattr(gpu, "record_ready", lambda x: ("ready-for", type(x).__module__))
    return rt


def test_front_end_hands_cupy_arrays_over_without_host_copies(front_end):
    x = _dev(np.arange(4, dtype=np.float32))
    arrays.allreduce_async(x, name="x")
    arrays.allreduce_async_(x, name="x_")
    arrays.broadcast_async(x, 0, name="b")
    arrays.allgather_async(x, name="g")
    kinds = []
    for kind, items, kw in front_end.calls:
        kinds.append(kind)
        ((name, inp, out),) = items
        assert inp is x, name
        assert out is None or isinstance(out, ndarray), name
        assert kw["device"] == 1 and kw["ready"] == ("ready-for", "cupy"), name
    assert kinds == [ALLREDUCE, ALLREDUCE, BROADCAST, ALLGATHER]
    assert front_end.calls[1][1][0][2] is x            # in place writes into x itself
    assert front_end.calls[0][1][0][2] is not x        # out of place: a fresh device array


def test_front_end_rejects_a_grouped_call_across_host_and_device(front_end):
    with pytest.raises(ValueError, match="different devices"):
        arrays.grouped_allreduce_async([np.ones(2, np.float32), _dev(np.ones(2, np.float32))])
    assert front_end.calls == []
