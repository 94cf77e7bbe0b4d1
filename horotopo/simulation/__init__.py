"""Simulated clusters: horotopo's own probe, planner and engine over a SimGrid network built from
a topology (see :mod:`horotopo.transport.simulated` for the transport and its costs).

Needs SimGrid's Python bindings (Debian's ``python3-simgrid``); importing this package does not,
running a simulation does (:class:`~horotopo.transport.simulated.SimulatorMissing` says how to
install it).
"""
from ..transport.simulated import (DEFAULT_COSTS, SimCosts, SimRun, SimulationConfigError,
                                   SimulationError, SimulatorMissing, load_simgrid)
from .runner import run_here, run_simulated

__all__ = ["run_simulated", "run_here", "SimCosts", "DEFAULT_COSTS", "SimRun",
           "SimulationError", "SimulationConfigError", "SimulatorMissing", "load_simgrid"]
