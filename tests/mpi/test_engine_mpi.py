"""The engine under mpiexec at any size: tree, ring, hierarchical and MPI allreduce and the tree
broadcast, checked against MPI_Allreduce on exact small-integer data, for every dtype, op, size
and in/out of place, with forced tiny chunks and random plans (same seed on every rank), plus
mismatched buffers that must raise on every rank.

Every check is agreed across ranks before it asserts, so a failure on one rank fails all of
them together instead of leaving the others waiting in the next collective.
"""
import hashlib

import numpy as np
import pytest
from mpi4py import MPI

import engine_cases
from engine_cases import horovod_scaled as scale
from mpi_helpers import agree

from horotopo.algorithms.hierarchical import HierarchicalAllreduce
from horotopo.engine import Engine, MismatchError
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from horotopo.validate import validate

COMM = MPI.COMM_WORLD
N = COMM.size
RANK = COMM.rank
SIZES = [0, 1, 7, 1000, 100003]
DTYPES = ["float16", "float32", "float64", "int32", "int64"]
OPS = ["sum", "average", "min", "max", "product"]


def random_plan(seed, chunk_bytes=1 << 20, trees=None):
    return engine_cases.random_plan(N, seed, chunk_bytes, trees)


def ring_plan(chunk_bytes=1 << 20):
    plan = plan_from_trees(N, [(r, *ring_parents(N, r), 1.0) for r in range(N)],
                           chunk_bytes=chunk_bytes)
    validate(plan)
    return plan


def inputs(count, dtype, op, seed):
    """Small integers: every reduction of them over <= 5 ranks is exact in every dtype."""
    rng = np.random.default_rng(1000 * seed + RANK)
    if op == "product":
        x = rng.choice([-1, 1, 2], count)
    elif op in ("min", "max"):
        x = rng.integers(-50, 51, count)
    else:
        x = rng.integers(0, 4, count)
    return x.astype(dtype)




_MPI_OPS = {"sum": MPI.SUM, "average": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX,
            "product": MPI.PROD}


def reference(x, op, pre=1.0, post=1.0):
    """MPI_Allreduce of the (prescaled) input, in a dtype wide enough to be exact."""
    wide = np.float64 if x.dtype.kind == "f" else np.int64
    scaled = scale(x, pre, x.dtype).astype(wide)
    out = np.empty_like(scaled)
    COMM.Allreduce(scaled, out, op=_MPI_OPS[op])
    if op == "average":
        post = post / N
    return scale(out.astype(x.dtype), post, x.dtype)


def same_bits_everywhere(arr):
    digest = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
    return len(set(COMM.allgather(digest))) == 1


def check_allreduce(eng, x, op, alg, in_place, pre=1.0, post=1.0, what="", want=None):
    """One allreduce against MPI_Allreduce (or ``want``, for dtypes MPI lacks): exact values,
    right object, same bits everywhere."""
    if want is None:
        want = reference(x, op, pre, post)
    if in_place:
        buf = x.copy()
        got = eng.allreduce(buf, buf, op=op, prescale_factor=pre, postscale_factor=post,
                            algorithm=alg)
        ok_obj = got is buf
    else:
        before = x.copy()
        got = eng.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post,
                            algorithm=alg)
        ok_obj = got is not x and np.array_equal(x, before)
    exact = got.dtype == x.dtype and got.shape == x.shape and np.array_equal(got, want)
    bad = int(np.count_nonzero(got != want)) if got.shape == want.shape else -1
    digest = hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()
    every = COMM.allgather((ok_obj and exact, digest))
    label = (f"{what} {alg} {op} {x.dtype} n={x.size} in_place={in_place} pre={pre} "
             f"post={post}")
    wrong = [r for r, (k, _) in enumerate(every) if not k]
    assert not wrong, f"{label}: wrong on ranks {wrong} ({bad} elements here)"
    assert len({d for _, d in every}) == 1, f"{label}: results differ across ranks"


@pytest.mark.parametrize("alg", ["tree", "ring", "mpi", "hierarchical"])
def test_every_dtype_op_and_size(alg):
    eng = Engine(COMM, random_plan(7, chunk_bytes=65536) if alg == "tree" else ring_plan(65536))
    try:
        k = 0
        for dtype in DTYPES:
            for op in OPS:
                for count in SIZES:
                    check_allreduce(eng, inputs(count, dtype, op, k), op, alg,
                                    in_place=bool(k % 2), what=f"case {k}")
                    k += 1
    finally:
        eng.close()


@pytest.mark.parametrize("alg", ["tree", "ring"])
def test_forced_tiny_chunks(alg):
    for chunk, count in ((8, 7), (8, 1000), (1024, 100003)):
        plan = ring_plan(chunk) if alg == "ring" else random_plan(11 + chunk, chunk)
        with Engine(COMM, plan) as eng:
            for k, (dtype, op) in enumerate((("int32", "sum"), ("float64", "max"))):
                check_allreduce(eng, inputs(count, dtype, op, k), op, alg, in_place=bool(k),
                                what=f"chunk {chunk}")


def test_many_chunks_repeated_stay_in_order():
    # MPI may complete requests out of order; every stream must still be posted in chunk
    # order. Many in-flight chunks, repeated, is where a violation shows up.
    with Engine(COMM, ring_plan(16384)) as eng:
        x = inputs(300007, "float32", "sum", 5)
        want = reference(x, "sum")
        out = np.empty_like(x)
        for it in range(4):
            out[...] = -1
            eng.allreduce(x, out, algorithm="tree")
            agree(np.array_equal(out, want), f"iteration {it}: "
                                             f"{int(np.count_nonzero(out != want))} wrong")


@pytest.mark.parametrize("window", [1, 2])
def test_smallest_windows(window):
    with Engine(COMM, random_plan(61 + window, 64, trees=2), window=window) as eng:
        for k, (dtype, op) in enumerate((("float32", "sum"), ("int32", "max"))):
            check_allreduce(eng, inputs(200, dtype, op, k), op, "tree", in_place=bool(k),
                            what=f"window {window}")
        want = np.arange(100, dtype=np.float64)
        buf = want.copy() if RANK == N - 1 else np.zeros_like(want)
        eng.broadcast(buf, N - 1)
        agree(np.array_equal(buf, want), f"broadcast window {window}")


@pytest.mark.parametrize("seed", range(6))
def test_random_plans(seed):
    rng = np.random.default_rng(seed)
    chunk = int(rng.choice([8, 100, 4096]))
    plan = random_plan(100 + seed, chunk_bytes=chunk)
    with Engine(COMM, plan) as eng:
        for k, count in enumerate((1, 7, 1000, 30011) if chunk > 8 else (1, 7, 300)):
            for dtype, op in (("float32", "sum"), ("int64", "product"), ("float16", "min")):
                check_allreduce(eng, inputs(count, dtype, op, k), op, "tree",
                                in_place=bool((k + seed) % 2), what=f"seed {seed}")


@pytest.mark.parametrize("alg", ["tree", "ring", "mpi", "hierarchical"])
def test_prescale_and_postscale(alg):
    with Engine(COMM, random_plan(3, 512) if alg == "tree" else ring_plan(512)) as eng:
        for k, dtype in enumerate(DTYPES):
            for op in ("sum", "average"):
                check_allreduce(eng, inputs(1000, dtype, op, k), op, alg, in_place=bool(k % 2),
                                pre=2.0, post=0.25, what="scaled")
                check_allreduce(eng, inputs(7, dtype, op, k), op, alg, in_place=not (k % 2),
                                pre=0.5, post=3.0, what="scaled")


@pytest.mark.parametrize("alg", ["tree", "ring", "mpi", "hierarchical"])
def test_random_floats_identical_on_every_rank(alg):
    x = np.random.default_rng(RANK).standard_normal(100003).astype(np.float32)
    want = np.empty_like(x)
    COMM.Allreduce(x, want)
    with Engine(COMM, random_plan(5, 4096, trees=3) if alg == "tree" else ring_plan(4096)) as eng:
        got = eng.allreduce(x, op="average", algorithm=alg)
    agree(same_bits_everywhere(got), f"{alg}: float results differ across ranks")
    agree(np.allclose(got, want / N, rtol=1e-5, atol=1e-5), f"{alg}: far from MPI_Allreduce")


@pytest.mark.parametrize("hosts", ["pairs", "alternate", "one each"])
def test_hierarchical_on_hosts_named_for_it(hosts):
    # Every rank here runs on one machine (the engine's hierarchical is then one host); named
    # hosts make its cross-host rings run over MPI: ranks paired, alternating (hosts of
    # unequal size at odd N), one host per rank.
    names = [{"pairs": r // 2, "alternate": r % 2, "one each": r}[hosts] for r in range(N)]
    with Engine(COMM, ring_plan(512)) as eng:
        runner = HierarchicalAllreduce(eng.transport, hosts=[f"h{h}" for h in names])
        for k, (count, dtype, op) in enumerate(((1, "int32", "sum"), (7, "float64", "max"),
                                                (1000, "float32", "sum"),
                                                (100003, "int64", "product"))):
            x = inputs(count, dtype, op, k)
            want = reference(x, op)
            out = np.empty_like(x)
            runner.run(x, out, op, 64)
            same = same_bits_everywhere(out)  # collective: asked on every rank
            agree(np.array_equal(out, want) and same,
                  f"{hosts} {dtype} {op} n={count}: "
                  f"{int(np.count_nonzero(out != want))} wrong")


def test_automatic_choice_is_correct_at_every_size():
    with Engine(COMM, random_plan(9, 8192)) as eng:
        for k, count in enumerate(SIZES + [1 << 20]):
            check_allreduce(eng, inputs(count, "float32", "sum", k), "sum", None,
                            in_place=bool(k % 2), what="auto")
            agree(eng.last_algorithm in ("tree", "mpi"), str(eng.last_algorithm))


@pytest.mark.parametrize("chunk", [8, 4096, 1 << 20])
def test_broadcast_every_dtype_root_and_size(chunk):
    plan = random_plan(21 + chunk, chunk) if chunk != 4096 else ring_plan(chunk)
    with Engine(COMM, plan) as eng:
        for dtype in DTYPES + ["uint8"]:
            for root in range(N):
                for count in SIZES if chunk > 8 else (0, 1, 7, 300):
                    want = ((np.arange(count) * 7 + root) % 251).astype(dtype)
                    buf = want.copy() if RANK == root else np.full(count, 3, dtype=dtype)
                    got = eng.broadcast(buf, root)
                    agree(got is buf and np.array_equal(buf, want),
                          f"broadcast {dtype} root {root} n={count} chunk {chunk}")


def test_broadcast_keeps_shape_and_works_after_allreduce():
    with Engine(COMM, random_plan(31, 64)) as eng:
        buf = np.arange(24, dtype=np.float64).reshape(2, 3, 4) * (RANK == N - 1)
        eng.allreduce(np.ones(5, np.int32))
        eng.broadcast(buf, N - 1)
        agree(buf.shape == (2, 3, 4) and buf.ravel().tolist() == list(range(24)), "shape")


def _expect_mismatch_everywhere(fn, match):
    try:
        fn()
    except MismatchError as exc:
        agree(match in str(exc), f"message {exc!s} lacks {match!r}")
        return
    except Exception as exc:  # pragma: no cover - reported through agree
        agree(False, f"raised {type(exc).__name__}: {exc}")
    agree(False, "no MismatchError")


def _needs_two():
    if N < 2:
        pytest.skip("a mismatch needs at least two ranks")


def test_mismatched_count_raises_on_every_rank():
    _needs_two()
    with Engine(COMM, random_plan(41, 64)) as eng:
        x = np.ones(100 + (RANK == 0), np.float32)
        for alg in ("tree", "ring", "mpi", None):
            _expect_mismatch_everywhere(lambda: eng.allreduce(x, algorithm=alg), "element count")
        check_allreduce(eng, inputs(50, "int32", "sum", 0), "sum", "tree", False, what="after")


def test_mismatched_dtype_op_algorithm_and_root_raise_on_every_rank():
    _needs_two()
    with Engine(COMM, ring_plan(256)) as eng:
        x = np.ones(64, np.float64 if RANK == 0 else np.float32)
        _expect_mismatch_everywhere(lambda: eng.allreduce(x), "dtype")
        y = np.ones(64, np.int32)
        _expect_mismatch_everywhere(lambda: eng.allreduce(y, op="max" if RANK else "min"), "op")
        _expect_mismatch_everywhere(
            lambda: eng.allreduce(y, algorithm="ring" if RANK else "tree"), "algorithm")
        _expect_mismatch_everywhere(lambda: eng.broadcast(y, 1 if RANK == 0 else 0), "root")
        z = np.ones(10 + RANK, np.uint8)
        _expect_mismatch_everywhere(lambda: eng.broadcast(z, 0), "element count")
        got = eng.allreduce(y)
        agree(got.tolist() == [N] * 64, "engine unusable after mismatches")


def test_invalid_arguments_on_one_rank_raise_everywhere():
    with Engine(COMM, ring_plan()) as eng:
        x = np.ones(8, np.float32)
        try:
            eng.allreduce(x, op="bogus" if RANK == 0 else "sum")
        except MismatchError as exc:
            agree(RANK != 0 and "invalid arguments" in str(exc), f"rank {RANK}: {exc}")
        except ValueError as exc:
            agree(RANK == 0 and "op must be" in str(exc), f"rank {RANK}: {exc}")
        else:
            agree(False, "no error")
        agree(eng.allreduce(x).tolist() == [float(N)] * 8, "unusable after the error")


def test_mismatched_plans_raise_at_construction():
    _needs_two()
    plan = ring_plan(1024 if RANK == 0 else 2048)
    _expect_mismatch_everywhere(lambda: Engine(COMM, plan), "ranks disagree")


def test_two_engines_on_one_communicator_do_not_cross():
    a = Engine(COMM, random_plan(51, 128))
    b = Engine(COMM, ring_plan(128))
    try:
        x = inputs(5000, "int64", "sum", 3)
        ra = a.allreduce(x, algorithm="tree")
        rb = b.allreduce(x * 2, algorithm="ring")
        ra2 = a.allreduce(x * 3, algorithm="tree")
        want = reference(x, "sum")
        agree(np.array_equal(ra, want) and np.array_equal(rb, 2 * want)
              and np.array_equal(ra2, 3 * want), "engines crossed")
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("alg", ["tree", "ring", "mpi"])
def test_torch_cpu_tensors_in_and_out(alg):
    """Engine calls on torch tensors work on the tensors' own memory and return tensors."""
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    import horotopo.torch  # noqa: F401 (registers the engine's torch buffer adapter)
    with Engine(COMM, random_plan(5, 256) if alg == "tree" else ring_plan(256)) as eng:
        x = inputs(1000, "float32", "sum", 3)
        want = reference(x, "sum")
        t = torch.from_numpy(x.copy()).reshape(10, 100)
        got = eng.allreduce(t, op="sum", algorithm=alg)
        agree(isinstance(got, torch.Tensor) and got.shape == (10, 100) and got is not t
              and np.array_equal(got.numpy().reshape(-1), want), f"{alg}: out of place")
        agree(np.array_equal(t.numpy().reshape(-1), x), f"{alg}: input modified")
        got = eng.allreduce(t, t, op="sum", algorithm=alg)
        agree(got is t and np.array_equal(t.numpy().reshape(-1), want), f"{alg}: in place")
        b = torch.arange(7, dtype=torch.int64) * (RANK == 0)
        agree(eng.broadcast(b, 0) is b and b.tolist() == list(range(7)), "broadcast")
