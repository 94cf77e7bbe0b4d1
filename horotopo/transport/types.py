"""The names the transport's modules share: the control ops, how a wait is named, and the
point-to-point calls that the collective steps (:mod:`horotopo.transport.p2p`) are written
against. :class:`~horotopo.transport.base.Transport` provides these calls; keeping their shape
here lets the steps and the transport class import it without importing each other.
"""
from __future__ import annotations

from typing import Any, Callable, List, Literal, Optional, Protocol, Sequence, Tuple, Union

from ..ops import Reduction

__all__ = ["ControlOp", "Describe", "PointToPoint", "ReduceOp"]

#: The data reductions: the package's one op vocabulary (:mod:`horotopo.ops`), here under the
#: name the transport's callers know.
ReduceOp = Reduction
#: The control steps' ops: the reductions, and a bitwise AND for vectors of flag bits.
ControlOp = Union[Reduction, Literal["band"]]
#: How a wait is named in its timeout: a text, or a callable given the pending indices.
Describe = Union[str, Callable[[List[int]], str]]


class PointToPoint(Protocol):
    """What the collective steps need of a transport: its place in the job, tags, nonblocking
    messages and their progress, and its clock. Every
    :class:`~horotopo.transport.base.Transport` has these."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def isend(self, buf: Any, dest: int, tag: int) -> Any: ...

    def irecv(self, buf: Any, source: int, tag: int) -> Any: ...

    def test(self, request: Any) -> bool: ...

    def waitsome(self, requests: Sequence[Any]) -> List[int]: ...

    def wait(self, requests: List[Any], deadline: Optional[float], *,
             peers: Optional[Sequence[int]] = None, what: Describe = "wait",
             on_done: Any = None, busy: bool = False, spin_polls: int = 0,
             nap_s: Optional[Tuple[float, float]] = ...) -> None: ...

    def cancel(self, request: Any) -> None: ...

    def alloc_tags(self, count: int) -> int: ...

    def now(self) -> float: ...
