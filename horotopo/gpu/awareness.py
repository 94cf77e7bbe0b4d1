"""Is the MPI library CUDA-aware (can it take device pointers)? Decided once per communicator.

Order of evidence:
1. ``HOROTOPO_CUDA_AWARE`` (a boolean: 1/0, true/false, ...) overrides everything.
2. The MPI library's own query, where it has one: ``MPIX_Query_cuda_support()`` (Open MPI and
   MPICH), else MPICH's ``MPIX_GPU_query_support(CUDA, &flag)``. mpi4py does not wrap these, so
   they are looked up with ctypes in the libmpi this process has already loaded.
3. When the evidence says yes, a one-time self-test: an allreduce of a small CuPy buffer,
   checked on the host. A library that says yes but computes wrong numbers is not trusted.

No query and no override means no: staging through pinned host memory is always correct, while
handing device pointers to a library that is not CUDA-aware crashes it. A rank without a CUDA
device always says no.

The decision is collective: every rank of the communicator must call :func:`cuda_aware`, and
all ranks get the same answer (the local evidence is combined with a host allreduce).
"""
from __future__ import annotations

import ctypes
import os
import warnings
from typing import Any, Dict, List, Optional

from .. import config
from .env import cupy_module, device_status

ENV = "HOROTOPO_CUDA_AWARE"
_MPIX_GPU_SUPPORT_CUDA = 0
_cache: Dict[Any, bool] = {}


def parse_override(value: Optional[str]) -> Optional[bool]:
    """Read ``HOROTOPO_CUDA_AWARE`` as horotopo.config does: a strict boolean (1/true/yes/on,
    0/false/no/off, any case); unset or empty -> None (detect).

    Raises
    ------
    ValueError
        (:class:`horotopo.config.ConfigError`) for any other value, naming the variable.
    """
    return config.parse(ENV, value)


def _loaded_mpi_libraries() -> List[str]:
    # Only a library already mapped into this process is safe to call: opening another libmpi
    # would give an uninitialised second MPI.
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line and ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libmpi"))


def query_mpi_library() -> Optional[bool]:
    """What the loaded MPI library says about CUDA support; None when it has no query.

    Must be called after MPI is initialised (importing mpi4py.MPI does that by default).
    """
    for path in _loaded_mpi_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = getattr(lib, "MPIX_Query_cuda_support", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = []
            return bool(fn())
        fn = getattr(lib, "MPIX_GPU_query_support", None)
        if fn is not None:
            flag = ctypes.c_int(0)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
            if fn(_MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)) == 0:
                return bool(flag.value)
    return None


def self_test(comm: Any) -> bool:
    """Allreduce a small CuPy buffer through ``comm`` and check it on the host (local verdict).

    Collective. Returns False, rather than raising, when there is no device or the MPI call
    fails; a library that is not CUDA-aware may crash instead, which is why this runs only when
    the query or the override says yes.
    """
    from mpi4py import MPI

    ready = False
    try:
        if device_status()[0]:
            cp = cupy_module()
            n = comm.Get_size()
            send = cp.full(64, comm.Get_rank() + 1, dtype=cp.float32)
            recv = cp.zeros(64, dtype=cp.float32)
            cp.cuda.get_current_stream().synchronize()
            ready = True
    except Exception:  # no usable device here: this rank says no
        ready = False
    # Every rank must take part in the device allreduce or none may: a rank that could not set
    # up would leave the others blocked in it.
    if not comm.allreduce(1 if ready else 0, op=MPI.MIN):
        return False
    try:
        comm.Allreduce(send, recv, op=MPI.SUM)
        got = cp.asnumpy(recv)
        return bool((got == n * (n + 1) / 2).all())
    except Exception:  # a failing device send is exactly the "not aware" answer
        return False


def _key(comm: Any) -> Any:
    try:
        return ("mpi", comm.py2f())
    except Exception:
        return ("obj", id(comm))


def cuda_aware(comm: Any, *, refresh: bool = False) -> bool:
    """Whether device buffers can be handed to MPI directly on ``comm`` (cached per comm).

    Parameters
    ----------
    comm : mpi4py communicator
        Collective over it: every rank must call this at the same point (the engine does, at
        init).
    refresh : bool
        Decide again instead of returning the cached answer.

    Returns
    -------
    bool
        The same value on every rank.

    Raises
    ------
    ValueError
        On every rank, if ``HOROTOPO_CUDA_AWARE`` holds something other than 0 or 1 on any.
    RuntimeError
        If ``HOROTOPO_CUDA_AWARE=1`` forces awareness but the self-test fails on some rank.
    """
    key = _key(comm)
    if not refresh and key in _cache:
        return _cache[key]
    from mpi4py import MPI

    try:
        override = config.get(ENV)
        bad: Optional[ValueError] = None
    except ValueError as exc:
        override, bad = None, exc
    # A bad value on one rank must raise on every rank: the others would wait in the
    # allreduces below for a rank that has left.
    if comm.allreduce(1 if bad else 0, op=MPI.MAX):
        raise bad or ValueError(f"{ENV} has an invalid value on another rank (expected a "
                                 f"boolean: {config.lookup(ENV).allowed()})")
    # Without a device the question is moot: no self-test, no warning, and the override
    # (often exported cluster-wide) is not an error on CPU-only ranks.
    has_device = device_status()[0]
    claim = has_device and (override if override is not None else bool(query_mpi_library()))
    # Ranks may see different environments; one rank that says no makes it no for all, so no
    # rank ever sends device pointers to a rank that stages.
    forced = comm.allreduce(1 if (override and has_device) else 0, op=MPI.MAX)
    agreed = comm.allreduce(1 if claim else 0, op=MPI.MIN)
    verdict = False
    if agreed:
        verdict = bool(comm.allreduce(1 if self_test(comm) else 0, op=MPI.MIN))
        if not verdict:
            if forced:
                raise RuntimeError(f"{ENV}=1 but the CUDA-aware self-test (an allreduce of a "
                                   "CuPy buffer) failed on at least one rank; unset it or set "
                                   f"{ENV}=0 to stage through host memory")
            warnings.warn("horotopo: MPI reports CUDA support but the self-test failed; "
                          "staging device buffers through pinned host memory",
                          RuntimeWarning, stacklevel=2)
    _cache[key] = verdict
    return verdict


def clear_cache() -> None:
    """Forget every cached decision (tests; a changed environment)."""
    _cache.clear()
