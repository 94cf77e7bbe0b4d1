"""The Horovod timeline: the Chrome-trace writer, the runtime's and the tree
algorithm's hooks in one process, and a 2-rank job launched with
``horotopo-run --timeline-filename`` that ends without calling shutdown()."""
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import horotopo as hvd
from horotopo import timeline
from horotopo.algorithms.tree import TreeAllreduce, TreeBroadcast
from horotopo.api.records import Response
from horotopo.api.runtime import ALLREDUCE, BROADCAST
from horotopo.plan import plan_from_trees
from loop_transport import run_ranks
from mpi_launch import ROOT
from test_api import _runtime_with_engine, _submit
from test_launch import _launcher
from timeline_check import check_trace, events_named, lanes, load_trace, names_on, rows


@pytest.fixture(autouse=True)
def no_timeline_left():
    yield
    timeline.stop()


def test_writer_rows_lanes_and_balanced_spans(tmp_path):
    path = tmp_path / "t.json"
    tl = timeline.Timeline(str(path), label="job")
    t = timeline.clock()
    tl.begin("grad.w", "ALLREDUCE", ts=t)
    tl.complete("grad.w", "QUEUE", t, t + 1e-3)
    tl.complete(["grad.w", "grad.b"], "TREE_REDUCE", t, t + 2e-3, {"tree": 0},
                lane="tree 0 reduce")
    tl.end("grad.w", ts=t + 3e-3, args={"dtype": "float32"})
    tl.end("grad.b")               # nothing open there: skipped, not an unmatched E
    tl.marker(timeline.CYCLE_START, t)
    tl.flush()
    mid = load_trace(str(path))    # complete JSON between flushes
    assert mid["otherData"]["producer"] == "horotopo"
    tl.begin("grad.b", "BROADCAST")  # left open: close() ends it
    tl.close()
    tl.begin("late", "ALLREDUCE")    # after close: ignored
    doc = load_trace(str(path))
    by_name = rows(doc)
    assert by_name["job"] == 0 and set(by_name) == {"job", "grad.w", "grad.b"}
    w, b = by_name["grad.w"], by_name["grad.b"]
    assert names_on(doc, w) == ["ALLREDUCE", "QUEUE"]
    assert lanes(doc, w) == {"tree 0 reduce": 1} and lanes(doc, b) == {"tree 0 reduce": 1}
    assert names_on(doc, b, 1) == ["TREE_REDUCE"]
    [queue] = events_named(doc, "QUEUE", w)
    assert queue["dur"] == pytest.approx(1000.0, abs=0.01)   # microseconds
    ends = [ev for ev in doc["traceEvents"] if ev["ph"] == "E"]
    assert ends[0]["args"] == {"dtype": "float32"}
    assert ends[1]["pid"] == b and ends[1]["args"] == {"unfinished": True}
    assert [ev["name"] for ev in doc["traceEvents"] if ev["ph"] == "i"] == ["CYCLE_START"]


def test_checker_rejects_what_viewers_cannot_draw():
    head = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "x"}}]
    with pytest.raises(AssertionError, match="B without E"):
        check_trace({"traceEvents": head + [{"ph": "B", "name": "a", "ts": 0, "pid": 1,
                                             "tid": 0}]})
    with pytest.raises(AssertionError, match="without nesting"):
        check_trace({"traceEvents": head + [
            {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 0},
            {"ph": "X", "name": "b", "ts": 5, "dur": 10, "pid": 1, "tid": 0}]})


def test_writer_is_thread_safe(tmp_path):
    path = tmp_path / "threads.json"
    tl = timeline.Timeline(str(path))
    per_thread = 3000    # more than one automatic flush per thread

    def work(k: int) -> None:
        for i in range(per_thread):
            tl.begin(f"row{k}", "OP", args={"i": i})
            tl.complete(f"row{k}", "INNER", timeline.clock(), timeline.clock(), lane="lane")
            tl.end(f"row{k}")
            if i % 500 == 0:
                tl.flush()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    tl.close()
    doc = load_trace(str(path))
    by_name = rows(doc)
    for k in range(6):
        pid = by_name[f"row{k}"]
        assert [ev["args"]["i"] for ev in doc["traceEvents"]
                if ev["ph"] == "B" and ev["pid"] == pid] == list(range(per_thread))
        assert len(names_on(doc, pid, lanes(doc, pid)["lane"])) == per_thread


def test_start_keeps_the_same_file_and_closes_another(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    tl = timeline.start(str(first))
    assert timeline.active() is tl and not tl.mark_cycles
    assert timeline.start(str(first), mark_cycles=True) is tl and tl.mark_cycles
    tl.complete("x", "OP", timeline.clock(), timeline.clock())
    other = timeline.start(str(second))
    assert other is not tl and tl.closed and timeline.active() is other
    assert "x" in rows(load_trace(str(first)))
    with pytest.raises(OSError):
        timeline.start(str(tmp_path / "missing-dir" / "c.json"))
    assert timeline.active() is other      # a bad path leaves the running timeline alone
    timeline.stop()
    assert timeline.active() is None and other.closed
    load_trace(str(second))
    assert timeline.tree_phases(allreduce=True) is None


TWO_TREES = plan_from_trees(3, [(0, [-1, 0, 0], [-1, 0, 1], 3.0),
                                (2, [1, 2, -1], [1, 2, -1], 1.0)], chunk_bytes=4096)


def test_tree_algorithms_record_each_trees_phases(tmp_path):
    path = tmp_path / "trees.json"
    tl = timeline.start(str(path))
    count, chunk = 20_000, 1024

    def body(t):
        # Every simulated rank shares the process's timeline; a row per rank keeps them apart.
        tl.set_rows([f"rank {t.rank}"])
        src = np.full(count, t.rank + 1.0, np.float32)
        out = np.empty_like(src)
        TreeAllreduce(t, TWO_TREES).run(src, out, "sum", chunk)
        buf = out.copy() if t.rank == 1 else np.zeros(count, np.float32)
        tl.set_rows([f"bcast {t.rank}"])
        TreeBroadcast(t, TWO_TREES).run(buf, 1, chunk)
        return out, buf

    results = run_ranks(3, body)
    timeline.stop()
    for out, buf in results:
        assert np.all(out == 6.0) and np.all(buf == 6.0)
    doc = load_trace(str(path))
    by_name = rows(doc)
    for r in range(3):
        pid = by_name[f"rank {r}"]
        lane = lanes(doc, pid)
        assert set(lane) == {"tree 0 reduce", "tree 0 broadcast", "tree 1 reduce",
                             "tree 1 broadcast"}
        for k, root in ((0, 0), (1, 2)):
            [red] = events_named(doc, "TREE_REDUCE", pid)[k:k + 1]
            assert red["tid"] == lane[f"tree {k} reduce"]
            assert red["args"]["tree"] == k and red["args"]["root"] == root
            [bc] = [ev for ev in events_named(doc, "TREE_BCAST", pid)
                    if ev["tid"] == lane[f"tree {k} broadcast"]]
            # the broadcast of a tree ends after its reduce (the pipeline overlaps them)
            assert bc["ts"] + bc["dur"] >= red["ts"] + red["dur"] - 0.01
        # tree 0 carries 3/4 of the buffer in chunks of 1024 elements
        assert events_named(doc, "TREE_REDUCE", pid)[0]["args"]["elements"] == 15_000
        assert events_named(doc, "TREE_REDUCE", pid)[0]["args"]["chunks"] == 15
        bpid = by_name[f"bcast {r}"]
        assert events_named(doc, "TREE_REDUCE", bpid) == []
        assert {ev["args"]["tree"] for ev in events_named(doc, "TREE_BCAST", bpid)} == {0, 1}


def test_runtime_writes_negotiation_queue_fusion_and_op_spans(tmp_path):
    path = tmp_path / "rt.json"
    rt = _runtime_with_engine(size=4)
    tl = timeline.start(str(path))
    ha, ea = _submit(rt, ALLREDUCE, "grad.a", np.ones(4, np.float32))
    hb, eb = _submit(rt, ALLREDUCE, "grad.b", np.ones(2, np.float32))
    hc, ec = _submit(rt, BROADCAST, "weights", np.arange(3, dtype=np.float64))
    # grad.b went through rank 0's negotiation: every rank's request time gives a tick
    t = timeline.clock()
    rt.ready_times["grad.b"] = {0: eb.t0, 1: t - 0.002, 2: t - 0.001, 3: t}
    responses = [Response(ALLREDUCE, "grad.a", None, ea.sig),
                 Response(ALLREDUCE, "grad.b", None, eb.sig),
                 Response(BROADCAST, "weights", None, ec.sig)]
    rt.trace_negotiations(tl, responses)
    rt.execute(responses)
    timeline.stop()
    assert rt.wait(ha)[0].tolist() == [4.0] * 4 and rt.wait(hc)[0].tolist() == [0.0, 1.0, 2.0]
    doc = load_trace(str(path))
    by_name = rows(doc)
    a, b, w = by_name["grad.a"], by_name["grad.b"], by_name["weights"]
    assert names_on(doc, a) == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE",
                                "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"]
    assert names_on(doc, b) == ["NEGOTIATE_ALLREDUCE", "0", "1", "2", "3", "ALLREDUCE",
                                "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"]
    assert events_named(doc, "NEGOTIATE_ALLREDUCE", a)[0]["args"] == {"cached": True}
    assert events_named(doc, "NEGOTIATE_ALLREDUCE", b)[0]["args"] == {"cached": False}
    assert events_named(doc, "ALLREDUCE", a)[0]["args"] == {"fused_tensors": 2}
    # a single broadcast needs no fusion buffer
    assert names_on(doc, w) == ["NEGOTIATE_BROADCAST", "BROADCAST", "QUEUE"]
    ends = {ev["pid"]: ev["args"] for ev in doc["traceEvents"] if ev["ph"] == "E"
            and ev["tid"] == 0 and "shape" in ev.get("args", {})}
    assert ends[a] == {"dtype": "float32", "shape": [4]}
    assert ends[w] == {"dtype": "float64", "shape": [3]}
    assert rt.ready_times == {}


def test_runtime_marks_an_errors_op_span(tmp_path):
    path = tmp_path / "err.json"
    rt = _runtime_with_engine()
    tl = timeline.start(str(path))
    h, e = _submit(rt, ALLREDUCE, "bad", np.ones(2, np.float32))
    responses = [Response(ALLREDUCE, "bad", "Mismatched things.", e.sig)]
    rt.trace_negotiations(tl, responses)
    rt.execute(responses)
    timeline.stop()
    with pytest.raises(hvd.HorovodInternalError):
        rt.wait(h)
    doc = load_trace(str(path))
    pid = rows(doc)["bad"]
    assert events_named(doc, "NEGOTIATE_ALLREDUCE", pid)[0]["args"]["error"] == \
        "Mismatched things."
    [end] = [ev for ev in doc["traceEvents"] if ev["ph"] == "E" and ev["pid"] == pid]
    assert end["args"]["error"] == "Mismatched things."


def test_start_and_stop_timeline_need_init():
    with pytest.raises(ValueError, match="has not been initialized"):
        hvd.start_timeline("/tmp/never.json")
    with pytest.raises(ValueError, match="has not been initialized"):
        hvd.stop_timeline()


JOB = """
import sys
import numpy as np
import horotopo as hvd
hvd.init()
x = np.full(50_000, hvd.rank() + 1.0, np.float32)
for step in range(3):
    hvd.allreduce(x, op=hvd.Sum, name="grad.w")
hvd.grouped_allreduce([x[:10], x[:20]], op=hvd.Sum, name="grads")
hvd.broadcast(np.arange(4.0), root_rank=1, name="weights")
print("job done", hvd.rank(), flush=True)
# no shutdown(): the timeline must still be closed at interpreter exit
"""


@pytest.mark.mpi
def test_two_rank_job_launched_with_a_timeline_writes_it(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    path = tmp_path / "timeline.json"
    res = subprocess.run(_launcher() + ["-np", "2", "-x", "HOROTOPO_PROBE=off",
                                        "--timeline-filename", str(path),
                                        "--timeline-mark-cycles", sys.executable, str(script)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stdout[-4000:]
    assert res.stdout.count("job done") == 2
    doc = load_trace(str(path))
    by_name = rows(doc)
    assert {"grad.w", "grads.0of2", "grads.1of2", "weights"} <= set(by_name)
    assert doc["otherData"]["size"] == 2 and doc["otherData"]["plan"]
    w = by_name["grad.w"]
    ops = names_on(doc, w)
    assert ops.count("NEGOTIATE_ALLREDUCE") == 3 and ops.count("ALLREDUCE") == 3
    assert "QUEUE" in ops
    algorithms = [n for n in ops if n.endswith("_ALLREDUCE") and n != "NEGOTIATE_ALLREDUCE"]
    assert len(algorithms) == 3 and set(algorithms) <= {"TREE_ALLREDUCE", "MPI_ALLREDUCE",
                                                        "RING_ALLREDUCE"}
    assert "MEMCPY_IN_FUSION_BUFFER" in names_on(doc, by_name["grads.0of2"])
    assert names_on(doc, by_name["weights"])[-1] == "TREE_BROADCAST"
    assert any(ev["ph"] == "i" and ev["name"] == "CYCLE_START" for ev in doc["traceEvents"])
    # the tree broadcast always runs on the trees: rank 0's phase of each tree is there
    assert any(name.endswith(" broadcast") for name in lanes(doc, by_name["weights"]))
    assert json.loads(Path(path).read_text())  # plain json too, not only the checker
    assert not (ROOT / "timeline.json").exists()
