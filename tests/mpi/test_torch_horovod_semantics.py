"""Multi-rank tests of horotopo.torch where Horovod 0.28.1's semantics are easy to miss (issue
14): the callable sparse handle, a fresh optimizer's state broadcast, reducescatter's gradient,
sparse_as_dense with a sparse-only optimizer, and join. Works at any size."""
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
        pass
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
