"""Simulated clusters: horotopo's own probe, planner and engine over a SimGrid network built from
a topology.

- :mod:`~horotopo.simulation.support`: SimGrid's Python bindings and the software costs a
  simulation charges; :mod:`~horotopo.simulation.actors`: SimGrid's engine, the ranks' actors
  and their mailboxes; :mod:`~horotopo.simulation.pending` and
  :mod:`~horotopo.simulation.collectives`: the requests, the completion queue and the
  collective steps of the simulated transport
  (:class:`~horotopo.transport.simulated.SimulatedTransport`, which stands on these).
- :mod:`~horotopo.simulation.platform` builds a topology's network in SimGrid, and
  :mod:`~horotopo.simulation.runner` runs a function on every rank of it
  (:func:`~horotopo.simulation.runner.run_simulated`). They stand on the transport, so this
  package's own namespace holds only the names below it.

Needs SimGrid's Python bindings (Debian's ``python3-simgrid``); importing this package does not,
running a simulation does (:class:`SimulatorMissing` says how to install it).
"""
from .actors import SimRun, Simulation
from .support import (DEFAULT_COSTS, SimCosts, SimulationConfigError, SimulationError,
                      SimulatorMissing, load_simgrid)

__all__ = ["SimCosts", "DEFAULT_COSTS", "Simulation", "SimRun", "SimulationError",
           "SimulationConfigError", "SimulatorMissing", "load_simgrid"]
