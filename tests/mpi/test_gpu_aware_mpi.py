"""cuda_aware() across real ranks: one answer everywhere, no hang when environments differ."""
import os

import pytest
from mpi4py import MPI

from horotopo.gpu import awareness
from horotopo.gpu.env import device_status

COMM = MPI.COMM_WORLD


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(awareness.ENV, raising=False)
    awareness.clear_cache()
    yield
    awareness.clear_cache()


def test_every_rank_gets_the_same_answer():
    verdict = awareness.cuda_aware(COMM)
    assert len(set(COMM.allgather(verdict))) == 1
    if not any(COMM.allgather(device_status()[0])):
        assert verdict is False  # no device anywhere: never CUDA-aware


def test_ranks_with_different_overrides_agree_on_no(monkeypatch):
    # Rank 0 says 0 and the others say 1: one "no" makes it no for everyone, with no self-test
    # (a self-test on some ranks only would leave them blocked in it).
    monkeypatch.setenv(awareness.ENV, "0" if COMM.rank == 0 else "1")
    assert awareness.cuda_aware(COMM) is False
    assert COMM.allgather(os.environ[awareness.ENV])[0] == "0"


def test_bad_override_on_one_rank_raises_on_every_rank(monkeypatch):
    if COMM.rank == 0:
        monkeypatch.setenv(awareness.ENV, "maybe")
    with pytest.raises(ValueError, match="HOROTOPO_CUDA_AWARE"):
        awareness.cuda_aware(COMM)
