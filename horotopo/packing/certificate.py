"""The optimality certificate's integrity check.

A dual-feasible point bounds the packing LP's optimum from above, so no feasible schedule can
beat it. The bound is reported as it is computed, never raised to the achieved rate: a bound
below what the trees achieve means the dual (or the pricing that produced it) is wrong, and
that is an internal error, not a "gap 0%". Floating point makes the two sides differ by a few
ulps when the bound is tight (ring on a uniform star); :data:`RTOL` absorbs that much and no
more. Within it the gap ``1 - R / bound`` is reported as the tiny (possibly negative) number it
is.
"""
from __future__ import annotations

import math
from typing import Optional

from ..topology import plural  # re-exported: counts in the planner's messages

__all__ = ["RTOL", "CertificateError", "check_certificate", "gap", "format_percent", "plural"]

# Measured on the test topologies (n <= 9, bundled and random): the raw bound sits at most
# ~6e-16 relative below the LP's rate when they coincide, so 1e-9 is rounding with margin.
RTOL = 1e-9


class CertificateError(RuntimeError):
    """A certified upper bound below the rate actually achieved: the dual is wrong.

    Attributes
    ----------
    topology : str
        Name of the topology being planned.
    phase : str
        The step that produced the bound (``"Garg-Konemann dual"``, ...).
    bound, achieved : float
        The bound and the achieved rate, bytes/s.
    """

    def __init__(self, topology: str, phase: str, bound: float, achieved: float,
                 achieved_by: str):
        self.topology = topology
        self.phase = phase
        self.bound = bound
        self.achieved = achieved
        super().__init__(
            f"internal error: certificate for topology {topology!r} is wrong: the upper bound "
            f"{bound / 1e6:.9g} MB/s from the {phase} is below the {achieved / 1e6:.9g} MB/s "
            f"that {achieved_by} achieves (by {1 - bound / achieved:.3g} relative, tolerance "
            f"{RTOL:g})")


def check_certificate(bound: float, achieved: float, *, topology: str, phase: str,
                      achieved_by: str = "the kept trees") -> None:
    """Raise :class:`CertificateError` if ``bound`` is below ``achieved`` beyond :data:`RTOL`.

    Parameters
    ----------
    bound : float
        The certified upper bound, bytes/s (``inf`` when no dual point was priced: no claim).
    achieved : float
        A rate that a feasible schedule reaches, bytes/s.
    topology, phase : str
        Named in the error: the topology's name and the step that produced ``bound``.
    achieved_by : str
        What reaches ``achieved`` (for the message).
    """
    if math.isnan(bound) or bound < achieved * (1.0 - RTOL):
        raise CertificateError(topology, phase, bound, achieved, achieved_by)


def gap(achieved: float, bound: Optional[float]) -> Optional[float]:
    """``1 - achieved / bound`` as computed (not floored), or None without a finite bound.

    After :func:`check_certificate` the value is at least ``-RTOL``; a tight bound may show as
    ``-1e-16`` rather than 0.
    """
    if bound is None or not math.isfinite(bound) or bound <= 0:
        return None
    return 1.0 - achieved / bound


def format_percent(fraction: float) -> str:
    """``0.0123`` -> ``"1.23%"``; a rounding-sized negative gap prints as ``0.00%``, not ``-0.00%``.

    Only the display rounds; JSON keeps the raw value.
    """
    return f"{round(fraction * 100, 2) + 0.0:.2f}%"
