"""The one self-tuner: which algorithm for this size, and whether the network slowed down.

Both questions are answered from one measurement record
(:class:`~horotopo.algorithms.cost.CallRecord`): per size bucket and algorithm run, the agreed
times of the job's own calls with the cost model's time and the topology model's prediction
for each. :meth:`SelfTuner.observe` is the one place a timed call enters it; then

- the :class:`~horotopo.algorithms.cost.Selector` reads it for the tree-or-library choice
  (measured over modelled time, per bucket, with hysteresis);
- the :class:`~horotopo.adapt.policy.Detector` reads the same sample against its prediction
  (:meth:`SelfTuner.slowed`): a lasting drop of efficiency below the bucket's baseline is a
  contended or degraded link, and the adaptive engine re-probes and re-plans.

The topology side is the algorithm the plan records (``plan.planner["algorithm"]``): a peer
such as NCCL's double binary tree is timed, recorded and watched under its own name, with its
own model's prediction, exactly as the plan's trees are.

Pure, like its two readers: fed the same agreed times in the same order, every rank holds the
same record and takes the same decisions at the same call.
"""
from __future__ import annotations

from typing import Optional

from ..algorithms.cost import CallRecord, CostModel, Sample, Selector
from ..params import ADAPT, AdaptParams
from ..plan import Plan
from .policy import Detector

__all__ = ["SelfTuner"]


class SelfTuner:
    """One record of timed calls and its two readers, the selector and the detector.

    Parameters
    ----------
    model : CostModel
        The (calibrated) cost model; its ``side`` names the topology side's algorithm.
    params : AdaptParams
        The selector's (``choice_*``, ``explore_*``, ``sample_min_bytes``) and the detector's
        (``threshold``, ``consecutive``, ``warmup``, ``min_seconds``, ``min_slow_s``,
        ``max_backoff``) fields.
    """

    def __init__(self, model: CostModel, params: AdaptParams = ADAPT) -> None:
        self.params = params
        self.record = CallRecord(window=params.choice_window)
        self.selector = Selector.from_params(model, params, self.record)
        self.detector = Detector(threshold=params.threshold, consecutive=params.consecutive,
                                 warmup=params.warmup, min_seconds=params.min_seconds,
                                 min_slow_s=params.min_slow_s, max_backoff=params.max_backoff)

    @property
    def model(self) -> CostModel:
        return self.selector.model

    @property
    def topology_algorithm(self) -> str:
        """The algorithm that runs where the cost model says "tree"."""
        return self.model.side.algorithm

    def choose(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> str:
        """The algorithm to run for this call, by its engine name: the selector's ``"mpi"``,
        or for its ``"tree"`` the topology side's algorithm (the plan's recorded peer, or its
        trees)."""
        return self.selector.recorded_as(self.selector.choose(plan, nbytes, chunk_bytes))

    def times(self, algorithm: str, nbytes: int) -> bool:
        """Whether a call of ``algorithm`` of ``nbytes`` is worth a timing agreement: every
        call of an algorithm the record predicts (the detector watches those), and library
        calls large enough for the selector's bandwidth decision."""
        if algorithm == "mpi":
            return self.selector.wants(nbytes)
        return self.record.predicts(self.model, algorithm)

    def observe(self, plan: Plan, algorithm: str, nbytes: int, seconds: float,
                chunk_bytes: Optional[int] = None) -> Optional[Sample]:
        """Record one call's agreed time (the one place a timed call enters); the sample
        kept, or None when the record has nothing to compare it with."""
        return self.record.observe(self.model, plan, algorithm, nbytes, seconds, chunk_bytes)

    def slowed(self, sample: Optional[Sample], algorithm: str) -> bool:
        """The detector's reading of a recorded sample: True when it completes a slow run
        long enough to re-plan."""
        return self.detector.observe(sample, algorithm)

    def switched(self, model: CostModel) -> None:
        """A new plan runs (its model, whose ``side`` may name another algorithm): the record
        keeps only the library's calls, every size's choice is made again, and the detector
        learns new baselines."""
        self.selector.replace_model(model)
        self.detector.reset()
