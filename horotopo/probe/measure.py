"""The collective measurements of the probe (the half that talks to the other ranks).

Every rank calls :func:`probe` together, over a :class:`~horotopo.transport.base.Transport`
(MPI's, or any other: the probe never touches MPI itself). The phases:

1. Latency: ping-pong between every pair, just before the pair's bandwidth test.
2. Bandwidth: every ordered pair, in circle-method order, one direction at a time (both at once
   measure low through a shaped link with a deep queue: each stream's TCP acknowledgements
   wait behind the other's data). By default one pair runs at a time: disjoint pairs are not
   independent when they cross a shared uplink (the very thing the probe looks for), so
   running a round's pairs together would understate the pairwise figures. ``concurrent_pairs=True`` runs each round at once, which is
   ``n / 2`` times faster and exact on non-blocking fabrics.
3. Shared bottlenecks: the ranks are clustered by their pairwise rates (at every gap between
   rate levels: hosts, racks...), and every two groups run concurrent tests (``a_k -> b_k``
   for ``k < min(|A|, |B|)``, then the reverse); with three groups or more, each group also
   against all the others.
4. Host limits: fan-out and fan-in at each rank (one rank sends to all others at once, then
   all others send to it).

A transfer is a warm-up (which drains token buckets and opens the TCP window) followed, back to
back, by the timed bytes; the receiver times from the end of one to the end of the other, and
the sender's time until the receiver acknowledges the last byte guards that window against a
receiver that noticed the warm-up's end late. Message size adapts until a transfer lasts about
``target_s``; repeats continue until the two best samples agree within ``tolerance``. After every attempt the ranks combine their timings with a max-allreduce, so every
rank holds every figure and takes the same decisions (sizes, repeats, budget) from the same
numbers; local clocks never steer the schedule.

The inference itself (groups, shared resources, binding caps, the document) is pure and lives in
:mod:`horotopo.probe.infer`.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..topology import GBPS_TO_BPS
from ..transport.base import Transport, TransportTimeout
from ..transport.p2p import Describe
from .infer import (DEFAULT_GAP, DEFAULT_MARGIN, ExtensionTest, GroupTest, build_document,
                    circle_rounds, cluster_levels, cluster_ranks, expected_rates,
                    extension_tests, group_tests, infer_all, infer_shared)

__all__ = ["ProbeConfig", "ProbeError", "probe", "measure_pairs", "MODES"]

Pair = Tuple[int, int]
# Offsets in the block of tags each exchange takes from the transport (alloc_tags): every rank
# runs the same exchanges in the same order, so the blocks agree without communication.
TAG_PING, TAG_PONG = 0, 1
TAG_WARM, TAG_DATA, TAG_ACK = 0, 1, 2


class ProbeError(RuntimeError):
    """A measurement that cannot be made: an unreachable pair, a timeout, a zero rate."""

# The time bound: a test costs about PAIR_COST times its target (growing the message, then
# the samples) plus TEST_OVERHEAD_S (the allreduces); a concurrent test aims SUBSET_FACTOR
# times longer. Past the budget, targets shrink down to MIN_TARGET_S.
PAIR_COST = 5.0
SUBSET_FACTOR = 2.0
TEST_OVERHEAD_S = 0.01
MIN_TARGET_S = 0.004

# quick: for init(); full: the default of `horotopo probe`, at most about 10 s for 8 ranks.
MODES: Dict[str, Dict[str, Any]] = {
    "quick": dict(target_s=0.008, max_bytes=4 << 20, tolerance=0.10, min_samples=2,
                  max_samples=3, ping_reps=5, budget_s=4.0),
    "full": dict(target_s=0.020, max_bytes=16 << 20, tolerance=0.08, min_samples=2,
                 max_samples=3, ping_reps=10, budget_s=8.5),
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
    warm_bytes : int
        Each timed message follows a warm-up of ``min(size, max(size / 4, warm_bytes))``.
    chunk_bytes : int
        Warm-up and timed bytes go as trains of messages of at most this size (MPICH over
        UCX moved single messages of a few MiB unevenly in our runs).
    tolerance : float
        Repeats stop once the two best samples of every figure agree within this fraction.
    min_samples, max_samples : int
        Repeats per test.
    ping_reps : int
        Ping-pongs per pair (after one warm-up that also opens the connection).
    timeout_s : float
        A wait longer than this is an error naming the pair.
    budget_s : float
        The probe's time bound: transfers shorten (down to ``MIN_TARGET_S``) so that the tests
        left fit in it, and past it every test takes a single sample.
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
    warm_bytes: int = 256 << 10
    chunk_bytes: int = 1 << 20
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
        if self.warm_bytes < 1 or self.chunk_bytes < 1:
            raise ValueError(f"warm_bytes and chunk_bytes: must be positive, got "
                             f"{self.warm_bytes}, {self.chunk_bytes}")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s: must be positive, got {self.budget_s!r}")
        if not self.gap > 1:
            raise ValueError(f"gap: a ratio between rate levels, must be above 1, got {self.gap!r}")
        if not 0 < self.margin < 1:
            raise ValueError(f"margin: must be in (0, 1), got {self.margin!r}")
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
    def _best(samples: List[float], tolerance: float) -> Tuple[float, bool]:
        """(estimate, stable): the second best sample, stable once the best two agree.

        The best two, because what is left of the noise after the sender's guard (see
        ``_run_flows``) only slows a sample down: a descheduled rank, another process on the
        link's CPU. The second, so that one lucky sample does not make the figure.
        """
        s = sorted(samples, reverse=True)
        if len(s) < 2:
            return s[0], False
        return s[1], (s[0] - s[1]) <= tolerance * s[0]

    def estimates(self, tolerance: float) -> Tuple[np.ndarray, np.ndarray, bool]:
        """(per-flow rates, per-subset rates, whether every figure is stable)."""
        stable = True
        flows = []
        for f in range(self.flows):
            est, ok = self._best([s[f] for s in self.flow_samples], tolerance)
            flows.append(est)
            stable &= ok
        subs = []
        for k in range(len(self.subsets)):
            est, ok = self._best([s[k] for s in self.subset_samples], tolerance)
            subs.append(est)
            stable &= ok
        return np.array(flows), np.array(subs), stable


def _span(ranks: Sequence[int]) -> str:
    return "ranks " + ",".join(str(r) for r in ranks)


def _pow2(x: float, lo: int, hi: int) -> int:
    v = lo
    while v < x and v < hi:
        v *= 2
    return min(v, hi)


class _Prober:
    """State of one collective probe over a transport (its tags keep the probe's messages
    apart from anything else on it)."""

    def __init__(self, transport: Transport, cfg: ProbeConfig,
                 progress: Callable[[str], None]):
        self.cfg = cfg
        self.say = progress
        self.t0 = time.perf_counter()
        self.transport = transport
        # A rank that never arrives must be a timeout naming it, not a hang.
        with _as_probe_error():
            transport.barrier(cfg.timeout_s, "probe start")
        self.rank = transport.rank
        self.n = transport.size
        self.hosts: List[str] = []
        self.rtt = np.zeros((self.n, self.n))
        self.clock = 0.0  # seconds since the start, the max over ranks (same on every rank)
        self.target = cfg.target_s
        self.spent = 0.0  # modelled transfer seconds of the tests so far (PAIR_COST * target)
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
        vec = np.append(np.asarray(local, dtype=np.float64), time.perf_counter() - self.t0)
        with _as_probe_error():
            self.transport.allreduce_control(vec, "max", self.cfg.timeout_s, what)
        self.clock = float(vec[-1])
        return vec[:-1]

    def _wait(self, requests: List[Any], deadline: float, what: Describe, *,
              peers: List[int], on_done: Optional[Callable[[int], None]] = None) -> None:
        """The transport's wait for ranks moving data (they yield, not sleep, between polls:
        a transfer's end must be noticed at once)."""
        with _as_probe_error():
            self.transport.wait(requests, deadline, peers=peers, what=what, on_done=on_done,
                                busy=True)

    def _progress(self, msg: str, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self._last_say >= 1.0:
            self._last_say = now
            self.say(f"[probe {now - self.t0:6.2f} s] {msg}")

    # ---- phase 1: latency ------------------------------------------------------------------

    def latency(self, pairs: Sequence[Pair]) -> None:
        """Ping-pong between each of ``pairs`` (all at once); every rank learns the fastest."""
        cfg = self.cfg
        n = self.n
        t = self.transport
        tags = t.alloc_tags(2)  # on every rank, in or out of the pairs
        local = np.zeros((n, n))
        ping = np.zeros(8, dtype=np.uint8)
        pong = np.zeros(8, dtype=np.uint8)
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
                    start = time.perf_counter()
                    reqs = [t.irecv(pong, b, tags + TAG_PONG), t.isend(ping, b, tags + TAG_PING)]
                    self._wait(reqs, deadline, what, peers=[b, b])
                    samples.append(time.perf_counter() - start)
                else:
                    self._wait([t.irecv(ping, a, tags + TAG_PING)], deadline, what, peers=[a])
                    self._wait([t.isend(pong, a, tags + TAG_PONG)], deadline, what, peers=[a])
            if self.rank == a:
                # The first round trip opens the connection; it is not a latency. The fastest
                # of the rest is the link's: slower ones waited for a descheduled rank, which
                # the planner would turn into needlessly large chunks.
                local[a, b] = local[b, a] = float(np.min(samples[1:]))
        got = self._sync(local.ravel(), f"latency {list(pairs)}").reshape(n, n)
        for a, b in pairs:
            self.rtt[a, b], self.rtt[b, a] = got[a, b], got[b, a]

    # ---- the timed transfer ------------------------------------------------------------------

    def _warm(self, nbytes: int) -> int:
        return min(nbytes, max(nbytes // 4, self.cfg.warm_bytes))

    def _run_flows(self, flows: Sequence[Pair], sizes: Sequence[int]) -> np.ndarray:
        """One attempt: flow ``f`` times ``sizes[f]`` bytes, all flows at once.

        The sender sends a warm-up and then the timed bytes back to back, as trains of
        messages of at most ``chunk_bytes``; the receiver has posted every receive beforehand
        and times from the end of the warm-up to the end of the timed bytes. The warm-up
        drains token buckets and switch buffers and opens the TCP window, and because the link
        never idles between the two, nothing refills: an idle gap (waiting for an
        acknowledgement, say) would let a token bucket pass the next bytes at line rate and
        make the link look faster than it is.

        A receiver that is descheduled when the warm-up ends notices it late, while the kernel
        keeps buffering the timed bytes, so its window can come out short; the sender's view
        guards against that: it times from the start until the receiver's one-byte
        acknowledgement of the last byte, which can only come late.

        Returns this rank's timings, 0 for flows it takes no part in: ``3 * len(flows)``
        values: the receivers' timed windows; the receivers' times from the call until each
        flow's last byte (the start is common to all ranks within a latency: everyone has just
        left the same allreduce), which is what concurrent aggregates are computed from; and
        the senders' times from the call until the acknowledgement.
        """
        me = self.rank
        cfg = self.cfg
        t = self.transport
        tags = t.alloc_tags(3)  # on every rank, in a flow or not
        chunk = cfg.chunk_bytes
        entry = time.perf_counter()
        m = len(flows)
        elapsed = np.zeros(3 * m)
        warm_end = np.zeros(m)
        ack = np.zeros(m + 1, dtype=np.uint8)
        left = {}
        reqs: List[Any] = []
        kinds: List[Tuple[str, int]] = []
        peers: List[int] = []
        send = self._sendbuf(max(sizes))
        warm = [self._warm(n) for n in sizes]
        slot = 0
        for f, (s, d) in enumerate(flows):
            if d != me:
                continue
            buf = self._recvbuf(slot, max(sizes[f], warm[f]))
            slot += 1
            left[f] = [0, 0]
            for kind, total, tag, step in (("warm-up", warm[f], TAG_WARM, chunk),
                                           ("timed", sizes[f], TAG_DATA, chunk)):
                for lo in range(0, total, step):
                    reqs.append(t.irecv(buf[lo:min(lo + step, total)], s, tags + tag))
                    kinds.append((kind + " receive", f))
                    peers.append(s)
                    left[f][kind == "timed"] += 1
        for f, (s, d) in enumerate(flows):
            if s != me:
                continue
            reqs.append(t.irecv(ack[f:f + 1], d, tags + TAG_ACK))
            kinds.append(("acknowledgement", f))
            peers.append(d)
            for kind, total, tag, step in (("warm-up", warm[f], TAG_WARM, chunk),
                                           ("timed", sizes[f], TAG_DATA, chunk)):
                for lo in range(0, total, step):
                    reqs.append(t.isend(send[lo:min(lo + step, total)], d, tags + tag))
                    kinds.append((kind + " send", f))
                    peers.append(d)
        if not reqs:
            return elapsed

        def on_done(k: int) -> None:
            kind, f = kinds[k]
            now = time.perf_counter()
            if kind == "acknowledgement":
                elapsed[2 * m + f] = now - entry
            elif kind.endswith("receive"):
                timed = kind.startswith("timed")
                left[f][timed] -= 1
                if left[f][timed] == 0:
                    if timed:
                        elapsed[f] = now - warm_end[f]
                        elapsed[m + f] = now - entry
                        reqs.append(t.isend(ack[m:], flows[f][0], tags + TAG_ACK))
                        kinds.append(("acknowledgement send", f))
                        peers.append(flows[f][0])
                    else:
                        warm_end[f] = now

        def describe(pending: List[int]) -> str:
            kind, f = kinds[pending[0]]
            s, d = flows[f]
            return (f"{self._who(s)} -> {self._who(d)}: a {sizes[f]}-byte transfer did not "
                    f"complete within {cfg.timeout_s:g} s (rank {me} waiting on a {kind})")

        self._wait(reqs, time.perf_counter() + cfg.timeout_s, describe, peers=peers,
                   on_done=on_done)
        return elapsed

    def measure(self, flows: Sequence[Pair], subsets: Sequence[Sequence[int]], label: str,
                start: int, weights: Optional[Sequence[float]] = None
                ) -> Tuple[np.ndarray, np.ndarray, float]:
        """Adaptive test: per-flow rates and per-subset aggregates in bytes/s, and the scale.

        Flow ``f`` moves ``scale * weights[f]`` bytes, ``scale`` starting at ``start``. Give the
        flows weights in proportion to their expected rates, so that, unless something caps
        them together, they all finish at once: a subset's aggregate (its bytes over the time
        from the common start until its last flow ends) then measures what the flows share,
        not the slowest flow.

        Every rank calls this with the same arguments; ranks in no flow only join the
        max-allreduce that ends each attempt.
        """
        cfg = self.cfg
        self.tests += 1
        w = np.ones(len(flows)) if weights is None else np.asarray(weights, dtype=float)
        w = w / w.max()
        rtt = np.array([self.rtt[s, d] for s, d in flows])
        figures = _Figures(len(flows), subsets)
        scale = float(start)
        attempts = cfg.max_samples + 12
        # An aggregate counts the warm-ups too (it cannot tell where, between the receivers,
        # the link stopped carrying warm-up bytes), so it needs longer transfers for a token
        # bucket's burst to matter little.
        target = self.target * (SUBSET_FACTOR if subsets else 1)
        self.spent += PAIR_COST * target
        m = len(flows)
        for _ in range(attempts):
            sizes = [max(cfg.min_bytes, int(scale * wf)) for wf in w]
            timings = self._sync(self._run_flows(flows, sizes), label)
            window, finished, acked = timings[:m], timings[m:2 * m], timings[2 * m:]
            whole = np.array([self._warm(v) + v for v in sizes], dtype=float)
            # The sender's figure, scaled to the timed bytes, bounds the window from below
            # (it includes the warm-up, at the same rate, and one round trip).
            sender = (acked - rtt) * np.asarray(sizes, dtype=float) / whole
            elapsed = np.maximum(window, sender)
            if np.any(elapsed <= 0):
                f = int(np.argmin(elapsed))
                raise ProbeError(f"{self._who(flows[f][0])} -> {self._who(flows[f][1])}: a "
                                 f"transfer measured zero time ({label})")
            span = float(finished.max() if subsets else elapsed.max())
            if span < target / 2 and scale < cfg.max_bytes:
                grow = max(2.0, min(64.0, target / span))
                scale = float(_pow2(scale * grow, cfg.min_bytes, cfg.max_bytes))
                continue
            nb = np.asarray(sizes, dtype=float)
            subset_rates = [float(whole[sub].sum()) / float(finished[sub].max())
                            for sub in subsets]
            figures.add(nb / elapsed, subset_rates)
            _, _, stable = figures.estimates(cfg.tolerance)
            have = len(figures.flow_samples)
            if have >= cfg.max_samples or (have >= cfg.min_samples and stable) \
                    or self.clock > cfg.budget_s:
                break
            # keep each attempt near target_s: the first size may have overshot on a slow path
            scale = float(_pow2(scale * target / span, cfg.min_bytes, cfg.max_bytes))
        if not figures.flow_samples:
            raise ProbeError(f"{label}: no usable sample within {attempts} attempts")
        rates, subs, _ = figures.estimates(cfg.tolerance)
        return rates, subs, scale

    def budget(self, pair_tests: int, subset_tests: int) -> None:
        """Shorten the transfers so that the tests left fit in what remains of ``budget_s``.

        A test is modelled as ``PAIR_COST`` targets (``SUBSET_FACTOR`` times more for a
        concurrent one) plus a fixed overhead, learnt from the tests so far. Decided from the
        common clock, so every rank picks the same target.
        """
        cfg = self.cfg
        overhead = TEST_OVERHEAD_S
        if self.tests:
            overhead = max(overhead, (self.clock - self.spent) / self.tests)
        left = cfg.budget_s - self.clock - overhead * (pair_tests + subset_tests)
        per_target = PAIR_COST * (pair_tests + SUBSET_FACTOR * subset_tests)
        want = left / per_target if per_target else cfg.target_s
        self.target = min(cfg.target_s, max(MIN_TARGET_S, want))

    # ---- phases 2 to 4 -----------------------------------------------------------------------

    def pairs(self) -> np.ndarray:
        n = self.n
        bw = np.full((n, n), np.nan)
        rounds = circle_rounds(n)
        groups = rounds if self.cfg.concurrent_pairs else [[p] for r in rounds for p in r]
        done = 0
        total = n * (n - 1) // 2
        scale = float(self.cfg.start_bytes)
        for pairs in groups:
            self.latency(pairs)
            # One direction at a time: through a shaped link with a deep queue, the reverse
            # stream's TCP acknowledgements wait behind data, and both directions measure low.
            for flows in ([(a, b) for a, b in pairs], [(b, a) for a, b in pairs]):
                # Start at a quarter of the last test's size: this pair may be much slower
                # (a wasted attempt would last long) or faster (one cheap attempt to grow).
                rates, _, scale = self.measure(flows, [], f"bandwidth {flows}",
                                               int(max(self.cfg.start_bytes, scale / 4)))
                for (s, d), r in zip(flows, rates):
                    bw[s, d] = r
            done += len(pairs)
            self.budget(2 * (total - done), 2 + 2 * n if n > 2 else 0)
            self._progress(f"bandwidth: {done}/{total} pairs")
        self._retry_lopsided(bw, 2 + 2 * n if n > 2 else 0)
        return bw

    def _retry_lopsided(self, bw: np.ndarray, tests_after: int) -> None:
        """Measure again the pairs whose two directions disagree, while the budget allows.

        Most links are symmetric, and the way a figure goes wrong (a descheduled rank, a
        neighbour's burst of load) is low: a pair much slower one way than the other is worth
        a second look, and each direction keeps the better of its two figures.
        """
        cfg = self.cfg
        suspects = sorted(((min(bw[a, b], bw[b, a]) / max(bw[a, b], bw[b, a]), a, b)
                           for a in range(self.n) for b in range(a + 1, self.n)
                           if min(bw[a, b], bw[b, a]) < (1 - 2 * cfg.tolerance)
                           * max(bw[a, b], bw[b, a])))
        retried = 0
        for _, a, b in suspects:
            # what a retry costs, from the tests so far; keep the rest of the budget for the
            # concurrent and fan tests
            per_test = self.clock / max(self.tests, 1)
            if self.clock + per_test * (2 + SUBSET_FACTOR * tests_after) > cfg.budget_s:
                break
            for s, d in ((a, b), (b, a)):
                rates, _, _ = self.measure([(s, d)], [], f"bandwidth again [{s}, {d}]",
                                           _pow2(bw[s, d] * self.target, cfg.min_bytes,
                                                 cfg.max_bytes))
                bw[s, d] = max(bw[s, d], float(rates[0]))
            retried += 1
        if suspects:
            self._progress(f"bandwidth: measured {retried} of {len(suspects)} lopsided pairs "
                           f"again", force=True)

    def _start(self, rates: Sequence[float]) -> int:
        """First scale for a concurrent test whose fastest flow should get ``max(rates)``."""
        return _pow2(max(rates) * self.target * SUBSET_FACTOR, self.cfg.min_bytes,
                     self.cfg.max_bytes)

    def concurrent(self, tests: Sequence[GroupTest], bw: np.ndarray
                   ) -> List[Tuple[Tuple[int, ...], Tuple[int, ...], List[Pair], float]]:
        results = []
        for test in tests:
            flows = list(test.flows)
            alone = expected_rates(bw, flows)
            label = f"concurrent {_span(test.src)} -> {_span(test.dst)}"
            _, agg, _ = self.measure(flows, [list(range(len(flows)))], label,
                                     self._start(alone), weights=alone)
            results.append((test.src, test.dst, flows, float(agg[0])))
            self._progress(f"{label}: {len(flows)} pairs, {agg[0] * 8 / 1e9:.3f} gbps in all "
                           f"(alone {sum(alone) * 8 / 1e9:.3f})", force=True)
        return results

    def extensions(self, tests: Sequence[ExtensionTest], bw: np.ndarray
                   ) -> List[Tuple[Tuple[int, ...], Tuple[int, ...], int, str, List[Pair], float]]:
        results = []
        for test in tests:
            flows = list(test.flows)
            alone = expected_rates(bw, flows)
            label = f"rank {test.rank} behind {_span(test.src)} -> {_span(test.dst)}"
            _, agg, _ = self.measure(flows, [[0, 1]], label, self._start(alone), weights=alone)
            results.append((test.src, test.dst, test.rank, test.side, flows, float(agg[0])))
            self._progress(f"{label}: {agg[0] * 8 / 1e9:.3f} gbps together (alone "
                           f"{sum(alone) * 8 / 1e9:.3f})")
        return results

    def fans(self, bw: np.ndarray, shared: Sequence[Mapping[str, Any]]
             ) -> Tuple[List[float], List[float]]:
        n = self.n
        out, inn = [0.0] * n, [0.0] * n
        for k in range(n):
            others = [j for j in range(n) if j != k]
            for flows, into in (([(k, j) for j in others], out), ([(j, k) for j in others], inn)):
                expected = expected_rates(bw, flows, shared)
                _, agg, _ = self.measure(flows, [list(range(len(flows)))],
                                         f"fan-{'out' if into is out else 'in'} at rank {k}",
                                         self._start(expected), weights=expected)
                into[k] = float(agg[0])
            self._progress(f"host limits: {k + 1}/{n} ranks")
        return out, inn


@contextlib.contextmanager
def _as_probe_error() -> Iterator[None]:
    """A transport's timeout, which names what the probe was waiting for, as a ProbeError."""
    try:
        yield
    except TransportTimeout as exc:
        raise ProbeError(str(exc)) from exc


@contextlib.contextmanager
def _opened(link: Any) -> Iterator[Transport]:
    """``link`` as a transport: a :class:`Transport` as it is; an mpi4py communicator (what the
    adaptive engine still passes) wrapped in the MPI transport for the call, then closed."""
    if isinstance(link, Transport):
        yield link
        return
    from ..transport import as_transport  # the door to MPI, opened only for a communicator

    transport = as_transport(link)
    try:
        yield transport
    finally:
        transport.close()


def probe(transport: Transport, mode: str = "full", *, name: Optional[str] = None,
          progress: Optional[Callable[[str], None]] = None, **overrides: Any) -> Dict[str, Any]:
    """Measure the network between the ranks of ``transport``; collective.

    Parameters
    ----------
    transport : Transport
        Every rank of it calls this. (An mpi4py communicator is still accepted and wrapped in
        :class:`~horotopo.transport.mpi.MPITransport` for the call.)
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
    with _opened(transport) as link:
        return _probe(_Prober(link, cfg, say), cfg, name)


def _probe(pr: _Prober, cfg: ProbeConfig, name: Optional[str]) -> Dict[str, Any]:
    """The phases of :func:`probe`."""
    with _as_probe_error():
        pr.hosts = [str(h) for h in pr.transport.allgather_object(
            pr.transport.processor_name, cfg.timeout_s, "probe: host names")]
    n = pr.n
    groups: List[List[int]] = [list(range(n))]
    levels: List[List[List[int]]] = []
    shared: List[Tuple[Tuple[int, ...], Tuple[int, ...], List[Pair], float]] = []
    extended: List[Tuple[Tuple[int, ...], Tuple[int, ...], int, str, List[Pair], float]] = []
    fan_out = fan_in = None
    bw = np.full((n, n), np.nan)
    if n > 1:
        pr._progress(f"latency and bandwidth: {n * (n - 1) // 2} pairs, "
                     f"{'a round' if cfg.concurrent_pairs else 'one pair'} at a time",
                     force=True)
        # the pairs, then (guessing two groups) two group tests and 2n fan tests
        pr.budget(n * (n - 1), 2 + 2 * n if n > 2 else 0)
        bw = pr.pairs()
        groups = cluster_ranks(bw, gap=cfg.gap)
        levels = cluster_levels(bw, gap=cfg.gap)
        tests = group_tests(levels)
        pr.budget(0, len(tests) + (2 * n if n > 2 else 0))
        if tests:
            pr._progress(f"groups by rate: {levels}", force=True)
            shared = pr.concurrent(tests, bw)
            ext = extension_tests(infer_shared(bw, shared, margin=cfg.margin), levels, n)
            pr.budget(0, len(ext) + (2 * n if n > 2 else 0))
            extended = pr.extensions(ext, bw)
        if n > 2:
            pr._progress("host limits: fan-out and fan-in", force=True)
            found = infer_all(bw, shared, extended, margin=cfg.margin)
            fan_out, fan_in = pr.fans(bw, found)
    to_gbps = 1.0 / GBPS_TO_BPS
    meta = {"levels": levels, "mode": cfg.mode, "seconds": round(pr.clock, 3),
            "tests": pr.tests,
            "target_ms": round(pr.target * 1e3, 2),
            "concurrent_pairs": cfg.concurrent_pairs}
    doc = build_document(
        name or f"probed-{n}", pr.hosts,
        [[None if i == j else bw[i, j] * to_gbps for j in range(n)] for i in range(n)],
        [[None if i == j else pr.rtt[i, j] / 2 * 1e3 for j in range(n)] for i in range(n)],
        fan_out_gbps=None if fan_out is None else [v * to_gbps for v in fan_out],
        fan_in_gbps=None if fan_in is None else [v * to_gbps for v in fan_in],
        shared_results=[(a, b, f, v * to_gbps) for a, b, f, v in shared],
        extension_results=[(a, b, r, side, f, v * to_gbps)
                           for a, b, r, side, f, v in extended],
        groups=groups, gap=cfg.gap, margin=cfg.margin, meta=meta)
    pr._progress(f"done: {pr.tests} tests", force=True)
    return doc


def measure_pairs(transport: Transport, pairs: Sequence[Pair], mode: str = "quick",
                  **overrides: Any) -> Dict[Pair, float]:
    """Rates (bytes/s) of the given directed pairs, each alone; collective.

    The probe's pairwise test (latency, warm-up, adaptive size, repeats) for just these pairs,
    e.g. to re-measure links that an allreduce found slow. Every rank passes the same
    ``pairs``; the result is the same on every rank.

    Raises
    ------
    ValueError
        A pair of one rank with itself, or a rank out of range.
    ProbeError
        A pair that cannot reach each other, or a timeout, naming the pair.
    """
    cfg = ProbeConfig.for_mode(mode, **overrides)
    with _opened(transport) as link:
        size = link.size
        for a, b in pairs:
            if a == b or not (0 <= a < size and 0 <= b < size):
                raise ValueError(f"a pair needs two different ranks in 0..{size - 1}, "
                                 f"got ({a}, {b})")
        pr = _Prober(link, cfg, lambda msg: None)
        out: Dict[Pair, float] = {}
        for a, b in pairs:
            pr.latency([(min(a, b), max(a, b))])
            rates, _, _ = pr.measure([(int(a), int(b))], [], f"bandwidth [{a}, {b}]",
                                     cfg.start_bytes)
            out[(int(a), int(b))] = float(rates[0])
        return out
