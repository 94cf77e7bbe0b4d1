"""An in-process Transport for threads standing in for ranks (pure tests of algorithms that
run over the transport interface). Sends are eager: the payload is copied into the mailbox at
isend time, so a send completes at once and a receive when its message has arrived."""
from __future__ import annotations

import collections
import threading

import numpy as np

from horotopo.transport.base import TagAllocator, Transport, allreduce_point_to_point


class LoopWorld:
    def __init__(self, size):
        self.size = size
        self.cv = threading.Condition()
        self.boxes = collections.defaultdict(collections.deque)  # (src, dst, tag) -> payloads

    def transports(self):
        return [LoopTransport(self, r) for r in range(self.size)]


class _Req:
    def __init__(self, kind, buf=None, key=None):
        self.kind, self.buf, self.key, self.done = kind, buf, key, kind == "send"


class LoopTransport(Transport):
    def __init__(self, world, rank):
        self.world, self._rank = world, rank
        self._tags = TagAllocator(1 << 15)

    rank = property(lambda self: self._rank)
    size = property(lambda self: self.world.size)

    def isend(self, buf, dest, tag):
        with self.world.cv:
            self.world.boxes[(self._rank, dest, tag)].append(np.array(buf, copy=True))
            self.world.cv.notify_all()
        return _Req("send")

    def irecv(self, buf, source, tag):
        return _Req("recv", buf, (source, self._rank, tag))

    def irecv_any(self, buf, tag):
        # source None: matched against whichever sender's mailbox holds a message first
        return _Req("recv", buf, (None, self._rank, tag))

    def cancel(self, request):
        # MPI semantics: a cancelled receive completes without taking a message
        with self.world.cv:
            request.done = True

    def _box(self, key):
        if key[0] is not None:
            return self.world.boxes[key]
        _, dst, tag = key
        return next((box for (s, d, t), box in list(self.world.boxes.items())
                     if d == dst and t == tag and box), None)

    def _try(self, req):
        if not req.done:
            box = self._box(req.key)
            if box:
                req.buf[...] = box.popleft()
                req.done = True
        return req.done

    def test(self, request):
        with self.world.cv:
            return self._try(request)

    def waitsome(self, requests):
        with self.world.cv:
            while True:
                done = [i for i, r in enumerate(requests) if self._try(r)]
                if done:
                    return done
                self.world.cv.wait(timeout=0.05)

    def waitall(self, requests):
        pending = list(requests)
        while pending:
            self.waitsome(pending)
            pending = [r for r in pending if not r.done]

    def alloc_tags(self, count):
        return self._tags.alloc(count)

    def allreduce(self, sendbuf, recvbuf, op):
        # stands in for MPI's library allreduce (the adaptive engine agrees call times with it)
        if recvbuf is not sendbuf:
            recvbuf[...] = sendbuf
        allreduce_point_to_point(self, recvbuf, op)


def run_ranks(size, body, transport=None):
    """Run ``body(transport)`` on ``size`` threads; return their results in rank order.

    ``transport(world, rank)`` makes each rank's transport (default: a LoopTransport), for
    tests of a transport variant (one without a library allreduce, say).
    """
    world = LoopWorld(size)
    out, errors = [None] * size, []

    def main(t):
        try:
            out[t.rank] = body(t)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    ranks = (world.transports() if transport is None
             else [transport(world, r) for r in range(size)])
    threads = [threading.Thread(target=main, args=(t,)) for t in ranks]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    if errors:
        raise errors[0]
    assert not any(th.is_alive() for th in threads), "a rank thread hung"
    return out
