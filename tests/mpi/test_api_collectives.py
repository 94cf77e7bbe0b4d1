"""Multi-rank tests of the top-level (NumPy) API, ported from Horovod's documented behaviour.

Runs under mpiexec at any size (tests/test_mpi_tier.py); cases that need two ranks skip at 1.
"""
import logging
import os
import time

import numpy as np
import pytest

import horotopo as hvd
from horotopo.api.basics import runtime
from mpi_launch import DEFAULT_INIT_ENV, INIT_VARIABLES

def start(comm=None):
    """hvd.init() with a ring plan unless HOROTOPO_PROBE is set: probing is tested elsewhere
    and a ring keeps init fast on a small box. The variable is restored at once, so that
    other test modules in this process see the environment they were started with.
    In the MPI tier's default-init launches (DEFAULT_INIT_ENV=1), plain hvd.init(), as a user
    calls it: quick probe, a plan of the measured model, the adaptive engine."""
    if os.environ.get(DEFAULT_INIT_ENV) == "1":
        hvd.init(comm)
        return
    saved = os.environ.get("HOROTOPO_PROBE")
    os.environ["HOROTOPO_PROBE"] = saved or "off"
    try:
        hvd.init(comm)
    finally:
        if saved is None:
            del os.environ["HOROTOPO_PROBE"]


DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8, np.int16]


@pytest.fixture(scope="module", autouse=True)
def started():
    start()
    yield


def need_two():
    if hvd.size() < 2:
        pytest.skip("needs at least 2 ranks to disagree or to wait for each other")


def test_init_took_the_path_this_launch_asked_for():
    # Without this, a default-init launch that silently fell back to HOROTOPO_PROBE=off would
    # pass as well as one that probed.
    from horotopo.adapt import AdaptiveEngine

    rt = runtime()
    assert isinstance(rt.engine, AdaptiveEngine)
    if os.environ.get(DEFAULT_INIT_ENV) == "1":
        assert not any(name in os.environ for name in INIT_VARIABLES), INIT_VARIABLES
        assert rt.setup.source == "probe", rt.setup.describe()
        assert rt.engine.adapt is True
    elif not any(name in os.environ for name in INIT_VARIABLES):
        assert rt.setup.source == "uniform", rt.setup.describe()
        assert rt.engine.adapt is False
    assert rt.setup.topology.n == rt.plan.n == hvd.size()


def test_basics_are_consistent():
    n, r = hvd.size(), hvd.rank()
    assert 0 <= r < n and hvd.is_initialized()
    assert 0 <= hvd.local_rank() < hvd.local_size() <= n
    assert 0 <= hvd.cross_rank() < hvd.cross_size() <= n
    assert hvd.local_size() * hvd.cross_size() == n or not hvd.is_homogeneous()
    assert hvd.mpi_threads_supported() is True
    assert hvd.mpi_enabled() and hvd.mpi_built() and not hvd.gloo_enabled()
    hvd.init()                       # a second init is a no-op
    assert hvd.size() == n


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_sum_average_min_max(dtype):
    n, r = hvd.size(), hvd.rank()
    x = (np.arange(12).reshape(3, 4) % 5 + r).astype(dtype)
    base = np.arange(12).reshape(3, 4) % 5
    want_sum = sum(base + k for k in range(n))
    got = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{np.dtype(dtype).name}")
    assert got.dtype == np.dtype(dtype) and got.shape == (3, 4)
    np.testing.assert_array_equal(got, want_sum.astype(dtype))
    assert np.all(x == (base + r).astype(dtype)), "the input must not change"
    got = hvd.allreduce(x, op=hvd.Min)
    np.testing.assert_array_equal(got, base.astype(dtype))
    got = hvd.allreduce(x, op=hvd.Max)
    np.testing.assert_array_equal(got, (base + n - 1).astype(dtype))
    if np.dtype(dtype).kind == "f":
        got = hvd.allreduce(x)           # Average is the default
        np.testing.assert_allclose(got, want_sum / n, rtol=1e-3)


def test_allreduce_product_and_bool():
    n = hvd.size()
    got = hvd.allreduce(np.full(5, 2, np.int64), op=hvd.Product)
    assert got.tolist() == [2 ** n] * 5
    flags = np.array([hvd.rank() == 0, False, True])
    assert hvd.allreduce(flags, op=hvd.Max).tolist() == [True, False, True]


def test_prescale_and_postscale():
    n = hvd.size()
    x = np.ones(7, np.float64) * (hvd.rank() + 1)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    np.testing.assert_allclose(got, np.full(7, n * (n + 1) / 2))
    # Integers scale in float64 and truncate, as Horovod does.
    got = hvd.allreduce(np.full(3, 3, np.int32), op=hvd.Sum, postscale_factor=0.5)
    assert got.tolist() == [int(3 * n * 0.5)] * 3


def test_in_place_variants_write_into_the_argument():
    n = hvd.size()
    x = np.full(6, float(hvd.rank()))
    out = hvd.allreduce_(x, op=hvd.Sum)
    assert out is x and x.tolist() == [n * (n - 1) / 2] * 6
    h = hvd.allreduce_async_(x, op=hvd.Max)
    assert hvd.synchronize(h) is x
    with pytest.raises(ValueError, match="Tensor is required to be contiguous."):
        hvd.allreduce_(np.zeros((4, 4))[:, 1])


def test_grouped_allreduce():
    n, r = hvd.size(), hvd.rank()
    xs = [np.full(k + 1, float(r + k)) for k in range(5)]
    got = hvd.grouped_allreduce(xs, op=hvd.Sum)
    for k, g in enumerate(got):
        assert g.tolist() == [sum(q + k for q in range(n))] * (k + 1)
    ys = [np.full(2, float(r)) for _ in range(3)]
    back = hvd.grouped_allreduce_(ys, op=hvd.Sum)
    assert all(b is y for b, y in zip(back, ys))
    assert hvd.grouped_allreduce([]) == []


def test_bfloat16_arrays_reduce_fuse_and_broadcast():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 arrays need ml-dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    n, r = hvd.size(), hvd.rank()
    # Small integers: exact in bfloat16 (8 significant bits) for any order of summation.
    xs = [(np.arange(k + 3) % 5 + r).astype(bf16) for k in range(3)]
    got = hvd.grouped_allreduce(xs, op=hvd.Sum, name="bf16.group")
    for k, g in enumerate(got):
        want = sum(np.arange(k + 3) % 5 + q for q in range(n)).astype(np.float32)
        assert g.dtype == bf16 and np.array_equal(g.astype(np.float32), want)
    avg = hvd.allreduce(np.full(4, 2 * n, bf16), name="bf16.avg")
    assert avg.dtype == bf16 and avg.astype(np.float32).tolist() == [2.0 * n] * 4
    b = np.full(3, r + 1, bf16)
    assert hvd.broadcast_(b, 0, name="bf16.b") is b and b.astype(np.float32).tolist() == [1] * 3


def test_ops_are_matched_by_name_not_by_order():
    n, r = hvd.size(), hvd.rank()
    names = [f"order.{k}" for k in range(8)]
    order = names if r % 2 == 0 else names[::-1]
    handles = {name: hvd.allreduce_async(np.full(3, float(int(name.split('.')[1]) + r)),
                                         name=name, op=hvd.Sum) for name in order}
    for name in names:
        k = int(name.split(".")[1])
        assert hvd.synchronize(handles[name]).tolist() == [k * n + n * (n - 1) / 2] * 3


def test_async_calls_return_before_peers_arrive():
    need_two()
    r = hvd.rank()
    if r != 0:
        time.sleep(0.5)
    t0 = time.monotonic()
    h = hvd.allreduce_async(np.ones(4), name="async.late", op=hvd.Sum)
    enqueue_s = time.monotonic() - t0
    if r == 0:
        assert enqueue_s < 0.2, "enqueue must not wait for the other ranks"
        assert hvd.poll(h) is False, "rank 0 cannot be done before the others submitted"
    assert hvd.synchronize(h).tolist() == [float(hvd.size())] * 4
    assert hvd.poll(h) is True
    assert hvd.synchronize(h) is None      # a finished handle is forgotten


def test_allgather_with_different_first_dimensions():
    n, r = hvd.size(), hvd.rank()
    for dtype in (np.float32, np.int64, np.uint8, np.float16):
        x = np.full((r + 1, 2, 3), r, dtype=dtype)
        got = hvd.allgather(x)
        assert got.shape == (n * (n + 1) // 2, 2, 3) and got.dtype == np.dtype(dtype)
        want = np.concatenate([np.full((k + 1, 2, 3), k, dtype=dtype) for k in range(n)])
        np.testing.assert_array_equal(got, want)
    empty_here = np.zeros((0 if r == 0 else 2, 4), np.float32)
    assert hvd.allgather(empty_here).shape == (2 * (n - 1), 4)


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast_from_each_root(root):
    n, r = hvd.size(), hvd.rank()
    root = root % n
    x = np.arange(10, dtype=np.float64) * (r + 1)
    got = hvd.broadcast(x, root)
    np.testing.assert_array_equal(got, np.arange(10) * (root + 1.0))
    assert x[1] == r + 1, "out-of-place broadcast leaves the argument alone"
    y = np.full((2, 3), r, np.int32)
    assert hvd.broadcast_(y, root) is y and np.all(y == root)
    hs = [hvd.broadcast_async(np.full(k + 1, r, np.int16), root) for k in range(4)]
    for k, h in enumerate(hs):
        assert hvd.synchronize(h).tolist() == [root] * (k + 1)


def test_broadcast_and_allgather_objects():
    r, n = hvd.rank(), hvd.size()
    obj = {"rank": r, "payload": list(range(r))} if r == 0 else None
    assert hvd.broadcast_object(obj, root_rank=0) == {"rank": 0, "payload": []}
    assert hvd.allgather_object(("r", r)) == [("r", k) for k in range(n)]


def test_barrier():
    hvd.barrier()
    hvd.barrier()


def test_alltoall_and_reducescatter():
    n, r = hvd.size(), hvd.rank()
    # rank r sends k+1 rows valued 100*r + k to rank k
    splits = [k + 1 for k in range(n)]
    x = np.concatenate([np.full((k + 1, 2), 100 * r + k) for k in range(n)]).astype(np.int64)
    out, received = hvd.alltoall(x, splits=splits)
    assert received.tolist() == [r + 1] * n
    want = np.concatenate([np.full((r + 1, 2), 100 * q + r) for q in range(n)])
    np.testing.assert_array_equal(out, want)
    even = hvd.alltoall(np.arange(2 * n, dtype=np.float32) + 10 * r)
    assert even.tolist() == [float(10 * q + 2 * r + j) for q in range(n) for j in range(2)]
    rows = 2 * n + 1
    mine = hvd.reducescatter(np.ones((rows, 3)) * (r + 1), op=hvd.Sum)
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    assert mine.shape == (counts[r], 3) and np.all(mine == n * (n + 1) / 2)


INT_DTYPES = [np.int32, np.int64, np.int8, np.uint8, np.int16]


def _horovod_int_average(total: np.ndarray, n: int, dtype) -> np.ndarray:
    """Horovod's integer Average: the sum times the float64 factor 1/size, cast back to the
    integer type in C's way (toward zero): 1 and 2 average to 1, -1 and -2 to -1."""
    return (total.astype(np.float64) * (1.0 / n)).astype(dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_average_truncates_toward_zero_as_horovod(dtype):
    n, r = hvd.size(), hvd.rank()
    signed = np.dtype(dtype).kind == "i"
    values = np.array([r + 1, 2 * r + 1, 7, 0] + ([-(r + 1), -7 - r] if signed else []))
    every = sum(np.array([q + 1, 2 * q + 1, 7, 0] + ([-(q + 1), -7 - q] if signed else []))
                for q in range(n))
    want = _horovod_int_average(every, n, dtype)
    if n == 2:
        # The documented cases: 1 and 2 average to 1; -1 and -2 to -1 (not floor's -2).
        assert want[0] == 1 and (not signed or want[4] == -1)
    x = values.astype(dtype)
    got = hvd.allreduce(x, op=hvd.Average, name=f"int.avg.{np.dtype(dtype).name}")
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    # Fused with other tensors of its dtype (one engine call over a fusion buffer).
    grouped = hvd.grouped_allreduce([x, x[::-1].copy()], op=hvd.Average)
    np.testing.assert_array_equal(grouped[0], want)
    np.testing.assert_array_equal(grouped[1], want[::-1])
    # The reduce-scatter's Average is the same arithmetic on this rank's rows.
    rows = np.tile(x, (n, 1))
    mine = hvd.reducescatter(rows, op=hvd.Average)
    np.testing.assert_array_equal(mine, np.tile(want, (1, 1)))


@pytest.mark.parametrize("algorithm", ["tree", "ring", "dbtree", "mpi"])
def test_integer_average_is_the_same_on_every_engine_path(algorithm):
    """Each allreduce algorithm gives Horovod's integer Average, bit for bit."""
    from mpi4py import MPI

    from horotopo.engine import Engine
    from horotopo.packing import ring_parents
    from horotopo.plan import plan_from_trees

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    plan = plan_from_trees(n, [(q, *ring_parents(n, q), 1.0) for q in range(n)],
                           chunk_bytes=16)   # several chunks per call
    x = np.array([r + 1, -(r + 1), 3 * r - 4, 1000 + r] * 5, dtype=np.int32)
    every = sum(np.array([q + 1, -(q + 1), 3 * q - 4, 1000 + q] * 5) for q in range(n))
    with Engine(comm, plan) as eng:
        got = eng.allreduce(x, op="average", algorithm=algorithm)
    np.testing.assert_array_equal(got, _horovod_int_average(every, n, np.int32))


def test_mismatched_shapes_fail_everywhere_and_the_job_continues():
    need_two()
    r = hvd.rank()
    shape = (2, 3) if r == 0 else (3, 3)
    with pytest.raises(hvd.HorovodInternalError) as err:
        hvd.allreduce(np.zeros(shape, np.float32), name="mismatch.shape")
    assert str(err.value) == ("Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of "
                              "shape [2, 3], but another rank sent a tensor of shape [3, 3].")
    got = hvd.allreduce(np.ones(3), name="mismatch.shape", op=hvd.Sum)
    assert got.tolist() == [float(hvd.size())] * 3


@pytest.mark.parametrize("case", ["dtype", "op", "scale", "root", "gather", "kind"])
def test_other_mismatches_raise_internal_errors(case):
    need_two()
    r = hvd.rank()
    odd = r == hvd.size() - 1
    name = f"mismatch.{case}"
    if case == "dtype":
        call = lambda: hvd.allreduce(np.ones(2, np.int32 if odd else np.float32), name=name)  # noqa
        want = "Mismatched data types: One rank had type HOROVOD_FLOAT32, but another rank " \
               "had type HOROVOD_INT32."
    elif case == "op":
        call = lambda: hvd.allreduce(np.ones(2), name=name, op=hvd.Max if odd else hvd.Sum)  # noqa
        want = "Mismatched reduction operation: One rank sent reduction op 1, but another " \
               "rank sent reduction op 4."
    elif case == "scale":
        call = lambda: hvd.allreduce(np.ones(2), name=name, op=hvd.Sum,  # noqa
                                     prescale_factor=2.0 if odd else 1.0)
        want = "Mismatched prescale and/or postscale factors: One rank sent factors (1, 1), " \
               "but another rank sent factors (2, 1)."
    elif case == "root":
        call = lambda: hvd.broadcast(np.ones(2), 1 if odd else 0, name=name)  # noqa
        want = "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another " \
               "rank specified root rank 1."
    elif case == "gather":
        call = lambda: hvd.allgather(np.ones((2, 5 if odd else 4)), name=name)  # noqa
        want = "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 " \
               "equal to 4, but another rank sent a tensor with dimension 1 equal to 5."
    else:
        call = lambda: (hvd.broadcast(np.ones(2), 0, name=name) if odd  # noqa
                        else hvd.allreduce(np.ones(2), name=name))
        want = "Mismatched operations: One rank did an ALLREDUCE, but another rank did an " \
               "BROADCAST."
    with pytest.raises(hvd.HorovodInternalError) as err:
        call()
    assert str(err.value) == want
    assert hvd.allreduce(np.ones(2), op=hvd.Sum).tolist() == [float(hvd.size())] * 2


@pytest.mark.parametrize("case", ["grouped-vs-gather", "alltoall-vs-allreduce",
                                  "gather-vs-broadcast"])
def test_different_collectives_under_one_call_name_fail_everywhere(case):
    """Ranks that call different collectives under one name submit different tensor names
    (a grouped op's name.0of2, alltoall's name.splits): rank 0 compares the calls and answers
    Horovod's mismatch on every rank instead of letting them wait for each other."""
    need_two()
    r = hvd.rank()
    name = f"mismatch.call.{case}"
    first = r == 0
    if case == "grouped-vs-gather":
        kinds = ("ALLREDUCE", "ALLGATHER")
        call = (lambda: hvd.grouped_allreduce([np.ones(2), np.ones(3)], name=name)) if first \
            else (lambda: hvd.allgather(np.ones(2), name=name))
    elif case == "alltoall-vs-allreduce":
        kinds = ("ALLTOALL", "ALLREDUCE")
        call = (lambda: hvd.alltoall(np.ones(hvd.size()), name=name)) if first \
            else (lambda: hvd.allreduce(np.ones(2), name=name))
    else:
        kinds = ("ALLGATHER", "BROADCAST")
        call = (lambda: hvd.grouped_allgather([np.ones(2)] * 2, name=name)) if first \
            else (lambda: hvd.broadcast(np.ones(2), 0, name=name))
    with pytest.raises(hvd.HorovodInternalError) as err:
        _within(30, call)
    assert str(err.value) == (f"Mismatched operations: One rank did an {kinds[0]}, but another "
                              f"rank did an {kinds[1]}.")
    assert hvd.allreduce(np.ones(2), op=hvd.Sum).tolist() == [float(hvd.size())] * 2


def test_duplicate_pending_name_is_a_value_error():
    need_two()
    if hvd.rank() != 0:
        time.sleep(0.5)      # keeps rank 0's first request pending
    h = hvd.allreduce_async(np.ones(2), name="dup.name")
    if hvd.rank() == 0:
        with pytest.raises(ValueError, match="same name as another tensor that is currently "
                                             "being processed"):
            hvd.allreduce_async(np.ones(2), name="dup.name")
    hvd.synchronize(h)
    hvd.synchronize(hvd.allreduce_async(np.ones(2), name="dup.name"))   # free again


def test_steady_state_runs_from_the_response_cache():
    n = hvd.size()
    rt = runtime()
    names = [f"cache.grad{k}" for k in range(6)]

    def step():
        hs = [hvd.allreduce_async(np.ones(k + 3, np.float32), name=nm, op=hvd.Sum)
              for k, nm in enumerate(names)]
        return [hvd.synchronize(h) for h in hs]

    step()
    hvd.barrier()
    before = dict(rt.stats)
    for _ in range(5):
        for k, got in enumerate(step()):
            assert got.tolist() == [float(n)] * (k + 3)
    assert rt.stats["negotiations"] == before["negotiations"], \
        "cached names must not go through rank 0 again"
    assert rt.stats["cache_hits"] - before["cache_hits"] == 5 * len(names)
    # A cached name with a new shape is invalidated and renegotiated, not misreduced.
    got = hvd.allreduce(np.ones(11, np.float32), name=names[0], op=hvd.Sum)
    assert got.tolist() == [float(n)] * 11
    assert rt.stats["negotiations"] > before["negotiations"]


def test_fusion_packs_many_small_tensors_into_few_engine_calls():
    rt = runtime()
    hvd.barrier()
    before = dict(rt.stats)
    xs = [np.full(4, float(k), np.float32) for k in range(32)]
    got = hvd.grouped_allreduce(xs, op=hvd.Sum, name="fusion.group")
    assert [g[0] for g in got] == [float(k * hvd.size()) for k in range(32)]
    calls = rt.stats["engine_allreduces"] - before["engine_allreduces"]
    assert calls == 1, f"32 tensors submitted together took {calls} engine allreduces"


def test_stall_warning_names_the_missing_ranks(caplog):
    need_two()
    rt = runtime()
    cfg = rt.settings
    saved = (cfg.stall_check, cfg.stall_check_s, cfg.reroute_s)
    cfg.stall_check, cfg.stall_check_s, cfg.reroute_s = True, 1.0, 0.5
    r = hvd.rank()
    try:
        hvd.allreduce(np.ones(2), name="stall.cached")           # now in the cache
        hvd.barrier()
        with caplog.at_level(logging.WARNING, logger="horotopo"):
            if r == 0:
                h1 = hvd.allreduce_async(np.ones(2), name="stall.fresh")
                h2 = hvd.allreduce_async(np.ones(2), name="stall.cached")
            time.sleep(3.0)
            if r != 0:
                h1 = hvd.allreduce_async(np.ones(2), name="stall.fresh")
                h2 = hvd.allreduce_async(np.ones(2), name="stall.cached")
            hvd.synchronize(h1)
            hvd.synchronize(h2)
    finally:
        cfg.stall_check, cfg.stall_check_s, cfg.reroute_s = saved
    if r == 0:
        text = "\n".join(rec.getMessage() for rec in caplog.records)
        assert "waiting for remainder of ranks for more than 1 seconds" in text
        assert "Missing ranks:" in text
        for q in range(1, hvd.size()):
            assert f"{q}: [stall.cached, stall.fresh]" in text, text


def test_unsupported_features_say_so():
    with pytest.raises(hvd.HorovodInternalError,
                       match=r"^Reducescatter currently only supports AVERAGE and SUM\.$"):
        hvd.reducescatter(np.ones(hvd.size()), op=hvd.Adasum)
    with pytest.raises(ValueError, match=r"^Allreduce: Process set provided does not exist, "
                                         r"or has not been registered\.$"):
        hvd.allreduce(np.ones(2), process_set=hvd.ProcessSet([0]))
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(np.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(np.ones(2, np.complex64))


def test_join_on_arrays_sends_zeros_and_returns_the_last_rank():
    last = hvd.size() - 1
    if hvd.rank() == last:   # the others have joined: only this rank's ones are summed
        got = hvd.allreduce(np.ones(3, np.float32), name="join.arrays", op=hvd.Sum)
        assert got.tolist() == [1.0] * 3
    assert hvd.join() == last


def _within(seconds, fn, *args):
    """Run ``fn`` on a thread and fail (not hang) when it has not returned by the deadline;
    return its value or raise its exception."""
    import threading

    out = {}

    def run():
        try:
            out["v"] = fn(*args)
        except BaseException as exc:  # handed to the caller below
            out["e"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} still waiting after {seconds} s"
    if "e" in out:
        raise out["e"]
    return out.get("v")


def test_a_barrier_that_only_one_rank_called_during_a_join_leaves_later_barriers_working():
    """Regression: the joined ranks take part in one rank's barrier without calling it, so a
    counted barrier name ("barrier.noname.<k>") drifted apart between ranks and every later
    barrier waited forever. Horovod's barrier has one fixed name."""
    need_two()
    if hvd.rank() == 0:
        hvd.barrier()            # the others have joined: they release it without calling it
    assert hvd.join() == 0
    _within(20, hvd.barrier)
    _within(20, hvd.barrier)


def test_shutdown_on_one_rank_fails_pending_ops_everywhere():
    need_two()
    if hvd.rank() == 0:
        time.sleep(0.3)
        hvd.shutdown()
    else:
        h = hvd.allreduce_async(np.ones(2), name="never.completed")
        with pytest.raises(hvd.HorovodInternalError, match="Horovod has been shut down"):
            hvd.synchronize(h)
        with pytest.raises(hvd.HorovodInternalError, match="has been shut down"):
            hvd.allreduce(np.ones(2))
        assert not hvd.is_initialized()
        hvd.shutdown()
    start()
    assert hvd.allreduce(np.ones(2), op=hvd.Sum).tolist() == [float(hvd.size())] * 2


def test_init_on_a_subset_given_as_ranks_or_a_communicator():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    me, n = world.Get_rank(), world.Get_size()
    hvd.shutdown()
    evens = list(range(0, n, 2))
    if me in evens:
        start(comm=evens)
        assert (hvd.size(), hvd.rank()) == (len(evens), evens.index(me))
        assert hvd.allreduce(np.ones(1), op=hvd.Sum).tolist() == [float(len(evens))]
        hvd.shutdown()
    else:
        with pytest.raises(ValueError, match="is not in the list"):
            hvd.init(comm=evens)
    sub = world.Split(color=me % 2, key=-me)         # reversed rank order inside each half
    start(comm=sub)
    assert (hvd.size(), hvd.rank()) == (sub.Get_size(), sub.Get_rank())
    got = hvd.allgather(np.array([me]))
    assert got.tolist() == sorted((r for r in range(n) if r % 2 == me % 2), reverse=True)
    hvd.shutdown()
    sub.Free()
    with pytest.raises(TypeError, match="mpi4py communicator or a list of ranks"):
        hvd.init(comm="world")
    start()
    assert hvd.size() == n


def test_shutdown_then_init_again():
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="has not been initialized"):
        hvd.size()
    hvd.shutdown()                        # harmless when already down
    start()
    assert hvd.allreduce(np.ones(2), op=hvd.Sum).tolist() == [float(hvd.size())] * 2
