"""Helpers for model and optimizer state, as ``horovod.torch.functions``."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from ..api.basics import rank
from ..api.process_sets import check_process_set, global_process_set
from ..api.objects import allgather_object, broadcast_object
from .mpi_ops import broadcast_async_, synchronize

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]


def _named(params: Any) -> List[Tuple[Optional[str], torch.Tensor]]:
    if isinstance(params, dict):
        return sorted(params.items())
    if isinstance(params, (list, tuple)) or hasattr(params, "__next__"):
        return [p if isinstance(p, tuple) else (None, p) for p in params]
    raise ValueError(f"invalid params of type: {type(params)}")


def broadcast_parameters(params: Any, root_rank: int,
                         process_set: Any = global_process_set) -> None:
    """Overwrite ``params`` on every rank with ``root_rank``'s values, in place.

    Parameters
    ----------
    params : dict, list or iterator
        ``model.state_dict()``, ``model.named_parameters()`` or a list of tensors (or of
        ``(name, tensor)`` pairs).
    root_rank : int
        The rank whose values win.
    """
    check_process_set(process_set, "Broadcast")
    handles = []
    for name, p in _named(params):
        if p is None:
            continue
        handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                        root_rank, name, process_set))
    for h in handles:
        synchronize(h)


def _initialize_state(optimizer: torch.optim.Optimizer, model: Optional[torch.nn.Module]) -> None:
    """Give a fresh optimizer its state, as Horovod does: a zero gradient for every trainable
    parameter (sparse for SparseAdam and for the sparse embeddings of ``model`` under SGD),
    then one local step."""
    sparse_params = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse_params.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam) or \
                        (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_params):
                    p.grad = p.grad.to_sparse()
    # DistributedOptimizer's classes carry this mark in their own namespace.
    if type(optimizer).__dict__.get("_horotopo_distributed"):
        # A DistributedOptimizer's step() allreduces every gradient, which would wait for
        # ranks that take no such step: step the wrapped optimizer class only.
        super(type(optimizer), optimizer).step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Optional[torch.nn.Module] = None,
                              process_set: Any = global_process_set) -> None:
    """Give every rank ``root_rank``'s optimizer state (buffers, step counts, hyperparameters).

    A fresh optimizer (no state yet) first takes one step on zero gradients so its state
    exists, as Horovod's does; ``model`` names the sparse embeddings whose zero gradients must
    be sparse. The whole ``state_dict()`` then travels as one pickled object, so scalars,
    tensors and nested containers all arrive intact; non-root ranks ``load_state_dict`` it.
    """
    check_process_set(process_set, "Broadcast")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer, model)
    state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None,
                             root_rank, name="optimizer_state", process_set=process_set)
    if rank() != root_rank:
        optimizer.load_state_dict(state)
