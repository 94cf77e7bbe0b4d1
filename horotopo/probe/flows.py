"""The probe's measurements between ranks: latency ping-pongs and timed flows, over a transport.

:class:`Prober` holds the state of one collective probe over a
:class:`~horotopo.transport.base.Transport` (MPI's, or any other: the probe never touches MPI
itself) and makes its two kinds of measurement:

- :meth:`Prober.latency`: ping-pong between pairs; each pair keeps its fastest round trip.
- :meth:`Prober.measure`: an adaptive test of flows run at once, giving per-flow rates and the
  aggregates of subsets of them.

A transfer is a warm-up (which drains token buckets and opens the TCP window) followed, back to
back, by the timed bytes; the receiver times from the end of one to the end of the other, and
the sender's time until the receiver acknowledges the last byte guards that window against a
receiver that noticed the warm-up's end late. Message size adapts until a transfer lasts about
``target_s``; repeats continue until the two best samples agree within ``tolerance``. After
every attempt the ranks combine their timings with a max-allreduce, so every rank holds every
figure and takes the same decisions (sizes, repeats, budget) from the same numbers; local clocks
never steer the schedule.

Which tests run, in what order, is :mod:`horotopo.probe.phases`'.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..transport.base import Transport, TransportTimeout
from ..transport.types import Describe
from .config import ProbeConfig, ProbeError
from .pairing import Pair

__all__ = ["Prober", "as_probe_error", "pow2"]

# Offsets in the block of tags each exchange takes from the transport (alloc_tags): every rank
# runs the same exchanges in the same order, so the blocks agree without communication.
TAG_PING, TAG_PONG = 0, 1
# A transfer's block: the warm-up train's tag, the timed train's and the acknowledgement's.
# One tag per train, so MPI's non-overtaking rule keeps each train in order; the emulated
# cluster's accuracy figures (benchmarks/probe_accuracy.py) are measured so. A tag per message
# would let the simulated transport, which sends one stream's messages one after another, move
# a train over a WAN at its rate, but it did not read the emulated cluster's pairs more
# accurately under load, so the tested form stays.
TAG_WARM, TAG_DATA, TAG_ACK = 0, 1, 2


# The transfers' buffers, one set per process: the bytes sent are never looked at and the bytes
# received are thrown away, so the ranks that share a process (a simulation's thousand actors,
# threads in tests) share them too instead of holding megabytes each. Within one rank the
# receive slots stay apart (one per concurrent flow).
_SEND: List[np.ndarray] = [np.zeros(0, dtype=np.uint8)]
_RECV: List[np.ndarray] = []


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


def pow2(x: float, lo: int, hi: int) -> int:
    """The first ``lo * 2**k`` at or above ``x``, capped at ``hi`` (message sizes stay a few
    distinct values, so repeated tests reuse their buffers)."""
    v = lo
    while v < x and v < hi:
        v *= 2
    return min(v, hi)


def _trains(warm: int, timed: int, step: int) -> Iterator[Tuple[str, int, int, int]]:
    """``(kind, lo, hi, tag offset)`` of one flow's messages, in the order they go: the
    warm-up's ``warm`` bytes, then the ``timed`` bytes, each as a train of messages of at most
    ``step`` bytes. Sender and receiver walk the same trains, so their messages match."""
    for kind, total, tag in (("warm-up", warm, TAG_WARM), ("timed", timed, TAG_DATA)):
        for lo in range(0, total, step):
            yield kind, lo, min(lo + step, total), tag


@contextlib.contextmanager
def as_probe_error() -> Iterator[None]:
    """A transport's timeout, which names what the probe was waiting for, as a ProbeError."""
    try:
        yield
    except TransportTimeout as exc:
        raise ProbeError(str(exc)) from exc


class Prober:
    """State of one collective probe over a transport (its tags keep the probe's messages
    apart from anything else on it)."""

    def __init__(self, transport: Transport, cfg: ProbeConfig,
                 progress: Callable[[str], None]):
        self.cfg = cfg
        self.say = progress
        self.transport = transport
        # Every timing and deadline is read on the transport's clock (a simulated transport's
        # is simulated time), never on this machine's directly.
        self.t0 = transport.now()
        # A rank that never arrives must be a timeout naming it, not a hang.
        with as_probe_error():
            transport.barrier(cfg.timeout_s, "probe start")
        self.rank = transport.rank
        self.n = transport.size
        self.hosts: List[str] = []
        self.rtt = np.zeros((self.n, self.n))
        self.clock = 0.0  # seconds since the start, the max over ranks (same on every rank)
        self.target = cfg.target_s
        self.spent = 0.0  # modelled transfer seconds of the tests so far (pair_cost * target)
        self.tests = 0
        self._last_say = self.t0
        # Where set, a pair whose first round trip (the connection's) took at least this long
        # is pinged once more, not ``ping_reps`` times (see the hosts scheme's rounds).
        self.long_rtt_s: Optional[float] = None

    # ---- helpers ---------------------------------------------------------------------------

    def _who(self, r: int) -> str:
        return f"rank {r} ({self.hosts[r]})" if self.hosts else f"rank {r}"

    @staticmethod
    def _sendbuf(nbytes: int) -> np.ndarray:
        if len(_SEND[0]) < nbytes:
            _SEND[0] = np.ones(nbytes, dtype=np.uint8)
        return _SEND[0][:nbytes]

    @staticmethod
    def _recvbuf(slot: int, nbytes: int) -> np.ndarray:
        while len(_RECV) <= slot:
            _RECV.append(np.zeros(0, dtype=np.uint8))
        if len(_RECV[slot]) < nbytes:
            _RECV[slot] = np.empty(nbytes, dtype=np.uint8)
        return _RECV[slot][:nbytes]

    def _sync(self, local: np.ndarray, what: str) -> np.ndarray:
        """Max-allreduce of ``local`` plus the common clock (the last element)."""
        vec = np.append(np.asarray(local, dtype=np.float64),
                        self.transport.now() - self.t0)
        with as_probe_error():
            self.transport.allreduce_control(vec, "max", self.cfg.timeout_s, what)
        self.clock = float(vec[-1])
        return vec[:-1]

    def _wait(self, requests: List[Any], deadline: float, what: Describe, *,
              peers: List[int], on_done: Optional[Callable[[int], None]] = None) -> None:
        """The transport's wait for ranks moving data (they yield, not sleep, between polls:
        a transfer's end must be noticed at once)."""
        with as_probe_error():
            self.transport.wait(requests, deadline, peers=peers, what=what, on_done=on_done,
                                busy=True)

    def note(self, msg: str, force: bool = False) -> None:
        """Pass ``msg`` to the progress callback, at most once a second unless ``force``."""
        now = self.transport.now()
        if force or now - self._last_say >= 1.0:
            self._last_say = now
            self.say(f"[probe {now - self.t0:6.2f} s] {msg}")

    # ---- latency ----------------------------------------------------------------------------

    def latency(self, pairs: Sequence[Pair]) -> None:
        """Ping-pong between each of ``pairs`` (all at once); every rank learns the fastest."""
        cfg = self.cfg
        t = self.transport
        tags = t.alloc_tags(2)  # on every rank, in or out of the pairs
        local = np.zeros(len(pairs))  # one figure per pair: the sync stays small at any n
        ping = np.zeros(8, dtype=np.uint8)
        pong = np.zeros(8, dtype=np.uint8)
        for k, (a, b) in enumerate(pairs):
            if self.rank not in (a, b):
                continue
            other = b if self.rank == a else a
            samples: List[float] = []
            last = False
            for rep in range(cfg.ping_reps + 1):
                deadline = t.now() + cfg.timeout_s
                what = (f"{self._who(self.rank)} cannot reach {self._who(other)}: no "
                        f"{'reply' if self.rank == a else 'ping'} within {cfg.timeout_s:g} s")
                if self.rank == a:
                    # The pinger decides when to stop and says so in the ping, which the
                    # ponger reads before it answers.
                    last = rep == cfg.ping_reps or (rep == 1 and self.long_rtt_s is not None
                                                    and samples[0] >= self.long_rtt_s)
                    ping[0] = last
                    start = t.now()
                    reqs = [t.irecv(pong, b, tags + TAG_PONG), t.isend(ping, b, tags + TAG_PING)]
                    self._wait(reqs, deadline, what, peers=[b, b])
                    samples.append(t.now() - start)
                else:
                    self._wait([t.irecv(ping, a, tags + TAG_PING)], deadline, what, peers=[a])
                    last = bool(ping[0])
                    self._wait([t.isend(pong, a, tags + TAG_PONG)], deadline, what, peers=[a])
                if last:
                    break
            if self.rank == a:
                # The first round trip opens the connection; it is not a latency. The fastest
                # of the rest is the link's: slower ones waited for a descheduled rank, which
                # the planner would turn into needlessly large chunks.
                local[k] = float(np.min(samples[1:]))
        got = self._sync(local, f"latency {list(pairs)}")
        for k, (a, b) in enumerate(pairs):
            self.rtt[a, b] = self.rtt[b, a] = got[k]

    # ---- the timed transfer ------------------------------------------------------------------

    def _warm(self, nbytes: int) -> int:
        return min(nbytes, max(int(nbytes * self.cfg.params.warm_share), self.cfg.warm_bytes))

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
        entry = t.now()
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
            for kind, lo, hi, tag in _trains(warm[f], sizes[f], chunk):
                reqs.append(t.irecv(buf[lo:hi], s, tags + tag))
                kinds.append((kind + " receive", f))
                peers.append(s)
                left[f][kind == "timed"] += 1
        for f, (s, d) in enumerate(flows):
            if s != me:
                continue
            reqs.append(t.irecv(ack[f:f + 1], d, tags + TAG_ACK))
            kinds.append(("acknowledgement", f))
            peers.append(d)
            for kind, lo, hi, tag in _trains(warm[f], sizes[f], chunk):
                reqs.append(t.isend(send[lo:hi], d, tags + tag))
                kinds.append((kind + " send", f))
                peers.append(d)
        if not reqs:
            return elapsed

        def on_done(k: int) -> None:
            kind, f = kinds[k]
            now = t.now()
            if kind == "acknowledgement":
                elapsed[2 * m + f] = now - entry
            elif kind.endswith("receive"):
                timed = kind.startswith("timed")
                left[f][timed] -= 1
                if left[f][timed] == 0:
                    if timed:
                        # The timed bytes end after the warm-up on a link that keeps one
                        # pair's messages in order (TCP); a simulated network moves them as
                        # flows side by side and can end them first. Then the window means
                        # nothing (0), and the sender's figure stands alone.
                        elapsed[f] = now - warm_end[f] if left[f][0] == 0 else 0.0
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

        self._wait(reqs, t.now() + cfg.timeout_s, describe, peers=peers,
                   on_done=on_done)
        return elapsed

    def measure(self, flows: Sequence[Pair], subsets: Sequence[Sequence[int]], label: str,
                start: int, weights: Optional[Sequence[float]] = None, paired: bool = False
                ) -> Tuple[np.ndarray, np.ndarray, float]:
        """Adaptive test: per-flow rates and per-subset aggregates in bytes/s, and the scale.

        Flow ``f`` moves ``scale * weights[f]`` bytes, ``scale`` starting at ``start``. Give the
        flows weights in proportion to their expected rates, so that, unless something caps
        them together, they all finish at once: a subset's aggregate (its bytes over the time
        from the common start until its last flow ends) then measures what the flows share,
        not the slowest flow.

        Every rank calls this with the same arguments; ranks in no flow only join the
        max-allreduce that ends each attempt.

        ``paired`` (tests without subsets, whose ``start`` is usually right, such as the
        leaders' rounds): where the flows' round trip is at least the target, the first two
        attempts run back to back and one allreduce ends both. Over a WAN each allreduce
        costs a one-way latency and waits for the slowest pair's acknowledgement, so this
        saves one of the two a test needs at least. The scale returned is then fitted to the
        target from the last sample (the next round's start). An aggregate needs the common
        start that only an allreduce gives, so ``paired`` with subsets is refused.
        """
        cfg = self.cfg
        self.tests += 1
        w = np.ones(len(flows)) if weights is None else np.asarray(weights, dtype=float)
        w = w / w.max()
        rtt = np.array([self.rtt[s, d] for s, d in flows])
        figures = _Figures(len(flows), subsets)
        scale = float(start)
        attempts = cfg.max_samples + cfg.params.growth_attempts
        # An aggregate counts the warm-ups too (it cannot tell where, between the receivers,
        # the link stopped carrying warm-up bytes), so it needs longer transfers for a token
        # bucket's burst to matter little.
        target = self.target * (self.cfg.params.subset_factor if subsets else 1)
        self.spent += self.cfg.params.pair_cost * target
        if paired and subsets:
            raise ValueError(f"{label}: paired attempts cannot measure aggregates")
        for attempt in range(attempts):
            sizes = [max(cfg.min_bytes, int(scale * wf)) for wf in w]
            # Past the budget a test takes one sample, paired or not. Paired only where an
            # allreduce costs more than a transfer: the flows' round trip (it waits for the
            # slowest acknowledgement) at least the target. On a LAN it saves nothing, and
            # the second run, whose flows start as each pair is done, reads less together
            # (racks with slow NICs at 256 ranks: 62 more attempts for unstable samples).
            runs = 2 if (paired and attempt == 0 and cfg.min_samples >= 2
                         and self.clock <= cfg.budget_s and rtt.max() >= target) else 1
            # Each run allocates its tags on every rank, so the blocks stay in step.
            local = np.concatenate([self._run_flows(flows, sizes) for _ in range(runs)])
            synced = self._sync(local, label)
            span = 0.0
            for timings in np.split(synced, runs):
                sample = self._sample(flows, sizes, timings, rtt, subsets, label)
                span = sample[0]
                if span < target / 2 and scale < cfg.max_bytes:
                    break  # too short: the paired run is too (same sizes), both go
                figures.add(sample[1], sample[2])
            if span < target / 2 and scale < cfg.max_bytes:
                grow = max(2.0, min(cfg.params.max_growth, target / span))
                scale = float(pow2(scale * grow, cfg.min_bytes, cfg.max_bytes))
                continue
            _, _, stable = figures.estimates(cfg.tolerance)
            have = len(figures.flow_samples)
            # keep each attempt near target_s: the first size may have overshot on a slow path
            fitted = float(pow2(scale * target / span, cfg.min_bytes, cfg.max_bytes))
            if have >= cfg.max_samples or (have >= cfg.min_samples and stable) \
                    or self.clock > cfg.budget_s:
                if paired:
                    # The scale handed on is the next round's start: sized to the target from
                    # the last sample. Handed on as used, a round past the budget (one sample)
                    # passes on an overshoot, and every later round's attempts last several
                    # targets (4x at 1024 ranks on two sites).
                    scale = fitted
                break
            scale = fitted
        if not figures.flow_samples:
            raise ProbeError(f"{label}: no usable sample within {attempts} attempts")
        rates, subs, _ = figures.estimates(cfg.tolerance)
        return rates, subs, scale

    def _sample(self, flows: Sequence[Pair], sizes: Sequence[int], timings: np.ndarray,
                rtt: np.ndarray, subsets: Sequence[Sequence[int]], label: str
                ) -> Tuple[float, np.ndarray, List[float]]:
        """One attempt's (span, per-flow rates, per-subset rates) from its synced timings."""
        m = len(flows)
        window, finished, acked = timings[:m], timings[m:2 * m], timings[2 * m:]
        whole = np.array([self._warm(v) + v for v in sizes], dtype=float)
        # The sender's figure, scaled to the timed bytes, bounds the window from below
        # (it includes the warm-up, at the same rate, and one round trip).
        sender = (acked - rtt) * np.asarray(sizes, dtype=float) / whole
        elapsed = np.maximum(window, sender)
        # The window is void when the timed train overtook the warm-up (they travel on
        # different tags) and the sender's figure can vanish into the round trip on shared
        # memory; the receiver's whole transfer, scaled to the timed bytes, still measures
        # the flow then (it includes the warm-up, at the same rate).
        receiver = finished * np.asarray(sizes, dtype=float) / whole
        elapsed = np.where(elapsed > 0, elapsed, receiver)
        if np.any(elapsed <= 0):
            f = int(np.argmin(elapsed))
            raise ProbeError(f"{self._who(flows[f][0])} -> {self._who(flows[f][1])}: a "
                             f"transfer measured zero time ({label})")
        # An aggregate runs from the common start, so each flow's first byte arrives one
        # latency late (a WAN's tens of ms would dwarf the transfer): take it off.
        arrived = np.maximum(finished - rtt / 2, 1e-9)
        span = float(arrived.max() if subsets else elapsed.max())
        subset_rates = [float(whole[sub].sum()) / float(arrived[sub].max()) for sub in subsets]
        return span, np.asarray(sizes, dtype=float) / elapsed, subset_rates

    def budget(self, pair_tests: int, subset_tests: int) -> None:
        """Shorten the transfers so that the tests left fit in what remains of ``budget_s``.

        A test is modelled as ``pair_cost`` targets (``subset_factor`` times more for a
        concurrent one) plus a fixed overhead (at least ``test_overhead_s``), learnt from the
        tests so far; targets shrink down to ``min_target_s`` (the config's
        :class:`~horotopo.params.ProbeParams`). Decided from the common clock, so every rank
        picks the same target.
        """
        cfg = self.cfg
        knobs = cfg.params
        overhead = knobs.test_overhead_s
        if self.tests:
            overhead = max(overhead, (self.clock - self.spent) / self.tests)
        left = cfg.budget_s - self.clock - overhead * (pair_tests + subset_tests)
        per_target = knobs.pair_cost * (pair_tests + knobs.subset_factor * subset_tests)
        want = left / per_target if per_target else cfg.target_s
        self.target = min(cfg.target_s, max(knobs.min_target_s, want))
