"""How a job reaches the horotopo backend: rank and size from MPI, checked against torch's.

Three things happen before the backend's first collective:

- the rendezvous: ``init_process_group`` reads ``env://`` by default, which needs
  ``MASTER_ADDR``/``MASTER_PORT`` (and ``RANK``/``WORLD_SIZE``) that ``mpirun`` does not set.
  With the two unset, :func:`mpi_rendezvous` starts horotopo, takes rank and size from MPI,
  and rank 0 hosts torch's key-value store (a ``TCPStore`` whose address the others get by a
  horotopo broadcast). With either set, torch's own ``env://`` runs unchanged;
- :func:`refuse_torchrun`: under ``torchrun`` there is no MPI job, so every process would
  be an MPI job of one; the backend stops at once and says how to launch instead;
- :func:`check_ranks`: torch's rank and size must be MPI's (a mismatch names both).
"""
from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any, Iterator, Mapping, Optional, Tuple
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from ... import config

__all__ = ["LAUNCH_HINT", "mpi_rendezvous", "wants_mpi_rendezvous", "refuse_torchrun",
           "check_ranks", "mpi_size_before_init"]

#: How to start a job for the horotopo backend (the torchrun error and the README say it).
LAUNCH_HINT = ("launch with MPI instead: `mpirun -n N python train.py` (or `mpiexec`, or "
               "`horotopo-run -np N python train.py`); rank and world size then come from MPI, "
               "and MASTER_ADDR/MASTER_PORT are not needed")

_DEFAULT_TIMEOUT = timedelta(minutes=30)


def wants_mpi_rendezvous(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``env://`` has no store address (``MASTER_ADDR`` and ``MASTER_PORT`` unset):
    only then does the rendezvous go over MPI, so a job that sets them keeps torch's own."""
    return (config.get("MASTER_ADDR", env) is None
            and config.get("MASTER_PORT", env) is None)


def _query_int(url: str, key: str) -> Optional[int]:
    # init_process_group(rank=, world_size=) reach the rendezvous as ?rank=..&world_size=..
    values = parse_qs(urlparse(url).query).get(key)
    return int(values[0]) if values else None


def mpi_rendezvous(url: str, timeout: timedelta = _DEFAULT_TIMEOUT,
                   **kwargs: Any) -> Iterator[Tuple[dist.Store, int, int]]:
    """torch's rendezvous protocol over MPI: yields ``(store, rank, world_size)`` once.

    Rank and size are the user's (``init_process_group``'s arguments, else ``RANK`` and
    ``WORLD_SIZE``) when given, so that the backend can check them against MPI's; else
    MPI's. Collective: every rank of the MPI job takes part.
    """
    from ... import torch as hvd  # the API module; imported late, it starts MPI

    hvd.init()
    me, n = hvd.rank(), hvd.size()
    if me == 0:
        # Port 0: the operating system picks a free port; the others learn it below.
        store = dist.TCPStore(socket.gethostname(), 0, n, True, timeout=timeout,
                              wait_for_workers=False)
        hvd.broadcast_object((socket.gethostname(), int(store.port)), 0,
                             name="torch.distributed.rendezvous")
    else:
        host, port = hvd.broadcast_object(None, 0, name="torch.distributed.rendezvous")
        store = dist.TCPStore(host, port, n, False, timeout=timeout)
    rank = _query_int(url, "rank")
    world = _query_int(url, "world_size")
    rank = rank if rank is not None and rank >= 0 else config.get("RANK")
    world = world if world is not None and world > 0 else config.get("WORLD_SIZE")
    yield store, me if rank is None else int(rank), n if world is None else int(world)
    raise RuntimeError("horotopo's MPI rendezvous cannot re-rendezvous: restart the job")


def mpi_size_before_init() -> int:
    """MPI's world size, from horotopo if it runs, else from MPI itself (without horotopo's
    set-up, so that a wrong launch is reported before any probe or plan)."""
    from ...api.basics import is_initialized, size

    if is_initialized():
        return size()
    from ...transport.mpi import world_comm

    return int(world_comm().Get_size())


def refuse_torchrun(world_size: int, mpi_size: int,
                    env: Optional[Mapping[str, str]] = None) -> None:
    """Raise when torch expects ``world_size`` > 1 ranks but MPI has only ``mpi_size`` == 1
    and torchrun started the process (``TORCHELASTIC_RUN_ID`` or ``LOCAL_WORLD_SIZE`` set).

    Raises
    ------
    RuntimeError
        Saying that torchrun is not a launcher for this backend, and how to launch.
    """
    elastic = (config.get("TORCHELASTIC_RUN_ID", env) is not None
               or config.get("LOCAL_WORLD_SIZE", env) is not None)
    if elastic and world_size > 1 and mpi_size == 1:
        raise RuntimeError(
            f"the horotopo backend runs over MPI, and torchrun (TORCHELASTIC_RUN_ID/"
            f"LOCAL_WORLD_SIZE are set) starts no MPI job, so this process is an MPI job of 1 "
            f"rank, not one of WORLD_SIZE={world_size}: {LAUNCH_HINT}.")


def check_ranks(torch_rank: int, torch_size: int, mpi_rank: int, mpi_size: int) -> None:
    """Raise unless torch.distributed's rank and size are MPI's.

    Raises
    ------
    RuntimeError
        Naming both pairs, and where torch's come from.
    """
    if (torch_rank, torch_size) != (mpi_rank, mpi_size):
        raise RuntimeError(
            f"torch.distributed says rank {torch_rank} of {torch_size} (from RANK/WORLD_SIZE, "
            f"init_process_group's rank/world_size, or a subgroup's ranks) but MPI says rank {mpi_rank} of "
            f"{mpi_size}: the horotopo backend takes rank and world size from MPI. Unset "
            f"RANK and WORLD_SIZE (and drop rank=/world_size=), or make them match MPI's; "
            f"{LAUNCH_HINT}.")

