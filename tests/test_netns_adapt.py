"""Emulated-network tier for adaptivity (root only): benchmarks/adapt_emulated.py on the
bundled slow-nic topology, one host's uplink reshaped to a quarter halfway through. The run
must re-plan within a few calls and recover to within 15% of a fresh plan of the new network.
Also the benchmark's pure summary on made-up series."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from horotopo_launch.emulate import available, leftovers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import adapt_emulated  # noqa: E402

_OK, _WHY = available()


def _series(times, replan_at, half):
    return [{"step": k, "phase": "before" if k < half else "after", "seconds": t,
             "plan": "x", "replanned": k == replan_at} for k, t in enumerate(times)]


def test_summary_verdicts():
    times = [0.2] * 10 + [0.4, 0.4, 0.4] + [0.21] * 7
    res = {"series": _series(times, 12, 10), "fresh_s": [0.2, 0.2, 0.3], "wrong": 0}
    s = adapt_emulated.summarize(res, 0.15, skip=1)
    assert s["ok"] and s["replan_step"] == 12 and s["calls_to_detect"] == 3
    assert s["degraded_s"] == pytest.approx(0.4) and s["recovered_s"] == pytest.approx(0.21)
    assert s["recovered_over_fresh"] == pytest.approx(1.05)
    slow = dict(res, series=_series(times[:13] + [0.3] * 7, 12, 10))
    assert not adapt_emulated.summarize(slow, 0.15, skip=1)["ok"]
    never = dict(res, series=_series(times, -1, 10))
    assert not adapt_emulated.summarize(never, 0.15, skip=1)["ok"]
    assert not adapt_emulated.summarize(dict(res, wrong=3), 0.15, skip=1)["ok"]


@pytest.mark.netns
@pytest.mark.skipif(not _OK, reason=_WHY)
def test_replans_and_recovers_on_emulated_cluster():
    prefix = "htadt"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "adapt_emulated.py"),
                           "--topology", "slow-nic", "--link", "n0,sw", "--steps", "40",
                           "--fresh-steps", "12", "--prefix", prefix, "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert leftovers(prefix) == {"namespaces": [], "links": []}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stderr[-4000:]
    out = json.loads(lines[-1])
    s = out["summary"]
    assert out["wrong"] == 0
    assert s["degraded_s"] > 1.4 * s["before_s"], s      # the reshape really slowed it
    assert s["replan_step"] is not None and s["calls_to_detect"] <= 6, s
    assert s["recovered_over_fresh"] <= 1.15, s
    assert proc.returncode == 0, proc.stderr[-4000:]
