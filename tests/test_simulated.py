"""The simulated transport (SimGrid actors in one process): MPI's matching rules, simulated
deadlines, byte scaling, the platform built from a topology, the engine's test grid (tree,
ring and dbtree, random plans, exact small-integer data, same bits on every rank) without
mpiexec, and `horotopo simulate` (declared, generated and probed topologies).

The grid: n in {1..8, 13, 16}; algorithms tree (random plans), ring and dbtree (NCCL's double
binary tree); per n and algorithm, every count of {0, 1, 7, 1000, 100003}
with every dtype, the op rotating so that each dtype meets every op and each count every op
(25 allreduces per algorithm and n, not the full 125: the file stays under a minute on two
cores). Skipped, with the install command, where SimGrid is missing; .ci/run installs it.
"""
import hashlib
import os
import json

import numpy as np
import pytest

from horotopo.transport.simulated import SimulatorMissing, load_simgrid

try:
    load_simgrid()
except SimulatorMissing as _exc:
    pytest.skip(str(_exc), allow_module_level=True)

from horotopo.engine import Engine  # noqa: E402
from horotopo.generate import racks, random_declared, random_measured, uniform_star  # noqa: E402
from horotopo.packing import ring_parents  # noqa: E402
from horotopo.plan import plan_from_trees  # noqa: E402
from horotopo.simulation import SimCosts, SimulationError  # noqa: E402
from horotopo.simulation.runner import run_simulated  # noqa: E402
from horotopo.simulation.platform import resource_latencies  # noqa: E402
from horotopo.topology import GBPS_TO_BPS, from_dict  # noqa: E402
from horotopo.simulation import support as simgrid_support  # noqa: E402
from horotopo.transport.base import TransportTimeout  # noqa: E402

from bench_scripts import benchmark_json, run_benchmark  # noqa: E402
from engine_cases import horovod_scaled as scaled, random_plan  # noqa: E402

COUNTS = [0, 1, 7, 1000, 100003]
DTYPES = ["float16", "float32", "float64", "int32", "int64"]
OPS = ["sum", "average", "min", "max", "product"]
FREE = SimCosts(per_message_s=0.0, recv_s_per_byte=0.0)


def star(n, gbps=1.0):
    return from_dict(uniform_star(n, gbps))


# ---- the transport's rules -------------------------------------------------------------------
def test_messages_of_one_source_and_tag_keep_their_order_and_tags_do_not_mix():
    def body(t):
        if t.rank == 0:
            reqs = [t.isend(np.full(3, k, np.int32), 1, 5) for k in range(4)]
            reqs.append(t.isend(np.full(3, 99, np.int32), 1, 6))
            t.waitall(reqs)
            return None
        # the tag-6 receive is posted first and must not take a tag-5 message
        bufs = [np.empty(3, np.int32) for _ in range(5)]
        reqs = [t.irecv(bufs[4], 0, 6)] + [t.irecv(bufs[k], 0, 5) for k in range(4)]
        t.waitall(reqs)
        return [int(b[0]) for b in bufs]

    assert run_simulated(star(2), body).results[1] == [0, 1, 2, 3, 99]


def test_a_wait_times_out_in_simulated_time_naming_the_missing_peer():
    def body(t):
        if t.rank == 1:
            req = t.irecv(np.empty(1), 0, 3)
            t0 = t.now()
            try:
                t.wait([req], t.now() + 2.0, peers=[0], what="waiting for rank 0")
            except TransportTimeout as exc:
                return str(exc), exc.missing, t.now() - t0
            return "no timeout", (), 0.0
        return None

    what, missing, waited = run_simulated(star(2), body).results[1]
    assert what == "waiting for rank 0" and missing == (0,)
    assert waited == pytest.approx(2.0, abs=1e-9)  # the deadline is on the simulated clock


def test_control_steps_agree_on_every_size():
    def body(t):
        n = t.size
        v = np.array([t.rank + 1, -t.rank], dtype=np.int64)
        t.allreduce_control(v, "sum")
        w = np.array([t.rank], dtype=np.int64)
        t.allreduce_control(w, "max", timeout_s=5.0)
        got = t.broadcast_object({"r": n - 1} if t.rank == n - 1 else None, n - 1, 5.0)
        every = t.allgather_object(t.rank * 10, 5.0)
        t.barrier(5.0)
        return v.tolist(), int(w[0]), got, every

    for n in (1, 3, 6, 8):  # recursive doubling with and without ranks left over
        want = ([n * (n + 1) // 2, -n * (n - 1) // 2], n - 1, {"r": n - 1},
                [10 * r for r in range(n)])
        assert run_simulated(star(n), body, scale=1e6).results == [want] * n


def test_scale_charges_the_simulated_bytes_on_the_link():
    nbytes, factor = 1000, 4096.0
    topo = from_dict({"name": "pair", "switches": ["sw"],
                      "links": [{"ends": ["a", "sw"], "gbps": 1.0},
                                {"ends": ["b", "sw"], "gbps": 1.0}], "ranks": ["a", "b"]})

    def body(t):
        buf = np.zeros(nbytes, np.uint8)
        t0 = t.now()
        t.waitall([t.isend(buf, 1, 1) if t.rank == 0 else t.irecv(buf, 0, 1)])
        return t.now() - t0

    plain = run_simulated(topo, body, costs=FREE).clock_s
    scaled = run_simulated(topo, body, scale=factor, costs=FREE).clock_s
    ideal = nbytes * factor / 125e6  # bytes over 1 gbps
    assert ideal <= scaled <= 1.1 * ideal  # SimGrid's TCP model gets ~97% of the rate
    assert plain < scaled / 100


def test_a_stream_sends_in_order_and_keeps_its_route_full():
    """Messages of one source, destination and tag cross one after another (the first is in
    after one message's time, not after all of theirs side by side), yet as many as fill the
    route's bandwidth-delay product are in flight (no latency paid per message)."""
    def pair(latency_ms):
        return from_dict({"name": "pair", "switches": ["sw"],
                          "links": [{"ends": ["a", "sw"], "gbps": 1.0, "latency_ms": latency_ms},
                                    {"ends": ["b", "sw"], "gbps": 1.0}], "ranks": ["a", "b"]})

    def body(t):
        bufs = [np.zeros(125_000, np.uint8) for _ in range(8)]  # 1 ms each at 1 gbps
        t0 = t.now()
        if t.rank == 0:
            t.waitall([t.isend(b, 1, 3) for b in bufs])
            return None
        reqs = [t.irecv(b, 0, 3) for b in bufs]
        t.waitall(reqs[:1])
        first = t.now() - t0
        t.waitall(reqs)
        return first, t.now() - t0

    first, last = run_simulated(pair(0.0), body, costs=FREE).results[1]
    assert 1e-3 < first < 1.2e-3 and 8e-3 < last < 8.6e-3
    first, last = run_simulated(pair(10.0), body, costs=FREE).results[1]
    assert 10e-3 < first and last < 10e-3 + 9e-3  # stop-and-wait would take 8 x 11 ms


def test_costs_are_charged_per_message_and_per_received_byte():
    costs = SimCosts(per_message_s=1e-3, recv_s_per_byte=1e-6)

    def body(t):
        buf = np.zeros(100, np.uint8)
        t.waitall([t.isend(buf, 1, 1) if t.rank == 0 else t.irecv(buf, 0, 1)])
        t.waitall([t.isend(buf, 0, 2) if t.rank == 1 else t.irecv(buf, 1, 2)])
        return t.now()

    free = run_simulated(star(2, 100.0), body, costs=FREE).clock_s
    paid = run_simulated(star(2, 100.0), body, costs=costs).clock_s
    # rank 0 posts twice (2 ms) and pays for 100 received bytes (0.1 ms) before finishing
    assert paid - free == pytest.approx(2e-3 + 1e-4, rel=0.05)


def test_costs_from_the_overhead_benchmark_summary():
    summary = {"ranks": 4, "bytes": 1 << 20, "python_cpu_s_per_message": 1e-5,
               "rows": [{"chunk_bytes": 4096, "messages": 768, "python_cpu_s": 0.01},
                        {"chunk_bytes": 1 << 20, "messages": 12, "python_cpu_s": 1.62e-3}]}
    c = SimCosts.from_overhead(summary)
    assert c.per_message_s == 1e-5
    assert c.recv_s_per_byte == pytest.approx((1.62e-3 - 12e-5) / (1.5 * (1 << 20)))


def test_a_rank_error_and_a_deadlock_are_reported():
    def raises(t):
        if t.rank == 1:
            raise KeyError("boom")
        return 1

    with pytest.raises(SimulationError, match="rank 1 raised KeyError.*boom"):
        run_simulated(star(2), raises)

    def hangs(t):
        if t.rank == 0:
            t.waitall([t.irecv(np.empty(1), 1, 9)])

    with pytest.raises(SimulationError, match="deadlock: rank 0 never returned"):
        run_simulated(star(2), hangs)


def test_missing_simgrid_says_how_to_install(monkeypatch, tmp_path):
    import sys
    monkeypatch.setitem(sys.modules, "simgrid", None)  # makes `import simgrid` fail
    monkeypatch.setattr(simgrid_support, "_DEBIAN_DIST_PACKAGES", tmp_path)
    with pytest.raises(SimulatorMissing, match="apt-get install -y python3-simgrid"):
        simgrid_support.load_simgrid()


# ---- the platform ---------------------------------------------------------------------------
def test_platform_routes_and_latencies_follow_the_model():
    doc = racks([2, 2], nic_gbps=1.0, uplink_gbps=0.25)
    for link in doc["links"]:
        link["latency_ms"] = 0.5 if "spine" in link["ends"] else 0.1
    topo = from_dict(doc)
    lat = resource_latencies(topo)
    for i in range(topo.n):
        for j in range(topo.n):
            assert sum(lat[r] for r in topo.routes[i][j]) == pytest.approx(topo.latency_s[i][j])
    meas = from_dict(random_measured(4, 3))
    lat = resource_latencies(meas)
    assert sum(lat[r] for r in meas.routes[1][2]) == pytest.approx(meas.latency_s[1][2])

    # Two flows across the one 0.25 gbps uplink share it; inside a rack they do not.
    def body(t):
        buf = np.zeros(250_000, np.uint8)
        peer = {0: 1, 1: 0, 2: 3, 3: 2}[t.rank]   # interleaved: 0,2 in rack 0; 1,3 in rack 1
        reqs = [t.isend(buf, peer, 1) if t.rank in (0, 2) else t.irecv(buf, peer, 1)]
        t.waitall(reqs)
        return t.now()

    cross = run_simulated(from_dict(racks([2, 2])), body, costs=FREE).clock_s
    assert cross >= 2 * 250_000 / (0.25e9 / 8)  # both 250 kB flows through one uplink


def test_hierarchical_platform_routes_every_pair_as_the_topology_does():
    """Declared topologies are built as star zones per attachment node under the root's
    routes: SimGrid's route between every pair of ranks is the topology's, link for link, with
    its latency (multi-GPU hosts, two ranks on one host, hosts on a switch)."""
    from horotopo.generate import rack_cluster
    shared = random_declared(9, 4)
    assert len(set(shared["ranks"])) == 7  # two hosts carry two ranks each
    for doc in (rack_cluster(12, hosts_per_rack=2, gpus=4, oversub=2, slow=0.5), shared):
        topo = from_dict(doc)

        def body(t, topo=topo):
            sg = t.sg
            me = sg.Host.current()
            bad = []
            for j in range(topo.n):
                if topo.hosts[j] == topo.hosts[t.rank]:
                    continue
                links, lat = me.route_to(sg.Host.by_name(topo.hosts[j]))
                want = [f"{r}:{topo.resources[r]}" for r in topo.routes[t.rank][j]]
                if [link.name for link in links] != want \
                        or abs(lat - topo.latency_s[t.rank][j]) > 1e-12:
                    bad.append((t.rank, j, [link.name for link in links], want))
            return bad

        assert run_simulated(topo, body).results == [[]] * topo.n


# ---- the engine's grid ----------------------------------------------------------------------




def inputs(n, rank, count, dtype, op, seed):
    """Small integers whose reductions over up to 16 ranks are exact in every dtype (products
    take a 2 on at most 4 ranks: float16 holds 2**4 exactly and 2**16 overflows)."""
    rng = np.random.default_rng(1000 * seed + rank)
    if op == "product":
        x = rng.choice([-1, 1, 2] if rank < 4 else [-1, 1], count)
    elif op in ("min", "max"):
        x = rng.integers(-50, 51, count)
    else:
        x = rng.integers(0, 4, count)
    return x.astype(dtype)




def reference(n, count, dtype, op, seed):
    wide = np.float64 if np.dtype(dtype).kind == "f" else np.int64
    every = np.stack([inputs(n, r, count, dtype, op, seed).astype(wide) for r in range(n)]) \
        if count else np.zeros((n, 0), wide)
    fold = {"sum": np.sum, "average": np.sum, "min": np.min, "max": np.max,
            "product": np.prod}[op]
    out = fold(every, axis=0).astype(wide)
    return scaled(out.astype(dtype), 1.0 / n if op == "average" else 1.0, dtype)


CASES = [(count, dtype, OPS[(c + d) % len(OPS)])
         for c, count in enumerate(COUNTS) for d, dtype in enumerate(DTYPES)]


# 7 and 13 are odd counts as 3 and 5 are, 16 a power of two as 4 and 8 are
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8] + [pytest.param(n, marks=pytest.mark.slow)
                                                       for n in (7, 13, 16)])
def test_engine_grid_exact_and_identical_on_every_rank(n):
    chunk = 32 << 10
    ring = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                           chunk_bytes=chunk)
    # dbtree builds its own two trees; the engine's plan only gives it the chunk size
    plans = {"tree": random_plan(n, 100 + n, chunk), "ring": ring, "dbtree": ring}
    topo = from_dict(random_declared(n, seed=n)) if n > 1 else star(1)

    def body(t):
        rows = []
        for alg, plan in plans.items():
            eng = Engine(t, plan)
            for k, (count, dtype, op) in enumerate(CASES):
                x = inputs(n, t.rank, count, dtype, op, k)
                before = x.copy()
                in_place = k % 2 == 1
                got = eng.allreduce(x, x if in_place else None, op=op, algorithm=alg)
                want = reference(n, count, dtype, op, k)
                ok = (got is x) if in_place else (got is not x and np.array_equal(x, before))
                exact = got.dtype == want.dtype and np.array_equal(got, want)
                rows.append((alg, count, dtype, op, ok and exact,
                             hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()))
        return rows

    run = run_simulated(topo, body, scale=1.0)
    for k, row in enumerate(run.results[0]):
        label = "{} n={} count={} {} {}".format(row[0], n, *row[1:4])
        wrong = [r for r in range(n) if not run.results[r][k][4]]
        assert not wrong, f"{label}: wrong on ranks {wrong}"
        assert len({run.results[r][k][5] for r in range(n)}) == 1, \
            f"{label}: results differ across ranks"
    assert run.clock_s > 0 or n == 1


def test_scaled_engine_run_is_checked_on_small_arrays_and_charged_full_size():
    """A 64 MiB float32 allreduce simulated with 64 KiB per rank (scale 1024), chunks scaled
    down alike so the pipeline has the full-size run's chunk count: exact results, and a
    simulated time no better than the bound the network allows."""
    n, full, factor = 4, 64 << 20, 1024
    topo = star(n, 1.0)
    plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                           chunk_bytes=1 << 20)

    def body(t):
        eng = Engine(t, plan, chunk_bytes=plan.chunk_bytes // factor,
                     window=simulated_window(plan.chunk_bytes))
        x = np.full(full // 4 // factor, t.rank + 1, np.float32)
        t0 = t.now()
        got = eng.allreduce(x, algorithm="ring")
        return bool(np.all(got == n * (n + 1) / 2)), t.now() - t0

    run = run_simulated(topo, body, scale=factor, costs=FREE)
    assert all(ok for ok, _ in run.results)
    # ring moves 2 (n-1)/n of the buffer through every NIC at 1 gbps
    bound = 2 * (n - 1) / n * full / 125e6
    assert bound <= run.clock_s <= 1.5 * bound


def simulated_window(chunk_bytes):
    from horotopo.schedule import window_for
    return window_for(chunk_bytes)


def test_simulate_command_plans_shares_and_runs_every_algorithm(tmp_path, capsys):
    """`horotopo simulate`: the plan made on rank 0 and shared by the plan protocol beats the
    ring on interleaved racks, every result is exact, and the JSON has the rows."""
    from horotopo.cli import main
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(racks([2, 2])))
    assert main(["simulate", str(path), "--size", "1M", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = {r["algorithm"]: r for r in res["rows"]}
    assert res["ranks"] == 4 and res["init_simulated_s"] > 0
    assert rows["tree"]["wrong"] == rows["ring"]["wrong"] == rows["dbtree"]["wrong"] == 0
    assert rows["tree"]["time_s"] < rows["ring"]["time_s"]
    assert res["probe"] == "declared" and res["probe_simulated_s"] is None


def test_start_together_releases_every_rank_at_one_instant_or_says_it_was_late():
    """Ranks that reach it at different instants (here after CPU work of their own) all leave
    at one agreed instant, a multiple of the margin at least a margin after the latest; a
    margin shorter than the agreement's own rounds over a 5 ms route is reported, not hidden."""
    from horotopo.generate import generate
    from horotopo.transport.base import TransportError

    def body(t):
        t._charge(0.001 * t.rank)  # each rank busy for its own time
        start = t.start_together()
        return start, t.now()

    got = run_simulated(star(5), body, costs=FREE).results
    starts = {s for s, _ in got}
    assert len(starts) == 1 and all(now == s for s, now in got)
    (start,) = starts
    assert start >= 0.004 + 1.0 and start == round(start)

    def hurried(t):
        return t.start_together(margin_s=1e-6)

    sites = from_dict(generate("sites:gpus=1,wan_gbps=10", 4))
    with pytest.raises(SimulationError, match="reached the common start .* after it"):
        run_simulated(sites, hurried, costs=FREE)


def test_a_killed_simulation_says_by_what():
    """A simulation's process that dies without a result is reported with the signal that
    killed it (SIGKILL: the out-of-memory killer's, which a 4096-rank what-if met at 21 GB),
    not as a SimGrid abort."""
    import signal

    def body(t):
        if t.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(SimulationError, match="killed by SIGKILL .*out-of-memory killer"):
        run_simulated(star(2), body, costs=FREE)


def test_a_long_simulation_reports_its_progress(capfd):
    """With ``progress``, a simulation says how far it is (messages, simulated clock, wall
    time) every ``progress_every_s`` of wall time; without it, nothing is printed."""
    import sys

    rounds, batch = 65, 64  # the wall clock is looked at every simulation_progress_messages = 4096
    count = rounds * batch

    def body(t):
        buf = np.zeros(4, np.uint8)
        for _ in range(rounds):
            if t.rank == 0:
                t.waitall([t.isend(buf, 1, 7) for _ in range(batch)])
            else:
                t.waitall([t.irecv(np.empty_like(buf), 0, 7) for _ in range(batch)])

    def say(line):
        print(f"progress: {line}", file=sys.stderr, flush=True)

    run = run_simulated(star(2), body, costs=FREE, progress=say, progress_every_s=0.0)
    lines = [l for l in capfd.readouterr().err.splitlines() if l.startswith("progress: ")]
    assert run.messages == count and len(lines) == 1, lines
    assert lines[0].startswith("progress: 4096 messages sent, simulated clock ")
    assert lines[0].endswith("s of wall time")
    run_simulated(star(2), body, costs=FREE)
    assert "messages sent" not in capfd.readouterr().err


def test_a_rows_time_does_not_depend_on_the_rows_asked_for_beside_it(capsys):
    """Each algorithm runs in a simulation of its own, from the same start: dbtree's row is
    the same alone, after the plan's or after ring's (in one shared simulation it moved by
    1-2% on the two sites, with the calls before it)."""
    from horotopo.cli import main
    args = ["simulate", "sites:gpus=4,wan_gbps=10", "--ranks", "32", "--size", "16M",
            "--chunk", "256K", "--json", "--algorithms"]
    got = {}
    for algorithms in ("dbtree", "tree,dbtree", "ring,dbtree"):
        assert main(args + [algorithms]) == 0
        res = json.loads(capsys.readouterr().out)
        rows = {r["algorithm"]: r for r in res["rows"]}
        assert all(r["wrong"] == 0 for r in rows.values())
        # the plan is made for the chunk the run takes, as `horotopo plan --chunk` makes it
        assert res["plan"]["chunk_bytes"] == 256 << 10
        got[algorithms] = rows
    alone = got["dbtree"]["dbtree"]["time_s"]
    assert got["tree,dbtree"]["dbtree"]["time_s"] == alone
    assert got["ring,dbtree"]["dbtree"]["time_s"] == alone
    # each row counts its own simulation's messages; the total adds the init's
    res_rows = got["tree,dbtree"]
    assert res_rows["tree"]["messages"] > 0 and res_rows["dbtree"]["messages"] > 0


def test_simulate_command_takes_a_generated_cluster(capsys):
    from horotopo.cli import main
    assert main(["simulate", "racks:hosts_per_rack=2,gpus=2,oversub=2", "--ranks", "8",
                 "--size", "256K", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ranks"] == 8 and res["topology"] == "racks-8-h2-g2-o2"
    assert [r["wrong"] for r in res["rows"]] == [0, 0, 0, 0]
    assert main(["simulate", "racks:gpus=2", "--size", "1M"]) == 2
    assert "needs --ranks N" in capsys.readouterr().err
    assert main(["simulate", "racks:hosts_per_rack=2,gpus=2", "--ranks", "4", "--size", "64K",
                 "--algorithms", "dbtree,tree", "--json"]) == 0
    assert [r["algorithm"] for r in json.loads(capsys.readouterr().out)["rows"]] == \
        ["tree", "dbtree"]
    with pytest.raises(SystemExit):
        main(["simulate", "racks-2x3", "--algorithms", "tree,nccl"])
    assert "algorithms must be a non-empty subset" in capsys.readouterr().err


def test_simulate_without_software_costs_times_the_network_alone(capsys):
    from horotopo.cli import main
    from horotopo.simulation import DEFAULT_COSTS
    args = ["simulate", "racks:hosts_per_rack=2,gpus=2,oversub=2", "--ranks", "8", "--size",
            "1M", "--algorithms", "tree,ring", "--json"]
    times = {}
    for extra in ([], ["--no-software-costs"]):
        assert main(args + extra) == 0
        res = json.loads(capsys.readouterr().out)
        assert [r["wrong"] for r in res["rows"]] == [0, 0]
        times[bool(extra)] = {r["algorithm"]: r["time_s"] for r in res["rows"]}
        costs = res["software_costs"]
        assert costs == ({"per_message_s": 0.0, "recv_s_per_byte": 0.0} if extra else
                         {"per_message_s": DEFAULT_COSTS.per_message_s,
                          "recv_s_per_byte": DEFAULT_COSTS.recv_s_per_byte})
    # the same plan and messages, less the CPU each rank spends on them
    for alg in ("tree", "ring"):
        assert times[True][alg] < times[False][alg], times


def test_simulate_window_reaches_the_engine_and_is_recorded(capsys):
    """--window replaces every algorithm's automatic window (what-if runs of the engine's
    window): the same plan and messages take another time; below one chunk it is refused."""
    from horotopo.cli import main
    args = ["simulate", "racks:hosts_per_rack=2,gpus=2,oversub=2", "--ranks", "8", "--size",
            "4M", "--algorithms", "tree", "--json"]
    got = {}
    for extra in ([], ["--window", "2"]):
        assert main(args + extra) == 0
        res = json.loads(capsys.readouterr().out)
        assert res["rows"][0]["wrong"] == 0
        got[res["window"]] = (res["rows"][0]["time_s"], res["messages"])
    assert set(got) == {None, 2}
    assert got[None][1] == got[2][1]      # the same messages ...
    assert got[None][0] != got[2][0]      # ... at another pace
    assert main(args + ["--window", "0"]) == 2
    assert "--window 0: needs at least 1 chunk" in capsys.readouterr().err


def test_simgrid_settings_change_the_network_model_and_bad_ones_are_refused(capsys):
    """--simgrid-cfg reaches SimGrid: without LV08's 0.97 bandwidth factor (TCP/IP headers)
    the network alone runs a two-rank allreduce in 0.97 of the time (its latency aside);
    SimGrid's refusal of an unknown key is a usage error naming it, not a traceback."""
    from horotopo.cli import main
    args = ["simulate", "racks:hosts_per_rack=2,gpus=1", "--ranks", "2", "--size", "16M",
            "--algorithms", "tree", "--no-software-costs", "--json"]
    times = {}
    for extra in ([], ["--simgrid-cfg", "network/bandwidth-factor:1.0"]):
        assert main(args + extra) == 0
        res = json.loads(capsys.readouterr().out)
        assert res["simgrid_config"] == extra[1:] and res["rows"][0]["wrong"] == 0
        times[bool(extra)] = res["rows"][0]["time_s"]
    assert times[True] / times[False] == pytest.approx(0.97, abs=0.01), times
    assert main(args + ["--simgrid-cfg", "network/no-such-key:1"]) == 2
    err = capsys.readouterr().err
    assert "SimGrid refused the configuration" in err and "network/no-such-key" in err
    with pytest.raises(SystemExit):
        main(args + ["--simgrid-cfg", "crosstraffic"])  # not NAME:VALUE
    assert "expected NAME:VALUE" in capsys.readouterr().err


def test_the_simulated_probe_recovers_the_declared_network_and_its_plan():
    """`--probe quick` runs horotopo's probe in the simulation: on racks-2x3 (1 gbps NICs, a
    0.25 gbps uplink between two interleaved racks) it finds every pair's rate and the uplink
    the pairs across the racks share, and the plan made from what it measured runs within 5%
    of the declared topology's plan.

    The tolerance: a probed rate is never above the declared one, and at least 85% of it.
    SimGrid's TCP model delivers about 97% of a link's rate (its bandwidth factor), and the
    simulated software costs (DEFAULT_COSTS: 11.34 us per message, 0.47 ns per received byte
    against the 8 ns a byte takes at 1 gbps) take a few percent more.
    """
    from horotopo.cli.simulate_cmd import resolve, simulate
    topo = resolve("racks-2x3")
    probed = simulate(topo, 1 << 20, "quick")
    declared = simulate(topo, 1 << 20, "declared")
    doc = probed["probed_topology"]
    assert probed["probe_simulated_s"] > 0 and doc["ranks"] == list(topo.hosts)
    for i in range(topo.n):
        for j in range(topo.n):
            if i != j:
                ratio = doc["bandwidth_gbps"][i][j] * GBPS_TO_BPS / topo.pair_capacity_Bps(i, j)
                assert 0.85 <= ratio <= 1.0, (i, j, ratio)
    uplink = topo.capacity_Bps[topo.resources.index("tor0->tor1")]
    shared = doc.get("shared", [])
    assert len(shared) == 2  # one per direction, each over the 9 pairs across the racks
    for s in shared:
        assert len(s["pairs"]) == 9
        assert 0.85 <= s["gbps"] * GBPS_TO_BPS / uplink <= 1.0
    times = {res["probe"]: {r["algorithm"]: r for r in res["rows"]}["tree"]
             for res in (probed, declared)}
    assert times["quick"]["wrong"] == times["declared"]["wrong"] == 0
    assert times["quick"]["time_s"] <= 1.05 * times["declared"]["time_s"]


@pytest.mark.parametrize("spec, n, scheme", [("sites:gpus=4,wan_gbps=10", 24, "hosts"),
                                             ("racks:hosts_per_rack=2,gpus=4", 8, None)])
def test_the_simulated_probe_finds_a_generated_clusters_hosts(spec, n, scheme):
    """A generated cluster's GPU ranks hang from their host's switch; in a simulation each
    rank's processor name is that host's, as MPI names a real node's ranks. So the probe works
    by hosts past 16 ranks (one leader per host), and by pairs below with the hosts named in
    what it measured, and the plan of that offers the host forest (with every rank a host of
    its own, the probed plan runs far slower than the declared one)."""
    from horotopo.cli.simulate_cmd import simulate
    from horotopo.generate import generate
    topo = from_dict(generate(spec, n))
    res = simulate(topo, 1 << 20, "quick", algorithms=("tree",))
    doc = res["probed_topology"]
    hosts = sorted(set(doc["ranks"]))
    assert len(hosts) == n // 4 and doc["ranks"] == [h for h in hosts for _ in range(4)]
    assert doc["probe"].get("scheme") == scheme
    assert "hosts" in res["plan"]["planner"]["forest"]
    assert res["rows"][0]["wrong"] == 0


def test_simulate_bounds_the_host_forest_it_plans(capsys):
    from horotopo.cli import main
    args = ["simulate", "sites:gpus=4,hosts_per_rack=2", "--ranks", "32", "--size", "1M",
            "--algorithms", "tree", "--json"]
    assert main(args + ["--max-host-trees", "2"]) == 0
    res = json.loads(capsys.readouterr().out)
    forest = res["plan"]["planner"]["forest"]
    # 8 hosts: 4 and 8 host trees unbounded; the host forest offered has 2
    assert forest["max_host_trees"] == 2 and forest["hosts"]["host_trees"] == 2
    assert res["rows"][0]["wrong"] == 0
    assert main(args + ["--max-host-trees", "0"]) == 2
    assert "--max-host-trees 0: needs at least 1" in capsys.readouterr().err


def test_gap_benchmark_takes_the_simulators_effects_away_one_at_a_time():
    """benchmarks/gap_sim.py: one plan, four settings, every result exact. On this small
    cluster each removal speeds the plan up (the acknowledgements' may not show). Not a law:
    on a large cluster the software costs can pace the sends, and the plan runs slightly
    faster with them than without."""
    rows = benchmark_json("gap_sim.py", "--clusters", "racks:hosts_per_rack=2,gpus=2,oversub=2",
                          "--ranks", "8", "--size", "4M", "--json")["rows"]
    assert [r["setting"] for r in rows] == ["full", "no costs", "no acks", "no headers"]
    assert all(r["wrong"] == 0 and r["optimum_s"] > 0 for r in rows)
    tree = [r["tree_s"] for r in rows]
    assert tree[1] < tree[0] and tree[2] <= tree[1] * (1 + 1e-9) and tree[3] < tree[2], tree
    assert rows[3]["simgrid_config"] == ["network/crosstraffic:0", "network/bandwidth-factor:1"]
    assert len({r["predicted_s"] for r in rows}) == 1  # the same plan throughout


def test_simgrid_floor_benchmark_times_bare_actors():
    """benchmarks/simgrid_floor.py: SimGrid's own cost per message (no horotopo code), per
    batch size; messages rounded down to whole batches."""
    rows = benchmark_json("simgrid_floor.py", "--pairs", "2", "--messages", "18", "--batch",
                          "1,4", "--json")["rows"]
    assert [(r["batch"], r["messages"]) for r in rows] == [(1, 36), (4, 32)]
    assert all(r["wall_s"] > 0 and r["wall_us_per_message"] > 0 for r in rows)
    refused = run_benchmark("simgrid_floor.py", "--batch", "0")
    assert refused.returncode == 2, refused.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity here")
def test_the_simulation_process_is_pinned_to_one_cpu(monkeypatch):
    """SimGrid runs one actor thread at a time: the simulation's child process is pinned to
    one CPU (HOROTOPO_SIM_CPU, default the one it starts on), the caller's process is not;
    -1 leaves the child unpinned, and a CPU outside the allowed set is refused."""
    from horotopo.simulation import SimulationConfigError
    allowed = os.sched_getaffinity(0)

    def body(t):
        return sorted(os.sched_getaffinity(0))

    monkeypatch.delenv("HOROTOPO_SIM_CPU", raising=False)
    [mine, _] = run_simulated(star(2), body).results
    assert len(mine) == 1 and mine[0] in allowed
    assert os.sched_getaffinity(0) == allowed  # the caller keeps its CPUs
    chosen = max(allowed)
    monkeypatch.setenv("HOROTOPO_SIM_CPU", str(chosen))
    assert run_simulated(star(2), body).results[0] == [chosen]
    monkeypatch.setenv("HOROTOPO_SIM_CPU", "-1")
    assert run_simulated(star(2), body).results[0] == sorted(allowed)
    monkeypatch.setenv("HOROTOPO_SIM_CPU", str(max(allowed) + 1000))
    with pytest.raises(SimulationConfigError, match="not one of the CPUs"):
        run_simulated(star(2), body)


def test_one_channel_over_hosts_of_eight_ranks_runs_at_the_nic_rate():
    """Two hosts of 8 ranks behind 10 gbps NICs, the network alone, one rank-level tree of the
    plan over hosts carrying all of it: it runs within 25% of the NIC's rate (a bandwidth
    factor and the pipeline's fill). Its intra-host stage is a chain; a star from each host's
    designated rank ran 2.3x slower here, the network's traffic into that rank crowded off its
    local link by the 7 short local flows."""
    from horotopo.algorithms.simcheck import SMALL_ELEMS, timed_allreduce
    from horotopo.generate import generate
    from horotopo.packing.alphabeta import window_for
    from horotopo.packing.hierarchy import HostModel
    from horotopo.packing.model import TreeRate
    topo = from_dict(generate("racks:hosts_per_rack=4,gpus=8,oversub=4", 16))
    nic = 10 * GBPS_TO_BPS
    tree = HostModel(topo).expand([TreeRate(0, (-1, 0), (-1, 0), nic)])[0]
    size, chunk = 16 << 20, 128 << 10
    plan = plan_from_trees(16, [(tree.root, tree.reduce_parent, tree.bcast_parent, nic)],
                           chunk_bytes=chunk, topology=topo)
    scale = size / (SMALL_ELEMS * 4)
    body = timed_allreduce(plan, "tree", SMALL_ELEMS, max(4, int(chunk / scale) // 4 * 4),
                           window_for(chunk, 1, plan.planner_params))
    run = run_simulated(topo, body, scale=scale, costs=FREE)
    assert sum(r["wrong"] for r in run.results) == 0
    assert max(r["time_s"] for r in run.results) <= 1.25 * size / nic
