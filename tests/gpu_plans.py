"""The plan the GPU checks run: shared by the GPU tests and benchmarks/gpu_allreduce.py, so that
the tests run the plan the GPU benchmark measures. Needs nothing but horotopo (no pytest, no
MPI), so that the benchmark can import it as well."""
from __future__ import annotations

from horotopo.plan import Plan, plan_from_trees


def two_tree_plan(n: int, chunk_bytes: int) -> Plan:
    """A plan of two trees for ``n`` ranks: a chain rooted at 0 (rate 2) and a star rooted at
    n-1 (rate 1). Uneven shares, deep and shallow trees."""
    chain = [-1] + list(range(n - 1))
    star = [n - 1] * n
    star[n - 1] = -1
    return plan_from_trees(n, [(0, chain, chain, 2.0), (n - 1, star, star, 1.0)],
                           chunk_bytes=chunk_bytes)
