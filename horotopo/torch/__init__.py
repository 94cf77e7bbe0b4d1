"""``import horotopo.torch as hvd``: a drop-in for ``horovod.torch``.

Same names, signatures and defaults as Horovod 0.28; the collectives run on horotopo's runtime
(see :mod:`horotopo.api.runtime`) along the planned reduce/broadcast trees.
"""
from .. import __version__
from ..api.basics import (ProcessSet, add_process_set, ccl_built, cross_rank, cross_size,
                          cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled,
                          is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                          mpi_enabled, mpi_threads_supported, nccl_built, rank,
                          remove_process_set, retune, rocm_built, size, start_timeline,
                          stop_timeline)
from ..api import basics
from ..api.errors import HorotopoInternalError, HorovodInternalError, HostsUpdatedInterrupt
from ..api.ops import (Adasum, Average, Max, Min, Product, Sum,
                       handle_average_backwards_compatibility)
from . import collectives
from . import adapter
from .compression import Compression
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .mpi_ops import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                      allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
                      broadcast_async, broadcast_async_, grouped_allgather,
                      grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                      grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
                      grouped_reducescatter_async, join, poll, reducescatter,
                      reducescatter_async, sparse_allreduce_async, synchronize)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm

# The engine takes torch tensors through this adapter: the engine knows no torch itself.
adapter.register()


def init(comm=None, process_sets=None) -> None:
    """Start horotopo (see :func:`horotopo.init`); forgets handles from an earlier run."""
    collectives.forget_handles()
    basics.init(comm, process_sets)


def shutdown() -> None:
    """Stop horotopo on every rank (see :func:`horotopo.shutdown`)."""
    collectives.forget_handles()
    basics.shutdown()


__all__ = [
    "__version__", "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "start_timeline", "stop_timeline", "retune",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "handle_average_backwards_compatibility",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "sparse_allreduce_async", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "grouped_allgather", "grouped_allgather_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "barrier", "join", "poll",
    "synchronize", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object",
    "Compression", "DistributedOptimizer", "SyncBatchNorm", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "HorovodInternalError", "HorotopoInternalError",
    "HostsUpdatedInterrupt",
]
