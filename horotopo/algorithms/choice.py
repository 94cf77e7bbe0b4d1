"""One chooser over every allreduce algorithm that has a topology model: of the registered
candidates with a ``predict`` (tree, ring, dbtree, hierarchical by default), the one predicted
fastest for the plan's target size.

Rank 0 makes the choice at init right after planning (:func:`with_choice`) and records it in
the plan's ``planner`` dict, which travels with the plan to every rank:
``planner["algorithm"]`` is the name, ``planner["predicted_s"]`` each candidate's predicted
seconds, ``planner["algorithm_size"]`` the size they are predicted for. The engine's per-call
choice keeps the library allreduce for small messages (the calibrated cost model) and, where
it would run the plan's trees, runs the recorded algorithm
(:meth:`horotopo.algorithms.registry.Candidates.select`).

Every prediction comes from the one time model, :mod:`horotopo.algorithms.flows`: pipelined
trees sharing links and CPUs (:func:`~horotopo.algorithms.flows.plan_time`) for the plan's
trees and for NCCL's two trees, stages of concurrent flows
(:func:`~horotopo.algorithms.flows.stage_time`) for ring and hierarchical allreduce, with the
same software costs. By default they are made on the network TCP gives the declared links
(:data:`~horotopo.algorithms.flows.TCP_NETWORK`: rates shared by round trip, acknowledgement
traffic), where plain max-min sharing of the declared links (``network=IDEAL_NETWORK``) misses
what the RTT weighting does on shared uplinks and WAN links.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Optional, Tuple

from ..packing.alphabeta import ENGINE_COSTS, NetworkModel, SoftwareCosts
from ..packing.alphabeta import target_size
from ..plan import Plan
from ..topology import Topology
from .flows import TCP_NETWORK, plan_time
from .registry import ALLREDUCE, REGISTRY, TREE

__all__ = ["candidates", "predictions", "choose", "with_choice", "recorded_algorithm",
           "forest_predictor"]


def candidates() -> Tuple[str, ...]:
    """The registered allreduce algorithms with a topology model, in priority order."""
    return tuple(c.name for c in REGISTRY[ALLREDUCE] if c.predict is not None)


def predictions(topology: Topology, plan: Plan, nbytes: int,
                chunk_bytes: Optional[int] = None, *, costs: SoftwareCosts = ENGINE_COSTS,
                network: NetworkModel = TCP_NETWORK) -> Dict[str, float]:
    """Predicted seconds of one allreduce of ``nbytes`` on ``topology`` for every registered
    allreduce candidate with a topology model, in priority order.

    Parameters
    ----------
    topology : Topology
        The network the ranks run on (the one ``plan`` was made from, or the real one).
    plan : Plan
        The plan an engine is bound to (the ``tree`` candidate's trees).
    nbytes : int
        Allreduce size in bytes.
    chunk_bytes : int, optional
        The engine's chunk size; None: the plan's (what an engine bound to it uses).
    costs : SoftwareCosts
        The software costs charged per message and received byte (default the active cost
        profile's, :data:`~horotopo.packing.alphabeta.ENGINE_COSTS`).
    network : NetworkModel
        What the transport makes of the declared links (default
        :data:`~horotopo.algorithms.flows.TCP_NETWORK`; ``IDEAL_NETWORK``: as declared).
    """
    if plan.n != topology.n:
        raise ValueError(f"the plan has {plan.n} ranks, the topology {topology.n}")
    chunk = int(chunk_bytes or plan.chunk_bytes)
    return {c.name: float(c.predict(topology, plan, int(nbytes), chunk, costs, network))
            for c in REGISTRY[ALLREDUCE] if c.predict is not None}


def choose(topology: Topology, plan: Plan, nbytes: Optional[int] = None,
           chunk_bytes: Optional[int] = None, *, costs: SoftwareCosts = ENGINE_COSTS,
           network: NetworkModel = TCP_NETWORK) -> Tuple[str, Dict[str, float]]:
    """``(name, predictions)``: the candidate predicted fastest for ``nbytes`` (default the
    planner's target size, :func:`~horotopo.packing.alphabeta.target_size`) and every
    candidate's prediction (:func:`predictions`). A tie goes to the earlier candidate in
    priority order, the plan's trees first."""
    size = target_size(nbytes)
    got = predictions(topology, plan, size, chunk_bytes, costs=costs, network=network)
    if not got:
        raise ValueError("no registered allreduce algorithm has a topology model")
    best = min(got, key=lambda name: (got[name], list(got).index(name)))
    return best, got


def with_choice(plan: Plan, topology: Topology, nbytes: Optional[int] = None, *,
                costs: SoftwareCosts = ENGINE_COSTS,
                network: NetworkModel = TCP_NETWORK) -> Plan:
    """``plan`` with the choice recorded in its ``planner`` dict (``algorithm``,
    ``predicted_s``, ``algorithm_size``; see the module docstring). The plan's trees and
    digest are unchanged: the choice is a record that travels with them."""
    size = target_size(nbytes)
    best, got = choose(topology, plan, size, costs=costs, network=network)
    return replace(plan, planner=dict(plan.planner, algorithm=best, predicted_s=got,
                                      algorithm_size=size))


def recorded_algorithm(plan: Plan) -> str:
    """The algorithm ``plan`` records as the topology's fastest; its own trees when it records
    none (a plan made before the choice, or by hand)."""
    return str(plan.planner.get("algorithm", TREE))


def forest_predictor(topology: Topology, *, costs: SoftwareCosts = ENGINE_COSTS,
                     network: NetworkModel = TCP_NETWORK) -> Callable[[Plan, int], float]:
    """``make_plan(predict=...)``: the flow model's time of a candidate forest's plan
    (:func:`~horotopo.algorithms.flows.plan_time`), so that the planner keeps the forest this
    chooser ranks highest. The planner's own :meth:`Plan.predict_time` shares no link among
    trees as TCP does, and it ranked single deep trees ahead of host forests that simulate
    faster (docs/results/forest_kinds.md lists each row's candidates)."""
    def predict(plan: Plan, nbytes: int) -> float:
        return plan_time(topology, plan, nbytes, costs=costs, network=network)
    return predict
