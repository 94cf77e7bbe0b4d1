"""The cost profile: its JSON, its refusals, what it charges each kind of rank, and that the
planner's model, the simulator and init() all read the one active profile."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from horotopo import costs
from horotopo.bootstrap import SettingsError, setup
from horotopo.packing import alphabeta as ab
from horotopo.plan import make_plan
from horotopo.topology import load
from horotopo.simulation.support import SimCosts

from loop_transport import run_ranks

MEASURED = costs.DEFAULT_PROFILE.replace(cpu_per_message_s=3e-6, cpu_per_byte_s=0.2e-9,
                                         cpu_per_message_s_source="a test",
                                         cpu_per_byte_s_source="a test", machine="test box")


@pytest.fixture(autouse=True)
def restore_active_profile():
    before = costs.active()
    yield
    costs.activate(*before)


def test_the_built_in_device_figures_name_the_results_they_come_from():
    root = Path(__file__).resolve().parents[1]
    for name in ("device_reduce_Bps", "device_per_message_s", "staging_copy_Bps",
                 "staging_copy_s"):
        folders = re.findall(r"docs/results/[\w.-]+/", costs.DEFAULT_PROFILE.sources[name])
        assert folders and all((root / f).is_dir() for f in folders), name


def test_profile_round_trips_through_json_with_its_sources():
    doc = json.loads(json.dumps(MEASURED.to_json()))
    back = costs.CostProfile.from_json(doc)
    assert back == MEASURED
    assert back.sources == MEASURED.sources and back.machine == "test box"
    assert back.sources["cpu_per_message_s"] == "a test"
    assert back.sources["device_reduce_Bps"] == costs.DEFAULT_PROFILE.sources["device_reduce_Bps"]
    text = back.describe()
    assert all(name in text for name, _ in costs.FIGURES) and "3.00 us" in text


@pytest.mark.parametrize("bad", [0.0, -1e-6, math.nan, math.inf, "fast", True])
def test_a_figure_that_is_not_positive_is_refused_in_one_line(bad):
    with pytest.raises(costs.CostsError) as err:
        MEASURED.replace(cpu_per_byte_s=bad)
    assert "cpu_per_byte_s" in str(err.value) and "\n" not in str(err.value)
    doc = MEASURED.to_json()
    doc["figures"]["staging_copy_Bps"]["value"] = bad
    with pytest.raises(costs.CostsError, match="staging_copy_Bps"):
        costs.CostProfile.from_json(doc)


def test_a_file_that_is_not_a_profile_names_itself(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text('{"format": "something else"}')
    with pytest.raises(costs.CostsError, match=f"{path}: not a cost profile"):
        costs.load(path)
    doc = MEASURED.to_json()
    del doc["figures"]["device_reduce_Bps"]
    path.write_text(json.dumps(doc))
    with pytest.raises(costs.CostsError, match="lacks device_reduce_Bps"):
        costs.load(path)
    with pytest.raises(costs.CostsError, match="cannot read"):
        costs.load(tmp_path / "missing.json")


def test_gpu_ranks_are_charged_the_kernel_rate_and_staging_only_without_cuda_aware_mpi():
    p = MEASURED
    assert p.charges("cpu") == (p.cpu_per_message_s, p.cpu_per_byte_s)
    aware = p.charges("gpu", cuda_aware=True)
    staged = p.charges("gpu", cuda_aware=False)
    assert aware == (p.device_per_message_s, 1 / p.device_reduce_Bps)
    assert staged[0] == pytest.approx(aware[0] + p.staging_copy_s)
    assert staged[1] == pytest.approx(aware[1] + 2 / p.staging_copy_Bps)
    assert aware[1] < p.cpu_per_byte_s
    with pytest.raises(costs.CostsError, match="ranks are one of cpu, gpu"):
        p.charges("tpu")


def test_the_planner_and_the_simulator_read_the_active_profile():
    plan = make_plan(load("racks-2x3"), size=16 << 20)
    default_time = plan.predict_time(16 << 20)
    assert (ab.ENGINE_COSTS.per_message_s, ab.ENGINE_COSTS.per_byte_s) == \
        costs.DEFAULT_PROFILE.charges("cpu")
    with costs.charging(MEASURED, "gpu", cuda_aware=False):
        charged = MEASURED.charges("gpu", cuda_aware=False)
        assert (ab.ENGINE_COSTS.per_message_s, ab.ENGINE_COSTS.per_byte_s) == charged
        assert SimCosts.active() == SimCosts(*charged)
        assert plan.predict_time(16 << 20) == pytest.approx(
            plan.predict_time(16 << 20, costs=ab.SoftwareCosts(*charged)))
        assert plan.predict_time(16 << 20) != default_time
    assert costs.charges() == costs.DEFAULT_PROFILE.charges("cpu")
    assert plan.predict_time(16 << 20) == default_time


def test_settings_name_the_file_or_fall_back_to_the_built_in_profile(tmp_path, monkeypatch):
    monkeypatch.setattr(costs, "default_path", lambda: tmp_path / "absent.json")
    profile, source = costs.from_settings({})
    assert profile is costs.DEFAULT_PROFILE and "built-in" in source
    path = costs.save(MEASURED, tmp_path / "sub" / "costs.json")
    assert costs.from_settings({"HOROTOPO_COSTS": str(path)}) == \
        (MEASURED, f"HOROTOPO_COSTS={path}")
    monkeypatch.setattr(costs, "default_path", lambda: path)
    assert costs.from_settings({})[0] == MEASURED
    with pytest.raises(costs.CostsError, match="HOROTOPO_COSTS=.*missing.json: cannot read"):
        costs.from_settings({"HOROTOPO_COSTS": str(tmp_path / "missing.json")})


def test_init_plans_with_rank_0s_profile_on_every_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(costs, "default_path", lambda: tmp_path / "absent.json")
    # costs high enough that the planner picks another chunk than with the built-in profile
    slow = MEASURED.replace(cpu_per_message_s=500e-6, cpu_per_byte_s=5e-9)
    path = costs.save(slow, tmp_path / "costs.json")
    env = {"HOROTOPO_TOPOLOGY": "racks-2x3", "HOROTOPO_COSTS": str(path)}
    got = run_ranks(6, lambda t: (setup(t, env=env).plan.digest, costs.active()))
    assert {digest for digest, _ in got} == {got[0][0]}
    assert all(active == (slow, "cpu", True) for _, active in got)
    assert make_plan(load("racks-2x3")).digest == got[0][0]  # init left it active
    with costs.charging(costs.DEFAULT_PROFILE):
        assert make_plan(load("racks-2x3")).digest != got[0][0]


def test_init_refuses_a_bad_profile_file_on_every_rank(tmp_path):
    path = tmp_path / "costs.json"
    doc = MEASURED.to_json()
    doc["figures"]["cpu_per_message_s"]["value"] = 0
    path.write_text(json.dumps(doc))
    env = {"HOROTOPO_TOPOLOGY": "racks-2x3", "HOROTOPO_COSTS": str(path)}

    def attempt(t):
        try:
            setup(t, env=env)
        except SettingsError as exc:
            return str(exc)
        return None

    got = run_ranks(3, attempt)
    assert all(msg and "HOROTOPO_COSTS=" in msg and "cpu_per_message_s" in msg for msg in got)
