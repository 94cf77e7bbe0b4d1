"""What Horovod 0.28.1's own CPU arithmetic gives in the cases of its test_torch.py that compare
against exact products, at a given number of ranks, without MPI or Horovod.

    python benchmarks/horovod_arithmetic.py [--ranks N]

Horovod on the CPU (ScaleBufferCPUImpl, the MPI sum) scales integers in float64 and truncates,
float16 in float32 and rounds to float16, float32 by the float32 factor; MPI sums the ranks'
contributions in the tensor's dtype, and Average multiplies the sum by ``(dtype)(1.0 / size)``.
This replays that on the tests' own inputs (their seeds and shapes) and prints, per test, the
dtypes for which Horovod's result fails the test's comparison. At 2 ranks none do; at 3, the
float16 prescale cases and the float32 join average do, whoever computes them that way.
"""
from __future__ import annotations

import argparse
import itertools
from typing import Callable, List

import numpy as np
import torch

INTS = (torch.int32, torch.int64)
DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16]


def horovod_prescaled_sum(t: torch.Tensor, factor: float, dtype: torch.dtype,
                          ranks: int) -> torch.Tensor:
    """Every rank holds ``t``: prescale it as Horovod does, then sum ``ranks`` copies in the
    dtype (float16 through float32 at each step, as Horovod's float16 MPI sum)."""
    if dtype in INTS:
        x = (t.double() * factor).to(dtype)
    elif dtype == torch.float16:
        x = (t.half().float() * np.float32(factor)).half()
    elif dtype == torch.float32:
        x = t.float() * torch.tensor(np.float32(factor))
    else:
        x = t.double() * factor
    total = x.clone()
    for _ in range(ranks - 1):
        total = (total.float() + x.float()).half() if dtype == torch.float16 else total + x
    return total.float() if dtype == torch.float16 else total


def expected_by_the_test(t: torch.Tensor, factor: float, dtype: torch.dtype,
                         ranks: int) -> torch.Tensor:
    """The test's reference: the prescaled value times the number of ranks, in float32 for
    float16 (test_horovod_*_prescale)."""
    wide = torch.float32 if dtype == torch.float16 else torch.float64 if dtype in INTS else dtype
    scaled = (torch.tensor(factor, dtype=torch.float64).type(wide) * t.type(wide)).type(dtype)
    return (scaled.float() if dtype == torch.float16 else scaled) * ranks


def failing_dtypes(seed: int, shape: Callable[[int], List[int]], tensors: int, one_sided: bool,
                   ranks: int) -> List[str]:
    np.random.seed(seed)
    bad = []
    for dtype, dim in itertools.product(DTYPES, [1, 2, 3]):
        torch.manual_seed(1234)
        factor = np.random.uniform()
        for _ in range(tensors):
            t = torch.FloatTensor(*shape(dim)).random_(-100, 100).type(dtype)
            got = horovod_prescaled_sum(t, factor, dtype, ranks)
            want = expected_by_the_test(t, factor, dtype, ranks)
            ok = bool((got - want).max() <= 0) if one_sided else torch.allclose(got, want, 0)
            if not ok:
                bad.append(str(dtype).replace("torch.", ""))
    return sorted(set(bad))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=3)
    ranks = p.parse_args().ranks
    cases = [("test_horovod_allreduce_prescale", 1234, lambda d: [17] * d, 1, False),
             ("test_horovod_reducescatter_prescale", 12345, lambda d: [ranks * 4] * d, 1, True),
             ("test_horovod_grouped_reducescatter_prescale", 12345, lambda d: [ranks * 4] * d,
              5, False)]
    for name, seed, shape, tensors, one_sided in cases:
        bad = failing_dtypes(seed, shape, tensors, one_sided, ranks)
        print(f"{name} at {ranks} ranks: Horovod's arithmetic fails the test for "
              f"{', '.join(bad) or 'no dtype'}")
    # test_horovod_join_allreduce: one rank joined, the other ranks' float32 tensors averaged
    # over all ranks, compared with t * (ranks - 1) / ranks.
    torch.manual_seed(1234)
    t = torch.FloatTensor(5).random_(-100, 100)
    total = t * (ranks - 1)
    horovod = total * np.float32(1.0 / ranks)
    wanted = total / ranks
    differ = (horovod != wanted).nonzero().flatten().tolist()
    print(f"test_horovod_join_allreduce at {ranks} ranks (float32, first tensor): Horovod's "
          f"average differs from the test's in {len(differ)} of {t.numel()} elements" +
          "".join(f"; t = {t[k]:g}: {horovod[k]:.6f} against {wanted[k]:.6f}" for k in differ))


if __name__ == "__main__":
    main()
