"""The trial of a re-plan: keep the new plan only if its first timed calls beat the old plan's.

A re-plan is a prediction: the refreshed model says the new plan is faster on the changed
network. The prediction can be wrong (the model's rates are not the network's, and at 256
simulated ranks a plan made for the slowed model ran 5% slower than the plan it replaced), so,
as Horovod's autotuner keeps a setting only when its samples beat the best one so far, the
adaptive engine times the new plan for its first ``calls`` monitored calls and goes back to the
old plan unless the new one was faster than the old one was on the changed network (its slow
run, the calls that triggered the re-plan).

Pure: :class:`~horotopo.adapt.runtime.AdaptiveEngine` feeds it the agreed (slowest rank's)
call times, rank 0 takes the verdict and broadcasts it, so every rank keeps or reverts at the
same call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any, List, Optional, Sequence, Tuple

from ..params import ADAPT

__all__ = ["Trial"]


@dataclass
class Trial:
    """The old plan's timed calls and the new plan's first ones, on one yardstick.

    Calls of different sizes are made comparable by dividing each time by the *old* plan's
    predicted time for that size (the same yardstick for both plans: a ratio of two plans'
    times at one size is unchanged by it, and sizes mix as the detector's efficiencies do).

    Parameters
    ----------
    old_plan : Plan
        The plan replaced (kept to go back to, and its prediction is the yardstick).
    old_calls : sequence of (nbytes, seconds)
        The old plan's agreed call times on the changed network (its slow run).
    calls : int
        The new plan's calls to time before the verdict (>= 1).
    chunk_bytes : int, optional
        The engine's chunk size (for the prediction).
    """

    old_plan: Any
    old_calls: Sequence[Tuple[int, float]]
    calls: int = ADAPT.trial_calls
    chunk_bytes: Optional[int] = None
    new_calls: List[Tuple[int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if int(self.calls) != self.calls or self.calls < 1:
            raise ValueError(f"a trial needs at least one call, got {self.calls!r}")
        if not self.old_calls:
            raise ValueError("a trial needs the old plan's timed calls to compare with")

    def _slowness(self, timed: Sequence[Tuple[int, float]]) -> float:
        """Median of time over the old plan's prediction for the same size."""
        return float(median(s / self.old_plan.predict_time(b, self.chunk_bytes)
                            for b, s in timed))

    @property
    def old_s(self) -> float:
        """The old plan's median slowness (seconds per predicted second)."""
        return self._slowness(self.old_calls)

    @property
    def new_s(self) -> float:
        """The new plan's median slowness so far (nan before its first call)."""
        return self._slowness(self.new_calls) if self.new_calls else float("nan")

    @property
    def done(self) -> bool:
        """True once the new plan has been timed for ``calls`` calls."""
        return len(self.new_calls) >= self.calls

    def add(self, nbytes: int, seconds: float) -> bool:
        """Record one of the new plan's calls; True when the trial is complete."""
        if not (nbytes > 0 and seconds > 0):
            raise ValueError(f"a timed call needs positive bytes and seconds, got "
                             f"{nbytes!r} bytes in {seconds!r} s")
        self.new_calls.append((int(nbytes), float(seconds)))
        return self.done

    def keep_new(self) -> bool:
        """The verdict: True when the new plan ran faster than the old one (strictly).

        A tie keeps the old plan: a switch that gains nothing is not worth a model that may
        be wrong elsewhere.
        """
        if not self.done:
            raise ValueError(f"the trial has {len(self.new_calls)} of its {self.calls} calls")
        return self.new_s < self.old_s
