"""The engine wraps its transport for staging only where some rank has a CUDA device."""
import numpy as np
from mpi4py import MPI

from horotopo.engine import Engine
from horotopo.gpu import StagingTransport, device_status
from horotopo.plan import ring_plan
from horotopo.topology import from_dict
from horotopo import generate


def test_cpu_only_job_keeps_the_plain_transport():
    comm = MPI.COMM_WORLD
    plan = ring_plan(from_dict(generate.uniform_star(comm.size)))
    any_device = comm.allreduce(1 if device_status()[0] else 0, op=MPI.MAX)
    with Engine(comm, plan) as engine:
        staged = isinstance(engine.transport, StagingTransport)
        if not any_device:
            assert not staged
        out = engine.allreduce(np.arange(10, dtype=np.int64))
        assert out.tolist() == [comm.size * i for i in range(10)]
