"""The slow marker: a test marked slow runs only when the run's -m expression names slow, and its
skip says how to run it (tests/conftest.py)."""
import pytest
from conftest import slow_selected
from mpi_launch import ROOT

CASE = "tests/slow_cases/one_slow_one_not.py"
# Hypothesis's plugin imports all of hypothesis at the inner session's end, where pytester then
# unloads it again: a second or more for each inner run, and nothing here uses it.
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


@pytest.mark.parametrize("expression, selects", [
    ("", False), ("mpi", False), ("not slow", True), ("slow", True), ("slow or mpi", True),
    ("mpi and slow", True), ("(slow)", True), ("slowest", False), ("not_slow", False)])
def test_which_mark_expressions_ask_for_slow_tests(expression, selects):
    assert slow_selected(expression) is selects


def test_a_slow_test_is_skipped_saying_how_to_run_it_unless_asked_for(pytester, monkeypatch):
    # From the repository's root, as a user runs it, so that the skip names the path to pass.
    monkeypatch.chdir(ROOT)
    plain = pytester.runpytest_inprocess(*QUIET, "-rs", CASE)
    plain.assert_outcomes(passed=1, skipped=1)
    plain.stdout.fnmatch_lines([f"*a slow check: run it with `pytest -m slow {CASE}`*"])
    asked = pytester.runpytest_inprocess(*QUIET, "-m", "slow", CASE)
    asked.assert_outcomes(passed=1, deselected=1)
