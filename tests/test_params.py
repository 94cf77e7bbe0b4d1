"""The parameter objects (horotopo.params): every tuning number of the engine, the adaptivity
and the probe lives in one of them, documented once, and the environment overrides the fields
that horotopo.config declares."""
from __future__ import annotations

import ast
import dataclasses
import pathlib
from typing import Dict, List

import pytest

from horotopo import config, params
from horotopo.adapt.policy import Detector
from horotopo.adapt.runtime import RUNTIME_DEFAULTS
from horotopo.adapt.trial import Trial
from horotopo.schedule import in_flight_for

ROOT = pathlib.Path(__file__).resolve().parent.parent / "horotopo"

#: The modules whose tuning numbers live in the parameter objects. probe/hostinfer.py,
#: probe/hosts.py and probe/flows.py, the packing and the cost model keep their own still.
CONVERTED = (["engine.py", "algorithms/tree.py", "buffers.py", "schedule.py"]
             + sorted(f"adapt/{p.name}" for p in (ROOT / "adapt").glob("*.py"))
             + sorted(f"probe/{p.name}" for p in (ROOT / "probe").glob("*.py")
                      if p.name not in ("hostinfer.py", "hosts.py", "flows.py")))

#: Module-level numbers of the converted modules that tune nothing, each with the reason.
TRUE_CONSTANTS: Dict[str, str] = {
    "schedule.py:SCHEDULE_VERSION": "the step table's JSON format version",
    "buffers.py:_INFINITY_BITS": "IEEE 754 bit patterns of each float width's infinity",
    "probe/group.py:TAG_BLOCK": "tags a probe test allocates per block: a protocol size that "
                                "every rank must agree on, not a trade-off",
    "probe/config.py:MODES": "the presets of ProbeConfig, the probe's effort object: named "
                             "instances of a parameter object, each field documented there",
}


def _has_number(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float))
               and not isinstance(n.value, bool) for n in ast.walk(node))


def module_numbers(source: str) -> List[str]:
    """Names bound at module level to an expression holding a number literal."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and _has_number(node.value):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif (isinstance(node, ast.AnnAssign) and node.value is not None
              and isinstance(node.target, ast.Name) and _has_number(node.value)):
            names.append(node.target.id)
    return names


def test_module_numbers_finds_the_forms_a_tuning_constant_takes():
    source = ("A = 3\nB: float = 0.5\nC = 1 << 20\nD = (64 << 10, 1 << 20)\n"
              "E = {'quick': dict(target_s=0.008)}\nF = -2\nNAME = 'x'\nFLAG = True\n"
              "G = ADAPT.threshold\n")
    assert module_numbers(source) == ["A", "B", "C", "D", "E", "F"]


def test_no_tuning_number_outside_the_parameter_objects():
    found = {f"{rel}:{name}" for rel in CONVERTED
             for name in module_numbers((ROOT / rel).read_text())}
    stray = sorted(found - set(TRUE_CONSTANTS))
    assert not stray, (f"module-level numbers {stray}: make each a field of a parameter object "
                       f"in horotopo/params.py, or, for a true constant, list it with its "
                       f"reason in TRUE_CONSTANTS")
    gone = sorted(set(TRUE_CONSTANTS) - found)
    assert not gone, f"TRUE_CONSTANTS lists names that are no longer there: {gone}"


@pytest.mark.parametrize("cls", params.PARAMETER_OBJECTS)
def test_every_field_says_why_its_default(cls):
    for f in dataclasses.fields(cls):
        assert f.default is not dataclasses.MISSING, f"{cls.__name__}.{f.name} has no default"
        assert len(f.metadata.get("why", "").split()) >= 5, (
            f"{cls.__name__}.{f.name}: say why its default, in its field's metadata")


@pytest.mark.parametrize("cls", params.PARAMETER_OBJECTS)
def test_parameter_objects_are_frozen(cls):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cls(), dataclasses.fields(cls)[0].name, 0)


def test_the_code_defaults_are_the_parameter_defaults():
    detector = Detector()
    for name in ("threshold", "consecutive", "warmup", "min_seconds", "min_slow_s",
                 "max_backoff"):
        assert getattr(detector, name) == getattr(params.ADAPT, name)
    assert Trial(old_plan=None, old_calls=[(1, 1.0)]).calls == params.ADAPT.trial_calls
    assert RUNTIME_DEFAULTS["min_slow_s"] == params.ADAPT.runtime_min_slow_s
    assert in_flight_for(4, 3) == 4 + 2 * 3 + params.ENGINE.in_flight_extra


def test_environment_overrides_the_declared_fields():
    env = {"HOROTOPO_ADAPT_THRESHOLD": "0.5", "HOROTOPO_ADAPT_CONSECUTIVE": "4",
           "HOROTOPO_ADAPT_TRIAL": "0"}
    got = config.adapt_params(env)
    assert (got.threshold, got.consecutive, got.trial_calls) == (0.5, 4, 0)
    assert dataclasses.replace(got, threshold=0.3, consecutive=3, trial_calls=3) == params.ADAPT
    assert config.adapt_params({}) == params.ADAPT
    assert config.engine_params({}) == params.ENGINE
    assert config.probe_params({}) == params.PROBE


@pytest.mark.parametrize("variable, value", [
    ("HOROTOPO_ADAPT_THRESHOLD", "1"), ("HOROTOPO_ADAPT_THRESHOLD", "0"),
    ("HOROTOPO_ADAPT_CONSECUTIVE", "0"), ("HOROTOPO_ADAPT_TRIAL", "-1")])
def test_a_value_the_object_refuses_is_refused_by_its_setting_first(variable, value):
    # init() checks every setting before it starts, so a value the parameter object would
    # refuse later must already fail the setting's own check, naming the variable.
    env = {variable: value}
    assert [row.error for row in config.effective(env) if row.error
            and row.setting.name == variable], f"{variable}={value} passes init()'s check"
    with pytest.raises(config.ConfigError, match=f"{variable}='{value}'"):
        config.adapt_params(env)


def test_each_override_is_declared_with_the_fields_default():
    for cls, fields in config.PARAMETER_SETTINGS.items():
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name, variable in fields.items():
            assert config.lookup(variable).default == defaults[name], variable


def test_the_planner_reads_its_parameters_and_the_plan_records_them():
    from horotopo.plan import Plan, make_plan
    from horotopo.schedule import compile_allreduce
    from horotopo.topology import load

    topology = load("racks-2x3")
    default = make_plan(topology, size=64 << 20, params=params.PLANNER)
    assert default.planner["params"] == {}
    narrow = params.PlannerParams(min_chunk=128 << 10, max_chunk=128 << 10, window_bytes=1 << 20)
    plan = make_plan(topology, size=64 << 20, params=narrow)
    assert {t.chunk_bytes for t in plan.trees} == {128 << 10} != {
        t.chunk_bytes for t in default.trees}
    assert plan.planner["params"] == {"window_bytes": 1 << 20, "min_chunk": 128 << 10,
                                      "max_chunk": 128 << 10}
    again = Plan.from_json(plan.to_json())
    assert params.PlannerParams.recorded(again.planner["params"]) == narrow
    # the engine's tables run the window the plan was made with: 1 MiB of 128 KiB chunks
    count = (64 << 20) // 4
    table = compile_allreduce(again, 0, count, "float32", (128 << 10) // 4)
    assert table.window == 8
    assert compile_allreduce(default, 0, count, "float32", (128 << 10) // 4).window == 16


def test_the_environment_overrides_the_planner_and_names_what_does_not_fit():
    got = config.planner_params({"HOROTOPO_PLANNER_MIN_CHUNK": "8388608",
                                 "HOROTOPO_PLANNER_MAX_CHUNK": "16777216"})
    assert (got.min_chunk, got.max_chunk) == (8 << 20, 16 << 20)
    assert config.planner_params({}) == params.PLANNER
    with pytest.raises(config.ConfigError,
                       match="HOROTOPO_PLANNER_MIN_CHUNK='8388608': min_chunk"):
        config.planner_params({"HOROTOPO_PLANNER_MIN_CHUNK": "8388608"})
    with pytest.raises(ValueError, match="unknown field"):
        params.PlannerParams.recorded({"window": 3})
