"""The transport's small collective steps over MPI (any size): point to point (naming missing
peers) and through MPI's nonblocking collectives (above ``named_max_ranks``) give the same
results, and a rank that never comes is named."""
import numpy as np
import pytest
from mpi4py import MPI

from horotopo.transport import MPITransport, TransportTimeout

COMM = MPI.COMM_WORLD
CHECK = MPITransport(COMM)  # the tests' own exchanges, apart from the transports under test


def steps(t):
    n, me = t.size, t.rank
    vec = np.array([me, -me, 0.5], dtype=np.float64)
    t.allreduce_control(vec, "max", timeout_s=30)
    total = np.array([me + 1], dtype=np.int64)
    t.allreduce_control(total, "sum", timeout_s=30)
    t.barrier(30)
    return {"bcast": [t.broadcast_bytes(bytes([r]) * (r + 1) if me == r else None, r, 30)
                      for r in range(n)],
            "empty": t.broadcast_bytes(b"" if me == 0 else None, 0, 30),
            "gather": t.gather_bytes(b"g" * me, n - 1, 30),
            "allgather": t.allgather_object({"rank": me, "pad": "x" * (100 * me)}, 30),
            "vec": vec.tolist(), "total": int(total[0])}


@pytest.mark.parametrize("named_max_ranks", [0, 64], ids=["mpi-collectives", "point-to-point"])
def test_steps_give_the_same_results_either_way(named_max_ranks):
    t = MPITransport(COMM, named_max_ranks=named_max_ranks)
    try:
        got = steps(t)
    finally:
        t.close()
    n, me = COMM.size, COMM.rank
    assert got["bcast"] == [bytes([r]) * (r + 1) for r in range(n)]
    assert got["empty"] == b""
    assert got["gather"] == ([b"g" * r for r in range(n)] if me == n - 1 else None)
    assert got["allgather"] == [{"rank": r, "pad": "x" * (100 * r)} for r in range(n)]
    assert got["vec"] == [n - 1, 0, 0.5] and got["total"] == n * (n + 1) // 2


def test_a_rank_that_never_comes_is_named():
    if COMM.size < 2:
        pytest.skip("needs two ranks: a second rank must stay away")
    absent = COMM.size - 1
    t = MPITransport(COMM)
    error = None
    if COMM.rank != absent:
        try:
            t.allgather_bytes(b"hi", 0.5, "settings")
        except TransportTimeout as exc:
            error = (str(exc), list(exc.missing))
    errors = CHECK.allgather_object(error, 60, "test")
    for r, e in enumerate(errors):
        if r == absent:
            assert e is None
        else:
            assert e == (f"settings: nothing from rank {absent} within 0.5 s", [absent]), e


def test_iallreduce_control_matches_the_point_to_point_step():
    """MPI's Iallreduce (the runtime's control cycle) and the generic point-to-point version
    give the same vectors, waited for through the one poll loop."""
    from horotopo.transport.base import Transport
    from horotopo.transport.poll import deadline_after

    n, me = COMM.size, COMM.rank
    t = MPITransport(COMM)
    try:
        got = {}
        for how, start in (("mpi", t.iallreduce_control),
                           ("p2p", lambda buf, op: Transport.iallreduce_control(t, buf, op))):
            flags = np.array([0b1111 & ~(1 << (me % 4)), (1 << 64) - 1], dtype=np.uint64)
            total = np.array([me + 1, -me], dtype=np.int64)
            reqs = [start(flags, "band"), start(total, "sum")]
            t.wait(reqs, deadline_after(30), what=f"control ({how})")
            got[how] = (flags.tolist(), total.tolist())
    finally:
        t.close()
    want = 0b1111
    for r in range(n):
        want &= ~(1 << (r % 4))
    assert got["mpi"] == got["p2p"] == ([want, (1 << 64) - 1],
                                        [n * (n + 1) // 2, -(n * (n - 1) // 2)])
