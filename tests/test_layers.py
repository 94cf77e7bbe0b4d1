"""The import contract of tests/import_contract.py, on the package and on deliberate breaches."""
from __future__ import annotations

import pathlib
import textwrap

from import_contract import LAYERS, cycles, import_graph, layer_of, violations

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_package_keeps_the_import_contract():
    found = violations(ROOT)
    assert not found, "import contract broken:\n" + "\n".join(map(str, found))


def test_no_import_cycle():
    # Functions' imports count: a cycle closed by an import inside a function is still one.
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_a_cycle_through_a_function_import_is_caught(tmp_path):
    # A cycle closed by an import inside a function still counts; one closed only under
    # TYPE_CHECKING never runs and does not.
    _write(tmp_path, {
        "horotopo/__init__.py": "",
        "horotopo/a.py": "from .b import g\n\ndef f():\n    return g()\n",
        "horotopo/b.py": "def g():\n    from .a import f\n    return f\n",
        "horotopo/c.py": "from typing import TYPE_CHECKING\nfrom .a import f\n",
        "horotopo/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from .c import f\nfrom . import c\n",
    })
    assert cycles(import_graph(tmp_path)) == [frozenset({"horotopo.a", "horotopo.b"})]


def test_every_package_module_is_in_a_layer():
    for path in (ROOT / "horotopo").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        assert layer_of(module) is not None, module


def _write(root: pathlib.Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_an_upward_import_is_caught(tmp_path):
    # The same layer names as the package: plan importing the API is the breach to catch.
    _write(tmp_path, {
        "horotopo/__init__.py": "",
        "horotopo/plan.py": "from .api import runtime\n",
        "horotopo/api/__init__.py": "",
        "horotopo/api/runtime.py": "from .. import plan\n",
    })
    found = violations(tmp_path)
    assert [(v.module, v.imported, v.line) for v in found] == [
        ("horotopo.plan", "horotopo.api.runtime", 1)]
    assert "layer 'plan' may not import layer 'api'" in found[0].why


def test_mpi4py_outside_its_door_is_caught(tmp_path):
    _write(tmp_path, {
        "horotopo/__init__.py": "",
        "horotopo/probe/__init__.py": "def f():\n    from mpi4py import MPI\n",
        "horotopo/transport/__init__.py": "",
        "horotopo/transport/mpi.py": "from mpi4py import MPI\n",
    })
    found = violations(tmp_path)
    assert [(v.module, v.line) for v in found] == [("horotopo.probe", 2)]
    assert "may import mpi4py" in found[0].why


def test_absolute_and_package_imports_resolve_to_the_module(tmp_path):
    # "from horotopo import config" names the foundation module, not the package's __init__
    # (which is API level): it must not be reported.
    _write(tmp_path, {
        "horotopo/__init__.py": "",
        "horotopo/config.py": "",
        "horotopo/topology.py": "from horotopo import config\nfrom . import config as c\n",
    })
    assert violations(tmp_path) == []


def test_a_module_outside_every_layer_is_reported(tmp_path):
    # The bare package name names its own __init__ only: a new top-level module must be given
    # a layer, not fall into the top one.
    _write(tmp_path, {
        "horotopo/__init__.py": "from . import stray\n",
        "horotopo/stray.py": "",
    })
    assert layer_of("horotopo") is not None
    assert layer_of("horotopo.stray") is None
    found = violations(tmp_path)
    assert [(v.module, v.imported) for v in found] == [("horotopo", "horotopo.stray")]
    assert "in no layer" in found[0].why


def test_layers_are_named_once():
    names = [name for name, _ in LAYERS]
    assert len(names) == len(set(names))


# The test files that still load a script of benchmarks/. The set may only shrink: a file not
# listed that loads one fails, and so does a listed one that no longer does.
LOADS_BENCHMARKS: frozenset = frozenset()

_LOADERS = {"spec_from_file_location", "import_module", "run_path", "insert", "append"}


def benchmark_loads(tests_dir: pathlib.Path, scripts: set) -> dict:
    """``{test file: [line, ...]}`` where a test imports benchmarks/ or one of its scripts,
    or hands a benchmarks/ path to a module loader or to ``sys.path``."""
    import ast

    found: dict = {}
    for path in sorted(tests_dir.rglob("*.py")):
        source = path.read_text()
        lines = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if not node.level else []
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                # the call's source only for a loader: asking for every call's reads the file
                # from its start each time
                hit = name in _LOADERS and (
                    "benchmarks" in (ast.get_source_segment(source, node) or "") or any(
                        isinstance(c, ast.Constant) and c.value in scripts
                        for c in ast.walk(node)))
                if hit:
                    lines.append(node.lineno)
                continue
            else:
                continue
            if any(n.split(".")[0] in scripts | {"benchmarks"} for n in names):
                lines.append(node.lineno)
        if lines:
            found[path.relative_to(tests_dir).as_posix()] = sorted(lines)
    return found


def _benchmark_scripts() -> set:
    return {p.stem for p in (ROOT / "benchmarks").glob("*.py")}


def test_tests_load_no_benchmark_but_the_listed_ones():
    found = benchmark_loads(ROOT / "tests", _benchmark_scripts())
    new = {f: lines for f, lines in found.items() if f not in LOADS_BENCHMARKS}
    assert not new, f"tests that load benchmarks/ (run the script, or test horotopo): {new}"
    gone = LOADS_BENCHMARKS - set(found)
    assert not gone, f"listed in LOADS_BENCHMARKS but no longer load benchmarks/: {sorted(gone)}"


def test_a_benchmark_load_is_caught(tmp_path):
    _write(tmp_path, {
        "spec.py": "import importlib.util\nspec = importlib.util.spec_from_file_location(\n"
                   "    'x', ROOT / 'benchmarks' / 'x.py')\n",
        "path.py": "import sys\nsys.path.insert(0, str(ROOT / 'benchmarks'))\nimport x\n",
        "package.py": "from benchmarks.x import f\n",
        "named.py": "import importlib.util\nspec = importlib.util.spec_from_file_location(\n"
                    "    'x', SCRIPT)\n",
        "subprocess_run.py": "import subprocess\n"
                             "subprocess.run(['python', 'benchmarks/x.py'])\n",
    })
    assert benchmark_loads(tmp_path, {"x"}) == {
        "named.py": [2], "package.py": [1], "path.py": [2, 3], "spec.py": [2]}
