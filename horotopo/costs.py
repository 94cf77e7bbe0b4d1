"""The software costs a rank spends on each message and each received byte: one profile that the
planner, the algorithm selector and the simulator all charge.

A :class:`CostProfile` holds the measured figures of the CPU path (Python CPU per message
posted, with its completion handling, and per received byte, the copy or reduce that follows)
and of the device path (the reduce kernel's rate, the per-message cost, and the host staging
copies MPI needs when it is not CUDA-aware), each with where it comes from. ``horotopo
calibrate`` measures the CPU figures on the job's own machine and writes a profile file;
``init()`` reads it (``HOROTOPO_COSTS``, else :func:`default_path` when that file exists).

Every model and the simulator read the figures through :func:`charges`, the pair ``(seconds
per message, seconds per received byte)`` of the *active* profile for the kind of rank it is
set up for (:func:`activate`, :func:`charging`); without a calibration that is
:data:`DEFAULT_PROFILE`'s CPU path.

How the device path turns into those two figures (:meth:`CostProfile.charges`):

- per message: the device path's own cost, plus one staging copy when MPI is not CUDA-aware
  (a send is copied to the host before it goes, a receive to the device after it lands);
- per received byte: the reduce kernel's time, plus, when staged, two copies at the staging
  rate, the received byte's and the matching sent byte's: in a pipelined tree or ring every
  rank sends as many bytes as it receives, so the send side's copy is charged with the
  receive.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from . import config

__all__ = ["CostProfile", "CostsError", "DEFAULT_PROFILE", "RANK_KINDS", "FIGURES",
           "default_path", "load", "save", "from_settings", "activate", "active", "charges",
           "charging"]

#: What ranks a profile is charged for.
RANK_KINDS = ("cpu", "gpu")

#: The profile's figures with their units, in the order they are shown.
FIGURES: Tuple[Tuple[str, str], ...] = (
    ("cpu_per_message_s", "s"), ("cpu_per_byte_s", "s/B"),
    ("device_reduce_Bps", "B/s"), ("device_per_message_s", "s"),
    ("staging_copy_Bps", "B/s"), ("staging_copy_s", "s"))

_FORMAT = "horotopo-costs/1"


class CostsError(ValueError):
    """A profile figure that cannot be charged (zero, negative, not a number), or a profile
    file that cannot be read; the message is one line naming the figure or the file."""


@dataclass(frozen=True)
class CostProfile:
    """Measured software costs of a rank, each figure with its source.

    Attributes
    ----------
    cpu_per_message_s : float
        The engine's Python CPU per message posted on the CPU path (send or receive, with its
        completion handling).
    cpu_per_byte_s : float
        CPU per received byte on the CPU path (the copy or reduce that follows a receive).
    device_reduce_Bps : float
        The device reduce kernel's rate (bytes of the buffer reduced per second).
    device_per_message_s : float
        Cost per message posted on the device path (the engine's Python, the kernel launch).
    staging_copy_Bps : float
        Rate of a device-host staging copy, charged only when MPI is not CUDA-aware.
    staging_copy_s : float
        Fixed cost of one staging copy (launch and stream synchronisation).
    sources : dict
        Figure name -> where the figure comes from (a command and the machine it ran on).
    machine : str
        The machine the CPU figures were measured on.
    """

    cpu_per_message_s: float
    cpu_per_byte_s: float
    device_reduce_Bps: float
    device_per_message_s: float
    staging_copy_Bps: float
    staging_copy_s: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    machine: str = ""

    def __post_init__(self) -> None:
        for name, unit in FIGURES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise CostsError(f"cost figure {name} must be a positive number of {unit}, "
                                 f"got {value!r}")
        object.__setattr__(self, "sources", dict(self.sources))

    def charges(self, ranks_are: str = "cpu", cuda_aware: bool = True) -> Tuple[float, float]:
        """``(seconds per message posted, seconds per received byte)`` for ranks of this kind
        (``"cpu"`` or ``"gpu"``; ``cuda_aware`` matters only for ``"gpu"``)."""
        if ranks_are not in RANK_KINDS:
            raise CostsError(f"ranks are one of {', '.join(RANK_KINDS)}, got {ranks_are!r}")
        if ranks_are == "cpu":
            return self.cpu_per_message_s, self.cpu_per_byte_s
        per_message = self.device_per_message_s
        per_byte = 1.0 / self.device_reduce_Bps
        if not cuda_aware:
            per_message += self.staging_copy_s
            per_byte += 2.0 / self.staging_copy_Bps
        return per_message, per_byte

    def replace(self, **figures: Any) -> "CostProfile":
        """A copy with ``figures`` (and, for each, the ``<name>_source`` keyword) replaced."""
        sources = dict(self.sources)
        values = {name: getattr(self, name) for name, _ in FIGURES}
        machine = figures.pop("machine", self.machine)
        for key, value in figures.items():
            if key.endswith("_source"):
                sources[key[:-len("_source")]] = str(value)
            elif key in values:
                values[key] = value
            else:
                raise TypeError(f"no cost figure named {key!r}")
        return CostProfile(**values, sources=sources, machine=machine)

    def to_json(self) -> Dict[str, Any]:
        return {"format": _FORMAT, "machine": self.machine,
                "figures": {name: {"value": getattr(self, name), "unit": unit,
                                   "source": self.sources.get(name, "")}
                            for name, unit in FIGURES}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "CostProfile":
        """The profile :meth:`to_json` wrote.

        Raises
        ------
        CostsError
            Another format, a missing figure, or a figure that is not positive.
        """
        if not isinstance(doc, Mapping) or doc.get("format") != _FORMAT:
            raise CostsError(f"not a cost profile (expected format {_FORMAT!r})")
        figures = doc.get("figures")
        if not isinstance(figures, Mapping):
            raise CostsError("a cost profile needs its 'figures'")
        missing = [name for name, _ in FIGURES
                   if not isinstance(figures.get(name), Mapping) or "value" not in figures[name]]
        if missing:
            raise CostsError(f"the cost profile lacks {', '.join(missing)}")
        return cls(**{name: figures[name]["value"] for name, _ in FIGURES},
                   sources={name: str(figures[name].get("source", "")) for name, _ in FIGURES},
                   machine=str(doc.get("machine", "")))

    def describe(self) -> str:
        """One line per figure: name, value in a readable unit, source."""
        def shown(name: str) -> str:
            value = getattr(self, name)
            if name.endswith("_Bps"):
                return f"{value / 1e9:.3f} GB/s"
            if name.endswith("_per_byte_s"):
                return f"{value * 1e9:.4f} ns/B"
            return f"{value * 1e6:.2f} us"
        lines = [f"cost profile{f' of {self.machine}' if self.machine else ''}:"]
        for name, _ in FIGURES:
            lines.append(f"  {name:<22} {shown(name):>14}  {self.sources.get(name, '')}")
        return "\n".join(lines)


_DEV_MACHINE = "the 2-core development machine (MPICH over shared memory)"
_H100_RUN = ("bash benchmarks/gpu_check.sh on one NVIDIA H100 80GB HBM3, 2026-12-05 "
             "(docs/results/gpu_check-2026-12-05-h100/)")

#: The costs charged without a calibration: the CPU path measured on the development machine
#: by ``mpiexec -n 4 python benchmarks/engine_overhead.py --bytes 1M``, the device path on an
#: H100 by ``benchmarks/gpu_check.sh`` (its kernel bench and ``benchmarks/gpu_costs.py``).
DEFAULT_PROFILE = CostProfile(
    cpu_per_message_s=11.34e-6,
    cpu_per_byte_s=0.472e-9,
    device_reduce_Bps=792e9,
    device_per_message_s=27.8e-6,
    staging_copy_Bps=52.2e9,
    staging_copy_s=35.7e-6,
    sources={
        "cpu_per_message_s": f"mpiexec -n 4 python benchmarks/engine_overhead.py --bytes 1M "
                             f"on {_DEV_MACHINE}, 2026-12-03",
        "cpu_per_byte_s": f"mpiexec -n 4 python benchmarks/engine_overhead.py --bytes 1M on "
                          f"{_DEV_MACHINE}, 2026-12-03 (largest-chunk row)",
        "device_reduce_Bps": f"{_H100_RUN}: benchmarks/kernel_bench.py, native kernels "
                             "2376-2584 GB/s of memory traffic over every dtype and op at "
                             "256 MiB; a reduce step moves three bytes per received byte, so "
                             "the low end over three",
        "device_per_message_s": f"{_H100_RUN}: benchmarks/gpu_costs.py, the engine's chain on "
                                "device pointers against a mirrored peer; it includes the "
                                "mirror's zero fill of each receive (one small kernel launch "
                                "per message), which that run did not take off",
        "staging_copy_Bps": f"{_H100_RUN}: benchmarks/gpu_costs.py, pinned copies, the slower "
                            "direction (host to device)",
        "staging_copy_s": f"{_H100_RUN}: benchmarks/gpu_costs.py, pinned copies, the larger "
                          "fixed cost (device to host)"},
    machine=f"{_DEV_MACHINE} (CPU figures); one NVIDIA H100 (device figures)")


def default_path() -> Path:
    """Where ``horotopo calibrate`` writes and ``init()`` looks without ``HOROTOPO_COSTS``:
    ``~/.cache/horotopo/costs.json``."""
    return Path.home() / ".cache" / "horotopo" / "costs.json"


def load(path: os.PathLike) -> CostProfile:
    """The profile in ``path``.

    Raises
    ------
    CostsError
        The file cannot be read, is not JSON, or is not a valid profile (one line, naming it).
    """
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise CostsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CostsError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        return CostProfile.from_json(doc)
    except CostsError as exc:
        raise CostsError(f"{path}: {exc}") from None


def save(profile: CostProfile, path: os.PathLike) -> Path:
    """Write ``profile`` to ``path`` (its folder made if missing); the path."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    except OSError as exc:
        raise CostsError(f"{target}: cannot write: {exc.strerror or exc}") from None
    return target


def from_settings(env: Optional[Mapping[str, str]] = None) -> Tuple[CostProfile, str]:
    """The profile a job uses, and where it came from: the file ``HOROTOPO_COSTS`` names, else
    :func:`default_path` when it exists, else :data:`DEFAULT_PROFILE`.

    Raises
    ------
    CostsError
        ``HOROTOPO_COSTS`` names a file that cannot be read as a profile, or the default file
        is not one (the message names the setting or the file).
    """
    try:
        named = config.get("HOROTOPO_COSTS", env)
    except config.ConfigError as exc:
        raise CostsError(str(exc)) from None
    if named is not None:
        try:
            return load(named), f"HOROTOPO_COSTS={named}"
        except CostsError as exc:
            raise CostsError(f"HOROTOPO_COSTS={exc}") from None
    path = default_path()
    if path.is_file():
        return load(path), str(path)
    return DEFAULT_PROFILE, "the built-in profile (no calibration file)"


_active: Tuple[CostProfile, str, bool] = (DEFAULT_PROFILE, "cpu", True)
# The active profile's two charges, worked out once: the planner reads them in its inner loops.
_charges: Tuple[float, float] = DEFAULT_PROFILE.charges("cpu")


def activate(profile: CostProfile, ranks_are: str = "cpu", cuda_aware: bool = True) -> None:
    """Charge ``profile`` for ranks of kind ``ranks_are`` in this process from now on."""
    global _active, _charges
    _charges = profile.charges(ranks_are, cuda_aware)  # refuses an unknown kind first
    _active = (profile, ranks_are, bool(cuda_aware))


def active() -> Tuple[CostProfile, str, bool]:
    """``(profile, ranks_are, cuda_aware)`` charged in this process."""
    return _active


def charges() -> Tuple[float, float]:
    """``(seconds per message, seconds per received byte)`` of the active profile."""
    return _charges


@contextlib.contextmanager
def charging(profile: CostProfile, ranks_are: str = "cpu",
             cuda_aware: bool = True) -> Iterator[CostProfile]:
    """:func:`activate` for the ``with`` block, the profile before it restored after."""
    before = _active
    activate(profile, ranks_are, cuda_aware)
    try:
        yield profile
    finally:
        activate(*before)
