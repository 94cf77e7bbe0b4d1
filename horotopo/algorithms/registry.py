"""The engine's algorithm registry, Horovod style: candidates in priority order, each with its
``enabled(plan, buffer)``, and the cost model choosing among the enabled ones.

A :class:`Candidate` names an algorithm, says what it needs (``requires``, for messages), tests
whether it can run a call (``enabled``) and builds its runner over a transport. The engine binds
each kind's candidates to its transport once, at set-up (:meth:`Candidates.bind`); per call,

- a forced algorithm (the engine's ``algorithm=`` argument) runs if it is enabled; otherwise a
  ValueError names the enabled ones (and an unknown name, the registered ones);
- else, when every algorithm the cost model times (:data:`~horotopo.algorithms.cost.MODELLED`)
  is enabled, the model (a :class:`~horotopo.algorithms.cost.CostModel` or a calibrated
  :class:`~horotopo.algorithms.cost.Selector`) picks among them;
- else the first enabled candidate the model times, else the first enabled one, in priority
  order;
- where that gives ``tree``, the algorithm the plan records as the topology's fastest
  (``plan.planner["algorithm"]``, :mod:`horotopo.algorithms.choice`) runs instead, when it is
  enabled: the cost model decides small messages against the library, the plan's choice
  decides how a large one crosses the topology.

Registered by default: allreduce ``tree`` (the Plan's trees), ``ring`` (any transport),
``mpi`` (the transport's library allreduce), ``dbtree`` (NCCL's double binary tree) and
``hierarchical`` (Horovod's hierarchical allreduce); broadcast ``tree``. Every candidate but
``mpi`` has a topology model (``predict``). Every input of a choice is the same on every rank
(the plan, the agreed dtype, the transport's kind), so ranks choose alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from .. import ops as _ops
from ..ops import is_allreduce_dtype
from ..buffers import ScratchPool
from ..packing.alphabeta import NetworkModel, SoftwareCosts
from ..params import ENGINE, EngineParams
from ..plan import Plan
from ..topology import Topology
from ..transport.base import Transport
from . import dbtree as _dbtree
from . import flows as _flows
from . import hierarchical as _hierarchical
from . import ring as _ring
from .cost import MODELLED
from .dbtree import DoubleBinaryTreeAllreduce
from .hierarchical import HierarchicalAllreduce
from .library import MPIAllreduce
from .ring import RingAllreduce
from .tree import TreeAllreduce, TreeBroadcast, Window

__all__ = ["Candidate", "Candidates", "Bound", "Chooser", "ALLREDUCE", "BROADCAST",
           "REGISTRY", "register", "NotEnabledError"]

ALLREDUCE = "allreduce"
BROADCAST = "broadcast"
#: The plan's own trees: the name the cost model gives the topology-aware choice.
TREE = "tree"


class NotEnabledError(ValueError):
    """A forced algorithm cannot run this call; the message names the enabled ones."""


class Chooser(Protocol):
    """What picks between the modelled algorithms: CostModel or Selector."""

    def choose(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> str: ...


#: ``predict(topology, plan, nbytes, chunk_bytes, costs, network) -> seconds``: the modelled
#: time of one allreduce of ``nbytes`` on ``topology`` in chunks of ``chunk_bytes``, the engine
#: bound to ``plan``, with the software ``costs`` on the ``network`` the transport makes of the
#: declared links.
Predict = Callable[[Topology, Plan, int, int, SoftwareCosts, NetworkModel], float]
#: Builds an algorithm's runner over ``(transport, plan, pool, window, params)``: ``params`` are
#: the engine's (:class:`~horotopo.params.EngineParams`), fixed at set-up.
Factory = Callable[[Transport, Plan, ScratchPool, Optional[int], EngineParams], Any]
#: ``enabled(transport, plan, buffer)``: the transport is the engine's (fixed at set-up);
#: ``buffer`` is the call's flat array, or None when only the size is known (any dtype the
#: kind supports).
Enabled = Callable[[Transport, Plan, Any], bool]


@dataclass(frozen=True)
class Candidate:
    """One registered algorithm of one kind (allreduce or broadcast).

    Attributes
    ----------
    name : str
        What ``algorithm=`` forces it by, and the timeline's span name (``TREE_ALLREDUCE``).
    kind : str
        :data:`ALLREDUCE` or :data:`BROADCAST`.
    requires : str
        What ``enabled`` checks, in words, for the error of a forced, disabled algorithm.
    enabled : callable
        ``enabled(transport, plan, buffer) -> bool``. It may depend on the transport, the plan
        and the buffer's type and dtype, never on its size or contents: a bound engine asks
        once per (buffer type, dtype) and keeps the answer (the size is the cost model's).
    make : callable
        ``make(transport, plan, pool, window, params)``: the runner; an allreduce runner has
        ``run(src, out, op, chunk_elems)``, a broadcast runner ``run(buf, root, chunk_elems)``,
        and either may count its messages in ``last_messages``.
    predict : callable, optional
        :data:`Predict`: the algorithm's modelled time on a topology, the one time model
        (:mod:`horotopo.algorithms.choice` picks the fastest of the candidates that have it).
        None for an algorithm without a topology model (``mpi``, calibrated at init).
    """

    name: str
    kind: str
    requires: str
    enabled: Enabled
    make: Factory
    predict: Optional[Predict] = None


#: What a bound kind knows of one (buffer type, dtype): the enabled names, whether every
#: modelled one is among them, the candidate taken without a chooser, the one run for "tree".
_Answer = Tuple[Tuple[str, ...], bool, Optional["Bound"], Optional["Bound"]]


class Bound:
    """A candidate bound to an engine's transport and plan: ``enabled(plan, buffer)`` and the
    runner."""

    # Plain attributes, not properties: the engine asks every candidate on every call.
    __slots__ = ("candidate", "name", "runner", "_check", "_transport")

    def __init__(self, candidate: Candidate, transport: Transport, plan: Plan,
                 pool: ScratchPool, window: Window, params: EngineParams = ENGINE) -> None:
        self.candidate = candidate
        self.name = candidate.name
        self._check = candidate.enabled
        self._transport = transport
        self.runner = candidate.make(transport, plan, pool, window, params)

    def enabled(self, plan: Plan, buffer: Any) -> bool:
        return self._check(self._transport, plan, buffer)

    @property
    def last_messages(self) -> int:
        return int(getattr(self.runner, "last_messages", 0))


class Candidates:
    """One kind's candidates bound to an engine (:meth:`bind`): choice and lookup per call.

    The enabled set of the bound plan is kept per (buffer type, dtype): the engine asks on
    every call, and three Python checks per call cost as much as the rest of its set-up.
    """

    def __init__(self, kind: str, bound: Sequence[Bound], plan: Optional[Plan] = None) -> None:
        self.kind = kind
        self.bound: Tuple[Bound, ...] = tuple(bound)
        self._by_name: Dict[str, Bound] = {b.name: b for b in self.bound}
        self._plan = plan
        # (type, dtype) -> (enabled names in priority order, whether every modelled one is
        # among them, the candidate taken when the chooser cannot be asked, the candidate
        # that runs where the chooser says "tree")
        self._known: Dict[Tuple[type, Any], _Answer] = {}

    @classmethod
    def bind(cls, kind: str, transport: Transport, plan: Plan, pool: ScratchPool,
             window: Window = None,
             registry: Optional[Dict[str, List[Candidate]]] = None,
             params: EngineParams = ENGINE) -> "Candidates":
        """Build every registered candidate of ``kind`` over ``transport`` (once, at set-up)."""
        table = REGISTRY if registry is None else registry
        if kind not in table:
            raise ValueError(f"no algorithms are registered for {kind!r}")
        return cls(kind, [Bound(c, transport, plan, pool, window, params)
                          for c in table[kind]], plan)

    @property
    def names(self) -> Tuple[str, ...]:
        """Every bound candidate's name, in priority order."""
        return tuple(self._by_name)

    def get(self, name: str) -> Bound:
        """The bound candidate named ``name`` (ValueError naming the registered ones)."""
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise ValueError(f"{self.kind} algorithm must be None or one of "
                             f"{', '.join(self.names)}; got {name!r}") from None

    def enabled(self, plan: Plan, buffer: Any) -> List[str]:
        """The names of the candidates that can run this call, in priority order."""
        return list(self._answer(plan, buffer)[0])

    def _answer(self, plan: Plan, buffer: Any) -> "_Answer":
        key = (type(buffer), getattr(buffer, "dtype", None))
        if plan is self._plan:
            known = self._known.get(key)
            if known is not None:
                return known
        on = tuple(b.name for b in self.bound if b._check(b._transport, plan, buffer))
        modelled = [name for name in on if name in MODELLED]
        recorded = plan.planner.get("algorithm")
        tree = self._by_name.get(recorded if recorded in on else TREE)
        fallback = self._by_name[modelled[0] if modelled else on[0]] if on else None
        if fallback is not None and fallback.name == TREE:
            fallback = tree
        answer = (on, len(modelled) == len(MODELLED), fallback, tree)
        if plan is self._plan:
            self._known[key] = answer
        return answer

    def select(self, plan: Plan, buffer: Any, nbytes: int, chunk_bytes: int,
               chooser: Optional[Chooser], forced: Optional[str] = None) -> Bound:
        """The candidate for one call (see the module docstring for the rule).

        Raises
        ------
        ValueError
            ``forced`` is not a registered name.
        NotEnabledError
            ``forced`` is registered but not enabled for this call, or nothing is enabled.
        """
        on, all_modelled, fallback, tree = self._answer(plan, buffer)
        if forced is not None:
            chosen = self.get(forced)
            if forced in on:
                return chosen
            raise NotEnabledError(
                f"{self.kind} algorithm {forced!r} is not enabled for this call (it needs "
                f"{chosen.candidate.requires}); enabled: {', '.join(on) or 'none'}")
        if fallback is None:
            raise NotEnabledError(
                f"no {self.kind} algorithm is enabled for this call; registered: "
                + "; ".join(f"{b.name} (needs {b.candidate.requires})" for b in self.bound))
        if chooser is not None and all_modelled:
            name = chooser.choose(plan, nbytes, chunk_bytes)
            return tree if name == TREE and tree is not None else self._by_name[name]
        return fallback


# -- the default candidates -------------------------------------------------------------------
# Each check is a few attribute lookups: they run for every candidate on every call.
def _tree_enabled(transport: Transport, plan: Plan, buffer: Any) -> bool:
    return bool(plan.trees) and (buffer is None or is_allreduce_dtype(buffer.dtype))


def _ring_enabled(transport: Transport, plan: Plan, buffer: Any) -> bool:
    return buffer is None or is_allreduce_dtype(buffer.dtype)


def _library_enabled(transport: Transport, plan: Plan, buffer: Any) -> bool:
    return transport.has_library_allreduce and (buffer is None
                                                or is_allreduce_dtype(buffer.dtype))


def _tree_predict(topology: Topology, plan: Plan, nbytes: int, chunk_bytes: int,
                  costs: SoftwareCosts, network: NetworkModel) -> float:
    return _flows.plan_time(topology, plan, nbytes, chunk_bytes, costs, network)


def _ring_predict(topology: Topology, plan: Plan, nbytes: int, chunk_bytes: int,
                  costs: SoftwareCosts, network: NetworkModel) -> float:
    return _ring.predict_time(topology, nbytes, chunk_bytes, costs, network)


def _dbtree_predict(topology: Topology, plan: Plan, nbytes: int, chunk_bytes: int,
                    costs: SoftwareCosts, network: NetworkModel) -> float:
    return _dbtree.predict_time(topology, nbytes, chunk_bytes, costs, network)


def _hierarchical_predict(topology: Topology, plan: Plan, nbytes: int, chunk_bytes: int,
                          costs: SoftwareCosts, network: NetworkModel) -> float:
    return _hierarchical.predict_time(topology, _hierarchical.topology_hosts(topology), nbytes,
                                      chunk_bytes, costs, network)


def _broadcast_enabled(transport: Transport, plan: Plan, buffer: Any) -> bool:
    return bool(plan.trees) and (buffer is None or _ops.dtype_code(buffer.dtype) > 0)


REGISTRY: Dict[str, List[Candidate]] = {
    ALLREDUCE: [
        Candidate("tree", ALLREDUCE, "a plan with trees and an allreduce dtype", _tree_enabled,
                  lambda t, plan, pool, window, params: TreeAllreduce(
                      t, plan, window=window, pool=pool, in_flight_extra=params.in_flight_extra,
                      pace_factor=params.pace_factor), _tree_predict),
        Candidate("ring", ALLREDUCE, "an allreduce dtype", _ring_enabled,
                  lambda t, plan, pool, window, params: RingAllreduce(t, pool=pool),
                  _ring_predict),
        Candidate("mpi", ALLREDUCE, "a transport with a library allreduce and an allreduce "
                  "dtype", _library_enabled,
                  lambda t, plan, pool, window, params: MPIAllreduce(t, pool)),
        # NCCL's double binary tree in rank order.
        Candidate("dbtree", ALLREDUCE, "an allreduce dtype", _ring_enabled,
                  lambda t, plan, pool, window, params: DoubleBinaryTreeAllreduce(
                      t, pool=pool, window=window, in_flight_extra=params.in_flight_extra),
                  _dbtree_predict),
        # Horovod's hierarchical allreduce over the ranks' hosts (processor names, exchanged
        # at its first call).
        Candidate("hierarchical", ALLREDUCE, "an allreduce dtype", _ring_enabled,
                  lambda t, plan, pool, window, params: HierarchicalAllreduce(t, pool=pool),
                  _hierarchical_predict),
    ],
    BROADCAST: [
        Candidate("tree", BROADCAST, "a plan with trees and a broadcast dtype",
                  _broadcast_enabled,
                  lambda t, plan, pool, window, params: TreeBroadcast(
                      t, plan, window=window, pool=pool,
                      in_flight_extra=params.in_flight_extra)),
    ],
}


def register(candidate: Candidate, before: Optional[str] = None) -> None:
    """Add ``candidate`` to its kind's list, last or just before the one named ``before``
    (engines made afterwards bind it). Every rank must register the same candidates."""
    table = REGISTRY.setdefault(candidate.kind, [])
    if any(c.name == candidate.name for c in table):
        raise ValueError(f"a {candidate.kind} algorithm named {candidate.name!r} is registered")
    names = [c.name for c in table]
    if before is None:
        table.append(candidate)
    elif before in names:
        table.insert(names.index(before), candidate)
    else:
        raise ValueError(f"no {candidate.kind} algorithm named {before!r}; registered: "
                         f"{', '.join(names)}")
