"""Forest kinds: the tree packings a plan may be cut from, and the choice among them.

Each kind is one small class (:class:`ForestKind`): its name, what a topology needs for it
(:meth:`~ForestKind.offered`), and :meth:`~ForestKind.pack`, which returns its candidate
packings (one, or one per setting it weighs). :data:`KINDS` lists them in the order the
choice weighs them:

- *deep*: the certified packing (:func:`~.gk.pack`, or over hosts
  :func:`~.hierarchy.pack_hierarchical`), highest throughput; every plan carries its bound;
  also the fewest of its trees that carry as much at their fair rates
  (:func:`~.sharing.fewest_trees`), where fewer than all;
- *hosts*: rotated binary trees over machines (:mod:`~.hostforest`), one crossing of each
  WAN or rack cut per tree, a few host hops deep, at each count of host trees
  (:func:`~.hostforest.host_tree_counts`).

:func:`choose_forest` keeps the candidate with the lowest predicted time for the plan's size
(:meth:`Plan.predict_time <horotopo.plan.Plan.predict_time>`); a tie keeps the one weighed
first, so the certified deep forest wins every tie. Which kind wins which row of the scale
table is docs/results/forest_kinds.md (``benchmarks/forest_kinds.py``): a kind stays only
where it wins some row. Ring itself is not a forest here but a peer algorithm that the
algorithm choice weighs against the plan (:mod:`horotopo.algorithms`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..params import PLANNER, PlannerParams
from ..topology import Topology
from .certificate import plural
from .gk import UNBOUNDED_BPS
from .hierarchy import HostModel, machines
from .hostforest import has_hosts, host_tree_counts, pack_host_forests
from .model import Packing
from .sharing import fewest_trees

__all__ = ["ForestKind", "Candidates", "KINDS", "FORESTS", "kind_names", "check_forest",
           "choose_forest", "describe_choice"]


@dataclass(frozen=True)
class Candidates:
    """What a kind packs from: the topology, the certified packing, whether the plan is over
    hosts, the bound on host trees (None: ``params.max_host_trees``), the topology's
    :class:`~.hierarchy.HostModel` where the packing built one, and the planner's
    parameters (the host forests' read theirs)."""

    topology: Topology
    packing: Packing
    hierarchical: bool
    max_host_trees: Optional[int] = None
    host_model: Optional[HostModel] = None
    params: PlannerParams = PLANNER


class ForestKind:
    """One kind of forest: ``name``, what it ``needs`` (said when it is forced where it is not
    offered), and its candidate packings."""

    name = ""
    needs = ""

    def offered(self, topology: Topology, hierarchical: bool,
                params: PlannerParams = PLANNER) -> bool:
        """Whether ``topology`` (planned over hosts where ``hierarchical``) can have it."""
        return True

    def pack(self, given: Candidates) -> List[Packing]:
        """The candidate packings, each with ``extra`` saying what sets it apart."""
        raise NotImplementedError


class DeepForest(ForestKind):
    name = "deep"

    def pack(self, given: Candidates) -> List[Packing]:
        # and the fewest of its trees that carry as much, each faster: a shorter fill
        fewer = fewest_trees(given.topology, given.packing.trees)
        if fewer is None:
            return [given.packing]
        return [given.packing, replace(given.packing, trees=fewer,
                                       extra=dict(given.packing.extra, leading_trees=len(fewer)))]


class HostForest(ForestKind):
    name = "hosts"
    needs = ("machines that hold several ranks (or a local fabric much faster than the way "
             "out)")

    def offered(self, topology: Topology, hierarchical: bool,
                params: PlannerParams = PLANNER) -> bool:
        return has_hosts(topology, params)

    def pack(self, given: Candidates) -> List[Packing]:
        h_count = len(set(machines(given.topology, given.params)))
        return pack_host_forests(given.topology,
                                 host_tree_counts(h_count, limit=given.max_host_trees,
                                                  params=given.params),
                                 model=given.host_model, params=given.params)


#: The kinds, in the order the choice weighs them (a tie keeps the earlier).
KINDS: Tuple[ForestKind, ...] = (DeepForest(), HostForest())

#: ``make_plan(forest=...)``: choose on the prediction, or force one kind.
FORESTS = ("auto",) + tuple(k.name for k in KINDS)


def kind_names() -> Tuple[str, ...]:
    """The kinds' names, in the order the choice weighs them."""
    return tuple(k.name for k in KINDS)


def _kind(name: str) -> ForestKind:
    return next(k for k in KINDS if k.name == name)


def check_forest(forest: str, topology: Optional[Topology] = None,
                 hierarchical: bool = False, params: PlannerParams = PLANNER) -> None:
    """Raise ValueError unless ``forest`` is one of :data:`FORESTS` and, given a topology,
    one that it offers (planned over hosts where ``hierarchical``)."""
    if forest not in FORESTS:
        raise ValueError(f"forest must be one of {', '.join(FORESTS)}, got {forest!r}")
    if forest != "auto" and topology is not None:
        kind = _kind(forest)
        if not kind.offered(topology, hierarchical, params):
            # forcing a forest that this topology cannot have must not quietly give another
            raise ValueError(f"forest {forest!r} needs {kind.needs}; {topology.name!r} "
                             f"{'planned over hosts ' if hierarchical else ''}has none")


def choose_forest(given: Candidates, build: Callable[[Packing], Any], size: int, *,
                  forest: str = "auto", network: Any = None,
                  predict: Optional[Callable[[Any, int], float]] = None,
                  progress: Optional[Callable[[str], None]] = None
                  ) -> Tuple[Any, Dict[str, Any]]:
    """The plan of the candidate predicted fastest for an allreduce of ``size`` bytes.

    ``build`` turns a packing into a plan (anything with ``predict_time(size)``,
    ``throughput_Bps`` and ``trees`` whose items have ``depth``); ``network`` (a
    :class:`~horotopo.packing.alphabeta.NetworkModel`, default the links as declared) is what
    ``predict_time`` predicts on; ``predict(plan, size)``, where given, predicts instead (the
    flow model of the algorithm choice); ``record["model"]`` says which predicted. ``forest``
    names a kind to force it: that kind alone is built, but for fewer than three ranks or a
    network where nothing binds, where the deep forest stands. Every candidate carries the
    certified packing's bound, which bounds every packing.

    Returns the plan and a record of the choice: the size, the chosen kind and, per kind
    weighed, its best candidate's predicted time, throughput, tree count and deepest tree
    (reduce plus broadcast hops), and the wall time the kind took; a kind with several
    candidates (host-tree counts) lists each one's predicted time under ``tried``.
    """
    topology = given.topology
    check_forest(forest, topology, given.hierarchical, given.params)
    record: Dict[str, Any] = {"size": int(size),
                              "model": "plan" if predict is None else "flows"}
    if predict is None:
        def predict(plan: Any, nbytes: int) -> float:
            return (plan.predict_time(nbytes) if network is None
                    else plan.predict_time(nbytes, network=network))
    if forest != "auto":
        record["forced"] = True
    if given.max_host_trees is not None:
        host_tree_counts(1, limit=given.max_host_trees)  # a bound below one fails here
        record["max_host_trees"] = int(given.max_host_trees)
    packing = given.packing
    constrained = (packing.upper_bound is not None and len(topology.capacity_Bps) > 0
                   and packing.throughput < UNBOUNDED_BPS)
    # with fewer than three ranks, or no resource that binds, every forest runs alike: the
    # certified one stands, whichever kind was asked for
    alike = topology.n < 3 or not constrained
    pick: Any = None
    for kind in KINDS:
        wanted = kind.name == "deep" if alike else forest in ("auto", kind.name)
        if not wanted or not kind.offered(topology, given.hierarchical, given.params):
            continue
        start = time.perf_counter()
        tried = [_candidate(kind, found, packing, build, size, predict)
                 for found in kind.pack(given)]
        if not tried:
            continue
        plan, summary = min(tried, key=lambda c: c[1]["predicted_s"])  # first of equals
        # the kind's wall time: its packing (the deep one's is the planner's), plans, predictions
        summary["seconds"] = round(time.perf_counter() - start, 4)
        if len(tried) > 1:
            summary["tried"] = {str(c[1]["variant"]): c[1]["predicted_s"] for c in tried}
        record[kind.name] = summary
        if pick is None or summary["predicted_s"] < record[record["chosen"]]["predicted_s"]:
            pick, record["chosen"] = plan, kind.name
    if progress is not None:
        progress(f"forest for {size} bytes: {record['chosen']} (predicted "
                 + ", ".join(f"{k} {record[k]['predicted_s'] * 1e3:.3f} ms"
                             for k in kind_names() if k in record) + ")")
    return pick, record


def _candidate(kind: ForestKind, found: Packing, packing: Packing,
               build: Callable[[Packing], Any], size: int,
               predict: Callable[[Any, int], float]) -> Tuple[Any, Dict[str, Any]]:
    """The plan of one candidate ``found`` of ``kind`` and its summary."""
    if found is not packing:
        # the plan carries the deep packing's certificate, so its statistics too (a plan over
        # hosts keeps its flat bound and machine count); the forest's own count of host trees
        found = replace(found, upper_bound=packing.upper_bound,
                        bound_phase=packing.bound_phase, iterations=packing.iterations,
                        columns=packing.columns, seconds=packing.seconds,
                        extra=dict(packing.extra, **found.extra))
    plan = build(found)
    pred = float(predict(plan, size))
    summary: Dict[str, Any] = {"predicted_s": pred, "throughput_Bps": plan.throughput_Bps,
                               "trees": len(plan.trees),
                               "max_hops": max(t.depth for t in plan.trees)}
    # what sets the candidate apart among its kind's: its count of host trees, or of the
    # certified packing's trees where it keeps the fewest that carry as much
    if kind.name == "hosts":
        summary["host_trees"] = summary["variant"] = found.extra["host_trees"]
    else:
        summary["variant"] = found.extra.get("leading_trees", "all")
    return plan, summary


def describe_choice(record: Dict[str, Any], size_text: Any = str) -> List[str]:
    """Lines saying which forest a plan kept and each kind's prediction
    (``planner["forest"]``)."""
    weighed = [k for k in kind_names() if k in record]
    how = "forced" if record.get("forced") else "predicted fastest"
    out = [f"  forest: {record['chosen']}, {how} for {size_text(record['size'])}"
           f"{' (the only candidate)' if len(weighed) == 1 else ''}"]
    for kind in weighed:
        got = record[kind]
        counts = f", {plural(got['host_trees'], 'host tree')}" if "host_trees" in got else ""
        out.append(f"    {kind:<8} predicted {got['predicted_s'] * 1e3:12.3f} ms, "
                   f"R {got['throughput_Bps'] / 1e6:.3f} MB/s, {plural(got['trees'], 'tree')}, "
                   f"deepest {plural(got['max_hops'], 'hop')}{counts}")
    return out
