"""The main job's driver (benchmarks/emulated_allreduce.py): its report, its verdict, and the
fallback to plain local ranks when the cluster cannot be emulated (no root needed).

A stand-in benchmark with allreduce_perf.py's command line and --json output feeds it, so these
tests check the driver and not the engine.
"""
import importlib.util
import json
import re
import textwrap
from pathlib import Path

import pytest

from horotopo.plan import ring_plan
from horotopo.topology import bundled, load

ROOT = Path(__file__).resolve().parent.parent


def _driver():
    spec = importlib.util.spec_from_file_location(
        "emulated_allreduce", ROOT / "benchmarks" / "emulated_allreduce.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(size, t, mpi_t, wrong=0):
    return {"size": size, "count": size // 4, "type": "float32", "redop": "sum",
            "time_s": t, "mpi_time_s": mpi_t, "wrong": wrong, "ratio": mpi_t / t,
            "algbw_GBps": size / t / 1e9, "busbw_GBps": 0.0}


def test_rows_are_found_in_noisy_output():
    drv = _driver()
    doc = {"rows": [_row(1 << 20, 0.1, 0.2)]}
    assert drv._rows(json.dumps(doc)) == doc["rows"]
    assert drv._rows("warming up\n" + json.dumps(doc) + "\n") == doc["rows"]
    with pytest.raises(RuntimeError, match="no JSON document"):
        drv._rows("nothing here\n")


def test_report_verdicts():
    drv = _driver()
    plan = ring_plan(load(bundled("racks-2x3")))
    text, ok = drv.report([_row(1 << 20, 0.1, 0.1), _row(16 << 20, 1.0, 2.0)], plan, True)
    assert ok and "16 MiB horotopo is faster than MPI_Allreduce (2.00x)" in text
    assert "the plan's predicted" in text and "16 MiB" in text.splitlines()[2]
    text, ok = drv.report([_row(16 << 20, 2.0, 1.0)], plan, False)
    assert ok and "slower than MPI_Allreduce (0.50x) on plain local ranks" in text
    text, ok = drv.report([_row(16 << 20, 1.0, 1.01)], plan, True)
    assert "on par with" in text
    text, ok = drv.report([_row(16 << 20, 1.0, 2.0, wrong=3)], plan, True)
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
        print(json.dumps({"rows": [{"size": 1 << 20, "count": 262144, "type": "float32",
              "redop": "sum", "time_s": 0.01, "mpi_time_s": 0.02, "ratio": 2.0,
              "wrong": 0 if size == 6 else 1, "algbw_GBps": 0.1, "busbw_GBps": 0.1}]}))
""")


def test_fallback_to_local_ranks_says_so(tmp_path, monkeypatch, capsys):
    from horotopo_launch import emulate
    from horotopo_launch.mpi import find_mpiexec
    if find_mpiexec() is None:
        pytest.skip("no mpiexec installed next to the interpreter or on PATH")
    bench = tmp_path / "allreduce_perf.py"
    bench.write_text(STAND_IN)
    drv = _driver()
    monkeypatch.setattr(emulate, "available", lambda: (False, "needs root (test)"))
    rc = drv.main(["--bench", str(bench), "-e", "1M"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "NOT emulating the topology (needs root (test)): falling back to plain local ranks" \
        in err
    assert "allreduce on 6 ranks, plain local ranks" in out
    assert out.strip().splitlines()[-1].startswith("verdict: at 1 MiB horotopo is faster")


def test_missing_benchmark_is_reported(tmp_path, capsys):
    assert _driver().main(["--bench", str(tmp_path / "absent.py")]) == 1
    assert "does not exist yet" in capsys.readouterr().err


def _planner_fails(*_args, **_kwargs):
    raise ValueError("dual bound below the achieved rate (injected)")


def test_planner_failure_fails_the_main_job(tmp_path, monkeypatch, capsys):
    # A planner failure must not turn into a ring plan benchmarked as if it were the plan.
    import horotopo.plan
    bench = tmp_path / "allreduce_perf.py"
    bench.write_text(STAND_IN)
    monkeypatch.setattr(horotopo.plan, "make_plan", _planner_fails)
    rc = _driver().main(["--bench", str(bench), "--local", "-e", "1M"])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert "the planner failed on" in err and "ValueError: dual bound below" in err, err
    assert "Traceback" in err and "allreduce on" not in out, out + err


@pytest.mark.parametrize("error", [ValueError("dual bound below the achieved rate (injected)"),
                                   NotImplementedError("no packing (injected)")])
def test_allreduce_perf_fails_when_the_planner_fails(monkeypatch, error):
    # No packing (NotImplementedError) fails the run too, rather than falling back to ring.
    import types

    import horotopo.plan
    spec = importlib.util.spec_from_file_location(
        "allreduce_perf", ROOT / "benchmarks" / "allreduce_perf.py")
    perf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf)

    def make_plan(topo):
        raise error

    monkeypatch.setattr(horotopo.plan, "make_plan", make_plan)
    # rank 0 of a job the size of the topology; bcast hands back what it is given
    comm = types.SimpleNamespace(rank=0, size=6, bcast=lambda obj, root=0: obj)
    args = perf._args(["--topology", str(bundled("racks-2x3"))])
    with pytest.raises(SystemExit, match=f"cannot load the plan: {type(error).__name__}: "
                                         f"{re.escape(str(error))}"):
        perf.load_plan(args, comm)
