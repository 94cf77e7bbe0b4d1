"""Runs a script of benchmarks/ the way its user does, in a process of its own, so that the
tests check what a benchmark prints and its exit status without importing benchmarks/ (which
is no package, and whose scripts the package never depends on)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout_s: float = 300.0
                  ) -> subprocess.CompletedProcess:
    """``python benchmarks/<script> <args>`` from the repository root, output captured."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def benchmark_json(script: str, *args: str, timeout_s: float = 300.0) -> Dict[str, Any]:
    """The JSON document a benchmark prints on stdout (its ``--json``); a non-zero exit status
    fails with the benchmark's stderr."""
    proc = run_benchmark(script, *args, timeout_s=timeout_s)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)
