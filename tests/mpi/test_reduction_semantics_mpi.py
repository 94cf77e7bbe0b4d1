"""One answer on every path under mpiexec, at any size: every allreduce algorithm (tree, ring,
dbtree and MPI_Allreduce) against the oracle of tests/reduction_cases.py, bit for bit, for every
float dtype and for max, min, sum and product with NaN, +-Inf and -0.0 mixed in; and the case
MPI answers [1, NaN]: [NaN, 1] against [1, NaN] for max and min, at 16,384 and 1M elements.
"""
import numpy as np
import pytest
from mpi4py import MPI

from horotopo.engine import Engine
from reduction_cases import (OPS, dtype_name, float_dtypes, mismatches, oracle, reported_case,
                             special_input)
from test_engine_mpi import agree, random_plan

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

COMM = MPI.COMM_WORLD
N = COMM.size
RANK = COMM.rank
ALGORITHMS = ("tree", "ring", "dbtree", "mpi")


@pytest.fixture(scope="module")
def engine():
    eng = Engine(COMM, random_plan(23, chunk_bytes=4096))
    yield eng
    eng.close()


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("count", [16384, 1 << 20])
def test_the_reported_case_gives_nan_nan_on_every_path(engine, op, count):
    want = reported_case(0, count)
    want[:2] = np.nan if N > 1 else want[:2]
    if N == 1:
        want[1] = 1.0
    problems = []
    for alg in ALGORITHMS:
        got = engine.allreduce(reported_case(RANK, count), op=op, algorithm=alg)
        problems += [f"{alg}: {m}" for m in mismatches(got, want, op)]
    agree(not problems, problems[:4])


@pytest.mark.parametrize("dtype", float_dtypes(), ids=dtype_name)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("count", [1, 5, 4099])
def test_every_path_matches_the_oracle_bit_for_bit(engine, dtype, op, count):
    inputs = [special_input(r, count, dtype, op, seed=count) for r in range(N)]
    want = oracle(inputs, op)
    problems = []
    for alg in ALGORITHMS:
        got = engine.allreduce(inputs[RANK].copy(), op=op, algorithm=alg)
        problems += [f"{alg}: {m}" for m in mismatches(got, want, op)]
    agree(not problems, problems[:4])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["sum", "product", "max", "min"])
def test_integers_wrap_and_compare_alike_on_every_path(engine, dtype, op):
    top = np.iinfo(dtype).max
    inputs = [np.array([top, -3 - r, 7, r % 2, -top], dtype=dtype) for r in range(N)]
    fold = {"sum": np.add, "product": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    want = inputs[0].copy()
    for x in inputs[1:]:
        want = fold(want, x)
    problems = []
    for alg in ALGORITHMS:
        got = engine.allreduce(inputs[RANK].copy(), op=op, algorithm=alg)
        if got.tolist() != want.tolist():
            problems.append(f"{alg}: {got.tolist()} != {want.tolist()}")
    agree(not problems, problems)
