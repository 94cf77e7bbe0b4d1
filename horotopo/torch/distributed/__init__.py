"""horotopo for torch.distributed: a backend named "horotopo" and DDP communication hooks.

Importing this module registers the backend::

    import horotopo.torch.distributed
    torch.distributed.init_process_group("horotopo")   # in a job started by mpirun
    model = DistributedDataParallel(model)              # buckets reduced along the trees

or keeps gloo/NCCL as the process group and reduces DDP's buckets with horotopo::

    model.register_comm_hook(horotopo.torch.distributed.hook_state(),
                             horotopo.torch.distributed.allreduce_hook)

Rank and world size come from MPI (see :mod:`.launch`); the backend shares horotopo's
runtime with ``horotopo.torch`` (one probe and plan per job, one background thread).

The import also lets ``env://`` (``init_process_group``'s default) rendezvous over MPI when
``MASTER_ADDR`` and ``MASTER_PORT`` are both unset, where torch's own ``env://`` would stop
with "environment variable ... expected, but not set"; a job that sets them is unchanged.
"""
from __future__ import annotations

import importlib
from typing import Any, Iterator

import torch.distributed as dist

from .backend import BACKEND_NAME, UNSUPPORTED_OPS, ProcessGroupHorotopo, create_process_group
from .completion import HorotopoWork
from .hooks import (HookState, allreduce_hook, bfloat16_compress_hook, float16_compress_hook,
                    hook_state)
from .launch import LAUNCH_HINT, mpi_rendezvous, wants_mpi_rendezvous

__all__ = ["BACKEND_NAME", "ProcessGroupHorotopo", "HorotopoWork", "UNSUPPORTED_OPS",
           "HookState", "hook_state", "allreduce_hook", "float16_compress_hook",
           "bfloat16_compress_hook", "LAUNCH_HINT", "register"]


def _env_or_mpi(torch_env: Any) -> Any:
    """torch's ``env://`` handler, falling back to :func:`.launch.mpi_rendezvous` when the
    store's address is not in the environment."""
    def handler(url: str, **kwargs: Any) -> Iterator[Any]:
        if wants_mpi_rendezvous():
            return mpi_rendezvous(url, **kwargs)
        return torch_env(url, **kwargs)
    handler._horotopo_wraps = torch_env  # type: ignore[attr-defined]  # (idempotent register)
    return handler


def register() -> None:
    """Register the "horotopo" backend and the MPI fallback of ``env://`` (done on import;
    calling it again changes nothing)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group,
                                      devices=["cpu", "cuda"])
    # torch offers no public way to replace a scheme's handler (registering "env" again
    # raises), so the fallback wraps the registered one in torch's table.
    # (torch.distributed.rendezvous is also the name of a function, hence import_module)
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if not hasattr(handlers["env"], "_horotopo_wraps"):
        handlers["env"] = _env_or_mpi(handlers["env"])


register()
