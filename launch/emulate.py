"""An emulated cluster on one machine: real, shaped networks between network namespaces.

From a declared topology (hosts, switches, links; see docs/topology.md), :class:`EmulatedCluster`
builds, as root:

- one network namespace per node, hosts and switches alike, named ``<prefix>-<node>``; in each
  a Linux bridge ``<prefix>br`` that holds the node's address (10.77.0.0/16). A host runs its
  ranks under its own hostname (``unshare --uts``);
- one veth pair per link, one end in each node's namespace, enslaved to that node's bridge;
- a token bucket (``tbf``) on the egress of each veth end, at the rate of that direction of the
  link (``gbps`` or ``[a->b, b->a]``). A switch is its bridge, so a packet from host ``a`` to
  host ``b`` crosses exactly the shaped links of the topology's route;
- a head namespace ``<prefix>-head`` wired without shaping to the first switch: mpiexec runs
  there, so hydra's control traffic is not counted against the links.

Because each node forwards on a bridge, a host joined to several links forwards like a switch
and a switch answers on its own address, which lets :meth:`EmulatedCluster.check` measure every
link direction alone (switch to host, host to switch, switch to switch).

The working MPICH recipe (PyPI ``mpich`` wheel 5.0.2, ch4:ucx), found by experiment::

    ip netns exec <prefix>-head mpiexec -launcher ssh -launcher-exec <launch.sh> \\
        -iface <prefix>br -hosts <ip of rank 0>,<ip of rank 1>,... -n N \\
        -genv MPIR_CVAR_NOLOCAL 1 -genv MPIR_CVAR_CH4_NETMOD ucx \\
        -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES <prefix>br  CMD...

with ``HYDRA_LAUNCHER_AUTOFORK=0`` in mpiexec's environment. Every rank has an address of its
own (an extra address on its host's bridge), so hydra places rank ``i`` on "host" ``i`` and the
launcher script (hydra calls it as ``launch.sh -x HOST CMD...``, like ssh) maps that address
to ``ip netns exec <prefix>-<host> unshare --uts sh -c 'hostname <host>; CMD...'``. The
environment passes through because nothing really goes over ssh. ``-iface`` makes hydra
advertise the head's address for its control port; the same interface name exists in every
namespace, which the proxies need. ``MPIR_CVAR_NOLOCAL=1`` and ``UCX_TLS=tcp,self`` stop MPICH
from moving data through shared memory, so ranks on different hosts always use TCP over the
bridges. For Open MPI the equivalent (``--mca pml ob1 --mca btl self,tcp``, the launcher as
``plm_ssh_agent``) is built by :func:`horotopo_launch.mpi.emulated_command_line`.

Every name this creates starts with the prefix, and a lock file per prefix says whether a live
process owns it, so a run after a crash removes its own leftovers and nothing else.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import networkx as nx

from horotopo.topology import Topology, TopologyError, from_dict, load

from .mpi import MPI, LaunchError, detect, emulated_command_line

__all__ = ["available", "EmulatedCluster", "EmulationError", "LinkRate", "cleanup",
           "leftovers", "DEFAULT_PREFIX"]

DEFAULT_PREFIX = "ht"
SUBNET = "10.77"
MTU = 9000
MAX_GBPS = 2.0
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,5}$")
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class EmulationError(RuntimeError):
    """The emulated cluster cannot be built or used; the message says why."""


class LinkRate(NamedTuple):
    """One row of :meth:`EmulatedCluster.check`."""

    link: str
    direction: str
    configured_gbps: float
    measured_gbps: float

    @property
    def error(self) -> float:
        """Relative deviation of the measurement from the configuration."""
        return abs(self.measured_gbps - self.configured_gbps) / self.configured_gbps


def _run(cmd: Sequence[str], check: bool = True, timeout: float = 30.0) -> str:
    proc = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise EmulationError(f"`{' '.join(cmd)}` failed ({proc.returncode}): "
                             f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@lru_cache(maxsize=1)
def available() -> Tuple[bool, str]:
    """Whether this machine can build emulated clusters, and if not, why.

    Needs root, ``ip`` with netns support, ``tc`` with ``tbf``, veth and bridge devices. The
    answer is found by trying (a throw-away namespace) and cached.
    """
    if sys.platform != "linux":
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, f"needs root to create network namespaces (running as uid {os.geteuid()})"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed (iproute2 / util-linux)"
    ns = f"htavail{os.getpid()}"
    try:
        _run(["ip", "netns", "add", ns])
    except (EmulationError, OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot create a network namespace: {exc}"
    try:
        for what, cmd in (
                ("a bridge", ["ip", "-n", ns, "link", "add", "b0", "type", "bridge"]),
                ("a veth pair", ["ip", "-n", ns, "link", "add", "v0", "type", "veth",
                                 "peer", "name", "v1"]),
                ("tc tbf shaping", ["tc", "-n", ns, "qdisc", "add", "dev", "v0", "root",
                                    "tbf", "rate", "100mbit", "burst", "64k", "latency",
                                    "20ms"]),
                ("unshare --uts", ["ip", "netns", "exec", ns, "unshare", "--uts", "true"])):
            try:
                _run(cmd)
            except (EmulationError, OSError, subprocess.TimeoutExpired) as exc:
                return False, f"cannot create {what}: {exc}"
    finally:
        _run(["ip", "netns", "del", ns], check=False)
    return True, "root, ip netns, bridges, veth and tc tbf all work"


# ---------------------------------------------------------------------------------------------
# the wiring plan: pure data computed from the topology


@dataclass(frozen=True)
class _Node:
    name: str
    switch: bool
    ns: str
    ip: str


@dataclass(frozen=True)
class _Link:
    a: str
    b: str
    gbps_ab: float
    gbps_ba: float
    dev: str  # the veth end's name, the same on both sides (each lives in its own namespace)


def _node_ip(k: int) -> str:
    return f"{SUBNET}.{k // 250}.{k % 250 + 1}"


def _rank_ip(i: int) -> str:
    return f"{SUBNET}.{128 + i // 250}.{i % 250 + 1}"


HEAD_IP = f"{SUBNET}.127.254"


def _declared_doc(topology: Union[str, Path, Mapping[str, Any], Topology]) -> Dict[str, Any]:
    if isinstance(topology, Topology):
        doc = topology.to_json()
    elif isinstance(topology, Mapping):
        doc = dict(topology)
        from_dict(doc)  # validates, with errors that name the field
    else:
        doc = load(topology).to_json()
    if "links" not in doc:
        raise EmulationError("only a declared topology (hosts, switches, links) can be emulated; "
                             "this one is a measured matrix")
    return doc


def _wiring(doc: Mapping[str, Any], prefix: str) -> Tuple[List[_Node], List[_Link]]:
    switches = list(doc.get("switches", []))
    names: List[str] = list(switches)
    for link in doc["links"]:
        for end in link["ends"]:
            if end not in names:
                names.append(end)
    for name in names:
        if not _NODE_RE.match(name):
            raise EmulationError(f"node name {name!r} cannot name a namespace: use letters, "
                                 f"digits, '_', '.', '-' (at most 40)")
    if len(names) > 250 or len(doc["ranks"]) > 250:
        raise EmulationError(f"at most 250 nodes and 250 ranks can be emulated, got "
                             f"{len(names)} nodes and {len(doc['ranks'])} ranks")
    graph = nx.MultiGraph()
    graph.add_nodes_from(names)
    graph.add_edges_from(tuple(link["ends"]) for link in doc["links"])
    if graph.number_of_edges() != graph.number_of_nodes() - 1:
        cycle = nx.find_cycle(graph)
        loop = " - ".join([str(e[0]) for e in cycle] + [str(cycle[0][0])])
        raise EmulationError(f"the topology has a loop ({loop}); bridged Ethernet needs a tree "
                             f"of links, so it cannot be emulated")
    switch_set = set(switches)
    nodes = [_Node(name, name in switch_set, f"{prefix}-{name}", _node_ip(k))
             for k, name in enumerate(names)]
    links = []
    unshaped_latency = []
    for k, link in enumerate(doc["links"]):
        gbps = link["gbps"]
        ab, ba = (gbps if isinstance(gbps, list) else [gbps, gbps])
        for rate in (ab, ba):
            if rate > MAX_GBPS:
                raise EmulationError(f"link {link['ends'][0]}-{link['ends'][1]}: {rate} gbps is "
                                     f"more than one machine can emulate faithfully (at most "
                                     f"{MAX_GBPS}); scale the topology down")
        if link.get("latency_ms"):
            unshaped_latency.append(f"{link['ends'][0]}-{link['ends'][1]}")
        links.append(_Link(link["ends"][0], link["ends"][1], float(ab), float(ba),
                           f"{prefix}l{k}"))
    if unshaped_latency:
        warnings.warn(f"latency_ms is not emulated, only rates are shaped (links "
                      f"{', '.join(unshaped_latency)})", stacklevel=3)
    return nodes, links


def _tbf(gbps: float) -> List[str]:
    rate_Bps = gbps * 1e9 / 8
    # A bucket of 2 ms (at least a few jumbo/GSO frames) keeps the rate exact over a
    # millisecond timer without letting bursts distort a measurement of a second or more.
    burst = max(int(rate_Bps * 0.002), 4 * 65536)
    return ["tbf", "rate", f"{int(gbps * 1e9)}bit", "burst", str(burst), "latency", "50ms"]


# ---------------------------------------------------------------------------------------------
# leftovers and locking


def _lock_path(prefix: str) -> Path:
    return Path(tempfile.gettempdir()) / f"horotopo-emulate-{prefix}.lock"


def leftovers(prefix: str) -> Dict[str, List[str]]:
    """Namespaces named ``<prefix>-*``, and devices of this module's naming in the root
    namespace (there should never be any), for cleaning up and for tests."""
    spaces = [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).splitlines()
              if line.strip()]
    links_out = _run(["ip", "-o", "link", "show"], check=False)
    links = [m.group(1) for m in re.finditer(r"^\d+:\s+([^:@\s]+)", links_out, re.M)]
    # Only names of the shapes this module makes: another device that happens to start with
    # the same letters (say ht0) is not ours.
    ours = re.compile(rf"^{re.escape(prefix)}(br|h|l\d+)$")
    return {"namespaces": [s for s in spaces if s.startswith(prefix + "-")],
            "links": [name for name in links if ours.match(name)]}


def _kill_namespace_processes(ns: str) -> None:
    # These are processes this tool started in its own namespace (ranks, proxies, probes).
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if not _run(["ip", "netns", "pids", ns], check=False).split():
                return
            time.sleep(0.05)


def cleanup(prefix: str) -> List[str]:
    """Remove every namespace named ``<prefix>-*`` (ending its processes); return their names.

    Every device lives inside those namespaces (veths are created straight into them), so
    this removes the devices too. Only for a prefix that no live process owns (see
    :class:`EmulatedCluster`).
    """
    found = leftovers(prefix)["namespaces"]
    for ns in found:
        _kill_namespace_processes(ns)
        _run(["ip", "netns", "del", ns], check=False)
    return found


# ---------------------------------------------------------------------------------------------


class EmulatedCluster:
    """A declared topology built out of namespaces, bridges, veths and tc (see module doc).

    Use it as a context manager: ``__enter__`` builds it (removing stale leftovers of the same
    prefix first), ``__exit__`` always tears it down. While it is up, SIGTERM and SIGHUP raise
    ``SystemExit`` in the main thread so that the teardown runs on a kill as well as on Ctrl-C.

    Parameters
    ----------
    topology : path, dict or Topology
        A declared topology (``links`` and ``switches``). Its link graph must be a tree.
    prefix : str
        Starts every namespace and device name; 1 to 6 lowercase letters or digits.
    mpi : MPI, optional
        The launcher to use for :meth:`run`; detected when first needed.
    """

    def __init__(self, topology: Union[str, Path, Mapping[str, Any], Topology],
                 prefix: str = DEFAULT_PREFIX, mpi: Optional[MPI] = None) -> None:
        if not _PREFIX_RE.match(prefix):
            raise EmulationError(f"prefix {prefix!r}: use 1 to 6 lowercase letters or digits, "
                                 f"starting with a letter")
        try:
            self.doc = _declared_doc(topology)
        except TopologyError as exc:
            raise EmulationError(str(exc)) from None
        self.prefix = prefix
        self.nodes, self.links = _wiring(self.doc, prefix)
        self.ranks: List[str] = list(self.doc["ranks"])
        self._node = {n.name: n for n in self.nodes}
        self.head_ns = f"{prefix}-head"
        self.iface = f"{prefix}br"
        self.workdir = Path(tempfile.gettempdir()) / f"horotopo-emulate-{prefix}"
        self.launcher = self.workdir / "launch.sh"
        self._mpi = mpi
        self._lock: Optional[int] = None
        self._up = False
        self._old_handlers: Dict[int, Any] = {}
        self.rates: Dict[Tuple[str, str], float] = {}
        for link in self.links:
            self.rates[link.a, link.b] = link.gbps_ab
            self.rates[link.b, link.a] = link.gbps_ba

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> "EmulatedCluster":
        ok, why = available()
        if not ok:
            raise EmulationError(f"cannot emulate a cluster here: {why}")
        self._acquire()
        try:
            self._install_handlers()
            cleanup(self.prefix)
            self._build()
            self._up = True
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._teardown()

    def _acquire(self) -> None:
        path = _lock_path(self.prefix)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise EmulationError(f"prefix {self.prefix!r} is in use by a live emulated cluster "
                                 f"(pid {owner}); pick another prefix") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock = fd

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        # Ctrl-C already raises KeyboardInterrupt, which unwinds through __exit__.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, stop)

    def _teardown(self) -> None:
        # Ignore a second Ctrl-C while tearing down: a half-removed cluster is worse.
        old_int = None
        if threading.current_thread() is threading.main_thread():
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            cleanup(self.prefix)
            shutil.rmtree(self.workdir, ignore_errors=True)
        finally:
            self._up = False
            if old_int is not None:
                signal.signal(signal.SIGINT, old_int)
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None

    # -- building ------------------------------------------------------------------------------

    def _build(self) -> None:
        p = self.prefix
        for node in self.nodes:
            ns = node.ns
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "add", self.iface, "mtu", str(MTU), "type", "bridge",
                  "forward_delay", "0", "stp_state", "0"])
            _run(["ip", "-n", ns, "addr", "add", f"{node.ip}/16", "dev", self.iface])
            _run(["ip", "-n", ns, "link", "set", self.iface, "up"])
        for i, host in enumerate(self.ranks):
            _run(["ip", "-n", self._node[host].ns, "addr", "add", f"{_rank_ip(i)}/16",
                  "dev", self.iface])
        for link in self.links:
            na, nb = self._node[link.a].ns, self._node[link.b].ns
            _run(["ip", "link", "add", link.dev, "netns", na, "mtu", str(MTU), "type", "veth",
                  "peer", "name", link.dev, "netns", nb, "mtu", str(MTU)])
            for ns, gbps in ((na, link.gbps_ab), (nb, link.gbps_ba)):
                _run(["tc", "-n", ns, "qdisc", "add", "dev", link.dev, "root", "handle", "1:",
                      *_tbf(gbps)])
                _run(["ip", "-n", ns, "link", "set", link.dev, "master", self.iface, "up"])
        # The head hangs off the first switch (or the first rank's host) on an unshaped veth.
        attach = next((n for n in self.nodes if n.switch), self._node[self.ranks[0]])
        _run(["ip", "netns", "add", self.head_ns])
        _run(["ip", "-n", self.head_ns, "link", "set", "lo", "up"])
        _run(["ip", "link", "add", self.iface, "netns", self.head_ns, "mtu", str(MTU), "type",
              "veth", "peer", "name", f"{p}h", "netns", attach.ns, "mtu", str(MTU)])
        _run(["ip", "-n", self.head_ns, "addr", "add", f"{HEAD_IP}/16", "dev", self.iface])
        _run(["ip", "-n", self.head_ns, "link", "set", self.iface, "up"])
        _run(["ip", "-n", attach.ns, "link", "set", f"{p}h", "master", self.iface, "up"])
        self._write_launcher()
        self._wait_reachable()

    def _write_launcher(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cases = []
        for i, host in enumerate(self.ranks):
            hn = host if _HOSTNAME_RE.match(host) else f"rank{i}"
            cases.append(f"    {_rank_ip(i)}) ns={self._node[host].ns}; hn={hn} ;;")
        for node in self.nodes:
            hn = node.name if _HOSTNAME_RE.match(node.name) else "node"
            cases.append(f"    {node.ip}) ns={node.ns}; hn={hn} ;;")
        script = "\n".join([
            "#!/bin/sh",
            "# Written by horotopo_launch.emulate: stands in for ssh. Called as",
            "#   launch.sh [ssh options] HOST COMMAND...",
            "# it runs COMMAND in HOST's network namespace under HOST's hostname.",
            'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done',
            'host="$1"; shift',
            'case "$host" in',
            *cases,
            '    *) echo "horotopo emulate: unknown host $host" >&2; exit 255 ;;',
            "esac",
            "# Not `exec $*`: Open MPI's command starts with variable assignments.",
            'exec ip netns exec "$ns" unshare --uts sh -c "hostname $hn; $*"',
            ""])
        self.launcher.write_text(script)
        self.launcher.chmod(0o755)

    def _wait_reachable(self, timeout: float = 10.0) -> None:
        # Bridges forward at once with STP off, but be sure before a job relies on it: a
        # refused connection from the farthest-numbered host proves the path works.
        targets = [self._node[h].ip for h in dict.fromkeys(self.ranks)]
        probe = ("import socket,sys,time\n"
                 f"end=time.time()+{timeout}\n"
                 f"for ip in {targets!r}:\n"
                 "    while True:\n"
                 "        try: socket.create_connection((ip, 9), timeout=1).close(); break\n"
                 "        except ConnectionRefusedError: break\n"
                 "        except OSError:\n"
                 "            if time.time()>end: sys.exit('unreachable: '+ip)\n"
                 "            time.sleep(0.1)\n")
        proc = subprocess.run(["ip", "netns", "exec", self.head_ns, sys.executable, "-c", probe],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout + 30)
        if proc.returncode != 0:
            raise EmulationError(f"the emulated network did not come up within {timeout}s: "
                                 f"{proc.stdout.strip()}")

    # -- using ---------------------------------------------------------------------------------

    @property
    def mpi(self) -> MPI:
        if self._mpi is None:
            self._mpi = detect()
        return self._mpi

    def host_addresses(self) -> List[str]:
        """``host_addresses()[i]`` is the address that stands for rank ``i``'s host."""
        return [_rank_ip(i) for i in range(len(self.ranks))]

    def command(self, argv: Sequence[str], np: Optional[int] = None,
                env: Optional[Mapping[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
        """The full command :meth:`run` executes, and the variables it adds for mpiexec."""
        np = len(self.ranks) if np is None else np
        try:
            mpi_argv, launcher_env = emulated_command_line(
                self.mpi, np=np, hosts=self.host_addresses(), launcher=str(self.launcher),
                iface=self.iface, env=dict(env or {}), command=list(argv))
        except LaunchError as exc:
            raise EmulationError(f"{exc} (the topology has {len(self.ranks)} ranks)") from None
        return ["ip", "netns", "exec", self.head_ns, *mpi_argv], launcher_env

    def run(self, argv: Sequence[str], np: Optional[int] = None,
            env: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
            capture_output: bool = True) -> subprocess.CompletedProcess:
        """Run an MPI job with rank ``i`` in the namespace of host ``ranks[i]``.

        Parameters
        ----------
        argv : sequence of str
            The program and its arguments.
        np : int, optional
            Number of ranks, at most (and by default) the topology's.
        env : mapping, optional
            Extra variables for every rank (the rest of the environment passes through).
        timeout : float, optional
            Seconds; past it the job is killed and :class:`subprocess.TimeoutExpired` raised.
        capture_output : bool
            Capture stdout and stderr (text) instead of passing them through.

        Returns
        -------
        subprocess.CompletedProcess
            With mpiexec's return code: non-zero when any rank failed or was killed.
        """
        if not self._up:
            raise EmulationError("the cluster is not built: use it inside a `with` block")
        cmd, launcher_env = self.command(argv, np, env)
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.update(launcher_env)
        pipe = subprocess.PIPE if capture_output else None
        proc = subprocess.Popen(cmd, env=full_env, stdout=pipe, stderr=pipe, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            # Timeout, Ctrl-C or SIGTERM: stop the job now, ranks included.
            self._kill_job(proc)
            raise
        finally:
            self._reap_ranks()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def _kill_job(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()

    def _reap_ranks(self) -> None:
        # A killed rank can leave its siblings or a proxy behind in the namespaces.
        for node in self.nodes:
            _kill_namespace_processes(node.ns)
        _kill_namespace_processes(self.head_ns)

    def exec_in(self, node: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside ``node``'s namespace (a host or a switch)."""
        return subprocess.Popen(["ip", "netns", "exec", self._node[node].ns, *argv], **kwargs)

    def _link(self, a: str, b: str) -> _Link:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        raise EmulationError(f"no link between {a!r} and {b!r}")

    def set_rate(self, a: str, b: str, gbps: float) -> None:
        """Reshape direction ``a -> b`` of the link between ``a`` and ``b`` (``tc change``)."""
        if not self._up:
            raise EmulationError("the cluster is not built: use it inside a `with` block")
        if not 0 < gbps <= MAX_GBPS:
            raise EmulationError(f"rate must be in (0, {MAX_GBPS}] gbps, got {gbps}")
        link = self._link(a, b)
        _run(["tc", "-n", self._node[a].ns, "qdisc", "change", "dev", link.dev, "root",
              "handle", "1:", *_tbf(gbps)])
        self.rates[a, b] = float(gbps)

    def link_bytes(self) -> Dict[Tuple[str, str], int]:
        """Bytes each link direction has sent so far (from the tc counters)."""
        out: Dict[Tuple[str, str], int] = {}
        for link in self.links:
            for src, dst in ((link.a, link.b), (link.b, link.a)):
                text = _run(["tc", "-n", self._node[src].ns, "-s", "-j", "qdisc", "show", "dev",
                             link.dev])
                out[src, dst] = sum(int(q.get("bytes", 0)) for q in json.loads(text)
                                    if q.get("root"))
        return out

    def directions(self) -> Iterator[Tuple[str, str, str]]:
        """``(link label, src, dst)`` for both directions of every link."""
        for link in self.links:
            label = f"{link.a}-{link.b}"
            yield label, link.a, link.b
            yield label, link.b, link.a

    def measure(self, src: str, dst: str, seconds: float = 1.5, warmup: float = 0.5,
                port: int = 5201) -> float:
        """Goodput in gbps of one TCP stream from node ``src`` to node ``dst``."""
        if not self._up:
            raise EmulationError("the cluster is not built: use it inside a `with` block")
        tool = str(Path(__file__).with_name("netcheck.py"))
        recv = self.exec_in(dst, [sys.executable, tool, "recv", str(port), str(seconds),
                                  str(warmup)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
        send = None
        try:
            assert recv.stdout is not None
            ready = recv.stdout.readline().strip()
            if ready != "ready":
                raise EmulationError(f"link probe in {dst} did not start: "
                                     f"{ready} {recv.stderr.read() if recv.stderr else ''}")
            send = self.exec_in(src, [sys.executable, tool, "send", self._node[dst].ip,
                                      str(port), str(seconds + warmup + 1.0)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            out, err = recv.communicate(timeout=seconds + warmup + 30)
            if recv.returncode != 0:
                raise EmulationError(f"link probe {src}->{dst} failed: {err.strip()}")
            result = json.loads(out.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            raise EmulationError(f"link probe {src}->{dst} timed out") from None
        finally:
            for p in (recv, send):
                if p is not None and p.poll() is None:
                    p.kill()
                if p is not None:
                    p.communicate()
        return result["bytes"] * 8 / result["seconds"] / 1e9

    def check(self, seconds: float = 1.5, tries: int = 3,
              tolerance: float = 0.10) -> List[LinkRate]:
        """Measure every direction of every link alone, with a plain TCP stream.

        Each direction is measured between the namespaces of its two ends (a switch answers
        on its bridge's address), so only that direction's shaper is on the path. A direction
        that comes out more than ``tolerance`` off is measured again, up to ``tries`` times in
        all, and the fastest is kept: a shaper never lets a stream exceed its rate, while other
        work on the machine's CPUs can only slow one down.

        Returns
        -------
        list of LinkRate
            ``(link, direction, configured_gbps, measured_gbps)`` per direction.
        """
        return [LinkRate(label, f"{src}->{dst}", self.rates[src, dst],
                         self.measure_best(src, dst, seconds, tries, tolerance))
                for label, src, dst in self.directions()]

    def measure_best(self, src: str, dst: str, seconds: float = 1.5, tries: int = 3,
                     tolerance: float = 0.10) -> float:
        """:meth:`measure`, repeated up to ``tries`` times while more than ``tolerance`` off
        the configured rate of ``src -> dst``; the fastest stream (see :meth:`check`)."""
        if (src, dst) not in self.rates:
            raise EmulationError(f"{src!r} and {dst!r} are not the ends of one link; "
                                 f"measure() takes any two nodes")
        configured = self.rates[src, dst]
        best = 0.0
        for _ in range(max(1, tries)):
            best = max(best, self.measure(src, dst, seconds=seconds))
            if abs(best - configured) <= tolerance * configured:
                break
        return best
