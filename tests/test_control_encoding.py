"""The control plane's plain encoding (horotopo.transport.wire): what the ranks' control
messages hold survives the trip, and a peer's bytes can build nothing but plain values, within
a size and depth limit."""
import math
import pickle

import numpy as np
import pytest

from horotopo.api.records import (Request, Response, Signature, request_rows, requests_from,
                                  response_rows, responses_from)
from horotopo.transport import wire
from loop_transport import run_ranks


def test_plain_values_round_trip_with_their_types():
    value = {"mode": "quick", "path": None, "ok": True, "n": 3, "x": -0.1,
             (0, 1): 2.5e9, "pairs": [(1, 2), (3, 4)], "raw": b"\x00\xff",
             "rates": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.int64(7),
             "nan": math.nan}
    got = wire.decode(wire.encode(value))
    assert set(got) == set(value)
    assert got[(0, 1)] == 2.5e9 and got["pairs"] == [(1, 2), (3, 4)] and got["raw"] == b"\x00\xff"
    assert got["rates"].dtype == np.float32 and np.array_equal(got["rates"], value["rates"])
    assert got["i"] == 7 and type(got["i"]) is int and math.isnan(got["nan"])


def test_negotiation_records_round_trip():
    sig = Signature("ALLREDUCE", "float32", (4, 2), 1, 1.0, 0.5, 0, -1, 0)
    reqs = [Request("grad", sig, 0.25, "call", 2)]
    resps = [Response("ALLGATHER", "g", None, sig, [1, 2]), Response("BROADCAST", "b", "no", sig)]
    assert requests_from(wire.decode(wire.encode(request_rows(reqs)))) == reqs
    assert responses_from(wire.decode(wire.encode(response_rows(resps)))) == resps


@pytest.mark.parametrize("bad", [object(), {1, 2}, np.array(["a"]), len])
def test_anything_but_plain_values_is_refused_when_sent(bad):
    with pytest.raises(wire.WireError, match="plain values only"):
        wire.encode({"x": [bad]})


def test_a_peer_cannot_make_the_receiver_unpickle_or_build_objects():
    with pytest.raises(wire.WireError):
        wire.decode(pickle.dumps({"a": 1}))
    with pytest.raises(wire.WireError, match="unknown form"):
        wire.decode(b'{"os.system": "true"}')
    with pytest.raises(wire.WireError, match="array of dtype object"):
        wire.decode(b'{"a": ["|O", [1], [1]]}')


def test_size_and_depth_limits():
    with pytest.raises(wire.WireError, match="exceeds the limit of 10 bytes"):
        wire.decode(wire.encode("x" * 20), limit=10)
    with pytest.raises(wire.WireError, match="nest"):
        wire.decode(b"[" * 100_000 + b"]" * 100_000)
    deep = []
    for _ in range(wire.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(wire.WireError, match="deeper than"):
        wire.encode(deep)


def test_the_transport_object_steps_carry_plain_values():
    def body(t):
        got = t.allgather_object({"rank": t.rank, "pair": (t.rank, 1)}, 10.0)
        root = t.broadcast_object({(0, 1): 1.5} if t.rank == 0 else None, 0, 10.0)
        return got, root

    for got, root in run_ranks(3, body):
        assert got == [{"rank": r, "pair": (r, 1)} for r in range(3)]
        assert root == {(0, 1): 1.5}
