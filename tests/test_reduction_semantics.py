"""One answer on every path: min/max as IEEE 754-2019 (NaN propagates and is canonical, -0.0
below +0.0), sum and product exact where their inputs make them so, for every float dtype and
every allreduce algorithm (tree, ring, dbtree, the library's), in process over threads.

The library's allreduce here is a stand-in that folds the ranks in rank order with C's
comparisons, as MPICH's and Open MPI's built-in MAX and MIN do, so the order-dependent answer
that MPI gives to [NaN, 1] against [1, NaN] is reproduced without MPI.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from engine_cases import random_plan
from loop_transport import LoopTransport, run_ranks
from reduction_cases import (OPS, dtype_name, float_dtypes, mismatches, oracle, reported_case,
                             special_input)
from horotopo import buffers, ops
from horotopo.engine import Engine
from horotopo.gpu.elementwise import reduce_arrays

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

ALGORITHMS = ("tree", "ring", "dbtree", "mpi")
DTYPES = float_dtypes()


class CompareLibrary(LoopTransport):
    """A LoopTransport whose library allreduce folds the ranks' buffers in rank order with
    ``acc = acc > x ? acc : x`` (max) and ``acc = acc < x ? acc : x`` (min), as MPI's built-in
    reductions are written."""

    def allreduce(self, sendbuf, recvbuf, op):
        world = self.world
        world.slots[self.rank] = np.array(sendbuf, copy=True)
        world.barrier.wait(timeout=20)
        acc = world.slots[0].copy()
        for x in world.slots[1:]:
            if op == "max":
                acc = np.where(acc > x, acc, x)
            elif op == "min":
                acc = np.where(acc < x, acc, x)
            else:
                acc = ops.UFUNCS[op](acc, x)
        world.barrier.wait(timeout=20)
        recvbuf[...] = acc


def compare_library(world, rank):
    if not hasattr(world, "barrier"):
        world.barrier = threading.Barrier(world.size)
        world.slots = [None] * world.size
    return CompareLibrary(world, rank)


def _all_paths(n, inputs_of, op, chunk_bytes=256):
    """Every algorithm's result on every rank: ``{algorithm: [rank 0's, rank 1's, ...]}``."""
    plan = random_plan(n, seed=7, chunk_bytes=chunk_bytes)

    def body(t):
        eng = Engine(t, plan)
        try:
            return {alg: eng.allreduce(inputs_of(t.rank), op=op, algorithm=alg)
                    for alg in ALGORITHMS}
        finally:
            eng.close()

    per_rank = run_ranks(n, body, transport=compare_library)
    return {alg: [r[alg] for r in per_rank] for alg in ALGORITHMS}


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("count", [16384, 1 << 20])
def test_the_reported_case_gives_nan_nan_on_every_path(op, count):
    # rank 0 holds [NaN, 1], rank 1 [1, NaN]: the library's own float MAX and MIN answer
    # [1, NaN], as MPI did
    def library_alone(t):
        x = reported_case(t.rank, count)
        t.allreduce(x, x, op)
        return x[:2]

    for res in run_ranks(2, library_alone, transport=compare_library):
        assert np.isnan(res).tolist() == [False, True]
    got = _all_paths(2, lambda r: reported_case(r, count), op, chunk_bytes=64 << 10)
    want = reported_case(0, count)
    want[:2] = np.nan
    for alg, results in got.items():
        for rank, res in enumerate(results):
            assert res[:2].view(np.uint32).tolist() == [0x7FC00000] * 2, (alg, rank, res[:2])
            assert not mismatches(res, want, op), (alg, rank)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,count", [(2, 1), (3, 7), (3, 4099)])
def test_every_path_matches_the_oracle_bit_for_bit(dtype, op, n, count):
    inputs = [special_input(r, count, dtype, op) for r in range(n)]
    want = oracle(inputs, op)
    got = _all_paths(n, lambda r: inputs[r].copy(), op)
    for alg, results in got.items():
        for rank, res in enumerate(results):
            bad = mismatches(res, want, op)
            assert not bad, f"{alg} on rank {rank}: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("op", ["max", "min"])
def test_one_rank_makes_nan_canonical_too(dtype, op):
    x = special_input(0, 64, dtype, op)

    def body(t):
        eng = Engine(t, random_plan(1, seed=1, chunk_bytes=256))
        try:
            return eng.allreduce(x.copy(), op=op)
        finally:
            eng.close()

    got = run_ranks(1, body)[0]
    assert not mismatches(got, oracle([x], op), op)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_reduce_pair_orders_signed_zeros_either_way_round(dtype):
    a = np.array([-0.0, 0.0, -0.0, 0.0, np.nan, 1.0, -np.inf, np.inf], dtype=dtype)
    b = np.array([0.0, -0.0, -0.0, 0.0, 1.0, np.nan, 5.0, 5.0], dtype=dtype)
    for x, y in ((a, b), (b, a)):
        hi = ops.reduce_pair(np, x.copy(), y, "max", np.empty_like(x))
        lo = ops.reduce_pair(np, x.copy(), y, "min", np.empty_like(x))
        assert np.signbit(hi[:4].astype(np.float32)).tolist() == [False, False, True, False]
        assert np.signbit(lo[:4].astype(np.float32)).tolist() == [True, True, True, False]
        assert np.isnan(hi[4:6].astype(np.float32)).all()
        assert np.isnan(lo[4:6].astype(np.float32)).all()
        assert hi[6:].astype(np.float32).tolist() == [5.0, np.inf]
        assert lo[6:].astype(np.float32).tolist() == [-np.inf, 5.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("op", ["max", "min"])
def test_order_keys_round_trip_and_order_like_the_op(dtype, op):
    values = special_input(3, 500, dtype, "max")
    keys = buffers.order_keys(values, op)
    back = np.empty_like(values)
    buffers.from_order_keys(keys, back, op)
    buffers.canonical_nan_into(back)
    canonical = values.copy()
    buffers.canonical_nan_into(canonical)
    assert back.view(np.uint8).tolist() == canonical.view(np.uint8).tolist()
    # folding the keys with plain integer max/min gives the oracle's answer
    pairs = [special_input(r, 500, dtype, "max") for r in range(4)]
    fold = np.maximum if op == "max" else np.minimum
    k = buffers.order_keys(pairs[0], op)
    for x in pairs[1:]:
        k = fold(k, buffers.order_keys(x, op))
    got = np.empty_like(pairs[0])
    buffers.from_order_keys(k, got, op)
    buffers.canonical_nan_into(got)
    assert not mismatches(got, oracle(pairs, op), op)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_the_gpu_step_on_the_host_follows_the_same_rules(dtype, op):
    # reduce_arrays is the CuPy fallback's step (and the host twin of native/reduce.cu)
    dt = next((d for d in DTYPES if dtype_name(d) == dtype), None)
    if dt is None:
        pytest.skip("bfloat16 needs ml-dtypes")
    xs = [special_input(r, 300, dt, op) for r in range(2)]
    for first, second in ((0, 1), (1, 0)):
        acc = xs[first].copy()
        raw = dtype == "bfloat16"
        reduce_arrays(np, acc.view(np.uint16) if raw else acc,
                      xs[second].view(np.uint16) if raw else xs[second], op,
                      dtype="bfloat16" if raw else None)
        buffers.canonical_nan_into(acc)
        assert not mismatches(acc, oracle(xs, op), op)


def test_integers_are_unaffected():
    inputs = [np.array([3, -7, 2**31 - 1, -2**31, 0], dtype=np.int32),
              np.array([-3, 7, -2**31, 2**31 - 1, 0], dtype=np.int32)]
    for op, fold in (("max", np.maximum), ("min", np.minimum)):
        got = _all_paths(2, lambda r: inputs[r].copy(), op)
        want = fold(inputs[0], inputs[1])
        for results in got.values():
            for res in results:
                assert res.dtype == np.int32 and res.tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_sums_and_products_wrap_as_twos_complement_on_every_path(dtype):
    top = np.iinfo(dtype).max
    inputs = [np.array([top, top, -3, 7], dtype=dtype), np.array([1, top, 5, 1 << 20], dtype=dtype)]
    for op, fold in (("sum", np.add), ("product", np.multiply)):
        got = _all_paths(2, lambda r: inputs[r].copy(), op)
        want = fold(inputs[0], inputs[1])
        for alg, results in got.items():
            for res in results:
                assert res.tolist() == want.tolist(), (alg, op)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d.itemsize == 2], ids=dtype_name)
def test_a_half_precision_step_computes_in_float32_and_rounds_once(dtype):
    # two ranks: one step, so every path rounds the float32 sum once
    rng = np.random.default_rng(5)
    inputs = [(rng.standard_normal(4099) * 100).astype(dtype) for _ in range(2)]
    want = (inputs[0].astype(np.float32) + inputs[1].astype(np.float32)).astype(dtype)
    got = _all_paths(2, lambda r: inputs[r].copy(), "sum")
    for alg, results in got.items():
        for res in results:
            assert res.view(np.uint16).tolist() == want.view(np.uint16).tolist(), alg


@pytest.mark.parametrize("special", [None, "-0.0", "nan"])
def test_the_library_checks_large_buffers_first_and_still_gives_the_oracle(special):
    from horotopo.params import ENGINE

    count = ENGINE.check_first_bytes // 4 + 17
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
    inputs[0][5] = inputs[1][5] = 0.0
    if special == "-0.0":
        inputs[1][5] = -0.0  # C's `>` keeps rank 1's -0.0 against rank 0's +0.0
    elif special == "nan":
        inputs[0][9] = np.nan  # C's `>` drops rank 0's NaN
    for op in ("max", "min"):
        want = oracle(inputs, op)
        got = _all_paths(2, lambda r: inputs[r].copy(), op, chunk_bytes=64 << 10)
        for alg, results in got.items():
            for res in results:
                assert not mismatches(res, want, op), (alg, op, special)
