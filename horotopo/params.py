"""The tuning parameters of the package, each documented once.

Each concern has one frozen dataclass: :class:`EngineParams`, :class:`AdaptParams`,
:class:`ProbeParams`, :class:`PlannerParams`, :class:`RuntimeParams` (the control plane's and
transports' waits) and :class:`ReliabilityParams` (timeouts on peers, and how a job ends). A
field holds its default and, in its metadata, why that value (the evidence behind it);
:func:`why` reads it. The modules of a concern take their numbers from the object they are
given, and from the defaults (``ENGINE``, ``ADAPT``, ``PROBE``, ``PLANNER``, ``RUNTIME``,
``RELIABILITY``) when given none, so no tuning number lives anywhere else
(tests/test_params.py scans the package for module-level numbers). :mod:`horotopo.config`
declares the fields a user may override through the environment and builds the objects with
those overrides (:func:`horotopo.config.planner_params`, :func:`~horotopo.config.adapt_params`).

This module stands below everything else and imports nothing of the package.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple, Type

__all__ = ["EngineParams", "AdaptParams", "ProbeParams", "PlannerParams", "RuntimeParams",
           "ReliabilityParams", "ENGINE", "ADAPT", "PROBE", "PLANNER", "RUNTIME", "RELIABILITY",
           "PARAMETER_OBJECTS", "why", "describe"]


def _param(default: Any, why: str) -> Any:
    """A field with its default and the reason for that value."""
    return dataclasses.field(default=default, metadata={"why": why})


def _require_at_least(obj: Any, least: float, names: Tuple[str, ...]) -> None:
    """Raise ValueError naming the first field of ``names`` below ``least``."""
    for name in names:
        if not getattr(obj, name) >= least:
            raise ValueError(f"{name}: must be >= {least:g}, got {getattr(obj, name)!r}")


def _require_positive(obj: Any, names: Tuple[str, ...]) -> None:
    """Raise ValueError naming the first field of ``names`` that is not above 0."""
    for name in names:
        if not getattr(obj, name) > 0:
            raise ValueError(f"{name}: must be positive, got {getattr(obj, name)!r}")


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
    single_size_latency_share: float = _param(
        0.5, "When calibration timed a single size (a slow network spent the budget on it), "
             "each latency of the fitted model is at most this share of that size's measured "
             "time, the prior's when smaller, so the rest of the time is read as bandwidth "
             "(not measured against other shares here).")
    kept_predictions: int = _param(
        1024, "Predictions of the topology side's time that the cost model keeps (per plan, "
              "size and costs; it asks on every call, and one costs a pipeline prediction of "
              "every tree, about a millisecond at 16 ranks). A job's gradients come in a few "
              "sizes; the bound only stops a job of ever-new sizes from growing it.")
    in_flight_extra: int = _param(
        2, "Chunks of one tree in flight at a rank beyond the scratch window and a chunk per "
           "hop each way (what keeps every link of the tree busy): a small margin over that.")
    pace_factor: float = _param(
        0.0, "0 sends a tree's chunks as soon as its pipeline allows; f > 0 holds each tree "
             "allreduce's sends up and down to f times the tree's planned rate, so that no "
             "tree takes more of a shared link than the plan gave it. Off: in the simulator "
             "(benchmarks/execution_sim.py's pace variants, "
             "docs/results/execution_sim_pacing.md) it moved the trees' times by a few percent "
             "either way, and not at all where a tree has one chunk.")
    check_first_bytes: int = _param(
        256 << 10, "From this many bytes up, the library allreduce's float min and max first "
                   "ask the ranks whether any holds a NaN or -0.0 (two passes and a latency) "
                   "instead of converting to order keys (about six passes): a pass over 256 "
                   "KiB costs about what a small allreduce does.")
    gpu_block_threads: int = _param(
        256, "Threads per block of the device reduce kernels: a multiple of the 32-thread "
             "warp, the common choice for memory-bound elementwise kernels (not measured "
             "against others here).")
    gpu_blocks_per_sm: int = _param(
        8, "Most blocks per streaming multiprocessor in a device reduce kernel's grid: enough "
           "to fill every SM several times over, while the kernels' grid-stride loop covers "
           "any larger array (not measured against others here).")
    staging_slots: int = _param(
        2, "Pinned host slots of a device-buffer stager: two give double buffering (one slot "
           "copies while the other's chunk is on the wire); more pin more host memory for "
           "copies that the wire, not the copy engine, paces.")
    cost_chunks: Tuple[int, ...] = _param(
        (256, 1 << 10, 4 << 10, 64 << 10, 256 << 10, 1 << 20),
        "Chunk sizes of horotopo calibrate's measured rows, in bytes: small chunks expose the "
        "per-message cost, large ones the per-byte cost; the fit needs both.")
    cost_repeats: int = _param(
        5, "Calls per row of horotopo calibrate, the least CPU time of them counting: a few "
           "repeats ride out a descheduled call.")
    cost_row_messages: int = _param(
        512, "Messages each row of horotopo calibrate aims at (its buffer is sized for it, "
             "between cost_min_buffer_bytes and cost_max_buffer_bytes), so that every row's "
             "time is mostly its messages'.")
    cost_min_buffer_bytes: int = _param(
        64 << 10, "The smallest buffer of a horotopo calibrate row: a row of small chunks "
                  "still moves enough bytes that the per-byte cost shows beside the "
                  "per-message one.")
    cost_max_buffer_bytes: int = _param(
        16 << 20, "The largest buffer of a horotopo calibrate row: rows of large chunks then "
                  "have fewer than cost_row_messages messages, and the calibration stays "
                  "within a few seconds.")

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
        if not 0 <= self.pace_factor < float("inf"):
            raise ValueError(f"pace_factor: must be a finite number >= 0 (0: off), got "
                             f"{self.pace_factor!r}")
        if not 0 < self.single_size_latency_share < 1:
            raise ValueError(f"single_size_latency_share: must be in (0, 1), got "
                             f"{self.single_size_latency_share!r}")
        if int(self.kept_predictions) < 1:
            raise ValueError(f"kept_predictions: must be at least 1, got "
                             f"{self.kept_predictions!r}")
        if self.cost_min_buffer_bytes > self.cost_max_buffer_bytes:
            raise ValueError(f"cost_min_buffer_bytes ({self.cost_min_buffer_bytes}) must not "
                             f"exceed cost_max_buffer_bytes ({self.cost_max_buffer_bytes})")
        _require_at_least(self, 1, ("check_first_bytes", "cost_repeats", "cost_row_messages",
                                    "cost_min_buffer_bytes",
                                    "gpu_block_threads", "gpu_blocks_per_sm", "staging_slots"))
        if not self.cost_chunks or any(int(c) < 1 for c in self.cost_chunks):
            raise ValueError(f"cost_chunks: need at least one size, each >= 1 byte, got "
                             f"{self.cost_chunks!r}")


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
    warm_share: float = _param(
        0.25, "A timed message follows a warm-up of at least this share of its size (and "
              "ProbeConfig.warm_bytes, at most the size itself), so that a connection's slow "
              "start is over before the timing (not measured against other shares here).")
    growth_attempts: int = _param(
        12, "Attempts of a test beyond its max_samples: those whose transfers were too short "
            "(below half the target) and grew the message, so that a test that starts far "
            "too small still reaches its samples.")
    max_growth: float = _param(
        64.0, "Most a too-short transfer's message grows at once (it at least doubles): the "
              "target over a transfer's time overestimates the growth needed when latency "
              "took most of that time (not measured against other caps here).")
    next_pair_start_share: float = _param(
        0.25, "The pairwise scheme starts a pair's bandwidth test at this share of the last "
              "test's size: a slower pair would make a full-size first attempt last long, a "
              "faster one costs one cheap attempt to grow.")
    hosts_per_group_guess: int = _param(
        4, "Before the host scheme knows the host groups, its budget keeps time for two "
           "aggregate tests (out of and into a group) per this many hosts, at least two: a "
           "guess at the groups' count, which only sets how the targets shorten (not measured "
           "against other guesses here).")
    pair_cost: float = _param(
        5.0, "A test costs about this many times its target transfer (growing the message, "
             "then the samples): what the time bound's shortening of the targets assumes.")
    subset_factor: float = _param(
        2.0, "A concurrent test aims this many times longer than a pair's: its flows share "
             "links, and each must still move enough bytes to time.")
    test_overhead_s: float = _param(
        0.01, "Fixed seconds a test costs beside its transfers (the allreduces that agree on "
              "its figures), until the tests so far show more.")
    min_target_s: float = _param(
        0.004, "The shortest a transfer's target gets when the budget runs short: below a "
               "few ms a timed transfer is mostly its latency.")
    group_overlap: float = _param(
        0.5, "Two hosts are in one group when the sets of hosts they kept their rate with "
             "overlap at least this much (Jaccard): one round that happened to load an uplink "
             "lightly does not join racks.")
    group_density: float = _param(
        0.75, "A host group found with fewer of its own pairs keeping their rate is split "
              "further, with a stricter overlap (nothing inside a rack is shared).")
    group_overlap_step: float = _param(
        0.1, "How much more overlap each further split of a host group asks for (up to an "
             "overlap of 1) (not measured against other steps here).")
    universal_ratio: float = _param(
        2.0, "A host that kept its rate with more than this many times the median host's count "
             "is placed by nothing: it stays a group of its own.")
    intra_share: float = _param(
        0.15, "Share of the hosts scheme's time budget for the measurements inside the hosts "
              "(fast local links).")
    local_max_bytes: int = _param(
        1 << 20, "The largest transfer inside a host. Every rank transfers at once in that "
                 "phase, and a simulation holds every rank's messages in one process (4 MiB "
                 "each at 1024 ranks: 12 GB).")
    round_pings: int = _param(
        2, "Ping-pongs per pair in a leaders' round (the first opens the connection and does "
           "not count).")
    long_rtt_s: float = _param(
        0.002, "A leaders' pair whose first round trip took this long (a WAN's) is pinged once "
               "more, not round_pings times: what a descheduled rank adds is small beside such "
               "a round trip, and each sample costs it again (10 ms a round over a 5 ms WAN, "
               "1.3 s of the 127 rounds of 1024 ranks on two sites).")
    fan_partners: int = _param(
        8, "Most partners of one NIC's fan test, taken fastest first until their expected "
           "rates exceed the NIC's: a bound on the test's flows, and its time, where the "
           "partners are slow.")
    fan_headroom: float = _param(
        1.25, "A fan test's partners add up to this much more than the fastest NIC seen, so "
              "that a NIC as fast as that one still caps the fan.")
    wait_budgets: float = _param(
        20.0, "How long ranks wait for the leaders' (or the pairs') phase, in time budgets "
              "beyond the timeouts: far above what the phase takes, so only a lost rank hits "
              "it.")

    def __post_init__(self) -> None:
        if not self.gap > 1:
            raise ValueError(f"gap: a ratio between rate levels, must be above 1, got "
                             f"{self.gap!r}")
        if not 0 < self.margin < 1:
            raise ValueError(f"margin: must be in (0, 1), got {self.margin!r}")
        if not self.slow_ratio > 1:
            raise ValueError(f"slow_ratio: must be above 1, got {self.slow_ratio!r}")
        _require_at_least(self, 1, ("pairs_up_to", "scan_max_ranks", "listed_links",
                                    "hosts_per_group_guess",
                                    "local_max_bytes", "round_pings", "fan_partners"))
        _require_positive(self, ("pair_cost", "subset_factor", "min_target_s", "universal_ratio",
                                 "fan_headroom", "wait_budgets", "long_rtt_s", "max_growth"))
        _require_at_least(self, 0, ("growth_attempts",))
        for name in ("warm_share", "next_pair_start_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)!r}")
        _require_at_least(self, 0, ("test_overhead_s",))
        for name in ("group_overlap", "group_density", "intra_share", "group_overlap_step"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)!r}")


@dataclass(frozen=True)
class PlannerParams:
    """How far the planner refines its packing, how it sizes chunks and windows, and how it
    searches for a fair set of trees."""

    max_trees_per_root: int = _param(
        4, "Pruning keeps at most this many reduce and this many broadcast trees per root: "
           "each tree costs its own pipeline fill and messages, and the plan reports what "
           "pruning gave up (pruning_loss).")
    target_gap: float = _param(
        0.01, "The certified gap at which the packing stops refining (column generation stops "
              "at half of it): 1% of the optimum is below what the model's rates tell apart "
              "(they are 92.7-96.7% of the network's on racks-2x3 in the simulator).")
    packing_eps: float = _param(
        0.1, "Step of the packing's multiplicative weights (Garg-Koenemann), which seed the "
             "column generation with trees: a larger step moves the lengths faster and gives "
             "coarser trees; the certified gap, not this step, decides when the packing stops.")
    columns_per_round: int = _param(
        4, "Roots priced per kind and column-generation round of a flat packing, or of a "
           "hierarchical one up to hierarchical_large_machines machines (past them it prices "
           "fewer): several columns per LP solve amortise the solve.")
    packing_weights_share: float = _param(
        0.2, "Share of the packing's time cap the multiplicative weights may take before "
             "column generation starts: they seed the pool quickly, and the certified bound "
             "comes from column generation's duals (not measured against other shares here).")
    packing_columns_share: float = _param(
        0.8, "Share of the packing's time cap past which column generation stops, leaving the "
             "rest to pruning, which re-solves the LP over the kept trees (not measured against "
             "other shares here).")
    weights_iterations_per_rank: int = _param(
        2, "Multiplicative-weights iterations per rank, up to max_weights_iterations: the "
           "seeding grows with the job until the cap (not measured against other counts "
           "here).")
    max_weights_iterations: int = _param(
        32, "The most multiplicative-weights iterations: each costs three Edmonds runs, most "
            "of the packing's time at hundreds of machines, and column generation refines "
            "from the seeds anyway.")
    prune_min_share: float = _param(
        0.01, "Pruning drops trees below this fraction of the packed rate (and below "
              "prune_rank_share / n at n ranks, whichever is smaller): each tree costs its own "
              "pipeline fill and messages for a share that moves little.")
    prune_rank_share: float = _param(
        0.25, "With n ranks, pruning also keeps trees down to this over n of the packed rate, "
              "so that a large job, whose fair trees are many and each small, keeps them.")
    smoothing_mix: float = _param(
        0.5, "Column generation prices at this mix of the best certified dual point and the LP "
             "duals (Wentges smoothing) once a certified point exists: the midpoint, the usual "
             "first choice for this stabilization (not measured against other mixes here).")
    smoothing_shrink: int = _param(
        4, "When nothing prices out at the smoothed duals, the mix is divided by this and the "
           "round is priced again, trusting the LP duals more (not measured against other "
           "factors here).")
    smoothing_min_mix: float = _param(
        1e-3, "Below this mix the smoothed duals are the LP duals for any purpose: nothing "
              "pricing out there means the pool's LP is optimal, and column generation stops.")
    prune_gap_share: float = _param(
        0.25, "Pruning may lose up to this share of target_gap of the packed rate when it "
              "keeps only the ring or each root's top trees, leaving the rest of the gap to "
              "the packing itself (not measured against other shares here).")
    prune_passes_per_rank: int = _param(
        4, "Passes of the pruning loop per rank, plus prune_min_passes: a bound on a loop "
           "that bans at least one tree per pass and usually ends far earlier; it stops a "
           "cycling re-pricing, it does not shape a finished pruning.")
    prune_min_passes: int = _param(
        20, "Passes of the pruning loop beyond prune_passes_per_rank per rank (the same "
            "bound, for small jobs).")
    filled_dual_period: int = _param(
        5, "Every this many column-generation rounds, the hierarchical packing also prices "
           "lengths 1/c on the resources the pool's LP fills (another certified bound): a "
           "pricing costs as much as a round's, and the LP duals usually certify first.")
    large_columns_per_round: int = _param(
        2, "Roots priced per kind and round of the hierarchical packing past "
           "hierarchical_large_machines machines: Edmonds is the cost at hundreds of "
           "machines (a rack's hosts all prefer one parent, so it contracts one cycle per "
           "level).")
    huge_columns_per_round: int = _param(
        1, "The same past huge_machines_factor times hierarchical_large_machines machines: one "
           "tree per kind and round.")
    huge_machines_factor: int = _param(
        4, "Past this many times hierarchical_large_machines machines the hierarchical "
           "packing prices huge_columns_per_round roots per round (256 machines: 2048 ranks "
           "of 8).")
    max_rounds: int = _param(
        500, "Cap on the packing's column-generation rounds: far above what a plan takes to "
             "meet target_gap or its time cap, so that only a stalled run stops here (the "
             "result stays certified).")
    packing_time_limit_s: float = _param(
        60.0, "CPU seconds a flat packing's column generation and pruning may take (this "
              "process's CPU time, so that other load on the machine does not change the "
              "plan): a bound for a pathological network, not a budget a plan meets; the "
              "result stays certified.")
    seed_roots: int = _param(
        2, "Roots whose bottleneck trees seed the hierarchical packing up to "
           "hierarchical_large_machines machines (past them one: a second moved no row of the "
           "scale table): central, fast roots whose trees meet the machine cut's bound at once "
           "on racks with slow NICs.")

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
                  "3 chunks 177.2 and 123.2 (16 trees of 512 KiB, window 4 -> 3: sites-16 "
                  "95.1 -> 88.5 ms). The bundled and emulated plans (1-4 trees) stay under "
                  "it.")
    min_window: int = _param(
        3, "The smallest window the rank budget leaves, in chunks. 2 ran the host forests of "
           "16 ranks 4% faster, but a deep forest (racks-256 with a slowed uplink, 8 trees 32 "
           "hops deep, 1 MiB chunks) ran 426.2 ms at 2, 403.8 at 3 and 397.9 at 4, and "
           "fattree-256 at 256 KiB chunks (128 trees) 167.6 at 2 and 160.3 at 3: a parent "
           "that holds fewer chunks holds back every child's next send, and a deep tree or a "
           "crowded link varies the more.")
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

    hierarchical_max_roots: int = _param(
        16, "The certified packing over hosts, past 64 machines, keeps the trees of at most "
            "this many roots. On racks, a fat tree and two sites at 1024 ranks its LP optimum "
            "puts the ring's chains on half the machines (64 host trees, 512 rank-level trees "
            "128 machines deep) for 1/H more rate than 16 roots give (629.9 against 625.0 "
            "MB/s); building and predicting that forest took more than every other forest "
            "candidate together, and the host forest was predicted faster on every such row.")
    hierarchical_packing_cpu_s: float = _param(
        8.0, "Past 64 machines, the CPU seconds the packing's column generation and pruning may "
             "take from 512 machines up, and in proportion to the square of the machines below "
             "(hierarchy.packing_cpu_cap; its multiplicative weights a fifth of them); the "
             "result stays certified. On racks with slow NICs at 4096 ranks (512 machines) 20 "
             "rounds of column generation (10.7 s of CPU, from 16.1 s in) raised R from 192.0 "
             "to 194.4 MB/s against a bound of 312.5, while planning 4096 ranks is to take at "
             "most 20 s. On the probed racks with slow NICs at 1024 ranks (128 machines) 8 s "
             "of column generation raised R by 0.1% and the plan was the same at 0.5 s.")
    packing_cpu_full_machines: int = _param(
        512, "Machines from which the hierarchical packing gets all of "
             "hierarchical_packing_cpu_s; below, in proportion to the square of the machines "
             "(hierarchy.packing_cpu_cap): 4096 ranks of 8, the largest job the planning "
             "targets name (20 s there, 2 s at 1024 ranks).")
    hierarchy_auto_min_ranks: int = _param(
        64, "HOROTOPO_HIERARCHY=auto plans over hosts above this many ranks, where some machine "
            "holds several: the flat planner takes about a second at 64 ranks and grows steeply "
            "beyond, while the hierarchy loses little. Above it, ranks that each have a host of "
            "their own are grouped by their top-of-rack switch into machines.")
    hierarchical_large_machines: int = _param(
        64, "Past this many machines the hierarchical packing works at scale: the topology-"
            "aware ring's chains alone seed it (the rank-order ring's too would double the LP "
            "at hundreds of machines), from one bottleneck seed root (a second moved no row of "
            "the scale table), pricing two roots per round (one past four times this), and "
            "hierarchical_max_roots and hierarchical_packing_cpu_s apply.")
    flat_bound_edmonds_max_ranks: int = _param(
        256, "The flat bound reported beside a hierarchical plan is priced exactly by Edmonds "
             "on the ranks up to this many ranks (2-7 s at 1024 on 2 cores); beyond, where the "
             "links form a tree, from lower bounds on the tree prices (certified, maybe looser).")
    group_latency_factor: float = _param(
        1.5, "Host forests: machines whose route latency, beyond the latency between two ranks "
             "of one machine, is at most this multiple of the smallest one between two "
             "machines share a group. Within one switch a route has two NIC hops beyond the "
             "local links; through a rack uplink it has two more (2x on the generators: racks "
             "split), and a WAN's milliseconds are thousands of times a data-centre hop.")
    max_host_trees: int = _param(
        32, "The most host-level trees a planned host forest keeps (each is as many rank-level "
            "trees as a machine has ranks): at 512 hosts of 8 ranks, 256 rank-level trees "
            "instead of 4096. Chosen so that a 64 MiB buffer still gives every rank-level tree "
            "256 KiB at 4096 ranks, and so that the planner's and the simulator's cost stays a "
            "small multiple of the deep forest's (at most 2 H host trees there).")
    host_tree_counts: Tuple[int, ...] = _param(
        (4, 8, 16), "Host-tree counts the forest choice predicts (each at most the machines' "
                    "count and max_host_trees; every rotation, one host tree per machine, is "
                    "offered besides where the machines are at most max_host_trees): fewer "
                    "trees mean fewer messages per rank and larger chunks, more trees better "
                    "balanced loads and a shorter pipeline fill; the prediction for the "
                    "planned size decides. Each count is a plan to build and predict. A count "
                    "above 16 is offered only as every rotation: 32 of 128 machines' "
                    "rotations ran many times slower than predicted in the simulator.")
    host_tree_arity: int = _param(
        2, "Children per machine in a host forest's trees (a heap of machines, rotated per "
           "tree): in a binary tree a machine exchanges each chunk with at most three others (its "
           "parent and two children) while the depth grows as log2 of the machines.")
    rotation_passes: int = _param(
        8, "Passes of swaps over the kept rotations of a host forest after the greedy choice "
           "(each keeps going while a swap improves the whole set): the greedy alone left 4 "
           "trees on 32 fattree hosts at 0.78 of every rotation's rate; the passes stop "
           "earlier when no swap helps.")
    host_fabric_factor: float = _param(
        8.0, "A machine for the host forests is also a set of ranks on a local fabric at least "
             "this many times faster than its way out: a GPU node's local fabric (10x the NIC "
             "on the generators). A top-of-rack switch of single-rank hosts behind a slower "
             "uplink also passes the machine test (racks-2x3: 4x), but a probe, which groups "
             "ranks by host name, could not find such a forest again.")

    gated_min_busy: float = _param(
        0.01, "The flow model charges the idle time a long route puts between a reduce arc's "
              "windows only where it takes at least this share of the arc's time: below it the "
              "windows' latency is lost in their bytes' time, and a further fluid run would "
              "move the prediction by less.")
    gated_passes: int = _param(
        12, "The most fluid runs the flow model makes to find the rates of trees whose reduce "
            "arcs idle between windows over a long route (each run's loads from the last "
            "one's rates, averaged with the last loads); it stops sooner once the idle shares "
            "move by less than gated_min_busy.")
    gated_max_busy: float = _param(
        0.9, "The share of a reduce arc's time that the idle time between its windows may take "
             "in the flow model, read from the rates of the last sharing, which the first one "
             "found ignoring that time: keeps the link load r / (1 - share) finite; a window "
             "bound holds the true share below 1.")

    def __post_init__(self) -> None:
        counts = ("max_trees_per_root", "window_bytes", "default_window", "max_window",
                  "rank_window_bytes", "min_window", "min_chunk", "max_chunk", "exhaustive_max",
                  "greedy_all_max", "candidates", "greedy_rounds", "hierarchical_max_roots",
                  "hierarchy_auto_min_ranks", "hierarchical_large_machines",
                  "flat_bound_edmonds_max_ranks", "max_host_trees", "columns_per_round",
                  "max_rounds", "seed_roots", "packing_cpu_full_machines", "host_tree_arity",
                  "rotation_passes", "weights_iterations_per_rank", "max_weights_iterations",
                  "filled_dual_period", "large_columns_per_round", "huge_columns_per_round",
                  "smoothing_shrink", "prune_passes_per_rank", "prune_min_passes",
                  "huge_machines_factor", "gated_passes")
        _require_at_least(self, 1, counts)
        for name in counts:
            if int(getattr(self, name)) != getattr(self, name):
                raise ValueError(f"{name}: must be a whole number, got {getattr(self, name)!r}")
        if self.default_window > self.max_window:
            raise ValueError(f"default_window ({self.default_window}) must not exceed "
                             f"max_window ({self.max_window})")
        if self.min_chunk > self.max_chunk:
            raise ValueError(f"min_chunk ({self.min_chunk}) must not exceed max_chunk "
                             f"({self.max_chunk})")
        if not self.chunk_scales or any(not f > 0 for f in self.chunk_scales):
            raise ValueError(f"chunk_scales: need at least one factor, each > 0, got "
                             f"{self.chunk_scales!r}")
        if not 0 < self.target_gap < 1:
            raise ValueError(f"target_gap: must be in (0, 1), got {self.target_gap!r}")
        if not self.host_tree_counts or any(
                int(c) != c or c < 1 for c in self.host_tree_counts):
            raise ValueError(f"host_tree_counts: must be whole numbers >= 1, got "
                             f"{self.host_tree_counts!r}")
        _require_at_least(self, 1, ("group_latency_factor", "host_fabric_factor"))
        _require_positive(self, ("packing_eps", "packing_time_limit_s", "prune_rank_share"))
        for name in ("packing_weights_share", "packing_columns_share", "prune_min_share",
                     "smoothing_mix", "smoothing_min_mix", "prune_gap_share",
                     "gated_min_busy"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)!r}")
        if not self.hierarchical_packing_cpu_s > 0:
            raise ValueError(f"hierarchical_packing_cpu_s: must be > 0, got "
                             f"{self.hierarchical_packing_cpu_s!r}")
        if not 0 <= self.tree_tie < 1:
            raise ValueError(f"tree_tie: must be in [0, 1), got {self.tree_tie!r}")
        if not self.gated_min_busy <= self.gated_max_busy < 1:
            raise ValueError(f"gated_max_busy: must be in [gated_min_busy, 1), got "
                             f"{self.gated_max_busy!r}")

    @classmethod
    def recorded(cls, record: Mapping[str, Any]) -> "PlannerParams":
        """The parameters a plan records (``plan.planner["params"]``: the fields that differ
        from the defaults, as :meth:`differing` writes them).

        Raises
        ------
        ValueError
            A field this version does not know, or a value it refuses.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise ValueError(f"planner parameters: unknown field(s) {', '.join(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()})

    def differing(self) -> Dict[str, Any]:
        """The fields whose value is not the default, by name (JSON-ready)."""
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def _check_nap(name: str, nap: Tuple[float, float]) -> None:
    if not (len(nap) == 2 and 0 < nap[0] <= nap[1]):
        raise ValueError(f"{name}: (first, longest) pause in seconds with 0 < first <= "
                         f"longest, got {nap!r}")


@dataclass(frozen=True)
class RuntimeParams:
    """How the runtime's control plane and transports wait, and where they switch scheme."""

    control_spin_polls: int = _param(
        50, "Polls the control wait spins on its test before it pauses: the wait is "
            "latency-bound (it is all a cached step waits for).")
    control_nap_s: Tuple[float, float] = _param(
        (2e-5, 1e-3), "The control wait's pauses after spinning, in seconds: from 20 us, "
                      "doubling up to 1 ms, so an idle job costs about nothing.")
    idle_nap_s: Tuple[float, float] = _param(
        (5e-5, 1e-3), "Idle polls of a deadline-bounded transport wait sleep from 50 us, "
                      "doubling up to 1 ms: short waits stay short, and a rank that waits for "
                      "seconds (a peer still planning) costs about nothing.")
    reroute_max_s: float = _param(
        5.0, "A cached request that waits longer than this (or than half the stall check, "
             "whichever is shorter) is sent through rank 0 again, so that a stall report can "
             "name the missing ranks: far below the stall check's 60 s default, and far above "
             "a control cycle (not measured against other bounds here).")
    handle_check_s: float = _param(
        0.2, "Seconds between a waiting handle's looks at whether the background thread "
             "still runs: a runtime that died is reported within this, and a wake-up five "
             "times a second costs nothing measurable.")
    start_check_s: float = _param(
        0.1, "Seconds between init()'s looks at whether the background thread, still setting "
             "up, has died: its error is raised within this.")
    named_max_ranks: int = _param(
        64, "Up to this many ranks the MPI transport's small collective steps with deadlines "
            "run point to point, so that a timeout names the missing peers; above, MPI's "
            "nonblocking collectives (log-depth, but unable to say which rank they wait for).")
    control_p2p_max_ranks: int = _param(
        64, "The same bound for the control allreduce under failure tracking: point to point "
            "up to it, so that a rank stuck in the engine is named; above, the library's.")
    timeline_flush_events: int = _param(
        2048, "Timeline events held in memory before they are written when no end-of-cycle "
              "flush comes (a program that drives the engine directly).")
    simulation_progress_s: float = _param(
        60.0, "Wall seconds between two progress lines of a long simulation.")
    simulation_progress_messages: int = _param(
        4096, "Messages a simulation moves between two looks at the wall clock for its "
              "progress line: a look per message would cost more than the message.")
    simulation_start_margin_s: float = _param(
        1.0, "Simulated seconds between the ranks' agreement on a common start and the start: "
             "far more than the agreement's log2(n) rounds take (a few WAN round trips), and "
             "free, since idle simulated time costs no wall time.")

    simulation_probe_bytes: int = _param(
        64 << 20, "Bytes of the long messages that measure the simulator's network "
                  "(horotopo.algorithms.simcheck.measure_network: its bandwidth factor, a "
                  "message's rate cap, the cross traffic, the sharing of a link, and the chain "
                  "allreduce): large enough that bandwidth, not latency, sets their time (half "
                  "a second over the 1 gbps test link; not measured against other sizes "
                  "here).")
    simulation_stream_sizes: Tuple[int, ...] = _param(
        (64 << 10, 1 << 20), "Message sizes at which two messages of one stream tell how the "
                             "simulator sends a stream (shared, held back always, or past the "
                             "bandwidth-delay product): one below and one above the 625 KB "
                             "product of the 1 gbps, 5 ms test link.")
    simulation_capped_below: float = _param(
        0.9, "A long message over the 10 gbps, 5 ms test link is read as capped by a TCP "
             "window when its rate, its latency taken off, is below this fraction of the "
             "link's rate as the simulator scales it: a margin for the rounding of a simulated "
             "transfer (not measured against other fractions here).")
    simulation_shared_within: float = _param(
        0.1, "Two messages of one stream posted together count as sharing the link when they "
             "end within this fraction of one message's time of each other (not measured "
             "against other fractions here).")
    simulation_held_beyond: float = _param(
        1.5, "The second of two messages of one stream posted together counts as held back "
             "when it ends later than this many times one message alone (not measured against "
             "other factors here).")

    def __post_init__(self) -> None:
        _check_nap("control_nap_s", self.control_nap_s)
        _check_nap("idle_nap_s", self.idle_nap_s)
        _require_at_least(self, 0, ("control_spin_polls", "named_max_ranks",
                                    "control_p2p_max_ranks"))
        _require_at_least(self, 1, ("timeline_flush_events", "simulation_progress_messages"))
        _require_positive(self, ("reroute_max_s", "handle_check_s", "start_check_s",
                                 "simulation_progress_s", "simulation_start_margin_s",
                                 "simulation_capped_below", "simulation_shared_within",
                                 "simulation_held_beyond"))
        _require_at_least(self, 1, ("simulation_probe_bytes",))
        sizes = self.simulation_stream_sizes
        if not (len(sizes) == 2 and all(int(s) == s for s in sizes) and 1 <= sizes[0] < sizes[1]):
            raise ValueError(f"simulation_stream_sizes: (below, above) the test link's "
                             f"bandwidth-delay product in whole bytes, 1 <= below < above, got "
                             f"{sizes!r}")


@dataclass(frozen=True)
class ReliabilityParams:
    """How long the runtime waits on its peers before it names a failure, and how it ends."""

    abort_grace_s: float = _param(
        10.0, "Seconds an abort waits for MPI_Abort to end the process before it exits by "
              "itself: a runtime may never return from MPI_Abort while another thread holds "
              "its lock.")
    abort_flush_s: float = _param(
        0.5, "Seconds an aborting rank pauses between writing its reason and MPI_Abort: the "
             "launcher's proxy forwards a rank's output through a pipe, and the abort's "
             "clean-up can end the proxy before it has drained the one line that says what "
             "happened.")
    settings_error_grace_s: float = _param(
        10.0, "Seconds a rank other than 0 that failed init() on a setting waits for rank 0 "
              "(failing on the same setting) to end the job with the one line, before it "
              "names itself and aborts the job: ranks reach init() seconds apart on a loaded "
              "machine (importing torch).")
    liveness_poll_s: float = _param(
        0.01, "How often the liveness responder's thread looks for pings when idle: an answer "
              "within 10 ms is far inside the ping timeout, and an idle responder costs about "
              "nothing.")
    teardown_wait_s: float = _param(
        5.0, "Seconds a closing watchdog or liveness responder waits for its thread to end, and "
             "the responder for its cancelled receive: with a working transport both end "
             "within a poll; the bound only keeps a broken one from holding up the shutdown "
             "(not measured against other bounds here).")
    ping_timeout_s: float = _param(
        2.0, "Seconds a liveness ping waits for the peers' answers, by default, before a "
             "silent peer is blamed for a stuck wait.")
    exchange_timeout_s: float = _param(
        60.0, "Seconds init()'s exchanges (settings, cost profile, the plan's digest) wait: "
              "every rank should be there at once.")
    departure_wait_s: float = _param(
        1.0, "Seconds a process that leaves before init() spends telling the other ranks and "
             "taking in the notices of peers that leave the same way, so that their init() "
             "fails at once naming it: sends to live peers complete in far less.")
    plan_timeout_s: float = _param(
        600.0, "Seconds the ranks wait for rank 0's plan: the planner may take a while at "
               "thousands of ranks.")
    doctor_arguments_timeout_s: float = _param(
        60.0, "Seconds the ranks of horotopo doctor wait for rank 0's verdict on the "
              "arguments: rank 0 only reads its disk.")
    probe_arguments_timeout_s: float = _param(
        120.0, "Seconds the ranks of horotopo probe wait for rank 0's verdict on the "
               "arguments: they start together, give or take the launcher's spread.")

    def __post_init__(self) -> None:
        _require_positive(self, tuple(f.name for f in dataclasses.fields(self)))


#: The defaults, read where a caller gives no object of its own.
ENGINE = EngineParams()
ADAPT = AdaptParams()
PROBE = ProbeParams()
PLANNER = PlannerParams()
RUNTIME = RuntimeParams()
RELIABILITY = ReliabilityParams()

#: Every parameter object, in the order docs/settings.md lists them.
PARAMETER_OBJECTS: Tuple[Type[Any], ...] = (EngineParams, AdaptParams, ProbeParams,
                                             PlannerParams, RuntimeParams, ReliabilityParams)


def why(cls: Type[Any], name: str) -> str:
    """Why field ``name`` of parameter object ``cls`` has its default."""
    return {f.name: f.metadata["why"] for f in dataclasses.fields(cls)}[name]


def describe(cls: Type[Any]) -> List[Dict[str, Any]]:
    """Each field of ``cls``: ``{"name", "default", "why"}``, in declaration order."""
    return [{"name": f.name, "default": f.default, "why": f.metadata["why"]}
            for f in dataclasses.fields(cls)]
