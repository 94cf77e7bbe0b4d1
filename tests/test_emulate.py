"""The emulated cluster's wiring plan, refusals and launcher script (no root needed).

Nothing here touches the network: the cluster is constructed but not entered, and the
launcher script is run with a fake `ip` on PATH that prints what it was asked to do.
"""
import os
import stat
import subprocess

import pytest

from horotopo.topology import bundled
from horotopo_launch.emulate import EmulatedCluster, EmulationError, LinkRate
from horotopo_launch.mpi import MPI

MPICH = MPI("mpich", "/opt/mpich/bin/mpiexec", "5.0.2")


def _two_racks():
    return {"name": "t", "switches": ["s0", "s1"],
            "links": [{"ends": ["a", "s0"], "gbps": 0.5}, {"ends": ["b", "s1"], "gbps": 0.5},
                      {"ends": ["s0", "s1"], "gbps": [0.2, 0.1]}],
            "ranks": ["a", "b", "a"]}


def test_wiring_of_bundled_topology():
    c = EmulatedCluster(bundled("racks-2x3"), prefix="hq", mpi=MPICH)
    assert sorted(n.name for n in c.nodes) == ["p0", "p1", "p2", "q0", "q1", "q2",
                                                "tor0", "tor1"]
    assert all(n.ns.startswith("hq-") for n in c.nodes)
    assert all(link.dev.startswith("hq") and len(link.dev) <= 15 for link in c.links)
    assert len({n.ip for n in c.nodes}) == 8
    assert c.rates["tor0", "tor1"] == 0.25 and c.rates["p0", "tor0"] == 1.0
    assert len(list(c.directions())) == 14


def test_asymmetric_rates_and_rank_addresses():
    c = EmulatedCluster(_two_racks(), prefix="hq", mpi=MPICH)
    assert c.rates["s0", "s1"] == 0.2 and c.rates["s1", "s0"] == 0.1
    addrs = c.host_addresses()
    assert len(addrs) == 3 and len(set(addrs)) == 3  # rank 0 and rank 2 share host a


def test_loop_is_refused():
    doc = _two_racks()
    doc["links"].append({"ends": ["a", "s1"], "gbps": 0.5})
    with pytest.raises(EmulationError, match=r"loop .*a.*s0.*s1|loop .*s1.*a"):
        EmulatedCluster(doc, prefix="hq")


def test_measured_topology_is_refused():
    doc = {"name": "m", "ranks": ["a", "b"], "bandwidth_gbps": [[None, 1.0], [1.0, None]]}
    with pytest.raises(EmulationError, match="only a declared topology"):
        EmulatedCluster(doc, prefix="hq")


def test_bad_inputs_are_refused():
    with pytest.raises(EmulationError, match="prefix"):
        EmulatedCluster(_two_racks(), prefix="Bad-Prefix")
    doc = _two_racks()
    doc["links"][0]["gbps"] = 40.0
    with pytest.raises(EmulationError, match="more than one machine can emulate"):
        EmulatedCluster(doc, prefix="hq")
    doc = _two_racks()
    doc["links"][0]["ends"] = ["a/b", "s0"]
    doc["ranks"] = ["a/b", "b"]
    with pytest.raises(EmulationError, match="cannot name a namespace"):
        EmulatedCluster(doc, prefix="hq")
    with pytest.raises(EmulationError, match="ranks"):
        EmulatedCluster({"links": [{"ends": ["a", "b"], "gbps": 1}]}, prefix="hq")


def test_use_outside_with_block_is_refused():
    c = EmulatedCluster(_two_racks(), prefix="hq", mpi=MPICH)
    with pytest.raises(EmulationError, match="inside a `with` block"):
        c.run(["true"])
    with pytest.raises(EmulationError, match="inside a `with` block"):
        c.set_rate("a", "s0", 0.1)


def test_command_runs_mpiexec_in_the_head_namespace():
    c = EmulatedCluster(_two_racks(), prefix="hq", mpi=MPICH)
    cmd, env = c.command(["prog", "arg"], np=2, env={"K": "v"})
    assert cmd[:4] == ["ip", "netns", "exec", "hq-head"]
    s = " ".join(cmd)
    assert f"-hosts {','.join(c.host_addresses()[:2])} -n 2" in s
    assert "-iface hqbr" in s and "MPIR_CVAR_NOLOCAL 1" in s and "-genv K v" in s
    assert cmd[-2:] == ["prog", "arg"] and env["HYDRA_LAUNCHER_AUTOFORK"] == "0"
    with pytest.raises(EmulationError, match="the topology has 3 ranks"):
        c.command(["prog"], np=4)


def test_launcher_script_maps_addresses_to_namespaces(tmp_path):
    c = EmulatedCluster(_two_racks(), prefix="hq", mpi=MPICH)
    c.workdir = tmp_path / "work"
    c.launcher = c.workdir / "launch.sh"
    c._write_launcher()
    fake = tmp_path / "bin"
    fake.mkdir()
    ip = fake / "ip"
    ip.write_text('#!/bin/sh\nfor a in "$@"; do printf "[%s]" "$a"; done\necho\n')
    ip.chmod(ip.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    # hydra calls its "ssh" as: launcher -x HOST "quoted proxy" args...
    rank2 = c.host_addresses()[2]
    out = subprocess.run([str(c.launcher), "-x", rank2, '"/p/hydra_pmi_proxy"', "--id", "1"],
                         env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    assert out.strip() == ('[netns][exec][hq-a][unshare][--uts][sh][-c]'
                           '[hostname a; "/p/hydra_pmi_proxy" --id 1]')
    bad = subprocess.run([str(c.launcher), "10.1.2.3", "true"], env=env,
                         stderr=subprocess.PIPE, text=True)
    assert bad.returncode == 255 and "unknown host 10.1.2.3" in bad.stderr


def test_link_rate_error():
    row = LinkRate("a-s", "a->s", 0.5, 0.45)
    assert row.error == pytest.approx(0.1)
    assert tuple(row) == ("a-s", "a->s", 0.5, 0.45)
