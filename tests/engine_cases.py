"""Case builders shared by the engine's exact-result grids (under mpiexec and simulated)."""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from horotopo.plan import Plan, plan_from_trees
from horotopo.validate import validate


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


def random_plan(n: int, seed: int, chunk_bytes: int, trees: Optional[int] = None) -> Plan:
    """A validated plan of 1-3 (or ``trees``) random tree pairs over ``n`` ranks, same on every
    rank for the same ``seed``."""
    rng = np.random.default_rng(seed)
    spec = []
    for _ in range(trees or int(rng.integers(1, 4))):
        root = int(rng.integers(0, n))
        spec.append((root, random_arborescence(n, root, rng), random_arborescence(n, root, rng),
                     float(rng.uniform(0.1, 2.0))))
    plan = plan_from_trees(n, spec, chunk_bytes=chunk_bytes)
    validate(plan)
    return plan
