"""The runtime's settings: Horovod's environment knobs, read through :mod:`horotopo.config`."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from .. import config

__all__ = ["Settings", "env_settings", "apply_log_level", "log"]

log = logging.getLogger("horotopo")


def env_settings(env: Optional[Mapping[str, str]] = None) -> Dict[str, float]:
    """The Horovod environment knobs this runtime honours (read through horotopo.config)."""
    def get(name: str) -> Any:
        return config.get(name, env=env)

    return {
        "cycle_time_s": get("HOROVOD_CYCLE_TIME") / 1000.0,
        "fusion_threshold": get("HOROVOD_FUSION_THRESHOLD"),
        "cache_capacity": get("HOROVOD_CACHE_CAPACITY"),
        "stall_check_s": get("HOROVOD_STALL_CHECK_TIME_SECONDS"),
        "stall_check": 0.0 if get("HOROVOD_STALL_CHECK_DISABLE") else 1.0,
        "stall_shutdown_s": get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"),
        "shutdown_timeout_s": get("HOROTOPO_SHUTDOWN_TIMEOUT"),
    }


@dataclass
class Settings:
    """What one runtime runs with. Mutable on purpose: tests shorten the stall check of a
    running job, and the controller reads these every cycle.

    Attributes
    ----------
    cycle_time_s : float
        The least time between two control cycles (HOROVOD_CYCLE_TIME).
    fusion_threshold : int
        The largest fusion buffer in bytes (HOROVOD_FUSION_THRESHOLD).
    cache_capacity : int
        Response-cache entries, hence bits per cycle (HOROVOD_CACHE_CAPACITY).
    stall_check : bool
        Rank 0 warns about names that only some ranks asked for.
    stall_check_s : float
        How long a name waits before that warning.
    stall_shutdown_s : float
        Horovod's stall shutdown: 0 never; else rank 0 ends the job when a name has waited
        this long for the other ranks (it runs with the stall check, as in Horovod).
    shutdown_timeout_s : float
        How long ``stop`` waits for the background thread.
    reroute_s : float
        A cached request that waits this long is re-routed through rank 0 so that its stall
        can be reported with the names of the missing ranks.
    """

    cycle_time_s: float
    fusion_threshold: int
    cache_capacity: int
    stall_check: bool
    stall_check_s: float
    stall_shutdown_s: float
    shutdown_timeout_s: float
    reroute_s: float

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None,
                 **overrides: float) -> "Settings":
        """The settings of :func:`env_settings`, with ``overrides`` (its keys) applied."""
        cfg = env_settings(env)
        unknown = set(overrides) - set(cfg)
        if unknown:
            raise TypeError(f"unknown runtime settings: {', '.join(sorted(unknown))}")
        cfg.update(overrides)
        stall_check_s = float(cfg["stall_check_s"])
        stall_check = bool(cfg["stall_check"]) and stall_check_s > 0
        return cls(cycle_time_s=max(0.0, float(cfg["cycle_time_s"])),
                   fusion_threshold=max(0, int(cfg["fusion_threshold"])),
                   cache_capacity=max(0, int(cfg["cache_capacity"])),
                   stall_check=stall_check, stall_check_s=stall_check_s,
                   stall_shutdown_s=float(cfg["stall_shutdown_s"]),
                   shutdown_timeout_s=float(cfg["shutdown_timeout_s"]),
                   reroute_s=(min(config.runtime_params(env).reroute_max_s, stall_check_s / 2)
                              if stall_check else math.inf))


_LOG_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
               "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}


def apply_log_level(level: Optional[str]) -> None:
    """Set the ``horotopo`` logger to ``level`` (HOROVOD_LOG_LEVEL; None leaves it alone).

    Without any handler configured (neither on this logger nor on the root), Python prints only
    warnings and worse; a level asked for explicitly must show its messages, so a stderr handler
    is added then (once).
    """
    if level is None:
        return
    log.setLevel(_LOG_LEVELS[level])
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
        log.addHandler(handler)
