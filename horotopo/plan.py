"""The Plan: the schedule of an allreduce, as data.

A Plan is what rank 0 computes at ``init()`` and broadcasts; the engine interprets it and builds
no trees itself. It holds one entry per tree (the paper's *synchronization topology* is the set of
these trees): the root ``r``, the reduce in-arborescence ``A`` and the broadcast out-arborescence
``B`` as parent arrays, the rate ``x`` and the share ``x / R`` of each buffer that the tree
carries. It also carries the modelled throughput ``R``, ring's throughput on the same model, the
certified upper bound, a chunk size and a digest that every rank checks.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from .packing import (ArcModel, Packing, check_certificate, format_percent, pack, plural,
                      ring_packing, start_bound, validate_arborescence)
from .packing.model import hops_to_root
from .packing.profiles import fill_crowding, forest_depths, tree_profiles
from .packing.profiles import plan_latency as _plan_latency
from .packing.sharing import share_fairly, sharing_note, usage_of
from .packing import alphabeta as _ab
from .packing import hierarchy as _hierarchy
from .packing.certificate import RTOL
from .packing.certificate import gap as certificate_gap
from .packing.alphabeta import target_size
from .packing.forests import Candidates, check_forest, choose_forest, describe_choice
from .packing.hostforest import host_tree_counts
from .packing.gk import PHASE_START
from . import config
from .params import PLANNER, PlannerParams
from .topology import Topology

__all__ = ["Tree", "Plan", "PlanError", "make_plan", "plan_from_trees", "ring_plan",
           "ring_time", "modelled_rate_on", "parse_size", "format_size", "children", "depth"]

PLAN_VERSION = 1


class PlanError(ValueError):
    """A plan document that is malformed or inconsistent."""


@dataclass(frozen=True)
class Tree:
    """One reduce/broadcast tree pair with its rate.

    ``reduce_parent[v]`` is where ``v`` sends its partial sum (``-1`` at the root);
    ``bcast_parent[v]`` is where ``v`` receives the result from (``-1`` at the root).
    """

    root: int
    reduce_parent: Tuple[int, ...]
    bcast_parent: Tuple[int, ...]
    rate_Bps: float
    share: float
    #: This tree's chunk size (None: the plan's ``chunk_bytes``), chosen from the alpha-beta
    #: model for the size the plan was made for (:func:`horotopo.packing.alphabeta.choose_chunk`).
    chunk_bytes: Optional[int] = None
    #: Hops of its critical reduce and broadcast paths as ``(latency_s, s_per_byte, count)``
    #: (:func:`horotopo.packing.alphabeta.critical_profile`); empty when no network was known.
    profile: _ab.Profile = ()

    def reduce_children(self) -> Tuple[Tuple[int, ...], ...]:
        return children(self.reduce_parent)

    def bcast_children(self) -> Tuple[Tuple[int, ...], ...]:
        return children(self.bcast_parent)

    @cached_property
    def depth(self) -> int:
        """Hops from the farthest leaf up ``A`` plus hops down ``B`` to the farthest leaf."""
        return depth(self.reduce_parent) + depth(self.bcast_parent)


# The package's one copy of the arborescence helpers: the step tables (horotopo.schedule) and
# the plan's own depth use these; the engine computes no tree structure itself.
def children(parent: Sequence[int]) -> Tuple[Tuple[int, ...], ...]:
    """Children of every rank in the parent array ``parent``, in increasing rank order.

    The order is fixed so that every reduction combines its children's parts in the same order
    on every run (bitwise-identical results whatever order the messages arrive in).
    """
    kids: list = [[] for _ in parent]
    for v, p in enumerate(parent):
        if p >= 0:
            kids[p].append(v)
    return tuple(tuple(k) for k in kids)


def depth(parent: Sequence[int]) -> int:
    """Largest number of hops from any rank to the root of the parent array ``parent``."""
    hops = hops_to_root(parent)
    if hops is None:
        raise PlanError("a parent array with a cycle has no depth")
    return int(hops.max()) if len(hops) else 0


@dataclass(frozen=True)
class Plan:
    """An allreduce schedule over ``n`` ranks (see module docstring)."""

    n: int
    trees: Tuple[Tree, ...]
    chunk_bytes: int
    throughput_Bps: float
    ring_Bps: float
    upper_bound_Bps: Optional[float]
    latency_s: float
    topology_name: str = ""
    topology_digest: str = ""
    pruning_loss: float = 0.0
    planner: Dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def packed_Bps(self) -> float:
        """The LP packing's total, which the certificate bounds (throughput_Bps: fair-shared)."""
        return self.planner.get("packed_Bps", self.throughput_Bps)

    @property
    def gap(self) -> Optional[float]:
        """Certified gap of the LP packing, ``1 - packed_Bps / upper_bound`` (None: no bound).
        Not floored: building or loading a plan rejects a bound below ``packed_Bps`` beyond
        rounding (``RTOL``), so the value is at least ``-RTOL``; a tight bound may give -1e-16.
        """
        return certificate_gap(self.packed_Bps, self.upper_bound_Bps)

    @cached_property
    def digest(self) -> str:
        """Hash of everything the engine acts on; ranks compare it before the first op. Kept
        once made: the plan is frozen, and at 1024 ranks each hash takes about 0.1 s."""
        core = {"n": self.n, "chunk_bytes": self.chunk_bytes, "trees": [
            [t.root, list(t.reduce_parent), list(t.bcast_parent), repr(float(t.share))]
            + ([] if t.chunk_bytes is None else [t.chunk_bytes]) for t in self.trees]}
        return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]

    def tree_chunks(self, chunk_bytes: Optional[int] = None) -> Tuple[int, ...]:
        """Each tree's chunk size in bytes when the engine runs at ``chunk_bytes``.

        The plan's chunk sizes are relative: ``chunk_bytes`` (default the plan's own, the
        largest tree's) scales every tree's chunk alike, so an engine given smaller chunks
        (a simulation's scaled-down buffers) keeps each tree's number of chunks.
        """
        base = self.chunk_bytes if chunk_bytes is None else int(chunk_bytes)
        return tuple(base if t.chunk_bytes is None
                     else max(1, round(t.chunk_bytes * base / self.chunk_bytes))
                     for t in self.trees)

    def profiled_on(self, topology: Topology, chunk_bytes: Optional[int] = None,
                    costs: _ab.SoftwareCosts = _ab.ENGINE_COSTS) -> "Plan":
        """The same trees (and digest) with every tree's critical-path profile made again on
        ``topology`` by the current model, at its chunk for ``chunk_bytes`` under ``costs``,
        crowded by all the plan's trees as the planner crowds them
        (:func:`~.packing.profiles.fill_crowding`): a plan kept from an earlier planner (a
        benchmark's cache) is predicted as the model now predicts it."""
        pairs = [(t.reduce_parent, t.bcast_parent) for t in self.trees]
        chunks = [float(c) for c in self.tree_chunks(chunk_bytes)]
        profiles = tree_profiles(topology, pairs, chunks, costs,
                                 [t.rate_Bps for t in self.trees], fill_crowding(topology, pairs))
        return replace(self, trees=tuple(replace(t, profile=p)
                                         for t, p in zip(self.trees, profiles)))

    def predict_time(self, nbytes: int, chunk_bytes: Optional[int] = None, *,
                     costs: _ab.SoftwareCosts = _ab.ENGINE_COSTS,
                     network: _ab.NetworkModel = _ab.IDEAL_NETWORK) -> float:
        """The planner's idealized seconds for an allreduce of ``nbytes`` at the window of the
        parameters the plan was made with (:attr:`planner_params`), each tree at its
        planned rate: the slowest tree's pipeline (its first chunk over its critical paths at
        the hops' link rates shared among the flows that reach them with it,
        :class:`~horotopo.packing.profiles.Crowding`; the rest at the tree's rate), or the
        busiest rank's software time plus the shortest tree's fill
        (:func:`horotopo.packing.alphabeta.plan_time`). The planner weighs forests and chunks
        by it. The time the chooser compares with the other algorithms is the one time model's,
        :func:`horotopo.algorithms.flows.plan_time`: the trees sharing the links (as the
        transport shares them) and the ranks' CPUs, not held at their planned rates.

        Parameters
        ----------
        nbytes : int
            Allreduce size in bytes.
        chunk_bytes : int, optional
            The engine's chunk size (see :meth:`tree_chunks`); None: the plan's.
        costs : SoftwareCosts
            The engine's software costs (default the measured ``ENGINE_COSTS``).
        network : NetworkModel
            What the transport makes of the declared links (default: as declared).

        A tree without a profile (explicit trees, no network) is charged ``depth`` hops at
        the plan's worst latency and its own rate: an upper estimate.
        """
        if nbytes <= 0 or self.n == 1:
            return 0.0
        profiles = [t.profile or ((self.latency_s, 1.0 / t.rate_Bps, t.depth),)
                    for t in self.trees]
        return _ab.plan_time([t.share * nbytes for t in self.trees],
                             self.tree_chunks(chunk_bytes), [t.rate_Bps for t in self.trees],
                             profiles, self._degrees, costs, network,
                             params=self.planner_params)

    @cached_property
    def planner_params(self) -> PlannerParams:
        """The planner parameters this plan was made with (``planner["params"]`` holds those
        that differ from the defaults): the windows its predictions charge are the ones the
        engine's tables run."""
        record = self.planner.get("params")
        return PlannerParams.recorded(record) if record else PLANNER

    @cached_property
    def _degrees(self) -> Tuple[Any, Any]:
        """:func:`~horotopo.packing.alphabeta.rank_degrees` of the trees, once per plan."""
        return _ab.rank_degrees([(t.root, t.reduce_parent, t.bcast_parent) for t in self.trees])

    @cached_property
    def tree_shapes(self) -> Tuple[Tuple[Tuple[Tuple[int, ...], ...],
                                         Tuple[Tuple[int, ...], ...], int], ...]:
        """Per tree: reduce children, broadcast children and depth, once per plan: ``O(n)``
        per tree, which every rank of a process that shares the plan (a simulation's
        thousands, :mod:`horotopo.schedule`) would otherwise repeat."""
        return tuple((children(t.reduce_parent), children(t.bcast_parent), t.depth)
                     for t in self.trees)

    def to_json(self) -> Dict[str, Any]:
        return {
            "version": PLAN_VERSION, "n": self.n, "chunk_bytes": self.chunk_bytes,
            "throughput_Bps": self.throughput_Bps, "ring_Bps": self.ring_Bps,
            "upper_bound_Bps": self.upper_bound_Bps, "gap": self.gap,
            "latency_s": self.latency_s, "pruning_loss": self.pruning_loss,
            "topology_name": self.topology_name, "topology_digest": self.topology_digest,
            "digest": self.digest, "planner": dict(self.planner),
            "trees": [_tree_json(t) for t in self.trees],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Plan":
        try:
            if doc.get("version", PLAN_VERSION) != PLAN_VERSION:
                raise PlanError(f"version: this horotopo reads plan version {PLAN_VERSION}, "
                                f"got {doc.get('version')!r}")
            trees = tuple(Tree(root=int(t["root"]),
                               reduce_parent=tuple(int(p) for p in t["reduce_parent"]),
                               bcast_parent=tuple(int(p) for p in t["bcast_parent"]),
                               rate_Bps=float(t["rate_Bps"]), share=float(t["share"]),
                               chunk_bytes=(None if t.get("chunk_bytes") is None
                                            else int(t["chunk_bytes"])),
                               profile=tuple((float(lat), float(inv), int(count))
                                             for lat, inv, count in t.get("profile", ())))
                          for t in doc["trees"])
            plan = cls(n=int(doc["n"]), trees=trees, chunk_bytes=int(doc["chunk_bytes"]),
                       throughput_Bps=float(doc["throughput_Bps"]),
                       ring_Bps=float(doc["ring_Bps"]),
                       upper_bound_Bps=(None if doc["upper_bound_Bps"] is None
                                        else float(doc["upper_bound_Bps"])),
                       latency_s=float(doc.get("latency_s", 0.0)),
                       topology_name=str(doc.get("topology_name", "")),
                       topology_digest=str(doc.get("topology_digest", "")),
                       pruning_loss=float(doc.get("pruning_loss", 0.0)),
                       planner=dict(doc.get("planner", {})))
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"malformed plan document: {type(exc).__name__}: {exc}") from None
        plan.validate()
        if "digest" in doc and doc["digest"] != plan.digest:
            raise PlanError(f"digest: document says {doc['digest']}, contents hash to "
                            f"{plan.digest}; the plan was altered or corrupted")
        return plan

    def validate(self) -> None:
        """Raise PlanError unless every tree spans all ranks and shares sum to 1."""
        if self.n < 1:
            raise PlanError(f"n: must be at least 1, got {self.n}")
        if not self.trees:
            raise PlanError("trees: a plan needs at least one tree")
        if self.chunk_bytes < 1:
            raise PlanError(f"chunk_bytes: must be positive, got {self.chunk_bytes}")
        checked = _check_forests(self.trees, self.n)
        for k, t in enumerate(self.trees):
            for name, parent in (("reduce_parent", t.reduce_parent),
                                 ("bcast_parent", t.bcast_parent)):
                problem = None if checked else validate_arborescence(parent, t.root, self.n)
                if problem:
                    raise PlanError(f"trees[{k}].{name}: {problem}")
            if not (t.share >= 0 and math.isfinite(t.share)):
                raise PlanError(f"trees[{k}].share: must be >= 0, got {t.share}")
            if not (t.rate_Bps > 0 and math.isfinite(t.rate_Bps)):
                raise PlanError(f"trees[{k}].rate_Bps: must be positive, got {t.rate_Bps}")
            if t.chunk_bytes is not None and t.chunk_bytes < 1:
                raise PlanError(f"trees[{k}].chunk_bytes: must be positive, got {t.chunk_bytes}")
            for hop in t.profile:
                if not (len(hop) == 3 and all(math.isfinite(x) and x >= 0 for x in hop)
                        and hop[2] >= 1):
                    raise PlanError(f"trees[{k}].profile: hops are (latency_s >= 0, "
                                    f"s_per_byte >= 0, count >= 1), got {hop!r}")
        total = sum(t.share for t in self.trees)
        if abs(total - 1.0) > 1e-9:
            raise PlanError(f"trees: shares must sum to 1, got {total!r}")
        bound = self.upper_bound_Bps
        if bound is not None and not (math.isfinite(bound) and bound > 0):
            raise PlanError(f"upper_bound_Bps: must be a positive finite number or null (no "
                            f"certificate), got {bound!r}")
        if not (isinstance(packed := self.packed_Bps, (int, float)) and 0 < packed < math.inf):
            raise PlanError(f"planner.packed_Bps: must be a positive rate, got {packed!r}")
        if bound is not None and bound < packed * (1 - RTOL):
            raise PlanError(f"upper_bound_Bps: {bound!r} is below the packing's rate "
                            f"{packed!r}; the certificate is wrong")

    def with_chunk(self, chunk_bytes: int) -> "Plan":
        """This plan with every tree at ``chunk_bytes`` (the per-tree sizes are dropped)."""
        return replace(self, chunk_bytes=int(chunk_bytes),
                       trees=tuple(replace(t, chunk_bytes=None) for t in self.trees))

    def ring_speedup(self, size: int) -> float:
        """How many times faster than ring the plan is predicted for an allreduce of ``size``
        bytes: ring's modelled time over the plan's, the one ratio to ring that is quoted."""
        t_plan = self.predict_time(size)
        return ring_time(self, size) / t_plan if t_plan > 0 else math.inf

    def describe(self, size: Optional[int] = None) -> str:
        lines = [f"plan for {self.topology_name or 'topology'}: {plural(self.n, 'rank')}, "
                 f"{plural(len(self.trees), 'tree')}, chunk {format_size(self.chunk_bytes)}, "
                 f"digest {self.digest}"]
        lines.append(f"  modelled throughput R   {self.throughput_Bps / 1e6:12.3f} MB/s"
                     + sharing_note(self.planner))
        lines.append(f"  ring on the same model  {self.ring_Bps / 1e6:12.3f} MB/s")
        gap = self.gap
        if self.upper_bound_Bps is None or gap is None:
            lines.append("  certified upper bound   none (no certificate: the optimality gap "
                         "is unknown)")
        else:
            phase = self.planner.get("bound_phase")
            lines.append(f"  certified upper bound   {self.upper_bound_Bps / 1e6:12.3f} MB/s "
                         f"(gap {format_percent(gap)} of the LP packing, pruning cost "
                         f"{self.pruning_loss * 100:.2f}%{', from the ' + phase if phase else ''})")
        for k, t in enumerate(self.trees):
            lines.append(f"  tree {k:<3} root {t.root:<3} rate {t.rate_Bps / 1e6:10.3f} MB/s "
                         f"share {t.share:6.3f} depth {t.depth}"
                         + ("" if t.chunk_bytes is None
                            else f" chunk {format_size(t.chunk_bytes)}"))
            # each arc in the direction its data flows: up to the root, then down from it
            lines.append(f"      reduce {_arcs(t.reduce_parent, up=True)}")
            lines.append(f"      bcast  {_arcs(t.bcast_parent, up=False)}")
        forest = self.planner.get("forest")
        if forest:
            lines += describe_choice(forest, format_size)
        if size is not None:
            t_plan = self.predict_time(size)
            t_ring = ring_time(self, size)
            lines.append(f"  predicted allreduce of {format_size(size)}: {t_plan * 1e3:.3f} ms "
                         f"(ring {t_ring * 1e3:.3f} ms)")
        return "\n".join(lines)


def _check_forests(trees: Sequence[Tree], n: int) -> bool:
    """Whether every tree's parent arrays are arborescences at its root (checked as forests,
    :func:`~horotopo.packing.profiles.forest_depths`). False sends :meth:`Plan.validate` to
    the tree-by-tree check, which names what is wrong."""
    depths = forest_depths([(t.root, t.reduce_parent, t.bcast_parent) for t in trees], n)
    if depths is None:
        return False
    for t, (up, down) in zip(trees, depths):
        # the check found every depth at once; filling Tree.depth's cache spares each tree
        # the walk of its own (milliseconds per tree at thousands of ranks)
        t.__dict__["depth"] = up + down
    return True


def _tree_json(t: Tree) -> Dict[str, Any]:
    doc: Dict[str, Any] = {"root": t.root, "reduce_parent": list(t.reduce_parent),
                           "bcast_parent": list(t.bcast_parent), "rate_Bps": t.rate_Bps,
                           "share": t.share}
    if t.chunk_bytes is not None:
        doc["chunk_bytes"] = t.chunk_bytes
    if t.profile:
        doc["profile"] = [list(h) for h in t.profile]
    return doc


def _arcs(parent: Sequence[int], up: bool) -> str:
    """The tree's arcs in the order data crosses them: a reduce from the deepest ranks up, a
    broadcast from the root down."""
    depth = hops_to_root(parent)  # None only for a cycle, which a Plan never holds
    hops = [0] * len(parent) if depth is None else depth.tolist()
    order = sorted((v for v, p in enumerate(parent) if p >= 0),
                   key=lambda v: (-hops[v] if up else hops[v], v))
    arcs = [(v, parent[v]) if up else (parent[v], v) for v in order]
    return " ".join(f"{a}->{b}" for a, b in arcs) or "(single rank)"


def ring_time(plan: Plan, nbytes: int) -> float:
    """Ring's modelled time: 2(n-1) steps of M/n bytes at the ring's per-step rate."""
    if plan.n == 1 or plan.ring_Bps <= 0:
        return 0.0
    return nbytes / plan.ring_Bps + 2 * (plan.n - 1) * plan.latency_s


# ---------------------------------------------------------------------------------------------
# building plans


def modelled_rate_on(plan: Plan, topology: Topology) -> float:
    """Modelled allreduce rate (bytes/s) of ``plan``'s trees and shares on ``topology``, which
    need not be the topology the plan was made from.

    The engine splits every buffer by the plan's shares, so resource ``l`` carries
    ``sum_t share_t * load_t(l)`` bytes per byte reduced; the slowest resource sets the rate.
    A plan made from a probed model is thus judged on the real (declared) network, without the
    noise of a measurement.
    """
    # From the plan's arcs' routes alone: an arc model of every rank pair costs O(n^2) routes
    load = usage_of(topology, plan.trees).load(np.array([t.share for t in plan.trees]))
    worst = float((load / topology.capacity_array).max(initial=0.0))
    return float("inf") if worst <= 0 else 1.0 / worst


def _from_packing(topology: Topology, packing: Packing, ring: Packing,
                  chunk_bytes: Optional[int], size: int, same_shape: bool = False,
                  params: PlannerParams = PLANNER) -> Plan:
    """The Plan of the trees of ``packing`` whose fair rates sum highest, at those rates, shares
    in proportion (:func:`~.packing.sharing.share_fairly`), with profiles and chunks for
    ``size``. ``same_shape``: ring's chains (rates kept), whose first tree's profile all take.
    ``params`` bound the fair-subset search and the chunks; ``planner["params"]`` records
    those that differ from the defaults."""
    packed = sum(t.rate for t in packing.trees)
    if packing.upper_bound is not None:
        # pack() checked its own total; the plan re-sums the tree rates, and a bound handed in
        # from elsewhere (ring_plan) is checked here for the first time.
        check_certificate(packing.upper_bound, packed, topology=topology.name,
                          phase=packing.bound_phase or "packing", achieved_by="the plan's trees")
    kept, sharing = share_fairly(topology, packing.trees, packed, keep_rates=same_shape,
                                 params=params)
    total = sum(t.rate for t in kept)
    shares = [t.rate / total for t in kept]
    # Force an exact sum of 1 so that every rank splits buffers identically.
    shares[-1] = 1.0 - sum(shares[:-1])
    cols = [(t.root, t.reduce_parent, t.bcast_parent, t.rate) for t in kept]
    k = 1 if same_shape else len(cols)
    # every tree counts: a first chunk shares each link with the flows that reach it with it
    crowding = fill_crowding(topology, [(t.reduce_parent, t.bcast_parent) for t in kept])
    profiles, chunks = _ab.plan_chunks(topology, cols[:k], shares[:k], size,
                                       crowding=crowding, params=params)
    profiles, chunks = profiles * (len(cols) // k), chunks * (len(cols) // k)
    top = int(chunk_bytes) if chunk_bytes else max(chunks)
    trees = tuple(Tree(root=t.root, reduce_parent=tuple(t.reduce_parent),
                       bcast_parent=tuple(t.bcast_parent), rate_Bps=t.rate, share=s,
                       chunk_bytes=None if chunk_bytes else c, profile=prof)
                  for t, s, c, prof in zip(kept, shares, chunks, profiles))
    latency = _plan_latency(topology, kept)
    plan = Plan(n=topology.n, trees=trees, chunk_bytes=top,
                throughput_Bps=total, ring_Bps=ring.throughput,
                upper_bound_Bps=packing.upper_bound, latency_s=latency,
                topology_name=topology.name, topology_digest=topology.digest,
                pruning_loss=packing.pruning_loss,
                planner=dict(packing.stats(), packed_Bps=packed, sharing=sharing,
                             params=params.differing()))
    plan.validate()
    return plan


def make_plan(topology: Topology, *, chunk_bytes: Optional[int] = None,
              max_trees_per_root: Optional[int] = None, target_gap: Optional[float] = None,
              progress: Optional[Any] = None, size: Optional[int] = None,
              forest: str = "auto", network: Optional[_ab.NetworkModel] = None,
              hierarchy: Optional[str] = None,
              max_host_trees: Optional[int] = None,
              params: Optional[PlannerParams] = None,
              predict: Optional[Callable[["Plan", int], float]] = None) -> Plan:
    """Plan ``topology``: the certified packing, pruned, and the forest predicted fastest.

    ``hierarchy`` (default ``HOROTOPO_HIERARCHY``: ``auto``, ``on`` or ``off``) packs trees over
    hosts with an intra-host stage (:mod:`horotopo.packing.hierarchy`), expanded to rank-level
    trees; its certificate is the hierarchical model's bound, and ``planner`` holds the flat
    model's bound beside it.

    ``size`` is the allreduce size the plan is made for (default :func:`target_size`): the
    chunk sizes are chosen for it, and of the forest kinds the topology offers
    (:mod:`horotopo.packing.forests`: the certified deep one, host forests) the one with the
    lowest predicted time for it is kept (``forest="auto"``; a kind's name forces it),
    predicted on ``network`` (default: the links as declared) by :meth:`Plan.predict_time`, or
    by ``predict(plan, size)`` where given: init passes the flow model that the algorithm
    choice predicts with (:func:`horotopo.algorithms.choice.forest_predictor`; this layer
    cannot import it), so that forests and algorithms are weighed on one model.
    ``plan.planner["forest"]`` records the choice and every kind's prediction.

    ``max_host_trees`` bounds the host forest's host-level trees (default
    :attr:`~horotopo.params.PlannerParams.max_host_trees`; each is as many rank-level trees as a
    host has ranks): fewer trees, fewer messages. A bound given is recorded in
    ``plan.planner["forest"]`` and kept by the adaptive engine's re-plans.

    ``params`` (default :func:`horotopo.config.planner_params`: the defaults of
    :class:`~horotopo.params.PlannerParams` with the environment's ``HOROTOPO_PLANNER_*``
    overrides) set how far the packing refines, and bound the chunks, windows and fair-subset
    search; ``max_trees_per_root`` and ``target_gap``, where given, replace those fields of
    ``params`` (:attr:`~horotopo.params.PlannerParams.max_trees_per_root`,
    :attr:`~horotopo.params.PlannerParams.target_gap`). ``plan.planner["params"]``
    records the fields that differ from the defaults (empty: all defaults).
    """
    params = config.planner_params() if params is None else params
    given = {"max_trees_per_root": max_trees_per_root, "target_gap": target_gap}
    params = replace(params, **{k: v for k, v in given.items() if v is not None})
    size = target_size(size)
    hierarchical = _hierarchy.use_hierarchy(topology, hierarchy, params)
    # before the packing: a forced forest is never replaced, nor refused after the work
    check_forest(forest, topology, hierarchical, params)
    if max_host_trees is not None:
        # a bound below one fails before the packing
        host_tree_counts(1, limit=max_host_trees, params=params)
    host_model = None
    if hierarchical:
        rate = _hierarchy.ring_throughput(topology)  # O(n): no n^2 ring columns
        ring = Packing(trees=(), throughput=rate, upper_bound=None, full_throughput=rate)
        # the packing's, and the host forests'
        host_model = _hierarchy.HostModel(topology, params=params)
        packing = _hierarchy.pack_hierarchical(topology,
                                               max_trees_per_root=params.max_trees_per_root,
                                               target_gap=params.target_gap, progress=progress,
                                               host_model=host_model, params=params)
    else:
        ring = ring_packing(topology)
        packing = pack(topology, progress=progress, params=params)
    plan, record = choose_forest(
        Candidates(topology, packing, hierarchical, max_host_trees, host_model, params),
        lambda p: _from_packing(topology, p, ring, chunk_bytes, size, params=params), size,
        forest=forest, network=network, predict=predict, progress=progress)
    return replace(plan, planner=dict(plan.planner, forest=record))


def ring_plan(topology: Topology, chunk_bytes: Optional[int] = None,
              size: Optional[int] = None, params: Optional[PlannerParams] = None) -> Plan:
    """Ring allreduce in rank order, expressed as a Plan of ``n`` chains.

    Its certificate is the cheap dual bound at lengths ``1 / c``
    (:func:`~horotopo.packing.start_bound`): exact on a uniform star, where ring is optimal,
    and an honest (loose) bound elsewhere, so a non-uniform topology never shows "gap 0%".
    """
    ring = ring_packing(topology)
    bound = start_bound(ArcModel(topology)) if topology.n > 1 else None
    certified = replace(ring, upper_bound=bound if bound is not None and math.isfinite(bound)
                        else None, bound_phase=PHASE_START)
    return _from_packing(topology, certified, ring, chunk_bytes, target_size(size),
                         same_shape=True,
                         params=config.planner_params() if params is None else params)


def plan_from_trees(n: int, trees: Sequence[Tuple[int, Sequence[int], Sequence[int], float]],
                    chunk_bytes: int = 1 << 20, latency_s: float = 0.0,
                    topology: Optional[Topology] = None) -> Plan:
    """A Plan from explicit ``(root, reduce_parent, bcast_parent, rate)`` tuples (tests, tools).

    The plan carries no certificate (``upper_bound_Bps`` None). With a ``topology``, each
    tree gets its critical-path profile there (for :meth:`Plan.predict_time`), all at
    ``chunk_bytes``.
    """
    total = float(sum(t[3] for t in trees))
    shares = [t[3] / total for t in trees]
    shares[-1] = 1.0 - sum(shares[:-1])
    profiles = (tree_profiles(topology, [(a, b) for _, a, b, _ in trees],
                              [chunk_bytes] * len(trees), _ab.ENGINE_COSTS)
                if topology is not None else [()] * len(trees))
    plan = Plan(n=n, trees=tuple(Tree(int(r), tuple(a), tuple(b), float(x), s, profile=prof)
                                 for (r, a, b, x), s, prof in zip(trees, shares, profiles)),
                chunk_bytes=chunk_bytes, throughput_Bps=total, ring_Bps=total,
                upper_bound_Bps=None, latency_s=latency_s, topology_name="explicit")
    plan.validate()
    return plan


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864. Binary units, as nccl-tests uses them."""
    s = str(text).strip().upper()
    num = s.rstrip("KMGIB")
    unit = s[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"cannot read size {text!r}; use a number with an optional K, M or G")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"cannot read size {text!r}; use a number with an optional K, M or G")
    if value < 0:
        raise ValueError(f"size {text!r} is negative")
    return int(value * _UNITS[unit])


def format_size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{int(nbytes)} B"
