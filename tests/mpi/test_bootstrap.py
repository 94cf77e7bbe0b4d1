"""setup_plan on the local ranks (any size): every rank gets the same plan, from a probe, a
file or the uniform model, and every failure is raised on every rank."""
import json
import os
import tempfile

import pytest
from mpi4py import MPI

from horotopo.bootstrap import BootstrapError, setup_plan, uniform_document
from horotopo.transport import MPITransport

SMALL = dict(max_bytes=128 << 10, start_bytes=16 << 10, min_bytes=4 << 10, warm_bytes=16 << 10,
             timeout_s=60.0, budget_s=2.0, target_s=0.002)


# One transport for the bootstrap calls, one for the tests' own exchanges.
WORLD = MPITransport(MPI.COMM_WORLD)
CHECK = MPITransport(MPI.COMM_WORLD)


def everyone(value):
    return CHECK.allgather_object(value, 60, "test")


def shared_file(doc):
    """Rank 0 writes ``doc``; every rank gets the path."""
    comm = MPI.COMM_WORLD
    path = None
    if comm.rank == 0:
        path = os.path.join(tempfile.mkdtemp(), "topo.json")
        with open(path, "w") as f:
            json.dump(doc, f)
    return CHECK.broadcast_object(path, 0, 60, "test path")


def outcome(env, **kw):
    """(digest or None, error text or None) of setup_plan on this rank."""
    try:
        return setup_plan(WORLD, env=env, **kw).digest, None
    except BootstrapError as exc:
        return None, str(exc)


def test_probe_quick_plan_is_identical_everywhere():
    digest, err = outcome({"HOROTOPO_PROBE": "quick"}, probe_options=SMALL)
    results = everyone([digest, err])
    assert err is None, err
    assert len({d for d, _ in results}) == 1


def test_probe_off_is_a_ring_over_a_uniform_model():
    comm = MPI.COMM_WORLD
    lines = []
    plan = setup_plan(WORLD, env={"HOROTOPO_PROBE": "off"}, log=lines.append)
    assert len(plan.trees) == comm.size and "uniform" in plan.topology_name
    if comm.rank == 0:
        assert any("ring plan over a uniform model" in ln for ln in lines)
    else:
        assert lines == []  # the log is rank 0's
    assert len(set(everyone(plan.digest))) == 1


def test_topology_file_is_loaded_and_planned():
    comm = MPI.COMM_WORLD
    doc = uniform_document(comm.size, gbps=2.0)
    doc["name"] = "from-file"
    path = shared_file(doc)
    plan = setup_plan(WORLD, env={"HOROTOPO_TOPOLOGY": path, "HOROTOPO_PROBE": "full"})
    assert plan.topology_name == "from-file" and plan.n == comm.size
    assert len(set(everyone(plan.digest))) == 1


def test_wrong_size_file_fails_on_every_rank():
    comm = MPI.COMM_WORLD
    path = shared_file(uniform_document(comm.size + 1))
    _, err = outcome({"HOROTOPO_TOPOLOGY": path})
    errors = everyone(err)
    assert all(e and f"has {comm.size + 1} ranks but this job has {comm.size}" in e
               for e in errors), errors


def test_unreadable_file_fails_on_every_rank():
    _, err = outcome({"HOROTOPO_TOPOLOGY": "/nonexistent/topo.json"})
    errors = everyone(err)
    assert all(e and "HOROTOPO_TOPOLOGY=/nonexistent/topo.json" in e for e in errors), errors


def test_a_bad_value_on_one_rank_fails_on_every_rank():
    comm = MPI.COMM_WORLD
    last = comm.size - 1
    env = {"HOROTOPO_PROBE": "bogus" if comm.rank == last else "off"}
    _, err = outcome(env)
    errors = everyone(err)
    assert all(e and f"rank {last}: HOROTOPO_PROBE='bogus'" in e for e in errors), errors


def test_ranks_that_disagree_fail_together():
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        pytest.skip("needs two ranks to disagree")
    _, err = outcome({"HOROTOPO_PROBE": "off" if comm.rank == 0 else "quick"})
    errors = everyone(err)
    assert all(e and "ranks disagree" in e for e in errors), errors


def test_a_file_nested_200000_deep_fails_on_every_rank():
    comm = MPI.COMM_WORLD
    path = None
    if comm.rank == 0:
        path = os.path.join(tempfile.mkdtemp(), "deep.json")
        with open(path, "w") as f:
            f.write("[" * 200_000 + "]" * 200_000)
    path = CHECK.broadcast_object(path, 0, 60, "test path")
    _, err = outcome({"HOROTOPO_TOPOLOGY": path})
    errors = everyone(err)
    assert all(e and f"HOROTOPO_TOPOLOGY={path}" in e and "nested" in e for e in errors), errors
    assert len(set(errors)) == 1, errors


def test_an_unexpected_exception_on_rank_0_reaches_every_rank(monkeypatch):
    from horotopo import bootstrap

    def planner(topology, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(bootstrap, "ring_plan", planner)
    _, err = outcome({"HOROTOPO_PROBE": "off"})
    errors = everyone(err)
    assert all(e and e.endswith("RecursionError: maximum recursion depth exceeded")
               for e in errors), errors
    assert len(set(errors)) == 1, errors
