"""Horovod's mismatch checks: what rank 0 answers when the ranks asked for different things.

The checks run in Horovod's order and use its messages word for word, since users (and tests
ported from Horovod) match on them.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from .ops import horovod_dtype_name, shape_string
from .records import (ALLREDUCE, BROADCAST, GATHERS, REDUCESCATTER, RETUNE,
                      RETUNE_MODES, Signature)

__all__ = ["CHECKS", "first_mismatch"]

#: A check: given the kind and every rank's signature in rank order, a message or None.
Check = Callable[[str, List[Signature]], Optional[str]]


def _field_check(kinds: Optional[Sequence[str]], field: Callable[[Signature], Any],
                 message: Callable[[str, Any, Any], str]) -> Check:
    """A check that every rank's ``field(sig)`` equals rank 0's, for requests of ``kinds``."""
    def check(kind: str, sigs: List[Signature]) -> Optional[str]:
        if kinds is not None and kind not in kinds:
            return None
        mine = field(sigs[0])
        return next((message(kind, mine, field(s)) for s in sigs[1:] if field(s) != mine),
                    None)
    return check


def _device_kind(on_cpu: bool) -> str:
    return "CPU" if on_cpu else "GPU"


def _check_gather_shapes(kind: str, sigs: List[Signature]) -> Optional[str]:
    if kind not in GATHERS:
        return None
    first = sigs[0].shape
    if len(first) == 0:
        return f"Rank zero tried to {kind} a rank-zero tensor."
    for s in sigs[1:]:
        shape = s.shape
        if len(shape) != len(first):
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of rank "
                    f"{len(first)}, but another rank sent a tensor of rank {len(shape)}.")
        for dim in range(1, len(first)):
            if shape[dim] != first[dim]:
                return (f"Mismatched {kind} tensor shapes: One rank sent a tensor with "
                        f"dimension {dim} equal to {first[dim]}, but another rank sent a tensor "
                        f"with dimension {dim} equal to {shape[dim]}.")
    return None


# Horovod's checks, in its order, with its messages
CHECKS: List[Check] = [
    _field_check(None, lambda s: s.dtype, lambda k, a, b: (
        f"Mismatched data types: One rank had type {horovod_dtype_name(a)}, but another rank "
        f"had type {horovod_dtype_name(b)}.")),
    _field_check(None, lambda s: s.kind, lambda k, a, b: (
        f"Mismatched operations: One rank did an {a}, but another rank did an {b}.")),
    _field_check((ALLREDUCE, REDUCESCATTER, BROADCAST), lambda s: s.shape, lambda k, a, b: (
        f"Mismatched {k} tensor shapes: One rank sent a tensor of shape {shape_string(a)}, "
        f"but another rank sent a tensor of shape {shape_string(b)}.")),
    _field_check((ALLREDUCE, REDUCESCATTER), lambda s: (s.prescale, s.postscale), lambda k, a, b: (
        f"Mismatched prescale and/or postscale factors: One rank sent factors ({a[0]:g}, "
        f"{a[1]:g}), but another rank sent factors ({b[0]:g}, {b[1]:g}).")),
    _field_check((ALLREDUCE, REDUCESCATTER), lambda s: s.op, lambda k, a, b: (
        f"Mismatched reduction operation: One rank sent reduction op {a}, but another rank "
        f"sent reduction op {b}.")),
    _check_gather_shapes,
    _field_check((BROADCAST,), lambda s: s.root, lambda k, a, b: (
        f"Mismatched {k} root ranks: One rank specified root rank {a}, but another rank "
        f"specified root rank {b}.")),
    _field_check((RETUNE,), lambda s: s.root, lambda k, a, b: (
        f"Mismatched retune modes: One rank asked for {RETUNE_MODES[a]}, but another rank "
        f"asked for {RETUNE_MODES[b]}.")),
    _field_check(None, lambda s: s.on_host, lambda k, a, b: (
        f"Mismatched {k} CPU/GPU device selection: One rank specified device "
        f"{_device_kind(a)}, but another rank specified device {_device_kind(b)}.")),
]


def first_mismatch(kind: str, sigs: List[Signature]) -> Optional[str]:
    """Horovod's message for the first check that ``sigs`` (rank order) fail, or None."""
    for check in CHECKS:
        error = check(kind, sigs)
        if error is not None:
            return error
    return None
