"""What lets the simulated transport reach thousands of ranks: the control steps in
``log2 n`` rounds with their bytes passed by reference (binomial-tree broadcast, gather and
allgather, charged their true size), and the plan decoded once per process while every rank
still receives it and checks its digest. Skipped where SimGrid is missing.
"""
import json
import re

import numpy as np
import pytest

from horotopo.transport.simulated import SimulatorMissing, load_simgrid

try:
    load_simgrid()
except SimulatorMissing as _exc:
    pytest.skip(str(_exc), allow_module_level=True)

from horotopo import costs, planning_protocol  # noqa: E402
from horotopo.generate import uniform_star  # noqa: E402
from horotopo.plan import Plan, plan_from_trees  # noqa: E402
from horotopo.schedule import ScheduleCache, compile_allreduce  # noqa: E402
from horotopo.simulation import SimCosts  # noqa: E402
from horotopo.simulation.runner import run_simulated  # noqa: E402
from horotopo.topology import GBPS_TO_BPS, from_dict  # noqa: E402
from horotopo.transport.base import TransportTimeout  # noqa: E402

from bench_scripts import benchmark_json, run_benchmark  # noqa: E402
from engine_cases import random_plan  # noqa: E402

FREE = SimCosts(per_message_s=0.0, recv_s_per_byte=0.0)


def star(n, gbps=1.0):
    return from_dict(uniform_star(n, gbps))


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_broadcast_and_allgather_bytes_reach_every_rank_in_n_minus_1_messages_each(n):
    roots = sorted({0, n // 2, n - 1})

    def body(t):
        out = []
        for root in roots:
            data = f"from {root}".encode() * (root + 1) if t.rank == root else None
            got = t.broadcast_bytes(data, root, 5.0)
            out.append((got, id(got)))
        every = t.allgather_bytes(bytes([t.rank]) * (t.rank % 3), 5.0)
        return out, every

    for root in roots:  # each step alone: n - 1 messages, 2 (n - 1) for the allgather
        def one(t, root=root):
            return t.broadcast_bytes(b"x" if t.rank == root else None, root, 5.0)
        assert run_simulated(star(n), one, costs=FREE).messages == n - 1
    run = run_simulated(star(n), body, costs=FREE)
    assert run.messages == (len(roots) + 2) * (n - 1)
    want_every = [bytes([r]) * (r % 3) for r in range(n)]
    for out, every in run.results:
        assert [got for got, _ in out] == [f"from {r}".encode() * (r + 1) for r in roots]
        assert every == want_every
    # by reference: every rank holds the root's own bytes object, not a copy of its own
    for k in range(len(roots)):
        assert len({res[0][k][1] for res in run.results}) == 1


def test_a_broadcast_is_charged_its_bytes_on_every_hop():
    # 2 MB down a binomial tree over 4 ranks on a 1 gbps star: rank 0 sends to 2 and 1 (its
    # uplink shared by the two), then 2 sends to 3: about three transfer times in all, at
    # LV08's 97% of the link's rate.
    size, rate = 2 << 20, 1.0 * GBPS_TO_BPS

    def body(t):
        got = t.broadcast_bytes(b"\1" * size if t.rank == 0 else None, 0, 60.0)
        return len(got), t.now()

    run = run_simulated(star(4), body, costs=FREE)
    assert all(r[0] == size for r in run.results)
    one = size / (0.97 * rate)
    assert run.clock_s == pytest.approx(3 * one, rel=0.05)


def test_a_broadcast_that_never_comes_times_out_naming_the_parent():
    def body(t):
        if t.rank == 0:
            return None  # the root never broadcasts: ranks 1 and 2 are its children
        try:
            t.broadcast_bytes(None, 0, 2.0, what="the plan")
        except TransportTimeout as exc:
            return str(exc), exc.missing, t.now()
        return "no timeout"

    for what, missing, when in run_simulated(star(3), body, costs=FREE).results[1:]:
        assert what == "the plan: nothing from rank 0 within 2 s (simulated)"
        assert missing == (0,) and when == pytest.approx(2.0)


def test_every_rank_receives_the_plan_checks_its_digest_and_shares_one_decoded_plan(
        monkeypatch):
    n = 6
    plan = random_plan(n, 3, 1 << 20, trees=3)
    topo = star(n)
    decoded = []
    real = Plan.from_json.__func__

    def counting(cls, doc):
        decoded.append(1)
        return real(cls, doc)

    monkeypatch.setattr(Plan, "from_json", classmethod(counting))
    planning_protocol._decode.cache_clear()

    def body(t):
        got, model = planning_protocol.share_plan(t, lambda: (plan, topo), what="init")
        return got.digest, id(got), id(model), len(decoded)

    run = run_simulated(topo, body, costs=FREE)
    assert {r[0] for r in run.results} == {plan.digest}
    assert len({r[1] for r in run.results}) == 1 and len({r[2] for r in run.results}) == 1
    assert {r[3] for r in run.results} == {1}  # one decode in the process, for all six ranks
    # the broadcast (a binomial tree: n - 1 messages) and the digests' allgather (2 (n - 1))
    assert run.messages == 3 * (n - 1)


def test_step_tables_from_shared_tree_shapes_match_a_fresh_compile():
    plan = random_plan(9, 5, 1 << 20, trees=4)
    twin = Plan.from_json(plan.to_json())  # no shapes kept yet
    for rank in range(9):
        cached = ScheduleCache(plan, rank).allreduce(1000, "float32", 37)
        assert cached == compile_allreduce(twin, rank, 1000, "float32", 37)
    chain = plan_from_trees(3, [(0, (-1, 0, 1), (-1, 0, 1), 1.0)])
    assert compile_allreduce(chain, 1, 10, "int32", 4).trees[0].recv_children == (2,)


def test_arrived_messages_are_reported_in_list_order_without_blocking_in_wait_any():
    # Thousands of ranks with hundreds of messages pending each: a completion found by the
    # comm's finish time costs no simcall; only a rank with nothing arrived blocks in wait_any.
    sg = load_simgrid()
    calls = []

    class Comm:
        def __getattr__(self, name):
            return getattr(sg.Comm, name)

        @staticmethod
        def wait_any(comms):
            calls.append(len(comms))
            return sg.Comm.wait_any(comms)

    class Counting:
        def __getattr__(self, name):
            return Comm() if name == "Comm" else getattr(sg, name)

    def body(t):
        buf = np.zeros(3, np.int64)
        if t.rank == 1:
            t.waitall([t.isend(np.full(3, v, np.int64), 0, tag) for v, tag in ((5, 7), (6, 8))])
            sg.this_actor.sleep_for(1.0)
            t.waitall([t.isend(np.full(3, 9, np.int64), 0, 9)])
            return None
        t.sg = Counting()
        a, b = np.zeros(3, np.int64), np.zeros(3, np.int64)
        reqs = [t.irecv(b, 1, 8), t.irecv(a, 1, 7)]
        t.test(reqs[0])  # posts them; both arrive while this rank sleeps
        sg.this_actor.sleep_for(0.5)
        first = t.waitsome(reqs)
        order = [first, reqs[1].done, t.waitsome(reqs[1:])]
        before = len(calls)
        t.waitall([t.irecv(buf, 1, 9)])  # not there yet: this one blocks
        return order, before, len(calls), a.tolist(), b.tolist(), buf.tolist()

    order, before, after, a, b, late = run_simulated(star(2), body, costs=FREE).results[0]
    assert order == [[0], False, [0]]  # the first of the list first, one at a time
    assert (a, b, late) == ([5] * 3, [6] * 3, [9] * 3)
    assert before == 0 and after == 1


def test_simulate_prints_each_algorithms_prediction_beside_its_time_and_marks_horotopos(
        capsys):
    """`horotopo simulate`'s table: per algorithm the simulated and the predicted time and
    their ratio; the algorithm horotopo runs with the plan is starred, and the JSON carries
    every algorithm's prediction and that choice."""
    from horotopo.cli import main
    from horotopo.cli.simulate_cmd import ALGORITHMS
    args = ["simulate", "racks:hosts_per_rack=2,gpus=2", "--ranks", "4", "--size", "64K"]
    assert main(args) == 0
    out = capsys.readouterr().out
    chosen = re.search(r"^horotopo runs (\w+) ", out, flags=re.M).group(1)
    lines = {line.split()[0]: line.split() for line in out.splitlines()
             if line.split() and line.split()[0].rstrip("*") in ALGORITHMS}
    assert sorted(lines) == sorted(a + ("*" if a == chosen else "") for a in ALGORITHMS)
    for _, _, time_us, pred_us, ratio, *_ in lines.values():
        assert float(ratio) == pytest.approx(float(time_us) / float(pred_us), abs=0.01)
    assert main(args + ["--algorithms", "ring", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["chosen"] == chosen and set(res["predicted_s"]) == set(ALGORITHMS)
    assert res["rows"][0]["predicted_s"] == res["predicted_s"]["ring"] > 0
    assert res["plan"]["planner"]["algorithm"] == chosen


def test_scale_table_caches_its_cells_reports_limits_and_writes_its_file(tmp_path, monkeypatch):
    """benchmarks/scale_sim.py: a row per generator, rank count and kind of rank, a cell per
    algorithm with exact results and its prediction; the horotopo column is the chosen
    algorithm's cell. A rerun with the same --cache simulates nothing and gives the same
    table; a cell past --max-wall is a limit, and the same algorithm at the larger rank count
    is not run, each saying so in the results file."""
    cache, md = tmp_path / "cells.json", tmp_path / "scale.md"
    base = ["--generators", "racks:hosts_per_rack=2,gpus=2", "--size", "64K", "--ranks", "4",
            "--predict-on", "declared",
            "--ranks-are", "cpu,gpu", "--chunk", "16K", "--cache", str(cache), "--json"]
    rows = benchmark_json("scale_sim.py", *base)["rows"]
    assert [(r["ranks"], r["costs"]) for r in rows] == [(4, "cpu"), (4, "gpu")]
    for row in rows:
        assert set(row["cells"]) == {"tree", "ring", "dbtree", "hierarchical"}
        assert all(c["wrong"] == 0 and c["chunk_bytes"] == 16 << 10 and c["time_s"] > 0
                   for c in row["cells"].values())
        assert row["chosen"] in row["cells"]
        assert set(row["predicted"]) == set(row["cells"]) and row["predicted"]["ring"] > 0
    again = run_benchmark("scale_sim.py", *base)
    assert again.returncode == 0 and "simulating" not in again.stderr
    assert json.loads(again.stdout)["rows"] == rows
    # cells simulated under other software costs are not this profile's cells
    other = costs.save(costs.DEFAULT_PROFILE.replace(
        device_per_message_s=2 * costs.DEFAULT_PROFILE.device_per_message_s),
        tmp_path / "costs.json")
    monkeypatch.setenv("HOROTOPO_COSTS", str(other))
    recharged = run_benchmark("scale_sim.py", *base)
    assert recharged.returncode == 0, recharged.stderr[-2000:]
    assert re.findall(r" (cpu|gpu) tree at [^:]*: (cached|simulating)$", recharged.stderr,
                      flags=re.M) == [("cpu", "cached"), ("gpu", "simulating")]
    monkeypatch.delenv("HOROTOPO_COSTS")
    limited = run_benchmark("scale_sim.py", "--generators", "fattree", "--size", "64K",
                            "--ranks", "4,8", "--ranks-are", "cpu", "--algorithms", "ring",
                            "--predict-on", "declared",
                            "--max-wall", "1e-6", "--json", "--markdown", str(md))
    assert limited.returncode == 0, limited.stderr[-2000:]
    small, large = json.loads(limited.stdout)["rows"]
    assert "did not finish within" in small["cells"]["ring"]["limit"]
    assert large["cells"]["ring"]["not_run"].startswith("ring at 4 ranks met the limit")
    text = md.read_text()
    assert "## Cells without a simulated time" in text
    assert re.search(r"^\| fattree-4-l8-s4-g1 \| 4 \| cpu \| 1 MiB \| \w+ \| "
                     r"(not asked|limit \(0 s\)) \|", text, flags=re.M)
    assert "fattree-8-l8-s4-g1 (cpu ranks), ring: not run: ring at 4 ranks met the limit" \
        in text


def test_scale_table_refuses_a_foreign_cache_file_in_one_line(tmp_path):
    bad = tmp_path / "cells.json"
    bad.write_text("{not json")
    proc = run_benchmark("scale_sim.py", "--ranks", "4", "--cache", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"scale_sim: --cache {bad}: not a cache this benchmark")
    assert len(proc.stderr.splitlines()) == 1
