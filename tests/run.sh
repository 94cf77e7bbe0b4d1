#!/usr/bin/env bash
# The whole test suite, all three tiers: unit tests, multi-rank tests under mpiexec
# (tests/test_mpi_tier.py launches tests/mpi/ at several sizes), and emulated-network tests
# (skipped with a reason unless root with ip netns and tc). Extra arguments go to pytest.
source "$(dirname "$0")/../launch/venv.sh" || exit 1
cd "$HOROTOPO_ROOT"
exec "$VENV/bin/python" -m pytest tests "$@"
