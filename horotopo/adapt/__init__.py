"""Adaptivity: re-plan when the network changes under a running job.

- :mod:`horotopo.adapt.policy` (pure): the slowdown detector, the suspect links, the refreshed
  model and its topology document.
- :mod:`horotopo.adapt.recovery` (pure): the verdict over a run's timed calls, whether it
  re-planned after the change and came within a tolerance of a fresh plan.
- :mod:`horotopo.adapt.reprobe`: a quick probe of chosen directed pairs only.
- :mod:`horotopo.adapt.runtime`: :class:`AdaptiveEngine`, the Engine wrapper that monitors its
  own transfers, detects, re-plans on rank 0 and switches plans at the same call on every rank;
  :func:`retune` for an explicit full re-probe.
- :mod:`horotopo.adapt.slowdown`: a link slowdown in the middle of a simulated job, and the
  verdict on the re-plan against plans made for the slowed network.
- :mod:`horotopo.adapt.trial` (pure): a re-plan's trial, which keeps the new plan only when
  its first timed calls beat the old plan's.
"""
from .policy import Detector, refresh_capacities, suspects, topology_with_capacities
from .runtime import AdaptiveEngine, ReplanEvent, retune

__all__ = ["AdaptiveEngine", "ReplanEvent", "retune", "Detector", "suspects",
           "refresh_capacities", "topology_with_capacities"]
