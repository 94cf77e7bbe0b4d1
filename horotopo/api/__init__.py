"""The Horovod-compatible runtime and its NumPy/CuPy front end (re-exported by ``horotopo``).

See :mod:`horotopo.api.runtime` for the background thread and its parts,
:mod:`horotopo.api.controller` for negotiation and the response cache, and
:mod:`horotopo.api.fusion` and :mod:`horotopo.api.executors` for tensor fusion and the ops.
"""
from .arrays import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                     allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
                     broadcast_async, broadcast_async_, grouped_allgather,
                     grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                     grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
                     grouped_reducescatter_async, join, poll, reducescatter,
                     reducescatter_async, synchronize)
from .basics import (ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built,
                     ddl_built, global_process_set, gloo_built, gloo_enabled, init,
                     is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                     mpi_enabled, mpi_threads_supported, nccl_built, rank, remove_process_set,
                     retune, rocm_built, shutdown, size, start_timeline, stop_timeline)
from .errors import HorotopoInternalError, HorovodInternalError, HostsUpdatedInterrupt
from .objects import allgather_object, broadcast_object
from .ops import Adasum, Average, Max, Min, Product, Sum, handle_average_backwards_compatibility

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "start_timeline", "stop_timeline", "retune",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "handle_average_backwards_compatibility",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_allgather",
    "grouped_allgather_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "barrier", "join",
    "poll", "synchronize", "broadcast_object", "allgather_object",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "HorovodInternalError", "HorotopoInternalError", "HostsUpdatedInterrupt",
]
