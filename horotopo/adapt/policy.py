"""The pure half of adaptivity: detect a lasting slowdown, pick the suspect links, refresh the
model and re-plan. No MPI here; :mod:`horotopo.adapt.runtime` feeds these the figures.

- :class:`Detector`: an allreduce's *efficiency* is its algorithm's predicted time over the
  measured time (slowest rank), read from the self-tuner's record
  (:class:`~horotopo.algorithms.cost.CallRecord`). After each plan switch the detector learns
  a baseline per size and algorithm (median of the first ``warmup`` efficiencies); a call
  whose efficiency is below ``(1 - threshold)`` of the baseline is *slow*, and
  ``consecutive`` slow calls in a row trigger a re-plan. Comparing with a baseline, not with
  the model itself, lets a machine that never reaches the modelled rate (Python overhead, a
  busy CPU) run without re-planning all the time, while the model still
  makes calls of different sizes comparable.
- :func:`suspects`: the directed rank pairs whose in-band rate (bytes over busy send time, from
  the engine's own transfers) fell the most against their own baseline.
- :func:`host_pairs`: the suspects at host level, one rank pair per pair of hosts (a host's
  ranks share its NIC and its uplinks, so one pair measures what all of them cross).
- :func:`split_pairs`: for each pair the re-probe found degraded, two more pairs that share
  disjoint parts of its route (one from its sender, one to its receiver; chosen by the routes'
  resource sets, which a measured model does not list in path order), so that the next
  re-probe tells which end is slow; then pairs that split those parts once more.
- :func:`plan_arcs`: the pairs a plan sends over (the suspects when in-band figures point at
  no link in particular).
- :func:`refresh_capacities`: lower the capacities of the resources that the re-probed pairs
  blame, leaving alone any resource that a healthy pair crosses, and blaming the fewest
  resources that explain every degraded pair.
- :func:`topology_with_capacities`: the same topology document with new capacities (declared
  or measured form), loaded again, so the new plan is made by the normal planner.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..algorithms.cost import Sample, size_bucket
from ..params import ADAPT
from ..topology import GBPS_TO_BPS, Topology, from_dict

__all__ = ["Detector", "suspects", "host_pairs", "split_pairs", "plan_arcs",
           "refresh_capacities", "topology_with_capacities", "Pair"]

Pair = Tuple[int, int]


@dataclass
class Detector:
    """Threshold-and-persistence detector of a lasting slowdown (see module docstring).

    Noise on a shared machine (a descheduled rank, another job's burst) makes single calls, and
    sometimes a few in a row, slow; a link that lost capacity makes every call slow for as long
    as it lasts. So a re-plan needs all of:

    - ``consecutive`` slow calls in a row (a normal call breaks the run);
    - those calls lasting ``min_slow_s`` seconds together (a burst of noise is short);
    - each call compared with the baseline of its own size and algorithm (``key``: the
      power-of-two bucket and the algorithm's name, :meth:`observe`): a small call is less
      efficient than a large one without anything being wrong, and each algorithm reaches its
      own share of its prediction.

    A re-plan that found nothing to change (:meth:`backoff`) doubles the run needed next time,
    up to ``max_backoff`` times, so a noisy machine pays for fewer and fewer fruitless
    re-probes; a real switch (:meth:`reset`) restores it.

    The defaults are :data:`horotopo.params.ADAPT`'s, where each value is explained.

    Parameters
    ----------
    threshold : float
        Fraction in (0, 1): a call is slow when its efficiency is below ``1 - threshold``
        times the baseline.
    consecutive : int
        Slow calls in a row that trigger (>= 1).
    warmup : int
        Calls after each :meth:`reset` that form a size's baseline (>= 1).
    min_seconds : float
        Calls shorter than this say nothing (latency-bound; their efficiency is noise) and
        neither count nor break a run of slow calls.
    min_slow_s : float
        Seconds the slow run must add up to before it triggers (0: no minimum).
    max_backoff : int
        Largest factor :meth:`backoff` multiplies ``consecutive`` and ``min_slow_s`` by.
    """

    threshold: float = ADAPT.threshold
    consecutive: int = ADAPT.consecutive
    warmup: int = ADAPT.warmup
    min_seconds: float = ADAPT.min_seconds
    min_slow_s: float = ADAPT.min_slow_s
    max_backoff: int = ADAPT.max_backoff
    slow_run: int = 0
    slow_seconds: float = 0.0
    factor: int = 1
    baselines: Dict[Hashable, float] = field(default_factory=dict)
    _warm: Dict[Hashable, List[float]] = field(default_factory=dict)
    _last_key: Hashable = 0

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold!r}")
        if int(self.consecutive) != self.consecutive or self.consecutive < 1:
            raise ValueError(f"consecutive must be a positive integer, got {self.consecutive!r}")
        if int(self.warmup) != self.warmup or self.warmup < 1:
            raise ValueError(f"warmup must be a positive integer, got {self.warmup!r}")
        if not self.min_slow_s >= 0:
            raise ValueError(f"min_slow_s must be >= 0, got {self.min_slow_s!r}")
        if int(self.max_backoff) != self.max_backoff or self.max_backoff < 1:
            raise ValueError(f"max_backoff must be a positive integer, got {self.max_backoff!r}")

    @property
    def baseline(self) -> Optional[float]:
        """The baseline of the size seen last (None while it warms up)."""
        return self.baselines.get(self._last_key)

    @property
    def needed(self) -> int:
        """Slow calls in a row that trigger now (``consecutive`` times the back-off)."""
        return self.consecutive * self.factor

    def reset(self) -> None:
        """Forget the baselines and the back-off (after a plan switch)."""
        self.baselines = {}
        self._warm = {}
        self.slow_run = 0
        self.slow_seconds = 0.0
        self.factor = 1

    def backoff(self) -> None:
        """A detection led to nothing (the links were fine): learn the current speed as the
        new normal and ask for a longer slow run next time."""
        factor = min(self.factor * 2, int(self.max_backoff))
        self.reset()
        self.factor = factor

    def observe(self, sample: Optional[Sample], algorithm: str) -> bool:
        """Feed one sample of the record (:meth:`horotopo.algorithms.cost.CallRecord.observe`)
        of a call of ``algorithm``: :meth:`update` with its prediction, keyed by its size
        bucket and algorithm. A call without a prediction (the library's) says nothing."""
        if sample is None or sample.predicted_s is None:
            return False
        return self.update(sample.predicted_s, sample.observed_s,
                           (size_bucket(sample.nbytes), algorithm))

    def update(self, predicted_s: float, measured_s: float, key: Hashable = 0) -> bool:
        """Feed one call; True when this call completes a slow run long enough to trigger.

        Deterministic: ranks that feed the same numbers take the same decisions.
        """
        if not (measured_s > 0 and predicted_s > 0) or measured_s < self.min_seconds:
            return False
        self._last_key = key
        eff = predicted_s / measured_s
        base = self.baselines.get(key)
        if base is None:
            warm = self._warm.setdefault(key, [])
            warm.append(eff)
            if len(warm) >= self.warmup:
                self.baselines[key] = float(median(warm))
            return False
        if eff < (1.0 - self.threshold) * base:
            self.slow_run += 1
            self.slow_seconds += measured_s
        else:
            self.slow_run = 0
            self.slow_seconds = 0.0
        if (self.slow_run >= self.needed
                and self.slow_seconds >= self.min_slow_s * self.factor):
            self.slow_run = 0
            self.slow_seconds = 0.0
            return True
        return False


def _rates(bytes_: np.ndarray, busy: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(busy > 0, bytes_ / np.where(busy > 0, busy, 1.0), np.nan)
    return r


def suspects(base_bytes: Any, base_busy: Any, recent_bytes: Any, recent_busy: Any,
             threshold: float, limit: int) -> Tuple[List[Pair], List[Pair]]:
    """Directed pairs whose in-band rate fell below ``1 - threshold`` of their baseline.

    Parameters
    ----------
    base_bytes, base_busy, recent_bytes, recent_busy : n x n arrays
        Bytes sent ``i -> j`` and seconds with a send ``i -> j`` outstanding, over the baseline
        window and over the recent (slow) window.
    threshold : float
    limit : int
        At most this many suspects, the worst first.

    Returns
    -------
    (suspects, healthy)
        Pairs sorted by how far they fell (worst first), and the pairs seen at their baseline
        rate (their routes are exonerated).
    """
    base = _rates(np.asarray(base_bytes, float), np.asarray(base_busy, float))
    now = _rates(np.asarray(recent_bytes, float), np.asarray(recent_busy, float))
    # Vectorised: at 1024 ranks the n^2 pairs would take a second in a Python loop.
    seen = np.isfinite(base) & np.isfinite(now)
    np.fill_diagonal(seen, False)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(seen, now / np.where(seen, base, 1.0), np.nan)
    fell = seen & (ratio < 1.0 - threshold)
    si, sj = np.nonzero(fell)
    order = np.lexsort((sj, si, ratio[si, sj]))[:max(0, int(limit))]  # worst first, then pair
    hi, hj = np.nonzero(seen & ~fell)
    return ([(int(si[k]), int(sj[k])) for k in order],
            [(int(i), int(j)) for i, j in zip(hi, hj)])


def host_pairs(pairs: Sequence[Pair], machine_of: Sequence[int]) -> List[Pair]:
    """``pairs`` at host level: the first rank pair of each ordered pair of machines, in order.

    A pair between two machines crosses the senders' NIC, the path between the machines and
    the receiver's NIC, whichever of the machines' ranks it joins (and each rank's own link to
    its host's fabric, which is local); so re-probing one pair per machine pair measures the
    network at the cost of ``H (H - 1)`` pairs at most for ``H`` machines, not ``n (n - 1)``.
    Pairs inside one machine are kept as they are (each crosses its ranks' own local links).

    Parameters
    ----------
    pairs : sequence of (src, dst)
        Rank pairs, the most important first (the worst suspects).
    machine_of : sequence of int
        The machine of every rank (:func:`horotopo.packing.hierarchy.machines`).
    """
    seen: set = set()
    out: List[Pair] = []
    for a, b in pairs:
        ma, mb = machine_of[a], machine_of[b]
        key = (ma, mb) if ma != mb else (-1 - a, -1 - b)  # inside a machine: the pair itself
        if key not in seen:
            seen.add(key)
            out.append((int(a), int(b)))
    return out


def split_pairs(topology: Topology, machine_of: Sequence[int], degraded: Sequence[Pair],
                done: Sequence[Pair] = ()) -> List[Pair]:
    """Pairs that tell apart the two ends of each degraded pair's route, at host level.

    A degraded pair ``a -> b`` says that some resource of its route is slow, not which: the
    sender's NIC and its rack's uplink, or the receiver's rack's downlink and NIC. For each
    degraded pair, one pair from ``a`` and one pair to ``b`` (from and to the first rank of
    other machines) whose routes share resources of ``a -> b``'s route and *none with each
    other*: each tests its own part of the route, so a healthy one clears its part and a
    degraded one points at it (what :func:`refresh_capacities` then blames, with the other
    pairs). The two are chosen from the routes' resource *sets*, never their order: a measured
    model lists a route's resources as pair, egress, ingress, then shared groups in the order
    the probe found them, not in path order. Among the disjoint choices, the two that cover
    the most of the route, then the most even split. Pairs between machines that ``done``
    (already probed) or an earlier pick joins are left out: one pair per pair of machines.

    Parameters
    ----------
    topology : Topology
        The model the routes come from.
    machine_of : sequence of int
        The machine of every rank.
    degraded : sequence of (src, dst)
    done : sequence of (src, dst)

    Returns
    -------
    list of (src, dst)
        At most two pairs per degraded pair, in the order of ``degraded``, then at most two
        more per degraded pair that split those pairs' parts again.
    """
    first: Dict[int, int] = {}
    for rank, m in enumerate(machine_of):
        first.setdefault(m, rank)
    skip = {(machine_of[a], machine_of[b]) for a, b in done}
    out: List[Pair] = []
    finer: List[Pair] = []
    for a, b in degraded:
        route = set(topology.routes[a][b])
        ends = (machine_of[a], machine_of[b])
        others = [r for m, r in first.items() if m not in ends]
        # What of the route each candidate crosses; one candidate per distinct part (the
        # lowest machine), and "no pair" (the empty part) for a side with no useful choice.
        sides = []
        for cands in ([(a, r) for r in others], [(r, b) for r in others]):
            parts: Dict[frozenset, Optional[Pair]] = {frozenset(): None}
            for s, d in cands:
                if (machine_of[s], machine_of[d]) not in skip:
                    parts.setdefault(frozenset(route.intersection(topology.routes[s][d])),
                                     (s, d))
            sides.append(parts)
        best: Tuple[Tuple[int, int], List[frozenset]] = ((0, 0), [])
        for mine in sides[0]:
            for theirs in sides[1]:
                score = (len(mine | theirs), min(len(mine), len(theirs)))
                if not mine & theirs and score > best[0]:
                    best = (score, [mine, theirs])
        for side, part in zip(sides, best[1]):
            pick = side[part]
            if pick is not None:
                skip.add((machine_of[pick[0]], machine_of[pick[1]]))
                out.append((int(pick[0]), int(pick[1])))
            # Then the largest smaller part on the same side (the sender's NIC without its
            # rack's uplink): found healthy it clears the rest of the part, which a degraded
            # ``pick`` would otherwise blame with it (resources in series on every probed
            # route). Listed after every first choice, so a cap on the pairs cuts these first.
            inner = max((q for q in side if q and q < part), key=len, default=None)
            if inner is not None:
                finer.append(side[inner])
    for s, d in finer:
        if (machine_of[s], machine_of[d]) not in skip:
            skip.add((machine_of[s], machine_of[d]))
            out.append((int(s), int(d)))
    return out


def plan_arcs(plan: Any) -> List[Pair]:
    """The directed pairs that ``plan``'s trees send over, the most loaded (share) first."""
    load: Dict[Pair, float] = {}
    for t in plan.trees:
        for v, p in enumerate(t.reduce_parent):
            if p >= 0:
                load[(v, p)] = load.get((v, p), 0.0) + t.share
        for v, p in enumerate(t.bcast_parent):
            if p >= 0:
                load[(p, v)] = load.get((p, v), 0.0) + t.share
    return [pair for pair, _ in sorted(load.items(), key=lambda kv: (-kv[1], kv[0]))]


def refresh_capacities(topology: Topology, probed: Mapping[Pair, float],
                       healthy: Sequence[Pair] = (),
                       threshold: float = ADAPT.threshold) -> List[float]:
    """New resource capacities (bytes/s) from re-probed pair rates.

    A probed pair below ``1 - threshold`` of its modelled rate is *degraded*: a pair's rate is
    the minimum over its route, so some resource on the route now carries at most the probed
    rate. The candidates of a degraded pair are its route's resources that no healthy pair (in
    ``healthy``, or probed at its modelled rate) crosses; when every resource is exonerated,
    the tightest one. The blame goes to the fewest candidates that explain every degraded
    pair, greedily: the candidates shared by the most unexplained pairs first (all of them on
    a tie: resources in series on every probed route cannot be told apart). So a rack's
    downlink that four degraded pairs cross is blamed, not the four senders' NICs. A blamed
    resource gets the largest probed rate of the degraded pairs through it (every one of them
    crosses it, so it carries at least that much). Nothing is ever raised.
    """
    caps = list(topology.capacity_Bps)
    ok_pairs = list(healthy)
    degraded: Dict[Pair, float] = {}
    for (i, j), rate in probed.items():
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"probed rate of {i}->{j} must be positive, got {rate!r}")
        if rate < (1.0 - threshold) * topology.pair_capacity_Bps(i, j):
            degraded[(i, j)] = float(rate)
        else:
            ok_pairs.append((i, j))
    cleared = {r for i, j in ok_pairs for r in topology.routes[i][j]}
    open_: Dict[Pair, set] = {}
    for (i, j) in degraded:
        route = topology.routes[i][j]
        if not route:
            continue  # same host: memory is not a constraint of the model
        cand = {r for r in route if r not in cleared}
        if not cand:
            tight = min(caps[r] for r in route)
            cand = {r for r in route if caps[r] == tight}
        open_[(i, j)] = cand
    picked: set = set()
    while open_:
        count: Dict[int, int] = {}
        for cand in open_.values():
            for r in cand:
                count[r] = count.get(r, 0) + 1
        top = max(count.values())
        pick = {r for r, k in count.items() if k == top}
        picked |= pick
        open_ = {p: c for p, c in open_.items() if not c & pick}
    for r in picked:
        rate = max(v for (i, j), v in degraded.items() if r in topology.routes[i][j])
        caps[r] = min(caps[r], rate)
    return caps


def topology_with_capacities(topology: Topology, capacity_Bps: Sequence[float],
                             name: Optional[str] = None) -> Topology:
    """``topology``'s own document with its resource capacities replaced, loaded again.

    The resources are numbered as the loader makes them: for the declared form, two per link
    (``a->b`` then ``b->a``) in link order; for the measured form, the pairs ``i -> j`` in row
    order, then the egress caps, the ingress caps and the shared groups.
    """
    if len(capacity_Bps) != len(topology.capacity_Bps):
        raise ValueError(f"{len(capacity_Bps)} capacities for {len(topology.capacity_Bps)} "
                         f"resources")
    doc = copy.deepcopy(topology.to_json())
    g = [float(c) / GBPS_TO_BPS for c in capacity_Bps]
    if topology.kind == "declared":
        for k, link in enumerate(doc["links"]):
            ab, ba = g[2 * k], g[2 * k + 1]
            link["gbps"] = ab if ab == ba else [ab, ba]
    else:
        n = topology.n
        k = 0
        for i in range(n):
            for j in range(n):
                if i != j:
                    doc["bandwidth_gbps"][i][j] = g[k]
                    k += 1
        for key in ("egress_gbps", "ingress_gbps"):
            vals = doc.get(key)
            if vals is None:
                continue
            for v in range(n):
                if vals[v] is not None:
                    vals[v] = g[k]
                    k += 1
        for group in doc.get("shared", []) or []:
            group["gbps"] = g[k]
            k += 1
        doc.pop("probe", None)
    doc["name"] = name or topology.name
    out = from_dict(doc)
    if [round(c) for c in out.capacity_Bps] != [round(float(c)) for c in capacity_Bps]:
        raise ValueError("internal: the rewritten document does not reload to the same "
                         "capacities")  # a loader change the numbering above must follow
    return out
