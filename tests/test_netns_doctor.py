"""Emulated-network tier: ``horotopo doctor`` across real shaped links names what the bundled
topology declares slow, and nothing else (root only).

- slow-nic: four hosts behind one switch, n2's NIC at 0.2 gbps against 0.8: the doctor names
  n2's NIC (out and in) and nothing else;
- racks-2x3: two racks of three hosts with 1 gbps NICs behind a 0.25 gbps uplink: the doctor
  names the uplink, both ways, as a shared link with the hosts of each rack behind it, and
  no NIC or host pair.

Skipped with the reason from ``available()`` where namespaces cannot be made.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from horotopo.topology import bundled, load
from horotopo_launch import emulate

_OK, _WHY = emulate.available()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(not _OK, reason=_WHY)]


def _doctor(name: str, tmp_path: Path, prefix: str) -> dict:
    declared = load(bundled(name)).to_json()
    out, png = tmp_path / "doctor.json", tmp_path / "doctor.png"
    with emulate.EmulatedCluster(declared, prefix=prefix) as cluster:
        result = cluster.run([sys.executable, "-m", "horotopo", "doctor", "-q",
                              "--json", str(out), "--png", str(png)], timeout=150)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    # rank 0 alone prints: one report
    assert result.stdout.count("horotopo doctor:") == 1, result.stdout
    assert png.stat().st_size > 10_000
    report = json.loads(out.read_text())
    report["stdout"] = result.stdout
    return report


def _named(report: dict) -> set:
    return {(s["kind"], tuple(s["hosts"])) for s in report["findings"]["slow"]}


def test_doctor_names_the_slow_nic(tmp_path):
    report = _doctor("slow-nic", tmp_path, "dcn")
    assert _named(report) == {("nic out", ("n2",)), ("nic in", ("n2",))}, report["stdout"]
    assert report["findings"]["shared"] == []
    assert "host n2 (rank 2): NIC out" in report["stdout"]
    nics = {h["name"]: h for h in report["findings"]["hosts"]}
    assert nics["n2"]["out_gbps"] == pytest.approx(0.2, rel=0.25)
    for name in ("n0", "n1", "n3"):
        assert nics[name]["out_gbps"] == pytest.approx(0.8, rel=0.25)
    assert report["plan"]["speedup"] > 1.0


def test_doctor_names_the_slow_uplink_between_racks(tmp_path):
    report = _doctor("racks-2x3", tmp_path, "dcr")
    racks = {("p0", "p1", "p2"), ("q0", "q1", "q2")}
    named = _named(report)
    assert {kind for kind, _ in named} == {"shared"}, report["stdout"]
    assert {hosts for _, hosts in named} == racks, report["stdout"]
    for link in report["findings"]["shared"]:
        assert link["gbps"] == pytest.approx(0.25, rel=0.3)
    assert "shared link out of hosts p0, p1, p2 (ranks 0,2,4)" in report["stdout"]
