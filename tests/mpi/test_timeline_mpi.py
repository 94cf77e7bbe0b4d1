"""The Horovod timeline in a real job, at any size: hvd.start_timeline /
stop_timeline while running, and HOROVOD_TIMELINE at init. Only rank 0 writes; it checks the
file and every rank fails with its verdict."""
import os

import numpy as np
import pytest

import horotopo as hvd
from horotopo.api.basics import runtime
from test_api_collectives import start
from timeline_check import events_named, lanes, load_trace, names_on, rows

BIG = 1 << 18          # float32 elements: 1 MiB, every tree of the plan gets a segment


@pytest.fixture(scope="module", autouse=True)
def started():
    start()
    yield


def verdict(check, name):
    """Run ``check()`` on rank 0; every rank fails with its AssertionError, if any."""
    problem = None
    if hvd.rank() == 0:
        try:
            check()
        except AssertionError as exc:
            problem = f"rank 0: {exc}"
    problem = hvd.broadcast_object(problem, root_rank=0, name=name)
    assert problem is None, problem


@pytest.fixture
def forced_algorithms(monkeypatch):
    """Buffers of BIG elements go through the trees, smaller ones through MPI_Allreduce, on
    every rank (whatever the cost model would pick), so the file's content is known."""
    inner = runtime().engine.engine
    plain = inner.allreduce

    def allreduce(sendbuf, recvbuf=None, **kwargs):
        kwargs["algorithm"] = "tree" if sendbuf.size >= BIG else "mpi"
        return plain(sendbuf, recvbuf, **kwargs)

    monkeypatch.setattr(inner, "allreduce", allreduce)


def _trees_of_plan():
    return {k for k, t in enumerate(runtime().plan.trees) if t.share > 0}


def test_start_and_stop_timeline_while_running(tmp_path, forced_algorithms):
    n, r = hvd.size(), hvd.rank()
    path = str(tmp_path / "runtime.json")
    big = np.full(BIG, r + 1.0, np.float32)
    hvd.start_timeline(path, mark_cycles=True)
    for _ in range(2):
        assert hvd.allreduce(big, op=hvd.Sum, name="tl.big")[0] == n * (n + 1) / 2
    hvd.allreduce(np.ones(8, np.float32), op=hvd.Sum, name="tl.small")
    hvd.grouped_allreduce([np.ones(3, np.float32), np.ones(5, np.float32)], op=hvd.Sum,
                          name="tl.group")
    assert hvd.broadcast(np.full(6, float(r)), root_rank=n - 1, name="tl.bcast")[0] == n - 1
    assert hvd.allgather(np.array([r]), name="tl.gather").tolist() == list(range(n))
    hvd.stop_timeline()
    hvd.allreduce(np.ones(2, np.float32), name="tl.after")
    if r != 0:
        assert not os.path.exists(path), "only rank 0 writes the timeline"

    def check():
        doc = load_trace(path)
        by_name = rows(doc)
        assert {"tl.big", "tl.small", "tl.group.0of2", "tl.group.1of2", "tl.bcast",
                "tl.gather"} <= set(by_name), sorted(by_name)
        assert "tl.after" not in by_name, "an op after stop_timeline() was written"
        big_ops = names_on(doc, by_name["tl.big"])
        assert big_ops.count("NEGOTIATE_ALLREDUCE") == 2 and big_ops.count("ALLREDUCE") == 2
        assert big_ops.count("TREE_ALLREDUCE") == 2 and "QUEUE" in big_ops, big_ops
        # the first tl.big was negotiated through rank 0: one tick per rank
        assert [str(k) for k in range(n)] == [x for x in big_ops if x.isdigit()]
        assert "MPI_ALLREDUCE" in names_on(doc, by_name["tl.small"])
        group = names_on(doc, by_name["tl.group.0of2"])
        assert "MEMCPY_IN_FUSION_BUFFER" in group and "MEMCPY_OUT_FUSION_BUFFER" in group
        assert events_named(doc, "ALLREDUCE", by_name["tl.group.1of2"])[0]["args"] == \
            {"fused_tensors": 2}
        bcast = names_on(doc, by_name["tl.bcast"])
        assert bcast[0] == "NEGOTIATE_BROADCAST" and "BROADCAST" in bcast, bcast
        gather = names_on(doc, by_name["tl.gather"])
        assert gather[0] == "NEGOTIATE_ALLGATHER" and "ALLGATHER" in gather, gather
        assert any(ev["ph"] == "i" and ev["name"] == "CYCLE_START"
                   for ev in doc["traceEvents"])
        if n == 1:
            return  # one rank moves no data: no tree ran
        assert "TREE_BROADCAST" in bcast and gather.count("TREE_BROADCAST") == n, gather
        pid = by_name["tl.big"]
        big_lanes = lanes(doc, pid)
        trees = _trees_of_plan()
        assert {ev["args"]["tree"] for ev in events_named(doc, "TREE_REDUCE", pid)} == trees
        assert {ev["args"]["tree"] for ev in events_named(doc, "TREE_BCAST", pid)} == trees
        for k in trees:
            assert {f"tree {k} reduce", f"tree {k} broadcast"} <= set(big_lanes)
            reduces = names_on(doc, pid, big_lanes[f"tree {k} reduce"])
            assert reduces == ["TREE_REDUCE"] * 2, reduces
        assert events_named(doc, "TREE_BCAST", by_name["tl.bcast"]), "no broadcast phases"

    verdict(check, "tl.verdict.runtime")


def test_timeline_from_the_environment_at_init(tmp_path, monkeypatch):
    n = hvd.size()
    path = str(tmp_path / "env.json")
    hvd.shutdown()
    monkeypatch.setenv("HOROVOD_TIMELINE", path)
    start()
    hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="env.grad")
    hvd.broadcast(np.arange(3.0), root_rank=0, name="env.weights")
    hvd.shutdown()                      # closes the file
    monkeypatch.delenv("HOROVOD_TIMELINE")
    start()                             # later modules run without a timeline
    if hvd.rank() != 0:
        assert not os.path.exists(path), "only rank 0 writes the timeline"

    def check():
        doc = load_trace(path)
        by_name = rows(doc)
        assert {"env.grad", "env.weights"} <= set(by_name), sorted(by_name)
        assert doc["otherData"]["size"] == n
        grad = names_on(doc, by_name["env.grad"])
        assert grad[0] == "NEGOTIATE_ALLREDUCE" and "ALLREDUCE" in grad, grad
        assert any(x.endswith("_ALLREDUCE") and x != "NEGOTIATE_ALLREDUCE" for x in grad), grad
        assert "BROADCAST" in names_on(doc, by_name["env.weights"])

    verdict(check, "tl.verdict.env")


def test_start_timeline_on_an_unwritable_path(tmp_path):
    bad = str(tmp_path / "no-such-dir" / "t.json")
    if hvd.rank() == 0:
        with pytest.raises(OSError):
            hvd.start_timeline(bad)
    else:
        hvd.start_timeline(bad)          # not the coordinator: nothing to open
    hvd.stop_timeline()
