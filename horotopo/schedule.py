"""The step table: a Plan compiled, for one rank and one buffer shape, into the messages it moves.

The Plan says which trees exist; the engine must know, at rank ``v``, for every tree and every
chunk of that tree's segment, which peer to receive from or send to, in which direction, at
which offsets of the buffer, and whether a received chunk is reduced into the buffer or lands
in it as the final value. This module computes exactly that, once per
``(plan, rank, count, dtype, chunk size, window)`` (and broadcast root), and the algorithms in
:mod:`horotopo.algorithms.tree` walk the result. All tree logic lives here: child lists in the
fixed reduction order, depths, the broadcast trees re-rooted for a broadcast root, the choice
of one tree for buffers of a single chunk, the scratch layout and the tag streams.

Directions, per tree and chunk, in the order a rank posts them:

- ``recv_child``: receive a reduce child's partial sum into scratch and *reduce* it into the
  buffer (children in increasing rank order, the order the reduction combines them);
- ``send_parent``: send this rank's partial sum up the reduce tree (every non-root, once);
- ``recv_parent``: receive the final chunk from the broadcast parent straight into the buffer
  (a *copy*: the received bits replace this rank's);
- ``send_child``: forward the final chunk to each broadcast child.

A :class:`Schedule` stores the table factored (each tree's peers once, its chunk offsets once);
:meth:`Schedule.rows` expands it into one :class:`Step` per tree, chunk and message.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .buffers import chunk_bounds, segment_bounds
from .params import ENGINE
from .packing.alphabeta import window_for
from .plan import Plan, children, depth

__all__ = ["Step", "TreeTable", "Schedule", "ScheduleCache", "compile_allreduce",
           "compile_broadcast", "rerooted", "window_for",
           "RECV_CHILD", "SEND_PARENT", "RECV_PARENT", "SEND_CHILD", "SCHEDULE_VERSION"]

SCHEDULE_VERSION = 1

RECV_CHILD = "recv_child"
SEND_PARENT = "send_parent"
RECV_PARENT = "recv_parent"
SEND_CHILD = "send_child"

# The automatic window (chunks of scratch per reduce child and tree, PlannerParams' window
# fields) is defined with the model that predicts what it allows, horotopo.packing.alphabeta,
# and re-exported here where the tables apply it under the parameters the plan was made with.


def in_flight_for(window: int, hops: int, extra: int = ENGINE.in_flight_extra) -> int:
    """Chunks of one tree that may be in flight at once: the scratch window plus a chunk per
    hop each way (what keeps every link of a tree of ``hops`` total depth busy) plus
    ``extra`` (:attr:`horotopo.params.EngineParams.in_flight_extra`)."""
    return window + 2 * hops + extra


@dataclass(frozen=True)
class Step:
    """One message of the table: tree, chunk, direction, peer and buffer offsets.

    ``reduce`` is True for a ``recv_child`` (the chunk is reduced into the buffer), False for a
    ``recv_parent`` (copied: it replaces the buffer's bits) and for sends. ``order`` is the
    child's position in the reduction order for ``recv_child`` and 0 otherwise; ``stream`` is
    the tag offset of the message's (peer, tag) stream.
    """

    tree: int
    chunk: int
    direction: str
    peer: int
    start: int
    length: int
    reduce: bool
    order: int
    stream: int


@dataclass(frozen=True)
class TreeTable:
    """One tree's part of a rank's table (the tree's segment is not empty).

    Attributes
    ----------
    tree : int
        Index of the tree in the plan.
    root : int
        Where the data flows through: the tree's root for an allreduce, the broadcast root for
        a broadcast.
    recv_children : tuple of int
        Reduce children, in the order their parts are reduced (empty for a broadcast).
    send_parent : int
        Reduce parent, -1 at the root and for a broadcast.
    recv_parent : int
        Broadcast parent, -1 at the root.
    send_children : tuple of int
        Broadcast children, in sending order.
    chunks : tuple of (int, int)
        ``(start, stop)`` element offsets of each chunk in the flat buffer, in chunk order.
    hops : int
        Reduce depth plus broadcast depth of the tree (broadcast depth alone for a broadcast).
    in_flight : int
        Chunks of this tree that may be in flight at once at this rank.
    stream_up, stream_down : int
        Tag offsets of the reduce messages and of the broadcast messages.
    scratch_offset, scratch_rows, scratch_width : int
        This tree's receive scratch in the schedule's scratch block: ``scratch_rows`` rows of
        ``scratch_width`` elements (``window`` rows per reduce child) from ``scratch_offset``.
    """

    tree: int
    root: int
    recv_children: Tuple[int, ...]
    send_parent: int
    recv_parent: int
    send_children: Tuple[int, ...]
    chunks: Tuple[Tuple[int, int], ...]
    hops: int
    in_flight: int
    stream_up: int
    stream_down: int
    scratch_offset: int
    scratch_rows: int
    scratch_width: int

    @property
    def is_root(self) -> bool:
        return self.recv_parent < 0

    def steps(self, k: int) -> Iterator[Step]:
        """The messages of chunk ``k`` in posting order."""
        a, b = self.chunks[k]
        for i, c in enumerate(self.recv_children):
            yield Step(self.tree, k, RECV_CHILD, c, a, b - a, True, i, self.stream_up)
        if self.send_parent >= 0:
            yield Step(self.tree, k, SEND_PARENT, self.send_parent, a, b - a, False, 0,
                       self.stream_up)
        if self.recv_parent >= 0:
            yield Step(self.tree, k, RECV_PARENT, self.recv_parent, a, b - a, False, 0,
                       self.stream_down)
        for c in self.send_children:
            yield Step(self.tree, k, SEND_CHILD, c, a, b - a, False, 0, self.stream_down)

    def to_json(self) -> Dict[str, Any]:
        return {"tree": self.tree, "root": self.root,
                "recv_children": list(self.recv_children), "send_parent": self.send_parent,
                "recv_parent": self.recv_parent, "send_children": list(self.send_children),
                "chunks": [[a, b - a] for a, b in self.chunks], "hops": self.hops,
                "in_flight": self.in_flight, "stream_up": self.stream_up,
                "stream_down": self.stream_down, "scratch_offset": self.scratch_offset,
                "scratch_rows": self.scratch_rows, "scratch_width": self.scratch_width}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "TreeTable":
        return cls(tree=int(doc["tree"]), root=int(doc["root"]),
                   recv_children=tuple(int(c) for c in doc["recv_children"]),
                   send_parent=int(doc["send_parent"]), recv_parent=int(doc["recv_parent"]),
                   send_children=tuple(int(c) for c in doc["send_children"]),
                   chunks=tuple((int(a), int(a) + int(n)) for a, n in doc["chunks"]),
                   hops=int(doc["hops"]), in_flight=int(doc["in_flight"]),
                   stream_up=int(doc["stream_up"]), stream_down=int(doc["stream_down"]),
                   scratch_offset=int(doc["scratch_offset"]),
                   scratch_rows=int(doc["scratch_rows"]),
                   scratch_width=int(doc["scratch_width"]))


@dataclass(frozen=True)
class Schedule:
    """A rank's step table for one collective on one buffer shape (see the module docstring).

    ``kind`` is ``"allreduce"`` or ``"broadcast"``; ``root`` is the broadcast root (-1 for an
    allreduce). ``tags`` is how many consecutive tags a run allocates (stream offsets index
    them); ``scratch_elems`` is the receive scratch the run needs, in elements of ``dtype``.
    Only trees whose segment is not empty have a :class:`TreeTable`.
    """

    kind: str
    plan_digest: str
    n: int
    rank: int
    count: int
    dtype: str
    chunk_elems: int
    window: int
    root: int
    tags: int
    scratch_elems: int
    trees: Tuple[TreeTable, ...]

    def rows(self) -> Iterator[Step]:
        """Every message of the table, tree by tree, chunk by chunk, in posting order."""
        for t in self.trees:
            for k in range(len(t.chunks)):
                yield from t.steps(k)

    def to_json(self) -> Dict[str, Any]:
        return {"version": SCHEDULE_VERSION, "kind": self.kind, "plan_digest": self.plan_digest,
                "n": self.n, "rank": self.rank, "count": self.count, "dtype": self.dtype,
                "chunk_elems": self.chunk_elems, "window": self.window, "root": self.root,
                "tags": self.tags, "scratch_elems": self.scratch_elems,
                "trees": [t.to_json() for t in self.trees]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Schedule":
        if doc.get("version", SCHEDULE_VERSION) != SCHEDULE_VERSION:
            raise ValueError(f"version: this horotopo reads schedule version "
                             f"{SCHEDULE_VERSION}, got {doc.get('version')!r}")
        return cls(kind=str(doc["kind"]), plan_digest=str(doc["plan_digest"]), n=int(doc["n"]),
                   rank=int(doc["rank"]), count=int(doc["count"]), dtype=str(doc["dtype"]),
                   chunk_elems=int(doc["chunk_elems"]), window=int(doc["window"]),
                   root=int(doc["root"]), tags=int(doc["tags"]),
                   scratch_elems=int(doc["scratch_elems"]),
                   trees=tuple(TreeTable.from_json(t) for t in doc["trees"]))

    def describe(self, max_chunks: int = 3) -> str:
        """The table in words: per tree the peers by direction and the first chunks' offsets."""
        what = self.kind if self.root < 0 else f"{self.kind} from rank {self.root}"
        lines = [f"step table of rank {self.rank}/{self.n}: {what} of {self.count} x "
                 f"{self.dtype}, chunks of {self.chunk_elems} elements, window {self.window}, "
                 f"{len(self.trees)} trees, {self.tags} tags, scratch {self.scratch_elems} "
                 f"elements, plan {self.plan_digest}"]
        for t in self.trees:
            lo, hi = t.chunks[0][0], t.chunks[-1][1]
            lines.append(f"  tree {t.tree:<3} root {t.root:<3} segment [{lo}, {hi}) in "
                         f"{len(t.chunks)} chunks, up to {t.in_flight} in flight")
            for k in range(min(len(t.chunks), max_chunks)):
                for s in t.steps(k):
                    how = " reduce" if s.reduce else (" copy" if s.direction == RECV_PARENT
                                                      else "")
                    lines.append(f"      chunk {k:<4} {s.direction:<11} peer {s.peer:<4} "
                                 f"[{s.start}, +{s.length}){how}")
            if len(t.chunks) > max_chunks:
                lines.append(f"      ... {len(t.chunks) - max_chunks} more chunks, same peers")
        return "\n".join(lines)


def rerooted(parent: Sequence[int], tree_root: int, root: int) -> Tuple[int, ...]:
    """Broadcast parent array ``parent`` (rooted at ``tree_root``) re-rooted at ``root``.

    ``root`` sends the segment to ``tree_root`` (one extra hop), ``tree_root`` sends it down the
    tree as usual, and nobody sends it back to ``root``: ``root``'s own children in the tree get
    it from ``root`` directly. The result is an out-arborescence from ``root``: every rank's
    path in ``parent`` reaches ``tree_root``, and now either stops at ``root`` on the way or
    continues from ``tree_root`` to ``root``.
    """
    out = list(parent)
    out[root] = -1
    if tree_root != root:
        out[tree_root] = root
    return tuple(out)


def _peers(k: int, root: int, recv_children: Tuple[int, ...], send_parent: int,
           recv_parent: int, send_children: Tuple[int, ...], hops: int) -> TreeTable:
    """Tree ``k``'s table at one rank before the buffer shape is known: its peers and depth,
    no chunks; :func:`_assemble` fills in the rest per shape."""
    return TreeTable(tree=k, root=root, recv_children=recv_children, send_parent=send_parent,
                     recv_parent=recv_parent, send_children=send_children, chunks=(),
                     hops=hops, in_flight=0, stream_up=0, stream_down=0, scratch_offset=0,
                     scratch_rows=0, scratch_width=0)


def _allreduce_peers(plan: Plan, rank: int) -> Tuple[TreeTable, ...]:
    """Every tree's neighbours of ``rank`` in an allreduce: its reduce and broadcast trees."""
    return tuple(_peers(k, t.root, up[rank], t.reduce_parent[rank], t.bcast_parent[rank],
                        down[rank], hops)
                 for k, (t, (up, down, hops)) in enumerate(zip(plan.trees, plan.tree_shapes)))


def _broadcast_peers(plan: Plan, rank: int, root: int) -> Tuple[TreeTable, ...]:
    """Every tree's neighbours of ``rank`` in a broadcast from ``root`` (:func:`rerooted`)."""
    if not 0 <= root < plan.n:
        raise ValueError(f"broadcast root {root} is out of range 0..{plan.n - 1}")
    out = []
    for k, t in enumerate(plan.trees):
        parent = rerooted(t.bcast_parent, t.root, root)
        out.append(_peers(k, root, (), -1, parent[rank], children(parent)[rank], depth(parent)))
    return tuple(out)


def compile_allreduce(plan: Plan, rank: int, count: int, dtype: Any, chunk_elems: int,
                      window: Optional[int] = None,
                      in_flight_extra: int = ENGINE.in_flight_extra) -> Schedule:
    """Rank ``rank``'s step table for an allreduce of ``count`` elements of ``dtype``.

    Parameters
    ----------
    plan : Plan
        The trees and shares; tree ``t`` carries the segment ``segment_bounds(count, shares)[t]``.
    rank : int
        The rank the table is for.
    count : int
        Elements in the flat buffer.
    dtype : numpy dtype or str
        Element type (it sizes the automatic window).
    chunk_elems : int
        Elements per chunk message.
    window : int, optional
        Chunks of scratch per tree and reduce child; None picks :func:`window_for`.
    in_flight_extra : int
        Chunks in flight per tree beyond the window and the hops (:func:`in_flight_for`; the
        engine's :attr:`~horotopo.params.EngineParams.in_flight_extra`).

    Returns
    -------
    Schedule
        The table, with scratch laid out as ``window`` rows of one chunk per reduce child.
    """
    _check_rank(plan, rank)
    return _assemble("allreduce", plan, plan.digest, rank, _allreduce_peers(plan, rank), count,
                     dtype, chunk_elems, window, -1, in_flight_extra)


def compile_broadcast(plan: Plan, rank: int, count: int, dtype: Any, chunk_elems: int,
                      root: int, window: Optional[int] = None,
                      in_flight_extra: int = ENGINE.in_flight_extra) -> Schedule:
    """Rank ``rank``'s step table for a broadcast of ``count`` elements from ``root``.

    Tree ``t`` carries ``share_t`` of the buffer down its broadcast tree re-rooted at ``root``
    (:func:`rerooted`). A buffer of at most one chunk goes down a single tree (the one with the
    largest share, the lowest index on ties), since splitting it only adds messages. Parameters
    are those of :func:`compile_allreduce`, plus the broadcast ``root``.
    """
    _check_rank(plan, rank)
    return _assemble("broadcast", plan, plan.digest, rank, _broadcast_peers(plan, rank, root),
                     count, dtype, chunk_elems, window, root, in_flight_extra)


def _check_rank(plan: Plan, rank: int) -> None:
    if not 0 <= rank < plan.n:
        raise ValueError(f"rank {rank} is out of range 0..{plan.n - 1}")


def _assemble(kind: str, plan: Plan, digest: str, rank: int, peers: Sequence[TreeTable],
              count: int, dtype: Any, chunk_elems: int, window: Optional[int],
              root: int, in_flight_extra: int) -> Schedule:
    """The table of ``kind`` from each tree's ``peers`` (:func:`_peers`): segments, chunks,
    scratch and streams for this shape."""
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 chunk, got {window}")
    dt = np.dtype(dtype)
    shares = [t.share for t in plan.trees]
    allreduce = kind == "allreduce"
    if not allreduce and count <= chunk_elems:
        best = max(range(len(shares)), key=lambda k: (shares[k], -k))
        shares = [1.0 if k == best else 0.0 for k in range(len(shares))]
    segments = segment_bounds(count, shares)
    # the automatic window over the trees that carry a segment (the model's count too)
    win = window or window_for(chunk_elems * dt.itemsize,
                               max(1, sum(1 for lo, hi in segments if hi > lo)),
                               plan.planner_params)
    tables: List[TreeTable] = []
    at = 0
    # each tree's chunk in the plan's proportions (a tree's own size from the alpha-beta
    # model, relative to the plan's chunk_bytes, which chunk_elems elements stand for)
    elems = plan.tree_chunks(chunk_elems)
    for p, (lo, hi) in zip(peers, segments):
        if hi <= lo:
            continue
        per = elems[p.tree]
        rows, width = len(p.recv_children) * win, min(per, hi - lo)
        # an allreduce has a reduce and a broadcast stream per tree; a broadcast one stream
        up, down = (2 * p.tree, 2 * p.tree + 1) if allreduce else (p.tree, p.tree)
        tables.append(replace(
            p, chunks=tuple(chunk_bounds(lo, hi, per)),
            in_flight=in_flight_for(win, p.hops, in_flight_extra),
            stream_up=up, stream_down=down,
            scratch_offset=at if rows else 0, scratch_rows=rows, scratch_width=width if rows else 0))
        at += rows * width
    return Schedule(kind=kind, plan_digest=digest, n=plan.n, rank=rank, count=count,
                    dtype=str(dt), chunk_elems=chunk_elems, window=win, root=root,
                    tags=(2 if allreduce else 1) * len(plan.trees), scratch_elems=at,
                    trees=tuple(tables))


class ScheduleCache:
    """Compiled tables of one plan at one rank, least recently used first out.

    A training loop allreduces the same few buffer shapes over and over; each shape is
    compiled once. The key is ``(kind, count, dtype, chunk_elems, window, root)``; the plan and
    rank are fixed per cache, so a lookup hashes a short tuple, never the plan.

    Parameters
    ----------
    plan : Plan
        The plan every table is compiled from.
    rank : int
        The rank the tables are for.
    window : int, optional
        Fixed window for every table; None sizes it from the chunk size.
    capacity : int
        Tables kept; the least recently used one goes when a new one would exceed it.
    in_flight_extra : int
        Chunks in flight per tree beyond the window and the hops, in every table.
    """

    def __init__(self, plan: Plan, rank: int, window: Optional[int] = None,
                 capacity: int = 64, in_flight_extra: int = ENGINE.in_flight_extra) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        _check_rank(plan, rank)
        self.plan = plan
        self.rank = rank
        self.window = window
        self.capacity = capacity
        self.in_flight_extra = in_flight_extra
        self.compiled = 0  # tables compiled so far (misses), for tests and overhead checks
        self._tables: "OrderedDict[tuple, Schedule]" = OrderedDict()
        # What depends only on the plan and rank is worked out once: a miss then costs only
        # the segments and chunk offsets of the new shape.
        self._digest = plan.digest
        self._allreduce = _allreduce_peers(plan, rank)
        self._broadcast: Dict[int, Tuple[TreeTable, ...]] = {}

    def allreduce(self, count: int, dtype: Any, chunk_elems: int) -> Schedule:
        """The allreduce table for ``count`` elements of ``dtype`` in ``chunk_elems`` chunks."""
        key = ("allreduce", count, dtype, chunk_elems, -1)
        table = self._get(key)
        if table is None:
            table = self._put(key, _assemble("allreduce", self.plan, self._digest, self.rank,
                                             self._allreduce, count, dtype, chunk_elems,
                                             self.window, -1, self.in_flight_extra))
        return table

    def broadcast(self, count: int, dtype: Any, chunk_elems: int, root: int) -> Schedule:
        """The broadcast table from ``root`` for ``count`` elements of ``dtype``."""
        key = ("broadcast", count, dtype, chunk_elems, root)
        table = self._get(key)
        if table is None:
            peers = self._broadcast.get(root)
            if peers is None:
                peers = self._broadcast[root] = _broadcast_peers(self.plan, self.rank, root)
            table = self._put(key, _assemble("broadcast", self.plan, self._digest, self.rank,
                                             peers, count, dtype, chunk_elems, self.window,
                                             root, self.in_flight_extra))
        return table

    def _get(self, key: tuple) -> Optional[Schedule]:
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
        return table

    def _put(self, key: tuple, table: Schedule) -> Schedule:
        self.compiled += 1
        self._tables[key] = table
        if len(self._tables) > self.capacity:
            self._tables.popitem(last=False)
        return table

    def __len__(self) -> int:
        return len(self._tables)
