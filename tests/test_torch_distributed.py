"""horotopo.torch.distributed without MPI: the launch checks, the op table, registration."""
import pytest

torch = pytest.importorskip("torch", reason="horotopo.torch needs torch (the [torch] extra)")

import torch.distributed as dist  # noqa: E402

import horotopo.torch.distributed as htd  # noqa: E402
from horotopo.api.ops import Average, Max, Min, Product, Sum  # noqa: E402
from horotopo.torch.distributed.backend import hvd_op  # noqa: E402
from horotopo.torch.distributed.launch import (check_ranks, refuse_torchrun,  # noqa: E402
                                                wants_mpi_rendezvous)

TORCHRUN = {"TORCHELASTIC_RUN_ID": "abc", "LOCAL_WORLD_SIZE": "2", "RANK": "1",
            "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}


def test_torchrun_is_refused_with_how_to_launch():
    with pytest.raises(RuntimeError, match=r"torchrun.*WORLD_SIZE=2.*mpirun -n N.*horotopo-run"):
        refuse_torchrun(2, 1, env=TORCHRUN)
    refuse_torchrun(2, 2, env=TORCHRUN)      # torchrun inside an MPI job of the right size
    refuse_torchrun(1, 1, env=TORCHRUN)      # a job of one needs no launcher
    refuse_torchrun(2, 1, env={"WORLD_SIZE": "2"})  # not torchrun: check_ranks reports it
    env = {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"}
    with pytest.raises(RuntimeError, match="torchrun"):
        refuse_torchrun(4, 1, env=env)


def test_a_rank_or_size_that_is_not_mpis_names_both():
    check_ranks(1, 4, 1, 4)
    with pytest.raises(RuntimeError, match=r"rank 3 of 4 .*MPI says rank 1 of 2"):
        check_ranks(3, 4, 1, 2)
    with pytest.raises(RuntimeError, match=r"rank 0 of 2 .*MPI says rank 0 of 3"):
        check_ranks(0, 2, 0, 3)


def test_env_rendezvous_goes_over_mpi_only_without_a_store_address():
    assert wants_mpi_rendezvous({})
    assert wants_mpi_rendezvous({"RANK": "0", "WORLD_SIZE": "2"})
    assert not wants_mpi_rendezvous({"MASTER_ADDR": "h"})
    assert not wants_mpi_rendezvous({"MASTER_PORT": "29500"})


def test_reduce_ops_map_to_horotopos_and_the_rest_name_themselves():
    R = dist.ReduceOp
    assert [hvd_op(o) for o in (R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT)] == \
        [Sum, Average, Min, Max, Product]
    for op in (R.BAND, R.BOR, R.BXOR):
        with pytest.raises(ValueError, match=f"no reduction {op.name}"):
            hvd_op(op)


def test_import_registers_the_backend_once():
    assert "horotopo" in dist.Backend.backend_list
    assert dist.Backend._plugins["HOROTOPO"].creator_fn is htd.backend.create_process_group
    handlers = __import__("importlib").import_module(
        "torch.distributed.rendezvous")._rendezvous_handlers
    wrapped = handlers["env"]
    htd.register()
    assert handlers["env"] is wrapped and hasattr(wrapped, "_horotopo_wraps")
    # torch's own cpu default stays gloo: registering claims no device
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_users_tags_are_never_a_collectives():
    # the MPI transport's tag allocator hands out exactly the tags below user_tags()
    from mpi4py import MPI

    from horotopo.transport.base import TransportError
    from horotopo.transport.mpi import MPITransport

    t = MPITransport(MPI.COMM_SELF)
    try:
        users = t.user_tags()
        assert len(users) >= 16383 and users.stop - 1 == MPI.COMM_SELF.Get_attr(MPI.TAG_UB)
        assert t.alloc_tags(users.start - 1) == 1  # the whole allocator range fits below
        with pytest.raises(TransportError, match="only"):
            t.alloc_tags(users.start)
    finally:
        t.close()
