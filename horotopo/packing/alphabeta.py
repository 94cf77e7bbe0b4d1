"""The alpha-beta model of a pipelined tree allreduce: what a plan's trees cost in time.

A tree carries its share ``P`` of the buffer in chunks of ``c`` bytes, ``K = ceil(P / c)`` of
them. Its reduce and broadcast stages overlap: the root sends chunk ``k`` down as soon as it is
reduced. So the first chunk crosses the critical reduce path and then the critical broadcast
path (the *fill*), and the rest follow at the tree's steady rate::

    T(P, c) = fill(c) + (P - c) / rate + c (1 / rate - 1 / b_slowest)
    fill(c) = sum over the hops h of the critical paths of (L_h + c / b_h + 2 alpha + beta c)

``L_h`` is the hop's route latency and ``b_h`` the rate a first chunk gets on it: the route's
bottleneck link rate where the tree is alone, and in a plan each link's rate shared among the
flows of the plan's trees that cross it at the same depth, but never below the tree's planned
rate (:class:`~horotopo.packing.profiles.Crowding`). A tree with a small share has a small
planned rate, but its chunks cross links it does not share at their speed; the 8 channels of
a host tree cross each NIC together, each at an eighth of it. On its slowest hop a chunk moves
at the tree's rate (the last term), since every tree shares that link from the start; so
``T >= P / rate``.

Hop figures are kept per tree as a *profile*: the multiset ``(latency, 1 / rate, count)`` of
the hops of its critical paths, so that a Plan can predict its time without the topology. A
:class:`NetworkModel` turns a declared network into the one a transport really gives (SimGrid
caps a flow at its TCP window over the round trip, and shares a link among the messages in
flight instead of sending them one after the other).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import config
from .. import costs as _costs
from ..params import PLANNER, PlannerParams
from ..topology import Topology
from .profiles import Crowding, Profile, TreeProfiler, declared_arc

__all__ = ["SoftwareCosts", "ENGINE_COSTS", "NO_COSTS", "NetworkModel", "IDEAL_NETWORK",
           "Profile", "window_for", "window_rate",
           "arc_figures", "on_network", "critical_profile", "fill_time", "tree_time", "cpu_time",
           "choose_chunk", "chunk_candidates", "plan_chunks", "rank_degrees", "busiest_cpu_time",
           "plan_time", "target_size"]


def target_size(size: Optional[int] = None) -> int:
    """The allreduce size a plan is made for: ``size``, else the fusion threshold
    (``HOROVOD_FUSION_THRESHOLD``: a training step's allreduces are fusion buffers of about
    that size), else, with fusion off, that setting's default."""
    if size is not None:
        if int(size) < 1:
            raise ValueError(f"size: a plan is made for a positive allreduce size, got {size}")
        return int(size)
    threshold = int(config.get("HOROVOD_FUSION_THRESHOLD"))
    return threshold if threshold > 0 else int(config.lookup("HOROVOD_FUSION_THRESHOLD").default)


def window_for(chunk_bytes: int, trees: int = 1, params: PlannerParams = PLANNER) -> int:
    """The automatic window (chunks of scratch per reduce child and tree) for ``chunk_bytes``
    in a plan of ``trees`` trees: about ``params.window_bytes`` per tree, between
    ``params.default_window`` and ``params.max_window`` chunks, and at most
    ``params.rank_window_bytes`` over all the trees, but never below ``params.min_window``
    (:class:`~horotopo.params.PlannerParams`). Defined with the model that predicts what the
    window allows; :mod:`horotopo.schedule` applies it."""
    if trees < 1:
        raise ValueError(f"trees must be at least 1, got {trees}")
    chunk = max(1, int(chunk_bytes))
    per_tree = max(params.default_window, min(params.max_window, params.window_bytes // chunk))
    return min(per_tree,
               max(params.min_window, params.rank_window_bytes // (int(trees) * chunk)))


@dataclass(frozen=True)
class SoftwareCosts:
    """The engine's software cost, per message posted and per received byte (seconds)."""

    per_message_s: float
    per_byte_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.per_message_s >= 0 and self.per_byte_s >= 0):
            raise ValueError(f"software costs must be >= 0, got {self.per_message_s!r} per "
                             f"message and {self.per_byte_s!r} per byte")


class _ActiveCosts(SoftwareCosts):
    """The charges of the active cost profile (:func:`horotopo.costs.charges`), read at each
    use: the default of every model here, so that a calibration or a simulation of GPU ranks
    reaches the planner, the selector and the simulator alike."""

    def __init__(self) -> None:
        pass

    per_message_s = property(lambda self: _costs.charges()[0])  # type: ignore[assignment]
    per_byte_s = property(lambda self: _costs.charges()[1])  # type: ignore[assignment]


#: The engine's software cost per message posted (each send and receive with its completion
#: handling) and per received byte (the copy or reduction that follows), as the active cost
#: profile has them (:mod:`horotopo.costs`; its built-in figures without a calibration).
ENGINE_COSTS: SoftwareCosts = _ActiveCosts()


def settled(costs: SoftwareCosts) -> SoftwareCosts:
    """``costs`` with their figures read now: :data:`ENGINE_COSTS` looks the active profile up
    at every read, and a plan's chunk choice or prediction reads them once per hop (hundreds
    of thousands of times at 1024 ranks)."""
    return SoftwareCosts(costs.per_message_s, costs.per_byte_s)


#: No software cost: the network alone.
NO_COSTS = SoftwareCosts(0.0, 0.0)


@dataclass(frozen=True)
class NetworkModel:
    """How a transport turns a declared link into what a message sees.

    ``latency_factor`` multiplies every route latency; ``bandwidth_factor`` every link rate;
    ``tcp_window_bytes`` (None: no cap) caps one message's rate at
    ``bandwidth_factor * tcp_window_bytes / (2 * latency)``, a TCP flow's window over its
    round trip. ``shared_messages``: messages in flight on one link share it fairly and finish
    together (SimGrid's flows) instead of one after the other (a TCP stream between two
    ranks), so a window of chunks crosses each hop as one block. ``streams``: how many of a
    stream's messages (one source, destination and tag) may be in flight at once:
    ``"free"`` (the engine's window decides), ``"serial"`` (the next leaves once the one
    before has arrived, latency included: one chunk per hop time) or ``"bdp"`` (further
    messages leave while those in flight hold less than the route's bandwidth-delay product).
    :data:`IDEAL_NETWORK` is the declared network itself; ``benchmarks/predict_check.py``
    measures the simulator's.
    """

    latency_factor: float = 1.0
    bandwidth_factor: float = 1.0
    tcp_window_bytes: Optional[float] = None
    shared_messages: bool = False
    streams: str = "free"

    def __post_init__(self) -> None:
        if not (self.latency_factor > 0 and self.bandwidth_factor > 0):
            raise ValueError(f"network factors must be positive, got latency "
                             f"{self.latency_factor!r}, bandwidth {self.bandwidth_factor!r}")
        if self.streams not in ("free", "serial", "bdp"):
            raise ValueError(f"streams must be free, serial or bdp, got {self.streams!r}")
        if self.tcp_window_bytes is not None and not self.tcp_window_bytes > 0:
            raise ValueError(f"tcp_window_bytes must be positive or None, got "
                             f"{self.tcp_window_bytes!r}")

    def hop(self, latency_s: float, s_per_byte: float) -> Tuple[float, float]:
        """``(latency, seconds per byte)`` a message sees on a route of declared
        ``latency_s`` whose bottleneck link moves a byte in ``s_per_byte``."""
        inv = s_per_byte / self.bandwidth_factor
        if self.tcp_window_bytes is not None and latency_s > 0:
            inv = max(inv, 2 * latency_s / (self.bandwidth_factor * self.tcp_window_bytes))
        return latency_s * self.latency_factor, inv


IDEAL_NETWORK = NetworkModel()


def arc_figures(topology: Topology, u: int, v: int,
                network: NetworkModel = IDEAL_NETWORK) -> Tuple[float, float]:
    """``(latency_s, seconds per byte)`` of one message ``u -> v``: the route's latency and
    its bottleneck link's inverse rate (0 for ranks that share memory), as ``network`` gives
    them."""
    return network.hop(*declared_arc(topology, u, v))


def on_network(profile: Profile, network: NetworkModel) -> Profile:
    """``profile``'s hops (declared figures) as ``network`` gives them."""
    if network == IDEAL_NETWORK:
        return profile
    return tuple((*network.hop(lat, inv), count) for lat, inv, count in profile)


def _hop_time(latency_s: float, s_per_byte: float, chunk: float, costs: SoftwareCosts,
              moved: Optional[float] = None) -> float:
    """One chunk across one hop: latency, transfer at the bottleneck link (of ``moved``
    bytes, default the chunk), a send and a receive posted, the received chunk handled."""
    move = chunk if moved is None else moved
    return latency_s + move * s_per_byte + chunk * costs.per_byte_s + 2 * costs.per_message_s


def critical_profile(topology: Topology, parent: Sequence[int], inward: bool,
                     chunk_bytes: float, network: NetworkModel = IDEAL_NETWORK,
                     costs: SoftwareCosts = ENGINE_COSTS) -> Profile:
    """The hops of the slowest root path of one tree for a chunk of ``chunk_bytes``.

    ``parent`` is a reduce tree (``inward``: ``v`` sends to ``parent[v]``) or a broadcast tree
    (``parent[v]`` sends to ``v``). The slowest path is the one whose first chunk takes
    longest to reach the root (reduce) or the leaf (broadcast); its hops are returned grouped.
    """
    n = len(parent)
    hop: List[Optional[Tuple[float, float]]] = [None] * n
    for v, p in enumerate(parent):
        if p >= 0:
            hop[v] = arc_figures(topology, v, p, network) if inward else \
                arc_figures(topology, p, v, network)
    # time from v to the root along the path, memoised
    total: List[Optional[float]] = [None] * n
    for v in range(n):
        path = []
        u = v
        while u >= 0 and total[u] is None:
            path.append(u)
            u = parent[u]
        t = 0.0 if u < 0 else total[u]
        for w in reversed(path):
            h = hop[w]
            t = t + (_hop_time(h[0], h[1], chunk_bytes, costs) if h is not None else 0.0)
            total[w] = t
    worst = max(range(n), key=lambda v: (total[v], -v))
    groups: Dict[Tuple[float, float], int] = {}
    u = worst
    while parent[u] >= 0:
        h = hop[u]
        groups[h] = groups.get(h, 0) + 1
        u = parent[u]
    return tuple((lat, inv, count) for (lat, inv), count in sorted(groups.items()))


def fill_time(profile: Profile, chunk: float, costs: SoftwareCosts,
              moved: Optional[float] = None) -> float:
    """Seconds for one chunk of ``chunk`` bytes to cross every hop of ``profile`` (each hop
    moving ``moved`` bytes before the chunk is through, default the chunk)."""
    return sum(count * _hop_time(lat, inv, chunk, costs, moved) for lat, inv, count in profile)


def window_rate(profile: Profile, chunk: float, window: int, costs: SoftwareCosts,
                streams: str = "free", declared: Optional[Profile] = None,
                network: Optional[NetworkModel] = None,
                in_flight: Optional[float] = None) -> float:
    """The rate that ``window`` chunks in flight per arc sustain over the profile's slowest
    hop (fewer where the transport's ``streams`` hold back a stream's messages; ``"bdp"``
    counts the bandwidth-delay product on the ``declared`` hops, default the profile's).

    On a ``network`` whose messages in flight share a link (``shared_messages``), the chunks
    in flight over a hop cross it as one block: they arrive together, after the hop's
    latency and their bytes at the link's rate (each message held to its own TCP window,
    not the block), and the receiver posts the next block only then. ``in_flight``: the
    chunks the tree keeps in flight between a leaf's send up and the result's return, which
    bound it to that many per round trip of its critical paths (every hop of the profile,
    each taking its block's time)."""
    best = math.inf
    trip = 0.0
    factor = network.bandwidth_factor if network is not None else 1.0
    shared = network is not None and network.shared_messages
    for (lat, inv, count), (lat0, inv0, _) in zip(profile, declared or profile):
        w = float(window)
        if streams == "serial":
            w = 1.0
        elif streams == "bdp" and inv0 > 0:
            w = min(w, 1.0 + math.floor(lat0 / inv0 / chunk))
        if shared and w > 1:
            moved = max(w * chunk * inv0 / factor, chunk * inv) / chunk
            hop = _hop_time(lat, moved, chunk, costs)
        else:
            hop = _hop_time(lat, inv, chunk, costs)
        if hop <= 0:
            continue
        trip += count * hop
        best = min(best, w * chunk / hop)
    if in_flight is not None and trip > 0:
        best = min(best, in_flight * chunk / trip)
    return best


def tree_time(part: float, chunk: float, rate_Bps: float, profile: Profile,
              costs: SoftwareCosts = ENGINE_COSTS, window: Optional[int] = None,
              network: NetworkModel = IDEAL_NETWORK,
              params: PlannerParams = PLANNER) -> float:
    """Seconds for one tree to allreduce its ``part`` bytes (see the module docstring).

    Parameters
    ----------
    part : float
        The tree's share of the buffer, in bytes.
    chunk : float
        Chunk size in bytes (a part smaller than a chunk goes as one chunk).
    rate_Bps : float
        The tree's planned rate ``x``.
    profile : Profile
        Hops of its critical reduce path followed by its critical broadcast path.
    costs : SoftwareCosts
        The engine's software costs.
    window : int, optional
        Chunks in flight per arc; None is :func:`window_for` the chunk under ``params``.
    network : NetworkModel
        What the transport makes of the profile's hops (:func:`on_network`); where it shares
        a link among the messages in flight, the pipeline's unit is a window of chunks.
    """
    if part <= 0:
        return 0.0
    c = min(float(chunk), float(part))
    win = window if window is not None else window_for(int(c), params=params)
    hops = on_network(profile, network)
    rate = min(rate_Bps * network.bandwidth_factor,
               window_rate(hops, c, win, costs, network.streams, profile, network))
    # Where a link is shared among the messages in flight, a window of chunks crosses each
    # hop at once and they finish together: the window is the pipeline's unit.
    # (Streams held to one message, or to a bandwidth-delay product, keep that block small.)
    unit = (min(float(part), win * c) if network.shared_messages and network.streams == "free"
            else c)
    # The unit crosses its slowest hop at the tree's rate, not alone at the link's: the
    # tree shares that link with the other trees from the start.
    slowest = max((inv for _, inv, _ in hops), default=0.0)
    return (fill_time(hops, c, costs, unit) + (part - unit) / rate
            + unit * max(0.0, 1.0 / rate - slowest))


def cpu_time(per_chunk_messages: float, per_chunk_received: float, chunks: float, chunk: float,
             costs: SoftwareCosts) -> float:
    """One rank's software time for one tree: ``chunks`` chunks, each costing its messages
    posted and its received chunks handled."""
    return chunks * (per_chunk_messages * costs.per_message_s
                     + per_chunk_received * chunk * costs.per_byte_s)


def chunk_candidates(part: float, lo: int, hi: int) -> List[int]:
    """Powers of two from ``lo`` to ``hi`` below ``part``, and the part itself when it fits
    in ``hi`` (one chunk)."""
    out = []
    c = lo
    while c <= hi and c < part:
        out.append(c)
        c *= 2
    if part <= hi:
        out.append(max(1, int(math.ceil(part))))
    return out or [lo]


def choose_chunk(part: float, rate_Bps: float, profile: Profile, busiest: Tuple[float, float],
                 lo: int, hi: int, costs: SoftwareCosts = ENGINE_COSTS,
                 window: Optional[int] = None, params: PlannerParams = PLANNER) -> int:
    """The chunk size that minimises one tree's predicted time for a ``part`` of bytes.

    Small chunks fill the pipeline fast but pay the software cost per message on the tree's
    busiest rank (``busiest`` = its messages posted and chunks received per chunk); big ones
    take long to cross the critical path. With fill ``d (L + c / b)`` and per-chunk cost
    ``alpha`` the continuous optimum is ``c* = sqrt(P alpha b / d)``; this takes the best of
    :func:`chunk_candidates` on the full model (window and CPU bound included), the smaller
    on ties. Every candidate is at least ``lo`` (or the whole part), at most ``hi``.
    ``window`` is the engine's chunks in flight per arc (None: :func:`window_for` each
    candidate under ``params``).
    """
    best_c, best_t = lo, math.inf
    for c in chunk_candidates(part, lo, hi):
        # the chunk count taken as part / c, not rounded up: the rounding's steps would make
        # the choice jump back and forth as the size grows
        t = max(tree_time(part, c, rate_Bps, profile, costs, window, params=params),
                cpu_time(busiest[0], busiest[1], part / c, c, costs))
        if t < best_t * (1 - 1e-9):
            best_c, best_t = c, t
    return int(best_c)


def rank_degrees(trees: Sequence[Tuple[int, Sequence[int], Sequence[int]]]
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """Per tree ``(root, reduce_parent, bcast_parent)`` (rows) and rank (columns): the
    messages a rank posts and the chunks it receives per chunk of the tree (a receive per
    reduce child, a send per broadcast child, and off the root a send up and a receive down).
    """
    n = len(trees[0][1]) if trees else 0
    msgs = np.zeros((len(trees), n))
    recvs = np.zeros((len(trees), n))
    for k, (root, a, b) in enumerate(trees):
        a, b = np.asarray(a), np.asarray(b)
        up = np.bincount(a[a >= 0], minlength=n)
        down = np.bincount(b[b >= 0], minlength=n)
        off = np.ones(n)
        off[root] = 0
        msgs[k] = up + down + 2 * off
        recvs[k] = up + off
    return msgs, recvs


def busiest_cpu_time(degrees: Tuple[np.ndarray, np.ndarray], parts: Sequence[float],
                     chunks: Sequence[float], costs: SoftwareCosts) -> float:
    """The busiest rank's software time over all trees (its CPU is shared by every tree):
    ``degrees`` from :func:`rank_degrees`, each tree's ``parts`` bytes in ``chunks``."""
    if costs.per_message_s == 0 and costs.per_byte_s == 0:
        return 0.0
    msgs, recvs = degrees
    count = np.array([math.ceil(p / c) if p > 0 else 0 for p, c in zip(parts, chunks)],
                     dtype=float)
    size = np.minimum(np.asarray(chunks, dtype=float), np.asarray(parts, dtype=float))
    per_rank = (count * costs.per_message_s) @ msgs + (count * size * costs.per_byte_s) @ recvs
    return float(per_rank.max())


def plan_time(parts: Sequence[float], chunks: Sequence[float], rates: Sequence[float],
              profiles: Sequence[Profile], degrees: Tuple[np.ndarray, np.ndarray],
              costs: SoftwareCosts = ENGINE_COSTS, network: NetworkModel = IDEAL_NETWORK,
              window: Optional[int] = None, params: PlannerParams = PLANNER) -> float:
    """Modelled seconds of one allreduce over several trees (a plan's prediction).

    Parameters
    ----------
    parts, chunks, rates, profiles : sequences, one entry per tree
        Each tree's share in bytes, chunk size, planned rate and critical-path profile.
    degrees : (ndarray, ndarray)
        :func:`rank_degrees` of the trees.
    costs : SoftwareCosts
        The engine's software costs.
    network : NetworkModel
        What the transport makes of the profiles' hops.
    window : int, optional
        Chunks in flight per arc; None: :func:`window_for` the largest chunk and the number
        of trees with a part under ``params``, as the engine's table takes it.

    Returns
    -------
    float
        The slowest tree's :func:`tree_time`, or the busiest rank's software time over all
        trees (:func:`busiest_cpu_time`) plus the shortest tree's fill, whichever is longer.
        The fill is added because that rank cannot start before a first chunk has reached it,
        nor finish before its last chunk has gone on to the root and back down: it is busy
        for its software time within, not over, the whole allreduce; without it a CPU-bound
        plan (one deep tree in large chunks) is predicted short of what the simulation runs.
    """
    live = [(p, c, x, prof) for p, c, x, prof in zip(parts, chunks, rates, profiles) if p > 0]
    costs = settled(costs)
    if not live:
        return 0.0
    win = window if window is not None else window_for(int(max(c for _, c, _, _ in live)),
                                                       len(live), params)
    # the channels of a host tree repeat their part, chunk, rate and profile: each once
    worst = max(tree_time(p, c, x, prof, costs, win, network)
                for p, c, x, prof in dict.fromkeys(live))
    cpu = busiest_cpu_time(degrees, parts, chunks, costs)
    if cpu <= 0:
        return worst
    first = min(fill_time(on_network(prof, network), min(c, p), costs)
                for p, c, _, prof in live)
    return max(worst, cpu + first)


def plan_chunks(topology: Topology, trees: Sequence[Tuple[int, Sequence[int], Sequence[int],
                                                          float]],
                shares: Sequence[float], size: int, costs: SoftwareCosts = ENGINE_COSTS,
                crowding: Optional[Crowding] = None,
                params: PlannerParams = PLANNER) -> Tuple[List[Profile], List[int]]:
    """Each tree's critical-path profile and chunk size for an allreduce of ``size`` bytes.

    ``trees`` holds ``(root, reduce_parent, bcast_parent, rate_Bps)``. Chunks are first chosen
    tree by tree (:func:`choose_chunk`) and the profiles taken at those chunks; the engine then
    runs every tree with the window of the largest chunk (one window per call), so each chunk
    is chosen again under that window, at most the largest. Last, every chunk is scaled alike
    by the factor of ``params.chunk_scales`` that minimises the whole plan's :func:`plan_time`:
    the tree-by-tree choice sees only its own tree's messages, while a rank's CPU serves every
    tree (a plan of many trees whose chunks each tree chose small keeps its busiest rank's CPU
    longer than larger chunks would).

    ``crowding`` (:func:`~horotopo.packing.profiles.fill_crowding` of every tree of the plan)
    charges each hop at its links' and its receiving rank's rates shared among the chunks that
    reach them at the same step, at least at the tree's rate; None charges the bottleneck
    link's rate.

    Every chunk lies between ``params.min_chunk`` and ``params.max_chunk``, and the windows
    are :func:`window_for` under ``params`` (:class:`~horotopo.params.PlannerParams`).
    """
    lo, hi = params.min_chunk, params.max_chunk
    costs = settled(costs)
    msgs, recvs = rank_degrees([(r, a, b) for r, a, b, _ in trees])
    busy = [(float(m.max()), float(q.max())) for m, q in zip(msgs, recvs)]
    # profiles of the whole batch at once
    pairs = [(a, b) for _, a, b, _ in trees]
    rates = [t[3] for t in trees] if crowding is not None else None

    profiles_at = TreeProfiler(topology, pairs, costs, rates, crowding).at

    def chosen(profiles: List[Profile], top: int, window: Optional[int]) -> List[int]:
        # the channels of a host tree ask the same question: each asked once
        asked = [(s * size, x, prof, bz) for (_, _, _, x), s, prof, bz
                 in zip(trees, shares, profiles, busy)]
        answer = {q: choose_chunk(*q, lo, top, costs, window, params)
                  for q in dict.fromkeys(asked)}
        return [answer[q] for q in asked]

    profiles = profiles_at([lo] * len(pairs))
    first = chosen(profiles, hi, None)
    profiles = profiles_at(first)
    top = max(first)
    window = window_for(top, len(pairs), params)
    chunks = chosen(profiles, top, window)
    parts = [s * size for s in shares]
    rates = [t[3] for t in trees]

    def scaled(f: float) -> List[int]:
        # a tree's chunk stays within [lo, hi], and at most its part (one chunk)
        return [c if f == 1.0 else int(min(max(lo, c * f), hi, max(c, math.ceil(p))))
                for c, p in zip(chunks, parts)]

    best = min(params.chunk_scales,
               key=lambda f: (plan_time(parts, scaled(f), rates, profiles, (msgs, recvs), costs,
                                        params=params), abs(math.log(f))))
    if best != 1.0:
        chunks = scaled(best)
        profiles = profiles_at(chunks)
    return profiles, chunks
