"""How hard the probe measures: :class:`ProbeConfig`, its presets (:data:`MODES`), and the
error a measurement that cannot be made raises (:class:`ProbeError`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict

from ..params import PROBE, ProbeParams

__all__ = ["ProbeConfig", "ProbeError", "MODES", "SCHEMES"]


class ProbeError(RuntimeError):
    """A measurement that cannot be made: an unreachable pair, a timeout, a zero rate."""


# quick: for init(); full: the default of `horotopo probe`, at most about 10 s for 8 ranks.
MODES: Dict[str, Dict[str, Any]] = {
    "quick": dict(target_s=0.008, max_bytes=4 << 20, tolerance=0.10, min_samples=2,
                  max_samples=3, ping_reps=5, budget_s=4.0),
    "full": dict(target_s=0.020, max_bytes=16 << 20, tolerance=0.08, min_samples=2,
                 max_samples=3, ping_reps=10, budget_s=8.5),
}


#: The probe's schemes (see ProbeConfig.scheme).
SCHEMES = ("auto", "pairs", "hosts")


@dataclass(frozen=True)
class ProbeConfig:
    """How hard the probe measures. Build one with :meth:`for_mode`.

    Attributes
    ----------
    mode : str
        ``"quick"`` or ``"full"``.
    target_s : float
        Aimed duration of one timed transfer; shorter ones (below half) grow the message.
    min_bytes, max_bytes, start_bytes : int
        Message size bounds per transfer, and the first size tried.
    warm_bytes : int
        Each timed message follows a warm-up of ``min(size, max(size * params.warm_share,
        warm_bytes))``.
    chunk_bytes : int
        Warm-up and timed bytes go as trains of messages of at most this size (MPICH over
        UCX can move single messages of a few MiB unevenly).
    tolerance : float
        Repeats stop once the two best samples of every figure agree within this fraction.
    min_samples, max_samples : int
        Repeats per test.
    ping_reps : int
        Ping-pongs per pair (after one warm-up that also opens the connection).
    timeout_s : float
        A wait longer than this is an error naming the pair.
    budget_s : float
        The probe's time bound: transfers shorten (down to ``params.min_target_s``) so that
        the tests left fit in it, and past it every test takes a single sample.
    concurrent_pairs : bool
        Run the pairs of a circle-method round at once (see :mod:`horotopo.probe.measure`).
    scheme : str
        ``"pairs"``: every ordered pair of ranks alone (:mod:`horotopo.probe.phases`);
        ``"hosts"``: host leaders in concurrent rounds with a trust test and group tests
        (:mod:`horotopo.probe.hosts`, linear in the hosts); ``"auto"``: ``"hosts"`` above
        ``params.pairs_up_to`` ranks.
    sample_pairs : int
        The hosts scheme's trust test: how many host pairs are measured alone again.
    params : ProbeParams
        How measured rates become a model: the clustering gap (:mod:`horotopo.probe.cluster`),
        the "clearly below" margin (:mod:`horotopo.probe.infer`), where "auto" switches scheme
        and how many ranks have every split tested; default :data:`horotopo.params.PROBE`.
    """

    mode: str = "full"
    target_s: float = 0.025
    min_bytes: int = 4 << 10
    max_bytes: int = 16 << 20
    start_bytes: int = 64 << 10
    warm_bytes: int = 256 << 10
    chunk_bytes: int = 1 << 20
    tolerance: float = 0.05
    min_samples: int = 2
    max_samples: int = 5
    ping_reps: int = 20
    timeout_s: float = 10.0
    budget_s: float = 9.0
    concurrent_pairs: bool = False
    scheme: str = "auto"
    sample_pairs: int = 8
    params: ProbeParams = PROBE

    @property
    def gap(self) -> float:
        """The clustering gap between rate levels (``params.gap``)."""
        return self.params.gap

    @property
    def margin(self) -> float:
        """The "clearly below" margin of the shared-resource inference (``params.margin``)."""
        return self.params.margin

    def scheme_for(self, n: int) -> str:
        """The scheme that runs on ``n`` ranks (``"auto"`` resolved)."""
        if self.scheme != "auto":
            return self.scheme
        return "pairs" if n <= self.params.pairs_up_to else "hosts"

    @classmethod
    def for_mode(cls, mode: str = "full", **overrides: Any) -> "ProbeConfig":
        """The preset for ``mode`` (``quick`` or ``full``) with ``overrides`` applied."""
        if mode not in MODES:
            raise ValueError(f"probe mode must be one of {', '.join(MODES)}, got {mode!r}")
        cfg = replace(cls(mode=mode, **MODES[mode]), **overrides)
        cfg.check()
        return cfg

    def check(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        if not (0 < self.target_s < 10):
            raise ValueError(f"target_s: must be in (0, 10) seconds, got {self.target_s!r}")
        if not (1 <= self.min_bytes <= self.start_bytes <= self.max_bytes):
            raise ValueError(f"need 1 <= min_bytes <= start_bytes <= max_bytes, got "
                             f"{self.min_bytes}, {self.start_bytes}, {self.max_bytes}")
        if not (1 <= self.min_samples <= self.max_samples):
            raise ValueError(f"need 1 <= min_samples <= max_samples, got {self.min_samples}, "
                             f"{self.max_samples}")
        if self.ping_reps < 1:
            raise ValueError(f"ping_reps: must be at least 1, got {self.ping_reps}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be positive, got {self.timeout_s!r}")
        if self.warm_bytes < 1 or self.chunk_bytes < 1:
            raise ValueError(f"warm_bytes and chunk_bytes: must be positive, got "
                             f"{self.warm_bytes}, {self.chunk_bytes}")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s: must be positive, got {self.budget_s!r}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.sample_pairs < 1:
            raise ValueError(f"sample_pairs: must be at least 1, got {self.sample_pairs!r}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance: must be in (0, 1), got {self.tolerance!r}")
