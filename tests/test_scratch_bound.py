"""The engine's receive scratch is bounded whatever the mix of calls: one block per array
module, the largest handed out, shared by the dtypes (a block per dtype would hold a scratch
window per dtype reduced). Counted in entries and bytes, not resident memory."""
import threading

import numpy as np

from horotopo.buffers import ScratchPool
from horotopo.engine import Engine
from horotopo.packing import ring_parents
from horotopo.plan import plan_from_trees
from loop_transport import LoopWorld

DTYPES = ("float16", "float32", "float64", "int32", "int64")


def test_one_block_serves_every_dtype_and_grows_to_the_largest_request():
    pool = ScratchPool()
    for dtype in DTYPES:
        got = pool.get(1000, np.zeros(1, dtype=dtype))
        assert got.dtype == np.dtype(dtype) and got.shape == (1000,)
        got[:] = 7  # writable, the whole view
    assert list(pool._blocks) == ["numpy"] and pool.held_bytes == 1000 * 8
    assert pool.get(0, np.zeros(1, np.float32)).shape == (0,)
    block = pool.get(3000, np.zeros(1, np.float64))
    assert block.shape == (3000,) and list(pool._blocks) == ["numpy"]
    assert pool.held_bytes == 3000 * 8


def test_a_mixed_job_holds_one_scratch_block_per_engine():
    n = 2
    plan = plan_from_trees(n, [(r, *ring_parents(n, r), 1.0) for r in range(n)],
                           chunk_bytes=64 << 10)
    held = {}

    def rank(t):
        eng = Engine(t, plan)
        rng = np.random.default_rng(3)
        for _ in range(60):
            dtype = DTYPES[int(rng.integers(len(DTYPES)))]
            count = int(rng.integers(1, 1 << 18))
            alg = ("tree", "ring", "dbtree")[int(rng.integers(3))]
            out = eng.allreduce(np.ones(count, dtype=dtype), algorithm=alg)
            assert np.all(out == 2)
        held[t.rank] = (len(eng._pool._blocks), eng._pool.held_bytes)
        eng.close()

    threads = [threading.Thread(target=rank, args=(t,)) for t in LoopWorld(n).transports()]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert len(held) == n
    for blocks, nbytes in held.values():
        # one block, no larger than the largest call's bytes (the tree's window is smaller)
        assert blocks == 1 and nbytes <= (1 << 18) * 8, (blocks, nbytes)
