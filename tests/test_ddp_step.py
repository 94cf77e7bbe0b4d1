"""benchmarks/ddp_step.py: its command line and table, and a tiny run on an emulated cluster.

The tiny run (a 2-layer MLP of 16 units, one step per variant, two emulated hosts) goes
through everything the real one does (namespaces, MPI across them, torch's store and gloo on
the emulated network, the three DDP variants, the parameter check); it needs root and ip
netns, and says so when skipped.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the benchmark trains with torch (the [torch] extra)")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "ddp_step.py"


def _bench():
    spec = importlib.util.spec_from_file_location("ddp_step", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_explains_the_variants_and_the_arguments():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for word in ("gloo+hook", "allreduce_hook", "images/s", "--hidden", "--rounds", "--local",
                 "--json", "racks-2x3", "needs root"):
        assert word in out.stdout, word
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])


def test_the_table_has_a_row_per_variant_with_its_ratio():
    bench = _bench()
    rows = [{"variant": v, "process_group": bench.WHAT[v][0], "reducer": bench.WHAT[v][1],
             "images_per_s": rate, "step_ms_median": 64000 / rate,
             "ratio_vs_gloo": rate / 100.0, "max_param_diff_vs_gloo": 0.0}
            for v, rate in zip(bench.VARIANTS, (100.0, 250.0, 180.0))]
    doc = {"ranks": 6, "params": 4206602, "gradient_bytes": 16826408, "batch_per_rank": 32,
           "rounds": 3, "steps_per_round": 2, "rows": rows}
    table = bench.report(doc, "emulated racks-2x3").splitlines()
    assert "6 ranks, emulated racks-2x3" in table[0] and "4.21M parameters" in table[0]
    assert [line.split()[0] for line in table[2:]] == list(bench.VARIANTS)
    assert table[3].split()[-2:] == ["2.50x", "0.0e+00"]
    assert table[4].split()[-2:] == ["1.80x", "0.0e+00"]


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
