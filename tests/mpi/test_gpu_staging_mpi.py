"""StagingTransport under the real engine and MPI, on CPU: NumPy arrays play the device buffers
and a fake copier plays CUDA, with device-to-host copies that finish only after a few polls (so
sends really are deferred and posted later, in order). Any size of world works."""
import numpy as np
import pytest
from mpi4py import MPI

from horotopo.engine import Engine
from horotopo.gpu import StagingTransport
from gpu_plans import two_tree_plan
from horotopo.transport import MPITransport


class SlowEvent:
    def __init__(self, run, polls):
        self.run, self.polls = run, polls

    def finish(self):
        if self.run is not None:
            self.run()
            self.run = None


class SlowCopier:
    """Copies complete after ``polls`` done() queries, or when waited on."""

    def __init__(self, polls=2):
        self.polls = polls
        self.copies = 0

    def pinned(self, nbytes):
        return np.full(nbytes, 0xAB, np.uint8)  # garbage until a copy lands

    def d2h(self, host, dev):
        self.copies += 1
        src = dev.view(np.uint8).reshape(-1).copy()

        def run():
            host[...] = src
        return SlowEvent(run, self.polls)

    def h2d(self, dev, host):
        self.copies += 1
        dev.view(np.uint8).reshape(-1)[...] = host  # the stream runs it before later work
        return SlowEvent(None, 0)

    def done(self, ev):
        if ev.polls > 0:
            ev.polls -= 1
            return False
        ev.finish()
        return True

    def wait(self, ev):
        ev.finish()

    def to_numpy(self, dev):
        return np.array(dev, copy=True)

    def from_numpy(self, dev, host):
        dev[...] = host


@pytest.fixture(scope="module")
def engine():
    comm = MPI.COMM_WORLD
    copier = SlowCopier()
    transport = StagingTransport(MPITransport(comm), copier=copier,
                                 is_device=lambda b: isinstance(b, np.ndarray))
    eng = Engine(transport, two_tree_plan(comm.size, 1024))
    yield eng, transport, copier
    eng.close()
    transport.close()


@pytest.mark.parametrize("algorithm", ["tree", "ring", "mpi"])
@pytest.mark.parametrize("dtype,op", [("float64", "sum"), ("float32", "max"), ("int64", "min"),
                                      ("int32", "product")])
def test_staged_allreduce_matches_mpi(engine, algorithm, dtype, op):
    eng, transport, copier = engine
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(100 + comm.rank)
    n = 3001  # not a multiple of the chunk: ragged last chunks
    if dtype.startswith("int"):
        x = rng.integers(-3, 4, n).astype(dtype)
    else:
        x = rng.integers(-1000, 1000, n).astype(dtype) / 8  # exact sums in any order
    before = transport.staged_bytes
    got = eng.allreduce(x, op=op, algorithm=algorithm)
    ref = np.empty_like(x)
    mop = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "product": MPI.PROD}[op]
    comm.Allreduce(x, ref, op=mop)
    np.testing.assert_array_equal(got, ref)
    if comm.size > 1 and algorithm != "mpi":
        assert transport.staged_bytes > before  # the data really went through the slots
