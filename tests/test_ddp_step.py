"""benchmarks/ddp_step.py: its command line and table, and a tiny run on an emulated cluster.

The tiny run (a 2-layer MLP of 16 units, one step per variant, two emulated hosts) goes
through everything the real one does (namespaces, MPI across them, torch's store and gloo on
the emulated network, the three DDP variants, the parameter check); it needs root and ip
netns, and says so when skipped.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench_scripts import run_benchmark

pytest.importorskip("torch", reason="the benchmark trains with torch (the [torch] extra)")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "ddp_step.py"
VARIANTS = ["gloo", "horotopo", "gloo+hook"]


def test_help_explains_the_variants_and_the_arguments():
    out = run_benchmark("ddp_step.py", "--help", timeout_s=60)
    assert out.returncode == 0, out.stderr
    for word in ("gloo+hook", "allreduce_hook", "images/s", "--hidden", "--rounds", "--local",
                 "--json", "racks-2x3", "needs root"):
        assert word in out.stdout, word
    bad = run_benchmark("ddp_step.py", "--steps", "0", timeout_s=60)
    assert bad.returncode == 2 and "--steps must be at least 1, got 0" in bad.stderr, bad.stderr


def test_the_table_has_a_row_per_variant_with_its_ratio():
    # plain local ranks and a tiny MLP: the table of a real run, without root
    from horotopo_launch.mpi import find_mpiexec
    if find_mpiexec() is None:
        pytest.skip("no mpiexec installed next to the interpreter or on PATH")
    out = run_benchmark("ddp_step.py", "--local", "-np", "2", "--hidden", "16", "--layers", "2",
                        "--batch", "4", "--rounds", "1", "--steps", "1", timeout_s=300)
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout.strip().splitlines()
    assert "2 ranks, plain local ranks" in table[0] and "1 rounds x 1 steps" in table[0]
    assert table[1].split()[1:3] == ["variant", "process"]
    rows = [line.split() for line in table[2:]]
    assert [row[0] for row in rows] == VARIANTS
    gloo_rate = float(rows[0][-4])
    for row in rows:
        rate, ratio, diff = float(row[-4]), row[-2], float(row[-1])
        # images/s is printed to 0.1 and the ratio to 0.01: compare within both roundings
        assert rate > 0 and ratio.endswith("x"), row
        assert float(ratio[:-1]) == pytest.approx(rate / gloo_rate, abs=0.006), row
        assert diff <= 1e-3, row
    assert rows[0][-2] == "1.00x"


PAIR = {"name": "pair", "switches": ["sw"],
        "links": [{"ends": ["a", "sw"], "gbps": 1.0}, {"ends": ["b", "sw"], "gbps": 0.25}],
        "ranks": ["a", "b"]}


@pytest.mark.netns
def test_a_tiny_run_on_an_emulated_cluster(tmp_path):
    # two hosts rather than racks-2x3's six: the same code path at a third of the start-up
    sys.path.insert(0, str(ROOT))
    from launch.emulate import available

    ok, why = available()
    if not ok:
        pytest.skip(f"the emulated cluster is not available here: {why}")
    topology = tmp_path / "pair.json"
    topology.write_text(json.dumps(PAIR))
    out = subprocess.run([sys.executable, str(SCRIPT), str(topology), "--hidden", "16",
                          "--layers", "2", "--batch", "4", "--rounds", "1", "--steps", "1",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["ranks"] == 2 and doc["where"] == "emulated pair"
    assert [r["variant"] for r in doc["rows"]] == ["gloo", "horotopo", "gloo+hook"]
    for row in doc["rows"]:
        assert row["steps"] == 1 and row["images_per_s"] > 0
        assert row["max_param_diff_vs_gloo"] <= 1e-5, row
