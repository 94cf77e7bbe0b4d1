"""The Horovod-style API on device buffers under mpiexec: CuPy arrays (``horotopo``) and CUDA
torch tensors (``horotopo.torch``) go to the engine as device arrays, never as host copies,
and come back on their device with exact values.

Inputs are small integers, so every result is exact and checked against MPI_Allreduce on host
copies. A spy on the runtime's engine records the array module of every buffer it is handed:
"cupy" only. Skipped with "no CUDA device" on CPU-only machines (HOROTOPO_TEST_GPU=1 fails
instead); the torch cases also need a CUDA build of torch.
"""
import numpy as np
import pytest
from mpi4py import MPI

import horotopo as hvd
from horotopo.api.basics import runtime
from gpu_support import require_device
from mpi_helpers import agree
from test_api_collectives import start

COMM = MPI.COMM_WORLD


class EngineSpy:
    """Delegates to the runtime's engine and records the module of every buffer it sees."""

    def __init__(self, engine):
        self.engine = engine
        self.modules = set()

    def allreduce(self, sendbuf, recvbuf=None, **kw):
        self.modules.update({type(sendbuf).__module__.split(".")[0],
                             type(recvbuf).__module__.split(".")[0]})
        return self.engine.allreduce(sendbuf, recvbuf, **kw)

    def broadcast(self, buf, root):
        self.modules.add(type(buf).__module__.split(".")[0])
        return self.engine.broadcast(buf, root)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def cp():
    cupy = require_device()
    cupy.cuda.Device(COMM.rank % cupy.cuda.runtime.getDeviceCount()).use()
    start()
    rt = runtime()
    spy = EngineSpy(rt.engine)
    rt.engine = spy
    yield cupy
    rt.engine = spy.engine


@pytest.fixture
def spy(cp):
    s = runtime().engine
    s.modules.clear()
    return s


def host_sum(x):
    out = np.empty_like(x)
    COMM.Allreduce(x, out, op=MPI.SUM)
    return out


def small(count, dtype, seed):
    return np.random.default_rng(seed * 100 + COMM.rank).integers(-8, 9, count).astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "int8"])
def test_cupy_grouped_allreduce_stays_on_the_device(cp, spy, dtype):
    hosts = [small(n, dtype, k) for k, n in enumerate((1, 1000, 300001))]
    got = hvd.grouped_allreduce([cp.asarray(h) for h in hosts], op=hvd.Sum,
                                name=f"g.{dtype}")
    for h, g in zip(hosts, got):
        want = host_sum(h.astype(np.int64)).astype(dtype)  # int8 wraps like the device sum
        agree(isinstance(g, cp.ndarray) and g.device.id == cp.cuda.Device().id
              and np.array_equal(cp.asnumpy(g), want), f"{dtype}: wrong result")
    agree(spy.modules == {"cupy"}, f"engine saw {spy.modules}")


def test_cupy_in_place_average_and_broadcast_and_allgather(cp, spy):
    n = hvd.size()
    x = cp.asarray(small(4097, "float32", 9) * n)
    want = host_sum(cp.asnumpy(x)) / n
    # Average is a sum times float32(1/n), as in Horovod: within an ulp of sum / n.
    agree(hvd.allreduce_(x, name="avg") is x and np.allclose(cp.asnumpy(x), want, rtol=2e-7,
                                                             atol=0), "avg")
    b = cp.arange(33, dtype=cp.int64) * (hvd.rank() == 0)
    agree(np.array_equal(cp.asnumpy(hvd.broadcast(b, 0, name="b")), np.arange(33)), "bcast")
    g = hvd.allgather(cp.full((hvd.rank() + 1, 2), hvd.rank(), cp.float32), name="ag")
    want_g = np.concatenate([np.full((r + 1, 2), r, np.float32) for r in range(n)])
    agree(isinstance(g, cp.ndarray) and np.array_equal(cp.asnumpy(g), want_g), "allgather")
    agree(spy.modules == {"cupy"}, f"engine saw {spy.modules}")


def test_cupy_input_written_on_another_stream_is_waited_for(cp, spy):
    # The caller's stream is still writing when the call is made; without the ready event the
    # background thread would send stale memory.
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.zeros(1 << 22, cp.float32)
        for _ in range(20):
            x += 1
        h = hvd.allreduce_async(x, op=hvd.Sum, name="streamed")
    got = hvd.synchronize(h)
    agree(float(got.min()) == float(got.max()) == 20.0 * hvd.size(), "stale input sent")


@pytest.fixture(scope="module")
def torch_cuda(cp):
    torch = pytest.importorskip("torch", reason="torch is not installed on this machine")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA (a CPU build)")
    torch.cuda.set_device(cp.cuda.Device().id)
    import horotopo.torch as thvd

    return torch, thvd


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "int64"])
def test_torch_cuda_allreduce_without_host_copies(torch_cuda, spy, dtype):
    torch, thvd = torch_cuda
    tdt = getattr(torch, dtype)
    host = small(100003, "float32" if dtype == "bfloat16" else dtype, 5)
    t = torch.as_tensor(host).to(device="cuda", dtype=tdt)
    got = thvd.allreduce(t, op=thvd.Sum, name=f"t.{dtype}")
    want = host_sum(host.astype(np.int64)).astype(host.dtype)
    agree(got.is_cuda and got.dtype == tdt and np.array_equal(
        got.to(torch.float64 if dtype == "bfloat16" else tdt).cpu().numpy().astype(host.dtype),
        want), f"{dtype}: wrong result")
    same = thvd.allreduce_(t, op=thvd.Sum, name=f"t_.{dtype}")
    agree(same is t and torch.equal(t, got), f"{dtype}: in place")
    agree(spy.modules == {"cupy"}, f"engine saw {spy.modules}")


def test_torch_cuda_broadcast_and_allgather(torch_cuda, spy):
    torch, thvd = torch_cuda
    p = torch.full((5, 3), float(hvd.rank()), device="cuda", dtype=torch.bfloat16)
    thvd.broadcast_(p, 0, name="tb")
    agree(p.is_cuda and float(p.abs().sum()) == 0.0, "broadcast_")
    g = thvd.allgather(torch.full((2,), hvd.rank(), device="cuda", dtype=torch.int32),
                       name="tg")
    agree(g.is_cuda and g.tolist() == [r for r in range(hvd.size()) for _ in (0, 1)],
          "allgather")
    agree(spy.modules == {"cupy"}, f"engine saw {spy.modules}")
