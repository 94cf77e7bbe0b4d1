"""The runtime's typed records and settings: fields by name, sizes, what crosses ranks
(pickled in negotiation), and the fusion plan built on them."""
import math
import pickle

import numpy as np
import pytest

from horotopo.api.fusion import FusionGroup, plan_fusion
from horotopo.api.queue import RequestQueue
from horotopo.api.records import (ALLGATHER, ALLREDUCE, BARRIER, BROADCAST, Entry, Handle,
                                  Request, Response, Signature)
from horotopo.api.settings import Settings


def _sig(kind=ALLREDUCE, dtype="float32", shape=(2, 3), op=1, root=0, device=-1):
    return Signature(kind, dtype, shape, op, 1.0, 1.0, root, device)


def test_signature_fields_size_and_side():
    sig = _sig(shape=(4, 5), device=2)
    assert (sig.kind, sig.dtype, sig.shape, sig.root, sig.device) == \
        (ALLREDUCE, "float32", (4, 5), 0, 2)
    assert sig.nbytes == 80 and not sig.on_host and _sig().on_host
    # bfloat16 has a size even where NumPy does not know the name
    assert _sig(dtype="bfloat16", shape=(3,)).nbytes == 6
    assert _sig(dtype="int8", shape=()).nbytes == 1
    assert _sig() == _sig() and _sig() != _sig(root=1)


def test_what_crosses_ranks_pickles_to_equal_records():
    sig = _sig(kind=ALLGATHER)
    msgs = [Request("g", sig, 0.25), Response(ALLGATHER, "g", None, sig, [2, 0, 1]),
            Response(BARRIER, "b", "Mismatched operations.", _sig(kind=BARRIER))]
    back = pickle.loads(pickle.dumps(msgs))
    assert back == msgs and isinstance(back[1].sig, Signature)
    assert back[1].extra == [2, 0, 1] and back[2].error == "Mismatched operations."


def test_queue_builds_entries_and_handles_resolve_in_order():
    queue = RequestQueue()
    queue.size = 2
    x = np.ones((2, 3), np.float16)
    hid = queue.enqueue(BROADCAST, [("x", x, x), ("r", None, None)], op=1, root=1)
    (ex, er), stopping = queue.take()
    assert not stopping and isinstance(ex, Entry) and not ex.sent
    assert ex.sig == Signature(BROADCAST, "float16", (2, 3), 1, 1.0, 1.0, 1, -1)
    assert er.sig == Signature(BROADCAST, "uint8", (), 1, 1.0, 1.0, 1, -1)  # data-less
    assert ex.handle is er.handle and (ex.index, er.index) == (0, 1)
    assert queue.pending_names == {"x", "r"}
    queue.finish([er], ["second"])
    assert not queue.poll(hid)
    queue.finish([ex], ["first"])
    assert queue.poll(hid) and queue.wait(hid, alive=lambda: True) == ["first", "second"]
    assert queue.pending_names == set()


def test_polling_an_unfinished_handle_gives_up_the_gil(monkeypatch):
    """A loop that spins on poll would otherwise hold the GIL that the background thread
    needs to finish the op, each hand-back waiting out the interpreter's switch interval."""
    from horotopo.api import queue as queue_module
    yields = []
    monkeypatch.setattr(queue_module.time, "sleep", yields.append)
    queue = RequestQueue()
    queue.size = 2
    x = np.ones(3, np.float32)
    hid = queue.enqueue(BROADCAST, [("x", x, x)], op=1, root=0)
    (entry,), _ = queue.take()
    assert not queue.poll(hid) and yields == [0]
    queue.finish([entry], ["done"])
    assert queue.poll(hid) and yields == [0]  # a finished handle answers at once


def test_a_handle_keeps_the_first_error():
    handle = Handle(7, 2)
    handle.resolve(1, error="first")
    handle.resolve(0, "value", error="second")
    assert handle.done and handle.error == "first" and handle.results == ["value", None]


def test_fusion_plan_groups_by_key_in_response_order():
    a = Response(ALLREDUCE, "a", None, _sig(shape=(4,)))           # 16 bytes
    b = Response(BROADCAST, "b", None, _sig(kind=BROADCAST, shape=(2,), root=1))
    c = Response(ALLREDUCE, "c", None, _sig(shape=(4,)))
    d = Response(ALLREDUCE, "d", "Mismatched data types.", _sig(shape=(4,)))
    e = Response(ALLREDUCE, "e", None, _sig(shape=(4,), device=0))  # never with host tensors
    f = Response(ALLREDUCE, "f", None, _sig(shape=(4,)))           # over the threshold
    order = plan_fusion([a, b, c, d, e, f], threshold=32)
    shaped = [[r.name for r in x.responses] if isinstance(x, FusionGroup) else x.name
              for x in order]
    assert shaped == [["a", "c"], ["b"], "d", ["e"], ["f"]]
    assert order[0].nbytes == 32 and order[0].kind == ALLREDUCE


def test_settings_from_env_with_overrides(monkeypatch):
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "4")
    cfg = Settings.from_env(fusion_threshold=-5, cycle_time_s=-1.0)
    assert cfg.fusion_threshold == 0 and cfg.cycle_time_s == 0.0
    assert cfg.stall_check and cfg.reroute_s == 2.0
    off = Settings.from_env(stall_check=0.0)
    assert not off.stall_check and math.isinf(off.reroute_s)
    with pytest.raises(TypeError, match="unknown runtime settings: fusion"):
        Settings.from_env(fusion=1)
