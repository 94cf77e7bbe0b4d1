"""Shared pytest set-up.

tests/mpi/ holds multi-rank tests. They are not collected in the plain run: tests/test_mpi_tier.py
launches them under mpiexec at several sizes (HOROTOPO_MPI_TIER=1 marks such a launch).
"""
import os

collect_ignore_glob = [] if os.environ.get("HOROTOPO_MPI_TIER") == "1" else ["mpi/*"]


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
