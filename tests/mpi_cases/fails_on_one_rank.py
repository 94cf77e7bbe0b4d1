"""An inner MPI-tier module that fails on rank 0 only, then needs every rank in a collective.

Not collected on its own (no test_ prefix): tests/test_mpi_tier.py runs it under mpiexec to
check that a rank whose tests failed ends the launch (tests/conftest.py) instead of leaving its
peers waiting in the next collective until the tier's timeout.
"""
from mpi4py import MPI


def test_fails_on_rank_0_only():
    assert MPI.COMM_WORLD.Get_rank() != 0, "rank 0 fails here on purpose"


def test_needs_every_rank():
    MPI.COMM_WORLD.Barrier()
