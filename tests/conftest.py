"""Shared pytest set-up.

tests/mpi/ holds multi-rank tests. They are not collected in the plain run: tests/test_mpi_tier.py
launches them under mpiexec at several sizes (HOROTOPO_MPI_TIER=1 marks such a launch).
"""
import os

collect_ignore_glob = [] if os.environ.get("HOROTOPO_MPI_TIER") == "1" else ["mpi/*"]
