"""Test support for GPU tests: skip without a device, or fail when a device is required.

``HOROTOPO_TEST_GPU=1`` (set by benchmarks/gpu_check.sh) turns the "no CUDA device" skip into a
failure, so a GPU run cannot pass by skipping everything. (Moved here from the package: test
support imports pytest and reads a test-only variable, neither of which belongs in horotopo.)
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from horotopo.gpu._env import cupy_module, device_status

TEST_GPU_ENV = "HOROTOPO_TEST_GPU"
SKIP_REASON = "no CUDA device"


def require_device() -> Any:
    """Return cupy when a CUDA device is usable; otherwise skip (or fail under HOROTOPO_TEST_GPU=1)."""
    ok, why = device_status()
    if ok:
        return cupy_module()
    if os.environ.get(TEST_GPU_ENV) == "1":
        pytest.fail(f"{TEST_GPU_ENV}=1 but {SKIP_REASON}: {why}")
    pytest.skip(SKIP_REASON)


def two_tree_plan(n: int, chunk_bytes: int) -> Any:
    """benchmarks/gpu_allreduce.py's plan (a chain and a star of uneven shares), so that the GPU
    tests run the plan the GPU check measures. Loaded from the file: benchmarks/ is no package,
    and it imports mpi4py.MPI, which only the MPI tests may do."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_allreduce.py"
    spec = importlib.util.spec_from_file_location("gpu_allreduce", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.two_tree_plan(n, chunk_bytes)
