"""SimGrid's Python bindings and the software costs a simulation charges.

Finding the bindings (Debian's ``python3-simgrid`` outside the venv) and the costs are jobs
apart from the transport (:mod:`horotopo.transport.simulated`, which re-exports these names). The figures come from the one cost profile
(:mod:`horotopo.costs`) that the planner charges too.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from ..costs import DEFAULT_PROFILE, CostProfile, charges

__all__ = ["INSTALL_HINT", "SimulatorMissing", "SimulationError", "SimulationConfigError",
           "load_simgrid", "SimCosts", "DEFAULT_COSTS", "NETWORK_CONFIG"]

INSTALL_HINT = ("the simulator needs SimGrid's Python bindings: on Debian or Ubuntu, "
                "`sudo apt-get install -y python3-simgrid` (3.32, a CPython 3.11 extension; "
                "the venv finds it in /usr/lib/python3/dist-packages)")

#: SimGrid's network model for long-lived MPI connections: LV08 (SimGrid's default: max-min
#: sharing with RTT-weighted flows, weight-S 20537, 0.97 of a link's rate for TCP/IP headers,
#: cross traffic, windows of at most network/TCP-gamma = 4 MiB, this machine's
#: net.ipv4.tcp_wmem maximum) without its latency factor of 13.01, which models the slow start
#: of a fresh TCP flow. MPI's connections, and the emulated cluster's, stay open for the whole
#: job, so a message pays the route's latency once, as the planner's model has it.
NETWORK_CONFIG = ("--cfg=network/model:LV08", "--cfg=network/latency-factor:1.0")

# Where Debian puts python3-* extension modules; a venv's sys.path does not include it.
_DEBIAN_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")



class SimulatorMissing(ImportError):
    """SimGrid's Python bindings cannot be imported; the message says how to install them."""


class SimulationError(RuntimeError):
    """A simulated run failed: a rank raised (the first error is the cause) or deadlocked."""


class SimulationConfigError(SimulationError, ValueError):
    """SimGrid refused a setting given to it (an unknown key, a value of the wrong type)."""


def load_simgrid() -> ModuleType:
    """The ``simgrid`` module, from the environment or from Debian's dist-packages folder.

    Raises
    ------
    SimulatorMissing
        Neither has it (the message says how to install it).
    """
    try:
        import simgrid  # type: ignore[import-not-found]
        return simgrid
    except ImportError:
        pass
    folder = str(_DEBIAN_DIST_PACKAGES)
    if not (_DEBIAN_DIST_PACKAGES / "simgrid.cpython-311-x86_64-linux-gnu.so").exists() \
            and not any(_DEBIAN_DIST_PACKAGES.glob("simgrid.*.so")):
        raise SimulatorMissing(INSTALL_HINT)
    # Appended for this import only: Debian's folder also holds other packages (numpy...) that
    # must not shadow the venv's.
    sys.path.append(folder)
    try:
        import simgrid  # type: ignore[import-not-found]
        return simgrid
    except ImportError as exc:
        raise SimulatorMissing(f"{INSTALL_HINT}; importing it failed: {exc}") from exc
    finally:
        if folder in sys.path:
            sys.path.remove(folder)


@dataclass(frozen=True)
class SimCosts:
    """Software costs charged as simulated time on the rank that spends them.

    Attributes
    ----------
    per_message_s : float
        Python CPU per message (each send and receive posted, with its completion handling).
    recv_s_per_byte : float
        CPU per received (simulated) byte: the copy or reduce that follows a receive.
    """

    per_message_s: float
    recv_s_per_byte: float

    @classmethod
    def from_overhead(cls, summary: Mapping[str, Any]) -> "SimCosts":
        """Costs from the JSON that ``benchmarks/engine_overhead.py`` prints.

        ``per_message_s`` is its ``python_cpu_s_per_message`` (the least over chunks of at
        most 4 KiB, where moving bytes costs next to nothing). ``recv_s_per_byte`` is the
        Python CPU of its largest-chunk row less that per-message cost, over the bytes the
        busiest rank receives in that row: its plan is the ring's chains, where a rank
        receives ``2 (n - 1) / n`` of the buffer (half reduced, half copied).
        """
        per = float(summary["python_cpu_s_per_message"])
        n = int(summary["ranks"])
        row = max(summary["rows"], key=lambda r: r["chunk_bytes"])
        received = 2 * (n - 1) / n * float(summary["bytes"])
        cpu = float(row["python_cpu_s"]) - int(row["messages"]) * per
        return cls(per_message_s=per, recv_s_per_byte=max(cpu, 0.0) / received)

    @classmethod
    def from_profile(cls, profile: CostProfile, ranks_are: str = "cpu",
                     cuda_aware: bool = True) -> "SimCosts":
        """What ``profile`` charges ranks of kind ``ranks_are`` (:meth:`CostProfile.charges`)."""
        per_message, per_byte = profile.charges(ranks_are, cuda_aware)
        return cls(per_message_s=per_message, recv_s_per_byte=per_byte)

    @classmethod
    def active(cls) -> "SimCosts":
        """The charges of the process's active cost profile (:func:`horotopo.costs.charges`),
        the planner's and the selector's figures too."""
        per_message, per_byte = charges()
        return cls(per_message_s=per_message, recv_s_per_byte=per_byte)


#: The built-in cost profile's CPU path (:data:`horotopo.costs.DEFAULT_PROFILE`, measured on
#: the development machine by ``mpiexec -n 4 python benchmarks/engine_overhead.py --bytes 1M``
#: and :meth:`SimCosts.from_overhead`): what a simulation charges without a calibration.
DEFAULT_COSTS = SimCosts(*DEFAULT_PROFILE.charges("cpu"))
