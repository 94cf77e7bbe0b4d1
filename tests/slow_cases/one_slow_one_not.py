"""A module with one test marked slow and one not, for tests/test_slow_marker.py.

Not collected on its own (no test_ prefix): the outer test runs it in a pytest of its own to see
which of the two the shared slow-marker hook (tests/conftest.py) lets run.
"""
import pytest


def test_quick():
    pass


@pytest.mark.slow
def test_marked_slow():
    pass
