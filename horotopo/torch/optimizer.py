"""DistributedOptimizer, as ``horovod.torch.DistributedOptimizer``.

Gradient hooks start an asynchronous in-place allreduce of each gradient as soon as autograd
has accumulated it, so communication overlaps the rest of the backward pass; ``step()`` (or
``synchronize()``) waits for them and then runs the wrapped optimizer's update.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ..api.basics import global_process_set, size
from ..api.process_sets import check_process_set
from ..api.ops import Adasum, Average
from .compression import Compression
from .functions import broadcast_object
from .mpi_ops import (allreduce_async_, grouped_allreduce_async_, sparse_allreduce_async,
                      synchronize)

__all__ = ["DistributedOptimizer"]


def _split(items: List[Any], parts: int) -> List[List[Any]]:
    """``items`` cut into ``parts`` contiguous runs whose lengths differ by at most one."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        out.append(items[start:end])
        start = end
    return [g for g in out if g]


def _checked_names(param_groups: List[Dict[str, Any]],
                   named_parameters: Optional[Sequence[Tuple[str, Any]]]
                   ) -> List[Tuple[str, Any]]:
    """``named_parameters`` as a list (made-up names when None), with Horovod's errors for
    non-tuples, duplicate names and parameters left unnamed."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                            for i, group in enumerate(param_groups)
                            for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [k for k, _ in named_parameters]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found "
                         f"duplicates: {', '.join(dups)}")
    all_ids = {id(v) for group in param_groups for v in group["params"]}
    unnamed = all_ids - {id(v) for _, v in named_parameters}
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters "
                         "were not named. Python object ids: "
                         + ", ".join(str(i) for i in sorted(unnamed)))
    return named_parameters


def _name_parameters(opt: torch.optim.Optimizer,
                     named_parameters: Optional[Sequence[Tuple[str, Any]]], compression: Any,
                     backward_passes_per_step: int) -> List[Tuple[str, Any]]:
    """Set what both wrappers keep per parameter (names, passes left before the allreduce)
    and the compression; return the checked ``named_parameters``."""
    opt._compression = compression
    named = _checked_names(opt.param_groups, named_parameters)
    opt._parameter_names = {v: k for k, v in sorted(named, key=lambda kv: kv[0])}
    opt.backward_passes_per_step = backward_passes_per_step
    opt._allreduce_delay = {v: backward_passes_per_step for _, v in named}
    return named


def _count_pass(p: torch.Tensor, handles: Dict[Any, Tuple[Any, Any]],
                delay: Dict[Any, int]) -> None:
    """A gradient hook's bookkeeping (Horovod's checks): one more backward pass for ``p``."""
    if p in handles and handles[p][0] is not None and delay[p] <= 0:
        raise AssertionError("Gradients were computed more than backward_passes_per_step times "
                             "before call to step(). Increase backward_passes_per_step to "
                             "accumulate gradients locally.")
    assert not p.grad.requires_grad
    assert delay[p] > 0
    delay[p] -= 1


def _check_nothing_pending(handles: Dict[Any, Tuple[Any, Any]]) -> None:
    """zero_grad() between backward() and step() would race the gradient allreduces."""
    if handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                             "before optimizer.step() or optimizer.synchronize(). This is "
                             "prohibited as it can cause a race condition.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed in front of the user's optimizer class (see :func:`DistributedOptimizer`)."""

    # Marks both wrappers: their step() is collective (broadcast_optimizer_state steps the
    # wrapped class instead).
    _horotopo_distributed = True

    def __init__(self, params: Any, named_parameters: Optional[Sequence[Tuple[str, Any]]],
                 compression: Any, backward_passes_per_step: int, op: int,
                 gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool,
                 process_set: Any) -> None:
        super(self.__class__, self).__init__(params)
        named_parameters = _name_parameters(self, named_parameters, compression,
                                            backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles: Dict[Any, Tuple[Any, Any]] = {}
        self._grad_hooks: List[Any] = []
        self._requires_update: set = set()
        self._synchronized = False
        self._should_synchronize = True
        if groups is not None:
            if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
                raise ValueError("groups should be a non-negative integer or a list of list of "
                                 "torch.Tensor.")
            if isinstance(groups, list):
                seen: set = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in seen:
                            raise ValueError("A parameter can only appear once in groups.")
                        seen.add(id(p))
        self._groups = groups
        self._p_to_group: Dict[Any, Tuple[Any, ...]] = {}
        self._group_counts: Dict[Tuple[Any, ...], int] = {}
        # A rank outside the process set reduces nothing: its gradients stay local and step()
        # applies them as they are (Horovod's behaviour).
        self._member = process_set is global_process_set or bool(process_set.included())
        if self._member and size() > 1:
            self._register_hooks()

    # -------------------------------------------------------------------------------- hooks

    def _register_hooks(self) -> None:
        trainable = [p for group in self.param_groups for p in group["params"]
                     if p.requires_grad]
        if self._groups is not None:
            # Every rank must form the same groups in the same order: take rank 0's order.
            # Only the set's ranks get here, so the order comes from the set's first rank.
            root = 0 if self.process_set is global_process_set else self.process_set.ranks[0]
            order = broadcast_object([self._parameter_names.get(p) for p in trainable],
                                     root_rank=root, name="DistributedOptimizer.order",
                                     process_set=self.process_set)
            position = {n: k for k, n in enumerate(order)}
            trainable.sort(key=lambda p: position.get(self._parameter_names.get(p), 1 << 30))
            if isinstance(self._groups, list):
                wanted = {id(p) for p in trainable}
                groups = [[p for p in g if id(p) in wanted] for g in self._groups]
                grouped = {id(p) for g in groups for p in g}
                groups += [[p] for p in trainable if id(p) not in grouped]
            else:
                groups = _split(trainable, self._groups)
            for g in groups:
                if not g:
                    continue
                key = tuple(g)
                for p in key:
                    self._p_to_group[p] = key
                self._group_counts[key] = 0
        for p in trainable:
            self._requires_update.add(p)
            if hasattr(p, "register_post_accumulate_grad_hook"):
                self._grad_hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
            else:  # torch < 2.1: hook the gradient accumulator node
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(p))
                self._grad_hooks.append(acc)

    def _scales(self) -> Tuple[float, float]:
        if self.op == Average:
            # The runtime divides by size for Average; the predivide factor moves part of
            # that division before the sum (to avoid fp16 overflow) and undoes it after.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p: torch.Tensor) -> Tuple[Any, Any]:
        if p.grad is None:
            # Another rank may have a gradient for this parameter (a dynamic graph): send
            # zeros so that the names still match.
            p.grad = p.data.new(p.size()).zero_()
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(tensor, name=name, op=self.op,
                                              process_set=self.process_set), None
            # p.grad stays sparse: synchronize() turns the reduced dense copy back into a
            # sparse gradient, so optimizers that take only sparse ones (SparseAdam) step.
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scales()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self.process_set)
        return handle, (ctx, compressed)

    def _grouped_allreduce_grad_async(self, group: Tuple[Any, ...]) -> Tuple[Any, Any]:
        for p in group:
            if p.grad is None:
                p.grad = p.data.new(p.size()).zero_()
        pairs = [self._compression.compress(p.grad) for p in group]
        pre, post = self._scales()
        handle = grouped_allreduce_async_([c for c, _ in pairs],
                                          name=self._parameter_names.get(group[0]), op=self.op,
                                          prescale_factor=pre, postscale_factor=post,
                                          process_set=self.process_set)
        return handle, [(ctx, c) for c, ctx in pairs]

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*_ignore: Any) -> None:
            _count_pass(p, self._handles, self._allreduce_delay)
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        handle, ctxs = self._grouped_allreduce_grad_async(group)
                        self._handles[group] = (handle, ctxs)
                        for q in group:
                            self._handles.pop(q, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    # -------------------------------------------------------------------------------- sync

    def synchronize(self) -> None:
        """Wait for every gradient allreduce (starting the ones no hook started)."""
        if not self._member:
            self._synchronized = True
            return
        done: set = set()
        for key in self._handles:
            done.update(key if isinstance(key, tuple) else (key,))
        for p in self._requires_update - done:
            self._handles[p] = self._allreduce_grad_async(p)
        for key, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                if isinstance(key, tuple):
                    self._handles[key] = self._grouped_allreduce_grad_async(key)
                else:
                    self._handles[key] = self._allreduce_grad_async(key)
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                outputs = synchronize(handle)
                for p, out, (cctx, _) in zip(key, outputs, ctx):
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    self._set_grad(p, self._compression.decompress(out, cctx))
                if self._groups is not None:
                    self._group_counts[key] = 0
                continue
            out = synchronize(handle)
            self._allreduce_delay[key] = self.backward_passes_per_step
            if self._groups is not None:
                self._group_counts[self._p_to_group[key]] = 0
            if ctx is not None:
                out = self._compression.decompress(out, ctx[0])
            if key.grad.is_sparse:
                # Sparse gradients take no copy_ or set_: clear, then add (as Horovod); a
                # sparse_as_dense result goes back to sparse first.
                with torch.no_grad():
                    key.grad.zero_().add_(out if out.is_sparse else out.to_sparse())
            else:
                self._set_grad(key, out)
        self._handles.clear()
        self._synchronized = True

    @staticmethod
    def _set_grad(p: torch.Tensor, value: torch.Tensor) -> None:
        if value is not p.grad:
            if value.is_sparse and not p.grad.is_sparse:
                value = value.to_dense()
            with torch.no_grad():
                p.grad.copy_(value)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this context, step() does not synchronize (call synchronize() yourself)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        _check_nothing_pending(self._handles)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Horovod's Adasum optimizer, mixed in front of the user's optimizer class: as each
    gradient is ready, the wrapped optimizer steps that parameter alone, and the change it
    made (the delta) is Adasum-allreduced; ``step()`` applies the combined deltas."""

    _horotopo_distributed = True

    def __init__(self, params: Any, named_parameters: Optional[Sequence[Tuple[str, Any]]],
                 compression: Any, backward_passes_per_step: int) -> None:
        super(self.__class__, self).__init__(params)
        named_parameters = _name_parameters(self, named_parameters, compression,
                                            backward_passes_per_step)
        self._handles: Dict[Any, Tuple[Any, Any]] = {}
        self._grad_hooks: List[Any] = []
        self._requires_update: set = set()
        # Where each parameter stood before its local step: the step's delta is taken from it.
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False)
                                 for _, p in named_parameters}
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    self._requires_update.add(p)
                    self._grad_hooks.append(
                        p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _allreduce_grad_async(self, p: torch.Tensor) -> Tuple[Any, Any]:
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:   # step p alone
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.data.copy_(p)
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)            # p now holds this rank's delta
        compressed, ctx = self._compression.compress(p)
        handle = allreduce_async_(compressed.data, name=self._parameter_names.get(p), op=Adasum)
        return handle, ctx

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*_ignore: Any) -> None:
            _count_pass(p, self._handles, self._allreduce_delay)
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self) -> None:
        """Nothing to do: step() waits for the deltas (as Horovod's Adasum optimizer)."""

    def skip_synchronize(self) -> None:
        """Refused, as Horovod's Adasum optimizer refuses it (step() must synchronize)."""
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:   # step() before backward_passes_per_step passes
                handle, ctx = self._allreduce_grad_async(p)
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starting_models[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        _check_nothing_pending(self._handles)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Sequence[Tuple[str, Any]]] = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = global_process_set) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged over all ranks.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The local optimizer; the result is an instance of a subclass of its class.
    named_parameters : sequence of (str, Parameter), optional
        ``model.named_parameters()``: the names key the allreduces (so hooks may fire in any
        order on different ranks).
    compression : Compression.none or Compression.fp16
    backward_passes_per_step : int
        Local backward passes accumulated before the gradients are allreduced.
    op : int
        Average (default), Sum, Min, Max, Product or Adasum (Horovod's Adasum optimizer: each
        parameter's local step is taken as its gradient arrives, and the deltas are combined
        with Adasum; CPU tensors on a power-of-two number of ranks).
    gradient_predivide_factor : float
        With Average, divide by this before the sum and by ``size / factor`` after.
    num_groups : int
        Deprecated alias for an integer ``groups``.
    groups : int or list of lists of Parameter, optional
        Allreduce parameters in groups (each group one fused call): an integer splits the
        parameters evenly into that many groups.
    sparse_as_dense : bool
        Densify sparse gradients for the allreduce (otherwise they are allgathered); the
        reduced gradient goes back to sparse before the step.
    process_set : ProcessSet
        The ranks whose gradients are averaged. On a rank outside the set nothing is
        reduced and ``step()`` applies the local gradients (as Horovod). Adasum takes only the
        global set, as Horovod's.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    # The global set needs no runtime to check (the optimizer may be built before init); any
    # other must be registered, but this rank need not be in it.
    pset = (0 if process_set is global_process_set
            else check_process_set(process_set, "DistributedOptimizer",
                                   member_required=False)[0])
    if op == Adasum and pset:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    if op == Adasum:
        # Horovod's Adasum optimizer: deltas of local steps, combined with Adasum (CPU
        # tensors, a power-of-two number of ranks: checked at each allreduce).
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
