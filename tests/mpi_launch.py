"""Helpers to run a command under the installed mpiexec, with a hard timeout.

A hung rank must fail the test, never hang the suite: the whole process group is killed on
timeout.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent

# Set to "1" by the MPI tier's default-init launches: tests/mpi/test_api_collectives.py then calls
# hvd.init() as a user would (quick probe, plan, adaptive engine) instead of HOROTOPO_PROBE=off.
DEFAULT_INIT_ENV = "HOROTOPO_TEST_DEFAULT_INIT"
# What the default init reads; a default-init launch unsets them, whatever the caller's shell has.
INIT_VARIABLES = ("HOROTOPO_PROBE", "HOROTOPO_TOPOLOGY", "HOROTOPO_ADAPT")

# Test launches put up to 5 ranks on 2 cores, and an MPICH rank waiting in a library call (a
# barrier, MPI's own allreduce) spins on the CPU the rank it waits for needs. Throttled, a rank
# that finds nothing in 4096 polls sleeps a microsecond and the rank with work gets the core.
# MPICH only (Open MPI ignores the name); a value in the caller's environment wins.
MPICH_OVERSUBSCRIBED = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"}


def mpiexec_path() -> Optional[str]:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def run_mpi(n: int, argv: Sequence[str], timeout: float = 300.0,
            env: Optional[Dict[str, str]] = None,
            unset: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``n`` ranks with this environment plus ``env``, less the names in
    ``unset`` (so that a launch can test a default that the caller's environment overrides)."""
    mpiexec = mpiexec_path()
    if mpiexec is None:
        raise RuntimeError("no mpiexec found next to the interpreter or on PATH")
    full_env = {**MPICH_OVERSUBSCRIBED,
                **{k: v for k, v in os.environ.items() if k not in unset}, **(env or {})}
    cmd: List[str] = [mpiexec, "-n", str(n), *argv]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def last_json(output: str, first_key: str) -> dict:
    """The last JSON object in ``output`` that starts with ``{"first_key"``.

    run_mpi merges stdout and stderr, and mpiexec forwards them in pieces: a rank's last
    stderr line may lose its newline to the stdout JSON that follows it, so the object is
    searched for, not taken from the start of a line.
    """
    import json

    start = output.rfind('{"' + first_key + '"')
    if start < 0:
        raise AssertionError(f'no {{"{first_key}": ...}} object in the output:\n{output[-3000:]}')
    value, _ = json.JSONDecoder().raw_decode(output, start)
    return value
