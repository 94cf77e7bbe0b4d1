"""Every module of the package imports on a machine without a GPU.

Modules loaded only on some paths (the torch.distributed backend's progress thread, the GPU
staging, the CLI's commands) are not imported by every test run; a name moved elsewhere
breaks them only when a user reaches that path. One child interpreter imports them all, so
this process keeps its own module state.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

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


def private_imports(sources: Dict[str, str]) -> List[str]:
    """``path:line name`` of every ``_private`` name one module of the package imports from
    another (a relative import, or one from ``horotopo``): internals others use are public
    names of their owner."""
    found = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and not (node.module or "").startswith("horotopo"):
                continue  # another project's name (torch's _BatchNorm) is its own business
            found += [f"{path}:{node.lineno} {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_the_private_import_check_finds_one():
    sources = {"a.py": "from .b import _secret\nfrom torch.nn import _Base\n",
               "c.py": "from horotopo.b import public, _hidden as hidden\n"}
    assert private_imports(sources) == ["a.py:1 _secret", "c.py:1 _hidden"]


def test_no_module_imports_a_private_name_of_another():
    sources = {str(p.relative_to(ROOT)): p.read_text()
               for p in sorted((ROOT / "horotopo").rglob("*.py"))}
    assert private_imports(sources) == []
