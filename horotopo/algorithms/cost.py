"""Cost model: predicted seconds of the tree allreduce and of MPI_Allreduce for a message size.

Each algorithm costs ``latency + bytes / bandwidth``; the tree adds a per-message cost (the
Python progress loop's overhead per chunk message) to the plan's own prediction
(:meth:`horotopo.plan.Plan.predict_time`), unless a calibration has measured its bandwidth
directly. ``Engine.calibrate()`` times both algorithms at a ladder of sizes on the real ranks and
fits these numbers, so the cut-over comes from measurements, not from a guess.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence, Tuple

from ..plan import Plan

__all__ = ["CostModel", "DEFAULT_COST_MODEL", "fit_line", "messages_per_rank"]


def messages_per_rank(plan: Plan, nbytes: int, chunk_bytes: int) -> float:
    """Chunk messages the busiest rank completes in a tree allreduce of ``nbytes``.

    Per tree and chunk a rank completes about one receive per reduce child, one send up, one
    receive down and one send per broadcast child; this counts that on the busiest rank.
    """
    worst = 0.0
    for v in range(plan.n):
        total = 0.0
        for t in plan.trees:
            part = t.share * nbytes
            if part <= 0:
                continue
            chunks = math.ceil(part / chunk_bytes)
            deg = (sum(1 for p in t.reduce_parent if p == v)
                   + sum(1 for p in t.bcast_parent if p == v)
                   + (2 if t.root != v else 0))
            total += chunks * deg
        worst = max(worst, total)
    return worst


def fit_line(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """Fit ``time = a + bytes / bw`` to ``(bytes, seconds)`` points; returns ``(a, bw)``.

    The fit minimises *relative* squared error (weights ``1 / time**2``), so that on a
    geometric ladder of sizes the small sizes pin the latency and the large ones the bandwidth.
    ``a`` is clamped at 0 and ``bw`` kept finite, so a noisy fit never makes an algorithm free.
    """
    if len(points) < 2:
        raise ValueError("need at least two (bytes, seconds) points to fit")
    sw = swx = swy = swxx = swxy = 0.0
    for x, y in points:
        if y <= 0:
            raise ValueError(f"times must be positive, got {y}")
        w = 1.0 / (y * y)
        sw += w
        swx += w * x
        swy += w * y
        swxx += w * x * x
        swxy += w * x * y
    det = sw * swxx - swx * swx
    slope = (sw * swxy - swx * swy) / det if det > 0 else 0.0
    slope = max(slope, 1e-15)
    a = (swy - slope * swx) / sw
    return max(0.0, a), 1.0 / slope


@dataclass(frozen=True)
class CostModel:
    """Predicted time of each algorithm; every field in seconds or bytes per second.

    Attributes
    ----------
    mpi_latency_s, mpi_Bps
        MPI_Allreduce's fixed cost and algorithm bandwidth; ``mpi_Bps=None`` means the plan's
        ring rate (``plan.ring_Bps``), which is what MPI's large-message algorithms reach on
        the modelled network.
    tree_latency_s
        The tree engine's fixed cost per call (metadata exchange, set-up).
    per_message_s
        Python overhead per chunk message in the progress loop.
    tree_Bps
        Measured tree bandwidth; ``None`` means the plan's prediction.
    """

    mpi_latency_s: float
    mpi_Bps: Optional[float]
    tree_latency_s: float
    per_message_s: float
    tree_Bps: Optional[float] = None
    source: str = "default"

    def tree_time(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> float:
        chunk = chunk_bytes or plan.chunk_bytes
        if nbytes <= 0:
            return self.tree_latency_s
        msgs = messages_per_rank(plan, nbytes, chunk) * self.per_message_s
        if self.tree_Bps:
            return self.tree_latency_s + msgs + nbytes / self.tree_Bps
        return self.tree_latency_s + msgs + plan.predict_time(nbytes, chunk)

    def mpi_time(self, plan: Plan, nbytes: int) -> float:
        bw = self.mpi_Bps or plan.ring_Bps
        if nbytes <= 0 or plan.n == 1:
            return self.mpi_latency_s
        return self.mpi_latency_s + nbytes / bw

    def choose(self, plan: Plan, nbytes: int, chunk_bytes: Optional[int] = None) -> str:
        """``"tree"`` when its predicted time is strictly lower, else ``"mpi"``."""
        if plan.n == 1:
            return "mpi"
        tree = self.tree_time(plan, nbytes, chunk_bytes)
        return "tree" if tree < self.mpi_time(plan, nbytes) else "mpi"

    def cutover_bytes(self, plan: Plan, chunk_bytes: Optional[int] = None,
                      limit: int = 1 << 34) -> Optional[int]:
        """Smallest power-of-two size from which the tree is chosen, or None up to ``limit``."""
        size = 1
        while size <= limit:
            if self.choose(plan, size, chunk_bytes) == "tree":
                return size
            size *= 2
        return None

    def with_(self, **changes: object) -> "CostModel":
        return replace(self, **changes)


# Measured on the development box (2 cores shared with other jobs, load 13-16, MPICH 5 over
# shared memory, 4 ranks) with `mpiexec -n 4 python benchmarks/engine_overhead.py`: the
# engine's 8-byte MPI path (100 us), 8-byte tree allreduce (6.6 ms: six hops, each waiting for
# a descheduled rank) and the wall time per chunk message (34 us). With these, a plan that is
# no faster than ring on its model always goes to MPI_Allreduce, and a plan much faster than
# ring goes to the tree above a few tens of KiB. Engine.calibrate() replaces them with
# measurements on the real ranks (and then a measured tree bandwidth replaces the model's).
DEFAULT_COST_MODEL = CostModel(mpi_latency_s=100e-6, mpi_Bps=None, tree_latency_s=6.6e-3,
                               per_message_s=34e-6)
