"""Multi-rank tests of horotopo.torch: collectives, autograd, helpers and DistributedOptimizer,
ported from Horovod's documented behaviour. Works at any size; 2-rank cases skip at 1."""
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="horotopo.torch needs torch (the [torch] extra)")

import horotopo.torch as hvd  # noqa: E402
from test_api_collectives import start  # noqa: E402  (init with a ring plan)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8, torch.int16]


@pytest.fixture(scope="module", autouse=True)
def started():
    start()
    yield


def need_two():
    if hvd.size() < 2:
        pytest.skip("needs at least 2 ranks")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_dtypes(dtype):
    n, r = hvd.size(), hvd.rank()
    x = (torch.arange(6).reshape(2, 3) % 4 + r).to(dtype)
    want = sum((torch.arange(6).reshape(2, 3) % 4 + k) for k in range(n)).to(dtype)
    got = hvd.allreduce(x, op=hvd.Sum)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, want)
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Max) is y
    assert torch.equal(y, (torch.arange(6).reshape(2, 3) % 4 + n - 1).to(dtype))
    if dtype.is_floating_point:
        avg = hvd.allreduce(x.float())
        assert torch.allclose(avg, want.float() / n, rtol=1e-2)


def test_allreduce_async_and_poll():
    n = hvd.size()
    hs = [hvd.allreduce_async(torch.full((4,), float(k)), name=f"t.async.{k}", op=hvd.Sum)
          for k in range(10)]
    outs = [hvd.synchronize(h) for h in hs]
    assert all(torch.equal(o, torch.full((4,), float(k * n))) for k, o in enumerate(outs))
    h = hvd.allreduce_async_(torch.ones(3), op=hvd.Sum)
    while not hvd.poll(h):
        pass  # poll hands the GIL to the thread that completes the op
    assert torch.equal(hvd.synchronize(h), torch.full((3,), float(n)))


def test_grouped_allreduce_and_compression():
    n, r = hvd.size(), hvd.rank()
    xs = [torch.full((k + 1,), float(r)) for k in range(4)]
    got = hvd.grouped_allreduce(xs, op=hvd.Sum)
    assert [g.tolist() for g in got] == [[n * (n - 1) / 2] * (k + 1) for k in range(4)]
    got = hvd.grouped_allreduce_(xs, op=hvd.Sum)
    assert all(g is x for g, x in zip(got, xs))
    h = hvd.allreduce(torch.full((5,), 0.5), op=hvd.Sum, compression=hvd.Compression.fp16)
    assert h.dtype == torch.float32 and torch.equal(h, torch.full((5,), 0.5 * n))


def test_allreduce_gradient_is_an_allreduce_of_the_gradient():
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(3, requires_grad=True)
    y = hvd.allreduce(x * (r + 1), op=hvd.Sum)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), float(n * (r + 1))))
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x).sum().backward()              # Average: gradient averaged -> ones
    assert torch.allclose(x.grad, torch.ones(3))
    ws = [torch.ones(2, requires_grad=True) for _ in range(2)]
    outs = hvd.grouped_allreduce(ws, op=hvd.Sum)
    (outs[0].sum() + 2 * outs[1].sum()).backward()
    assert torch.equal(ws[0].grad, torch.full((2,), float(n)))
    assert torch.equal(ws[1].grad, torch.full((2,), 2.0 * n))


def test_allgather_values_and_gradient():
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        x = torch.full((r + 1, 3), r).to(dtype)
        got = hvd.allgather(x)
        want = torch.cat([torch.full((k + 1, 3), k).to(dtype) for k in range(n)])
        assert got.dtype == dtype and torch.equal(got, want)
    x = torch.full((r + 1, 2), float(r), requires_grad=True)
    g = hvd.allgather(x)
    weights = torch.arange(g.shape[0], dtype=torch.float32).unsqueeze(1).expand(-1, 2)
    (g * weights).sum().backward()
    offset = r * (r + 1) // 2
    assert torch.equal(x.grad, weights[offset:offset + r + 1])


def test_broadcast_values_and_gradient():
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.float64):
        x = torch.full((2, 2), r).to(dtype)
        assert torch.equal(hvd.broadcast(x, root), torch.full((2, 2), root).to(dtype))
        assert torch.equal(x, torch.full((2, 2), r).to(dtype))
        assert hvd.broadcast_(x, root) is x and torch.equal(x, torch.full((2, 2), root).to(dtype))
    x = torch.ones(4, requires_grad=True)
    hvd.broadcast(x, root).sum().backward()
    want = torch.ones(4) if r == root else torch.zeros(4)
    assert torch.equal(x.grad, want)


def test_alltoall_and_reducescatter_tensors():
    n, r = hvd.size(), hvd.rank()
    x = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    out = hvd.alltoall(x)
    assert out.tolist() == [float(100 * q + 2 * r + j) for q in range(n) for j in range(2)]
    out, received = hvd.alltoall(x, splits=torch.tensor([2] * n, dtype=torch.int32))
    assert received.tolist() == [2] * n
    rs = hvd.reducescatter(torch.ones(n * 2, 3), op=hvd.Sum)
    assert rs.shape == (2, 3) and torch.equal(rs, torch.full((2, 3), float(n)))


def test_mismatch_raises_horovod_internal_error():
    need_two()
    shape = (2,) if hvd.rank() == 0 else (3,)
    with pytest.raises(hvd.HorovodInternalError, match=r"Mismatched ALLREDUCE tensor shapes: "
                       r"One rank sent a tensor of shape \[2\], but another rank sent a tensor "
                       r"of shape \[3\]\."):
        hvd.allreduce(torch.zeros(shape), name="torch.mismatch")
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum),
                       torch.full((1,), float(hvd.size())))


def test_errors_for_bad_arguments():
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(torch.ones(1), average=False, op=hvd.Sum)
    with pytest.raises(hvd.HorovodInternalError,
                       match=r"^Reducescatter currently only supports AVERAGE and SUM\.$"):
        hvd.reducescatter(torch.ones(hvd.size()), op=hvd.Adasum)
    with pytest.raises(ValueError, match="is not supported"):
        hvd.allreduce(torch.ones(1, dtype=torch.complex64))
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_(torch.zeros(4, 4)[:, 0])


def test_duplicate_pending_name():
    need_two()
    if hvd.rank() != 0:
        time.sleep(0.5)      # keeps rank 0's first request pending
    h = hvd.allreduce_async(torch.ones(1), name="torch.dup")
    if hvd.rank() == 0:
        with pytest.raises(ValueError, match="same name as another tensor that is currently"):
            hvd.allreduce_async(torch.ones(1), name="torch.dup")
    hvd.synchronize(h)


def test_broadcast_parameters_and_objects():
    r = hvd.rank()
    torch.manual_seed(r)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model[1].running_mean.fill_(r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    assert torch.equal(model[0].weight, ref[0].weight)
    assert torch.equal(model[1].running_mean, torch.zeros(3))
    other = torch.nn.Linear(2, 2)
    hvd.broadcast_parameters(list(other.named_parameters()), root_rank=0)
    gathered = hvd.allgather(other.weight.detach().reshape(1, -1))
    assert all(torch.equal(gathered[0], gathered[k]) for k in range(hvd.size()))
    with pytest.raises(ValueError, match="invalid params of type"):
        hvd.broadcast_parameters(5, root_rank=0)
    got = hvd.broadcast_object({"t": torch.arange(3) * r, "r": r}, root_rank=0)
    assert got["r"] == 0 and torch.equal(got["t"], torch.zeros(3, dtype=torch.int64))
    assert hvd.allgather_object(r) == list(range(hvd.size()))


def _data(step, rank, batch=6):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(batch, 5, generator=g), torch.randint(0, 3, (batch,), generator=g)


def _model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _reference_grads(step, passes=1, like=None):
    """Each rank's local gradient (summed over its passes) at ``like``'s parameters (the
    initial ones by default), averaged over ranks."""
    model = _model()
    if like is not None:
        model.load_state_dict(like.state_dict())
    total = None
    for q in range(hvd.size()):
        model.zero_grad()
        for p in range(passes):
            x, y = _data(step * passes + p, q)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    return [g / hvd.size() for g in total]


@pytest.mark.parametrize("groups", [None, 2, "list"])
def test_distributed_optimizer_averages_gradients(groups):
    r = hvd.rank()
    model = _model()
    if groups == "list":
        groups = [[model[0].weight, model[2].weight]]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), groups=groups)
    x, y = _data(0, r)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    for got, want in zip(model.parameters(), _reference_grads(0)):
        assert torch.allclose(got.grad, want, atol=1e-6)


def test_backward_passes_per_step_accumulates_locally():
    r = hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    opt.zero_grad()
    for p in range(2):
        x, y = _data(p, r)
        torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    for got, want in zip(model.parameters(), _reference_grads(0, passes=2)):
        assert torch.allclose(got.grad, want, atol=1e-6)
    if hvd.size() > 1:
        opt.zero_grad()
        for p in range(2):
            x, y = _data(p, r)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()


def test_training_keeps_ranks_identical_and_matches_the_reference():
    r = hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.none)
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, y = _data(step, r)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        for p, g in zip(ref.parameters(), _reference_grads(step, like=ref)):
            p.grad = g
        ref_opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-5)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0))
    assert all(torch.equal(every[0], every[k]) for k in range(hvd.size()))


def test_synchronize_skip_synchronize_and_zero_grad_rules():
    need_two()
    r = hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    x, y = _data(3, r)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called after loss.backward"):
        opt.zero_grad()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="optimizer.step\\(\\) called without"):
        opt.step()


def test_broadcast_optimizer_state():
    r = hvd.rank()
    for wrap in (False, True):
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
        if wrap:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        x, y = _data(9, r)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
        state = opt.state_dict()["state"][0]["exp_avg"]
        every = hvd.allgather(state.reshape(1, -1))
        assert all(torch.equal(every[0], every[k]) for k in range(hvd.size()))
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)


def test_sparse_gradients_with_and_without_densifying():
    n, r = hvd.size(), hvd.rank()
    for dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(6, 2, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.0),
                                       named_parameters=[(f"emb{dense}", emb.weight)],
                                       sparse_as_dense=dense)
        emb(torch.tensor([r % 6])).sum().backward()
        opt.step()
        grad = emb.weight.grad.to_dense()
        want = torch.zeros(6, 2)
        for q in range(n):
            want[q % 6] += 1.0 / n
        assert torch.allclose(grad, want, atol=1e-6), (dense, grad)


def test_sync_batch_norm_matches_batch_norm_over_the_global_batch():
    n, r = hvd.size(), hvd.rank()
    g = torch.Generator().manual_seed(5)
    everyone = torch.randn(n * 3, 4, 5, generator=g, dtype=torch.float64) * 2 + 1
    mine = everyone[3 * r:3 * (r + 1)].clone().requires_grad_(True)
    sbn = hvd.SyncBatchNorm(4, momentum=0.3).double()
    out = sbn(mine)
    weights = torch.arange(everyone.numel(), dtype=torch.float64).reshape(everyone.shape)
    (out * weights[3 * r:3 * (r + 1)]).sum().backward()

    ref_in = everyone.clone().requires_grad_(True)
    bn = torch.nn.BatchNorm1d(4, momentum=0.3).double()
    ref = bn(ref_in)
    (ref * weights).sum().backward()
    assert torch.allclose(out, ref[3 * r:3 * (r + 1)], atol=1e-9)
    assert torch.allclose(mine.grad, ref_in.grad[3 * r:3 * (r + 1)], atol=1e-9)
    assert torch.allclose(sbn.running_mean, bn.running_mean, atol=1e-12)
    assert torch.allclose(sbn.running_var, bn.running_var, atol=1e-12)
    # The weight's gradient is local (the DistributedOptimizer averages it later); summed over
    # ranks it is the global one.
    total = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
    assert torch.allclose(total, bn.weight.grad, atol=1e-8)
    sbn.eval()
    assert torch.allclose(sbn(mine), bn.eval()(mine), atol=1e-9)
    with pytest.raises(ValueError, match="expected at least 2D input"):
        sbn(torch.ones(3))
