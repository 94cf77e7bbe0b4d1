"""A quick, targeted re-probe: measure only the suspect directed pairs, one at a time.

It is the probe's own pairwise test (:func:`horotopo.probe.measure_pairs`: warm-up, then timed
bytes of adaptive size, the receiver's timing) with the ``quick`` settings and a short target,
so a handful of pairs costs a fraction of a second on a 1 gbps network. Collective: every rank
calls it with the same pairs.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager, Dict, Sequence, Tuple

from ..params import ADAPT, AdaptParams
from ..probe import measure_pairs
from ..transport.base import Transport

__all__ = ["probe_pairs", "true_size"]

Pair = Tuple[int, int]


def probe_pairs(transport: Transport, pairs: Sequence[Pair], *,
                params: AdaptParams = ADAPT) -> Dict[Pair, float]:
    """Bytes/s of each directed pair in ``pairs``, measured alone; the same dict on every rank.

    Parameters
    ----------
    transport : Transport
        Every rank of it must call this with the same ``pairs``.
    pairs : sequence of (src, dst)
    params : AdaptParams
        The re-probe's aimed transfer time, timeout (a transfer that takes longer is a
        :class:`horotopo.probe.ProbeError` naming the pair) and time bound.
    """
    with true_size(transport):
        return measure_pairs(transport, pairs, "quick", target_s=params.reprobe_target_s,
                             timeout_s=params.reprobe_timeout_s,
                             budget_s=params.reprobe_budget_s)


def true_size(transport: Any) -> ContextManager[Any]:
    """The context in which ``transport`` charges messages their true size.

    A simulated transport charges the engine's messages ``scale`` times their bytes (ranks hold
    small arrays while the network carries full-size buffers); a probe's transfers are sized to
    be timed, so inside a probe they must cost what they hold, or every rate reads ``scale``
    times too low. Other transports charge true sizes anyway (a no-op context).
    """
    enter = getattr(transport, "true_size", None)
    return enter() if enter is not None else nullcontext()
