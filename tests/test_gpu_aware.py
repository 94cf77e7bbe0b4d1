"""CUDA-awareness detection: the override, combining ranks' evidence, the self-test's role."""
import importlib
import warnings

import pytest

from horotopo.gpu import awareness

MIN, MAX = "min", "max"


class FakeComm:
    """A communicator whose other ranks contribute fixed values to each allreduce."""

    def __init__(self, others=()):
        self.others = list(others)  # per call: the other ranks' values, or None for "same"
        self.calls = []

    def allreduce(self, value, op):
        self.calls.append(value)
        from mpi4py import MPI
        other = self.others.pop(0) if self.others else None
        vals = [value] + ([] if other is None else list(other))
        return min(vals) if op == MPI.MIN else max(vals)

    def Get_size(self):
        return 1

    def Get_rank(self):
        return 0


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    pytest.importorskip("mpi4py", reason="mpi4py not installed")
    monkeypatch.delenv(awareness.ENV, raising=False)
    # Decide as a rank with a device would; the no-device case sets its own.
    monkeypatch.setattr(awareness, "device_status", lambda: (True, ""))
    awareness.clear_cache()
    yield
    awareness.clear_cache()


@pytest.mark.parametrize("value,expected", [(None, None), ("", None), ("0", False),
                                            ("1", True), (" 1\n", True), ("TRUE", True),
                                            ("off", False), ("yes", True)])
def test_parse_override(value, expected):
    assert awareness.parse_override(value) is expected


@pytest.mark.parametrize("value", ["2", "-1", "maybe", "y"])
def test_bad_override_names_the_variable(value, monkeypatch):
    with pytest.raises(ValueError, match=f"HOROTOPO_CUDA_AWARE={value!r}: must be one of 1, "
                                         f"true, yes, on, 0, false, no, off"):
        awareness.parse_override(value)
    monkeypatch.setenv(awareness.ENV, value)
    with pytest.raises(ValueError, match="HOROTOPO_CUDA_AWARE"):
        awareness.cuda_aware(FakeComm())


def _spy_self_test(monkeypatch, result):
    ran = []
    monkeypatch.setattr(awareness, "self_test", lambda comm: ran.append(1) or result)
    return ran


def test_bad_value_on_another_rank_raises_here_too():
    with pytest.raises(ValueError, match="HOROTOPO_CUDA_AWARE has an invalid value on another"):
        awareness.cuda_aware(FakeComm(others=[[1]]))


def test_override_zero_wins_over_the_library(monkeypatch):
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: True)
    ran = _spy_self_test(monkeypatch, True)
    monkeypatch.setenv(awareness.ENV, "0")
    assert awareness.cuda_aware(FakeComm()) is False
    assert ran == []


def test_library_yes_confirmed_by_self_test(monkeypatch):
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: True)
    ran = _spy_self_test(monkeypatch, True)
    assert awareness.cuda_aware(FakeComm()) is True
    assert ran == [1]


def test_library_yes_but_self_test_fails_stages_with_a_warning(monkeypatch):
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: True)
    _spy_self_test(monkeypatch, False)
    with pytest.warns(RuntimeWarning, match="self-test failed"):
        assert awareness.cuda_aware(FakeComm()) is False


def test_forced_awareness_that_fails_the_self_test_is_an_error(monkeypatch):
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: None)
    _spy_self_test(monkeypatch, False)
    monkeypatch.setenv(awareness.ENV, "1")
    with pytest.raises(RuntimeError, match="HOROTOPO_CUDA_AWARE=1"):
        awareness.cuda_aware(FakeComm())


def test_no_query_and_no_override_means_staging(monkeypatch):
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: None)
    ran = _spy_self_test(monkeypatch, True)
    assert awareness.cuda_aware(FakeComm()) is False
    assert ran == []  # never hand device pointers to a library that did not say yes


def test_one_rank_saying_no_makes_it_no_everywhere(monkeypatch):
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: True)
    ran = _spy_self_test(monkeypatch, True)
    # Call order: bad value (MAX), forced (MAX), claim (MIN). Another rank's claim is 0.
    comm = FakeComm(others=[None, None, [0]])
    assert awareness.cuda_aware(comm) is False
    assert ran == []


def test_one_rank_failing_the_self_test_fails_it_for_all(monkeypatch):
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: True)
    _spy_self_test(monkeypatch, True)
    comm = FakeComm(others=[None, None, None, [0]])  # fourth allreduce: the self-test verdicts
    with pytest.warns(RuntimeWarning):
        assert awareness.cuda_aware(comm) is False


def test_rank_without_device_says_no_quietly_even_when_forced(monkeypatch):
    monkeypatch.setattr(awareness, "device_status", lambda: (False, "no CUDA device"))
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: True)
    ran = _spy_self_test(monkeypatch, True)
    monkeypatch.setenv(awareness.ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert awareness.cuda_aware(FakeComm()) is False
    assert ran == []


def test_decision_is_cached_per_communicator(monkeypatch):
    calls = []
    monkeypatch.setattr(awareness, "query_mpi_library", lambda: calls.append(1) or None)
    comm = FakeComm()
    assert awareness.cuda_aware(comm) is False
    assert awareness.cuda_aware(comm) is False
    assert calls == [1]
    awareness.cuda_aware(comm, refresh=True)
    assert calls == [1, 1]


def test_query_reads_the_loaded_mpi_library():
    importlib.import_module("mpi4py.MPI")  # loads and initialises libmpi
    if not awareness._loaded_mpi_libraries():
        pytest.skip("no libmpi*.so mapped in this process (statically linked MPI?)")
    got = awareness.query_mpi_library()
    # MPICH and Open MPI both export MPIX_Query_cuda_support; None would mean the lookup broke.
    assert got in (True, False)


def test_self_test_without_device_says_no(monkeypatch):
    from horotopo.gpu.env import device_status
    monkeypatch.setattr(awareness, "device_status", device_status)  # the real one
    if device_status()[0]:
        pytest.skip("a CUDA device is present; tests/mpi/test_gpu_mpi.py covers this case")
    from mpi4py import MPI
    assert awareness.self_test(MPI.COMM_SELF) is False
