"""Test support for GPU tests: skip without a device, or fail when a device is required.

``HOROTOPO_TEST_GPU=1`` (set by benchmarks/gpu_check.sh) turns the "no CUDA device" skip into a
failure, so a GPU run cannot pass by skipping everything. (It imports pytest and reads a
test-only variable: neither belongs in horotopo.)
"""
from __future__ import annotations

import os
from typing import Any

import pytest

from horotopo.gpu.env import cupy_module, device_status

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
