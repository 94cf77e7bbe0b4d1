"""The runtime's table of process sets: every set's ranks by id, and what this rank holds for
the sets it is a member of (the set's communicator, plan and engine).

The background thread registers a set when it runs a negotiated PROCESS_SET response (the
user-facing side, :mod:`horotopo.api.process_sets`, asks for it): the set's members make a
communicator of their own (the transport's ``group_comm``, collective over the members only)
and a plan of their own: the set's first rank plans the job's measured topology restricted to
the members (:func:`restrict`; no new probe) and shares the plan with the members
(:func:`horotopo.planning_protocol.share_plan`), so the trees serve the subset.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import config
from ..topology import Topology

__all__ = ["PROCESS_SET_ADD", "PROCESS_SET_REMOVE", "restrict", "ranks_from_name",
           "build_group", "Group", "SetTable"]

#: The request's ``op`` of the negotiated process-set ops (kind PROCESS_SET).
PROCESS_SET_ADD = 0
PROCESS_SET_REMOVE = 1


def restrict(topology: Topology, ranks: Sequence[int]) -> Topology:
    """The job's network model seen by ``ranks`` only: their hosts, the routes and latencies
    between them (rank ``k`` of the result is ``ranks[k]``), the same resources.

    The result is planned, never re-read from a file: its ``source`` records what it was cut
    from, for its digest.
    """
    idx = [int(r) for r in ranks]
    return Topology(
        name=f"{topology.name}[{','.join(map(str, idx))}]",
        hosts=tuple(topology.hosts[r] for r in idx),
        resources=topology.resources, capacity_Bps=topology.capacity_Bps,
        routes=[[tuple(topology.routes[a][b]) for b in idx] for a in idx],
        latency_s=tuple(tuple(topology.latency_s[a][b] for b in idx) for a in idx),
        kind=topology.kind,
        source=json.dumps({"restricted_from": topology.digest, "ranks": idx}, sort_keys=True))


def ranks_from_name(name: str) -> Tuple[int, ...]:
    """The ranks of a PROCESS_SET add request, which its name carries (so that every rank
    that adds the same set meets under one name)."""
    return tuple(int(r) for r in name.rsplit(".", 1)[1].split(","))


def build_group(comm: Any, ranks: Tuple[int, ...], rank: int, topology: Topology,
                ring: bool, timeout_s: float) -> "Group":
    """This member's part of a new set: a communicator over ``ranks`` of ``comm`` (collective
    over the members only), the plan of the members' sub-network, made on the set's first
    rank and checked by every member, and an engine that runs it (no re-probing: the set's
    model is cut from the job's)."""
    from horotopo.adapt import AdaptiveEngine
    from horotopo.adapt.runtime import RUNTIME_DEFAULTS
    from horotopo.algorithms.choice import forest_predictor
    from horotopo.plan import make_plan, ring_plan
    from horotopo.planning_protocol import share_plan
    from horotopo.transport import mpi as door

    # The engine and the planning exchange each work on a Dup of it (freed when closed); the
    # communicator itself lives as long as the process, as the runtime's own does.
    sub = door.group_comm(comm, ranks)
    model = restrict(topology, ranks)
    transport = door.MPITransport(sub)
    try:
        plan, _ = share_plan(
            transport,
            lambda: ((ring_plan(model) if ring or len(ranks) < 3
                      else make_plan(model, predict=forest_predictor(model))), None),
            what=f"process set {list(ranks)}: plan")
    finally:
        transport.close()
    engine = AdaptiveEngine(sub, plan, model, adapt=False, timeout_s=timeout_s, calibrate_s=0.0,
                            engine_params=config.engine_params(), **RUNTIME_DEFAULTS)
    return Group(0, tuple(ranks), ranks.index(rank), engine, plan, model)


@dataclass
class Group:
    """What a member holds for one process set: the engine over the set's communicator, the
    plan over its sub-network, and this rank's place in it."""

    pid: int
    ranks: Tuple[int, ...]
    rank: int
    engine: Any
    plan: Any
    topology: Topology

    @property
    def size(self) -> int:
        return len(self.ranks)


class SetTable:
    """Every process set's ranks by id (identical on every rank), and this rank's groups.

    Only the background thread changes it, when it runs a PROCESS_SET response; user threads
    read it (dict reads are atomic, and a registration completes before the user's
    ``add_process_set`` returns).
    """

    def __init__(self, size: int) -> None:
        self._ranks: Dict[int, Tuple[int, ...]] = {0: tuple(range(size))}
        self.groups: Dict[int, Group] = {}
        self._next = 1
        self._lock = threading.Lock()

    @property
    def members(self) -> Dict[int, Tuple[int, ...]]:
        """The id -> ranks mapping itself (the coordinator counts requests against it)."""
        return self._ranks

    def get(self, pid: int) -> Optional[Tuple[int, ...]]:
        return self._ranks.get(pid)

    def ranks_of(self, pid: int) -> Tuple[int, ...]:
        ranks = self._ranks.get(pid)
        if ranks is None:
            raise ValueError("Process set does not exist or has not been registered.")
        return ranks

    def find(self, ranks: Sequence[int]) -> Optional[int]:
        key = tuple(ranks)
        return next((pid for pid, r in self._ranks.items() if r == key), None)

    def ids(self) -> Dict[int, List[int]]:
        """``{id: ranks}`` (Horovod's ``_get_process_set_ids_and_ranks``)."""
        return {pid: list(r) for pid, r in self._ranks.items()}

    def register(self, ranks: Tuple[int, ...], group: Optional[Group]) -> int:
        """Record a set under the next id (the same on every rank: every rank registers the
        same sets in the same order); ``group`` is this rank's part, None for a non-member."""
        with self._lock:
            pid = self._next
            self._next += 1
            self._ranks[pid] = tuple(ranks)
            if group is not None:
                group.pid = pid
                self.groups[pid] = group
        return pid

    def unregister(self, pid: int) -> Optional[Group]:
        with self._lock:
            self._ranks.pop(pid, None)
            return self.groups.pop(pid, None)
