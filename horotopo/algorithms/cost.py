"""Cost model and the per-call choice between the tree engine and MPI_Allreduce.

Each algorithm costs ``latency + bytes / bandwidth``; the tree's transfer time is the plan's
own alpha-beta prediction (:meth:`horotopo.plan.Plan.predict_time`, with this model's
per-message cost as the engine's software cost) times a measured factor ``tree_scale``, so a calibration made on one plan still applies to the next
one after a re-plan. :data:`DEFAULT_COST_MODEL` is only a prior: ``Engine.calibrate()`` times
both algorithms on the job's own ranks at init (:func:`calibrated_model`), and a
:class:`Selector` refines the choice per size from the timings of real calls, Horovod-autotune
style, with hysteresis so that scheduling noise does not flip it back and forth.

"Tree" is the cost model's name for the topology side of the choice: whatever the plan records
as the topology's fastest algorithm (``plan.planner["algorithm"]``, the plan's own trees or a
peer such as NCCL's double binary tree), which the engine runs where the model says "tree".
:class:`TopologySide` predicts that algorithm's time, calibration fits against it, and the
:class:`CallRecord` keeps its timed calls under its own name; the selector and the contention
detector (:class:`horotopo.adapt.policy.Detector`) both read that one record.

Every input to these functions must be the same on all ranks (times agreed by a max-allreduce,
:func:`agree_max`), so that every rank takes the same decision at the same call: the engine's
per-call metadata check would raise otherwise, on every rank, instead of mixing algorithms.
"""
from __future__ import annotations

import math
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..packing.alphabeta import ENGINE_COSTS, NetworkModel, SoftwareCosts, rank_degrees
from ..params import ADAPT, ENGINE, AdaptParams, EngineParams
from ..plan import Plan
from ..topology import Topology
from .flows import TCP_NETWORK

__all__ = ["CostModel", "DEFAULT_COST_MODEL", "MODELLED", "TREE", "fit_line", "fit_affine",
           "messages_per_rank", "calibrated_model", "Selector", "agree_max", "size_bucket",
           "TopologySide", "CallRecord", "Sample"]

#: The algorithms the cost model and the Selector time and choose between (the registry,
#: :mod:`horotopo.algorithms.registry`, asks them only when all of these are enabled).
MODELLED: Tuple[str, ...] = ("tree", "mpi")
#: The cost model's name for the topology side (see the module docstring).
TREE = "tree"
#: ``predict(topology, plan, nbytes, chunk_bytes, costs, network) -> seconds``: an algorithm's
#: topology model (:attr:`horotopo.algorithms.registry.Candidate.predict`).
Predict = Callable[[Topology, Plan, int, int, SoftwareCosts, NetworkModel], float]


@dataclass(frozen=True)
class TopologySide:
    """The algorithm an engine runs where the cost model says "tree", and its predicted time.

    Attributes
    ----------
    algorithm : str
        The plan's recorded algorithm when the engine can run it, else ``"tree"`` (the plan's
        own trees).
    predict : callable, optional
        That algorithm's topology model (:data:`Predict`); None for the plan's own trees,
        which :meth:`horotopo.plan.Plan.predict_time` predicts.
    topology : Topology, optional
        The network the plan was made for; a peer's model needs it.
    network : NetworkModel
        What the transport makes of the declared links, for a peer's model: the chooser's
        (:func:`horotopo.algorithms.choice.predictions`), so that a peer is predicted as the
        plan recorded it.
    kept : int
        Predictions kept (:attr:`~horotopo.params.EngineParams.kept_predictions`).

    A peer's time (:meth:`seconds`) comes from its own model on ``topology``. Without one it is
    the figure the plan records for its target size (``planner["predicted_s"]``), scaled to
    other sizes as the plan's trees scale: the two predictions run side by side in the
    chooser's table, and the trees' pipeline model is the shape the plan carries. A peer
    without either has no prediction (None).
    """

    algorithm: str = TREE
    predict: Optional[Predict] = None
    topology: Optional[Topology] = None
    network: NetworkModel = TCP_NETWORK
    kept: int = ENGINE.kept_predictions
    _memo: Dict[Tuple[Any, ...], Tuple[Any, Optional[float]]] = field(
        default_factory=dict, compare=False, repr=False)

    def seconds(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None,
                costs: SoftwareCosts = ENGINE_COSTS) -> Optional[float]:
        """Predicted seconds of one allreduce of ``nbytes`` by :attr:`algorithm` (None: no
        model). Kept per plan, size and costs: the self-tuner asks on every call, and a
        prediction lays out every tree's pipeline (a peer's, its flows) again."""
        if nbytes <= 0 or plan.n == 1:
            return plan.predict_time(nbytes, chunk_bytes, costs=costs)
        chunk = int(chunk_bytes or plan.chunk_bytes)
        key = (id(plan), int(nbytes), chunk, costs.per_message_s, costs.per_byte_s)
        hit = self._memo.get(key)
        if hit is not None and hit[0]() is plan:
            return hit[1]
        got = (plan.predict_time(int(nbytes), chunk, costs=costs) if self.algorithm == TREE
               else self._predict(plan, int(nbytes), chunk, costs))
        if len(self._memo) >= self.kept:
            self._memo.clear()
        # A weak reference: the memo names a plan (plans are immutable) without keeping it.
        self._memo[key] = (weakref.ref(plan), got)
        return got

    def __reduce__(self) -> Tuple[Any, ...]:
        # Without the kept predictions: they name plans of this process (a cost model
        # travels between ranks, and is compared there).
        return (TopologySide, (self.algorithm, self.predict, self.topology, self.network,
                               self.kept))

    def _predict(self, plan: Plan, nbytes: int, chunk: int,
                 costs: SoftwareCosts) -> Optional[float]:
        if self.predict is not None and self.topology is not None:
            return float(self.predict(self.topology, plan, nbytes, chunk, costs, self.network))
        figures = plan.planner.get("predicted_s")
        size = plan.planner.get("algorithm_size")
        if not isinstance(figures, dict) or self.algorithm not in figures or not size:
            return None
        at_size = plan.predict_time(int(size), chunk, costs=costs)
        if not at_size > 0:
            return None
        return float(figures[self.algorithm]) * plan.predict_time(nbytes, chunk,
                                                                 costs=costs) / at_size



def messages_per_rank(plan: Plan, nbytes: int, chunk_bytes: int) -> float:
    """Chunk messages the busiest rank completes in a tree allreduce of ``nbytes`` in chunks of
    ``chunk_bytes`` (:func:`~horotopo.packing.alphabeta.rank_degrees` per chunk: a receive
    per reduce child, a send up, a receive down and a send per broadcast child)."""
    msgs, _ = rank_degrees([(t.root, t.reduce_parent, t.bcast_parent) for t in plan.trees])
    counts = np.array([math.ceil(t.share * nbytes / chunk_bytes) for t in plan.trees], float)
    return float((counts @ msgs).max()) if len(counts) else 0.0


def fit_affine(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """Fit ``y = a + slope * x`` to ``(x, y)`` points; returns ``(a, slope)``.

    Minimises *relative* squared error (weights ``1 / y**2``), so that on a geometric ladder
    of sizes the small ones pin ``a`` and the large ones the slope. ``a`` is clamped at 0 and
    the slope kept positive, so a noisy fit never makes an algorithm free.
    """
    if len(points) < 2:
        raise ValueError("need at least two (x, y) points to fit")
    sw = swx = swy = swxx = swxy = 0.0
    for x, y in points:
        if y <= 0:
            raise ValueError(f"times must be positive, got {y}")
        w = 1.0 / (y * y)
        sw += w
        swx += w * x
        swy += w * y
        swxx += w * x * x
        swxy += w * x * y
    det = sw * swxx - swx * swx
    slope = (sw * swxy - swx * swy) / det if det > 0 else 0.0
    slope = max(slope, 1e-15)
    a = (swy - slope * swx) / sw
    if a < 0:
        # A negative intercept is noise; refit the slope through the origin instead of keeping
        # a slope that was steepened to reach below zero.
        a = 0.0
        slope = max(swxy / swxx if swxx > 0 else 0.0, 1e-15)
    return a, slope


def fit_line(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """Fit ``time = a + bytes / bw`` to ``(bytes, seconds)`` points; returns ``(a, bw)``
    (:func:`fit_affine` with the slope read as seconds per byte)."""
    a, slope = fit_affine(points)
    return a, 1.0 / slope


@dataclass(frozen=True)
class CostModel:
    """Predicted time of each algorithm; every field in seconds or bytes per second.

    Attributes
    ----------
    mpi_latency_s, mpi_Bps
        MPI_Allreduce's fixed cost and algorithm bandwidth; ``mpi_Bps=None`` (the uncalibrated
        prior only) means the plan's ring rate (``plan.ring_Bps``). A real MPI_Allreduce is
        often far from that (it does not know the topology), which is why the runtime always
        measures it (:func:`calibrated_model`).
    tree_latency_s
        The tree engine's fixed cost per call (metadata exchange, set-up).
    per_message_s
        Python overhead per chunk message in the progress loop, the software cost the plan's
        prediction charges per message; 0 (once calibrated) charges the engine's measured
        CPU cost (:data:`~horotopo.packing.alphabeta.ENGINE_COSTS`), the plan's own default,
        and the fitted ``tree_scale`` holds the rest.
    tree_Bps
        Measured tree bandwidth; ``None`` means the plan's prediction times ``tree_scale``.
    tree_scale
        Measured tree time over the plan's predicted time (1: the plan's rate is reached). A
        factor, not a rate, so that it carries over to the next plan after a re-plan.
    side
        What runs where this model says "tree" and its prediction (:class:`TopologySide`;
        default the plan's own trees). Not a figure: models that differ only in it are equal.
    """

    mpi_latency_s: float
    mpi_Bps: Optional[float]
    tree_latency_s: float
    per_message_s: float
    tree_Bps: Optional[float] = None
    source: str = "default"
    tree_scale: float = 1.0
    side: TopologySide = field(default=TopologySide(), compare=False, repr=False)

    @property
    def costs(self) -> SoftwareCosts:
        """The software costs the topology side's prediction charges."""
        return (SoftwareCosts(self.per_message_s, ENGINE_COSTS.per_byte_s)
                if self.per_message_s else ENGINE_COSTS)

    def plan_time(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> float:
        """The topology side's predicted time with this model's per-message software cost: the
        recorded algorithm's (:class:`TopologySide`), or the plan's trees' where the recorded
        one has no prediction (a plan made by hand names a peer without its figures)."""
        got = self.side.seconds(plan, nbytes, chunk_bytes, self.costs)
        return got if got is not None else plan.predict_time(nbytes, chunk_bytes,
                                                             costs=self.costs)

    def tree_time(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> float:
        if nbytes <= 0 or self.tree_Bps:
            return self.tree_time_of(nbytes, 0.0)  # the prediction is not read: skip it
        return self.tree_time_of(nbytes, self.plan_time(plan, nbytes, chunk_bytes))

    def tree_time_of(self, nbytes: int, predicted_s: float) -> float:
        """:meth:`tree_time` from the topology side's prediction ``predicted_s`` (what
        :meth:`plan_time` gives), for a caller that already holds it."""
        if nbytes <= 0:
            return self.tree_latency_s
        if self.tree_Bps:
            return self.tree_latency_s + nbytes / self.tree_Bps
        return self.tree_latency_s + self.tree_scale * predicted_s

    def mpi_time(self, plan: Plan, nbytes: int) -> float:
        bw = self.mpi_Bps or plan.ring_Bps
        if nbytes <= 0 or plan.n == 1:
            return self.mpi_latency_s
        return self.mpi_latency_s + nbytes / bw

    def time(self, algorithm: str, plan: Plan, nbytes: int,
             chunk_bytes: Optional[int] = None) -> float:
        """:meth:`tree_time` for ``"tree"``, :meth:`mpi_time` for ``"mpi"``."""
        if algorithm == "tree":
            return self.tree_time(plan, nbytes, chunk_bytes)
        if algorithm == "mpi":
            return self.mpi_time(plan, nbytes)
        raise ValueError(f"the cost model knows 'tree' and 'mpi', not {algorithm!r}")

    def choose(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> str:
        """``"tree"`` when its predicted time is strictly lower, else ``"mpi"``."""
        if plan.n == 1:
            return "mpi"
        tree = self.tree_time(plan, nbytes, chunk_bytes)
        return "tree" if tree < self.mpi_time(plan, nbytes) else "mpi"

    def cutover_bytes(self, plan: Plan, chunk_bytes: Optional[int] = None,
                      limit: int = 1 << 34) -> Optional[int]:
        """Smallest power-of-two size from which the tree is chosen, or None up to ``limit``."""
        size = 1
        while size <= limit:
            if self.choose(plan, size, chunk_bytes) == "tree":
                return size
            size *= 2
        return None

    def with_(self, **changes: object) -> "CostModel":
        return replace(self, **changes)

    def describe(self) -> str:
        mpi = (f"{self.mpi_Bps / 1e6:.1f} MB/s" if self.mpi_Bps else "the plan's ring rate")
        tree = (f"{self.tree_Bps / 1e6:.1f} MB/s" if self.tree_Bps
                else f"{self.tree_scale:.2f} x the plan's time")
        return (f"{self.source} cost model: MPI {self.mpi_latency_s * 1e6:.0f} us + bytes at "
                f"{mpi}; tree {self.tree_latency_s * 1e6:.0f} us + {tree}")


#: Only the prior of an Engine that nobody calibrated (a library user's; the hvd runtime
#: always calibrates at init and then learns from its own calls): the ``prior_*`` fields of
#: :data:`horotopo.params.ENGINE`, which say where they were measured. Nothing the runtime
#: decides rests on them alone.
DEFAULT_COST_MODEL = CostModel(mpi_latency_s=ENGINE.prior_mpi_latency_s, mpi_Bps=None,
                               tree_latency_s=ENGINE.prior_tree_latency_s,
                               per_message_s=ENGINE.prior_per_message_s)


def calibrated_model(plan: Plan, sizes: Sequence[int], tree_s: Sequence[float],
                     mpi_s: Sequence[float], chunk_bytes: Optional[int] = None,
                     prior: CostModel = DEFAULT_COST_MODEL,
                     params: EngineParams = ENGINE) -> CostModel:
    """The cost model fitted to agreed calibration timings (pure; every rank gets the same).

    MPI_Allreduce: ``latency + bytes / bandwidth`` (:func:`fit_line`). The topology side
    (``tree_s`` are its times: the plan's recorded algorithm, ``prior.side``):
    ``latency + tree_scale * prediction(bytes)`` (:func:`fit_affine` against that algorithm's
    own prediction, :meth:`CostModel.plan_time`), so its extrapolation to larger sizes keeps
    the algorithm's modelled shape, and the scale carries over to a new plan. With a single
    size, each latency is the prior's, at most ``params.single_size_latency_share`` of that
    size's time, and only the rates are fitted.
    """
    if not (len(sizes) == len(tree_s) == len(mpi_s)) or not sizes:
        raise ValueError("calibrated_model needs one tree and one MPI time per size")
    model = prior.with_(per_message_s=0.0)  # calibrated: tree_scale holds the software cost
    pred = [model.plan_time(plan, int(s), chunk_bytes) for s in sizes]
    if len(sizes) == 1:
        share = params.single_size_latency_share
        mpi_lat = min(prior.mpi_latency_s, share * mpi_s[0])
        tree_lat = min(prior.tree_latency_s, share * tree_s[0])
        mpi_bw = sizes[0] / max(mpi_s[0] - mpi_lat, 1e-12)
        scale = (tree_s[0] - tree_lat) / pred[0] if pred[0] > 0 else 1.0
    else:
        mpi_lat, mpi_bw = fit_line(list(zip([float(s) for s in sizes], mpi_s)))
        if all(p > 0 for p in pred):
            tree_lat, scale = fit_affine(list(zip(pred, tree_s)))
        else:  # one rank: the plan predicts nothing; the tree is never chosen then
            tree_lat, scale = min(tree_s), 1.0
    return prior.with_(mpi_latency_s=mpi_lat, mpi_Bps=mpi_bw, tree_latency_s=tree_lat,
                       tree_Bps=None, tree_scale=max(scale, 1e-6), per_message_s=0.0,
                       source="calibrated")


def size_bucket(nbytes: int) -> int:
    """The power-of-two bucket of ``nbytes``: sizes in ``(2**(k-1), 2**k]`` share bucket ``k``
    (and their measurements, scaled by the model to each call's size)."""
    return max(0, int(nbytes) - 1).bit_length()


def agree_max(values: Sequence[float], allreduce_max: Callable[[np.ndarray], None]
              ) -> List[float]:
    """Rank-local timings -> the same list on every rank: the maximum over ranks of each.

    ``allreduce_max(vec)`` is an in-place max-allreduce over the ranks (the engine's transport
    or :func:`horotopo.transport.p2p.allreduce_point_to_point`). A collective's time is its
    slowest rank's, and a value every rank holds bit for bit is what lets each rank run the
    same :class:`Selector` and reach the same choice without sending the choice itself.
    """
    vec = np.array([float(v) for v in values], dtype=np.float64)
    allreduce_max(vec)
    return [float(v) for v in vec]


@dataclass(frozen=True)
class Sample:
    """One timed call as the record keeps it.

    Attributes
    ----------
    nbytes : int
    observed_s : float
        The call's agreed time (the slowest rank's).
    modelled_s : float
        The cost model's time for the call (:meth:`CostModel.time`): what the selector
        scales by the measured ratios.
    predicted_s : float or None
        The algorithm's topology model (:class:`TopologySide`; for a forced plan's trees or
        ring, the plan's own figures): what the contention detector compares the call with.
        None for the library's allreduce, which no topology model describes.
    """

    nbytes: int
    observed_s: float
    modelled_s: float
    predicted_s: Optional[float]

    @property
    def ratio(self) -> Optional[float]:
        """Observed over modelled time (the selector's measure; None without a model time)."""
        return self.observed_s / self.modelled_s if self.modelled_s > 0 else None

    @property
    def efficiency(self) -> Optional[float]:
        """Predicted over observed time (the detector's measure; None without a prediction)."""
        return None if not self.predicted_s else self.predicted_s / self.observed_s


@dataclass
class CallRecord:
    """The self-tuner's one measurement record: per size bucket and algorithm run, the last
    ``window`` timed calls, each with its observed time and its predictions.

    :meth:`observe` is the one place a timed call enters. The selector reads the record for
    which algorithm a size should take, and the contention detector reads each sample against
    its plan's prediction, so the two never disagree about what was measured. Keys are the
    names of the algorithms that ran: a call of the plan's recorded peer is kept as that peer,
    which the selector reads as its topology side.
    """

    window: int = ADAPT.choice_window
    _samples: Dict[Tuple[int, str], Deque[Sample]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if int(self.window) != self.window or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")

    @staticmethod
    def predicts(model: CostModel, algorithm: str) -> bool:
        """Whether :meth:`predicted` has a model for calls of ``algorithm``."""
        return algorithm in (model.side.algorithm, TREE, "ring")

    def predicted(self, model: CostModel, plan: Plan, algorithm: str, nbytes: int,
                  chunk_bytes: Optional[int] = None) -> Optional[float]:
        """The topology model's time for one call of ``algorithm`` (None: it has none): the
        topology side's (:class:`TopologySide`), the plan's own trees' (a forced ``tree``), or
        the plan's ring rate for a forced ring."""
        if algorithm == model.side.algorithm:
            return model.side.seconds(plan, nbytes, chunk_bytes, model.costs)
        if algorithm == TREE:
            return plan.predict_time(nbytes, chunk_bytes, costs=model.costs)
        if algorithm == "ring" and plan.ring_Bps:
            return nbytes / plan.ring_Bps
        return None

    @staticmethod
    def modelled(model: CostModel, plan: Plan, algorithm: str, nbytes: int,
                 chunk_bytes: Optional[int] = None,
                 predicted_s: Optional[float] = None) -> Optional[float]:
        """The cost model's time for one call of ``algorithm``, for the two sides it times
        (the library, and the topology side, from ``predicted_s`` when :meth:`predicted`
        gave one); None for any other."""
        if algorithm == "mpi":
            return model.mpi_time(plan, nbytes)
        if algorithm == model.side.algorithm:
            if predicted_s is None:
                return model.tree_time(plan, nbytes, chunk_bytes)
            return model.tree_time_of(nbytes, predicted_s)
        return None

    def observe(self, model: CostModel, plan: Plan, algorithm: str, nbytes: int,
                seconds: float, chunk_bytes: Optional[int] = None) -> Optional[Sample]:
        """Record one call's agreed time; returns the sample kept (None when the call has
        neither a cost model time nor a prediction, or no positive size and time)."""
        if not (nbytes > 0 and seconds > 0):
            return None
        predicted = self.predicted(model, plan, algorithm, nbytes, chunk_bytes)
        modelled = self.modelled(model, plan, algorithm, nbytes, chunk_bytes, predicted)
        if not (predicted and predicted > 0) and not (modelled and modelled > 0):
            return None
        sample = Sample(int(nbytes), float(seconds),
                        float(modelled) if modelled and modelled > 0 else 0.0,
                        float(predicted) if predicted and predicted > 0 else None)
        key = (size_bucket(nbytes), algorithm)
        got = self._samples.get(key)
        if got is None:
            got = self._samples[key] = deque(maxlen=int(self.window))
        got.append(sample)
        return sample

    def samples(self, algorithm: str, nbytes: int) -> Tuple[Sample, ...]:
        """The kept calls of ``algorithm`` in the bucket of ``nbytes``, oldest first."""
        return tuple(self._samples.get((size_bucket(nbytes), algorithm), ()))

    def forget(self, algorithm: Optional[str] = None, keep: Sequence[str] = ()) -> None:
        """Drop ``algorithm``'s calls, or without one every algorithm's but those named in
        ``keep`` (after a re-plan every topology algorithm runs on another plan or model; the
        library's figures stay)."""
        for key in [k for k in self._samples
                    if (k[1] == algorithm if algorithm is not None else k[1] not in keep)]:
            del self._samples[key]

    def summary(self) -> Dict[str, Dict[str, Any]]:
        """Per bucket and algorithm: calls kept, median ratio to the cost model and median
        efficiency against the prediction (for logs and tests)."""
        out: Dict[str, Dict[str, Any]] = {}
        for (b, alg), got in sorted(self._samples.items()):
            ratios = [s.ratio for s in got if s.ratio is not None]
            effs = [s.efficiency for s in got if s.efficiency is not None]
            out.setdefault(str(b), {})[alg] = {
                "calls": len(got),
                "ratio": round(median(ratios), 4) if ratios else None,
                "efficiency": round(median(effs), 4) if effs else None}
        return out


@dataclass
class Selector:
    """Tree or MPI_Allreduce per call, from the cost model refined by the record's timings.

    It reads the :class:`CallRecord`: for each power-of-two size bucket, the last calls of the
    library and of the topology side (``model.side.algorithm``: the plan's trees or its
    recorded peer), each as measured over modelled time. An algorithm's estimate for a call is
    the model's time scaled by the median of those ratios (the model alone when the bucket has
    none, or for calls under ``sample_min_bytes``, which latency decides). Then:

    - the first call of a bucket takes the algorithm with the lower estimate;
    - afterwards the bucket keeps its algorithm until the other's estimate is lower by more
      than ``margin`` (hysteresis): a median over a window, plus a margin, so one descheduled
      rank's slow call moves nothing;
    - once the chosen algorithm has been measured in a bucket of at least ``explore_min_bytes``,
      an algorithm never measured there is tried once if the model puts it within
      ``explore_ratio`` of the chosen one: the model extrapolates from a short calibration, and
      one measured call settles what it cannot (Horovod's autotuner samples the same way).

    Deterministic: fed the same agreed timings (:func:`agree_max`) in the same order, every
    rank holds the same record and returns the same choice at the same call. The defaults are
    :data:`horotopo.params.ADAPT`'s (``choice_*``, ``explore_*``, ``sample_min_bytes``).
    """

    model: CostModel = DEFAULT_COST_MODEL
    margin: float = ADAPT.choice_margin
    window: int = ADAPT.choice_window
    explore_ratio: float = ADAPT.explore_ratio
    explore_min_bytes: int = ADAPT.explore_min_bytes
    sample_min_bytes: int = ADAPT.sample_min_bytes
    record: Optional[CallRecord] = None
    _current: Dict[int, str] = field(default_factory=dict)
    _explored: Dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin!r}")
        if int(self.window) != self.window or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if self.explore_ratio < 1:
            raise ValueError(f"explore_ratio must be >= 1, got {self.explore_ratio!r}")
        if self.record is None:
            self.record = CallRecord(window=int(self.window))

    @classmethod
    def from_params(cls, model: CostModel, params: AdaptParams = ADAPT,
                    record: Optional[CallRecord] = None) -> "Selector":
        """A selector with ``params``' choice fields, reading ``record``."""
        return cls(model=model, margin=params.choice_margin, window=params.choice_window,
                   explore_ratio=params.explore_ratio,
                   explore_min_bytes=params.explore_min_bytes,
                   sample_min_bytes=params.sample_min_bytes, record=record)

    # -------------------------------------------------------------------------------------
    def recorded_as(self, algorithm: str) -> str:
        """The record's name for one of the two sides: the topology side's algorithm for
        ``"tree"``."""
        return self.model.side.algorithm if algorithm == TREE else algorithm

    def _ratios(self, algorithm: str, nbytes: int) -> List[float]:
        assert self.record is not None
        if nbytes < self.sample_min_bytes:
            return []
        got = [s.ratio for s in self.record.samples(self.recorded_as(algorithm), nbytes)]
        return [r for r in got if r is not None][-int(self.window):]

    def estimate(self, algorithm: str, plan: Plan, nbytes: int,
                 chunk_bytes: Optional[int] = None) -> float:
        """Seconds the selector expects ``algorithm`` (``"tree"`` or ``"mpi"``) to take."""
        base = self.model.time(algorithm, plan, nbytes, chunk_bytes)
        got = self._ratios(algorithm, nbytes)
        return base * median(got) if got else base

    def samples(self, algorithm: str, nbytes: int) -> int:
        """How many measurements of ``algorithm`` the bucket of ``nbytes`` holds."""
        return len(self._ratios(algorithm, nbytes))

    def current(self, nbytes: int) -> Optional[str]:
        """The bucket's settled algorithm (None before its first call)."""
        return self._current.get(size_bucket(nbytes))

    def choose(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> str:
        """The algorithm for this call (may be a one-off exploration of the other one)."""
        if plan.n == 1 or nbytes <= 0:
            return "mpi"
        b = size_bucket(nbytes)
        est = {a: self.estimate(a, plan, nbytes, chunk_bytes) for a in (TREE, "mpi")}
        cur = self._current.get(b)
        if cur is None:
            cur = TREE if est[TREE] < est["mpi"] else "mpi"
        else:
            other = "mpi" if cur == TREE else TREE
            if est[other] < (1.0 - self.margin) * est[cur]:
                cur = other
        self._current[b] = cur
        other = "mpi" if cur == TREE else TREE
        if (nbytes >= self.explore_min_bytes and b not in self._explored
                and self.samples(cur, nbytes) > 0 and self.samples(other, nbytes) == 0
                and est[other] < self.explore_ratio * est[cur]):
            self._explored[b] = other
            return other
        return cur

    def wants(self, nbytes: int) -> bool:
        """Whether a library call of ``nbytes`` is worth a timing agreement (smaller calls are
        latency noise for a bandwidth decision, and the calibrated latencies decide them)."""
        return nbytes >= self.sample_min_bytes

    def update(self, plan: Plan, nbytes: int, algorithm: str, seconds: float,
               chunk_bytes: Optional[int] = None) -> Optional[Sample]:
        """Feed one call's agreed (slowest rank's) time into the record
        (:meth:`CallRecord.observe`); ``algorithm`` is the name that ran (the topology side's
        peer, not ``"tree"``, when the plan records one)."""
        assert self.record is not None
        return self.record.observe(self.model, plan, algorithm, nbytes, seconds, chunk_bytes)

    def replace_model(self, model: CostModel) -> None:
        """Another plan's model (after a re-plan): every bucket's choice is made again, and
        the record keeps only the library's calls (every topology algorithm now runs on
        another plan)."""
        assert self.record is not None
        self.model = model
        self.record.forget(keep=("mpi",))
        self._current.clear()
        self._explored.clear()

    def forget(self, algorithm: str) -> None:
        """Drop ``algorithm``'s measurements (``"tree"``: the topology side's) and every
        bucket's settled choice."""
        assert self.record is not None
        self.record.forget(self.recorded_as(algorithm))
        self._current.clear()
        self._explored.clear()

    def snapshot(self) -> Tuple[Dict[int, str], Dict[int, str]]:
        """The choice state :meth:`choose` changes (for :meth:`restore` after a failed call)."""
        return dict(self._current), dict(self._explored)

    def restore(self, saved: Tuple[Dict[int, str], Dict[int, str]]) -> None:
        self._current, self._explored = dict(saved[0]), dict(saved[1])

    def state(self) -> Dict[str, Any]:
        """A plain summary (for logs and tests): per bucket, the choice and the median ratios
        of the two sides (``tree``: the topology side's)."""
        out: Dict[str, Any] = {}
        assert self.record is not None
        for b, algs in self.record.summary().items():
            for alg, got in algs.items():
                side = TREE if alg == self.model.side.algorithm else alg
                if side in MODELLED and got["ratio"] is not None:
                    out.setdefault(b, {})[side] = got["ratio"]
        for b, alg in sorted(self._current.items()):
            out.setdefault(str(b), {})["choice"] = alg
        return out
