"""The probe on the local ranks (any size): a loadable topology, the same on every rank, the CLI
file round trip, and a timeout that names the pair instead of hanging."""
import json
import os
import tempfile

import pytest
from mpi4py import MPI

from horotopo.cli import main as cli_main
from horotopo.plan import make_plan
from horotopo.probe import ProbeError, measure_pairs, probe
from horotopo.probe.measure import ProbeConfig, Prober
from horotopo.topology import from_dict, load
from horotopo.transport import MPITransport

# Small messages: this tier checks the protocol and the document, not the figures.
SMALL = dict(max_bytes=128 << 10, start_bytes=16 << 10, min_bytes=4 << 10, warm_bytes=16 << 10,
             timeout_s=60.0, budget_s=2.0, target_s=0.002)


# The tests' own exchanges run on a transport of their own, apart from the probe's.
CHECK = MPITransport(MPI.COMM_WORLD)


def everyone(value):
    return CHECK.allgather_object(value, 60, "test")


def test_probe_gives_the_same_loadable_topology_on_every_rank():
    comm = MPI.COMM_WORLD
    doc = probe(MPITransport(comm), "quick", name="local", **SMALL)
    topo = from_dict(doc)
    assert topo.n == comm.size and doc["name"] == "local"
    assert doc["ranks"] == everyone(MPI.Get_processor_name())
    for i in range(comm.size):
        for j in range(comm.size):
            if i != j:
                assert doc["bandwidth_gbps"][i][j] > 0
                assert doc["latency_ms"][i][j] >= 0
    assert doc["probe"]["mode"] == "quick" and doc["probe"]["tests"] >= comm.size * (comm.size - 1)
    texts = everyone(json.dumps(doc, sort_keys=True))
    assert all(t == texts[0] for t in texts), "ranks hold different documents"


def test_cli_writes_a_file_that_plans():
    comm = MPI.COMM_WORLD
    path = CHECK.broadcast_object(os.path.join(tempfile.mkdtemp(), "probed.json")
                                  if comm.rank == 0 else None, 0, 60, "test path")
    code = cli_main(["probe", "--quick", "-q", "--max-bytes", "128K", "--timeout", "60",
                     "-o", path, "--name", "cli"])
    assert code == 0
    comm.Barrier()
    if comm.rank == 0:
        topo = load(path)
        assert topo.n == comm.size and topo.name == "cli"
        plan = make_plan(topo)
        assert plan.n == comm.size and plan.throughput_Bps > 0


def test_a_missing_peer_is_a_timeout_naming_the_pair():
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        pytest.skip("needs two ranks: a pair whose sender never sends")
    transport = MPITransport(comm)
    pr = Prober(transport, ProbeConfig.for_mode("quick", timeout_s=0.5), lambda m: None)
    pr.hosts = ["h%d" % r for r in range(comm.size)]
    error = ""
    if comm.rank == 0:
        try:
            pr._run_flows([(1, 0)], [4096])  # rank 1 never takes part
        except ProbeError as exc:
            error = str(exc)
    errors = everyone(error)
    transport.close()
    assert "rank 1 (h1) -> rank 0 (h0)" in errors[0] and "0.5 s" in errors[0], errors[0]


def test_bad_settings_fail_before_any_communication():
    with pytest.raises(ValueError, match="max_bytes"):
        probe(CHECK, "quick", max_bytes=1)


def test_measure_pairs_gives_every_rank_the_same_rates():
    comm = MPI.COMM_WORLD
    pairs = [(i, (i + 1) % comm.size) for i in range(comm.size)] if comm.size > 1 else []
    rates = measure_pairs(MPITransport(comm), pairs, **SMALL)
    assert sorted(rates) == sorted(pairs) and all(v > 0 for v in rates.values())
    got = everyone(sorted((list(k), v) for k, v in rates.items()))
    assert all(g == got[0] for g in got)
    with pytest.raises(ValueError, match="two different ranks"):
        measure_pairs(CHECK, [(0, 0)])



def test_probe_by_hosts_over_mpi_gives_rank_0_a_loadable_document():
    """The hosts scheme over real MPI: ranks paired into hosts by name (two per host, the
    lowest leading), the document on rank 0 only, every pair measured."""
    comm = MPI.COMM_WORLD
    hosts = [f"host{r // 2}" for r in range(comm.size)]
    doc = probe(MPITransport(comm), "quick", name="by-hosts", hosts=hosts, scheme="hosts",
                **SMALL)
    if comm.rank != 0:
        assert doc is None
        return
    topo = from_dict(doc)
    assert topo.n == comm.size and doc["ranks"] == hosts
    info = doc["probe"]
    assert info["scheme"] == "hosts" and info["members"] == [
        list(range(k, min(k + 2, comm.size))) for k in range(0, comm.size, 2)]
    for i in range(comm.size):
        for j in range(comm.size):
            if i != j:
                assert doc["bandwidth_gbps"][i][j] > 0
    assert make_plan(topo).throughput_Bps > 0
