"""Process sets (Horovod 0.28's hvd.ProcessSet / add_process_set / remove_process_set and the
process_set= argument): disjoint and overlapping sets, sets made and removed while other ops
are in flight, Horovod's errors, and each set's own plan over its members' sub-network.

Works at any size (tests/test_mpi_tier.py); what needs two ranks or more says so. Results are
small integers, so every comparison is exact.
"""
import numpy as np
import pytest

import horotopo as hvd
from horotopo.api import process_sets as ps_module
from horotopo.api.basics import runtime
from test_api_collectives import start


@pytest.fixture(scope="module", autouse=True)
def started():
    start()
    # The module needs dynamic sets; the job was started by whichever module came first.
    saved = ps_module._dynamic
    ps_module.allow_dynamic()
    yield
    ps_module._dynamic = saved


def _need_two():
    if hvd.size() < 2:
        pytest.skip("needs two ranks: at one rank every process set is the global set")


def test_the_global_sets_ranks_are_a_duplicate():
    with pytest.raises(ValueError, match=r"^Attempted to add a duplicate process set: "):
        hvd.add_process_set(range(hvd.size()))


def _halves():
    n = hvd.size()
    return [r for r in range(n) if r % 2 == 0], [r for r in range(n) if r % 2 == 1]


def test_add_and_remove_need_dynamic_process_sets(monkeypatch):
    monkeypatch.setattr(ps_module, "_dynamic", False)
    monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)
    with pytest.raises(ValueError, match=r"^Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding "
                                         r"process sets after Horovod initialization\.$"):
        hvd.add_process_set([0])
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 7
    with pytest.raises(ValueError, match="to allow removing process sets"):
        hvd.remove_process_set(fake)
    assert hvd.remove_process_set(hvd.global_process_set) is False


def test_disjoint_sets_give_exact_results_over_their_members():
    _need_two()
    r = hvd.rank()
    even, odd = _halves()
    sets = [hvd.add_process_set(even)] + ([hvd.add_process_set(odd)] if odd else [])
    mine = next(s for s in sets if s.included())
    members = mine.ranks
    assert mine.size() == len(members) and mine.rank() == members.index(r)
    assert hvd.global_process_set.ranks == list(range(hvd.size()))
    x = np.full(3, r + 1, np.int64)
    assert hvd.allreduce(x, op=hvd.Sum, name="ps.sum", process_set=mine).tolist() == \
        [sum(q + 1 for q in members)] * 3
    avg = hvd.allreduce(np.full(2, float(r), np.float64), name="ps.avg", process_set=mine)
    assert avg.tolist() == [sum(members) / len(members)] * 2
    got = hvd.allgather(np.full((r % 3 + 1, 2), r, np.int32), name="ps.gather",
                        process_set=mine)
    assert got[:, 0].tolist() == [q for q in members for _ in range(q % 3 + 1)]
    root = members[-1]                      # a global rank, as in Horovod
    b = hvd.broadcast(np.full(4, r, np.int32), root, name="ps.bcast", process_set=mine)
    assert b.tolist() == [root] * 4
    a, c = hvd.grouped_allreduce([np.ones(2, np.int32) * r, np.ones(1) * 2], op=hvd.Sum,
                                 name="ps.grouped", process_set=mine)
    assert a.tolist() == [sum(members)] * 2 and c.tolist() == [2.0 * len(members)]
    k = len(members)
    rs = hvd.reducescatter(np.arange(2 * k, dtype=np.int64) * (r + 1), op=hvd.Sum,
                           name="ps.rs", process_set=mine)
    me = members.index(r)
    total = sum(q + 1 for q in members)
    assert rs.tolist() == [2 * me * total, (2 * me + 1) * total]
    out, received = hvd.alltoall(np.arange(k, dtype=np.int32) + 10 * r, splits=[1] * k,
                                 name="ps.a2a", process_set=mine)
    assert out.tolist() == [10 * q + me for q in members] and received.tolist() == [1] * k
    hvd.barrier(process_set=mine)
    assert hvd.allgather_object({"r": r}, process_set=mine) == [{"r": q} for q in members]
    assert hvd.broadcast_object(r * 7, root_rank=members[0], process_set=mine) == members[0] * 7
    for s in reversed(sets):
        assert hvd.remove_process_set(s) is True
        assert s.process_set_id is None


def test_overlapping_sets_and_the_global_set_run_at_once_under_one_name():
    _need_two()
    n, r = hvd.size(), hvd.rank()
    # Both overlap the global set, and each other from three ranks on ([0, 1] and [1, 2]).
    low = hvd.add_process_set(range(0, max(1, n - 1)))
    high = hvd.add_process_set(range(1, n))
    handles = [(hvd.allreduce_async(np.full(2, r + 1), op=hvd.Sum, name="ov"), list(range(n)))]
    for s in (low, high):
        if s is not None and s.included():
            handles.append((hvd.allreduce_async(np.full(2, r + 1), op=hvd.Sum, name="ov",
                                                process_set=s), s.ranks))
    for h, members in handles:
        assert hvd.synchronize(h).tolist() == [float(sum(q + 1 for q in members))] * 2
    for s in (high, low):
        if s is not None:
            assert hvd.remove_process_set(s)


def test_sets_made_and_removed_while_a_global_op_waits():
    _need_two()
    n, r = hvd.size(), hvd.rank()
    # Pending until every rank asks: rank 0 asks only after the set was made and removed.
    h = None if r == 0 else hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="while.waiting")
    s = hvd.add_process_set([n - 1])
    if s.included():
        assert hvd.allreduce(np.full(1, 5.0), op=hvd.Sum, process_set=s).tolist() == [5.0]
    assert hvd.remove_process_set(s)
    if r == 0:
        h = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="while.waiting")
    assert hvd.synchronize(h).tolist() == [float(n)]


def test_horovods_errors_for_sets():
    _need_two()
    n, r = hvd.size(), hvd.rank()
    s = hvd.add_process_set([0])
    with pytest.raises(ValueError, match="Attempted to add a duplicate process set"):
        hvd.add_process_set([0])
    if r != 0:
        with pytest.raises(ValueError, match=rf"^Allreduce: Rank {r} is not a member of the "
                                             rf"provided process set\.$"):
            hvd.allreduce(np.ones(1), process_set=s)
        with pytest.raises(ValueError, match=rf"^Allgather: Rank {r} is not a member"):
            hvd.allgather(np.ones(1), process_set=s)
        with pytest.raises(ValueError, match="Process is not part of provided process set."):
            s.rank()
        assert s.included() is False
    else:
        with pytest.raises(ValueError, match="broadcast received invalid root rank"):
            hvd.broadcast(np.ones(1), n, process_set=s)
        with pytest.raises(NotImplementedError, match="Adasum does not support non-global"):
            hvd.allreduce(np.ones(1), op=hvd.Adasum, process_set=s)
    assert hvd.remove_process_set(s)
    assert hvd.remove_process_set(s) is False         # already removed: Horovod's False
    with pytest.raises(ValueError, match=r"^Broadcast: Process set provided does not exist, or "
                                         r"has not been registered\.$"):
        hvd.broadcast(np.ones(1), 0, process_set=s)
    with pytest.raises(ValueError, match="distinct ranks"):
        hvd.add_process_set([0, n])


def test_a_sets_plan_covers_its_members_only():
    _need_two()
    n, r = hvd.size(), hvd.rank()
    members = list(range(1, n)) if n > 2 else [0]
    s = hvd.add_process_set(members)
    rt = runtime()
    if s.included():
        group = rt.sets.groups[s.process_set_id]
        k = len(members)
        assert group.ranks == tuple(members) and group.rank == members.index(r)
        assert group.plan.n == k and group.topology.n == k
        for tree in group.plan.trees:
            assert 0 <= tree.root < k and len(tree.reduce_parent) == k
            assert all(-1 <= p < k for p in tree.reduce_parent + tree.bcast_parent)
        # The set's model is the job's, cut to the members (no new probe).
        job = rt.setup.topology
        assert group.topology.hosts == tuple(job.hosts[q] for q in members)
        assert [list(x) for x in group.topology.latency_s] == \
            [[job.latency_s[a][b] for b in members] for a in members]
        digests = hvd.allgather_object(group.plan.digest, process_set=s)
        assert len(set(digests)) == 1
    else:
        assert s.process_set_id not in rt.sets.groups
    assert hvd.remove_process_set(s)


def _all_done_before_shutdown():
    # One rank's shutdown ends the ops still pending on every rank (Horovod's semantics), and
    # an op on a set without that rank may still be pending on its members: without this,
    # the rank whose own set ran slower failed now and then with "Horovod has been shut down".
    hvd.barrier()


def test_init_with_process_sets_registers_them_in_order():
    n = hvd.size()
    _need_two()
    hvd.shutdown()
    try:
        with pytest.raises(ValueError, match="process_sets entry number 2 is a duplicate"):
            hvd.init(process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet(range(1, n)),
                                   hvd.ProcessSet(reversed(range(1, n)))])
        assert not hvd.is_initialized()
        sets = [hvd.ProcessSet([0]), hvd.ProcessSet(reversed(range(1, n)))]
        hvd.init(process_sets=sets)
        assert [s.process_set_id for s in sets] == [1, 2]
        assert runtime().sets.ids() == {0: list(range(n)), 1: [0], 2: list(range(1, n))}
        mine = sets[0] if hvd.rank() == 0 else sets[1]
        got = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=mine)
        assert got.tolist() == [float(mine.size())]
        _all_done_before_shutdown()
    finally:
        hvd.shutdown()
        start()


def test_init_with_communicator_process_sets():
    _need_two()
    from mpi4py import MPI

    n, r = hvd.size(), hvd.rank()
    even, odd = _halves()
    sub = MPI.COMM_WORLD.Split(color=r % 2, key=r)
    hvd.shutdown()
    try:
        mine, whole = hvd.ProcessSet(sub), hvd.ProcessSet(MPI.COMM_WORLD)
        assert mine.ranks is None and mine.process_set_id is None
        hvd.init(process_sets=[mine, whole])
        want = even if r % 2 == 0 else odd
        assert mine.ranks == want and mine.included()
        # Every rank registered both halves, in the same order, though it saw only its own.
        assert runtime().sets.ids() == {0: list(range(n)), 1: even, 2: odd}
        assert mine.process_set_id == (1 if r % 2 == 0 else 2)
        assert whole.process_set_id is None          # the global set's duplicate
        got = hvd.allreduce(np.array([r]), op=hvd.Sum, process_set=mine)
        assert got.tolist() == [sum(want)]
        with pytest.raises(NotImplementedError, match="^Dynamically adding process sets "
                                                      "defined by an MPI communicator"):
            hvd.add_process_set(hvd.ProcessSet(sub))
        _all_done_before_shutdown()
    finally:
        hvd.shutdown()
        sub.Free()
        start()


def test_distributed_optimizer_averages_over_its_set():
    _need_two()
    torch = pytest.importorskip("torch")
    import horotopo.torch as thvd

    r = hvd.rank()
    even, odd = _halves()
    sets = [hvd.add_process_set(even)] + ([hvd.add_process_set(odd)] if odd else [])
    mine = next(s for s in sets if s.included())
    w = torch.nn.Parameter(torch.zeros(2))
    opt = thvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0),
                                    named_parameters=[("w", w)], process_set=mine)
    opt.zero_grad()
    (w * float(r + 1)).sum().backward()        # gradient r + 1 on this rank
    opt.step()
    want = -sum(q + 1 for q in mine.ranks) / len(mine.ranks)
    assert w.detach().tolist() == [want, want]
    # allgather's gradient: averaged over the set, then this rank's rows within the set.
    x = torch.full((r % 2 + 1,), float(r), requires_grad=True)
    got = thvd.allgather(x, name="ps.grad", process_set=mine)
    assert got.tolist() == [float(q) for q in mine.ranks for _ in range(q % 2 + 1)]
    (got * (torch.arange(len(got), dtype=torch.float32) + r)).sum().backward()
    offset = sum(q % 2 + 1 for q in mine.ranks[:mine.rank()])
    mean = sum(mine.ranks) / len(mine.ranks)
    assert x.grad.tolist() == [offset + k + mean for k in range(r % 2 + 1)]
    for s in reversed(sets):
        assert hvd.remove_process_set(s)


def test_unnamed_ops_of_a_set_leave_the_global_numbering_in_step():
    """Only a set's members count its unnamed ops: after the even ranks ran some that the odd
    ranks did not, unnamed ops of the global set still pair up across all ranks."""
    _need_two()
    even, _ = _halves()
    evens = hvd.add_process_set(even)
    try:
        if hvd.rank() in even:
            for k in range(3):
                got = hvd.broadcast(np.full(2, hvd.rank() + k), root_rank=even[0],
                                    process_set=evens)
                assert got.tolist() == [even[0] + k] * 2
            assert hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=evens)[0] == len(even)
        got = hvd.broadcast(np.full(2, hvd.rank()), root_rank=0)
        assert got.tolist() == [0, 0]
        assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == hvd.size()
    finally:
        hvd.remove_process_set(evens)
