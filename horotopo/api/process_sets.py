"""Process sets, as in Horovod 0.28 (``horovod.common.process_sets``): collectives over a
subset of the ranks.

A process set is registered by every rank at the same point (``hvd.init(process_sets=...)``,
or :func:`add_process_set` with ``HOROVOD_DYNAMIC_PROCESS_SETS=1``): a negotiated op of the
global set, so that each rank's background thread builds the set at the same place of the
response stream; :mod:`horotopo.api.set_table` holds what the runtime builds for it (the
members' communicator, and a plan of the members' sub-network, so the trees serve the
subset). The set's collectives are negotiated through rank 0 with the
others (a name is ready once the set's members asked for it) and run on the set's engine.

Ranks stay global in the API, as in Horovod: a broadcast's ``root_rank`` is a global rank,
and ``ProcessSet.rank()`` is the rank within the set.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from .. import config
from .records import PROCESS_SET
from .set_table import PROCESS_SET_ADD, PROCESS_SET_REMOVE, SetTable, restrict
from .state import runtime

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "check_process_set", "restrict", "SetTable", "register",
           "check_duplicates", "NOT_REGISTERED", "allow_dynamic", "dynamic"]

#: Horovod's words (operations.cc) after "<Op>: ".
NOT_REGISTERED = "Process set provided does not exist, or has not been registered."
_DYNAMIC_ADD = ("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after Horovod "
                "initialization.")
_DYNAMIC_REMOVE = ("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets after "
                   "Horovod initialization.")


class ProcessSet:
    """A set of ranks that run collectives together (Horovod's ``hvd.ProcessSet``).

    Parameters
    ----------
    ranks_or_comm : sequence of int, or an mpi4py communicator
        The global ranks (any order; kept sorted), or a communicator whose members form the
        set. A communicator's set is registered by ``hvd.init(process_sets=[...])`` only (as
        in Horovod): every rank passes its own communicator (``COMM_WORLD.Split(...)``), and
        the ranks are learnt then.

    Attributes
    ----------
    process_set_id : int or None
        Set once registered (``hvd.init(process_sets=...)`` or :func:`add_process_set`);
        None before, and again once removed.
    ranks : list of int
        The sorted global ranks.
    """

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]) -> None:
        if _is_communicator(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "or an mpi4py Comm object") from None
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "or an mpi4py Comm object")
        self.ranks = ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """The number of ranks in the set; None while not registered."""
        if self.process_set_id is None:
            return None
        return len(_table().ranks_of(self.process_set_id))

    def rank(self) -> Optional[int]:
        """This process's rank within the set; None while not registered.

        Raises
        ------
        ValueError
            This process is not in the set (Horovod's message).
        """
        if self.process_set_id is None:
            return None
        ranks = _table().ranks_of(self.process_set_id)
        me = runtime().rank
        if me not in ranks:
            raise ValueError("Process is not part of provided process set.")
        return ranks.index(me)

    def included(self) -> Optional[bool]:
        """Whether this process is in the set; None before its ranks are known."""
        if self.ranks is None:
            return None
        return runtime().rank in self.ranks

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


def _is_communicator(obj: Any) -> bool:
    # Duck-typed: only the transport may import mpi4py, and any object with mpi4py's
    # Comm methods that init() calls will do.
    return all(hasattr(obj, a) for a in ("allgather", "Get_size", "Get_rank"))


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


_dynamic = False   # hvd.init(process_sets="dynamic") was called


def allow_dynamic() -> None:
    """What ``init(process_sets="dynamic")`` asks for (Horovod sets the variable instead)."""
    global _dynamic
    _dynamic = True


def dynamic() -> bool:
    """Whether sets may be added and removed after init."""
    return _dynamic or bool(config.get("HOROVOD_DYNAMIC_PROCESS_SETS"))


def _table() -> SetTable:
    return runtime().sets


def check_process_set(process_set: Any, what: str = "Allreduce",
                      member_required: bool = True) -> Tuple[int, Tuple[int, ...]]:
    """``(id, ranks)`` of the set a collective ``what`` ("Allreduce"...) was called on.

    ``member_required=False`` accepts a set this rank is not in (a DistributedOptimizer on
    such a rank leaves its gradients local, as Horovod's does).

    Raises
    ------
    ValueError
        Horovod's errors: the set is not registered (never, or removed), or this rank is not
        a member.
    """
    if process_set is None or process_set is global_process_set:
        return 0, _table().ranks_of(0)
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be an hvd.ProcessSet, got "
                        f"{type(process_set).__name__}")
    rt = runtime()
    pid = process_set.process_set_id
    ranks = rt.sets.get(pid) if pid is not None else None
    if ranks is None:
        raise ValueError(f"{what}: {NOT_REGISTERED}")
    if member_required and rt.rank not in ranks:
        raise ValueError(f"{what}: Rank {rt.rank} is not a member of the provided process set.")
    return pid, ranks


def add_process_set(process_set: Any) -> ProcessSet:
    """Register a process set after init; collective over every rank (Horovod's).

    Parameters
    ----------
    process_set : ProcessSet or sequence of int
        The ranks; every rank must pass the same ones.

    Returns
    -------
    ProcessSet
        ``process_set`` (or a new one for a rank list), registered.

    Raises
    ------
    ValueError
        Without ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` (or ``init(process_sets="dynamic")``), or
        when a set of these ranks exists already (Horovod's messages), or for ranks out of
        range.
    """
    rt = runtime()
    if isinstance(process_set, ProcessSet) and process_set.mpi_comm is not None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not "
            "implemented. Please build the process set via a list of ranks.")
    if not dynamic():
        raise ValueError(_DYNAMIC_ADD)
    return register(rt, process_set)


def register(rt: Any, process_set: Any) -> ProcessSet:
    """Register ``process_set`` (a ProcessSet or its ranks) on the runtime ``rt``: a negotiated
    op of the global set, collective over every rank; its id is set once registered.

    Raises
    ------
    ValueError
        Ranks out of range or repeated, or a set of these ranks exists already.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = tuple(process_set.ranks or ())
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= rt.size:
        raise ValueError(f"a process set needs distinct ranks in 0..{rt.size - 1}, got "
                         f"{list(ranks)}")
    if rt.sets.find(ranks) is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    name = "process_set.add." + ",".join(map(str, ranks))
    hid = rt.enqueue(PROCESS_SET, [(name, None, None)], op=PROCESS_SET_ADD)
    process_set.process_set_id = int(rt.wait(hid)[0])
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a registered process set; collective over every rank (Horovod's).

    Returns
    -------
    bool
        True once removed; False for the global set or a set that is not registered.

    Raises
    ------
    ValueError
        Without ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` (Horovod's message).
    """
    rt = runtime()
    pid = process_set.process_set_id
    if pid is None or pid == 0:
        return False
    if not dynamic():
        raise ValueError(_DYNAMIC_REMOVE)
    process_set._invalidate()
    if rt.sets.get(pid) is None:
        return False
    hid = rt.enqueue(PROCESS_SET, [(f"process_set.remove.{pid}", None, None)],
                     op=PROCESS_SET_REMOVE, root=pid)
    return rt.wait(hid)[0] is not None


def check_duplicates(process_sets: Sequence[Any], size: Optional[int] = None) -> None:
    """Refuse ``hvd.init(process_sets=[...])`` entries that repeat another's ranks, or the
    global set's once ``size`` is known (Horovod's message).

    Raises
    ------
    TypeError
        An entry is not a ProcessSet.
    ValueError
        Entry ``k`` is a duplicate.
    """
    seen = set() if size is None else {tuple(range(size))}
    for k, ps in enumerate(process_sets):
        if not isinstance(ps, ProcessSet):
            raise TypeError(f"process_sets entry number {k} is not an hvd.ProcessSet: {ps!r}")
        if ps.mpi_comm is not None:
            continue            # its ranks are known once init has asked the communicator
        key = tuple(ps.ranks or ())
        if key in seen:
            raise ValueError(f"Horovod could not be initialized because process_sets entry "
                             f"number {k} is a duplicate: {ps}")
        seen.add(key)
