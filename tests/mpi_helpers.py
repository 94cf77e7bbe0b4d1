"""Checks for the tests that run on every rank of an MPI job (tests/mpi/)."""
from __future__ import annotations

from mpi4py import MPI


def agree(ok: object, msg: str = "", comm: MPI.Comm = MPI.COMM_WORLD) -> None:
    """Assert ``ok`` on every rank at once; the message names the failing ranks.

    A plain ``assert`` failing on one rank alone would leave the others waiting for it in their
    next collective; here every rank fails together, with every failing rank's message.
    """
    every = comm.allgather((bool(ok), str(msg)))
    bad = [f"rank {r}: {m}" for r, (k, m) in enumerate(every) if not k]
    assert not bad, "; ".join(bad)
