"""``horotopo doctor``: the diagnosis of measured documents (pure), its report and picture, and
the command's user errors and output under mpiexec on local ranks."""
from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

import pytest

from horotopo.cli import build_parser
from horotopo.params import PROBE
from horotopo.probe.diagnose import PlanSummary, diagnose, format_ranks, report_lines
from horotopo.probe.hostinfer import host_layout, rank_document
from horotopo.topology import measured_document
from mpi_launch import run_mpi

DATA = Path(__file__).parent / "data"


def _pairs_doc(nics, noise=0.0, seed=0, shared=(), override=None):
    """A measured document of one rank per host ``h<k>``, each pair at the lower of its two
    NICs (times up to ``noise`` either way), with fan figures as the probe writes them."""
    rng = random.Random(seed)
    n = len(nics)
    jitter = lambda: 1.0 + rng.uniform(-noise, noise)  # noqa: E731
    bw = [[None if i == j else min(nics[i], nics[j]) * jitter() for j in range(n)]
          for i in range(n)]
    for (i, j), v in (override or {}).items():
        bw[i][j] = v
    doc = measured_document("synthetic", [f"h{k}" for k in range(n)], bw, shared=list(shared))
    doc["probe"] = {"fan_out_gbps": [v * jitter() for v in nics],
                    "fan_in_gbps": [v * jitter() for v in nics]}
    return doc


def _named(diagnosis):
    return set(diagnosis.named())


def test_a_slow_nic_among_fast_ones_is_named():
    d = diagnose(_pairs_doc([1.0, 1.0, 1.0, 0.25, 1.0, 1.0], noise=0.08))
    assert _named(d) == {("nic out", ("h3",)), ("nic in", ("h3",))}
    slow = [s for s in d.slow if s.kind == "nic out"][0]
    assert slow.gbps == pytest.approx(0.25, rel=0.1)
    assert slow.reference_gbps == pytest.approx(1.0, rel=0.1)
    assert slow.sentence().startswith("host h3 (rank 3): NIC out 0.2")
    assert "below the median of the other hosts 1" in slow.sentence()
    assert d.shared == ()


def test_a_uniform_network_names_nothing():
    d = diagnose(_pairs_doc([1.0] * 8, noise=0.12, seed=3))
    assert d.slow == () and d.shared == ()
    assert all(h.out_gbps == pytest.approx(1.0, rel=0.15) for h in d.hosts)
    text = "\n".join(report_lines(d))
    assert "nothing: every NIC, host pair and shared link is within 1.5x" in text
    assert "none found" in text


def test_the_threshold_is_the_documented_ratio():
    # just inside the ratio: not named; just past it: named
    inside = diagnose(_pairs_doc([1.0, 1.0, 1.0, 1.0 / (PROBE.slow_ratio * 0.95)]))
    assert inside.slow == ()
    past = diagnose(_pairs_doc([1.0, 1.0, 1.0, 1.0 / (PROBE.slow_ratio * 1.05)]))
    assert {kind for kind, _ in past.named()} == {"nic out", "nic in"}


def test_a_nic_is_the_one_the_plan_uses_and_a_contradiction_is_said():
    # a fan-in test that read 0.02 gbps into h2 (a binding ingress cap in the model) while
    # single transfers into it reached 1 gbps
    doc = _pairs_doc([1.0] * 4)
    doc["ingress_gbps"] = [None, None, 0.02, None]
    d = diagnose(doc)
    assert [h.in_gbps for h in d.hosts][2] == 0.02
    assert d.hosts[2].best_in_gbps == pytest.approx(1.0)
    assert _named(d) == {("nic in", ("h2",))}
    assert d.slow[0].seen_gbps == pytest.approx(1.0)
    assert "a single transfer into it reached 1 gbps: the probe's figures disagree" in \
        d.slow[0].sentence()


def test_a_slow_host_pair_is_named_as_a_link():
    d = diagnose(_pairs_doc([1.0] * 5, override={(1, 4): 0.2}))
    assert _named(d) == {("link", ("h1", "h4"))}
    assert d.slow[0].sentence() == ("link h1 -> h4: 0.2 gbps, 5.0x below what its two hosts "
                                    "reach with others 1 gbps")


def _racks_doc(uplink=0.25, nic=1.0, slow_host=None):
    """The probe by hosts' document of two racks of three hosts (two ranks each) behind one
    uplink of ``uplink`` gbps each way; ``slow_host``'s NIC at a quarter of the others'."""
    names = [f"{rack}{k}" for rack in "ab" for k in range(3)]
    layout = host_layout([name for name in names for _ in range(2)])
    nics = [nic / 4 if k == slow_host else nic for k in range(6)]
    host = [[None if a == b else (min(nics[a], nics[b], uplink) if (a < 3) != (b < 3)
                                  else min(nics[a], nics[b])) for b in range(6)]
            for a in range(6)]
    local = [[[None, 50.0], [50.0, None]]] * 6
    lat = [[None if a == b else 0.01 for b in range(6)] for a in range(6)]
    shared = [((0, 1, 2), (3, 4, 5), uplink, "out of hosts 0-2"),
              ((3, 4, 5), (0, 1, 2), uplink, "into hosts 0-2")]
    return rank_document("racks", layout, [[float("nan") if v is None else v for v in row]
                                           for row in host],
                         [[float("nan") if v is None else v for v in row] for row in lat],
                         local, [[[None, 0.001], [0.001, None]]] * 6, shared,
                         {"scheme": "hosts", "mode": "quick", "seconds": 1.0},
                         nic_gbps=(nics, nics))


def test_a_rack_behind_a_slow_uplink_is_a_shared_bottleneck():
    d = diagnose(_racks_doc())
    assert [h.name for h in d.hosts] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert [h.ranks for h in d.hosts][:2] == [(0, 1), (2, 3)]
    # the hosts' own NIC links are NICs, not bottlenecks between hosts
    assert all(h.out_gbps == pytest.approx(1.0) and h.in_gbps == pytest.approx(1.0)
               for h in d.hosts)
    assert len(d.shared) == 2
    behind = sorted(s.behind for s in d.shared)
    assert behind == [("a0", "a1", "a2"), ("b0", "b1", "b2")]
    names = [h.name for h in d.hosts]
    texts = sorted(s.describe(names) for s in d.shared)
    # two racks alike: each link is told by the rack that sends over it
    assert texts == ["out of hosts a0, a1, a2 (ranks 0-5) to the other hosts",
                     "out of hosts b0, b1, b2 (ranks 6-11) to the other hosts"]
    # the uplink is named (both ways); the cross-rack pairs it explains are not
    assert _named(d) == {("shared", ("a0", "a1", "a2")), ("shared", ("b0", "b1", "b2"))}


def test_an_uplink_as_fast_as_a_nic_is_reported_but_not_named_slow():
    d = diagnose(_racks_doc(uplink=0.9))
    assert len(d.shared) == 2 and d.slow == ()


def test_a_slow_nic_behind_an_uplink_names_the_nic_only():
    d = diagnose(_racks_doc(uplink=1.0, slow_host=4))
    assert _named(d) == {("nic out", ("b1",)), ("nic in", ("b1",))}
    assert d.slow[0].what == "host b1 (ranks 8-9)"


def test_a_saved_probe_of_racks_with_slow_nics():
    """The probe by hosts of 128 ranks (32 hosts of 4, 8 racks; 8 NICs at 2.5 gbps against
    10, rack 0 behind a 4.375 gbps uplink against 8.125 or 10): every slow NIC and rack 0's
    uplink are named, and no fast NIC. The probe read 8 pairs of hosts of racks 6 and 7 at a
    quarter of their NICs; the doctor reports them as it measured them."""
    from horotopo.generate import generate

    declared = generate("racks:hosts_per_rack=4,gpus=4,oversub=4,slow=0.25", 128)
    slow_nics = {a for link in declared["links"] for a, b in [link["ends"]]
                 if b.startswith("tor") and link["gbps"] < 10}
    with gzip.open(DATA / "probed-racks-128-slow.json.gz", "rt") as fh:
        d = diagnose(json.load(fh))
    nics = {hosts[0] for kind, hosts in d.named() if kind in ("nic out", "nic in")}
    assert nics == slow_nics and len(nics) == 8
    uplinks = {hosts for kind, hosts in d.named() if kind == "shared"}
    assert uplinks == {("r0h0", "r0h1", "r0h2", "r0h3")}
    assert len(d.shared) == 14  # both ways of 7 racks' uplinks (rack 6's does not bind)
    links = {hosts for kind, hosts in d.named() if kind == "link"}
    assert {h for pair in links for h in pair} == {"r6h0", "r6h1", "r6h2", "r6h3", "r7h3"}


def test_report_and_plan_lines():
    d = diagnose(_pairs_doc([1.0, 1.0, 0.25, 1.0]))
    plan = PlanSummary(trees=2, roots=(0, 1), throughput_Bps=80e6, ring_Bps=40e6,
                       size=128 << 20, size_label="128 MiB", plan_s=1.0, ring_s=2.5,
                       forest="deep")
    lines = report_lines(d, plan, {"mode": "full", "seconds": 4.2})
    assert lines[0] == "horotopo doctor: 4 ranks on 4 hosts, probe full in 4.2 s"
    assert "  h2 (rank 2)  0.25 / 0.25   slow" in lines
    assert lines[-2] == ("plan: 2 trees (roots 0, 1), deep forest, modelled 80.0 MB/s "
                         "(ring 40.0 MB/s)")
    assert lines[-1] == ("  allreduce of 128 MiB predicted 1000.0 ms, ring 2500.0 ms: "
                         "2.50x faster than ring")
    assert plan.to_json()["speedup"] == pytest.approx(2.5)
    slower = PlanSummary(1, (0,), 1.0, 1.0, 1, "1 B", plan_s=2.0, ring_s=1.0)
    assert slower.versus_ring() == "ring is predicted 2.00x faster at this size"
    assert PlanSummary(1, (0,), 1.0, 1.0, 1, "1 B", 1.0, 1.001).versus_ring() == \
        "about as fast as ring"


def test_findings_json_round_trips():
    d = diagnose(_racks_doc(slow_host=1))
    doc = json.loads(json.dumps(d.to_json()))
    assert doc["slow_ratio"] == PROBE.slow_ratio
    assert {s["kind"] for s in doc["slow"]} == {"nic out", "nic in", "shared"}
    assert all(s["sentence"] for s in doc["slow"])
    assert doc["shared"][0]["behind"].startswith("out of hosts a0, a1, a2")


def test_format_ranks():
    assert format_ranks([2]) == "rank 2"
    assert format_ranks([7, 6]) == "ranks 6-7"
    assert format_ranks([0, 2, 4]) == "ranks 0,2,4"
    assert format_ranks(list(range(16)) + [20, 21, 22, 23]) == "ranks 0-15,20-23"


def test_a_declared_topology_is_refused():
    with pytest.raises(ValueError, match="declared topology"):
        diagnose({"name": "x", "ranks": ["a", "b"], "links": []})


def test_the_picture_is_drawn(tmp_path):
    pytest.importorskip("matplotlib", reason="the picture needs matplotlib (plot extra)")
    from horotopo.cli.doctor_cmd import draw_network

    for k, doc in enumerate([_racks_doc(slow_host=2), _pairs_doc([1.0] * 4,
                                                                   override={(0, 1): 0.1})]):
        path = tmp_path / f"net{k}.png"
        draw_network(diagnose(doc), str(path), title="test")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_subcommand_and_its_defaults():
    args = build_parser().parse_args(["doctor"])
    assert (args.json, args.png, args.no_png, args.quick) == ("doctor.json", "doctor.png",
                                                              False, False)


def _doctor(n, *argv, timeout=120):
    return run_mpi(n, [sys.executable, "-m", "horotopo", "doctor", *argv], timeout=timeout)


def test_one_rank_is_a_one_line_error():
    got = _doctor(1, "--json", "/tmp/never-written-doctor.json")
    assert got.returncode == 2, got.stdout
    lines = [ln for ln in got.stdout.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("horotopo doctor: error: needs at "
                                                       "least 2 ranks")


@pytest.mark.parametrize("argv, words", [
    (["--json", "/nonexistent-folder/d.json"], "--json /nonexistent-folder/d.json: the folder"),
    (["--png", "/nonexistent-folder/d.png"], "--png /nonexistent-folder/d.png: the folder"),
    (["--json", "/"], "--json /: is a folder"),
    (["--size", "0"], "--size must be positive"),
    (["--max-bytes", "lots"], "cannot read size 'lots'"),
    (["--timeout", "-3"], "--timeout must be a positive number")])
def test_rank_0_names_the_problem(argv, words):
    from horotopo.cli.doctor_cmd import _check

    problem, _ = _check(build_parser().parse_args(["doctor", *argv]), 4)
    assert problem is not None and words in problem and "\n" not in problem


def test_good_arguments_pass_with_the_probe_settings(tmp_path):
    from horotopo.cli.doctor_cmd import _check

    args = build_parser().parse_args(["doctor", "--json", str(tmp_path / "d.json"), "--no-png",
                                      "--max-bytes", "1M", "--size", "64M"])
    assert _check(args, 4) == (None, {"max_bytes": 1 << 20, "start_bytes": 64 << 10,
                                      "min_bytes": 4 << 10, "size": 64 << 20})


def test_a_user_error_is_one_line_on_rank_0_and_stops_every_rank():
    got = _doctor(2, "--json", "/nonexistent-folder/d.json")
    assert got.returncode == 2, got.stdout
    lines = [ln for ln in got.stdout.splitlines() if ln.strip()]
    assert lines == ["horotopo doctor: error: --json /nonexistent-folder/d.json: the folder "
                     "'/nonexistent-folder' does not exist"], got.stdout


def test_doctor_on_local_ranks_writes_its_files(tmp_path):
    out, png = tmp_path / "d.json", tmp_path / "d.png"
    got = _doctor(3, "--quick", "-q", "--max-bytes", "128K", "--timeout", "60",
                  "--json", str(out), "--png", str(png))
    assert got.returncode == 0, got.stdout
    assert got.stdout.count("horotopo doctor: 3 ranks on 1 host") == 1, got.stdout
    assert f"wrote {out}, {png}" in got.stdout
    report = json.loads(out.read_text())
    assert set(report) == {"findings", "plan", "measured"}
    assert report["measured"]["ranks"] == [h for h in report["measured"]["ranks"]]
    assert len(report["measured"]["ranks"]) == 3
    assert report["plan"]["trees"] == len(report["plan"]["plan"]["trees"]) >= 1
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_rank_0_report_of_a_probe_by_hosts(tmp_path, capsys):
    """Rank 0's half on a saved probe by hosts (24 ranks, 4 per host, two sites): the printed
    plan line quotes the planner's own prediction against ring."""
    from horotopo.cli.doctor_cmd import report
    from horotopo.plan import make_plan
    from horotopo.topology import from_dict

    with gzip.open(DATA / "probed-sites-24-g4.json.gz", "rt") as fh:
        doc = json.load(fh)
    size = 64 << 20
    assert report(doc, size, json_path=str(tmp_path / "d.json"), png_path=None) == 0
    printed = capsys.readouterr().out
    saved = json.loads((tmp_path / "d.json").read_text())
    assert saved["measured"] == doc
    plan = make_plan(from_dict(doc), size=size)
    assert saved["plan"]["speedup"] == pytest.approx(plan.ring_speedup(size))
    assert saved["plan"]["trees"] == len(plan.trees)
    assert f"{plan.ring_speedup(size):.2f}x faster than ring" in printed
    assert "horotopo doctor: 24 ranks on 6 hosts, probe quick" in printed
    assert "out of hosts a-r0h0, a-r0h1, a-r0h2 (ranks 0-11) to the other hosts" in printed
