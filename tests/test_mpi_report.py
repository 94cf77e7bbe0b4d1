"""The MPI tier's inner-result check (tests/mpi_report.py) on synthetic runs: it must fail on a
skip that the allow-list does not name, on a rank that reported nothing and on ranks that
disagree, and let through the skips that are expected."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from mpi_report import REPORT_ENV, AllowedSkip, allowed, check_launch, read_reports

HERE = Path(__file__).resolve().parent


def _report(rank: int, outcomes: Dict[str, str],
            skips: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    return {"rank": rank, "exitstatus": 0, "outcomes": outcomes, "skips": skips or {}}


GPU_SKIPPED = {"t.py::test_a": "passed", "t.py::test_gpu": "skipped"}
GPU_REASON = {"t.py::test_gpu": "no CUDA device"}


def test_allowed_skips_pass_and_are_counted():
    reports = {r: _report(r, GPU_SKIPPED, GPU_REASON) for r in range(3)}
    res = check_launch("n=3", 3, reports)
    assert res.problems == []
    assert res.counts == {"passed": 1, "skipped": 1}
    assert res.line() == "n=3: 1 passed, 1 skipped (skipped: 1 x 'no CUDA device')"


def test_an_unlisted_skip_fails():
    outcomes = {"t.py::test_a": "passed", "tests/mpi/test_torch_ops.py": "skipped"}
    skips = {"tests/mpi/test_torch_ops.py": "horotopo.torch needs torch (the [torch] extra)"}
    res = check_launch("n=2", 2, {r: _report(r, outcomes, skips) for r in range(2)})
    assert len(res.problems) == 1, res.problems
    assert "tests/mpi/test_torch_ops.py skipped on ranks [0, 1]" in res.problems[0]
    assert "not on the allow-list for 2 ranks" in res.problems[0]


def test_a_two_rank_skip_is_allowed_only_at_one_rank():
    assert allowed("needs at least 2 ranks", 1)
    assert not allowed("needs at least 2 ranks", 2)
    assert not allowed("no CUDA device on this box", 2)      # the whole reason must match
    own = [AllowedSkip("flaky.*", "a made-up entry", max_ranks=3)]
    assert allowed("flaky network", 3, own) and not allowed("flaky network", 4, own)


def test_a_silent_rank_a_disagreeing_rank_and_an_empty_run_fail():
    reports = {0: _report(0, GPU_SKIPPED, GPU_REASON),
               1: _report(1, {"t.py::test_a": "failed", "t.py::test_gpu": "skipped"}, GPU_REASON)}
    problems = check_launch("n=3", 3, reports).problems
    assert any("ranks [2] wrote no report" in p for p in problems), problems
    assert any("rank 1 disagrees with rank 0 on 1 tests" in p for p in problems), problems
    assert check_launch("n=1", 1, {}).problems == ["ranks [0] wrote no report (did they reach "
                                                   "the end of pytest?)", "no test passed"]


INNER = {
    "conftest.py": "from mpi_report import register as pytest_configure\n",
    "test_inner.py": textwrap.dedent("""
        import pytest

        def test_passes():
            pass

        def test_skips_for_no_device():
            pytest.skip("no CUDA device")

        @pytest.mark.skipif(True, reason="torch is missing")
        def test_skipif():
            pass

        @pytest.mark.xfail(reason="known", strict=True)
        def test_xfails():
            assert False
    """),
    "test_gone.py": "import pytest\npytest.importorskip('no_such_module_h12', reason='gone')\n",
}


def test_rank_report_plugin_records_a_real_session(tmp_path):
    # The plugin in a real pytest run, as tests/conftest.py registers it in each MPI rank.
    for name, text in INNER.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "reports"
    env = {**os.environ, REPORT_ENV: str(out), "PMI_RANK": "0",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = read_reports(out)
    assert list(reports) == [0]
    assert reports[0]["skips"] == {"test_inner.py::test_skips_for_no_device": "no CUDA device",
                                   "test_inner.py::test_skipif": "torch is missing",
                                   "test_gone.py": "gone"}
    res = check_launch("synthetic", 1, reports)
    assert res.counts == {"passed": 1, "skipped": 3, "xfailed": 1}
    assert [p.split(" skipped")[0] for p in res.problems] == ["test_gone.py",
                                                              "test_inner.py::test_skipif"]
