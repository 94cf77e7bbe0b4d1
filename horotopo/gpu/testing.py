"""Test support for GPU tests: skip without a device, or fail when a device is required.

``HOROTOPO_TEST_GPU=1`` (set by benchmarks/gpu_check.sh) turns the "no CUDA device" skip into a
failure, so a GPU run cannot pass by skipping everything.
"""
from __future__ import annotations

import os
from typing import Any

from ._env import cupy_module, device_status

TEST_GPU_ENV = "HOROTOPO_TEST_GPU"
SKIP_REASON = "no CUDA device"


def require_device() -> Any:
    """Return cupy when a CUDA device is usable; otherwise skip (or fail under HOROTOPO_TEST_GPU=1)."""
    import pytest

    ok, why = device_status()
    if ok:
        return cupy_module()
    if os.environ.get(TEST_GPU_ENV) == "1":
        pytest.fail(f"{TEST_GPU_ENV}=1 but {SKIP_REASON}: {why}")
    pytest.skip(SKIP_REASON)


def two_tree_plan(n: int, chunk_bytes: int) -> Any:
    """A plan of two trees for ``n`` ranks: a chain rooted at 0 (rate 2) and a star rooted at
    n-1 (rate 1). Uneven shares, deep and shallow trees: what the GPU tests and checks use."""
    from ..plan import plan_from_trees

    chain = [-1] + list(range(n - 1))
    star = [n - 1] * n
    star[n - 1] = -1
    return plan_from_trees(n, [(0, chain, chain, 2.0), (n - 1, star, star, 1.0)],
                           chunk_bytes=chunk_bytes)
