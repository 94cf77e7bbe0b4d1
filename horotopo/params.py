"""The tuning parameters of the engine, the adaptivity, the probe and the planner, each
documented once.

Each concern has one frozen dataclass: :class:`EngineParams`, :class:`AdaptParams`,
:class:`ProbeParams`, :class:`PlannerParams`. A field holds its default and, in its metadata,
why that value (the evidence behind it); :func:`why` reads it. The modules of a concern take
their numbers from the object they are given, and from the defaults (``ENGINE``, ``ADAPT``,
``PROBE``, ``PLANNER``) when given none, so no tuning number lives anywhere else. :mod:`horotopo.config` declares the
fields a user may override through the environment and builds the objects with those
overrides (:func:`horotopo.config.adapt_params`).

This module stands below everything else and imports nothing of the package.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple, Type

__all__ = ["EngineParams", "AdaptParams", "ProbeParams", "PlannerParams", "ENGINE", "ADAPT",
           "PROBE", "PLANNER",
           "PARAMETER_OBJECTS", "why", "describe"]


def _param(default: Any, why: str) -> Any:
    """A field with its default and the reason for that value."""
    return dataclasses.field(default=default, metadata={"why": why})


@dataclass(frozen=True)
class EngineParams:
    """How the engine times itself and paces a tree's chunks."""

    calibration_sizes: Tuple[int, ...] = _param(
        (64 << 10, 1 << 20, 4 << 20, 16 << 20),
        "Engine.calibrate()'s ladder, in bytes. Steps of 16x and 4x: the second size must be "
        "large enough, even on a slow network where the budget stops the ladder there, for "
        "bandwidth (not per-call latency) to set its time, or the fit extrapolates a slope it "
        "never saw.")
    calibration_repeats: int = _param(
        2, "Timed runs per size of Engine.calibrate() after one warm-up; the best of them "
           "counts, and more would spend init()'s HOROTOPO_CALIBRATE_S budget on repeats "
           "instead of sizes.")
    timing_repeats: int = _param(
        3, "Timed runs per size and algorithm of Engine.time_algorithms() after one warm-up; "
           "the slowest rank's best of them counts.")
    prior_mpi_latency_s: float = _param(
        100e-6, "MPI_Allreduce's fixed cost in the cost model of an engine nobody calibrated "
                "(the hvd runtime calibrates at init and then learns from its own calls): the "
                "engine's 8-byte library path on the development box (2 shared cores, MPICH "
                "over shared memory, 4 ranks; mpiexec -n 4 python "
                "benchmarks/engine_overhead.py). It describes that machine, not a job's "
                "network.")
    prior_tree_latency_s: float = _param(
        6.6e-3, "The topology side's fixed cost in that uncalibrated model: an 8-byte tree "
                "allreduce on the same box and run (six hops, each waiting for a descheduled "
                "rank).")
    prior_per_message_s: float = _param(
        34e-6, "Wall time per chunk message in that uncalibrated model, from the same run; "
               "a calibration replaces it by the fitted scale.")
    in_flight_extra: int = _param(
        2, "Chunks of one tree in flight at a rank beyond the scratch window and a chunk per "
           "hop each way (what keeps every link of the tree busy): a small margin over that.")

    def __post_init__(self) -> None:
        if not self.calibration_sizes or any(int(s) < 1 for s in self.calibration_sizes):
            raise ValueError(f"calibration_sizes: need at least one size, each >= 1 byte, got "
                             f"{self.calibration_sizes!r}")
        for name in ("calibration_repeats", "timing_repeats"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)!r}")
        if self.in_flight_extra < 0:
            raise ValueError(f"in_flight_extra: must be >= 0, got {self.in_flight_extra!r}")
        for name in ("prior_mpi_latency_s", "prior_tree_latency_s", "prior_per_message_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0 seconds, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class AdaptParams:
    """When a lasting slowdown re-plans, and how the re-plan measures and judges itself."""

    threshold: float = _param(
        0.3, "A call is slow below 0.7 of its size's baseline efficiency. Compared with a "
             "baseline, not with the model, so that a machine that never reaches the modelled "
             "rate (Python overhead, a busy CPU) does not re-plan all the time.")
    consecutive: int = _param(
        3, "Slow calls in a row that trigger a re-plan: a descheduled rank or another job's "
           "burst makes one call, sometimes two, slow; a degraded link makes all of them.")
    warmup: int = _param(
        3, "Calls after each plan switch whose median efficiency is a size's baseline: the "
           "median of three ignores one outlier.")
    min_seconds: float = _param(
        0.005, "Calls shorter than 5 ms are latency-bound: their efficiency is noise, so "
               "they neither count nor break a slow run.")
    min_slow_s: float = _param(
        0.0, "Seconds a slow run must add up to before it triggers, for an engine built "
             "directly: none, the run of slow calls alone decides.")
    runtime_min_slow_s: float = _param(
        1.0, "The same for the hvd runtime's engine: a burst of scheduling noise on a busy "
             "machine rarely lasts a second, a degraded link stays degraded, so noise does not "
             "buy a re-probe inside a user's call.")
    max_backoff: int = _param(
        8, "Largest factor a fruitless re-plan's back-off multiplies the slow run by: each "
           "one doubles it, so a noisy machine pays for fewer and fewer re-probes, and after "
           "three the run needed stops growing.")
    trial_calls: int = _param(
        3, "Tree calls a new plan is timed for before it is kept: a plan made for the slowed "
           "model can run slower than the one it replaced (5% at 256 simulated ranks), and "
           "the median of three calls tells.")
    choice_margin: float = _param(
        0.1, "The selector keeps a size's algorithm until the other's estimate is lower by "
             "more than this fraction: with the median over a window, one descheduled rank's "
             "slow call moves nothing.")
    choice_window: int = _param(
        5, "Timed calls per size bucket and algorithm that the self-tuner's record keeps; the "
           "selector scales the cost model by their median ratio.")
    explore_ratio: float = _param(
        2.0, "The selector tries an algorithm never measured at a size once when the model "
             "puts it within this factor of the chosen one: the model extrapolates from a "
             "short calibration, and one measured call settles what it cannot.")
    explore_min_bytes: int = _param(
        1 << 20, "Smallest size the selector explores at: below 1 MiB a wrong try costs little "
                 "and latency, which the calibration measured, decides.")
    sample_min_bytes: int = _param(
        64 << 10, "Smallest library call worth a timing agreement, and the smallest size whose "
                  "measured ratios the selector reads: smaller calls are latency noise for a "
                  "bandwidth decision.")
    reprobe_target_s: float = _param(
        0.025, "Aimed duration of one timed transfer of a re-probe: a handful of pairs costs "
               "a fraction of a second on a 1 gbps network.")
    reprobe_timeout_s: float = _param(
        10.0, "A re-probe transfer that takes longer is an error naming the pair.")
    reprobe_budget_s: float = _param(
        60.0, "Time bound of one re-probe's measurements, far above what a handful of suspect "
              "pairs takes, so that the bound does not shorten their transfers.")

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold!r}")
        for name in ("consecutive", "warmup", "max_backoff", "choice_window"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if int(self.trial_calls) != self.trial_calls or self.trial_calls < 0:
            raise ValueError(f"trial_calls must be a count of calls >= 0, got "
                             f"{self.trial_calls!r}")
        if not 0 <= self.choice_margin < 1:
            raise ValueError(f"choice_margin must be in [0, 1), got {self.choice_margin!r}")
        if not self.explore_ratio >= 1:
            raise ValueError(f"explore_ratio must be >= 1, got {self.explore_ratio!r}")
        for name in ("min_seconds", "min_slow_s", "runtime_min_slow_s", "explore_min_bytes",
                     "sample_min_bytes"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("reprobe_target_s", "reprobe_timeout_s", "reprobe_budget_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ProbeParams:
    """How the probe turns measured rates into a model and a diagnosis.

    The measuring effort itself (message sizes, repeats, budget) is
    :class:`horotopo.probe.config.ProbeConfig`, whose presets are the probe's modes.
    """

    gap: float = _param(
        1.5, "Rate levels closer than this ratio are one level: noise, not structure.")
    margin: float = _param(
        0.2, "'Clearly below' for the inference of shared resources: more than 20% under "
             "what the pairwise figures predict.")
    pairs_up_to: int = _param(
        16, "Largest job the 'auto' scheme probes pair by pair: n (n - 1) pair tests stay "
            "within the probe's budget up to about 16 ranks; above, host leaders in rounds.")
    scan_max_ranks: int = _param(
        5, "Most ranks whose every split in two is tested when the pair rates show no groups: "
           "2 (2^(n-1) - 1 - n) tests, 6 at 4 ranks and 20 at 5, then 50 at 6 (too many for "
           "the quick probe's budget).")
    slow_ratio: float = _param(
        1.5, "The diagnosis's 'clearly below its peers' (a NIC against the median of the "
             "other hosts' NICs): the probe's own gap between rate levels, so that what the "
             "probe tells apart is what the doctor names; measurement noise (a probe's pairs "
             "agree with the links within 15%) stays well inside it.")
    listed_links: int = _param(
        10, "Slow host pairs the doctor's text names one by one before it counts the rest "
            "(its JSON has all).")

    def __post_init__(self) -> None:
        if not self.gap > 1:
            raise ValueError(f"gap: a ratio between rate levels, must be above 1, got "
                             f"{self.gap!r}")
        if not 0 < self.margin < 1:
            raise ValueError(f"margin: must be in (0, 1), got {self.margin!r}")
        if not self.slow_ratio > 1:
            raise ValueError(f"slow_ratio: must be above 1, got {self.slow_ratio!r}")
        for name in ("pairs_up_to", "scan_max_ranks", "listed_links"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class PlannerParams:
    """How the planner sizes chunks and windows and searches for a fair set of trees."""

    window_bytes: int = _param(
        2 << 20, "Scratch per reduce child and tree of the automatic window, in bytes. Small "
                 "chunks need many in flight to ride out a peer that is slow to be scheduled "
                 "(racks-2x3, emulated, 64 KiB chunks: 16 in flight ran 1.2-1.5x faster than "
                 "4); big chunks need few (4 x 1 MiB is as fast as MPI allows over shared "
                 "memory).")
    default_window: int = _param(
        4, "The smallest automatic window per tree, in chunks: what 1 MiB and larger chunks "
           "get.")
    max_window: int = _param(32, "The largest automatic window per tree, in chunks.")
    rank_window_bytes: int = _param(
        12 << 20, "Scratch per reduce child over all of a plan's trees, in bytes: past it the "
                  "automatic window shrinks (to min_window at least). Every chunk of the "
                  "window costs its posts up front: in the simulator at 64 MiB, 32 trees of "
                  "128 KiB chunks (window 16) ran sites-64 202.4 ms and fattree-64 142.1, with "
                  "3 chunks 177.2 and 123.2. The bundled and emulated plans (1-4 trees) stay "
                  "under it.")
    min_window: int = _param(
        3, "The smallest window the rank budget leaves, in chunks. 2 ran the host forests of "
           "16 ranks 4% faster, but a deep forest (racks-256 with a slowed uplink, 8 trees 32 "
           "hops deep, 1 MiB chunks) ran 426.2 ms at 2, 403.8 at 3 and 397.9 at 4: a parent "
           "that holds fewer chunks holds back every child's next send.")
    min_chunk: int = _param(
        64 << 10, "The smallest chunk the planner considers for a tree, in bytes: the low end of "
                  "the range the alpha-beta model's chunk choice searches.")
    max_chunk: int = _param(
        4 << 20, "The largest chunk the planner considers for a tree, in bytes: the high end of "
                 "the range the alpha-beta model's chunk choice searches.")
    chunk_scales: Tuple[float, ...] = _param(
        (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
        "Factors of every tree's chunk tried together after the tree-by-tree choice: a rank's "
        "CPU serves every tree, so a plan of many trees whose chunks each tree chose small "
        "keeps its busiest rank longer than larger chunks would.")
    exhaustive_max: int = _param(
        6, "The fair-subset search tries every subset of up to this many trees (2^6 fair "
           "allocations); above, it removes trees greedily.")
    greedy_all_max: int = _param(
        32, "Up to this many trees each greedy round of the fair-subset search tries every "
            "removal; above, only the most over-represented candidates.")
    candidates: int = _param(
        8, "Removals tried per greedy round above greedy_all_max trees: the trees most "
           "over-represented at their bottleneck first.")
    greedy_rounds: int = _param(
        8, "Greedy rounds of the fair-subset search above greedy_all_max trees.")
    tree_tie: float = _param(
        0.02, "In the exhaustive fair-subset search, fair sums within this fraction of the best "
              "tie, and the fewest trees win: the measured model's rates are within a few "
              "percent of the network's (92.7-96.7% on racks-2x3 in the simulator).")

    def __post_init__(self) -> None:
        for name in ("window_bytes", "default_window", "max_window", "rank_window_bytes",
                     "min_window", "min_chunk", "max_chunk", "exhaustive_max",
                     "greedy_all_max", "candidates", "greedy_rounds"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"{name}: must be a positive whole number, got {value!r}")
        if self.default_window > self.max_window:
            raise ValueError(f"default_window ({self.default_window}) must not exceed "
                             f"max_window ({self.max_window})")
        if self.min_chunk > self.max_chunk:
            raise ValueError(f"min_chunk ({self.min_chunk}) must not exceed max_chunk "
                             f"({self.max_chunk})")
        if not self.chunk_scales or any(not f > 0 for f in self.chunk_scales):
            raise ValueError(f"chunk_scales: need at least one factor, each > 0, got "
                             f"{self.chunk_scales!r}")
        if not 0 <= self.tree_tie < 1:
            raise ValueError(f"tree_tie: must be in [0, 1), got {self.tree_tie!r}")

    def differing(self) -> Dict[str, Any]:
        """The fields whose value is not the default, by name (JSON-ready)."""
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


#: The defaults, read where a caller gives no object of its own.
ENGINE = EngineParams()
ADAPT = AdaptParams()
PROBE = ProbeParams()
PLANNER = PlannerParams()

#: Every parameter object, in the order docs/settings.md lists them.
PARAMETER_OBJECTS: Tuple[Type[Any], ...] = (EngineParams, AdaptParams, ProbeParams,
                                             PlannerParams)


def why(cls: Type[Any], name: str) -> str:
    """Why field ``name`` of parameter object ``cls`` has its default."""
    return {f.name: f.metadata["why"] for f in dataclasses.fields(cls)}[name]


def describe(cls: Type[Any]) -> List[Dict[str, Any]]:
    """Each field of ``cls``: ``{"name", "default", "why"}``, in declaration order."""
    return [{"name": f.name, "default": f.default, "why": f.metadata["why"]}
            for f in dataclasses.fields(cls)]
