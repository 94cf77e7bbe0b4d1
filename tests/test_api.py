"""Unit tests of the API runtime's pieces that need no MPI: ops, errors, cache, negotiation
messages and fusion (with a recording engine). Multi-rank behaviour is in tests/mpi/."""
import warnings
from collections import OrderedDict

import numpy as np
import pytest

import horotopo as hvd
from horotopo.api import runtime as rtmod
from horotopo.api.controller import Coordinator, ResponseCache, bits_of, trace_negotiations
from horotopo.api.executors import Executor
from horotopo.api.ops import check_op, handle_average_backwards_compatibility
from horotopo.api.queue import RequestQueue
from horotopo.api.records import Response, Signature
from horotopo.api.runtime import ALLGATHER, ALLREDUCE, BARRIER, BROADCAST
from horotopo.api.settings import Settings


def test_op_constants_match_horovod():
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def test_average_and_op_together_is_an_error():
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        handle_average_backwards_compatibility(hvd.Sum, True)


def test_average_flag_is_deprecated_but_honoured():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert handle_average_backwards_compatibility(None, True) == hvd.Average
        assert handle_average_backwards_compatibility(None, False) == hvd.Sum
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert handle_average_backwards_compatibility(None, None) == hvd.Average


def test_adasum_is_not_implemented_and_bad_ops_are_rejected():
    with pytest.raises(NotImplementedError, match="Adasum"):
        check_op(hvd.Adasum)
    with pytest.raises(ValueError, match="unknown reduction op"):
        check_op(17)


def test_queries_before_init_raise_horovods_error():
    if hvd.is_initialized():
        pytest.skip("another test in this process initialized horotopo")
    for query in (hvd.size, hvd.rank, hvd.local_rank, hvd.local_size, hvd.cross_rank,
                  hvd.cross_size, hvd.mpi_threads_supported):
        with pytest.raises(ValueError, match=r"has not been initialized; use hvd.init\(\)\."):
            query()


def test_internal_error_aliases():
    assert hvd.HorotopoInternalError is hvd.HorovodInternalError
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


def test_process_sets_need_init_and_ranks():
    with pytest.raises(ValueError, match="has not been initialized"):
        hvd.add_process_set([0])
    with pytest.raises(ValueError, match="list of process ranks"):
        hvd.ProcessSet(3)
    ps = hvd.ProcessSet([2, 0])
    assert ps.ranks == [0, 2] and ps.process_set_id is None and ps.size() is None


def test_a_topology_restricted_to_some_ranks_keeps_their_links():
    from horotopo.api.process_sets import restrict
    from horotopo.topology import bundled, load

    top = load(bundled("racks-2x3"))
    sub = restrict(top, [1, 4, 5])
    assert sub.n == 3 and sub.hosts == tuple(top.hosts[r] for r in (1, 4, 5))
    assert sub.routes[0][2] == tuple(top.routes[1][5])
    assert sub.latency_s[2][1] == top.latency_s[5][4]
    assert sub.digest != top.digest


def test_bits_of_lists_set_bits_in_order():
    words = np.array([0b1011, 1 << 63, 0, 1], dtype=np.uint64)
    assert bits_of(words) == [0, 1, 3, 127, 192]


def test_response_cache_is_lru_and_reuses_lowest_free_bit():
    cache = ResponseCache(3)
    for name in "abc":
        cache.put(name, (name,))
    assert [cache.get(n)[0] for n in "abc"] == [0, 1, 2]
    cache.touch("a")                      # b is now least recently used
    cache.put("d", ("d",))
    assert cache.get("b") is None and cache.get("d")[0] == 1
    cache.erase_bit(0)                    # a
    cache.put("e", ("e",))
    assert cache.get("e")[0] == 0 and len(cache) == 3
    assert cache.entry_at(2) == ("c", ("c",))


def test_cache_capacity_zero_caches_nothing():
    cache = ResponseCache(0)
    cache.put("a", ("a",))
    assert cache.get("a") is None


def _sig(kind=ALLREDUCE, dtype="float32", shape=(2, 3), op=hvd.Sum, pre=1.0, post=1.0, root=0,
         device=-1):
    return Signature(kind, dtype, shape, op, pre, post, root, device)


@pytest.fixture
def coordinator():
    return Coordinator(3, Settings.from_env())


@pytest.mark.parametrize("other,message", [
    (_sig(shape=(3, 3)), "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape "
                         "[2, 3], but another rank sent a tensor of shape [3, 3]."),
    (_sig(dtype="int32"), "Mismatched data types: One rank had type HOROVOD_FLOAT32, but "
                          "another rank had type HOROVOD_INT32."),
    (_sig(kind=BROADCAST), "Mismatched operations: One rank did an ALLREDUCE, but another rank "
                           "did an BROADCAST."),
    (_sig(pre=0.5), "Mismatched prescale and/or postscale factors: One rank sent factors "
                    "(1, 1), but another rank sent factors (0.5, 1)."),
    (_sig(op=hvd.Max), "Mismatched reduction operation: One rank sent reduction op 1, but "
                       "another rank sent reduction op 4."),
    (_sig(device=0), "Mismatched ALLREDUCE CPU/GPU device selection: One rank specified device "
                     "CPU, but another rank specified device GPU."),
])
def test_mismatch_messages_use_horovods_wording(coordinator, other, message):
    resp = coordinator.construct("t", {0: _sig(), 1: _sig(), 2: other})
    assert (resp.kind, resp.name, resp.error) == (ALLREDUCE, "t", message)


def test_broadcast_root_and_allgather_shape_messages(coordinator):
    b = lambda root: _sig(kind=BROADCAST, root=root)  # noqa: E731
    assert coordinator.construct("b", {0: b(0), 1: b(1), 2: b(0)}).error == (
        "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank "
        "specified root rank 1.")
    g = lambda shape: _sig(kind=ALLGATHER, shape=shape)  # noqa: E731
    assert coordinator.construct("g", {0: g((2, 3)), 1: g((5, 4)), 2: g((1, 3))}).error == (
        "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to 3, "
        "but another rank sent a tensor with dimension 1 equal to 4.")
    assert coordinator.construct("g", {0: g((2, 3)), 1: g((2,)), 2: g((1, 3))}).error == (
        "Mismatched ALLGATHER tensor shapes: One rank sent a tensor of rank 2, but another rank "
        "sent a tensor of rank 1.")
    assert coordinator.construct("g", {0: g(()), 1: g(()), 2: g(())}).error == (
        "Rank zero tried to ALLGATHER a rank-zero tensor.")
    ok = coordinator.construct("g", {0: g((2, 3)), 1: g((0, 3)), 2: g((4, 3))})
    assert ok.error is None and ok.extra == [2, 0, 4]


class RecordingEngine:
    """Engine double: sums as if every rank held the same data, and records each call."""

    def __init__(self, size):
        self.size = size
        self.calls = []

    def allreduce(self, sendbuf, recvbuf=None, op="sum", prescale_factor=1.0,
                  postscale_factor=1.0):
        self.calls.append(("allreduce", sendbuf.dtype.name, sendbuf.size, op, prescale_factor,
                           postscale_factor))
        assert op == "sum"
        np.copyto(recvbuf, sendbuf * prescale_factor * self.size * postscale_factor,
                  casting="unsafe")
        return recvbuf

    def broadcast(self, buf, root):
        self.calls.append(("broadcast", buf.dtype.name, buf.size, root))
        return buf


class Harness:
    """The runtime's parts that run a cycle's responses, put together as the runtime does,
    around a recording engine: the request queue, the pending entries and the executor (no
    thread, no MPI). ``ready_times`` stands for the coordinator's, for the timeline."""

    def __init__(self, size, threshold):
        self.queue = RequestQueue()
        self.queue.size = size
        self.pending = OrderedDict()
        self.engine = RecordingEngine(size)
        self.executor = Executor(self.engine, 0, size, threshold,
                                 {"engine_allreduces": 0, "fused_tensors": 0},
                                 self.queue.finish)
        self.ready_times = {}
        self.tl = None
        self.t_resp = 0.0

    def enqueue(self, *args, **kwargs):
        return self.queue.enqueue(*args, **kwargs)

    def wait(self, hid):
        return self.queue.wait(hid, alive=lambda: True)

    def admit(self):
        """Move what was enqueued to the pending entries, as a cycle does; return it."""
        entries, _ = self.queue.take()
        for e in entries:
            self.pending[e.name] = e
        return entries

    def trace_negotiations(self, tl, responses):
        self.tl = tl
        self.t_resp = trace_negotiations(tl, responses, self.pending, self.ready_times)

    def execute(self, responses):
        self.executor.execute(responses, self.pending, self.tl, self.t_resp)


def _runtime_with_engine(size=4, threshold=1 << 20):
    return Harness(size, threshold)


def _submit(rt, kind, name, array, op=hvd.Sum, pre=1.0, post=1.0, root=0):
    out = np.empty_like(array) if array is not None else None
    hid = rt.enqueue(kind, [(name, array, out)], op=op, prescale=pre, postscale=post, root=root)
    (entry,) = rt.admit()
    return hid, entry


def test_fusion_groups_by_dtype_op_and_scale_and_respects_the_threshold():
    rt = _runtime_with_engine(threshold=64)
    plan = [("a", np.float32, 4, hvd.Sum, 1.0), ("b", np.float32, 4, hvd.Sum, 1.0),
            ("c", np.float64, 4, hvd.Sum, 1.0), ("d", np.float32, 4, hvd.Sum, 2.0),
            ("e", np.float32, 4, hvd.Average, 1.0), ("f", np.float32, 8, hvd.Sum, 1.0)]
    entries = {}
    for name, dtype, n, op, pre in plan:
        hid, e = _submit(rt, ALLREDUCE, name, np.ones(n, dtype), op=op, pre=pre)
        entries[name] = (hid, e)
    rt.execute([Response(ALLREDUCE, name, None, entries[name][1].sig) for name, *_ in plan])
    calls = rt.engine.calls
    # a+b fuse (32 bytes); f would make 64 bytes: still within 64, so it joins them.
    assert ("allreduce", "float32", 16, "sum", 1.0, 1.0) in calls
    assert ("allreduce", "float64", 4, "sum", 1.0, 1.0) in calls
    assert ("allreduce", "float32", 4, "sum", 2.0, 1.0) in calls
    assert ("allreduce", "float32", 4, "sum", 1.0, 0.25) in calls   # Average: 1/size post
    assert len(calls) == 4
    for name, dtype, n, op, pre in plan:
        got = rt.wait(entries[name][0])[0]
        want = pre * (1 if op == hvd.Average else 4)
        assert got.dtype == dtype and np.all(got == want), name


def test_fusion_threshold_splits_buffers():
    rt = _runtime_with_engine(threshold=40)
    hids = [_submit(rt, ALLREDUCE, f"t{k}", np.full(4, k, np.float32))[0] for k in range(5)]
    rt.execute([Response(ALLREDUCE, f"t{k}", None, rt.pending[f"t{k}"].sig) for k in range(5)])
    assert [c[2] for c in rt.engine.calls] == [8, 8, 4]
    assert [rt.wait(h)[0].tolist() for h in hids] == [[4.0 * k] * 4 for k in range(5)]


def test_narrow_integers_are_widened_for_the_engine():
    rt = _runtime_with_engine(size=2)
    hid, e = _submit(rt, ALLREDUCE, "i8", np.array([100, -3], np.int8))
    rt.execute([Response(ALLREDUCE, "i8", None, e.sig)])
    assert rt.engine.calls[0][1] == "int64"
    assert rt.wait(hid)[0].tolist() == [-56, -6]     # wraps like native int8 arithmetic


def test_broadcasts_from_one_root_share_a_byte_buffer():
    rt = _runtime_with_engine()
    h1, e1 = _submit(rt, BROADCAST, "x", np.arange(3, dtype=np.float64), root=0)
    h2, e2 = _submit(rt, BROADCAST, "y", np.arange(5, dtype=np.int16), root=0)
    h3, e3 = _submit(rt, BROADCAST, "z", np.arange(2, dtype=np.int16), root=1)
    rt.execute([Response(BROADCAST, e.name, None, e.sig) for e in (e1, e2, e3)])
    assert rt.engine.calls == [("broadcast", "uint8", 34, 0), ("broadcast", "uint8", 4, 1)]
    assert rt.wait(h1)[0].tolist() == [0.0, 1.0, 2.0]
    assert rt.wait(h2)[0].tolist() == [0, 1, 2, 3, 4]


def test_error_responses_and_barriers_complete_their_handles():
    rt = _runtime_with_engine()
    h_err, e = _submit(rt, ALLREDUCE, "bad", np.ones(2, np.float32))
    h_bar = rt.enqueue(BARRIER, [("barrier.0", None, None)])
    rt.admit()
    rt.execute([Response(ALLREDUCE, "bad", "Mismatched things.", e.sig),
                Response(BARRIER, "barrier.0", None, rt.pending["barrier.0"].sig)])
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched things."):
        rt.wait(h_err)
    assert rt.wait(h_bar) == [None]
    assert not rt.queue.pending_names   # both names are free again


def test_duplicate_pending_name_is_a_value_error():
    rt = _runtime_with_engine()
    _submit(rt, ALLREDUCE, "dup", np.ones(2))
    with pytest.raises(ValueError, match="same name as another tensor"):
        rt.enqueue(ALLREDUCE, [("dup", np.ones(2), np.ones(2))])
    with pytest.raises(ValueError, match="same name"):
        rt.enqueue(ALLREDUCE, [("p", np.ones(2), None), ("p", np.ones(2), None)])


def test_env_settings_read_horovods_knobs(monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3.5")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1048576")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "7")
    cfg = rtmod.env_settings()
    assert cfg["cycle_time_s"] == pytest.approx(0.0035)
    assert cfg["fusion_threshold"] == 1 << 20
    assert cfg["stall_check_s"] == 7.0
    monkeypatch.delenv("HOROVOD_CYCLE_TIME")
    monkeypatch.delenv("HOROVOD_FUSION_THRESHOLD")
    cfg = rtmod.env_settings()
    assert cfg["cycle_time_s"] == pytest.approx(0.001)
    assert cfg["fusion_threshold"] == 128 * 1024 * 1024
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "fast")
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME"):
        rtmod.env_settings()


def test_broadcast_root_out_of_range_is_a_value_error():
    rt = _runtime_with_engine(size=4)
    with pytest.raises(ValueError, match="root_rank 4 is out of range: there are 4 ranks"):
        rt.enqueue(BROADCAST, [("b", np.ones(2), np.ones(2))], root=4)


def _req(name, kind, call="", count=1):
    from horotopo.api.records import Request, Signature

    return Request(name, Signature(kind, "float32", (2,), 1, 1.0, 1.0, 0, -1), 0.0, call, count)


def test_different_collectives_under_one_call_are_a_mismatch_for_all_its_names():
    from horotopo.api.controller import Coordinator
    from horotopo.api.records import ALLGATHER, ALLREDUCE
    from horotopo.api.settings import Settings

    c = Coordinator(2, Settings.from_env())
    assert c.respond([[_req("g.0of2", ALLREDUCE, "g", 2)], []], False) == []
    got = c.respond([[_req("g.1of2", ALLREDUCE, "g", 2)], [_req("g", ALLGATHER)]], False)
    assert sorted(r.name for r in got) == ["g", "g.0of2", "g.1of2"]
    assert {r.error for r in got} == {"Mismatched operations: One rank did an ALLREDUCE, but "
                                      "another rank did an ALLGATHER."}
    assert c.table == {}


def test_a_name_answered_through_a_join_can_come_again():
    """Regression: a name answered because the other ranks had joined left rank 0's call
    record behind; when the name came again, rank 0 looked up a request it had not made."""
    from horotopo.api.controller import Coordinator
    from horotopo.api.records import ALLREDUCE, JOIN, JOIN_NAME
    from horotopo.api.settings import Settings

    c = Coordinator(3, Settings.from_env())
    assert c.respond([[_req("n", ALLREDUCE)], [], []], False) == []
    got = c.respond([[], [_req(JOIN_NAME, JOIN)], [_req(JOIN_NAME, JOIN)]], False)
    assert [r.name for r in got] == ["n"]
    assert c._calls == {}      # nothing of the answered name is left to meet its next use
    c.respond([[_req(JOIN_NAME, JOIN)], [], []], False)          # the join completes
    assert c.respond([[], [], [_req("n", ALLREDUCE)]], False) == []
    assert c.respond([[], [_req("n", ALLREDUCE)], []], False) == []
    (resp,) = c.respond([[_req("n", ALLREDUCE)], [], []], False)
    assert (resp.name, resp.error) == ("n", None)


def test_init_refuses_process_sets_that_repeat_each_other_or_the_global_set():
    from horotopo.api.process_sets import check_duplicates

    check_duplicates([hvd.ProcessSet([0]), hvd.ProcessSet([1, 2])], size=3)
    with pytest.raises(ValueError, match=r"^Horovod could not be initialized because "
                                         r"process_sets entry number 1 is a duplicate: "):
        check_duplicates([hvd.ProcessSet([0]), hvd.ProcessSet([0])])
    with pytest.raises(ValueError, match="entry number 0 is a duplicate"):
        check_duplicates([hvd.ProcessSet([2, 1, 0])], size=3)      # the global set
    with pytest.raises(TypeError, match="entry number 0 is not an hvd.ProcessSet"):
        check_duplicates([[0, 1]])


def test_version_is_the_installed_packages_one_source():
    from importlib import metadata

    import horotopo
    assert horotopo.__version__ == metadata.version("horotopo")
    torch_front = pytest.importorskip("horotopo.torch", reason="horotopo.torch needs torch")
    assert torch_front.__version__ is horotopo.__version__
    assert "__version__" in horotopo.__all__ and "__version__" in torch_front.__all__
