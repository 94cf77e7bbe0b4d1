#!/usr/bin/env bash
# The main job (the first Quickstart command). On a fresh clone it creates the venv,
# plans the bundled heterogeneous topology (two racks of three hosts, 1 gbps host links and a
# 0.25 gbps uplink), emulates it with network namespaces and shaped links, and runs the
# allreduce benchmark across them: horotopo against MPI_Allreduce, with the plan's prediction
# and a one-line verdict. Without root it says so and falls back to plain local ranks.
#   bash benchmarks/main.sh [TOPOLOGY.json] [-b 1M -e 16M -f 4 -n 3 -w 1] [--local]
source "$(dirname "$0")/../launch/venv.sh" || exit 1
cd "$HOROTOPO_ROOT"
exec "$VENV/bin/python" benchmarks/emulated_allreduce.py "$@"
