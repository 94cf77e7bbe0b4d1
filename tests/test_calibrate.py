"""horotopo calibrate: it measures with the engine's own runner, writes a profile that simulate
and init read, and refuses figures that are not positive; simulate --ranks-are gpu charges the
device path."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from horotopo import costs
from horotopo.cli import calibrate_cmd, main
from horotopo.cli.simulate_cmd import resolve, simulate
from horotopo.params import ENGINE
from horotopo.simulation.support import SimulatorMissing, load_simgrid

ROOT = Path(__file__).resolve().parents[1]
# A small cluster whose links are fast enough that the ranks' reduce work, not the network,
# sets the time of an allreduce.
FAST = "racks:hosts_per_rack=2,gpus=2,nic_gbps=400,local_gbps=2000"


def _simgrid() -> None:
    try:
        load_simgrid()
    except SimulatorMissing as exc:
        pytest.skip(f"the simulator is not installed: {exc}")


@pytest.fixture(autouse=True)
def restore_active_profile():
    before = costs.active()
    yield
    costs.activate(*before)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    """The profile ``horotopo calibrate -o`` writes, run as a user runs it."""
    path = tmp_path_factory.mktemp("calibrate") / "costs.json"
    done = subprocess.run([sys.executable, "-m", "horotopo", "calibrate", "-o", str(path),
                           "--repeats", "3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[calibrate] chunk" in done.stderr and f"wrote {path}" in done.stderr
    return path


def test_calibrate_writes_a_profile_of_this_machine(calibrated):
    profile = costs.load(calibrated)
    for name in ("cpu_per_message_s", "cpu_per_byte_s"):
        assert profile.sources[name].startswith("horotopo calibrate on ")
    # the engine's Python per message is microseconds, its reduce or copy a fraction of a
    # nanosecond per byte, on any machine this runs on
    assert 0.1e-6 < profile.cpu_per_message_s < 1e-3
    assert 1e-12 < profile.cpu_per_byte_s < 1e-8
    assert profile.device_per_message_s == profile.cpu_per_message_s
    assert profile.device_reduce_Bps == costs.DEFAULT_PROFILE.device_reduce_Bps


def test_the_engine_runner_is_what_is_measured():
    rows = calibrate_cmd.measure(calibrate_cmd.MirrorPeer(), repeats=1,
                                 chunks=(1024, 1 << 20))
    small, large = rows
    # ring chains of two ranks: a rank receives each chunk of its half to reduce and each of
    # the other half as the result, and sends as many
    assert small["messages"] == ENGINE.cost_row_messages > large["messages"] > 0
    assert small["received_bytes"] == small["messages"] // 2 * 1024
    assert all(r["cpu_s"] > 0 for r in rows)


def test_fit_recovers_the_costs_that_made_the_rows():
    rows = [{"messages": m, "received_bytes": b, "cpu_s": m * 7e-6 + b * 0.3e-9}
            for m, b in ((512, 1 << 17), (512, 1 << 24), (32, 1 << 24), (128, 1 << 20))]
    per_message, per_byte = calibrate_cmd.fit_costs(rows)
    assert per_message == pytest.approx(7e-6) and per_byte == pytest.approx(0.3e-9)


class _OneRank:
    size = 1

    @classmethod
    def world(cls):
        return cls()

    def close(self):
        pass


@pytest.mark.parametrize("figures, word", [((0.0, 0.3e-9), "per-message"),
                                           ((5e-6, -1e-12), "per-byte")])
def test_a_figure_that_is_not_positive_is_refused(figures, word, tmp_path, monkeypatch,
                                                  capsys):
    import horotopo.transport

    monkeypatch.setattr(horotopo.transport, "MPITransport", _OneRank, raising=False)
    monkeypatch.setattr(calibrate_cmd, "measure", lambda *a, **k: [])
    monkeypatch.setattr(calibrate_cmd, "fit_costs", lambda rows: figures)
    out = tmp_path / "costs.json"
    assert main(["calibrate", "-o", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines()
             if not line.startswith("[calibrate] ")]  # progress
    assert len(lines) == 1 and lines[0].startswith("horotopo calibrate: error: the measured")
    assert word in lines[0] and "not positive" in lines[0]
    assert not out.exists()


def test_simulate_charges_and_plans_with_the_calibrated_file(calibrated, monkeypatch, capsys):
    _simgrid()
    monkeypatch.setenv("HOROTOPO_COSTS", str(calibrated))
    profile = costs.load(calibrated)
    assert main(["simulate", FAST, "--ranks", "4", "--size", "1M", "--algorithms", "tree",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["software_costs"] == {"per_message_s": profile.cpu_per_message_s,
                                     "recv_s_per_byte": profile.cpu_per_byte_s}
    assert res["cost_profile"]["source"] == f"HOROTOPO_COSTS={calibrated}"
    assert costs.CostProfile.from_json(res["cost_profile"]["profile"]) == profile
    assert res["rows"][0]["wrong"] == 0


def test_gpu_ranks_take_less_time_on_a_reduction_heavy_case_and_staging_adds_to_it():
    _simgrid()
    topology = resolve(FAST, 4)
    runs = {}
    for kind, aware in (("cpu", True), ("gpu", True), ("gpu", False)):
        res = simulate(topology, 4 << 20, algorithms=("tree",), ranks_are=kind,
                       cuda_aware=aware, profile=costs.DEFAULT_PROFILE)
        runs[kind, aware] = res
        assert res["rows"][0]["wrong"] == 0
        charged = costs.DEFAULT_PROFILE.charges(kind, aware)
        assert (res["software_costs"]["per_message_s"],
                res["software_costs"]["recv_s_per_byte"]) == charged
    time = {key: res["rows"][0]["time_s"] for key, res in runs.items()}
    predicted = {key: res["rows"][0]["predicted_s"] for key, res in runs.items()}
    assert time["gpu", True] < time["gpu", False] < time["cpu", True], time
    # the planner's prediction charges the same figures
    assert predicted["gpu", True] < predicted["gpu", False] < predicted["cpu", True], predicted


def test_under_mpiexec_the_ranks_measure_their_exchange_over_mpi(tmp_path):
    from mpi_launch import mpiexec_path, run_mpi

    if mpiexec_path() is None:
        pytest.skip("no mpiexec next to the interpreter or on PATH")
    path = tmp_path / "costs.json"
    done = run_mpi(2, [sys.executable, "-m", "horotopo", "calibrate", "-o", str(path),
                       "--repeats", "2"], timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert done.stdout.count(f"wrote {path}") == 1  # rank 0 alone writes and says so
    profile = costs.load(path)
    assert "2 ranks over MPI" in profile.sources["cpu_per_message_s"]
    assert 0.1e-6 < profile.cpu_per_message_s < 1e-3 and 1e-12 < profile.cpu_per_byte_s < 1e-8


def test_show_prints_the_profile_init_would_use(calibrated, monkeypatch, capsys):
    monkeypatch.setenv("HOROTOPO_COSTS", str(calibrated))
    assert main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"from HOROTOPO_COSTS={calibrated}\n")
    assert "cpu_per_message_s" in out and "horotopo calibrate on" in out
    monkeypatch.setenv("HOROTOPO_COSTS", str(calibrated.parent / "missing.json"))
    assert main(["calibrate", "--show"]) == 2
    assert "HOROTOPO_COSTS=" in capsys.readouterr().err
