"""The parameter objects (horotopo.params): every tuning number of the package lives in one
of them, documented once, and the environment overrides the fields that horotopo.config
declares."""
from __future__ import annotations

import ast
import dataclasses
import functools
import pathlib
from typing import Dict, List, Mapping, Tuple

import pytest

from horotopo import config, params
from horotopo.adapt.policy import Detector
from horotopo.adapt.runtime import RUNTIME_DEFAULTS
from horotopo.adapt.trial import Trial
from horotopo.schedule import in_flight_for

ROOT = pathlib.Path(__file__).resolve().parent.parent / "horotopo"

#: Module-level numbers that tune nothing, each with the reason: formats and protocol numbers
#: (versions, tags, flags, exit codes, op codes), unit conversions, tolerances of a check,
#: guards on what a file or message may hold, memory bounds that change no result, drawing
#: layout, model data of the generators, and measured figures that calibration replaces.
NOT_TUNING: Dict[str, str] = {
    "algorithms/flows.py:TCP_NETWORK": "measured figures (the network the simulator's TCP "
                                       "model gives, checked against it by test_predict)",
    "algorithms/dbtree.py:DEFAULT_CHUNK_BYTES": "a nominal chunk the two-tree plan carries; "
                                                "the engine passes its own per call",
    "algorithms/hierarchical.py:RING_TAGS": "tags of one call's rings: a protocol block",
    "algorithms/simcheck.py:SMALL_ELEMS": "a memory bound of a simulated rank's buffer; the "
                                          "rest of a size is scale, the times do not change",
    "algorithms/simcheck.py:TOTAL_ELEMS": "the same memory bound over all simulated ranks",
    "api/basics.py:SETTINGS_ERROR_EXIT": "exit status of a settings error",
    "api/checks.py:CHECKS": "the metadata checks' table (indices into a request record)",
    "api/controller.py:_FLAG_RUNNING": "a control-vector flag bit",
    "api/controller.py:_FLAG_ALL_CACHED": "a control-vector flag bit",
    "api/controller.py:_FLAG_NONE_JOINED": "a control-vector flag bit",
    "api/controller.py:MAX_REASON_BYTES": "a guard on the length of a message, not a trade-off",
    **{f"api/ops.py:{name}": "Horovod's op code" for name in
       ("Average", "Sum", "Adasum", "Min", "Max", "Product")},
    "api/set_table.py:PROCESS_SET_ADD": "a process-set protocol code",
    "api/set_table.py:PROCESS_SET_REMOVE": "a process-set protocol code",
    "buffers.py:_INFINITY_BITS": "IEEE 754 bit patterns of each float width's infinity",
    "cli/__init__.py:USAGE_EXIT": "exit status of a usage error",
    "cli/doctor_cmd.py:DRAWN_LINKS": "drawing layout: slow links drawn at most",
    "cli/draw.py:ROW": "drawing layout",
    "cli/draw.py:BINDING": "drawing layout: the utilisation drawn as binding",
    "cli/draw.py:MAX_TREE_PANELS": "drawing layout",
    "config.py:SETTINGS": "the settings registry: each default documented there",
    "costs.py:DEFAULT_PROFILE": "measured figures (the built-in cost profile), replaced by "
                                "horotopo calibrate's",
    "generate.py:LOCAL_LATENCY_MS": "generator model data",
    "generate.py:HOP_LATENCY_MS": "generator model data",
    "generate.py:WAN_LATENCY_MS": "generator model data",
    "gpu/awareness.py:_MPIX_GPU_SUPPORT_CUDA": "an MPI extension's constant",
    "gpu/kernels.py:VECTOR_BYTES": "the vector load width the *_v16 kernels are written for",
    "gpu/staging.py:_H2D": "a copy direction code",
    "gpu/staging.py:_D2H": "a copy direction code",
    "ops.py:CANONICAL_NAN_BITS": "IEEE 754 bit patterns of the canonical NaNs",
    "ops.py:_DTYPE_CODES": "wire codes of the dtypes",
    "ops.py:_BFLOAT16_CODE": "wire code of bfloat16",
    "ops.py:_OP_CODES": "wire codes of the ops",
    "packing/alphabeta.py:NO_COSTS": "zero software costs: the network alone, by definition",
    "packing/bottleneck.py:_DIGITS": "a tolerance of a comparison: digits that tie",
    "packing/certificate.py:RTOL": "a tolerance of the certificate check",
    "packing/gk.py:UNBOUNDED_BPS": "a figure reported where nothing constrains (one rank)",
    "packing/profiles.py:BATCH_ENTRIES": "a memory bound on the batched arrays; the profiles "
                                         "are the same at any batch size",
    "packing/sharing.py:SATURATED_RTOL": "a tolerance: rounding of a saturated resource",
    "plan.py:PLAN_VERSION": "the plan's JSON format version",
    "plan.py:_UNITS": "unit conversions of sizes",
    "planning_protocol.py:MAX_MESSAGE_CHARS": "a guard on the length of a message",
    "probe/config.py:MODES": "the presets of ProbeConfig, the probe's effort object: named "
                             "instances of a parameter object, each field documented there",
    **{f"probe/flows.py:{name}": "a tag offset in a test's block: protocol" for name in
       ("TAG_PING", "TAG_PONG", "TAG_WARM", "TAG_DATA", "TAG_ACK")},
    "probe/flows.py:_SEND": "the shared send buffer, empty until a transfer grows it",
    "probe/group.py:TAG_BLOCK": "tags a probe test allocates per block: a protocol size that "
                                "every rank must agree on, not a trade-off",
    "reliability/abort.py:ABORT_EXIT_CODE": "exit status of an abort",
    "reliability/targets.py:MIN_FRACTION": "an acceptance target of the versus-MPI verdict",
    "reliability/targets.py:MEDIAN_FRACTION": "an acceptance target of the versus-MPI verdict",
    "reliability/targets.py:MPI_SLACK": "an acceptance target of the versus-MPI verdict",
    "reliability/targets.py:TARGET_SIZE": "the size the versus-MPI targets are stated for",
    "schedule.py:SCHEDULE_VERSION": "the step table's JSON format version",
    "simulation/platform.py:HOST_FLOPS": "a speed SimGrid requires and nothing charges",
    "topology.py:GBPS_TO_BPS": "a unit conversion",
    "topology.py:MAX_DEPTH": "a guard on a topology file's nesting",
    "topology.py:MAX_FILE_BYTES": "a file-size guard",
    "topology.py:BASE_FILE_BYTES": "a file-size guard",
    "topology.py:BYTES_PER_RANK_PAIR": "a file-size guard",
    "topology.py:BYTES_PER_RANK": "a file-size guard",
    "torch/distributed/backend.py:_P2P_TIMEOUT": "torch.distributed's own default timeout",
    "torch/distributed/launch.py:_DEFAULT_TIMEOUT": "torch.distributed's own default timeout",
    "torch/distributed/p2p.py:TAGS_PER_GROUP": "a tag range per process group: protocol",
    "torch/distributed/p2p.py:_HEADER": "the length of a message header: protocol",
    "transport/mpi.py:ARRIVAL_TAG": "a protocol tag",
    "transport/mpi.py:DEPARTURE_TAG": "a protocol tag",
    "transport/mpi.py:_MISSING": "a state code of a rank's arrival",
    "transport/mpi.py:_ARRIVED": "a state code of a rank's arrival",
    "transport/mpi.py:_DEPARTED": "a state code of a rank's arrival",
    "transport/poll.py:IDLE": "a poll step's report code",
    "transport/poll.py:PROGRESS": "a poll step's report code",
    "transport/poll.py:DONE": "a poll step's report code",
    "transport/wire.py:MAX_CONTROL_BYTES": "a guard on a control message's size",
    "transport/wire.py:MAX_DEPTH": "a guard on a control message's nesting",
    "validate.py:CAPACITY_RTOL": "a tolerance of the plan check",
    "validate.py:SHARE_ATOL": "a tolerance of the plan check",
}


def _has_number(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float))
               and not isinstance(n.value, bool) for n in ast.walk(node))


def _bound_names(target: ast.AST) -> List[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for elt in target.elts for name in _bound_names(elt)]
    return []


def module_numbers(source: str) -> List[str]:
    """Names bound at module level to an expression holding a number literal."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and _has_number(node.value):
            names += [name for t in node.targets for name in _bound_names(t)]
        elif (isinstance(node, ast.AnnAssign) and node.value is not None
              and _has_number(node.value)):
            names += _bound_names(node.target)
    return names


def stray_numbers(sources: Mapping[str, str]) -> List[str]:
    """``path:NAME`` of every module-level number of ``sources`` (path -> source text) that
    :data:`NOT_TUNING` does not list."""
    return sorted(f"{path}:{name}" for path, text in sources.items()
                  for name in module_numbers(text)
                  if f"{path}:{name}" not in NOT_TUNING)


#: Values that tune nothing as a function parameter's default: none, identities, the first
#: index, and "none given" (-1, an empty pause).
NEUTRAL_DEFAULTS = (0, 1, -1, (0.0, 0.0))

#: Numeric defaults of function parameters other than NEUTRAL_DEFAULTS that tune nothing, by
#: ``path:function:parameter`` (``path:*`` for a whole module), each with the reason.
NOT_TUNING_DEFAULTS: Dict[str, str] = {
    "generate.py:*": "generator model data: the clusters a user asks for by name and "
                     "parameters (horotopo simulate NAME:key=value)",
    "torch/sync_batch_norm.py:__init__:eps": "torch.nn.BatchNorm's own default",
    "torch/sync_batch_norm.py:__init__:momentum": "torch.nn.BatchNorm's own default",
    "algorithms/cost.py:cutover_bytes:limit": "a bound on the sizes the search looks at "
                                              "(16 GiB), not a trade-off",
    "plan.py:plan_from_trees:chunk_bytes": "a nominal chunk of a plan built by hand; the "
                                           "engine passes its own per call",
    "validate.py:validate:chunk_elems": "the shape of the check's tables: small chunks, so "
                                        "that every tree has several",
    "schedule.py:__init__:capacity": "a memory bound of the step-table cache; the tables are "
                                     "the same at any capacity",
    "probe/pairing.py:group_tests:min_pairs": "a concurrent test by definition: one pair "
                                              "alone is the pairwise figure",
    "probe/diagnose.py:_hosts:show": "text layout: hosts named before the rest are counted",
    "schedule.py:describe:max_chunks": "text layout: chunks described per step",
}


def _neutral(node: ast.AST) -> bool:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return False
    return not isinstance(value, bool) and any(
        value == v and type(value) is type(v) or (isinstance(v, int) and value == v
                                                  and isinstance(value, float))
        for v in NEUTRAL_DEFAULTS)


@functools.lru_cache(maxsize=None)  # the scans and their failing twin parse the same modules
def default_numbers(source: str) -> Tuple[str, ...]:
    """``function:parameter`` of every parameter (of a function, method or lambda, at any
    depth) whose default holds a number literal and is not one of NEUTRAL_DEFAULTS."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        name = getattr(node, "name", "<lambda>")
        out += [f"{name}:{a.arg}" for a, d in pairs if _has_number(d) and not _neutral(d)]
    return tuple(out)


def stray_defaults(sources: Mapping[str, str]) -> List[str]:
    """``path:function:parameter`` of every numeric default of ``sources`` that
    :data:`NOT_TUNING_DEFAULTS` does not list."""
    return sorted(f"{path}:{item}" for path, text in sources.items()
                  for item in default_numbers(text)
                  if f"{path}:{item}" not in NOT_TUNING_DEFAULTS
                  and f"{path}:*" not in NOT_TUNING_DEFAULTS)


def _package_sources() -> Dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def test_module_numbers_finds_the_forms_a_tuning_constant_takes():
    source = ("A = 3\nB: float = 0.5\nC = 1 << 20\nD = (64 << 10, 1 << 20)\n"
              "E = {'quick': dict(target_s=0.008)}\nF = -2\nG, H = 1, 2\nNAME = 'x'\n"
              "FLAG = True\nI = ADAPT.threshold\ndef f():\n    J = 7\n")
    assert module_numbers(source) == ["A", "B", "C", "D", "E", "F", "G", "H"]


def test_a_new_tuning_constant_anywhere_fails_the_scan():
    sources = _package_sources()
    sources["packing/sharing.py"] += "\nFOO_FACTOR = 1.5\n"
    sources["packing/new_search.py"] = '"""A new module."""\nSEARCH_ROUNDS = 8\n'
    # a name that is allowed in one module is not thereby allowed in another
    sources["engine.py"] += "\nRTOL = 1e-9\n"
    assert stray_numbers(sources) == ["engine.py:RTOL", "packing/new_search.py:SEARCH_ROUNDS",
                                      "packing/sharing.py:FOO_FACTOR"]


def _assert_all_listed(stray: List[str], what: str, table: str, gone: List[str]) -> None:
    assert not stray, (f"{what} {stray}: take each from a field of a parameter object in "
                       f"horotopo/params.py (its default and why), or, if it tunes nothing, "
                       f"list it with its reason in {table}")
    assert not gone, f"{table} lists entries that are no longer there: {gone}"


def test_no_tuning_number_outside_the_parameter_objects():
    sources = _package_sources()
    found = {f"{path}:{name}" for path, text in sources.items()
             for name in module_numbers(text)}
    _assert_all_listed(stray_numbers(sources), "module-level numbers", "NOT_TUNING",
                       sorted(set(NOT_TUNING) - found))


def test_default_numbers_finds_the_forms_a_tuning_default_takes():
    source = ("def f(a, b=3, *, c=0.5, d=None, e=0, g=1.0, h=-1, i=True):\n"
              "    def inner(j=1 << 20):\n        pass\n"
              "class K:\n    def m(self, k=(0.0, 0.0), m=(0.1, 1.0), n=-2, o=ENGINE.x):\n"
              "        return lambda p=2: p\n")
    assert sorted(default_numbers(source)) == sorted(
        ["f:b", "f:c", "inner:j", "m:m", "m:n", "<lambda>:p"])


def test_a_new_tuning_default_anywhere_fails_the_scan():
    sources = _package_sources()
    sources["packing/gk.py"] += "\ndef refine(packing, rounds=12):\n    return packing\n"
    # a parameter allowed in one function allows no other
    sources["plan.py"] += "\ndef plan_again(plan, chunk_bytes=1 << 20):\n    return plan\n"
    assert stray_defaults(sources) == ["packing/gk.py:refine:rounds",
                                       "plan.py:plan_again:chunk_bytes"]


def test_no_tuning_number_in_a_function_signature():
    sources = _package_sources()
    found = {f"{path}:{item}" for path, text in sources.items()
             for item in default_numbers(text)} | {f"{path}:*" for path in sources}
    _assert_all_listed(stray_defaults(sources), "numeric defaults of function parameters",
                       "NOT_TUNING_DEFAULTS", sorted(set(NOT_TUNING_DEFAULTS) - found))


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
            and f"{variable}='{value}'" in row.error], f"{variable}={value} passes init()'s check"
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
    # the packing's own bounds are parameters too, and a keyword given replaces the field
    pruned = make_plan(topology, size=64 << 20, max_trees_per_root=1, params=narrow)
    assert pruned.planner["params"] == dict(plan.planner["params"], max_trees_per_root=1)
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


def test_a_replan_keeps_the_planner_parameters_the_plan_was_made_with():
    from horotopo.adapt import AdaptiveEngine
    from horotopo.bootstrap import uniform_document
    from horotopo.plan import make_plan
    from horotopo.topology import from_dict
    from loop_transport import run_ranks

    # 1000 gbps claimed: the re-probe of in-process copies finds less, so the model changes
    topo = from_dict(uniform_document(3, 1000.0))
    plan = make_plan(topo, chunk_bytes=4096, params=params.PlannerParams(window_bytes=1 << 20))

    def body(t):
        eng = AdaptiveEngine(t, plan, topo, adapt=False, timeout_s=0)
        try:
            event = eng.replan("test")
            return event.switched, eng.plan.planner["params"]
        finally:
            eng.close()

    got = run_ranks(3, body)
    assert got == [(True, {"window_bytes": 1 << 20})] * 3, got


def test_init_refuses_planner_parameters_that_do_not_fit_on_every_rank():
    from horotopo.bootstrap import SettingsError, setup
    from loop_transport import run_ranks

    env = {"HOROTOPO_TOPOLOGY": "racks-2x3", "HOROTOPO_PLANNER_MIN_CHUNK": str(8 << 20)}

    def refused(t):
        with pytest.raises(SettingsError, match="HOROTOPO_PLANNER_MIN_CHUNK='8388608'"):
            setup(t, env=env)
        return True

    assert run_ranks(6, refused) == [True] * 6
    # the environment given is the one planned with
    made = run_ranks(6, lambda t: setup(t, env={"HOROTOPO_TOPOLOGY": "racks-2x3",
                                                "HOROTOPO_PLANNER_WINDOW_BYTES": "1048576"}))
    assert {s.plan.planner["params"]["window_bytes"] for s in made} == {1 << 20}


def _as_text(value) -> str:
    return ",".join(map(repr, value)) if isinstance(value, tuple) else repr(value)


@pytest.mark.parametrize("cls", params.PARAMETER_OBJECTS)
def test_every_field_has_a_variable_read_as_its_type(cls):
    concern = cls.__name__[:-len("Params")].upper()
    for f in dataclasses.fields(cls):
        variable = config.parameter_variable(cls, f.name)
        assert variable == f"HOROTOPO_{concern}_{f.name.upper()}"
        # the default written out comes back as the default, of the field's own type
        got = getattr(config.parameters(cls, {variable: _as_text(f.default)}), f.name)
        assert got == f.default and type(got) is type(f.default), (variable, got)
        assert [type(v) for v in getattr(got, "__iter__", lambda: [])()] == [
            type(v) for v in getattr(f.default, "__iter__", lambda: [])()]
        row = next(r for r in config.effective({variable: _as_text(f.default)})
                   if r.setting.name == variable)
        assert (row.source, row.variable) == ("environment", variable), row


def test_the_scheme_names_and_the_earlier_spelling_set_the_fields():
    env = {"HOROTOPO_PROBE_SLOW_RATIO": "2.5", "HOROTOPO_RELIABILITY_PING_TIMEOUT_S": "0.5",
           "HOROTOPO_RUNTIME_CONTROL_NAP_S": "1e-4, 2e-3", "HOROTOPO_PLANNER_HOST_TREE_COUNTS": "2,4",
           "HOROTOPO_ENGINE_CALIBRATION_REPEATS": "4", "HOROTOPO_ADAPT_TRIAL": "1"}
    assert config.probe_params(env).slow_ratio == 2.5
    assert config.reliability_params(env).ping_timeout_s == 0.5
    assert config.runtime_params(env).control_nap_s == (1e-4, 2e-3)
    assert config.planner_params(env).host_tree_counts == (2, 4)
    assert config.engine_params(env).calibration_repeats == 4
    assert config.adapt_params(env).trial_calls == 1
    with pytest.raises(config.ConfigError, match="disagree"):
        config.adapt_params({"HOROTOPO_ADAPT_TRIAL": "1", "HOROTOPO_ADAPT_TRIAL_CALLS": "2"})


@pytest.mark.parametrize("variable, value, says", [
    ("HOROTOPO_PROBE_SLOW_RATIO", "abc", "must be a number"),
    ("HOROTOPO_PROBE_SLOW_RATIO", "1", "slow_ratio: must be above 1"),
    ("HOROTOPO_ENGINE_COST_REPEATS", "1.5", "must be a whole number"),
    ("HOROTOPO_RUNTIME_CONTROL_NAP_S", "1e-3", "control_nap_s: (first, longest) pause"),
    ("HOROTOPO_PLANNER_CHUNK_SCALES", "0.5,,2", "must be numbers, comma-separated"),
    ("HOROTOPO_PLANNER_HOST_TREE_COUNTS", "4,8.5", "must be whole numbers, comma-separated"),
    ("HOROTOPO_RELIABILITY_PING_TIMEOUT_S", "0", "ping_timeout_s: must be positive"),
    ("HOROTOPO_RELIABILITY_PLAN_TIMEOUT_S", "inf", "must be a number")])
def test_a_bad_parameter_value_is_one_line_naming_the_variable(variable, value, says):
    cls = config.lookup(variable).parameter[0]
    with pytest.raises(config.ConfigError) as caught:
        config.parameters(cls, {variable: value})
    message = str(caught.value)
    assert message.startswith(f"{variable}={value!r}: ") and says in message, message
    assert "\n" not in message
    # init() refuses it before anything starts (it checks every row of this table)
    assert [r.error for r in config.effective({variable: value}) if r.error] == [message]


def test_a_bad_parameter_value_ends_a_command_with_one_line_and_status_2(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, HOROTOPO_PLANNER_MAX_WINDOW="many")
    res = subprocess.run([sys.executable, "-m", "horotopo", "plan", "racks-2x3", "-o",
                          str(tmp_path / "p.json")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[-1] == ("horotopo plan: error: HOROTOPO_PLANNER_MAX_WINDOW="
                                           "'many': must be a whole number")
    assert "Traceback" not in res.stderr


def test_the_doctor_judges_and_lists_with_the_environments_probe_parameters(
        tmp_path, capsys, monkeypatch):
    import gzip
    import json

    from horotopo.cli.doctor_cmd import report

    with gzip.open(pathlib.Path(__file__).parent / "data" / "probed-sites-24-g4.json.gz",
                   "rt") as fh:
        doc = json.load(fh)

    def printed() -> str:
        assert report(doc, 64 << 20, json_path=str(tmp_path / "d.json"), png_path=None) == 0
        return capsys.readouterr().out

    link = "link a-r0h0 -> b-r0h2: 6.13 gbps, 1.3x below"
    default = printed()
    assert "(at least 1.5x below)" in default and link not in default
    monkeypatch.setenv("HOROTOPO_PROBE_SLOW_RATIO", "1.05")
    judged = printed()
    assert "(at least 1.05x below)" in judged and link in judged
    monkeypatch.setenv("HOROTOPO_PROBE_LISTED_LINKS", "2")
    assert "... and 4 more slow host pairs" in printed()


def test_init_waits_for_the_plan_as_long_as_the_environment_says(monkeypatch):
    import time

    from horotopo import bootstrap
    from horotopo.bootstrap import BootstrapError, setup
    from loop_transport import run_ranks

    planner = bootstrap.ring_plan

    def slow_planner(topology, **kwargs):
        time.sleep(0.6)
        return planner(topology, **kwargs)

    monkeypatch.setattr(bootstrap, "ring_plan", slow_planner)

    def outcome(env):
        def body(t):
            try:
                return setup(t, env=env).plan.digest
            except BootstrapError as exc:
                return exc
        return run_ranks(2, body)

    waited = outcome({"HOROTOPO_PROBE": "off"})
    assert all(isinstance(d, str) for d in waited), waited
    # rank 0 then waits for rank 1 to confirm the plan: as long as the exchange timeout
    short = outcome({"HOROTOPO_PROBE": "off", "HOROTOPO_RELIABILITY_PLAN_TIMEOUT_S": "0.2",
                     "HOROTOPO_RELIABILITY_EXCHANGE_TIMEOUT_S": "0.5"})
    assert isinstance(short[1], BootstrapError), short
    assert "nothing from rank 0 within 0.2 s" in str(short[1]), short[1]


def test_the_predictions_charge_the_window_the_plan_was_made_with():
    from dataclasses import replace

    from horotopo.algorithms import flows
    from horotopo.generate import generate
    from horotopo.packing import alphabeta
    from horotopo.plan import Plan, make_plan
    from horotopo.schedule import compile_allreduce
    from horotopo.topology import from_dict

    # two sites over a WAN: a window of 4 chunks of 128 KiB does not cover the round trip
    topology = from_dict(generate("sites:wan_gbps=10", 8))
    size, chunk = 64 << 20, 128 << 10
    narrow = params.PlannerParams(min_chunk=chunk, max_chunk=chunk, window_bytes=512 << 10)
    plan = Plan.from_json(make_plan(topology, size=size, params=narrow).to_json())
    assert plan.planner_params == narrow
    as_default = replace(plan, planner=dict(plan.planner, params={}))
    engine_window = compile_allreduce(plan, 0, size // 4, "float32", chunk // 4).window
    assert engine_window == 4 != compile_allreduce(as_default, 0, size // 4, "float32",
                                                   chunk // 4).window
    profiles = [t.profile for t in plan.trees]
    at_engine_window = alphabeta.plan_time(
        [t.share * size for t in plan.trees], plan.tree_chunks(None),
        [t.rate_Bps for t in plan.trees], profiles,
        alphabeta.rank_degrees([(t.root, t.reduce_parent, t.bcast_parent) for t in plan.trees]),
        window=engine_window)
    assert plan.predict_time(size) == pytest.approx(at_engine_window, rel=1e-12)
    assert plan.predict_time(size) > 1.2 * as_default.predict_time(size)
    flow_time = flows.plan_time(topology, plan, size)
    assert flow_time == pytest.approx(flows.plan_time(topology, plan, size,
                                                      window=engine_window), rel=1e-12)
    assert flow_time > flows.plan_time(topology, as_default, size)


def test_objects_built_at_construction_take_the_environments_parameters(monkeypatch, tmp_path):
    from horotopo.engine import Engine
    from horotopo.gpu.staging import Stager
    from horotopo.plan import plan_from_trees
    from horotopo.timeline import Timeline
    from loop_transport import run_ranks

    class Pinned:
        def pinned(self, nbytes):
            return bytearray(nbytes)

    monkeypatch.setenv("HOROTOPO_ENGINE_STAGING_SLOTS", "3")
    assert len(Stager(64, copier=Pinned())._slots) == 3
    monkeypatch.setenv("HOROTOPO_RUNTIME_TIMELINE_FLUSH_EVENTS", "7")
    timeline = Timeline(str(tmp_path / "t.json"))
    try:
        assert timeline._flush_events == 7
    finally:
        timeline.close()
    # an engine nobody calibrated charges the prior of the parameters it was given
    prior = params.EngineParams(prior_mpi_latency_s=1e-3, prior_tree_latency_s=2e-3,
                                prior_per_message_s=3e-5, kept_predictions=5)
    plan = plan_from_trees(2, [(0, [-1, 0], [-1, 0], 1.0)])

    def model(t):
        with Engine(t, plan, params=prior) as eng:
            m = eng.cost_model
            return m.mpi_latency_s, m.tree_latency_s, m.per_message_s, m.side.kept

    assert run_ranks(2, model) == [(1e-3, 2e-3, 3e-5, 5)] * 2


def test_the_engines_in_flight_extra_reaches_its_tree_tables(monkeypatch):
    from horotopo.engine import Engine
    from horotopo.plan import plan_from_trees
    from loop_transport import run_ranks

    # a chain 0 <- 1 <- 2: rank 1's tree has one hop each way
    plan = plan_from_trees(3, [(0, [-1, 0, 1], [-1, 0, 1], 1.0)])

    def in_flight(t, engine_params):
        with Engine(t, plan, window=4, params=engine_params) as eng:
            tree = eng.allreduce_algorithms.get("tree").runner.schedules
            bcast = eng.broadcast_algorithms.get("tree").runner.schedules
            tables = (tree.allreduce(1 << 12, "float32", 64).trees[0],
                      bcast.broadcast(1 << 12, "float32", 64, 0).trees[0])
            # the window, a chunk per hop each way, and the extra
            return [t.in_flight - 4 - 2 * t.hops for t in tables]

    assert run_ranks(3, lambda t: in_flight(t, params.ENGINE)) == [
        [params.ENGINE.in_flight_extra] * 2] * 3
    monkeypatch.setenv("HOROTOPO_ENGINE_IN_FLIGHT_EXTRA", "7")
    assert config.engine_params().in_flight_extra == 7 != params.ENGINE.in_flight_extra
    assert run_ranks(3, lambda t: in_flight(t, config.engine_params())) == [[7, 7]] * 3


def test_the_gpu_grid_takes_the_parameters_it_is_given(monkeypatch):
    from horotopo.gpu import kernels

    assert kernels.grid_blocks(10 ** 6, 100) == 100 * params.ENGINE.gpu_blocks_per_sm
    narrow = params.EngineParams(gpu_block_threads=128, gpu_blocks_per_sm=2)
    assert kernels.grid_blocks(1000, 100, narrow) == 8  # ceil(1000 / 128)
    assert kernels.grid_blocks(10 ** 6, 100, narrow) == 200
    assert kernels.grid_blocks(0, 100, narrow) == 1
    # the launches' geometry is the environment's, read when the kernels are first loaded
    # (whether or not this machine can load them: the value is checked first)
    monkeypatch.setattr(kernels._NativeState, "modules", {})
    monkeypatch.setattr(kernels._NativeState, "error", None)
    monkeypatch.setattr(kernels._NativeState, "params", params.ENGINE)
    monkeypatch.setenv("HOROTOPO_ENGINE_GPU_BLOCK_THREADS", "128")
    monkeypatch.setenv("HOROTOPO_ENGINE_GPU_BLOCKS_PER_SM", "2")
    kernels.load_native()
    got = kernels._NativeState.params
    assert (got.gpu_block_threads, got.gpu_blocks_per_sm) == (128, 2)
    monkeypatch.setattr(kernels._NativeState, "modules", {})
    monkeypatch.setattr(kernels._NativeState, "error", None)
    monkeypatch.setenv("HOROTOPO_ENGINE_GPU_BLOCK_THREADS", "0")
    with pytest.raises(config.ConfigError, match="HOROTOPO_ENGINE_GPU_BLOCK_THREADS='0'"):
        kernels.load_native()


def test_a_transports_idle_pauses_are_the_ones_it_was_built_with(monkeypatch):
    import time

    from horotopo.transport.base import Transport, WrappedTransport

    class Never(Transport):
        """A transport whose one request never completes: it counts the polls of a wait."""

        def __init__(self, idle_nap_s=None):
            self.polls = 0
            if idle_nap_s is not None:
                self.idle_nap_s = idle_nap_s

        rank, size = 0, 2

        def test(self, request):
            self.polls += 1
            return False

        def cancel(self, request):
            pass

    def polls(transport, wait_s=0.2):
        from horotopo.transport.poll import TransportTimeout

        with pytest.raises(TransportTimeout):
            transport.wait([object()], time.perf_counter() + wait_s, peers=[1])
        return getattr(transport, "inner", transport).polls

    assert Never().idle_nap_s == params.RUNTIME.idle_nap_s
    # 50 ms pauses: a handful of polls in 0.2 s, where the default's 1 ms pauses make hundreds
    slow = polls(Never((0.05, 0.05)))
    assert slow <= 6 and polls(Never()) > 4 * slow

    class Wrapped(WrappedTransport):
        def test(self, request):
            return self.inner.test(request)

        def cancel(self, request):
            self.inner.cancel(request)

    # a wrapper (failure tracking, staging) waits as the transport it wraps
    assert polls(Wrapped(Never((0.05, 0.05)))) <= 6
    # the MPI transport takes the environment's at construction
    from mpi4py import MPI
    from horotopo.transport.mpi import MPITransport

    monkeypatch.setenv("HOROTOPO_RUNTIME_IDLE_NAP_S", "0.002,0.004")
    t = MPITransport(MPI.COMM_SELF)
    try:
        assert t.idle_nap_s == (0.002, 0.004)
    finally:
        t.close()


#: Numbers inside a function body that tune nothing wherever they stand: none, identities, a
#: pair, and unit conversions (bits per byte, percent, KiB, kilo/mega/giga, milli/micro/nano).
NEUTRAL_BODY_NUMBERS = (0, 1, -1, 2, 8, 100, 1024, 1e3, 1e6, 1e9, 1e-3, 1e-6, 1e-9)
#: Shift counts that are units (``64 << 10`` is 64 KiB): the number shifted is the one judged.
UNIT_SHIFTS = (10, 20, 30)

#: Numbers in function bodies that tune nothing, by ``path:function:value`` (``path:function:*``
#: for a whole function, ``path:*`` for a whole module), each with the reason.
NOT_TUNING_BODY: Dict[str, str] = {
    "generate.py:*": "generator model data: the clusters a user asks for by name",
    "cli/draw.py:*": "drawing layout",
    "cli/doctor_cmd.py:draw_network:*": "drawing layout",
    "config.py:_number:10": "the base of a decimal number",
    "engine.py:__init__:15": "hex digits of the plan digest the ranks compare",
    "engine.py:__init__:16": "the base of a hex digest",
    "engine.py:time_algorithms:4": "bytes of a float32",
    "algorithms/simcheck.py:simulate_allreduce:4": "bytes of a float32",
    "algorithms/simcheck.py:_chain_time:4": "bytes of a float32",
    "algorithms/simcheck.py:_chain_time:3": "the three ranks of the test chain",
    **{f"algorithms/simcheck.py:{function}:{value!r}":
       "the design of a test network of measure_network (its links' rates and latencies, "
       "the chain's chunk and window, a message tag): the figures measured are ratios to "
       "what the design declares"
       for function, values in (("_chain_time", (0.002, 0.05, 10.0, 128, 16)),
                                ("_two_flows", (10.0,)), ("body", (7,)),
                                ("measure_network", (0.0002, 0.005, 10.0, 5.0)))
       for value in values},
    "algorithms/simcheck.py:measure_network:125000000.0": "1 gbps in bytes per second",
    "algorithms/simcheck.py:measure_network:1250000000.0": "10 gbps in bytes per second",
    "algorithms/simcheck.py:measure_network:1.001": "a tolerance: a ratio of one, rounded",
    "algorithms/tree.py:__init__:3": "a step count: a non-root's reduce send, and its "
                                     "broadcast receive and copy",
    "api/controller.py:__init__:63": "bits of a 64-bit word, less one (a ceiling division)",
    "api/controller.py:__init__:64": "bits of a 64-bit word",
    "api/controller.py:bits_of:64": "bits of a 64-bit word",
    "gpu/awareness.py:self_test:64": "elements of a self-test's buffer: any few will do",
    "gpu/elementwise.py:*": "IEEE 754 and bfloat16 bit patterns and shifts",
    "gpu/kernels.py:backend_for:3": "a warning's stack level",
    "gpu/transport.py:_size_class:16": "64 KiB, the smallest pooled slot: a memory bound, the "
                                       "copies are the same at any slot size",
    "packing/gk.py:pack:10": "a progress line every ten rounds: text, not behaviour",
    "packing/model.py:ring_packing:1000000000000000.0": "a figure reported where nothing "
                                                        "constrains (one host)",
    "packing/model.py:stats:4": "digits of a rounded figure in a report",
    "probe/config.py:check:10": "a guard on a probe setting (seconds per transfer)",
    "transport/base.py:__init__:64": "a guard: the fewest tags a transport must offer",
    "transport/mpi.py:__init__:32767": "the least MPI_TAG_UB the MPI standard guarantees",
    "adapt/runtime.py:_inband:4": "the four matrices of the in-band report",
    "adapt/runtime.py:_replan:4": "digits of a rounded figure in a report",
    "adapt/slowdown.py:run_slowdown:4": "bytes of a float32",
    **{f"adapt/slowdown.py:{function}:8e-09": "bytes per second in gbps"
       for function in ("run_slowdown", "body", "series_lines")},
    "adapt/slowdown.py:slowed:200": "text layout: characters of a message",
    "api/executors.py:adasum_pair:0.5": "Adasum's formula",
    "api/ops.py:handle_average_backwards_compatibility:3": "a warning's stack level",
    "api/set_table.py:build_group:3": "a structural minimum: two ranks have one plan, the ring",
    "bootstrap.py:describe:12": "text layout: digest characters shown",
    "buffers.py:order_keys:16": "bits of a float16",
    "cli/calibrate_cmd.py:__init__:15": "a tag space (32768 tags) for the mirror transport",
    "cli/calibrate_cmd.py:measure:4": "bytes of a float32",
    "packing/alphabeta.py:plan_chunks:3": "an index into a tree record",
    "packing/hierarchy.py:pack_hierarchical:4": "digits of a rounded figure in a report",
    "plan.py:digest:16": "hex characters of a digest",
    "plan.py:plan_from_trees:3": "an index into a tree record",
    "plan.py:validate:3": "the length of a hop record",
    "planning_protocol.py:_one_line:3": "the length of an ellipsis",
    "probe/measure.py:_probe:3": "digits of a rounded figure in a report",
    "reliability/targets.py:summarize:3": "digits of a rounded figure in a report",
    "simulation/runner.py:_current_cpu:36": "the index of /proc/self/stat's processor field",
    "timeline.py:_us:3": "digits of a rounded figure in the trace",
    "timeline.py:complete:3": "digits of a rounded figure in the trace",
    "topology.py:_best_error:64": "a bound on the schema errors looked at for the message",
    "topology.py:digest:16": "hex characters of a digest",
    "torch/distributed/p2p.py:_open:32": "the tag space split for process groups: protocol",
    "validate.py:validate:16": "the check's coverage: every root up to 16 ranks, three above",
    "validate.py:validate:3": "the check's shape: several chunks per tree",
    "probe/hostinfer.py:split:0.5": "the cut of a matrix of 0s and 1s",
    "probe/cluster.py:cluster_ranks:3": "a structural minimum: two ranks have one rate, no "
                                        "levels",
    "probe/cluster.py:cluster_levels:3": "the same structural minimum",
    "probe/pairing.py:group_tests:3": "a structural minimum: a round robin over the other "
                                      "groups needs two of them",
    "probe/diagnose.py:versus_ring:1.005": "the band a report's words call 'about as fast'",
    "probe/diagnose.py:versus_ring:0.995": "the band a report's words call 'about as fast'",
    "probe/diagnose.py:report_lines:4": "text layout: the narrowest column",
    "reliability/versus_mpi.py:versus_mpi_report:1.05": "the band a report's words call 'on "
                                                        "par'",
    "reliability/versus_mpi.py:versus_mpi_report:0.95": "the band a report's words call 'on "
                                                        "par'",
    "simulation/actors.py:run:64": "mailboxes made ahead per rank, so that a rank rarely "
                                   "makes one in its own thread: the simulation's wall time",
    "simulation/actors.py:run:16": "text layout: ranks named in a deadlock's message",
    "algorithms/cost.py:fit_affine:1e-15": "a floor that keeps a fitted slope positive",
    "algorithms/cost.py:calibrated_model:1e-12": "a guard against a division by zero",
    "algorithms/cost.py:summary:4": "digits of a rounded figure in a report",
    "probe/flows.py:_run_flows:3": "three tags per test and three timings per flow: protocol",
    "algorithms/flows.py:_arc_weights:1e-12": "a guard against a division by zero",
    "algorithms/flows.py:_sharing:1e-12": "a guard against a division by zero",
    "algorithms/flows.py:trees_time:1e-300": "a guard against a division by zero",
    "cli/simulate_cmd.py:_simulate:4": "bytes of a float32",
    "packing/forests.py:choose_forest:3": "a structural minimum: below three ranks every "
                                          "forest runs alike",
    "packing/forests.py:choose_forest:4": "digits of a rounded figure in a report",
    "packing/sharing.py:_distinct:4": "the table-or-sort choice of a unique: the same result "
                                      "either way, only its speed and memory",
    "packing/sharing.py:_distinct:22": "the same choice's smallest table (4 Mi entries)",
    "packing/sharing.py:_distinct:31": "the bits of an int32 index",
    "packing/sharing.py:usage_of:31": "the bits of an int32 index",
    "packing/sharing.py:_packed_rates:3": "an index into a tree record",
    "probe/hosts.py:_document:3": "digits of a rounded figure in a report",
}


def _neutral_body_number(value: object) -> bool:
    return any(value == v for v in NEUTRAL_BODY_NUMBERS)


@functools.lru_cache(maxsize=None)  # the scan and its failing twin parse the same modules
def body_numbers(source: str) -> Tuple[str, ...]:
    """``function:value`` of every number literal in a function's body (statements of a
    nested function count for that one; defaults are the signature scan's) that is not one of
    NEUTRAL_BODY_NUMBERS, nor a unit shift."""
    out: List[str] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement in node.body:
                visit(statement, node.name)
            return
        if isinstance(node, ast.Lambda):
            visit(node.body, function)
            return
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift)
                and isinstance(node.right, ast.Constant) and node.right.value in UNIT_SHIFTS):
            visit(node.left, function)
            return
        if (function and isinstance(node, ast.Constant)
                and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
                and not _neutral_body_number(node.value)):
            out.append(f"{function}:{node.value!r}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "")
    return tuple(out)


def _body_listed(path: str, item: str) -> bool:
    function = item.rsplit(":", 1)[0]
    return any(key in NOT_TUNING_BODY for key in
               (f"{path}:{item}", f"{path}:{function}:*", f"{path}:*"))


def stray_body_numbers(sources: Mapping[str, str]) -> List[str]:
    """``path:function:value`` of every number in a function body of ``sources`` that
    NOT_TUNING_BODY does not list."""
    return sorted({f"{path}:{item}" for path, text in sources.items()
                   for item in body_numbers(text) if not _body_listed(path, item)})


def test_body_numbers_finds_the_forms_a_tuning_number_takes():
    source = ("X = 5\n"
              "def f(a, b=3):\n    y = a * 0.9 + 64 << 10\n    z = 1 << 20\n"
              "    def g():\n        return 12\n    return [0, 1, -1, 2, 8, 1e6, 1e-9, -7]\n"
              "class K:\n    def m(self):\n        return (lambda q: q / 4)(self) + 2.5\n")
    assert sorted(body_numbers(source)) == sorted(
        ["f:0.9", "f:64", "f:7", "g:12", "m:4", "m:2.5"])


def test_a_new_tuning_number_in_a_function_body_fails_the_scan():
    sources = _package_sources()
    sources["packing/gk.py"] += "\ndef refine(packing):\n    return packing * 0.75\n"
    sources["packing/new_search.py"] = "def search(x):\n    return x[:12]\n"
    # a value listed in one function allows it in no other
    sources["engine.py"] += "\ndef slice_digest(d):\n    return d[:15]\n"
    assert stray_body_numbers(sources) == ["engine.py:slice_digest:15",
                                           "packing/gk.py:refine:0.75",
                                           "packing/new_search.py:search:12"]


def test_no_tuning_number_in_a_function_body():
    sources = _package_sources()
    found = {f"{path}:{item}" for path, text in sources.items()
             for item in body_numbers(text)}
    found |= {f"{path}:{item.rsplit(':', 1)[0]}:*" for path, text in sources.items()
              for item in body_numbers(text)} | {f"{path}:*" for path in sources}
    _assert_all_listed(stray_body_numbers(sources), "numbers in function bodies",
                       "NOT_TUNING_BODY", sorted(set(NOT_TUNING_BODY) - found))


def test_the_watchdog_and_the_liveness_responder_take_the_environments_teardown_wait(
        monkeypatch):
    from horotopo.reliability import LivenessResponder
    from horotopo.reliability.watchdog import Watchdog
    from loop_transport import run_ranks

    monkeypatch.setenv("HOROTOPO_RELIABILITY_TEARDOWN_WAIT_S", "0.25")
    dog = Watchdog(60.0)
    try:
        assert dog.teardown_wait_s == 0.25 != params.RELIABILITY.teardown_wait_s
    finally:
        dog.close()

    def waits(t):
        responder = LivenessResponder(t)
        try:
            return responder.teardown_wait_s
        finally:
            responder.close()

    assert run_ranks(2, waits) == [0.25, 0.25]


def test_the_runtimes_waits_and_reroute_bound_come_from_the_environment(monkeypatch):
    from horotopo.api.runtime import Runtime
    from horotopo.api.settings import Settings

    assert Settings.from_env({}).reroute_s == params.RUNTIME.reroute_max_s
    env = {"HOROTOPO_RUNTIME_REROUTE_MAX_S": "2.5"}
    assert Settings.from_env(env).reroute_s == 2.5
    # half the stall check when that is shorter; never without the stall check
    assert Settings.from_env(dict(env, HOROVOD_STALL_CHECK_TIME_SECONDS="4")).reroute_s == 2.0
    assert Settings.from_env(dict(env, HOROVOD_STALL_CHECK_DISABLE="1")).reroute_s == float("inf")
    monkeypatch.setenv("HOROTOPO_RUNTIME_HANDLE_CHECK_S", "0.05")
    monkeypatch.setenv("HOROTOPO_RUNTIME_START_CHECK_S", "0.03")
    runtime = Runtime()
    assert (runtime.queue.check_s, runtime._start_check_s) == (0.05, 0.03)



def test_a_single_size_calibration_caps_the_latencies_at_the_engines_share():
    from horotopo.algorithms.cost import DEFAULT_COST_MODEL, calibrated_model
    from horotopo.plan import plan_from_trees

    plan = plan_from_trees(2, [(0, [-1, 0], [-1, 0], 1.0)])
    prior = DEFAULT_COST_MODEL.with_(mpi_latency_s=1.0, tree_latency_s=1.0)
    sizes, tree_s, mpi_s = [1 << 20], [0.02], [0.01]
    model = calibrated_model(plan, sizes, tree_s, mpi_s, prior=prior)
    share = params.ENGINE.single_size_latency_share
    assert (model.mpi_latency_s, model.tree_latency_s) == (share * 0.01, share * 0.02)
    quarter = config.engine_params({"HOROTOPO_ENGINE_SINGLE_SIZE_LATENCY_SHARE": "0.25"})
    model = calibrated_model(plan, sizes, tree_s, mpi_s, prior=prior, params=quarter)
    assert (model.mpi_latency_s, model.tree_latency_s) == (0.25 * 0.01, 0.25 * 0.02)
