"""The "horotopo" torch.distributed backend and DDP hooks, against gloo in the same job.

Runs under mpiexec at any size (tests/test_mpi_tier.py). The default group is "horotopo",
started as a user would (``init_process_group("horotopo")`` with no MASTER_ADDR: the MPI
rendezvous); a gloo group over the same ranks (``new_group(backend="gloo")``, on the store
that rendezvous made) gives every reference result.
"""
from datetime import timedelta
from typing import Callable, List

import pytest

torch = pytest.importorskip("torch", reason="horotopo.torch needs torch (the [torch] extra)")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import horotopo.torch as hvd  # noqa: E402
import horotopo.torch.distributed as htd  # noqa: E402
from gpu_support import require_device  # noqa: E402
from horotopo.api.basics import runtime  # noqa: E402
from test_api_collectives import start  # noqa: E402  (init with a ring plan)

# Every dtype horotopo.torch moves (horotopo.torch.tensors), each against gloo.
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool]
R = dist.ReduceOp


@pytest.fixture(scope="module")
def gloo():
    start()
    dist.init_process_group("horotopo")
    group = dist.new_group(backend="gloo")
    yield group
    dist.destroy_process_group()


def need_two():
    if hvd.size() < 2:
        pytest.skip("needs at least 2 ranks")


def data(dtype: torch.dtype, rank: int, n: int = 6) -> torch.Tensor:
    # Small integers: every dtype holds them, their sums and products exactly.
    return (torch.arange(n) % 3 + rank + 1).to(dtype)


# gloo has no int16 ("Invalid scalar type"): its reference runs on int32 copies, exact for the
# small integers of data().
GLOO_DTYPE = {torch.int16: torch.int32}


def for_gloo(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in a dtype gloo reduces (its own dtype where gloo has it)."""
    return t.to(GLOO_DTYPE.get(t.dtype, t.dtype), copy=True)


def equal(mine: torch.Tensor, ref: torch.Tensor) -> bool:
    return torch.equal(mine, ref.to(mine.dtype))


def test_rank_and_size_come_from_mpi(gloo):
    assert dist.get_backend() == "horotopo"
    assert (dist.get_rank(), dist.get_world_size()) == (hvd.rank(), hvd.size())
    assert isinstance(dist.distributed_c10d._get_default_group(), htd.ProcessGroupHorotopo)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_matches_gloo(gloo, dtype):
    ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT] + ([R.AVG] if dtype.is_floating_point else [])
    for op in ops:
        mine = data(dtype, dist.get_rank())
        ref = for_gloo(mine)
        dist.all_reduce(mine, op=op)
        dist.all_reduce(ref, op=op, group=gloo)
        assert mine.dtype == dtype and equal(mine, ref), (op, mine, ref)
    xs = [data(dtype, dist.get_rank(), k + 1) for k in range(3)]
    refs = [for_gloo(x) for x in xs]
    dist.all_reduce_coalesced(xs, op=R.MAX)
    for x, ref in zip(xs, refs):
        dist.all_reduce(ref, op=R.MAX, group=gloo)
        assert equal(x, ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_and_allgathers_match_gloo(gloo, dtype):
    me, n = dist.get_rank(), dist.get_world_size()
    for root in range(n):
        mine = data(dtype, me)
        ref = for_gloo(mine)
        dist.broadcast(mine, src=root)
        dist.broadcast(ref, src=root, group=gloo)
        assert equal(mine, ref)
    x = data(dtype, me).reshape(2, 3)
    outs = [torch.empty_like(x) for _ in range(n)]
    refs = [for_gloo(x) for _ in range(n)]
    dist.all_gather(outs, x)
    dist.all_gather(refs, for_gloo(x), group=gloo)
    assert all(equal(a, b) for a, b in zip(outs, refs))
    out, ref = torch.empty(2 * n, 3, dtype=dtype), for_gloo(torch.empty(2 * n, 3, dtype=dtype))
    dist.all_gather_into_tensor(out, x)
    dist.all_gather_into_tensor(ref, for_gloo(x), group=gloo)
    assert equal(out, ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_scatters_match_gloo(gloo, dtype):
    me, n = dist.get_rank(), dist.get_world_size()
    for op in (R.SUM, R.MAX):
        inputs = [data(dtype, me + k, 4) for k in range(n)]
        out, ref = torch.empty(4, dtype=dtype), for_gloo(torch.empty(4, dtype=dtype))
        dist.reduce_scatter(out, inputs, op=op)
        dist.reduce_scatter(ref, [for_gloo(t) for t in inputs], op=op, group=gloo)
        assert equal(out, ref), (op, out, ref)
        flat = torch.cat(inputs)
        out, ref = torch.empty(4, dtype=dtype), for_gloo(torch.empty(4, dtype=dtype))
        dist.reduce_scatter_tensor(out, flat, op=op)
        dist.reduce_scatter_tensor(ref, for_gloo(flat), op=op, group=gloo)
        assert equal(out, ref), (op, out, ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_to_all_single_matches_gloo(gloo, dtype):
    me, n = dist.get_rank(), dist.get_world_size()
    x = (torch.arange(2 * n) + 100 * me).to(dtype)
    out, ref = torch.empty_like(x), for_gloo(x)
    dist.all_to_all_single(out, x)
    dist.all_to_all_single(ref, for_gloo(x), group=gloo)
    assert equal(out, ref)
    # uneven: rank me sends k + 1 rows to rank k; rank k receives k + 1 from everyone
    send = [k + 1 for k in range(n)]
    recv = [me + 1] * n
    x = (torch.arange(sum(send)) + 100 * me).to(dtype)
    out = torch.empty(sum(recv), dtype=dtype)
    ref = for_gloo(torch.empty(sum(recv), dtype=dtype))
    dist.all_to_all_single(out, x, recv, send)
    dist.all_to_all_single(ref, for_gloo(x), recv, send, group=gloo)
    assert equal(out, ref)


def test_async_work_wait_and_future(gloo):
    n = dist.get_world_size()
    works = [dist.all_reduce(torch.full((3,), float(k)), async_op=True) for k in range(5)]
    chained = works[-1].get_future().then(lambda f: f.value()[0] * 2)
    for k, w in enumerate(works):
        assert w.wait() is True
        assert w.is_completed()
    assert torch.equal(works[0].get_future().value()[0], torch.zeros(3))
    assert torch.equal(chained.wait(), torch.full((3,), 8.0 * n))
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()


def _expect_error_everywhere(call: Callable[[], object], match: str) -> None:
    with pytest.raises(Exception, match=match):
        call()


def test_mismatched_tensors_raise_on_every_rank(gloo):
    need_two()
    me = dist.get_rank()
    _expect_error_everywhere(lambda: dist.all_reduce(torch.ones(me + 2)),
                             "Mismatched ALLREDUCE tensor shapes")
    dtype = torch.float32 if me == 0 else torch.float64
    _expect_error_everywhere(lambda: dist.broadcast(torch.ones(3, dtype=dtype), src=0),
                             "Mismatched data types")
    _expect_error_everywhere(
        lambda: dist.all_gather_into_tensor(torch.empty((me + 1) * dist.get_world_size()),
                                            torch.ones(me + 1)),
        "Mismatched ALLGATHER tensor shapes")
    n = dist.get_world_size()
    _expect_error_everywhere(
        lambda: dist.reduce_scatter_tensor(torch.empty(2, dtype=dtype),
                                           torch.ones(2 * n, dtype=dtype)),
        "Mismatched data types")
    _expect_error_everywhere(
        lambda: dist.all_to_all_single(torch.empty(n, dtype=dtype), torch.ones(n, dtype=dtype)),
        "Mismatched data types")
    # different collectives at one place of the group's order
    other = ((lambda: dist.all_reduce(torch.ones(4))) if me == 0
             else (lambda: dist.broadcast(torch.ones(4), src=0)))
    _expect_error_everywhere(other, "Mismatched operations")
    t = torch.ones(2)
    dist.all_reduce(t)  # the job goes on
    assert torch.equal(t, torch.full((2,), float(dist.get_world_size())))


def test_what_horotopo_cannot_do_names_itself(gloo):
    # called on the group itself: torch.distributed's own argument checks differ by rank
    pg = dist.distributed_c10d._get_default_group()
    for call, what in [(lambda: pg.gather([[torch.ones(1)]], [torch.ones(1)], None), "gather"),
                       (lambda: pg.scatter([torch.ones(1)], [[torch.ones(1)]], None),
                        "scatter"),
                       (lambda: pg.reduce([torch.ones(1)], None), "reduce"),
                       (lambda: pg.alltoall([torch.ones(1)], [torch.ones(1)], None),
                        "alltoall")]:
        with pytest.raises(NotImplementedError, match=f"does not implement {what}:"):
            call()
    with pytest.raises(ValueError, match="no reduction BAND"):
        dist.all_reduce(torch.ones(1, dtype=torch.int32), op=R.BAND)
    # send/recv: CPU and CUDA tensors of the listed dtypes, tags within the group's block
    for call, match in [(lambda: pg.send([torch.ones(1, device="meta")], 0, 0),
                         "cannot run send of a meta tensor: .*CPU and CUDA tensors only"),
                        (lambda: pg.recv([torch.ones(1, dtype=torch.complex64)], 0, 0),
                         "cannot run recv of torch.complex64")]:
        with pytest.raises(NotImplementedError, match=match):
            call()
    with pytest.raises(ValueError, match=r"tag -1 is out of range; .* tags 0\.\."):
        pg.send([torch.ones(1)], 0, -1)
    with pytest.raises(ValueError, match="rank 99 is not in the group"):
        pg.recv([torch.ones(1)], 99, 0)


# ---------------------------------------------------------------------------- send and recv

P2P_DTYPES = DTYPES


def test_ring_exchange_respects_tags_for_every_dtype(gloo):
    # every rank sends two messages right (tags 7, then 3) and receives them from the left in
    # the other order: each tag matches its own message (at n = 1 the ring is this rank)
    me, n = dist.get_rank(), dist.get_world_size()
    right, left = (me + 1) % n, (me - 1) % n
    for dtype in P2P_DTYPES:
        a, b = data(dtype, me), data(dtype, me + 10)[:4].reshape(2, 2)
        got_b, got_a = torch.zeros(2, 2, dtype=dtype), torch.zeros(6, dtype=dtype)
        sends = [dist.isend(a, right, tag=7), dist.isend(b, right, tag=3)]
        recv_b, recv_a = dist.irecv(got_b, left, tag=3), dist.irecv(got_a, left, tag=7)
        for w in sends + [recv_b, recv_a]:
            w.wait()
        assert torch.equal(got_a, data(dtype, left)), (dtype, got_a)
        assert torch.equal(got_b, data(dtype, left + 10)[:4].reshape(2, 2)), (dtype, got_b)
    got = torch.zeros(3)  # torch's batch form goes through the same send and recv
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(me)), right),
           dist.P2POp(dist.irecv, got, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(got, torch.full((3,), float(left)))


def test_send_recv_beside_collectives_and_from_any_rank(gloo):
    need_two()
    me, n = dist.get_rank(), dist.get_world_size()
    # a receive posted before a collective and matched after it: the runtime's own messages
    # and the user's do not meet
    got = torch.zeros(5, dtype=torch.bfloat16)
    pending = dist.irecv(got, (me - 1) % n, tag=0)
    total = torch.ones(1000)
    dist.all_reduce(total)
    dist.send(torch.full((5,), float(me) + 0.5, dtype=torch.bfloat16), (me + 1) % n, tag=0)
    pending.wait()
    assert torch.equal(got, torch.full((5,), ((me - 1) % n) + 0.5, dtype=torch.bfloat16))
    assert torch.equal(total, torch.full((1000,), float(n)))
    # rank 0 receives from whichever rank sends first; recv returns the sender
    if me == 0:
        senders = []
        for _ in range(n - 1):
            t = torch.zeros(3, 2)  # not contiguous once transposed: received via a copy
            src = dist.recv(t.t(), tag=11)
            assert torch.equal(t.t(), torch.full((2, 3), float(src))), (src, t)
            senders.append(src)
        assert sorted(senders) == list(range(1, n))
    else:
        dist.send(torch.full((2, 3), float(me)), 0, tag=11)
    # a receive from any rank posted before one from rank 1: rank 1's first message is its
    if me == 0:
        first, second = torch.zeros(2), torch.zeros(7)
        works = [dist.irecv(first, tag=4), dist.irecv(second, 1, tag=4)]
        for w in works:
            w.wait()
        assert torch.equal(first, torch.ones(2)) and torch.equal(second, torch.full((7,), 2.0))
    elif me == 1:
        dist.send(torch.ones(2), 0, tag=4)
        dist.send(torch.full((7,), 2.0), 0, tag=4)
    dist.barrier()


def test_a_message_of_another_size_or_dtype_is_an_error_naming_both(gloo):
    need_two()
    me, n = dist.get_rank(), dist.get_world_size()
    right, left = (me + 1) % n, (me - 1) % n
    sends = [dist.isend(torch.arange(4, dtype=torch.int32), right, tag=2),
             dist.isend(torch.ones(3), right, tag=2),
             dist.isend(torch.arange(6, dtype=torch.int64), right, tag=2)]
    with pytest.raises(ValueError, match=f"rank {left} sent 4 int32 elements .*receiving "
                                         f"tensor holds 5 int32"):
        dist.recv(torch.zeros(5, dtype=torch.int32), left, tag=2)
    with pytest.raises(ValueError, match="sent 3 float32 elements .* holds 3 float64"):
        dist.recv(torch.zeros(3, dtype=torch.float64), left, tag=2)
    ok = torch.zeros(6, dtype=torch.int64)  # the stream stays in step after the errors
    dist.recv(ok, left, tag=2)
    assert torch.equal(ok, torch.arange(6))
    for w in sends:
        w.wait()


def test_a_receive_nobody_answers_ends_at_the_groups_timeout(gloo):
    me, n = dist.get_rank(), dist.get_world_size()
    pg = htd.ProcessGroupHorotopo(me, n, timedelta(seconds=0.3))  # every rank makes one
    with pytest.raises(Exception, match=rf"recv from rank {(me - 1) % n} \(tag 1\).*timeout "
                                        r"of 0.3 s"):
        pg.recv([torch.zeros(2)], (me - 1) % n, 1).wait()


def test_messages_travel_on_the_runtimes_user_transport(gloo):
    rt = runtime()
    users = rt.user_transport()
    # the engine's data transport below its link tracking (staged only with a device)
    assert users is rt.engine.tracked.inner or users.inner is rt.engine.tracked.inner
    me, n = dist.get_rank(), dist.get_world_size()
    got = torch.zeros(2)
    works = [dist.isend(torch.ones(2), (me + 1) % n, tag=9),
             dist.irecv(got, (me - 1) % n, tag=9)]
    for w in works:
        w.wait()
    assert dist.distributed_c10d._get_default_group()._p2p._transport is users


def test_cuda_tensors_take_the_device_path(gloo, monkeypatch):
    require_device()  # skips with "no CUDA device" (fails under HOROTOPO_TEST_GPU=1)
    from horotopo.gpu import StagingTransport

    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    me, n = dist.get_rank(), dist.get_world_size()
    for dtype in DTYPES:  # the collectives, against gloo on the same values on the CPU
        for op in [R.SUM, R.MIN, R.MAX, R.PRODUCT]:
            mine, ref = data(dtype, me).to(dev), for_gloo(data(dtype, me))
            dist.all_reduce(mine, op=op)
            dist.all_reduce(ref, op=op, group=gloo)
            assert mine.is_cuda and equal(mine.cpu(), ref), (dtype, op)
        mine, ref = data(dtype, me).to(dev), for_gloo(data(dtype, me))
        dist.broadcast(mine, src=n - 1)
        dist.broadcast(ref, src=n - 1, group=gloo)
        assert equal(mine.cpu(), ref)
        out = torch.empty(6 * n, dtype=dtype, device=dev)
        ref = for_gloo(torch.empty(6 * n, dtype=dtype))
        dist.all_gather_into_tensor(out, data(dtype, me).to(dev))
        dist.all_gather_into_tensor(ref, for_gloo(data(dtype, me)), group=gloo)
        assert equal(out.cpu(), ref)
        flat = torch.cat([data(dtype, me + k, 4) for k in range(n)])
        out, ref = torch.empty(4, dtype=dtype, device=dev), for_gloo(torch.empty(4, dtype=dtype))
        dist.reduce_scatter_tensor(out, flat.to(dev))
        dist.reduce_scatter_tensor(ref, for_gloo(flat), group=gloo)
        assert equal(out.cpu(), ref)
    # send/recv: the user transport is handed the tensors' device memory (a CuPy view), and
    # stages it through pinned memory only where MPI is not CUDA-aware
    users = runtime().user_transport()
    payloads = []
    post = users.isend

    def isend(buf, dest, tag):
        payloads.append(type(buf).__module__.split(".")[0])
        return post(buf, dest, tag)

    monkeypatch.setattr(users, "isend", isend)
    staged_before = users.staged_bytes if isinstance(users, StagingTransport) else 0
    right, left = (me + 1) % n, (me - 1) % n
    nbytes = 0
    for dtype in P2P_DTYPES:
        sent = data(dtype, me).to(dev)
        got = torch.zeros(3, 2, dtype=dtype, device=dev).t()  # not contiguous
        works = [dist.isend(sent, right, tag=1), dist.irecv(got, left, tag=1)]
        for w in works:
            w.wait()
        assert torch.equal(got.cpu(), data(dtype, left).reshape(2, 3)), dtype
        nbytes += 2 * sent.numel() * sent.element_size()
    assert payloads == ["numpy", "cupy"] * len(P2P_DTYPES)  # header, then the payload
    if isinstance(users, StagingTransport):
        assert users.staged_bytes - staged_before == nbytes


# ---------------------------------------------------------------------------- DDP and FSDP

# Weights and inputs that are multiples of 60, a batch of 60 rows (the last bias's gradient
# is the row count) and learning rate 1 keep every gradient a multiple of 60, so dividing by
# 1..5 ranks is exact and every run must end on the same parameters bit for bit.
EXACT = 60


def _model(scale: int = EXACT) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randint(-2, 3, p.shape) * scale).double())
    return model


def _train(model: nn.Module, steps: int = 3, scale: int = EXACT) -> List[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    me = dist.get_rank()
    for step in range(steps):
        x = ((torch.arange(60 * 5).reshape(60, 5) % 4 + me + step) * scale).double()
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _assert_same(got: List[torch.Tensor], want: List[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g - w).abs().max()


def test_ddp_with_the_horotopo_backend_equals_gloo(gloo):
    want = _train(DDP(_model(), process_group=gloo, bucket_cap_mb=1e-4))
    got = _train(DDP(_model(), bucket_cap_mb=1e-4))  # several buckets: several allreduces
    _assert_same(got, want)


def test_ddp_hook_equals_gloo(gloo):
    want = _train(DDP(_model(), process_group=gloo, bucket_cap_mb=1e-4))
    model = DDP(_model(), process_group=gloo, bucket_cap_mb=1e-4)
    model.register_comm_hook(htd.hook_state(gloo), htd.allreduce_hook)
    _assert_same(_train(model), want)


def _torchs_bf16_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    # torch's own hook under another name: DDP refuses the name bf16_compress_hook without
    # NCCL, although gloo reduces bfloat16 on the CPU
    return default_hooks.bf16_compress_hook(state, bucket)


@pytest.mark.parametrize("ours,torchs", [(htd.float16_compress_hook,
                                          default_hooks.fp16_compress_hook),
                                         (htd.bfloat16_compress_hook, _torchs_bf16_hook)],
                         ids=["fp16", "bf16"])
def test_compressing_hooks_equal_torchs(gloo, ours, torchs):
    # small integers: float16 must hold the gradients
    want_model = DDP(_model(1), process_group=gloo)
    want_model.register_comm_hook(gloo, torchs)
    model = DDP(_model(1), process_group=gloo)
    model.register_comm_hook(htd.hook_state(gloo), ours)
    got, want = _train(model, steps=1, scale=1), _train(want_model, steps=1, scale=1)
    # The compressed sums round (more so as ranks add up), in an order that differs from
    # gloo's: equal to within the format's precision, relative to the largest entry.
    eps = torch.finfo(torch.float16 if ours is htd.float16_compress_hook
                      else torch.bfloat16).eps
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=4 * eps * float(w.abs().max()))


def test_fsdp_fully_shard_trains_on_horotopo(gloo):
    fsdp = pytest.importorskip("torch.distributed.fsdp",
                               reason="this torch has no torch.distributed.fsdp")
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    def sharded(mesh: DeviceMesh) -> List[torch.Tensor]:
        model = _model()
        fsdp.fully_shard(model, mesh=mesh)
        _train(model)
        return [p.full_tensor().detach().clone() for p in model.parameters()]

    got = sharded(init_device_mesh("cpu", (dist.get_world_size(),)))
    want = sharded(DeviceMesh.from_group(gloo, "cpu"))
    _assert_same(got, want)
    _assert_same(got, _train(DDP(_model(), process_group=gloo)))
