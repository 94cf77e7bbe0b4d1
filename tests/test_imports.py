"""Every module of the package imports on a machine without a GPU.

Modules loaded only on some paths (the torch.distributed backend's progress thread, the GPU
staging, the CLI's commands) are not imported by every test run; a name moved elsewhere
breaks them only when a user reaches that path. One child interpreter imports them all, so
this process keeps its own module state.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import importlib, pkgutil, horotopo
bad = []
for info in pkgutil.walk_packages(horotopo.__path__, "horotopo."):
    if info.name.endswith(".__main__"):
        continue  # runs the command line
    try:
        importlib.import_module(info.name)
    except Exception as exc:
        bad.append(f"{info.name}: {type(exc).__name__}: {exc}")
print("\\n".join(bad) or "every module imported")
"""


def test_every_module_of_the_package_imports():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1:] == ["every module imported"], \
        proc.stdout[-3000:] + proc.stderr[-3000:]
