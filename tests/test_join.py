"""hvd.join's negotiation without MPI: rank 0's Coordinator counts joined ranks in, answers
the collectives that cannot run with Horovod's errors, and the join once every rank has
joined; a joined rank's executor stands in zeros for the names it never asked for."""
import numpy as np
import pytest

from horotopo.api.controller import Coordinator
from horotopo.api.executors import stand_in
from horotopo.api.records import (ALLGATHER, ALLREDUCE, BARRIER, BROADCAST, JOIN, JOIN_NAME,
                                  REDUCESCATTER, Request, Response, Signature)
from horotopo.api.settings import Settings


def _sig(kind: str = ALLREDUCE, shape=(2, 3), dtype: str = "float32") -> Signature:
    return Signature(kind, dtype, shape, 1, 1.0, 1.0, 0, -1)


def _asks(size: int, **by_rank):
    """gathered request lists: by_rank maps 'r0'.. to lists of (name, kind)."""
    out = [[] for _ in range(size)]
    for key, reqs in by_rank.items():
        out[int(key[1:])] = [Request(name, _sig(kind), 0.0) for name, kind in reqs]
    return out


def test_a_joined_rank_counts_as_asking_for_every_allreduce():
    c = Coordinator(3, Settings.from_env())
    assert c.respond(_asks(3, r1=[(JOIN_NAME, JOIN)], r0=[("a", ALLREDUCE)]), False) == []
    (resp,) = c.respond(_asks(3, r2=[("a", ALLREDUCE)]), False)
    assert (resp.name, resp.kind, resp.error) == ("a", ALLREDUCE, None)


@pytest.mark.parametrize("kind,message", [
    (BROADCAST, "Broadcast is not supported with Join at this time."),
    (ALLGATHER, "Allgather is not supported with Join at this time. Specify "
                "sparse_to_dense=True if using DistributedOptimizer"),
    (REDUCESCATTER, "Reducescatter is not supported with Join at this time."),
])
def test_other_collectives_get_horovods_join_errors(kind, message):
    c = Coordinator(2, Settings.from_env())
    (resp,) = c.respond(_asks(2, r0=[(JOIN_NAME, JOIN)], r1=[("b", kind)]), False)
    assert resp.error == message


def test_the_join_is_answered_once_all_have_joined_with_the_last_rank():
    c = Coordinator(3, Settings.from_env())
    assert c.respond(_asks(3, r2=[(JOIN_NAME, JOIN)]), False) == []
    got = c.respond(_asks(3, r0=[(JOIN_NAME, JOIN)], r1=[("c", ALLREDUCE)]), False)
    assert [(r.name, r.kind) for r in got] == [("c", ALLREDUCE)]
    got = c.respond(_asks(3, r1=[("e", ALLREDUCE), (JOIN_NAME, JOIN)]), False)
    assert [(r.name, r.kind) for r in got] == [("e", ALLREDUCE), (JOIN_NAME, JOIN)]
    assert got[-1].extra == [1]
    # The next round starts afresh: nobody has joined.
    assert c.respond(_asks(3, r0=[("d", ALLREDUCE)]), False) == []
    assert c.joined == []


def test_stand_in_entries_are_zeros_for_allreduce_and_empty_for_errors():
    e = stand_in(Response(ALLREDUCE, "z", None, _sig(shape=(4,), dtype="int64")))
    assert e.array is e.output and e.array.dtype == np.int64 and not e.array.any()
    assert e.array.shape == (4,)
    e = stand_in(Response(BROADCAST, "w", "Broadcast is not supported with Join at this time.",
                          _sig(BROADCAST)))
    assert e.array is None


def test_a_barrier_releases_the_ranks_that_have_not_joined_as_horovods_does():
    c = Coordinator(3, Settings.from_env())
    (resp,) = c.respond(_asks(3, r0=[(JOIN_NAME, JOIN)], r1=[("b", BARRIER)],
                              r2=[("b", BARRIER)]), False)
    assert (resp.kind, resp.error) == (BARRIER, None)


def test_with_a_rank_joined_each_rank_gets_its_allgather_error_without_waiting_for_the_others():
    """Unnamed calls are numbered per rank, so ranks that sat in join at different times ask
    under different names: each request fails on its own, and nobody waits for a name that
    another rank will never ask for. An allreduce still waits for every rank."""
    c = Coordinator(3, Settings.from_env())
    got = c.respond(_asks(3, r1=[(JOIN_NAME, JOIN)], r0=[("allgather.noname.4", ALLGATHER)],
                          r2=[("allgather.noname.5", ALLGATHER), ("s", ALLREDUCE)]), False)
    assert sorted((r.name, r.error.split(" is ")[0]) for r in got) == [
        ("allgather.noname.4", "Allgather"), ("allgather.noname.5", "Allgather")]
    assert c.respond(_asks(3, r0=[("s", ALLREDUCE)]), False)[0].error is None
