"""A transport whose ranks are SimGrid actors in one process: horotopo's own code over a
simulated network.

Every rank runs its function in a SimGrid actor (:func:`run_simulated`); a message is a
``Mailbox.put_async`` charged in *simulated* bytes: ``scale`` times the bytes the rank really
holds, so a rank can keep a small array while the simulation moves the full-size buffer (the
results are still checked exactly, on the small arrays). The control steps (the engine's
metadata check, a plan's broadcast, a barrier) are charged their true size. Software costs are
charged as simulated time (:class:`SimCosts`): a fixed cost per message posted, and a cost per
received byte (the copy or the reduce that follows a receive). A rank's CPU is one resource:
each cost starts when the CPU is free (or now, if later), and a message is posted once the CPU
has done everything charged before it; a rank that waits anyway for the network sleeps for
nothing more, so sleeps (each a SimGrid simcall, i.e. thread switches) happen only when a post
has to wait for the CPU.

Matching is MPI's: one mailbox per (source, destination, tag), which SimGrid matches in FIFO
order, so messages of one (source, tag) stream never overtake each other. SimGrid pairs a send
with its receive (rendezvous): a send completes once the receiver has posted its receive and
the bytes have crossed the network, as MPI allows for any message size.

Waiting must go through :meth:`SimulatedTransport.waitsome`, ``waitall`` or ``wait``: they
block in simulated time. (The generic poll loop sleeps in wall-clock time, which would stop the
whole simulation.) :meth:`SimulatedTransport.now` is the simulated clock, and deadlines are
values of it, as :meth:`Transport.wait` has them: the probe, which times its transfers and
sets its deadlines on ``transport.now()``, measures the simulated network.

SimGrid comes from Debian's ``python3-simgrid`` (3.32, a CPython 3.11 extension): ``apt-get
install python3-simgrid``. A virtual environment does not see Debian's dist-packages folder, so
:func:`load_simgrid` adds it to ``sys.path`` for that import only when the plain import fails.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import config
from .base import TagAllocator, Transport, TransportError, TransportTimeout
from .types import Describe
from ..simulation.collectives import RoundsRequest, SimCollectives
from ..simulation.pending import CompletionQueue, Request
from ..simulation.support import (DEFAULT_COSTS, INSTALL_HINT, SimCosts, SimulationConfigError,
                              SimulationError, SimulatorMissing, load_simgrid)
from ..simulation.actors import SimRun, Simulation

__all__ = ["load_simgrid", "SimulatorMissing", "SimCosts", "DEFAULT_COSTS", "Simulation",
           "SimulatedTransport", "SimRun", "SimulationError", "SimulationConfigError",
           "INSTALL_HINT"]


class SimulatedTransport(SimCollectives, Transport):
    """One rank's transport inside a :class:`Simulation` (made by :meth:`Simulation.run`).

    Attributes
    ----------
    scale : float
        Simulated bytes per real byte of the point-to-point messages the algorithms post;
        the control steps are charged their true size.
    """

    def __init__(self, sim: Simulation, rank: int, size: int, scale: float,
                 processor_name: str) -> None:
        self.sim = sim
        self.sg = sim.sg
        self._rank = rank
        self._size = size
        self.scale = float(scale)
        self._name = processor_name
        self._tags = TagAllocator(1 << 20)
        self._queue: List[Request] = []
        self._streams: Dict[Tuple[int, int], Request] = {}  # (dest, tag): its last send
        self._pipe: Dict[int, float] = {}  # dest: bytes in flight that fill the route
        self._cpu_free = 0.0      # simulated time at which this rank's CPU is done
        self.unscaled = 0         # > 0 inside a control step
        self._snapshot: Optional[Tuple[Any, np.ndarray, Request]] = None

    # ---- identity ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def processor_name(self) -> str:
        return self._name

    def now(self) -> float:
        """The simulated clock, in seconds (the simulation's, from SimGrid's start)."""
        return float(self.sg.Engine.clock)

    def alloc_tags(self, count: int) -> int:
        return self._tags.alloc(count)

    def start_together(self, margin_s: Optional[float] = None) -> float:
        """A barrier that releases every rank at one simulated instant, which it returns.

        A plain barrier releases the ranks at different instants: the last round's messages
        reach them over routes of different latencies (a WAN's 5 ms on the two-site
        clusters), so a call timed from it starts with offsets left by what ran before. Here
        the ranks agree on the latest clock among them and all sleep until the first multiple
        of ``margin_s`` at least ``margin_s`` after it (simulated idle time costs no wall
        time).

        Raises
        ------
        TransportError
            A rank reached the agreed instant only after it (``margin_s`` too short for the
            agreement's own rounds and the rank's pending CPU work).

        ``margin_s`` defaults to :attr:`~horotopo.params.RuntimeParams.simulation_start_margin_s`
        as the environment sets it.
        """
        if margin_s is None:
            margin_s = config.runtime_params().simulation_start_margin_s
        self.flush(settle=True)  # the rank's pending CPU work is part of where it stands
        clock = np.array([self.now()], dtype=np.float64)
        self.allreduce_control(clock, "max")
        # on a multiple of the margin: every call starts at the same fraction of a second,
        # one less thing that a call inherits from what ran before it
        start = float(np.ceil((clock[0] + margin_s) / margin_s)) * margin_s
        self.flush(settle=True)
        late = self.now() - start
        if late > 0:
            raise TransportError(f"rank {self._rank} reached the common start {late:.6f} s "
                                 f"after it (margin {margin_s} s)")
        if late < 0:
            self.sg.this_actor.sleep_for(-late)
        return start

    # ---- messages -----------------------------------------------------------------------------
    def _bytes_of(self, buf: Any) -> np.ndarray:
        arr = np.asarray(buf)
        if not arr.flags.c_contiguous:
            raise TransportError("the simulated transport moves contiguous arrays only")
        return arr.reshape(-1).view(np.uint8)

    def isend(self, buf: Any, dest: int, tag: int) -> Request:
        return self._isend(buf, dest, tag, scaled=not self.unscaled)

    def _isend(self, buf: Any, dest: int, tag: int, scaled: bool) -> Request:
        """Post a send charged ``scale`` times its bytes when ``scaled``, else its bytes."""
        self._check_peer(dest)
        raw = self._bytes_of(buf)
        # MPI forbids touching a buffer while a send of it is pending, so a buffer sent again
        # (a broadcast root's payload to every rank) is copied once, not once per destination.
        snap = self._snapshot
        if snap is not None and snap[0] is buf and not snap[2].done \
                and snap[1].nbytes == raw.nbytes:
            payload = snap[1]
        else:
            payload = raw.copy()
        charged = int(round(raw.nbytes * self.scale)) if scaled else raw.nbytes
        req = Request("send", None, (self._rank, dest, tag), dest,
                       (payload, charged), charged)
        self._snapshot = (buf, payload, req)
        self._stream(req, tag)
        return req

    def _stream(self, req: Request, tag: int) -> None:
        """Queue the send ``req`` behind the one before it on its (destination, tag) stream."""
        req.stream = (req.peer, tag)
        last = self._streams.get(req.stream)
        if last is not None and not last.done:
            req.behind, last.next = last, req
        self._streams[req.stream] = req
        self._post(req)

    def _isend_ref(self, obj: Any, nbytes: int, dest: int, tag: int) -> Request:
        """Post a send of the immutable ``obj`` itself, charged ``nbytes`` (the collective
        steps' by-reference messages: the ranks share one process)."""
        self._check_peer(dest)
        req = Request("send", None, (self._rank, dest, tag), dest,
                       (obj, nbytes), nbytes)
        self._stream(req, tag)
        return req

    def _irecv_ref(self, source: int, tag: int) -> Request:
        """Post a receive of a :meth:`_isend_ref` object: once done, ``payload`` is the
        object and ``charged`` its bytes."""
        self._check_peer(source)
        req = Request("recv", None, (source, self._rank, tag), source)
        self._post(req)
        return req

    def irecv(self, buf: Any, source: int, tag: int) -> Request:
        self._check_peer(source)
        req = Request("recv", self._bytes_of(buf), (source, self._rank, tag),
                       source)
        self._post(req)
        return req

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self._size or peer == self._rank:
            raise TransportError(f"rank {self._rank} cannot message rank {peer} of "
                                 f"{self._size}")

    def _charge(self, seconds: float) -> None:
        """Occupy the CPU for ``seconds`` from when it is free (or from now)."""
        clock = self.sg.Engine.clock
        self._cpu_free = (self._cpu_free if self._cpu_free > clock else clock) + seconds

    def _post(self, req: Request) -> None:
        self._charge(self.sim.costs.per_message_s)
        self._queue.append(req)

    def settle(self) -> None:
        """Return once this rank's CPU has done the work charged to it (the last receives
        handled) and its queued messages are out: where a timed call really ends."""
        self.flush(settle=True)

    def flush(self, settle: bool = False) -> None:
        """Post the queued messages once the CPU has done the work charged before them (in
        posting order, so each mailbox keeps MPI's order); with ``settle``, also wait for the
        CPU when nothing is queued (a rank's last work)."""
        if self._queue or settle:
            wait = self._cpu_free - self.sg.Engine.clock
            if wait > 0:
                self.sg.this_actor.sleep_for(wait)
        if self._queue:
            queue, self._queue = self._queue, []
            for req in queue:
                req.queued = False
                if req.done:
                    continue  # cancelled before it was posted
                if req.kind == "send":
                    if self._may_start(req):
                        self._put(req)
                else:
                    req.comm, req.handle = self.sim.acquire(req.mailbox).get_async()
                    if req.watch is not None:
                        req.watch.posted(req)
        if settle:
            # Sends nobody waited for still go out, each after the one before it.
            while True:
                blocked = [r for r in self._streams.values() if not r.done and r.comm is None]
                if not blocked:
                    break
                self.complete(self._head(blocked[0]))

    def _put(self, req: Request) -> None:
        req.comm = self.sim.acquire(req.mailbox).put_async(req.payload, req.charged)
        sim = self.sim
        sim.messages += 1
        if sim.messages >= sim.next_report:
            sim.report()
        if req.watch is not None:
            req.watch.posted(req)

    def _head(self, req: Request) -> Request:
        """The request to wait on for ``req``: itself once posted, or for a send held behind
        others on its stream, one of them in flight."""
        while req.comm is None and req.behind is not None and not req.behind.done:
            req = req.behind
        return req

    def _may_start(self, req: Request) -> bool:
        """Whether a send may go out now: every message before it on its stream is out, and
        those still in flight hold less than the route's bandwidth-delay product (a
        connection keeps that many bytes in the pipe; on a short route, one message)."""
        ahead = 0
        r = req.behind
        while r is not None and not r.done:
            if r.comm is None:
                return False
            ahead += r.charged
            r = r.behind
        return ahead == 0 or ahead < self._pipe_bytes(req.peer)

    def _pipe_bytes(self, dest: int) -> float:
        """Bytes in flight that fill the route to ``dest`` (:meth:`Simulation.pipe_bytes`)."""
        got = self._pipe.get(dest)
        if got is None:
            got = self._pipe[dest] = self.sim.pipe_bytes(self._rank, dest)
        return got

    def complete(self, req: Request, waited: bool = False) -> None:
        """``req`` has completed, or completes now (``wait`` blocks until it has).

        ``waited``: ``wait_any`` returned it. Otherwise ``comm.wait()`` is called even on a
        comm known to be finished (one simcall, no simulated time): SimGrid 3.32 drops a comm
        from its actors' ``activities_`` lists only when a waiting simcall is answered, and
        removes from those ``std::list`` by a full pass; a comm found finished by its
        ``finish_time`` and never waited for stays listed, and every later removal passes over
        all of them (at 256 ranks with the plan's own chunks: most of the simulation's CPU).
        """
        if not waited:
            req.comm.wait()
        req.done = True
        self.sim.release(req.mailbox)
        if req.kind == "recv":
            payload, charged = req.handle.get()
            req.handle = req.comm = None
            self._charge(charged * self.sim.costs.recv_s_per_byte)
            if req.buf is None:  # by reference (_irecv_ref): the object is the result
                req.payload, req.charged = payload, charged
                return
            if payload.nbytes != req.buf.nbytes:
                raise TransportError(
                    f"rank {self._rank}: a {payload.nbytes}-byte message from rank {req.peer} "
                    f"for a {req.buf.nbytes}-byte receive")
            req.buf[...] = payload
            if req.watch is not None:
                req.watch.finished(req, charged)
        else:
            self._release(req)
            if req.watch is not None:
                req.watch.finished(req)
        req.payload = None
        req.comm = None

    def _release(self, req: Request) -> None:
        """A send is done: the stream's next message goes out now, as a connection sends what
        was handed to it without the rank's CPU (TCP's socket buffer, an RDMA queue)."""
        nxt = req.next
        while nxt is not None:
            if not nxt.done and nxt.comm is None:
                if nxt.queued or not self._may_start(nxt):
                    break
                self._put(nxt)
            nxt = nxt.next
        req.next = None
        if self._streams.get(req.stream) is req:
            del self._streams[req.stream]

    def test(self, request: Any) -> bool:
        self.flush()
        if isinstance(request, RoundsRequest):
            return self._test_rounds(request)
        head = self._head(request)
        if not request.done and (self._finished(head) or head.comm.test()):
            self.complete(head)
        return request.done

    def _test_rounds(self, rounds: RoundsRequest) -> bool:
        for r in rounds.pending():
            head = self._head(r)
            if not head.done and (self._finished(head) or head.comm.test()):
                self.complete(head)
        rounds.advance()
        return rounds.done

    def cancel(self, request: Any) -> None:
        reqs = request.pending() if isinstance(request, RoundsRequest) else [request]
        for r in reqs:
            if not r.done and r.comm is not None:
                r.comm.cancel()
                self.sim.release(r.mailbox)
            r.done = True
            if r.kind == "send":
                self._release(r)
            if r.watch is not None:
                r.watch.finished(r)

    def _finished(self, head: Request) -> bool:
        """Whether the posted ``head`` has completed, without a simcall: SimGrid sets a
        comm's ``finish_time`` (-1 until then) in the same step of its maestro that marks the
        comm done and copies its data, before any actor runs again; ``test`` and ``wait_any``
        are simcalls (two thread switches each)."""
        return head.comm.finish_time >= 0

    def completion_queue(self) -> CompletionQueue:
        """A queue that keeps one progress loop's requests between its waits (see
        :mod:`horotopo.simulation.pending`): each completion then costs time in
        proportion to the messages that can complete next, where :meth:`waitsome` passes over
        every request it is given."""
        return CompletionQueue(self)

    def waitsome(self, requests: Sequence[Any]) -> List[int]:
        return self._waitsome(requests, None)

    def waitsome_until(self, requests: Sequence[Any], deadline: float) -> List[int]:
        """:meth:`waitsome` that gives up at ``deadline``, simulated seconds: an empty list
        once the simulated clock reaches it with none completed (SimGrid's timed
        ``wait_any_for``; with no requests, a sleep until the deadline)."""
        return self._waitsome(requests, deadline)

    def _waitsome(self, requests: Sequence[Any], deadline: Optional[float]) -> List[int]:
        self.flush()
        while True:
            ready = [k for k, r in enumerate(requests) if r.done]
            if ready:
                return ready
            # The first completed head in the list's order, as wait_any would report it, found
            # without a simcall; one completion per call, as wait_any gives, so that the CPU
            # costs are charged in the same order (a receive's, then what its callback posts).
            for r in requests:
                head = r if r.comm is not None else self._head(r)
                if self._finished(head):
                    self.complete(head)
                    break
            else:
                if not self._wait_any(requests, deadline):
                    return []

    def _wait_any(self, requests: Sequence[Any], deadline: Optional[float] = None) -> bool:
        """Block until one of ``requests`` (none done) completes, and complete it; False when
        ``deadline`` (simulated seconds) came first."""
        if deadline is not None:
            left = deadline - self.now()
            if left <= 0:
                return False
            if not requests:
                self.sg.this_actor.sleep_for(left)
                return False
        # A request is its own head once posted; only sends held behind others on their
        # stream share one, and only then do the heads need making unique.
        heads = requests
        if any([r.comm is None for r in requests]):  # a list: faster than a generator
            heads = list({id(h): h for h in map(self._head, requests)}.values())
        comms = [h.comm for h in heads]
        if deadline is None:
            got = self.sg.Comm.wait_any(comms)
        else:
            got = self.sg.Comm.wait_any_for(comms, left)
            if got < 0:
                return False
        self.complete(heads[got], waited=True)
        return True

    def waitall(self, requests: Sequence[Any]) -> None:
        pending = [r for r in requests if not r.done]
        while pending:
            self.waitsome(pending)
            pending = [r for r in pending if not r.done]

    def wait(self, requests: List[Any], deadline: Optional[float], *,
             peers: Optional[Sequence[int]] = None, what: Describe = "wait",
             on_done: Any = None, busy: bool = False, spin_polls: int = 0,
             nap_s: Tuple[float, float] = (0.0, 0.0)) -> None:
        """Wait for every request in simulated time (see :meth:`Transport.wait`).

        ``deadline`` is a :meth:`now` value: simulated seconds. ``busy``, ``spin_polls`` and
        ``nap_s`` tune a wall-clock poll loop and mean nothing here.
        """
        sim_deadline = deadline
        done: List[bool] = []
        while True:
            self.flush()
            done.extend([False] * (len(requests) - len(done)))
            comms: List[Any] = []
            owners: List[Tuple[int, Request]] = []
            progressed = False
            for k in range(len(done)):
                if done[k]:
                    continue
                req = requests[k]
                if isinstance(req, RoundsRequest):
                    req.advance()
                    if req.done:
                        finished = True
                    else:
                        finished = False
                        for part in req.pending():
                            head = self._head(part)
                            comms.append(head.comm)
                            owners.append((k, head))
                else:
                    finished = req.done
                    if not finished:
                        head = self._head(req)
                        comms.append(head.comm)
                        owners.append((k, head))
                if finished:
                    done[k] = progressed = True
                    if on_done is not None:
                        on_done(k)
            if progressed:
                continue  # on_done may have appended requests; the queue may need posting
            if all(done):
                return
            if any(c is None for c in comms):
                continue  # a round posted parts that are queued: flush them first
            # the first completed, as wait_any would report it, without a simcall
            got = next((i for i, (_, head) in enumerate(owners) if self._finished(head)), -1)
            if got >= 0:
                self.complete(owners[got][1])
                continue
            if sim_deadline is None:
                got = self.sg.Comm.wait_any(comms)
            else:
                got = self.sg.Comm.wait_any_for(comms, max(0.0, sim_deadline - self.now()))
            if got < 0:
                self._time_out(requests, done, peers, what)
            self.complete(owners[got][1], waited=True)

    def _time_out(self, requests: List[Any], done: List[bool], peers: Optional[Sequence[int]],
                  what: Describe) -> None:
        pending = [k for k in range(len(done)) if not done[k]]
        missing: List[int] = []
        for k in pending:
            req = requests[k]
            if isinstance(req, RoundsRequest):
                missing += [r.peer for r in req.pending()]
            elif peers is not None:
                missing.append(peers[k])
            self.cancel(req)
        raise TransportTimeout(what(pending) if callable(what) else what, missing)
