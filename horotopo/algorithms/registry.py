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
  order.

Registered by default: allreduce ``tree`` (the Plan's trees), ``ring`` (any transport),
``mpi`` (the transport's library allreduce), ``dbtree`` (NCCL's double binary tree) and
``hierarchical`` (Horovod's hierarchical allreduce), peers for comparisons; broadcast
``tree``. Every input of a choice is the same on every rank (the plan, the agreed dtype, the
transport's kind), so ranks choose alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from .. import ops as _ops
from ..ops import is_allreduce_dtype
from ..buffers import ScratchPool
from ..plan import Plan
from ..transport.base import Transport
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


class NotEnabledError(ValueError):
    """A forced algorithm cannot run this call; the message names the enabled ones."""


class Chooser(Protocol):
    """What picks between the modelled algorithms: CostModel or Selector."""

    def choose(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> str: ...


#: Builds an algorithm's runner over ``(transport, plan, pool, window)``.
Factory = Callable[[Transport, Plan, ScratchPool, Optional[int]], Any]
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
        ``make(transport, plan, pool, window)``: the runner; an allreduce runner has
        ``run(src, out, op, chunk_elems)``, a broadcast runner ``run(buf, root, chunk_elems)``,
        and either may count its messages in ``last_messages``.
    """

    name: str
    kind: str
    requires: str
    enabled: Enabled
    make: Factory


class Bound:
    """A candidate bound to an engine's transport and plan: ``enabled(plan, buffer)`` and the
    runner."""

    # Plain attributes, not properties: the engine asks every candidate on every call.
    __slots__ = ("candidate", "name", "runner", "_check", "_transport")

    def __init__(self, candidate: Candidate, transport: Transport, plan: Plan,
                 pool: ScratchPool, window: Window) -> None:
        self.candidate = candidate
        self.name = candidate.name
        self._check = candidate.enabled
        self._transport = transport
        self.runner = candidate.make(transport, plan, pool, window)

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
        # among them, the candidate taken when the chooser cannot be asked)
        self._known: Dict[Tuple[type, Any], Tuple[Tuple[str, ...], bool, Optional[Bound]]] = {}

    @classmethod
    def bind(cls, kind: str, transport: Transport, plan: Plan, pool: ScratchPool,
             window: Window = None,
             registry: Optional[Dict[str, List[Candidate]]] = None) -> "Candidates":
        """Build every registered candidate of ``kind`` over ``transport`` (once, at set-up)."""
        table = REGISTRY if registry is None else registry
        if kind not in table:
            raise ValueError(f"no algorithms are registered for {kind!r}")
        return cls(kind, [Bound(c, transport, plan, pool, window) for c in table[kind]], plan)

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

    def _answer(self, plan: Plan, buffer: Any
                ) -> Tuple[Tuple[str, ...], bool, Optional[Bound]]:
        key = (type(buffer), getattr(buffer, "dtype", None))
        if plan is self._plan:
            known = self._known.get(key)
            if known is not None:
                return known
        on = tuple(b.name for b in self.bound if b._check(b._transport, plan, buffer))
        modelled = [name for name in on if name in MODELLED]
        fallback = self._by_name[modelled[0] if modelled else on[0]] if on else None
        answer = (on, len(modelled) == len(MODELLED), fallback)
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
        on, all_modelled, fallback = self._answer(plan, buffer)
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
            return self._by_name[chooser.choose(plan, nbytes, chunk_bytes)]
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


def _broadcast_enabled(transport: Transport, plan: Plan, buffer: Any) -> bool:
    return bool(plan.trees) and (buffer is None or _ops.dtype_code(buffer.dtype) > 0)


REGISTRY: Dict[str, List[Candidate]] = {
    ALLREDUCE: [
        Candidate("tree", ALLREDUCE, "a plan with trees and an allreduce dtype", _tree_enabled,
                  lambda t, plan, pool, window: TreeAllreduce(t, plan, window=window,
                                                              pool=pool)),
        Candidate("ring", ALLREDUCE, "an allreduce dtype", _ring_enabled,
                  lambda t, plan, pool, window: RingAllreduce(t, pool=pool)),
        Candidate("mpi", ALLREDUCE, "a transport with a library allreduce and an allreduce "
                  "dtype", _library_enabled,
                  lambda t, plan, pool, window: MPIAllreduce(t, pool)),
        # NCCL's double binary tree in rank order: a peer to compare with, never chosen by
        # the cost model (which does not time it); forced by name.
        Candidate("dbtree", ALLREDUCE, "an allreduce dtype", _ring_enabled,
                  lambda t, plan, pool, window: DoubleBinaryTreeAllreduce(t, pool=pool,
                                                                          window=window)),
        # Horovod's hierarchical allreduce over the ranks' hosts (processor names, exchanged
        # at its first call): a peer like dbtree, forced by name.
        Candidate("hierarchical", ALLREDUCE, "an allreduce dtype", _ring_enabled,
                  lambda t, plan, pool, window: HierarchicalAllreduce(t, pool=pool)),
    ],
    BROADCAST: [
        Candidate("tree", BROADCAST, "a plan with trees and a broadcast dtype",
                  _broadcast_enabled,
                  lambda t, plan, pool, window: TreeBroadcast(t, plan, window=window,
                                                              pool=pool)),
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
