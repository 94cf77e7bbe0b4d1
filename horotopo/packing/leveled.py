"""Few trees where a measured network's rates differ by no more than the probe's noise.

A measured topology's capacities carry the probe's error. On a uniform star the quick probe
reads every pair and every NIC a few percent apart, and the certified packing, which is exact
for the figures it is given, spends those few percent: five to seven trees, each using the
links that happened to read fastest, where the star as declared takes two. The extra trees
buy nothing on the real network and cost messages and flows: on the emulated uniform-4 star
the five-tree plans run slower than the two-tree ones.

:func:`leveled` groups the capacities into levels no wider than a ratio (:data:`LEVEL_RATIO`)
and gives each level its lowest figure. A packing of that network finds the structure the
noise hid (two chains on the star); its trees, scaled to the rate the measured network allows,
are always feasible there (every level's figure is at most each of its members). The plan
(:func:`~horotopo.packing.depth.choose_forest`) keeps them instead of a forest of more trees
when they are predicted at most :data:`LEVEL_TOLERANCE` slower: a difference the probe cannot
tell from noise.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence, Tuple

import numpy as np

from ..topology import Topology

__all__ = ["leveled", "level_capacities", "LEVEL_RATIO", "LEVEL_TOLERANCE"]

#: Capacities within this ratio of their level's lowest are one level. Three quick probes of
#: the emulated 0.4 gbps star (``benchmarks/probe_accuracy.py uniform-4 --quick``)
#: read its pairs 0.397-0.403 gbps and its NICs' fan-out and fan-in 0.400-0.439 gbps; one of
#: the three planned five trees on those figures (0.938 of the two-tree plan on the star as
#: declared). The probe groups ranks only at rate gaps of 1.5x
#: (``horotopo.probe.cluster.DEFAULT_GAP``): differences below that are taken as noise there.
LEVEL_RATIO = 1.10

#: A forest of fewer trees packed on the leveled network replaces one of more trees when its
#: predicted time is at most this much longer: within the levels' width, so within the noise.
#: Its throughput is within that width by construction: every leveled capacity is at least
#: ``1 / LEVEL_RATIO`` of the measured one, so the leveled network's optimum is too.
LEVEL_TOLERANCE = LEVEL_RATIO - 1.0


def level_capacities(capacity: Sequence[float], ratio: float = LEVEL_RATIO
                     ) -> Tuple[float, ...]:
    """Each capacity replaced by the lowest of its level.

    Levels are formed from the lowest capacity up: a level starts at the lowest capacity not
    yet placed and takes every capacity at most ``ratio`` times it. Levels are therefore never
    wider than ``ratio`` (no chaining of small steps into one wide level), and no capacity is
    raised.

    Parameters
    ----------
    capacity : sequence of float
        Positive capacities (bytes/s); ``inf`` stays ``inf``.
    ratio : float
        Widest ratio within a level, above 1.

    Returns
    -------
    tuple of float
        The leveled capacities, in the order given.

    Raises
    ------
    ValueError
        ``ratio`` not above 1, or a capacity that is not positive.
    """
    if not ratio > 1.0:
        raise ValueError(f"ratio: the widest ratio within a level, must be above 1, "
                         f"got {ratio!r}")
    caps = np.asarray(capacity, dtype=float)
    if caps.size and not np.all(caps > 0):
        raise ValueError(f"capacities must be positive, got {caps[~(caps > 0)][0]!r}")
    out = caps.copy()
    start = None
    for i in np.argsort(caps, kind="stable"):
        if start is None or caps[i] > start * ratio:
            start = caps[i]
        out[i] = start
    return tuple(float(v) for v in out)


def leveled(topology: Topology, ratio: float = LEVEL_RATIO) -> Topology:
    """``topology`` with its capacities leveled (:func:`level_capacities`).

    The result keeps the name, routes and source, so a plan packed on it is built and
    certified against ``topology`` itself; it is only ever a network to pack on.
    """
    return replace(topology, capacity_Bps=level_capacities(topology.capacity_Bps, ratio))
