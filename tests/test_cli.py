"""The command line says what it means: user errors in one line with exit status 2, arcs in the
direction data flows, one ratio to ring, and plurals that agree with their counts."""
import json
import re
import subprocess
import sys

import pytest

from horotopo.cli import main
from horotopo.plan import Plan


def _error_line(capsys):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["plan", "racks-2x3", "--size", "0"], "horotopo plan: error: --size must be positive, got 0"),
    (["plan", "racks-2x3", "--size", "-5"], "horotopo plan: error: --size must be positive, got -5"),
    (["plan", "racks-2x3", "--size", "0.1"], "horotopo plan: error: --size must be positive"),
    (["plan", "racks-2x3", "--size", "12Q"], "horotopo plan: error: --size '12Q' is not a size"),
    (["plan", "racks-2x3", "--size", "nan"], "horotopo plan: error: --size 'nan' is not a size"),
    (["plan", "racks-2x3", "--size", "1e999"], "horotopo plan: error: --size '1e999' is not a "),
    (["plan", "racks-2x3", "--chunk", "0"], "horotopo plan: error: --chunk must be positive"),
    (["plan", "racks-2x3", "--forest", "tall"], "horotopo plan: error: --forest invalid choice"),
    (["plan"], "horotopo plan: error: the following arguments are required: topology"),
    (["simulate", "racks-2x3", "--size", "0"], "horotopo simulate: error: --size must be "
                                               "positive"),
])
def test_argument_errors_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert _error_line(capsys).startswith(message)


def test_user_errors_are_one_line_with_status_2(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text('{"links": [')
    cases = [
        (["plan", "racks-2x3", "--png", str(tmp_path / "no" / "t.png")],
         f"--png {tmp_path}/no/t.png: the folder '{tmp_path}/no' does not exist"),
        (["plan", "racks-2x3", "-o", str(tmp_path / "no" / "p.json")],
         f"-o {tmp_path}/no/p.json: the folder '{tmp_path}/no' does not exist"),
        (["plan", "racks-2x3", "-o", str(tmp_path)], "is a folder; give a file name"),
        (["plan", "racks-9x9"], "'racks-9x9' is neither a topology file nor a bundled topology; "
                                "bundled: racks-2x3, slow-nic, uniform-4"),
        (["plan", str(tmp_path / "gone.json")], "cannot read: no such file"),
        (["plan", str(bad)], f"topology file {bad}: not valid JSON"),
        (["plan", "racks-2x3", "--forest", "hosts"], "--forest: forest 'hosts' needs machines that hold "
                                                     "several ranks"),
        (["simulate", "nope"], "'nope' is neither a topology file nor a bundled topology"),
        (["simulate", "racks-2x3", "--plan", str(bad)], f"--plan {bad}: not valid JSON"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        line = _error_line(capsys)
        assert line.startswith(f"horotopo {argv[0]}: error: ") and message in line, line
    # a bad setting read while planning is the user's too
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "lots")
    assert main(["plan", "racks-2x3", "-q"]) == 2
    assert "HOROVOD_FUSION_THRESHOLD" in _error_line(capsys)


def test_a_bug_keeps_its_traceback(monkeypatch):
    import horotopo.cli.plan_cmd as plan_cmd

    def broken(*args, **kwargs):
        raise RuntimeError("a planner bug")

    monkeypatch.setattr(plan_cmd, "make_plan", broken)
    with pytest.raises(RuntimeError, match="a planner bug"):
        main(["plan", "racks-2x3", "-q"])


def test_the_entry_point_exits_2_in_one_line():
    out = subprocess.run([sys.executable, "-m", "horotopo", "plan", "racks-2x3", "--size", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr == ("horotopo plan: error: --size must be positive, got 0 "
                          "(see horotopo plan --help)\n")


@pytest.fixture(scope="module")
def racks_plan(tmp_path_factory):
    """``horotopo plan slow-nic --size 4M`` as text, and the same plan as JSON."""
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    text = subprocess.run([sys.executable, "-m", "horotopo", "plan", "slow-nic", "--size", "4M",
                           "-q", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    return text.stdout, Plan.from_json(json.loads(out.read_text()))


def _tree_lines(text):
    """``{tree: (root, reduce arcs, bcast arcs)}`` from the plan's text."""
    trees, current = {}, None
    for line in text.splitlines():
        head = re.match(r"\s+tree (\d+)\s+root (\d+)", line)
        if head:
            current = int(head.group(1))
            trees[current] = [int(head.group(2)), [], []]
        arcs = re.match(r"\s+(reduce|bcast)\s+(.*)", line)
        if arcs and current is not None:
            pairs = [tuple(map(int, a.split("->"))) for a in arcs.group(2).split()]
            trees[current][1 if arcs.group(1) == "reduce" else 2] = pairs
    return trees


def test_arcs_are_printed_in_the_direction_data_flows(racks_plan):
    text, plan = racks_plan
    trees = _tree_lines(text)
    assert len(trees) == len(plan.trees) >= 1
    for k, (root, reduce, bcast) in trees.items():
        tree = plan.trees[k]
        assert root == tree.root
        # reduce: child -> parent; broadcast: parent -> child, the root's arcs first
        assert sorted(reduce) == sorted((v, p) for v, p in enumerate(tree.reduce_parent) if p >= 0)
        assert sorted(bcast) == sorted((p, v) for v, p in enumerate(tree.bcast_parent) if p >= 0)
        assert bcast[0][0] == root and reduce[-1][1] == root
        reached = {root}
        for parent, child in bcast:  # each broadcast arc leaves a rank that has the data
            assert parent in reached
            reached.add(child)


def test_one_ratio_to_ring_that_agrees_with_the_times(racks_plan):
    text, plan = racks_plan
    assert len(re.findall(r"\d\.\d\dx", text)) == 1, text
    times = re.search(r"predicted allreduce of 4 MiB: ([\d.]+) ms by \w+ \(ring ([\d.]+) ms\)",
                      text)
    verdict = re.search(r"verdict: ([\d.]+)x faster than ring|slower than ring \(([\d.]+)x",
                        text)
    assert times and verdict, text
    ratio = float(verdict.group(1) or verdict.group(2))
    t_plan, t_ring = float(times.group(1)), float(times.group(2))
    assert ratio == pytest.approx(t_ring / t_plan, abs=0.01)
    predicted = plan.planner["predicted_s"]
    assert ratio == pytest.approx(predicted["ring"] / predicted[plan.planner["algorithm"]],
                                  abs=0.01)


def test_counts_and_nouns_agree(capsys):
    assert main(["plan", "racks-2x3", "-q", "--size", "1M", "--forest", "deep"]) == 0
    text = capsys.readouterr().out
    assert ", 1 tree," in text
    assert not re.search(r"\b1 (trees|hops)\b", text), text
    assert not re.search(r"\b(0|[2-9]|\d\d+) (tree|hop)\b", text), text


def test_plan_help_points_inside_the_repository(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "docs/topology.md" in out and "DESIGN" not in out and "../" not in out


def test_probe_refuses_a_missing_folder_on_every_rank_at_once(tmp_path):
    from mpi_launch import mpiexec_path, run_mpi

    if mpiexec_path() is None:
        pytest.skip("no mpiexec next to the interpreter or on PATH")
    out = run_mpi(2, [sys.executable, "-m", "horotopo", "probe", "--quick", "-o",
                      str(tmp_path / "no" / "t.json")], timeout=120)
    # rank 0's verdict stops both ranks before the probe, and the job says it once
    assert out.returncode == 2, out.stdout
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert lines == [f"horotopo probe: error: -o {tmp_path}/no/t.json: the folder "
                     f"'{tmp_path}/no' does not exist"], out.stdout
