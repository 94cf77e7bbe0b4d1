"""One protocol for "rank 0 plans, every rank gets the Plan, the ranks check its digest".

``init()`` (:func:`horotopo.bootstrap.setup`) runs it once; a re-plan (the adaptive engine)
runs it again whenever the model changes. It speaks only to the transport, so it runs over
MPI and over a simulator alike:

1. the root calls ``build()`` (the planner, with whatever it needs from the model); any
   exception there becomes a one-line message, so that no rank waits for a plan that never
   comes; a plan that records no allreduce algorithm gets the one predicted fastest on the
   model (:func:`horotopo.algorithms.choice.with_choice`), so that a re-plan carries its
   choice as the init's plan does;
2. the root broadcasts the Plan's JSON and its model's (or the failure) to every rank;
3. every rank rebuilds the Plan, and the ranks compare its digest.

A failure anywhere is raised on every rank as the caller's ``error`` type, with the same text.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable, Dict, Optional, Tuple, Type

from .algorithms.choice import with_choice
from .params import RELIABILITY
from .plan import Plan
from .topology import Topology, from_dict
from .transport.base import Transport, TransportTimeout

__all__ = ["share_plan", "Build"]

#: What the root runs: the Plan and the model it was planned on (None when there is none).
Build = Callable[[], Tuple[Plan, Optional[Topology]]]


def share_plan(transport: Transport, build: Build, *, root: int = 0, what: str = "plan",
               error: Type[Exception] = RuntimeError, failure: str = "planning failed",
               settings_error: Optional[Type[Exception]] = None,
               timeout_s: float = RELIABILITY.plan_timeout_s,
               check_timeout_s: float = RELIABILITY.exchange_timeout_s
               ) -> Tuple[Plan, Optional[Topology]]:
    """Plan on ``root``, broadcast, check digests; collective over ``transport``.

    Parameters
    ----------
    transport : Transport
        Every rank of it calls this.
    build : callable
        Called on ``root`` only: returns ``(plan, topology)``. An exception of type ``error``
        is passed on with its own text; any other, whatever its type, becomes
        ``"{failure}: {type}: {text}"`` (each text cut to its first line). A
        ``KeyboardInterrupt`` or ``SystemExit`` is sent on as such an error, then raised on
        the root as itself.
    root : int
        The rank that plans.
    what : str
        Names the protocol in timeouts (``"init"``, ``"re-plan at call 12"``).
    error : exception type
        What every rank raises on a failure (a build error, a timeout, differing digests).
    failure : str
        Prefix of the message for an unexpected exception in ``build``.
    settings_error : exception type, optional
        A subclass of ``error`` that ``build`` raises for the user's own mistake (a bad
        file named by a setting): every rank raises it as this type, so the job can report
        it as a settings error rather than a failure.
    timeout_s : float
        How long the other ranks wait for the root's plan (the planner may take a while).
    check_timeout_s : float
        How long the digest check waits for every rank.

    Returns
    -------
    (Plan, Topology or None)
        The same plan (same digest) and model on every rank.

    Raises
    ------
    error
        On every rank, with the same message, except for a timeout: that names the ranks
        this rank was missing (the exception's cause is the
        :class:`~horotopo.transport.base.TransportTimeout`, whose ``missing`` lists them).
    """
    payload: Dict[str, Any] = {}
    interrupted: Optional[BaseException] = None
    if transport.rank == root:
        try:
            plan, topology = build()
            if topology is not None and "algorithm" not in plan.planner:
                plan = with_choice(plan, topology)
            payload = {"plan": plan.to_json(),
                       "topology": None if topology is None else topology.to_json()}
        except error as exc:
            payload = {"error": _one_line(str(exc)),
                       "settings": settings_error is not None
                       and isinstance(exc, settings_error)}
        except BaseException as exc:  # noqa: BLE001 - every rank must learn of the failure
            # Anything at all (a RecursionError, a MemoryError, a bug; a KeyboardInterrupt is
            # passed on too, then raised here as itself).
            payload = {"error": f"{failure}: {type(exc).__name__}: {_one_line(str(exc))}"}
            if not isinstance(exc, Exception):
                interrupted = exc
    try:
        data = transport.broadcast_bytes(
            _encode(payload) if transport.rank == root else None, root, timeout_s,
            f"{what}: waiting for the plan")
        failed, plan, model = _decode(bytes(data))
        if interrupted is not None:
            raise interrupted
        if failed is not None:
            settings = settings_error is not None and json.loads(bytes(data)).get("settings")
            raise (settings_error if settings else error)(failed)
        digests = [d.decode() for d in transport.allgather_bytes(
            plan.digest.encode(), check_timeout_s, f"{what}: comparing plans")]
    except TransportTimeout as exc:
        raise error(str(exc)) from exc
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise error(f"plan digest differs across ranks: rank 0 has {digests[0]}, "
                    + ", ".join(f"rank {r} has {digests[r]}" for r in odd))
    return plan, model


#: The longest failure text sent: a message is one line, not a dump of the data.
MAX_MESSAGE_CHARS = 500


def _one_line(text: str) -> str:
    """``text``'s first line, at most :data:`MAX_MESSAGE_CHARS` long."""
    line = text.strip().splitlines()[0] if text.strip() else "(no message)"
    return line if len(line) <= MAX_MESSAGE_CHARS else line[:MAX_MESSAGE_CHARS - 3] + "..."


#: The plan's wall-clock timings (the planner's ``seconds``, ``flat_bound_seconds``), as
#: ``json.dumps`` writes them: ``"key": number``.
_WALL_TIME = re.compile(r'("(?:seconds|flat_bound_seconds)": )(-?[0-9][0-9.eE+-]*)')


def _encode(payload: Dict[str, Any]) -> bytes:
    """The root's broadcast, with every wall-clock timing written to a fixed width.

    The broadcast's size must not depend on how long the planner took: a simulated job
    charges the broadcast its bytes, so ``0.1`` against ``0.0855`` seconds moved every rank's
    start by a few nanoseconds and a simulated allreduce at 256 ranks in its 4th digit. JSON
    allows the padding (spaces before a number); a value is rounded to 4 decimals, as the
    planner records it.
    """
    def fixed(match: "re.Match[str]") -> str:
        return f"{match.group(1)}{float(match.group(2)):14.4f}"
    return _WALL_TIME.sub(fixed, json.dumps(payload)).encode()


@functools.lru_cache(maxsize=2)
def _decode(data: bytes) -> Tuple[Optional[str], Optional[Plan], Optional[Topology]]:
    """The root's broadcast: its error text, or its Plan and model. Kept for the last two
    payloads: the ranks of one process (a simulation's thousands of ranks) receive the same
    bytes and share one immutable Plan and Topology instead of decoding a copy each."""
    got = json.loads(data)
    if "error" in got:
        return got["error"], None, None
    return None, Plan.from_json(got["plan"]), (None if got["topology"] is None
                                               else from_dict(got["topology"]))
