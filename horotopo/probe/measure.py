"""The collective measurements of the probe (the half that touches MPI).

Every rank calls :func:`probe` together. The phases:

1. Latency: ping-pong between every pair, the pairs of each circle-method round at once.
2. Bandwidth: every ordered pair, both directions at once, in circle-method order. By default
   one pair runs at a time: disjoint pairs are not independent when they cross a shared
   uplink (the very thing the probe looks for), so running a round's pairs together would
   understate the pairwise figures. ``concurrent_pairs=True`` runs each round at once, which is
   ``n / 2`` times faster and exact on non-blocking fabrics.
3. Shared bottlenecks: the ranks are clustered by their pairwise rates, and every two groups
   run a concurrent test (``a_k <-> b_k`` for ``k < min(|A|, |B|)``).
4. Host limits: fan-out and fan-in at each rank (one rank sends to all others and all others
   send to it, at once).

A transfer is timed by its sender, from the start until the receiver's one-byte
acknowledgement arrives, less the pair's round-trip time. Message size adapts until a transfer
lasts about ``target_s``; repeats continue until the two best samples agree within
``tolerance``. After every attempt the ranks combine their timings with a max-allreduce, so every
rank holds every figure and takes the same decisions (sizes, repeats, budget) from the same
numbers; local clocks never steer the schedule.

The inference itself (groups, shared resources, binding caps, the document) is pure and lives in
:mod:`horotopo.probe.infer`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..topology import GBPS_TO_BPS
from ._mpi import ProbeError, allgather_json, allreduce_max, wait_all
from .infer import (DEFAULT_GAP, DEFAULT_MARGIN, build_document, circle_rounds, cluster_ranks,
                    group_tests)

__all__ = ["ProbeConfig", "probe", "MODES"]

Pair = Tuple[int, int]
TAG_PING, TAG_PONG, TAG_DATA, TAG_ACK = 0x5101, 0x5102, 0x5103, 0x5104

# quick: for init(); full: the default of `horotopo probe`, at most about 10 s for 8 ranks.
MODES: Dict[str, Dict[str, Any]] = {
    "quick": dict(target_s=0.008, max_bytes=4 << 20, tolerance=0.10, min_samples=2,
                  max_samples=3, ping_reps=5, budget_s=4.0),
    "full": dict(target_s=0.025, max_bytes=16 << 20, tolerance=0.05, min_samples=2,
                 max_samples=5, ping_reps=20, budget_s=9.0),
}


@dataclass(frozen=True)
class ProbeConfig:
    """How hard the probe measures. Build one with :meth:`for_mode`.

    Attributes
    ----------
    mode : str
        ``"quick"`` or ``"full"``.
    target_s : float
        Aimed duration of one timed transfer; shorter ones (below half) grow the message.
    min_bytes, max_bytes, start_bytes : int
        Message size bounds per transfer, and the first size tried.
    tolerance : float
        Repeats stop once the two best samples of every figure agree within this fraction.
    min_samples, max_samples : int
        Repeats per test.
    ping_reps : int
        Ping-pongs per pair (after one warm-up that also opens the connection).
    timeout_s : float
        A wait longer than this is an error naming the pair.
    budget_s : float
        Past this (measured on the common clock), every test takes a single sample.
    concurrent_pairs : bool
        Run the pairs of a circle-method round at once (see module docstring).
    gap, margin : float
        Clustering gap and "clearly below" margin, see :mod:`horotopo.probe.infer`.
    """

    mode: str = "full"
    target_s: float = 0.025
    min_bytes: int = 4 << 10
    max_bytes: int = 16 << 20
    start_bytes: int = 64 << 10
    tolerance: float = 0.05
    min_samples: int = 2
    max_samples: int = 5
    ping_reps: int = 20
    timeout_s: float = 10.0
    budget_s: float = 9.0
    concurrent_pairs: bool = False
    gap: float = DEFAULT_GAP
    margin: float = DEFAULT_MARGIN

    @classmethod
    def for_mode(cls, mode: str = "full", **overrides: Any) -> "ProbeConfig":
        """The preset for ``mode`` (``quick`` or ``full``) with ``overrides`` applied."""
        if mode not in MODES:
            raise ValueError(f"probe mode must be one of {', '.join(MODES)}, got {mode!r}")
        cfg = replace(cls(mode=mode, **MODES[mode]), **overrides)
        cfg.check()
        return cfg

    def check(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        if not (0 < self.target_s < 10):
            raise ValueError(f"target_s: must be in (0, 10) seconds, got {self.target_s!r}")
        if not (1 <= self.min_bytes <= self.start_bytes <= self.max_bytes):
            raise ValueError(f"need 1 <= min_bytes <= start_bytes <= max_bytes, got "
                             f"{self.min_bytes}, {self.start_bytes}, {self.max_bytes}")
        if not (1 <= self.min_samples <= self.max_samples):
            raise ValueError(f"need 1 <= min_samples <= max_samples, got {self.min_samples}, "
                             f"{self.max_samples}")
        if self.ping_reps < 1:
            raise ValueError(f"ping_reps: must be at least 1, got {self.ping_reps}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be positive, got {self.timeout_s!r}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance: must be in (0, 1), got {self.tolerance!r}")


@dataclass
class _Figures:
    """Samples of one test: per flow and per aggregate subset."""

    flows: int
    subsets: Sequence[Sequence[int]]
    flow_samples: List[List[float]] = field(default_factory=list)
    subset_samples: List[List[float]] = field(default_factory=list)

    def add(self, flow_rates: np.ndarray, subset_rates: Sequence[float]) -> None:
        self.flow_samples.append([float(v) for v in flow_rates])
        self.subset_samples.append([float(v) for v in subset_rates])

    @staticmethod
    def _best(samples: List[float]) -> Tuple[float, float]:
        s = sorted(samples, reverse=True)
        # The second best: a single high outlier (a token bucket's burst) is discarded, and
        # low outliers (a descheduled rank) never count.
        est = s[1] if len(s) > 1 else s[0]
        spread = (s[0] - s[1]) / s[0] if len(s) > 1 else math.inf
        return est, spread

    def estimates(self) -> Tuple[np.ndarray, np.ndarray, float]:
        """(per-flow rates, per-subset rates, worst spread)."""
        worst = 0.0
        flows = []
        for f in range(self.flows):
            est, spread = self._best([s[f] for s in self.flow_samples])
            flows.append(est)
            worst = max(worst, spread)
        subs = []
        for k in range(len(self.subsets)):
            est, spread = self._best([s[k] for s in self.subset_samples])
            subs.append(est)
            worst = max(worst, spread)
        return np.array(flows), np.array(subs), worst


def _pow2(x: float, lo: int, hi: int) -> int:
    v = lo
    while v < x and v < hi:
        v *= 2
    return min(v, hi)


class _Prober:
    """State of one collective probe on a private duplicate of the communicator."""

    def __init__(self, comm: Any, cfg: ProbeConfig, progress: Callable[[str], None]):
        self.cfg = cfg
        self.say = progress
        self.t0 = time.perf_counter()
        # Idup, not Dup: a rank that never arrives must be a timeout, not a hang.
        self.comm, req = comm.Idup()
        wait_all([req], time.perf_counter() + cfg.timeout_s,
                 f"probe start: not every rank of the {comm.size} arrived within "
                 f"{cfg.timeout_s:g} s")
        self.rank = self.comm.rank
        self.n = self.comm.size
        self.hosts: List[str] = []
        self.rtt = np.zeros((self.n, self.n))
        self.clock = 0.0  # seconds since the start, the max over ranks (same on every rank)
        self.tests = 0
        self._send = np.zeros(0, dtype=np.uint8)
        self._recv: List[np.ndarray] = []
        self._last_say = time.perf_counter()

    # ---- helpers ---------------------------------------------------------------------------

    def _who(self, r: int) -> str:
        return f"rank {r} ({self.hosts[r]})" if self.hosts else f"rank {r}"

    def _sendbuf(self, nbytes: int) -> np.ndarray:
        if len(self._send) < nbytes:
            self._send = np.ones(nbytes, dtype=np.uint8)
        return self._send[:nbytes]

    def _recvbuf(self, slot: int, nbytes: int) -> np.ndarray:
        while len(self._recv) <= slot:
            self._recv.append(np.zeros(0, dtype=np.uint8))
        if len(self._recv[slot]) < nbytes:
            self._recv[slot] = np.empty(nbytes, dtype=np.uint8)
        return self._recv[slot][:nbytes]

    def _sync(self, local: np.ndarray, what: str) -> np.ndarray:
        """Max-allreduce of ``local`` plus the common clock (the last element)."""
        vec = np.append(local, time.perf_counter() - self.t0)
        out = allreduce_max(self.comm, vec, self.cfg.timeout_s, what)
        self.clock = float(out[-1])
        return out[:-1]

    def _progress(self, msg: str, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self._last_say >= 1.0:
            self._last_say = now
            self.say(f"[probe {now - self.t0:6.2f} s] {msg}")

    # ---- phase 1: latency ------------------------------------------------------------------

    def latency(self) -> None:
        from mpi4py import MPI

        cfg = self.cfg
        local = np.zeros((self.n, self.n))
        ping = np.zeros(8, dtype=np.uint8)
        pong = np.zeros(8, dtype=np.uint8)
        for pairs in circle_rounds(self.n):
            for a, b in pairs:
                if self.rank not in (a, b):
                    continue
                other = b if self.rank == a else a
                samples = []
                for rep in range(cfg.ping_reps + 1):
                    deadline = time.perf_counter() + cfg.timeout_s
                    what = (f"{self._who(self.rank)} cannot reach {self._who(other)}: no "
                            f"{'reply' if self.rank == a else 'ping'} within {cfg.timeout_s:g} s")
                    if self.rank == a:
                        t = time.perf_counter()
                        reqs = [self.comm.Irecv([pong, MPI.BYTE], source=b, tag=TAG_PONG),
                                self.comm.Isend([ping, MPI.BYTE], dest=b, tag=TAG_PING)]
                        wait_all(reqs, deadline, what, busy=True)
                        samples.append(time.perf_counter() - t)
                    else:
                        wait_all([self.comm.Irecv([ping, MPI.BYTE], source=a, tag=TAG_PING)],
                                 deadline, what, busy=True)
                        wait_all([self.comm.Isend([pong, MPI.BYTE], dest=a, tag=TAG_PONG)],
                                 deadline, what, busy=True)
                if self.rank == a:
                    # the first round trip opens the connection; it is not a latency
                    rtt = float(np.median(samples[1:]))
                    local[a, b] = local[b, a] = rtt
        self.rtt = self._sync(local.ravel(), "latency phase").reshape(self.n, self.n)

    # ---- the timed transfer ------------------------------------------------------------------

    def _run_flows(self, flows: Sequence[Pair], nbytes: int) -> np.ndarray:
        """One attempt: every flow moves ``nbytes`` at once; returns this rank's timings."""
        from mpi4py import MPI

        me = self.rank
        elapsed = np.zeros(len(flows))
        acks = np.zeros(len(flows) + 1, dtype=np.uint8)
        reqs: List[Any] = []
        kinds: List[Tuple[str, int]] = []
        slot = 0
        for f, (s, d) in enumerate(flows):
            if d == me:
                reqs.append(self.comm.Irecv([self._recvbuf(slot, nbytes), MPI.BYTE], source=s,
                                            tag=TAG_DATA))
                kinds.append(("data", f))
                slot += 1
            if s == me:
                reqs.append(self.comm.Irecv([acks[f:f + 1], MPI.BYTE], source=d, tag=TAG_ACK))
                kinds.append(("ack", f))
        if not reqs:
            return elapsed
        send = self._sendbuf(nbytes)
        t0 = time.perf_counter()
        for f, (s, d) in enumerate(flows):
            if s == me:
                reqs.append(self.comm.Isend([send, MPI.BYTE], dest=d, tag=TAG_DATA))
                kinds.append(("send", f))

        def on_done(k: int) -> None:
            kind, f = kinds[k]
            if kind == "data":
                reqs.append(self.comm.Isend([acks[-1:], MPI.BYTE], dest=flows[f][0],
                                            tag=TAG_ACK))
                kinds.append(("ackout", f))
            elif kind == "ack":
                elapsed[f] = time.perf_counter() - t0

        def describe(pending: List[int]) -> str:
            kind, f = kinds[pending[0]]
            s, d = flows[f]
            return (f"{self._who(s)} -> {self._who(d)}: a {nbytes}-byte transfer did not "
                    f"complete within {self.cfg.timeout_s:g} s (rank {me} waiting on its "
                    f"{'receive' if kind == 'data' else 'send' if kind == 'send' else 'ack'})")

        wait_all(reqs, time.perf_counter() + self.cfg.timeout_s, describe, busy=True,
                 on_done=on_done)
        return elapsed

    def measure(self, flows: Sequence[Pair], subsets: Sequence[Sequence[int]], label: str,
                start: int) -> Tuple[np.ndarray, np.ndarray, int]:
        """Adaptive test: per-flow rates and per-subset aggregates (bytes/s), and the size used.

        Every rank calls this with the same ``flows``; ranks not in any flow only join the
        max-allreduce that ends each attempt.
        """
        cfg = self.cfg
        self.tests += 1
        rtt = np.array([self.rtt[s, d] for s, d in flows])
        figures = _Figures(len(flows), subsets)
        nbytes = start
        for attempt in range(cfg.max_samples + 12):
            elapsed = self._sync(self._run_flows(flows, nbytes), label)
            if np.any(elapsed <= 0):
                f = int(np.argmin(elapsed))
                raise ProbeError(f"{self._who(flows[f][0])} -> {self._who(flows[f][1])}: a "
                                 f"transfer measured zero time ({label})")
            # The acknowledgement adds a round trip; never let the correction eat more than
            # half the timing (latency-bound attempts grow the message instead).
            busy = np.maximum(elapsed - rtt, 0.5 * elapsed)
            span = float(busy.max())
            if span < cfg.target_s / 2 and nbytes < cfg.max_bytes:
                grow = max(2.0, min(64.0, cfg.target_s / span))
                nbytes = _pow2(nbytes * grow, cfg.min_bytes, cfg.max_bytes)
                continue
            subset_rates = []
            for sub in subsets:
                t = max(float(elapsed[sub].max() - rtt[sub].max()), 0.5 * float(elapsed[sub].max()))
                subset_rates.append(len(sub) * nbytes / t)
            figures.add(nbytes / busy, subset_rates)
            _, _, spread = figures.estimates()
            have = len(figures.flow_samples)
            over_budget = self.clock > cfg.budget_s
            if have >= cfg.max_samples or (have >= cfg.min_samples and spread <= cfg.tolerance) \
                    or over_budget:
                break
            # keep each attempt near target_s: the first size may have overshot on a slow path
            nbytes = _pow2(nbytes * cfg.target_s / span, cfg.min_bytes, cfg.max_bytes)
        if not figures.flow_samples:
            raise ProbeError(f"{label}: no usable sample within {cfg.max_samples + 12} attempts")
        rates, subs, _ = figures.estimates()
        return rates, subs, nbytes

    # ---- phases 2 to 4 -----------------------------------------------------------------------

    def pairs(self) -> np.ndarray:
        n = self.n
        bw = np.full((n, n), np.nan)
        rounds = circle_rounds(n)
        tests = [r for r in rounds] if self.cfg.concurrent_pairs else [[p] for r in rounds
                                                                         for p in r]
        size = self.cfg.start_bytes
        done = 0
        total = n * (n - 1) // 2
        for k, pairs in enumerate(tests):
            flows = [f for a, b in pairs for f in ((a, b), (b, a))]
            rates, _, size = self.measure(flows, [], f"bandwidth {pairs}", size)
            for (s, d), r in zip(flows, rates):
                bw[s, d] = r
            done += len(pairs)
            self._progress(f"bandwidth: {done}/{total} pairs")
        return bw

    def concurrent(self, groups: List[List[int]], bw: np.ndarray
                   ) -> List[Tuple[int, int, List[Pair], float]]:
        results = []
        for test in group_tests(groups):
            flows = list(test.flows)
            slowest = min(bw[s, d] for s, d in flows)
            start = _pow2(slowest * self.cfg.target_s, self.cfg.min_bytes, self.cfg.max_bytes)
            _, agg, _ = self.measure(flows, [list(test.forward), list(test.backward)],
                                     f"concurrent group {test.src} <-> group {test.dst}", start)
            results.append((test.src, test.dst, [flows[f] for f in test.forward], float(agg[0])))
            results.append((test.dst, test.src, [flows[f] for f in test.backward], float(agg[1])))
            self._progress(f"concurrent group {test.src} <-> {test.dst}: "
                           f"{agg[0] * 8 / 1e9:.3f} / {agg[1] * 8 / 1e9:.3f} gbps", force=True)
        return results

    def fans(self, bw: np.ndarray) -> Tuple[List[float], List[float]]:
        n = self.n
        out, inn = [0.0] * n, [0.0] * n
        for k in range(n):
            others = [j for j in range(n) if j != k]
            flows = [(k, j) for j in others] + [(j, k) for j in others]
            m = len(others)
            # split the target time over the flows: together they move about rate * target
            slowest = min(bw[s, d] for s, d in flows)
            start = _pow2(slowest * self.cfg.target_s / 2, self.cfg.min_bytes, self.cfg.max_bytes)
            _, agg, _ = self.measure(flows, [list(range(m)), list(range(m, 2 * m))],
                                     f"fan-out/fan-in at rank {k}", start)
            out[k], inn[k] = float(agg[0]), float(agg[1])
            self._progress(f"host limits: {k + 1}/{n} ranks")
        return out, inn


def probe(comm: Any, mode: str = "full", *, name: Optional[str] = None,
          progress: Optional[Callable[[str], None]] = None, **overrides: Any) -> Dict[str, Any]:
    """Measure the network between the ranks of ``comm``; collective.

    Parameters
    ----------
    comm : mpi4py communicator
    mode : str
        ``"full"`` (the default of ``horotopo probe``; about 10 s at most for 8 ranks) or
        ``"quick"`` (what ``init()`` runs by default).
    name : str, optional
        Name of the document (default ``"probed-<n>"``).
    progress : callable, optional
        Receives one-line progress messages (give it on rank 0 only).
    **overrides
        Fields of :class:`ProbeConfig` (``max_bytes``, ``timeout_s``, ``concurrent_pairs``...).

    Returns
    -------
    dict
        The measured-topology document (DESIGN.md), the same on every rank; it loads with
        :func:`horotopo.topology.from_dict`. Extra figures are under its ``"probe"`` key.

    Raises
    ------
    ProbeError
        A pair that cannot reach each other, a timeout or a zero measurement; the message names
        the pair.
    """
    cfg = ProbeConfig.for_mode(mode, **overrides)
    say = progress or (lambda msg: None)
    from mpi4py import MPI

    pr = _Prober(comm, cfg, say)
    try:
        pr.hosts = [str(h) for h in allgather_json(pr.comm, MPI.Get_processor_name(),
                                                   cfg.timeout_s, "probe: host names")]
        n = pr.n
        groups: List[List[int]] = [list(range(n))]
        shared: List[Tuple[int, int, List[Pair], float]] = []
        fan_out = fan_in = None
        bw = np.full((n, n), np.nan)
        if n > 1:
            pr._progress(f"latency: {n * (n - 1) // 2} pairs", force=True)
            pr.latency()
            pr._progress(f"bandwidth: {n * (n - 1) // 2} pairs, "
                         f"{'a round' if cfg.concurrent_pairs else 'one pair'} at a time",
                         force=True)
            bw = pr.pairs()
            groups = cluster_ranks(bw, gap=cfg.gap)
            if len(groups) > 1:
                pr._progress(f"groups by rate: {groups}", force=True)
                shared = pr.concurrent(groups, bw)
            if n > 2:
                pr._progress("host limits: fan-out and fan-in", force=True)
                fan_out, fan_in = pr.fans(bw)
        to_gbps = 1.0 / GBPS_TO_BPS
        meta = {"mode": cfg.mode, "seconds": round(pr.clock, 3), "tests": pr.tests,
                "concurrent_pairs": cfg.concurrent_pairs}
        doc = build_document(
            name or f"probed-{n}", pr.hosts,
            [[None if i == j else bw[i, j] * to_gbps for j in range(n)] for i in range(n)],
            [[None if i == j else pr.rtt[i, j] / 2 * 1e3 for j in range(n)] for i in range(n)],
            fan_out_gbps=None if fan_out is None else [v * to_gbps for v in fan_out],
            fan_in_gbps=None if fan_in is None else [v * to_gbps for v in fan_in],
            shared_results=[(a, b, f, v * to_gbps) for a, b, f, v in shared],
            groups=groups, gap=cfg.gap, margin=cfg.margin, meta=meta)
        pr._progress(f"done: {pr.tests} tests", force=True)
        return doc
    finally:
        try:
            pr.comm.Free()
        except Exception:  # noqa: BLE001 - after an error the communicator may be unusable
            pass
