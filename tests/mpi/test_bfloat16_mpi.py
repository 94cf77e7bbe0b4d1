"""bfloat16 (ml_dtypes) through the engine under mpiexec at any size: tree, ring and the MPI
library path, every op, in and out of place, lengths 0, 1, shorter than the number of ranks
and primes (several chunks), prescale/postscale, broadcast, and the benchmark's #wrong.

Inputs are small integers, which bfloat16 holds exactly (8 significant bits: every integer up
to 256), so every result here is exact and compared bit for bit; random floats are checked for
identical bits on every rank. Checks go through ``agree`` so all ranks fail together.
"""
import numpy as np
import pytest
from mpi4py import MPI

from horotopo.engine import Engine, MismatchError
from mpi_helpers import agree
from test_engine_mpi import check_allreduce, random_plan, ring_plan, same_bits_everywhere

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 on the CPU needs ml-dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

COMM = MPI.COMM_WORLD
N = COMM.size
RANK = COMM.rank
OPS = ["sum", "average", "min", "max", "product"]
# 0, 1, shorter than the ranks (N - 1 at N >= 3), primes: one chunk, and many of 1 KiB.
SIZES = sorted({0, 1, max(0, N - 1), 2, 7, 131, 65537})
_MPI_OPS = {"sum": MPI.SUM, "average": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX,
            "product": MPI.PROD}


def engine_for(alg, chunk_bytes=1024):
    return Engine(COMM, random_plan(17, chunk_bytes) if alg == "tree" else ring_plan(chunk_bytes))


def small_ints(count, op, seed):
    """Values whose reduction over <= 5 ranks is an integer of at most 2**8 in magnitude."""
    rng = np.random.default_rng(1000 * seed + RANK)
    if op == "product":
        return rng.choice([-1, 1, 2], count)
    if op in ("min", "max"):
        return rng.integers(-50, 51, count)
    return rng.integers(0, 4, count)


def f32_scale(values, factor):
    """The engine's bfloat16 scaling: float32 product, rounded to bfloat16 once."""
    if factor == 1.0:
        return values.astype(BF16)
    return (values.astype(np.float32) * np.float32(factor)).astype(BF16)


def reference(x, op, pre=1.0, post=1.0):
    """The exact result: MPI_Allreduce in float64 of the prescaled bfloat16 input."""
    wide = f32_scale(x, pre).astype(np.float64)
    out = np.empty_like(wide)
    COMM.Allreduce(wide, out, op=_MPI_OPS[op])
    return f32_scale(out.astype(BF16), post / N if op == "average" else post)


def bits(arr):
    return np.ascontiguousarray(arr).view(np.uint16)


def check(eng, x, op, alg, in_place, pre=1.0, post=1.0, what=""):
    """The engine's checks (values, returned object, same bits on every rank) against the
    exact bfloat16 answer."""
    check_allreduce(eng, x, op, alg, in_place, pre, post, what, want=reference(x, op, pre, post))


@pytest.mark.parametrize("alg", ["tree", "ring", "mpi"])
def test_bf16_every_op_size_in_and_out_of_place(alg):
    with engine_for(alg) as eng:
        k = 0
        for op in OPS:
            for count in SIZES:
                x = small_ints(count, op, k).astype(BF16)
                check(eng, x, op, alg, in_place=bool(k % 2), what=f"case {k}")
                k += 1


@pytest.mark.parametrize("alg", ["tree", "ring", "mpi"])
def test_bf16_prescale_and_postscale(alg):
    with engine_for(alg, 512) as eng:
        for k, (pre, post) in enumerate(((2.0, 0.25), (3.0, 0.5), (0.5, 3.0))):
            for op in ("sum", "average", "max"):
                # Still exact: sums over <= 5 ranks of 3 * (0..3) are <= 45, maxima of
                # 3 * (-50..50) need 8 significant bits, and the factors are halves or 3.
                x = small_ints(1009, op, k).astype(BF16)
                check(eng, x, op, alg, in_place=bool(k % 2), pre=pre, post=post, what="scaled")


@pytest.mark.parametrize("alg", ["tree", "ring", "mpi"])
def test_bf16_random_floats_identical_on_every_rank(alg):
    x = np.random.default_rng(RANK).standard_normal(30011).astype(BF16)
    want = np.empty(x.size, np.float64)
    COMM.Allreduce(x.astype(np.float64), want)
    with engine_for(alg, 4096) as eng:
        got = eng.allreduce(x, op="average", algorithm=alg)
    agree(same_bits_everywhere(got), f"{alg}: bfloat16 results differ across ranks")
    # Each tree/ring step rounds to bfloat16 (8 bits); a handful of steps stay close.
    agree(np.allclose(got.astype(np.float64), want / N, rtol=0.05, atol=0.05),
          f"{alg}: far from the float64 answer")


def test_bf16_broadcast_every_root():
    with engine_for("tree", 64) as eng:
        for root in range(N):
            for count in (0, 1, 7, 1000):
                want = (np.arange(count) % 200 - 100).astype(BF16)
                buf = want.copy() if RANK == root else np.zeros(count, BF16)
                got = eng.broadcast(buf, root)
                agree(got is buf and np.array_equal(bits(buf), bits(want)),
                      f"broadcast root {root} n={count}")


def test_bf16_against_float16_raises_on_every_rank():
    if N < 2:
        pytest.skip("a mismatch needs at least two ranks")
    with engine_for("tree") as eng:
        x = np.ones(10, BF16 if RANK == 0 else np.float16)
        try:
            eng.allreduce(x)
        except MismatchError as exc:
            agree("dtype" in str(exc), str(exc))
        else:
            agree(False, "no MismatchError")
        agree(eng.allreduce(np.ones(3, BF16)).astype(np.float32).tolist() == [N] * 3,
              "engine unusable after the mismatch")
