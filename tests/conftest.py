"""Shared pytest set-up.

tests/mpi/ holds multi-rank tests. They are not collected in the plain run: tests/test_mpi_tier.py
launches them under mpiexec at several sizes (HOROTOPO_MPI_TIER=1 marks such a launch).

A test marked ``slow`` repeats, at greater cost, a behaviour that a faster test of the default run
already checks; it is skipped, saying how to run it, unless the run's ``-m`` expression names
``slow`` (``pytest -m slow``, ``-m "slow or mpi"``).
"""
import os
import re
import sys

import pytest

# pytester runs a small module in-process (tests/test_slow_marker.py): no interpreter to start.
pytest_plugins = ["pytester"]

collect_ignore_glob = [] if os.environ.get("HOROTOPO_MPI_TIER") == "1" else ["mpi/*"]


def slow_selected(mark_expression: str) -> bool:
    """Whether a ``-m`` expression asks for slow tests: it names the ``slow`` marker.

    A slow test that the expression itself deselects (``-m "not slow"``) never reaches the skip
    below, so naming the marker is enough to tell a run that filters on it from one that does not.
    """
    return re.search(r"(?<![\w.])slow(?![\w.])", mark_expression) is not None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # First, so that a skipped slow test starts none of its fixtures (an mpiexec job, a network).
    if item.get_closest_marker("slow") is not None and \
            not slow_selected(item.config.getoption("-m") or ""):
        pytest.skip(f"a slow check: run it with `pytest -m slow {item.nodeid.split('::')[0]}`")


def pytest_configure(config):
    # Inside an MPI-tier launch: record this rank's outcomes for the outer test (mpi_report.py).
    from mpi_report import register
    register(config)


def pytest_terminal_summary(terminalreporter):
    # The MPI tier's inner counts, which its outer tests keep as the "mpi_inner" property, so
    # that a plain run shows what ran under mpiexec and what skipped there, and why.
    lines = sorted((rep.nodeid, value)
                   for key in ("passed", "failed")
                   for rep in terminalreporter.stats.get(key, [])
                   for name, value in getattr(rep, "user_properties", ()) if name == "mpi_inner")
    if lines:
        terminalreporter.write_sep("-", "MPI tier: inner results")
        for _, line in lines:
            terminalreporter.write_line(line)


# MPI-tier modules that start horotopo's runtime (hvd.init or the torch.distributed backend).
# Once started it keeps cycling in the background until the process ends, and at 5 ranks on 2
# cores that cycling slowed the engine-level grids that follow it alphabetically 30-fold
# (test_every_dtype_op_and_size[ring]: 1 s alone, 37-43 s after test_api_collectives.py).
RUNTIME_MODULES = frozenset({
    "test_api_collectives.py", "test_api_runtime.py", "test_gpu_api_mpi.py",
    "test_process_sets.py", "test_timeline_mpi.py", "test_torch_distributed.py",
    "test_torch_horovod_semantics.py", "test_torch_ops.py"})


def pytest_collection_modifyitems(session, config, items):
    # Engine-level modules first, then those that start the runtime; the order is the same on
    # every rank (a stable sort of the collected order), as collective tests need.
    if os.environ.get("HOROTOPO_MPI_TIER") == "1":
        items.sort(key=lambda item: item.path.name in RUNTIME_MODULES)


_SESSION_FAILED = pytest.StashKey[bool]()


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_SESSION_FAILED] = exitstatus not in (0,
                                                               pytest.ExitCode.NO_TESTS_COLLECTED)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # A rank whose tests failed ends the whole MPI-tier launch once it has reported: its peers
    # would otherwise wait in a collective that this rank no longer reaches (-x stops it early;
    # a failure can also skip a collective), and the outer test would see a 600 s timeout
    # instead of the failure.
    if os.environ.get("HOROTOPO_MPI_TIER") != "1" or not config.stash.get(_SESSION_FAILED, False):
        return
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    if mpi.COMM_WORLD.Get_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(1)
