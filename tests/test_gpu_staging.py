"""Stager's double buffering, driven by a fake copier and fake MPI requests.

The fakes are adversarial in time: an asynchronous copy or message lands either as early or as
late as CUDA/MPI would allow (at issue, or only when its event/request is waited). A stager
that read a slot before its copy finished, or reused a slot that a send, receive or copy still
uses, gets wrong data in one of the two timings.
"""
import numpy as np
import pytest

from horotopo.gpu import Stager

TIMINGS = ["early", "late"]


def _bytes(a):
    return np.asarray(a).view(np.uint8).reshape(-1)


class FakeEvent:
    def __init__(self, run):
        self.run = run

    def complete(self):
        if self.run is not None:
            self.run()
            self.run = None


class FakeCopier:
    """Copies between 'device' arrays (NumPy here) and pinned slots, completing at a chosen time."""

    def __init__(self, timing, log):
        self.timing = timing
        self.log = log
        self.pending = []  # copies the current stream is ordered after (h2d)

    def pinned(self, nbytes):
        return np.zeros(nbytes, np.uint8)

    def _copy(self, run):
        ev = FakeEvent(run)
        if self.timing == "early":
            ev.complete()
        return ev

    def d2h(self, host, dev):
        self.log.append(("d2h", int(dev[0])))
        snapshot = dev.copy()

        def run():  # bytes, as cudaMemcpyAsync copies them
            _bytes(host)[...] = _bytes(snapshot)
        return self._copy(run)

    def h2d(self, dev, host):
        self.log.append(("h2d",))

        def run():  # reads the slot only when the copy executes
            _bytes(dev)[...] = _bytes(host)
        ev = self._copy(run)
        self.pending.append(ev)
        return ev

    def wait(self, ev):
        ev.complete()

    def run_stream(self):
        """What a kernel on the current stream sees: every h2d it was ordered after is done."""
        for ev in self.pending:
            ev.complete()
        self.pending.clear()


class FakeRequest:
    def __init__(self, name, run, timing, log):
        self.name, self.run, self.log = name, run, log
        if timing == "early":
            self.run()
            self.run = None

    def Wait(self):
        self.log.append(("wait", self.name))
        if self.run is not None:
            self.run()
            self.run = None


def _chunks(n, size=5):
    # Chunk k holds k*1000 + i, so a chunk in the wrong place is obvious.
    return [np.arange(size, dtype=np.float64) + 1000.0 * k for k in range(n)]


@pytest.mark.parametrize("copy_timing", TIMINGS)
@pytest.mark.parametrize("send_timing", TIMINGS)
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_send_delivers_every_chunk(copy_timing, send_timing, slots):
    log = []
    dev = _chunks(7)
    st = Stager(dev[0].nbytes, slots=slots, copier=FakeCopier(copy_timing, log))
    sent = {}

    def isend(k, host):
        assert host.dtype == np.float64 and host.shape == dev[k].shape

        def run():  # MPI may read the buffer any time until the request completes
            sent[k] = host.copy()
        return FakeRequest(("send", k), run, send_timing, log)

    reqs = st.send(dev, isend)
    assert len(reqs) == 7
    st.drain()
    for k, chunk in enumerate(dev):
        np.testing.assert_array_equal(sent[k], chunk)


def test_send_overlaps_copy_of_next_chunk_with_current_send():
    log = []
    dev = _chunks(4)
    st = Stager(dev[0].nbytes, slots=2, copier=FakeCopier("late", log))
    st.send(dev, lambda k, host: FakeRequest(("send", k), lambda: None, "late", log))
    st.drain()
    pos = {e: i for i, e in enumerate(log)}
    for k in range(3):
        # The copy of k+1 starts before send k is waited on: double buffering.
        assert pos[("d2h", 1000 * (k + 1))] < pos[("wait", ("send", k))]
    for k in range(2):
        # ...and a slot is refilled only after the send that used it completed.
        assert pos[("wait", ("send", k))] < pos[("d2h", 1000 * (k + 2))]


@pytest.mark.parametrize("copy_timing", TIMINGS)
@pytest.mark.parametrize("recv_timing", TIMINGS)
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_receive_lands_every_chunk_on_the_device(copy_timing, recv_timing, slots):
    log = []
    n = 6
    messages = _chunks(n)
    dev = [np.zeros_like(m) for m in messages]
    copier = FakeCopier(copy_timing, log)
    st = Stager(dev[0].nbytes, slots=slots, copier=copier)

    def irecv(k, host):
        def run():  # the message may land any time until the request completes
            host[...] = messages[k]
        return FakeRequest(("recv", k), run, recv_timing, log)

    seen = []
    for k in st.receive(dev, irecv):
        copier.run_stream()  # the reduce runs on the stream that waits for the h2d
        seen.append(k)
        np.testing.assert_array_equal(dev[k], messages[k])
    st.drain()
    assert seen == list(range(n))


def test_receive_posts_ahead_by_the_number_of_slots():
    log = []
    dev = [np.zeros(3) for _ in range(4)]
    st = Stager(dev[0].nbytes, slots=2, copier=FakeCopier("early", log))
    posted = []

    def irecv(k, host):
        posted.append(k)
        return FakeRequest(("recv", k), lambda: None, "early", log)

    it = st.receive(dev, irecv)
    assert next(it) == 0
    assert posted == [0, 1]  # chunk 1 is on its way while chunk 0 is reduced
    list(it)
    assert posted == [0, 1, 2, 3]


def test_chunk_larger_than_slot_is_rejected():
    st = Stager(16, copier=FakeCopier("early", []))
    with pytest.raises(ValueError, match="exceeds"):
        st.to_host(np.zeros(3))


def test_reusing_a_slot_with_an_unloaded_receive_is_an_error():
    st = Stager(24, slots=1, copier=FakeCopier("early", []))
    st.recv_slot(np.zeros(3))
    with pytest.raises(RuntimeError, match="to_device"):
        st.to_host(np.zeros(3))
    st.drain()
    st.to_host(np.zeros(3))  # drained: the slot is free again


class _Dev(np.ndarray):
    """A NumPy array that the staging transport treats as a device buffer."""


class _InnerRequest:
    def __init__(self):
        self.complete = False


class RecordingTransport:
    """An inner transport that records what was posted; requests complete when told to."""

    rank, size = 0, 2

    def __init__(self):
        self.posted = []

    def isend(self, buf, dest, tag):
        self.posted.append(("send", tag, bytes(np.asarray(buf).view(np.uint8))))
        return _InnerRequest()

    def irecv(self, buf, source, tag):
        req = _InnerRequest()
        req.buf = buf
        self.posted.append(("recv", tag))
        return req

    def test(self, req):
        return req.complete

    def waitsome(self, reqs):
        done = [i for i, r in enumerate(reqs) if r.complete]
        assert done, "would block forever"
        return done


class PollCopier(FakeCopier):
    """Copies finish only when waited on or when the test calls finish_copies()."""

    def __init__(self):
        super().__init__("late", [])
        self.issued = []

    def _copy(self, run):
        ev = super()._copy(run)
        self.issued.append(ev)
        return ev

    def finish_copies(self):
        for ev in self.issued:
            ev.complete()

    def done(self, ev):
        return ev.run is None


def _staging(inner):
    from horotopo.gpu import StagingTransport
    return StagingTransport(inner, copier=PollCopier(), is_device=lambda b: isinstance(b, _Dev))


def test_staged_sends_are_posted_in_order_after_their_copy():
    inner = RecordingTransport()
    st = _staging(inner)
    dev = np.arange(4, dtype=np.int32).view(_Dev)
    host = np.array([9, 9], dtype=np.int32)
    r1 = st.isend(dev, 1, 7)
    r2 = st.isend(host, 1, 7)  # a host buffer behind a device one must not overtake it
    assert inner.posted == []
    assert st.test(r1) is False and inner.posted == []  # copy not finished: nothing posted
    st.copier.finish_copies()
    assert st.test(r1) is False  # posted now, not yet complete
    assert [p[1:] for p in inner.posted] == [(7, dev.tobytes()), (7, host.tobytes())]
    for p in (r1, r2):
        p.inner.complete = True
    assert st.waitsome([r1, r2]) == [0, 1]


def test_staged_receive_copies_to_the_device_on_completion():
    inner = RecordingTransport()
    st = _staging(inner)
    dev = np.zeros(3, dtype=np.float64).view(_Dev)
    req = st.irecv(dev, 1, 3)
    assert st.test(req) is False
    req.inner.buf[...] = np.array([1.5, 2.5, 3.5]).view(np.uint8)  # the message lands
    req.inner.complete = True
    assert st.waitsome([req]) == [0]
    st.copier.run_stream()  # the reduce that follows runs after the queued copy
    np.testing.assert_array_equal(dev, [1.5, 2.5, 3.5])
    assert st.staged_bytes == dev.nbytes


def test_pinned_slots_are_reused_after_completion():
    inner = RecordingTransport()
    st = _staging(inner)
    made = []
    orig = st.copier.pinned
    st.copier.pinned = lambda n: made.append(n) or orig(n)
    for _ in range(5):
        r = st.isend(np.ones(100).view(_Dev), 1, 0)
        st.copier.wait(r.event)
        st.test(r)
        r.inner.complete = True
        assert st.test(r)
    assert len(made) == 1


class _CountingControl:
    """A transport with a communicator whose control allreduces are counted."""

    comm = object()

    def __init__(self):
        self.control_calls = 0

    def allreduce_control(self, buf, op, timeout_s=None, what="allreduce"):
        self.control_calls += 1


@pytest.mark.parametrize("device, aware", [(False, False), (True, False), (True, True)])
def test_the_staging_decision_is_made_once_per_transport(monkeypatch, device, aware):
    # The runtime decides for user point-to-point traffic, then its engine asks for the same
    # transport: the second ask must cost no collective (ranks would still agree, but each
    # extra allreduce is a round over the whole job at init).
    from horotopo.gpu import StagingTransport, awareness, env
    from horotopo.gpu.transport import staging_if_needed

    monkeypatch.setattr(env, "device_status", lambda: (device, ""))
    aware_calls = []
    monkeypatch.setattr(awareness, "cuda_aware", lambda comm: aware_calls.append(comm) or aware)
    transport = _CountingControl()
    first, second = staging_if_needed(transport), staging_if_needed(transport)
    assert transport.control_calls == 1
    assert len(aware_calls) == (1 if device else 0)
    staged = device and not aware
    assert isinstance(first, StagingTransport) == staged
    assert isinstance(second, StagingTransport) == staged
    if staged:
        # each caller gets its own wrapper: a StagingTransport's slots are per caller
        assert first is not second and first.inner is second.inner is transport
    else:
        assert first is second is transport
    other = _CountingControl()
    staging_if_needed(other)
    assert other.control_calls == 1  # a new transport decides anew
