"""Case builders shared by the engine's exact-result grids (under mpiexec and simulated)."""
from __future__ import annotations

from typing import List

import numpy as np


def random_arborescence(n: int, root: int, rng: np.random.Generator) -> List[int]:
    """A random parent array of a tree spanning ``n`` ranks into ``root`` (root's parent -1)."""
    order = [root] + [int(v) for v in rng.permutation([v for v in range(n) if v != root])]
    parent = [-1] * n
    for i in range(1, n):
        parent[order[i]] = order[int(rng.integers(0, i))]
    return parent


def horovod_scaled(values: np.ndarray, factor: float, dtype) -> np.ndarray:
    """Horovod's scaling: floats in their precision (half via float32), ints via float64."""
    dtype = np.dtype(dtype)
    if factor == 1.0:
        return values.astype(dtype)
    if dtype.kind == "f":
        if dtype == np.float16:
            return (values.astype(np.float32) * np.float32(factor)).astype(np.float16)
        return values.astype(dtype) * dtype.type(factor)
    return (values.astype(np.float64) * factor).astype(dtype)
