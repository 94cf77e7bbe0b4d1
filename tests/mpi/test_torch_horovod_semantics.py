"""Multi-rank tests of horotopo.torch where Horovod 0.28.1's semantics are easy to miss:
the callable sparse handle, a fresh optimizer's state broadcast, reducescatter's gradient,
sparse_as_dense with a sparse-only optimizer, join, and a DistributedOptimizer over a process
set seen from a rank outside it. Works at any size."""

import pytest

torch = pytest.importorskip("torch", reason="horotopo.torch needs torch (the [torch] extra)")

import horotopo.torch as hvd  # noqa: E402
from test_api_collectives import start  # noqa: E402  (init with a ring plan)


@pytest.fixture(scope="module", autouse=True)
def started():
    start()
    yield


def _sparse_rows(r: int) -> "torch.Tensor":
    """A 5x2 sparse tensor with row r % 5 equal to r + 1 and row 4 equal to 1."""
    dense = torch.zeros(5, 2)
    dense[r % 5] += r + 1
    dense[4] += 1
    return dense.to_sparse()


def test_sparse_allreduce_async_returns_a_callable_handle():
    n = hvd.size()
    want = sum(_sparse_rows(q).to_dense() for q in range(n))
    handle = hvd.sparse_allreduce_async(_sparse_rows(hvd.rank()), name="sem.sparse.call",
                                        op=hvd.Sum)
    assert callable(handle)
    out = handle()
    assert out.is_sparse and torch.equal(out.to_dense(), want)
    # hvd.synchronize (and poll) still take it; Average divides by the number of ranks.
    handle = hvd.sparse_allreduce_async(_sparse_rows(hvd.rank()), name="sem.sparse.sync",
                                        op=hvd.Average)
    while not hvd.poll(handle):
        pass  # poll hands the GIL to the thread that completes the op
    out = hvd.synchronize(handle)
    assert out.is_sparse and torch.allclose(out.to_dense(), want / n)


def _model() -> "torch.nn.Module":
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


@pytest.mark.parametrize("wrap", [False, True], ids=["plain", "distributed"])
def test_broadcast_optimizer_state_of_a_fresh_optimizer(wrap):
    r = hvd.rank()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1), betas=(0.5 + 0.1 * r, 0.99))
    if wrap:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, 0, model)     # Horovod's positional model argument
    state = opt.state_dict()
    assert len(state["state"]) == len(before)
    for k, p in enumerate(model.parameters()):
        s = opt.state[p]
        assert float(s["step"]) == 1.0
        assert torch.equal(s["exp_avg"], torch.zeros_like(p))
        # A zero gradient leaves Adam's parameters where they were.
        assert torch.equal(p.detach(), before[k])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert opt.param_groups[0]["betas"] == pytest.approx((0.5, 0.99))


def test_broadcast_optimizer_state_gives_sparse_adam_sparse_zero_gradients():
    torch.manual_seed(2)
    emb = torch.nn.Embedding(4, 3, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.1 * (hvd.rank() + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=emb)
    assert emb.weight.grad.is_sparse
    assert float(opt.state[emb.weight]["step"]) == 1.0
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def _reducescatter_grad(op: int, pre: float, post: float) -> "torch.Tensor":
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(2 * n, 3, requires_grad=True)
    out = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
    weights = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r
    (out * weights).sum().backward()
    return x.grad


@pytest.mark.parametrize("pre,post", [(1.0, 1.0), (2.0, 0.25)])
def test_reducescatter_gradient_is_horovods(pre, post):
    """Horovod 0.28.1's backward: the allgather of the output's gradient, times size for Sum
    (Average is not divided), times the pre- and postscale factors."""
    n = hvd.size()
    every = torch.cat([torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * q
                       for q in range(n)])
    got = _reducescatter_grad(hvd.Sum, pre, post)
    assert torch.allclose(got, every * n * pre * post)
    got = _reducescatter_grad(hvd.Average, pre, post)
    assert torch.allclose(got, every * pre * post)


def test_sparse_as_dense_steps_a_sparse_only_optimizer():
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 2, sparse=True)
    start_weight = emb.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                   named_parameters=[("sem.emb", emb.weight)],
                                   sparse_as_dense=True)
    emb(torch.tensor([r % 6])).sum().backward()
    opt.step()
    grad = emb.weight.grad
    assert grad.is_sparse
    want = torch.zeros(6, 2)
    for q in range(n):
        want[q % 6] += 1.0 / n
    assert torch.allclose(grad.to_dense(), want, atol=1e-6)
    # Every rank took the same step: only the rows some rank looked up moved.
    moved = (emb.weight.detach() != start_weight).any(dim=1)
    assert moved.tolist() == [k < n for k in range(6)]
    every = hvd.allgather(emb.weight.detach().reshape(1, -1))
    assert all(torch.equal(every[0], every[k]) for k in range(n))


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_join_with_every_rank_in_turn_the_last(op):
    """Ranks run out of data at different steps and join; the joined ranks add zeros to the
    others' allreduces, and join returns the rank that ran longest (the last to join)."""
    n, r = hvd.size(), hvd.rank()
    for last in range(n):
        steps = [3 if q == last else 1 + q % 2 for q in range(n)]
        for k in range(steps[r]):
            got = hvd.allreduce(torch.full((3,), float(r + 1)), name=f"sem.join.{op}.{k}",
                                op=getattr(hvd, op))
            want = float(sum(q + 1 for q in range(n) if steps[q] > k))
            if op == "Average":
                want /= n        # the joined ranks still count
            assert torch.allclose(got, torch.full((3,), want)), (last, k)
        assert hvd.join() == last
    # No rank is joined any more: a plain allgather runs.
    assert hvd.allgather(torch.tensor([r])).tolist() == list(range(n))


def test_join_fails_the_other_collectives_on_every_rank_and_passes_barriers():
    n, r = hvd.size(), hvd.rank()
    last = n - 1
    if n == 1:
        assert hvd.join() == 0   # alone, nobody else has joined while this rank works
        return
    if r == last:
        with pytest.raises(hvd.HorovodInternalError,
                           match=r"^Broadcast is not supported with Join at this time\.$"):
            hvd.broadcast(torch.ones(2), root_rank=last, name="sem.join.bcast")
        with pytest.raises(hvd.HorovodInternalError,
                           match=r"Allgather is not supported with Join at this time"):
            hvd.allgather(torch.ones(2), name="sem.join.gather")
        with pytest.raises(hvd.HorovodInternalError,
                           match=r"^Reducescatter is not supported with Join at this time\.$"):
            hvd.reducescatter(torch.ones(2 * n), name="sem.join.rs")
        with pytest.raises(hvd.HorovodInternalError,
                           match=r"^Alltoall is not supported with Join at this time\.$"):
            hvd.alltoall(torch.ones(n), name="sem.join.a2a")
        # An allreduce still runs, with the joined ranks' zeros; a barrier releases this rank.
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="sem.join.ar").tolist() == [1, 1]
        hvd.barrier()
    assert hvd.join() == last


def _linear() -> "torch.nn.Module":
    torch.manual_seed(3)
    return torch.nn.Linear(4, 1)


def _batch(step: int, r: int) -> "torch.Tensor":
    return torch.full((2, 4), float(step + r)) * torch.arange(1.0, 5.0)


def test_join_lets_a_distributed_optimizer_train_on_uneven_data():
    """Rank r has r + 1 batches; at each step the gradient is the sum over the ranks that still
    have data, over all ranks (the joined ones add zeros)."""
    n, r = hvd.size(), hvd.rank()
    model = _linear()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for step in range(r + 1):
        opt.zero_grad()
        model(_batch(step, r)).sum().backward()
        opt.step()
    assert hvd.join() == n - 1
    ref = _linear()
    for step in range(r + 1):
        grads = []
        for q in range(step, n):             # the ranks with a batch at this step
            ref.zero_grad()
            ref(_batch(step, q)).sum().backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        with torch.no_grad():
            for k, p in enumerate(ref.parameters()):
                p -= 0.1 * sum(g[k] for g in grads) / n
    for got, want in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(got, want, atol=1e-5)


def test_repeated_names_are_answered_from_the_cache_around_a_join():
    """join switches the response cache off while ranks are joined; before and after, a
    repeated name is answered from the cache (not renegotiated after a stall)."""
    from horotopo.api.basics import runtime

    stats = runtime().stats
    for _ in range(2):
        hits = stats["cache_hits"]
        for _ in range(3):
            hvd.allreduce(torch.ones(2), name="sem.cached", op=hvd.Sum)
        assert stats["cache_hits"] >= hits + 2
        hvd.join()


def test_grouped_allgather_values_handle_and_gradient():
    n, r = hvd.size(), hvd.rank()
    a = torch.full((r + 1, 2), float(r), requires_grad=True)    # first dimension differs
    b = torch.arange(3, dtype=torch.float64) + 10 * r
    ga, gb = hvd.grouped_allgather([a, b], name="sem.gag")
    assert torch.equal(ga, torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)]))
    assert torch.equal(gb, torch.cat([torch.arange(3, dtype=torch.float64) + 10 * q
                                      for q in range(n)]))
    handle = hvd.grouped_allgather_async([b.to(torch.int32)], name="sem.gag.async")
    (got,) = hvd.synchronize(handle)
    assert got.dtype == torch.int32 and got.tolist() == gb.to(torch.int32).tolist()
    # The gradient: averaged over ranks, then this rank's rows (Horovod's definition).
    weights = torch.arange(ga.numel(), dtype=torch.float32).reshape(ga.shape) + r
    (ga * weights).sum().backward()
    offset = sum(q + 1 for q in range(r))
    mean = torch.arange(ga.numel(), dtype=torch.float32).reshape(ga.shape) + (n - 1) / 2
    assert torch.allclose(a.grad, mean[offset:offset + r + 1])


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_grouped_reducescatter_values_and_horovods_gradient(op):
    n, r = hvd.size(), hvd.rank()
    pre, post = 2.0, 0.5
    xs = [torch.full((2 * n, 3), float(r + 1), requires_grad=True),
          (torch.arange(n + 1, dtype=torch.float32) * (r + 1)).requires_grad_(True)]
    outs = hvd.grouped_reducescatter(xs, op=getattr(hvd, op), prescale_factor=pre,
                                     postscale_factor=post, name=f"sem.grs.{op}")
    total = n * (n + 1) / 2 * pre * post / (n if op == "Average" else 1)
    assert torch.allclose(outs[0], torch.full((2, 3), total))
    # n + 1 rows: rank 0 keeps two, the others one (Horovod's blocks).
    start = 0 if r == 0 else r + 1
    rows = 2 if r == 0 else 1
    if n == 1:
        start, rows = 0, 2
    assert torch.allclose(outs[1], torch.arange(start, start + rows, dtype=torch.float32) * total)
    w0 = torch.full((2, 3), float(r + 1))
    w1 = torch.full((rows,), 10.0 * (r + 1))
    ((outs[0] * w0).sum() + (outs[1] * w1).sum()).backward()
    scale = (n if op == "Sum" else 1) * pre * post
    want0 = torch.cat([torch.full((2, 3), float(q + 1)) for q in range(n)]) * scale
    want1 = torch.cat([torch.full((2 if q == 0 or n == 1 else 1,), 10.0 * (q + 1))
                       for q in range(n)]) * scale
    assert torch.allclose(xs[0].grad, want0)
    assert torch.allclose(xs[1].grad, want1)
    handle = hvd.grouped_reducescatter_async([torch.ones(n, 2)], op=hvd.Sum,
                                             name=f"sem.grs.async.{op}")
    (got,) = hvd.synchronize(handle)
    assert torch.equal(got, torch.full((1, 2), float(n)))


def _adasum_reference(vectors):
    """Adasum of the ranks' vectors in NumPy, written from the formula (float64): neighbours
    first, then pairs of pairs (Horovod's distance-doubling order)."""
    import numpy as np

    level = [np.asarray(v, dtype=np.float64) for v in vectors]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            dot = float(a @ b)
            ca = 1 - dot / (2 * float(a @ a)) if float(a @ a) > 0 else 1.0
            cb = 1 - dot / (2 * float(b @ b)) if float(b @ b) > 0 else 1.0
            nxt.append(ca * a + cb * b)
        level = nxt
    return level[0]


def test_adasum_allreduce_on_power_of_two_ranks_or_horovods_error():
    n, r = hvd.size(), hvd.rank()
    gen = torch.Generator().manual_seed(11)
    every = [torch.randn(7, generator=gen, dtype=torch.float64) for _ in range(n)]
    second = [torch.randn(2, 3, generator=gen, dtype=torch.float32) for _ in range(n)]
    if n & (n - 1):
        with pytest.raises(NotImplementedError,
                           match=r"^Running Adasum with non-power of 2 ranks is not supported "
                                 r"yet\.$"):
            hvd.allreduce(every[r], op=hvd.Adasum)
        return
    got = hvd.allreduce(every[r], op=hvd.Adasum, name="sem.adasum")
    want = _adasum_reference([v.numpy() for v in every])
    assert torch.allclose(got, torch.from_numpy(want), rtol=1e-12, atol=1e-12)
    # Grouped: each tensor has its own coefficients; scale factors scale the result.
    a, b = hvd.grouped_allreduce([every[r], second[r]], op=hvd.Adasum, prescale_factor=2.0,
                                 postscale_factor=0.25, name="sem.adasum.grouped")
    assert torch.allclose(a, torch.from_numpy(want) * 0.5, rtol=1e-12, atol=1e-12)
    want_b = _adasum_reference([v.reshape(-1).numpy() for v in second]).reshape(2, 3) * 0.5
    assert torch.allclose(b, torch.from_numpy(want_b).float(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Adasum needs float16, float32 or float64"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)


def test_adasum_distributed_optimizer_combines_the_ranks_steps():
    """DistributedOptimizer(op=Adasum), Horovod's delta optimizer: each rank's local SGD step
    is a delta, and the parameters move by the Adasum of the ranks' deltas."""
    n, r = hvd.size(), hvd.rank()
    if n & (n - 1):
        return   # Horovod's error for these counts is checked in the test above
    torch.manual_seed(5)
    model = torch.nn.Linear(3, 2).double()
    start = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    batches = [torch.arange(6, dtype=torch.float64).reshape(2, 3) * (q + 1) - q
               for q in range(n)]
    opt.zero_grad()
    (model(batches[r]) ** 2).sum().backward()
    opt.step()
    deltas = []   # each rank's SGD delta, computed here for every rank
    for q in range(n):
        ref = torch.nn.Linear(3, 2).double()
        with torch.no_grad():
            for p, s in zip(ref.parameters(), start):
                p.copy_(s)
        (ref(batches[q]) ** 2).sum().backward()
        deltas.append([-0.1 * p.grad for p in ref.parameters()])
    for k, (p, s) in enumerate(zip(model.parameters(), start)):
        combined = _adasum_reference([d[k].reshape(-1).numpy() for d in deltas])
        want = s + torch.from_numpy(combined).reshape(s.shape)
        assert torch.allclose(p.detach(), want, atol=1e-10), k


def _local_grads(r: int) -> "list":
    """The gradients rank r's batch gives the _linear model, computed locally."""
    ref = _linear()
    ref(_batch(0, r)).sum().backward()
    return [p.grad.clone() for p in ref.parameters()]


@pytest.mark.parametrize("groups", [None, 1], ids=["per-tensor", "grouped"])
def test_distributed_optimizer_on_a_set_leaves_the_other_ranks_gradients_local(groups):
    """DistributedOptimizer(process_set=even ranks): the even ranks step with the gradient
    averaged over the even ranks; the odd ranks build it, reduce nothing and step with their
    own gradient (Horovod's behaviour, not an error)."""
    from horotopo.api import process_sets as ps_module

    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs two ranks: at one rank every set is the global set")
    saved = ps_module._dynamic
    ps_module.allow_dynamic()
    even = [q for q in range(n) if q % 2 == 0]
    even_set = hvd.add_process_set(even)
    try:
        model = _linear()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       groups=groups, process_set=even_set)
        model(_batch(0, r)).sum().backward()
        opt.step()
        mine = _local_grads(r)
        if r in even:
            every = [_local_grads(q) for q in even]
            want = [sum(g[k] for g in every) / len(even) for k in range(len(mine))]
            for p, w in zip(model.parameters(), want):
                assert torch.allclose(p.grad, w, rtol=0, atol=1e-6)
        else:
            want = mine
            for p, w in zip(model.parameters(), want):
                assert torch.equal(p.grad, w)
        # The step applied exactly those gradients.
        with torch.no_grad():
            for p, p0, w in zip(model.parameters(), _linear().parameters(), want):
                assert torch.allclose(p, p0 - 0.1 * w, rtol=0, atol=1e-6)
    finally:
        hvd.remove_process_set(even_set)
        ps_module._dynamic = saved


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_average_of_torch_tensors_truncates_toward_zero(dtype):
    """Horovod's integer Average: sum * (1.0 / size) in float64, cast toward zero."""
    n, r = hvd.size(), hvd.rank()
    x = torch.tensor([r + 1, -(r + 1), 5 * r], dtype=getattr(torch, dtype))
    total = sum(torch.tensor([q + 1, -(q + 1), 5 * q], dtype=torch.float64) for q in range(n))
    want = (total * (1.0 / n)).to(getattr(torch, dtype))   # float -> int truncates toward 0
    got = hvd.allreduce(x, op=hvd.Average, name=f"sem.int.avg.{dtype}")
    assert got.dtype == x.dtype and torch.equal(got, want)
    if n == 2:
        assert got[:2].tolist() == [1, -1]


def test_float_average_multiplies_by_the_float32_reciprocal_as_horovod():
    """Horovod on the CPU averages a float32 sum by multiplying it by (float)(1.0 / size), not
    by dividing: at 3 ranks 142 averages to 47.333336, one bit above 142 / 3. horotopo gives
    Horovod's bits (the sums of these small integers are exact, so only the scaling rounds)."""
    n, r = hvd.size(), hvd.rank()
    base = torch.tensor([75.0, 71.0, -94.0, 65.0, 16.0, 1.0, 2.0])
    got = hvd.allreduce(base + r, op=hvd.Average, name="sem.float.avg")
    total = sum(base + q for q in range(n))
    import numpy as np

    want = torch.from_numpy(total.numpy() * np.float32(1.0 / n))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    got = hvd.allreduce(base + r, op=hvd.Sum, postscale_factor=0.1, name="sem.float.post")
    want = torch.from_numpy(total.numpy() * np.float32(0.1))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
