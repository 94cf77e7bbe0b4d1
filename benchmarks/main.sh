#!/usr/bin/env bash
# The main job: plan the bundled default heterogeneous topology and print the trees,
# the predicted allreduce time against ring, and the certified gap.
source "$(dirname "$0")/../launch/venv.sh"
cd "$HOROTOPO_ROOT"
exec "$VENV/bin/python" -m horotopo plan "${1:-horotopo/data/topologies/racks-2x3.json}" --size 64M
