"""docs/coverage.md against the code: the tables cannot claim what horotopo does not have, nor
leave out what it has."""
import re
from pathlib import Path
from typing import List, Tuple

import pytest

torch = pytest.importorskip("torch", reason="horotopo.torch needs torch (the [torch] extra)")

import horotopo.torch as hvd  # noqa: E402
from horotopo.torch.distributed import UNSUPPORTED_OPS, ProcessGroupHorotopo  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "coverage.md"

#: horovod.torch 0.28.1's public names: its __init__.py's imports and mpi_ops' public functions.
HOROVOD_TORCH = {
    "__version__", "elastic", "Compression", "allgather_object", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "allreduce", "allreduce_async",
    "allreduce_", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async",
    "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async", "allgather",
    "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_async", "broadcast_", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "init", "shutdown",
    "is_initialized", "start_timeline", "stop_timeline", "size", "local_size", "cross_size",
    "rank", "local_rank", "cross_rank", "is_homogeneous", "mpi_threads_supported",
    "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max",
    "Product", "handle_average_backwards_compatibility", "HorovodInternalError",
    "HostsUpdatedInterrupt", "DistributedOptimizer", "SyncBatchNorm",
}
#: horotopo.torch's names that Horovod does not have (named in the text under the table).
HOROTOPO_ONLY = {"retune", "HorotopoInternalError"}
STATUSES = ("supported", "partial", "not supported")


def _table(heading: str) -> List[List[str]]:
    """The rows (cells, backticks removed) of the first table after ``## heading``."""
    text = DOC.read_text()
    start = text.index(f"\n## {heading}\n")
    rows = []
    for line in text[start + 1:].splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("| `"):
            rows.append([c.strip().replace("`", "") for c in line.strip("|").split("|")])
    assert rows, f"no table under '## {heading}' in {DOC}"
    return rows


def _status(cell: str) -> str:
    status = next((s for s in sorted(STATUSES, key=len, reverse=True) if cell.startswith(s)),
                  None)
    assert status is not None, f"unknown status {cell!r} in {DOC}"
    return status


def _horovod_rows() -> List[Tuple[str, str]]:
    return [(cells[0], _status(cells[1])) for cells in _table("horovod.torch")]


def test_the_horovod_table_lists_every_horovod_symbol_once():
    names = [name for name, _ in _horovod_rows()]
    assert len(names) == len(set(names)), "a symbol is listed twice"
    assert set(names) == HOROVOD_TORCH, (
        f"missing: {sorted(HOROVOD_TORCH - set(names))}; "
        f"not Horovod's: {sorted(set(names) - HOROVOD_TORCH)}")


def test_what_the_table_supports_exists_and_what_it_does_not_is_absent():
    for name, status in _horovod_rows():
        if status == "not supported":
            assert not hasattr(hvd, name), f"{name} exists but the table says not supported"
        else:
            assert hasattr(hvd, name), f"the table says {name} is {status}, but it is missing"


def test_every_public_name_of_horotopo_torch_is_in_the_table():
    listed = {name for name, _ in _horovod_rows()}
    assert set(hvd.__all__) - listed == HOROTOPO_ONLY


def test_the_torch_distributed_table_matches_the_backend():
    rows = _table("torch.distributed")
    refused = set(UNSUPPORTED_OPS)
    for call, method, status_cell, _ in rows:
        status = _status(status_cell)
        if status == "not supported":
            assert method in refused, f"{call}: {method} is not among the refused operations"
        else:
            assert callable(getattr(ProcessGroupHorotopo, method, None)), \
                f"{call}: the backend has no {method}"
            assert method not in refused, f"{call}: {method} is refused by the backend"
    assert refused <= {row[1] for row in rows}, "a refused operation is missing from the table"


def test_the_doc_names_no_status_outside_its_words():
    for cells in _table("horovod.torch"):
        assert re.match(r"(supported|partial|not supported)$", cells[1]), cells
