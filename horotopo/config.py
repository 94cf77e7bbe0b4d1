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
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

from . import params as _params

__all__ = ["ConfigError", "Setting", "Effective", "SETTINGS", "get", "lookup", "parse",
           "declared", "effective", "markdown_table", "launcher_size", "LAUNCHER_SIZE_VARIABLES",
           "TRUE_WORDS", "FALSE_WORDS", "LOG_LEVELS", "PARAMETER_SETTINGS", "parameters",
           "engine_params", "adapt_params", "probe_params", "planner_params",
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

    ``kind`` is ``float``, ``int``, ``bool``, ``choice`` or ``str`` (a path or a command).
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
        return "a non-empty string" if not self.blank_ok else "any string"

    def show_default(self) -> str:
        """The default as a reader would write it."""
        if self.default is None:
            return self.default_doc or "unset"
        if self.kind == "bool":
            return "1" if self.default else "0"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)

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
        if self.kind == "float":
            try:
                value: Any = float(text)
            except ValueError:
                raise bad() from None
            if not math.isfinite(value):
                raise bad()
        elif self.kind == "int":
            try:
                value = int(text, 10)
            except ValueError:
                raise bad() from None
        elif self.kind == "str":
            return raw
        else:  # a registry entry with a kind this module does not know: a bug here
            raise AssertionError(f"setting {self.name}: unknown kind {self.kind!r}")
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            raise bad()
        if self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)):
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


_S = Setting
#: Every variable, in the order of the README table. Aliases map to their setting too.
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
    _S("HOROTOPO_ADAPT_THRESHOLD", "float", _params.ADAPT.threshold, "Fraction below its "
       "size's baseline efficiency at which an allreduce counts as slow for re-planning "
       "(AdaptParams.threshold).", lo=0.0, lo_open=True, hi=1.0, hi_open=True),
    _S("HOROTOPO_ADAPT_CONSECUTIVE", "int", _params.ADAPT.consecutive, "Slow allreduces in a "
       "row that trigger a re-plan (AdaptParams.consecutive).", lo=1),
    _S("HOROTOPO_ADAPT_TRIAL", "int", _params.ADAPT.trial_calls, "Tree allreduces a re-plan's "
       "new plan is timed for before it is kept or reverted; 0 keeps every re-plan "
       "(AdaptParams.trial_calls).", lo=0),
    _S("HOROTOPO_PLANNER_MIN_CHUNK", "int", _params.PLANNER.min_chunk, "Smallest chunk the "
       "planner gives a tree (PlannerParams.min_chunk).", lo=1, unit="bytes"),
    _S("HOROTOPO_PLANNER_MAX_CHUNK", "int", _params.PLANNER.max_chunk, "Largest chunk the "
       "planner gives a tree (PlannerParams.max_chunk).", lo=1, unit="bytes"),
    _S("HOROTOPO_PLANNER_WINDOW_BYTES", "int", _params.PLANNER.window_bytes, "Scratch per "
       "reduce child and tree of the automatic window; the plan records it and the engine runs "
       "its windows (PlannerParams.window_bytes).", lo=1, unit="bytes"),
    _S("HOROTOPO_PLANNER_RANK_WINDOW_BYTES", "int", _params.PLANNER.rank_window_bytes,
       "Scratch per reduce child over all of a plan's trees, past which the automatic window "
       "shrinks (PlannerParams.rank_window_bytes).", lo=1, unit="bytes"),
    _S("HOROTOPO_PLANNER_TREE_TIE", "float", _params.PLANNER.tree_tie, "Fraction of the best "
       "fair sum within which fewer trees win the fair-subset search (PlannerParams.tree_tie).",
       lo=0.0, hi=1.0, hi_open=True),
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
    """Every setting's effective value; a bad value is reported in ``error``, not raised."""
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
    return out


#: The fields of the parameter objects that a user may override, and the variable of each.
PARAMETER_SETTINGS: Dict[Type[Any], Dict[str, str]] = {
    _params.EngineParams: {},
    _params.AdaptParams: {"threshold": "HOROTOPO_ADAPT_THRESHOLD",
                          "consecutive": "HOROTOPO_ADAPT_CONSECUTIVE",
                          "trial_calls": "HOROTOPO_ADAPT_TRIAL"},
    _params.ProbeParams: {},
    _params.PlannerParams: {"min_chunk": "HOROTOPO_PLANNER_MIN_CHUNK",
                            "max_chunk": "HOROTOPO_PLANNER_MAX_CHUNK",
                            "window_bytes": "HOROTOPO_PLANNER_WINDOW_BYTES",
                            "rank_window_bytes": "HOROTOPO_PLANNER_RANK_WINDOW_BYTES",
                            "tree_tie": "HOROTOPO_PLANNER_TREE_TIE"},
    _params.RuntimeParams: {},
    _params.ReliabilityParams: {},
}

_P = TypeVar("_P")


def parameters(cls: Type[_P], env: Optional[Mapping[str, str]] = None) -> _P:
    """Parameter object ``cls`` (:mod:`horotopo.params`): its defaults, with the fields that
    :data:`PARAMETER_SETTINGS` declares overridden from the environment.

    Raises
    ------
    ConfigError
        A variable holds a value the object refuses, or variables hold values that do not fit
        together (a smallest chunk above the largest), naming the variables.
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


def _show_parameter(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(_show_parameter(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def parameters_markdown() -> str:
    """The tables of docs/settings.md's parameter section: every field of every parameter
    object, its default, the variable that overrides it (if any) and why that value."""
    out: List[str] = []
    for cls in _params.PARAMETER_OBJECTS:
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        out += [f"### `{cls.__name__}`", "", doc, "",
                "| field | default | variable | why this value |", "| --- | --- | --- | --- |"]
        overrides = PARAMETER_SETTINGS[cls]
        for f in dataclasses.fields(cls):
            variable = f"`{overrides[f.name]}`" if f.name in overrides else "-"
            cells = [f"`{f.name}`", _show_parameter(f.default), variable, f.metadata["why"]]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def markdown_table() -> str:
    """The settings table of docs/settings.md (a Markdown table of every setting)."""
    rows = ["| variable | type | default | allowed | what it does |",
            "| --- | --- | --- | --- | --- |"]
    for s in declared():
        name = f"`{s.name}`" + "".join(f" (or `{a}`)" for a in s.aliases)
        kind = s.kind + (f" ({s.unit})" if s.unit else "")
        cells = [name, kind, s.show_default(), s.allowed(), s.doc]
        # a bare "|" inside a cell would split it into two columns
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
