"""The main job: its report (:mod:`horotopo.reliability.versus_mpi`), and its driver
(benchmarks/emulated_allreduce.py) run as its user runs it: the fallback to plain local ranks
(no root needed) and its failures.

A stand-in benchmark with allreduce_perf.py's command line and --json output feeds the driver,
so these tests check the driver and not the engine.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from horotopo.plan import ring_plan
from horotopo.reliability.versus_mpi import benchmark_rows, versus_mpi_report
from horotopo.topology import bundled, load

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "benchmarks" / "emulated_allreduce.py"
PERF = ROOT / "benchmarks" / "allreduce_perf.py"
# A planner setting with a value the planner refuses: the planner fails as it does on a real
# error, with nothing patched.
BAD_PLANNER_SETTING = {"HOROTOPO_HIERARCHY": "bogus"}


def _run(argv, env=None, timeout=300):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _mpiexec():
    from horotopo_launch.mpi import find_mpiexec
    found = find_mpiexec()
    if found is None:
        pytest.skip("no mpiexec installed next to the interpreter or on PATH")
    return found


def _row(size, t, mpi_t, wrong=0):
    return {"size": size, "count": size // 4, "type": "float32", "redop": "sum",
            "time_s": t, "mpi_time_s": mpi_t, "wrong": wrong, "ratio": mpi_t / t,
            "algbw_GBps": size / t / 1e9, "busbw_GBps": 0.0}


def test_rows_are_found_in_noisy_output():
    doc = {"rows": [_row(1 << 20, 0.1, 0.2)]}
    assert benchmark_rows(json.dumps(doc)) == doc["rows"]
    assert benchmark_rows("warming up\n" + json.dumps(doc) + "\n") == doc["rows"]
    with pytest.raises(RuntimeError, match="no JSON document"):
        benchmark_rows("nothing here\n")


def test_report_verdicts():
    plan = ring_plan(load(bundled("racks-2x3")))
    text, ok = versus_mpi_report([_row(1 << 20, 0.1, 0.1), _row(16 << 20, 1.0, 2.0)], plan, True)
    assert ok and "16 MiB horotopo is faster than MPI_Allreduce (2.00x)" in text
    assert "the plan's predicted" in text and "16 MiB" in text.splitlines()[2]
    text, ok = versus_mpi_report([_row(16 << 20, 2.0, 1.0)], plan, False)
    assert ok and "slower than MPI_Allreduce (0.50x) on plain local ranks" in text
    text, ok = versus_mpi_report([_row(16 << 20, 1.0, 1.01)], plan, True)
    assert "on par with" in text
    text, ok = versus_mpi_report([_row(16 << 20, 1.0, 2.0, wrong=3)], plan, True)
    assert not ok and text.splitlines()[-1].startswith("verdict: WRONG RESULTS")


STAND_IN = textwrap.dedent("""
    import argparse, json
    from mpi4py import MPI
    p = argparse.ArgumentParser()
    for flag in ("-b", "-e", "-f", "-n", "-w", "-c", "--topology"):
        p.add_argument(flag)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    assert a.json and a.topology.endswith("racks-2x3.json")
    comm = MPI.COMM_WORLD
    size = comm.allreduce(1)
    if comm.rank == 0:
        print("warming up", flush=True)  # the driver finds the JSON document among other lines
        print(json.dumps({"rows": [{"size": 1 << 20, "count": 262144, "type": "float32",
              "redop": "sum", "time_s": 0.01, "mpi_time_s": 0.02, "ratio": 2.0,
              "wrong": 0 if size == 6 else 1, "algbw_GBps": 0.1, "busbw_GBps": 0.1}]}))
""")


def test_fallback_to_local_ranks_says_so(tmp_path):
    _mpiexec()
    bench = tmp_path / "allreduce_perf.py"
    bench.write_text(STAND_IN)
    proc = _run([DRIVER, "--bench", bench, "--local", "-e", "1M"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("NOT emulating the topology (--local was given): falling back to plain local ranks"
            in proc.stderr)
    assert "allreduce on 6 ranks, plain local ranks" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("verdict: at 1 MiB horotopo is faster")


def test_missing_benchmark_is_reported(tmp_path):
    proc = _run([DRIVER, "--bench", tmp_path / "absent.py"])
    assert proc.returncode == 1 and "does not exist yet" in proc.stderr, proc.stderr


def test_planner_failure_fails_the_main_job(tmp_path):
    # A planner failure must not turn into a ring plan benchmarked as if it were the plan.
    bench = tmp_path / "allreduce_perf.py"
    bench.write_text(STAND_IN)
    proc = _run([DRIVER, "--bench", bench, "--local", "-e", "1M"], env=BAD_PLANNER_SETTING)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 1, out + err
    assert "the planner failed on" in err and "ConfigError: HOROTOPO_HIERARCHY='bogus'" in err
    assert "Traceback" in err and "allreduce on" not in out, out + err


def test_allreduce_perf_fails_when_the_planner_fails(tmp_path):
    # No ring fallback: the planner's error ends the run on every rank, naming the error. Two
    # ranks over a topology of two, which the benchmark accepts before it plans.
    topology = tmp_path / "two.json"
    topology.write_text(json.dumps({
        "name": "two", "switches": ["s"], "ranks": ["a", "b"],
        "links": [{"ends": ["a", "s"], "gbps": 1.0}, {"ends": ["b", "s"], "gbps": 1.0}]}))
    proc = subprocess.run(
        [_mpiexec(), "-n", "2", sys.executable, str(PERF), "--topology", str(topology)],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
        env={**os.environ, **BAD_PLANNER_SETTING})
    assert proc.returncode != 0, proc.stdout
    assert ("allreduce_perf: cannot load the plan: ConfigError: HOROTOPO_HIERARCHY='bogus'"
            in proc.stdout), proc.stdout
