"""Unit tests of horotopo.torch that need no MPI (multi-rank ones are in tests/mpi/)."""
import pytest

torch = pytest.importorskip("torch", reason="horotopo.torch needs torch (the [torch] extra)")

import horotopo.torch as hvd  # noqa: E402
from horotopo.torch.optimizer import _split  # noqa: E402


def test_surface_has_horovods_names():
    for name in ("init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
                 "cross_rank", "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built",
                 "gloo_enabled", "gloo_built", "nccl_built", "ccl_built", "cuda_built",
                 "rocm_built", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
                 "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
                 "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast",
                 "broadcast_", "broadcast_async", "broadcast_async_", "barrier", "poll",
                 "synchronize", "broadcast_parameters", "broadcast_optimizer_state",
                 "broadcast_object", "allgather_object", "Compression", "DistributedOptimizer",
                 "HorovodInternalError", "HorotopoInternalError", "alltoall", "reducescatter",
                 "join"):
        assert hasattr(hvd, name), name
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert hvd.mpi_built() and not hvd.gloo_built() and not hvd.nccl_built()


def test_fp16_compression_round_trips_floats_and_leaves_integers():
    x = torch.tensor([1.5, -2.25], dtype=torch.float32)
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(c, ctx)
    assert back.dtype == torch.float32 and torch.equal(back, x)
    i = torch.tensor([3, 4])
    c, ctx = hvd.Compression.fp16.compress(i)
    assert c.dtype == torch.int64 and hvd.Compression.fp16.decompress(c, ctx) is c
    n, ctx = hvd.Compression.none.compress(x)
    assert n is x and hvd.Compression.none.decompress(n, ctx) is x


def test_split_makes_even_contiguous_groups():
    assert _split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert _split([1, 2], 4) == [[1], [2]]


def _opt():
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_distributed_optimizer_argument_errors():
    model, opt = _opt()
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.DistributedOptimizer(opt, model.named_parameters(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op"):
        hvd.DistributedOptimizer(opt, model.named_parameters(), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    adasum = hvd.DistributedOptimizer(opt, model.named_parameters(), op=hvd.Adasum)
    assert isinstance(adasum, torch.optim.SGD)
    with pytest.raises(AssertionError, match="not supported when using Adasum optimizer"):
        adasum.skip_synchronize()
    with pytest.raises(ValueError, match="has not been initialized"):   # an unregistered set
        hvd.DistributedOptimizer(opt, model.named_parameters(),
                                 process_set=hvd.ProcessSet([0]))


def test_distributed_optimizer_checks_parameter_names():
    model, opt = _opt()
    w, b = model.weight, model.bias
    with pytest.raises(ValueError, match="must be unique. Found duplicates: x"):
        hvd.DistributedOptimizer(opt, [("x", w), ("x", b)])
    with pytest.raises(ValueError, match="sequence of tuples"):
        hvd.DistributedOptimizer(opt, [w, b])
    with pytest.raises(ValueError, match="were not named"):
        hvd.DistributedOptimizer(opt, [("w", w)])
    with pytest.raises(ValueError, match="groups should be"):
        hvd.DistributedOptimizer(opt, model.named_parameters(), groups=-1)
    with pytest.raises(ValueError, match="only appear once"):
        hvd.DistributedOptimizer(opt, model.named_parameters(), groups=[[w], [w]])
