"""The robustness verdict (benchmarks/robustness.py's), on made-up job documents (no cluster
needed)."""
import pytest

from horotopo.reliability.targets import summarize

MiB = 1 << 20


def _job(hvd_s, mpi_s, alg="tree", wrong=0):
    return {"rows": [{"size": 16 * MiB, "hvd_s": hvd_s, "mpi_s": mpi_s,
                      "algorithms": [alg] * len(hvd_s)}], "wrong": wrong}


def test_targets_met():
    jobs = [_job([1.0, 1.1, 1.05], [3.0, 3.0, 3.0]) for _ in range(3)]
    res, misses = summarize("t", {16 * MiB: 0.95}, jobs)
    assert misses == []
    f = res["sizes"][0]["fraction"]
    assert f["median"] == pytest.approx(0.95 / 1.05)
    assert res["sizes"][0]["algorithms"] == {"tree": 9}


def test_each_miss_is_listed():
    # one job ran MPI_Allreduce at 0.3 of the optimum and 10% slower than MPI in its own run
    jobs = [_job([1.0] * 3, [3.0] * 3), _job([3.3] * 3, [3.0] * 3, alg="mpi"),
            _job([1.3] * 3, [3.0] * 3, wrong=2)]
    _, misses = summarize("t", {16 * MiB: 1.0}, jobs)
    text = "\n".join(misses)
    assert "minimum fraction" in text and "median fraction" in text
    assert "MPI_Allreduce's time" in text and "2 wrong elements" in text
