"""Every environment variable horotopo and its launcher read, in one registry.

Each :class:`Setting` has a name, a type, a default, the values it allows and a one-line doc.
Code reads a variable only through :func:`get` (``config.get("HOROVOD_CYCLE_TIME")``), which
parses and checks it: a bad value raises :class:`ConfigError` naming the variable, the value
and what is allowed, never a bare ``could not convert string to float``. Tests pass ``env=`` to
read from a mapping of their own instead of ``os.environ``.

Conventions that hold for every setting:

- unset, or set to an empty or blank string, means the default (except for a setting declared
  ``blank_ok=False``, where a blank value is an error: an empty path is a mistake, not a
  choice);
- booleans are strict: ``1/true/yes/on`` or ``0/false/no/off`` in any case; anything else
  raises (``HOROVOD_STALL_CHECK_DISABLE=false`` means *do* check);
- a setting may have aliases (the ``HOROTOPO_*`` spellings that ``horotopo-run`` sets next to
  Horovod's ``HOROVOD_*`` ones); when the name and an alias are both set they must agree.

``python -m horotopo config`` prints the effective settings and where each came from;
``--markdown`` prints docs/settings.md, whose table comes from :func:`markdown_table`.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

from . import params as _params

__all__ = ["ConfigError", "Setting", "Effective", "SETTINGS", "get", "lookup", "parse",
           "declared", "effective", "markdown_table", "launcher_size", "LAUNCHER_SIZE_VARIABLES",
           "TRUE_WORDS", "FALSE_WORDS", "LOG_LEVELS", "PARAMETER_SETTINGS", "parameters",
           "engine_params", "adapt_params", "probe_params", "planner_params", "runtime_params",
           "reliability_params", "reliability_params_or_defaults", "parameter_variable",
           "parameters_markdown"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: Horovod's log levels, lower case as ``get`` returns them (``horotopo-run --log-level``).
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


class ConfigError(ValueError):
    """An environment variable (or setting) holds a value that cannot work."""


@dataclass(frozen=True)
class Setting:
    """One environment variable: how to parse it and what it means.

    ``kind`` is ``float``, ``int``, ``bool``, ``choice``, ``str`` (a path or a command) or
    ``numbers`` (a comma-separated list of ``item`` numbers, ``int`` or ``float``).
    ``lo``/``hi`` bound numbers (``lo_open`` excludes ``lo``, ``hi_open`` ``hi``); ``choices`` lists a choice's
    values (compared in lower case). ``default`` is what :func:`get` returns when unset; ``None``
    means "not set" and is explained by ``default_doc``.
    """

    name: str
    kind: str
    default: Any
    doc: str
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    choices: Tuple[str, ...] = ()
    aliases: Tuple[str, ...] = ()
    blank_ok: bool = True
    default_doc: str = ""
    unit: str = ""
    item: str = ""
    #: ``(parameter object, field)`` for a setting that overrides a field of
    #: :mod:`horotopo.params` (the object checks the value: :func:`parameters`).
    parameter: Optional[Tuple[Type[Any], str]] = None

    def allowed(self) -> str:
        """What the setting accepts, in words (for errors and the README table)."""
        if self.kind == "bool":
            return "/".join(TRUE_WORDS) + " or " + "/".join(FALSE_WORDS)
        if self.kind == "choice":
            return ", ".join(self.choices)
        if self.kind in ("float", "int"):
            what = "a number" if self.kind == "float" else "a whole number"
            bounds = []
            if self.lo is not None:
                bounds.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
            if self.hi is not None:
                bounds.append(f"{'<' if self.hi_open else '<='} {self.hi:g}")
            return what + (" " + " and ".join(bounds) if bounds else "")
        if self.kind == "numbers":
            return ("numbers" if self.item == "float" else "whole numbers") + ", comma-separated"
        return "a non-empty string" if not self.blank_ok else "any string"

    def show_default(self) -> str:
        """The default as a reader would write it."""
        if self.default is None:
            return self.default_doc or "unset"
        if self.kind == "bool":
            return "1" if self.default else "0"
        return _show_parameter(self.default)

    def parse(self, raw: str, source: Optional[str] = None) -> Any:
        """``raw`` (a set, non-blank value) as this setting's type, checked.

        ``source`` is the variable it was read from (an alias, say), named in the error.

        Raises
        ------
        ConfigError
            Naming the variable, the value and what is allowed.
        """
        name = source or self.name
        text = raw.strip()

        def bad() -> ConfigError:
            return ConfigError(f"{name}={raw!r}: must be {self.allowed()}")

        if self.kind == "bool":
            low = text.lower()
            if low in TRUE_WORDS:
                return True
            if low in FALSE_WORDS:
                return False
            raise ConfigError(f"{name}={raw!r}: must be one of "
                              f"{', '.join(TRUE_WORDS + FALSE_WORDS)} (any case)")
        if self.kind == "choice":
            low = text.lower()
            if low not in self.choices:
                raise ConfigError(f"{name}={raw!r}: must be one of {', '.join(self.choices)} "
                                  f"(default {self.show_default()})")
            return low
        if self.kind == "numbers":
            items = [part.strip() for part in text.split(",")]
            if not all(items):
                raise bad()
            return tuple(_number(item, self.item, bad) for item in items)
        if self.kind in ("float", "int"):
            value: Any = _number(text, self.kind, bad)
        elif self.kind == "str":
            return raw
        else:  # a registry entry with a kind this module does not know: a bug here
            raise AssertionError(f"setting {self.name}: unknown kind {self.kind!r}")
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            raise bad()
        if self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)):
            raise bad()
        return value


def _number(text: str, kind: str, bad: Callable[[], ConfigError]) -> Any:
    """``text`` as a finite float (``kind == "float"``) or a base-10 int, else ``bad()``."""
    try:
        value = float(text) if kind == "float" else int(text, 10)
    except ValueError:
        raise bad() from None
    if not math.isfinite(value):
        raise bad()
    return value


def _registry(*settings: Setting) -> Dict[str, Setting]:
    out: Dict[str, Setting] = {}
    for s in settings:
        for key in (s.name,) + s.aliases:
            if key in out:
                raise AssertionError(f"{key} is declared twice")
            out[key] = s
    return out


def _launcher_alias(name: str) -> Tuple[str, ...]:
    # horotopo-run sets HOROTOPO_<X> next to HOROVOD_<X> for each tuning flag; both are read.
    return ("HOROTOPO_" + name[len("HOROVOD_"):],)


def parameter_variable(cls: Type[Any], field_name: str) -> str:
    """The variable that overrides field ``field_name`` of parameter object ``cls``:
    ``HOROTOPO_<CONCERN>_<FIELD>`` (``ProbeParams.slow_ratio``: ``HOROTOPO_PROBE_SLOW_RATIO``)."""
    return f"HOROTOPO_{cls.__name__[:-len('Params')].upper()}_{field_name.upper()}"


#: Earlier spellings of parameter variables, still read beside the scheme's name.
_PARAMETER_ALIASES: Dict[str, Tuple[str, ...]] = {
    "HOROTOPO_ADAPT_TRIAL_CALLS": ("HOROTOPO_ADAPT_TRIAL",)}


def _parameter_setting(cls: Type[Any], field: "dataclasses.Field[Any]",
                       kind: Any) -> Setting:
    item = ""
    if typing.get_origin(kind) is tuple:
        item = "float" if float in typing.get_args(kind) else "int"
        kind_name = "numbers"
    elif kind in (bool, int, float):
        kind_name = kind.__name__
    else:  # a parameter of a type the environment cannot spell: a bug in horotopo/params.py
        raise AssertionError(f"{cls.__name__}.{field.name}: no setting for type {kind!r}")
    name = parameter_variable(cls, field.name)
    return Setting(name, kind_name, field.default,
                   f"{cls.__name__}.{field.name} (see Parameters below).",
                   item=item, aliases=_PARAMETER_ALIASES.get(name, ()),
                   parameter=(cls, field.name))


def _parameter_settings() -> List[Setting]:
    """A setting for every field of every parameter object, typed as the field."""
    out = []
    for cls in _params.PARAMETER_OBJECTS:
        kinds = typing.get_type_hints(cls)
        out += [_parameter_setting(cls, f, kinds[f.name]) for f in dataclasses.fields(cls)]
    return out


_S = Setting
#: Every variable, in the order of the README table, then the parameter objects' fields.
#: Aliases map to their setting too.
SETTINGS: Dict[str, Setting] = _registry(
    # -- Horovod's knobs (the runtime's control cycle) --------------------------------------
    _S("HOROVOD_CYCLE_TIME", "float", 1.0, "Milliseconds between two control cycles of the "
       "background thread.", lo=0.0, aliases=_launcher_alias("HOROVOD_CYCLE_TIME"), unit="ms"),
    _S("HOROVOD_FUSION_THRESHOLD", "int", 128 * 1024 * 1024, "Largest fusion buffer in bytes; "
       "0 turns fusion off.", lo=0, aliases=_launcher_alias("HOROVOD_FUSION_THRESHOLD"),
       unit="bytes"),
    _S("HOROVOD_CACHE_CAPACITY", "int", 1024, "Entries in the response cache; 0 negotiates "
       "every request through rank 0.", lo=0,
       aliases=_launcher_alias("HOROVOD_CACHE_CAPACITY")),
    _S("HOROVOD_DYNAMIC_PROCESS_SETS", "bool", False, "Allow hvd.add_process_set and "
       "hvd.remove_process_set after init (hvd.init(process_sets='dynamic') does too)."),
    _S("HOROVOD_STALL_CHECK_DISABLE", "bool", False, "Turn off the stall check (rank 0's "
       "warning about tensors that only some ranks submitted)."),
    _S("HOROVOD_STALL_CHECK_TIME_SECONDS", "float", 60.0, "Seconds a tensor may wait for the "
       "other ranks before rank 0 warns, naming the missing ranks; 0 turns the check off.",
       lo=0.0, unit="s"),
    _S("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "float", 300.0, "Seconds a tensor may wait for "
       "the other ranks before the job shuts down, every rank failing its pending ops with "
       "the stall report (which ranks submitted what); 0 never, as Horovod's default. Runs "
       "with the stall check.", lo=0.0, unit="s"),
    _S("HOROVOD_LOG_LEVEL", "choice", None, "Level of the 'horotopo' logger in every rank "
       "(trace is debug).", choices=LOG_LEVELS, aliases=_launcher_alias("HOROVOD_LOG_LEVEL"),
       default_doc="unset: the logger is left as the program configured it"),
    _S("HOROVOD_START_TIMEOUT", "float", 120.0, "Seconds init() waits for every rank to "
       "arrive; then it fails naming the ranks that did not.", lo=0.0, lo_open=True,
       aliases=_launcher_alias("HOROVOD_START_TIMEOUT"), unit="s"),
    _S("HOROVOD_TIMELINE", "str", None, "Write a Chrome-trace JSON timeline of every op to "
       "this file.", aliases=_launcher_alias("HOROVOD_TIMELINE"), blank_ok=False,
       default_doc="unset: no timeline"),
    _S("HOROVOD_TIMELINE_MARK_CYCLES", "bool", False, "Mark each control cycle in the "
       "timeline.", aliases=_launcher_alias("HOROVOD_TIMELINE_MARK_CYCLES")),
    _S("HOROVOD_HIERARCHICAL_ALLREDUCE", "bool", False, "Run every allreduce as Horovod's "
       "hierarchical allreduce (reduce-scatter in each host, ring allreduce of each shard "
       "across hosts, allgather in each host; hosts by processor name) instead of the "
       "algorithm the engine chooses."),
    # -- horotopo's own ---------------------------------------------------------------------
    _S("HOROTOPO_PROBE", "choice", "quick", "What init() measures: quick probe, full probe, "
       "or off (a ring plan over a uniform model).", choices=("off", "quick", "full")),
    _S("HOROTOPO_HIERARCHY", "choice", "auto", "Plan trees over hosts with an intra-host "
       "stage (on), over ranks (off), or hosts when a host has several ranks and there are "
       "more than 64 ranks (auto).", choices=("auto", "on", "off")),
    _S("HOROTOPO_TOPOLOGY", "str", None, "A topology JSON file to plan on instead of "
       "probing, or the name of a bundled one (racks-2x3, slow-nic, uniform-4); see "
       "docs/topology.md.", blank_ok=False, default_doc="unset: probe (HOROTOPO_PROBE)"),
    _S("HOROTOPO_ADAPT", "bool", None, "Re-plan when the engine's transfers stay slower than "
       "the plan.", default_doc="on, except with HOROTOPO_PROBE=off"),
    _S("HOROTOPO_CALIBRATE_S", "float", 1.5, "Seconds init() may spend timing the tree and "
       "MPI_Allreduce on this job's ranks (the tree-or-MPI choice starts from these timings and "
       "learns from real calls); 0 skips it (the choice then starts from the plan's model).",
       lo=0.0, unit="s"),
    _S("HOROTOPO_TIMEOUT_S", "float", 60.0, "Seconds one collective may take before the "
       "watchdog names the ranks it waits for and aborts the job.", lo=0.0, lo_open=True,
       unit="s"),
    _S("HOROTOPO_SHUTDOWN_TIMEOUT", "float", 15.0, "Seconds shutdown() waits for the "
       "background thread before it gives up on it.", lo=0.0, unit="s"),
    _S("HOROTOPO_POLL_SLEEP_US", "float", 50.0, "Microseconds a waiting MPI transport sleeps "
       "between polls after spinning; 0 blocks in MPI_Waitsome.", lo=0.0, unit="us"),
    _S("HOROTOPO_SPIN_POLLS", "int", 200, "Empty polls a waiting MPI transport spins before "
       "it starts to sleep.", lo=0),
    _S("HOROTOPO_CUDA_AWARE", "bool", None, "Whether MPI takes device pointers.",
       default_doc="unset: ask the MPI library, then self-test"),
    _S("HOROTOPO_GPU_KERNELS", "choice", "auto", "Device reduce kernels: native (fail if "
       "they cannot load), fallback (CuPy elementwise) or auto.",
       choices=("auto", "native", "fallback")),
    _S("HOROTOPO_NATIVE_DIR", "str", None, "Directory holding native/reduce.cu.",
       default_doc="unset: the repository's native/, else the installed copy"),
    _S("HOROTOPO_SIM_CPU", "int", None, "The CPU a simulation's process is pinned to "
       "(horotopo simulate and the benchmarks over SimGrid): SimGrid runs one actor thread at "
       "a time, and its hand-offs cost about 2.5x as much spread over cores; -1 leaves the "
       "process unpinned.", lo=-1, default_doc="unset: the CPU the simulation starts on"),
    _S("HOROTOPO_COSTS", "str", None, "A cost profile file (written by horotopo calibrate) "
       "whose per-message and per-byte software costs init() plans with and horotopo "
       "simulate charges.", blank_ok=False,
       default_doc="unset: ~/.cache/horotopo/costs.json when it exists, else the built-in "
                   "profile"),
    # -- the launcher (horotopo-run) ---------------------------------------------------------
    _S("HOROTOPO_MPIEXEC", "str", None, "The mpiexec horotopo-run uses.",
       default_doc="unset: the installed wheel's, else PATH's"),
    # -- torch.distributed's own, read by the "horotopo" backend (horotopo.torch.distributed) --
    _S("RANK", "int", None, "torch.distributed's rank; the horotopo backend checks it against "
       "MPI's.", lo=0, default_doc="unset: MPI's rank"),
    _S("WORLD_SIZE", "int", None, "torch.distributed's number of ranks; the horotopo backend "
       "checks it against MPI's.", lo=1, default_doc="unset: MPI's size"),
    _S("MASTER_ADDR", "str", None, "env:// rendezvous host. With it and MASTER_PORT unset, "
       "the horotopo backend's import lets env:// rendezvous over MPI (rank 0 hosts the "
       "store).", default_doc="unset: rendezvous over MPI"),
    _S("MASTER_PORT", "int", None, "env:// rendezvous port (see MASTER_ADDR).", lo=0, hi=65535,
       default_doc="unset: rendezvous over MPI"),
    _S("TORCHELASTIC_RUN_ID", "str", None, "Set by torchrun; the horotopo backend then "
       "refuses to start without MPI, saying how to launch.", default_doc="unset: not torchrun"),
    _S("LOCAL_WORLD_SIZE", "int", None, "Set by torchrun (ranks on this node); read as "
       "TORCHELASTIC_RUN_ID.", lo=0, default_doc="unset: not torchrun"),
    *_parameter_settings(),
)


def lookup(name: str) -> Setting:
    """The setting declared under ``name`` (or one of its aliases).

    Raises
    ------
    KeyError
        ``name`` is not declared here: reading an undeclared variable is a bug.
    """
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared setting: declare it in horotopo/config.py "
                       f"before reading it") from None


def _environ(env: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if env is None else env


def _read(setting: Setting, env: Mapping[str, str]) -> Tuple[Any, str, Optional[str]]:
    """``(value, source, raw)``: source is ``"default"`` or the variable it came from."""
    found: List[Tuple[str, str]] = []
    for key in (setting.name,) + setting.aliases:
        raw = env.get(key)
        if raw is None:
            continue
        if not raw.strip():
            if not setting.blank_ok:
                raise ConfigError(f"{key} is set but empty: must be {setting.allowed()}, or "
                                  f"unset ({setting.show_default()})")
            continue
        found.append((key, raw))
    if not found:
        return setting.default, "default", None
    values = [(key, raw, setting.parse(raw, key)) for key, raw in found]
    key, raw, value = values[0]
    for other, other_raw, other_value in values[1:]:
        if other_value != value:
            raise ConfigError(f"{key}={raw!r} and {other}={other_raw!r} disagree: set one, or "
                              f"both to the same value")
    return value, key, raw


#: Where MPI launchers put the number of processes of the job: MPICH's and Intel MPI's PMI,
#: Open MPI, PMIx (Open MPI 5), Slurm. Not settings: facts the launcher states.
LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")


def launcher_size(env: Optional[Mapping[str, str]] = None) -> int:
    """How many processes the MPI launcher started (1 when no launcher says), read without
    starting MPI."""
    environ = _environ(env)
    for name in LAUNCHER_SIZE_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 1


def get(name: str, env: Optional[Mapping[str, str]] = None) -> Any:
    """The value of setting ``name``: parsed from the environment, else its default.

    Parameters
    ----------
    name : str
        A declared name (or alias), e.g. ``"HOROVOD_CYCLE_TIME"``.
    env : mapping, optional
        Where to read; ``os.environ`` when omitted.

    Raises
    ------
    ConfigError
        A bad value, naming the variable, the value and what is allowed.
    KeyError
        ``name`` is not declared.
    """
    return _read(lookup(name), _environ(env))[0]


def parse(name: str, raw: Optional[str]) -> Any:
    """``raw`` parsed as setting ``name`` would be (``None`` or blank: the default)."""
    return get(name, {} if raw is None else {name: raw})


@dataclass(frozen=True)
class Effective:
    """One setting as a process sees it: its value and where the value came from."""

    setting: Setting
    value: Any
    source: str                     # "default", "environment" or "error" (a bad value)
    variable: Optional[str] = None  # the variable that set it (the name or an alias)
    raw: Optional[str] = None       # the text as set (None for a default)
    error: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.setting.name, "value": self.value, "source": self.source,
                "variable": self.variable, "raw": self.raw, "default": self.setting.default,
                "type": self.setting.kind,
                "allowed": self.setting.allowed(), "doc": self.setting.doc,
                "aliases": list(self.setting.aliases), "error": self.error}


def declared() -> List[Setting]:
    """Each setting once, in declaration order."""
    seen: Dict[str, Setting] = {}
    for s in SETTINGS.values():
        seen.setdefault(s.name, s)
    return list(seen.values())


def effective(env: Optional[Mapping[str, str]] = None) -> List[Effective]:
    """Every setting's effective value; a bad value is reported in ``error``, not raised.

    A parameter variable's value is also checked by its object, together with the other
    variables of that object (a smallest chunk above the largest is an error of both).
    """
    where = _environ(env)
    out = []
    for s in declared():
        try:
            value, variable, raw = _read(s, where)
            if raw is None:
                out.append(Effective(s, value, "default"))
            else:
                out.append(Effective(s, value, "environment", variable, raw))
        except ConfigError as exc:
            out.append(Effective(s, None, "error", error=str(exc)))
    for cls in _params.PARAMETER_OBJECTS:
        rows = [i for i, row in enumerate(out) if row.setting.parameter is not None
                and row.setting.parameter[0] is cls]
        if any(out[i].source == "error" for i in rows):
            continue
        try:
            parameters(cls, where)
        except ConfigError as exc:
            for i in rows:
                if out[i].source == "environment":
                    out[i] = Effective(out[i].setting, None, "error", error=str(exc))
    return out


#: The variable of every field of every parameter object (``HOROTOPO_<CONCERN>_<FIELD>``).
PARAMETER_SETTINGS: Dict[Type[Any], Dict[str, str]] = {
    cls: {f.name: parameter_variable(cls, f.name) for f in dataclasses.fields(cls)}
    for cls in _params.PARAMETER_OBJECTS}

_P = TypeVar("_P")


def parameters(cls: Type[_P], env: Optional[Mapping[str, str]] = None) -> _P:
    """Parameter object ``cls`` (:mod:`horotopo.params`): its defaults, with each field whose
    variable (:func:`parameter_variable`) the environment sets overridden.

    Raises
    ------
    ConfigError
        A variable holds a value of the wrong type, or one the object refuses, or variables
        hold values that do not fit together (a smallest chunk above the largest), naming the
        variables.
    """
    where = _environ(env)
    values: Dict[str, Any] = {}
    given: List[str] = []
    for field_name, variable in PARAMETER_SETTINGS[cls].items():
        value, source, raw = _read(lookup(variable), where)
        if raw is not None:
            values[field_name] = value
            given.append(f"{source}={raw!r}")
    try:
        return cls(**values)
    except ValueError as exc:
        raise ConfigError(f"{' and '.join(given)}: {exc}") from None


def engine_params(env: Optional[Mapping[str, str]] = None) -> _params.EngineParams:
    """The engine's parameters as this environment sets them (see :func:`parameters`)."""
    return parameters(_params.EngineParams, env)


def adapt_params(env: Optional[Mapping[str, str]] = None) -> _params.AdaptParams:
    """The adaptivity's parameters as this environment sets them (see :func:`parameters`)."""
    return parameters(_params.AdaptParams, env)


def probe_params(env: Optional[Mapping[str, str]] = None) -> _params.ProbeParams:
    """The probe's parameters as this environment sets them (see :func:`parameters`)."""
    return parameters(_params.ProbeParams, env)


def planner_params(env: Optional[Mapping[str, str]] = None) -> _params.PlannerParams:
    """The planner's parameters as this environment sets them (see :func:`parameters`)."""
    return parameters(_params.PlannerParams, env)


def runtime_params(env: Optional[Mapping[str, str]] = None) -> _params.RuntimeParams:
    """The control plane's and transports' waits as this environment sets them (see
    :func:`parameters`)."""
    return parameters(_params.RuntimeParams, env)


def reliability_params(env: Optional[Mapping[str, str]] = None) -> _params.ReliabilityParams:
    """The timeouts on peers as this environment sets them (see :func:`parameters`)."""
    return parameters(_params.ReliabilityParams, env)


def reliability_params_or_defaults(
        env: Optional[Mapping[str, str]] = None) -> _params.ReliabilityParams:
    """:func:`reliability_params`, or the defaults when a variable of them is bad: for the
    paths that end the job or report a bad setting, which that variable must not stop (the
    report names it, or init() already did)."""
    try:
        return reliability_params(env)
    except ConfigError:
        return _params.RELIABILITY


def _show_parameter(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(_show_parameter(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def parameters_markdown() -> str:
    """The tables of docs/settings.md's parameter section: every field of every parameter
    object, its default, the variable that overrides it and why that value."""
    out: List[str] = []
    for cls in _params.PARAMETER_OBJECTS:
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        out += [f"### `{cls.__name__}`", "", doc, "",
                "| field | default | variable | why this value |", "| --- | --- | --- | --- |"]
        for f in dataclasses.fields(cls):
            setting = lookup(parameter_variable(cls, f.name))
            variable = " or ".join(f"`{v}`" for v in (setting.name,) + setting.aliases)
            cells = [f"`{f.name}`", _show_parameter(f.default), variable, f.metadata["why"]]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def markdown_table() -> str:
    """The settings table of docs/settings.md: a Markdown table of every setting but the
    parameter objects' fields (:func:`parameters_markdown` lists those)."""
    rows = ["| variable | type | default | allowed | what it does |",
            "| --- | --- | --- | --- | --- |"]
    for s in declared():
        if s.parameter is not None:
            continue
        name = f"`{s.name}`" + "".join(f" (or `{a}`)" for a in s.aliases)
        kind = s.kind + (f" ({s.unit})" if s.unit else "")
        cells = [name, kind, s.show_default(), s.allowed(), s.doc]
        # a bare "|" inside a cell would split it into two columns
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
