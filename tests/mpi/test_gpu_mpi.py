"""GPU allreduce across ranks sharing the GPUs: CuPy buffers through the engine, staged through
pinned memory (and directly when MPI is CUDA-aware), checked against MPI on host copies.
Skipped with "no CUDA device" on CPU-only machines (HOROTOPO_TEST_GPU=1 fails instead)."""
import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from horotopo import gpu
from horotopo.engine import Engine
from gpu_plans import two_tree_plan
from gpu_support import require_device
from horotopo.transport import MPITransport

COMM = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def cp():
    cupy = require_device()
    cupy.cuda.Device(COMM.rank % cupy.cuda.runtime.getDeviceCount()).use()
    return cupy


@pytest.fixture(scope="module")
def aware(cp):
    verdict = gpu.cuda_aware(COMM)
    assert len(set(COMM.allgather(verdict))) == 1, "ranks disagree on CUDA-awareness"
    return verdict


@pytest.fixture(scope="module", params=["staged", "direct"])
def engine(request, cp, aware):
    if request.param == "direct" and not aware:
        pytest.skip("MPI is not CUDA-aware here: device pointers cannot go to MPI directly")
    transport = MPITransport(COMM)
    if request.param == "staged":
        transport = gpu.StagingTransport(transport)
    eng = Engine(transport, two_tree_plan(COMM.size, 256 << 10))
    yield eng
    eng.close()
    transport.close()


@pytest.mark.parametrize("algorithm", ["tree", "ring"])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float64", "average"),
                                      ("float16", "sum"), ("int32", "max"),
                                      ("float32", "min")])
def test_cupy_allreduce_matches_cpu(cp, engine, algorithm, dtype, op):
    rng = np.random.default_rng(7 + COMM.rank)
    n = (3 << 20) // 4 + 5  # several chunks per tree, ragged end
    host = (rng.integers(-64, 64, n) / (1 if dtype == "int32" else 4)).astype(dtype)
    dev = cp.asarray(host)
    got = cp.asnumpy(engine.allreduce(dev, op=op, algorithm=algorithm))
    wide = host.astype(np.float64) if dtype == "float16" else host
    ref = np.empty_like(wide)
    mop = {"sum": MPI.SUM, "average": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
    COMM.Allreduce(wide, ref, op=mop)
    if op == "average":
        ref = ref / COMM.size
    # Quarter-integers with small magnitudes sum exactly in any order; average rounds once.
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64),
                               rtol=1e-15 if op != "average" else 1e-12, atol=0)
    digests = COMM.allgather(hashlib.sha256(got.tobytes()).hexdigest())
    assert len(set(digests)) == 1, "ranks hold different results"
