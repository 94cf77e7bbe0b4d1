"""The package's import contract: layers that import only downwards, and one door to MPI.

Read by tests/test_layers.py. The layers follow the data flow (probe -> topology ->
packing -> plan -> algorithms/engine -> API) read as *import* direction: a stage imports the
values of the stages below it (the probe builds a Topology, so it sits above topology), never
the other way round. Modules of one layer may import each other.
"""
from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

# Lowest first. A module belongs to the layer of its longest matching prefix.
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("foundation", ("horotopo.config", "horotopo.costs", "horotopo.timeline",
                    "horotopo.topology", "horotopo.generate", "horotopo.ops", "horotopo.buffers",
                    "horotopo.gpu._env", "horotopo.gpu.elementwise", "horotopo.gpu.kernels",
                    "horotopo.gpu.staging", "horotopo.transport.wire", "horotopo.transport.poll")),
    ("transport", ("horotopo.transport", "horotopo.gpu")),
    ("probe", ("horotopo.probe",)),
    ("packing", ("horotopo.packing",)),
    ("plan", ("horotopo.plan", "horotopo.schedule", "horotopo.validate")),
    ("algorithms", ("horotopo.algorithms", "horotopo.engine", "horotopo.planning_protocol",
                    "horotopo.bootstrap")),
    ("runtime", ("horotopo.adapt", "horotopo.reliability")),
    ("api", ("horotopo.api", "horotopo.torch", "horotopo.cli", "horotopo.__main__",
             "horotopo")),
)

# The one door to MPI (plus launch/, which is outside the package, and the CUDA-awareness
# query, which asks the MPI library itself what it was built with).
MPI_DOORS: Tuple[str, ...] = ("horotopo.transport.mpi", "horotopo.gpu.awareness")


@dataclass(frozen=True)
class Violation:
    module: str
    imported: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.imported}: {self.why}"


def layer_of(module: str, layers: Sequence[Tuple[str, Tuple[str, ...]]] = LAYERS
             ) -> Optional[Tuple[int, str]]:
    """``(index, name)`` of the layer whose longest prefix matches ``module``."""
    best: Optional[Tuple[int, int, str]] = None
    for index, (name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index, name)
    return None if best is None else (best[1], best[2])


def _module_name(path: pathlib.Path, root: pathlib.Path) -> Tuple[str, str]:
    """``(module, package)`` of a source file under ``root`` (the folder holding the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def imports_of(path: pathlib.Path, root: pathlib.Path) -> Iterator[Tuple[str, int]]:
    """Every absolute module name ``path`` imports (relative imports resolved), with its line.

    ``from pkg import x`` yields ``pkg.x`` (x may be a submodule), so a module that imports a
    sibling module through its package (``from horotopo import config``) is judged by the
    sibling, not by the package's ``__init__``.
    """
    _, package = _module_name(path, root)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield f"{target}.{alias.name}", node.lineno


def violations(root: pathlib.Path, package: str = "horotopo",
               layers: Sequence[Tuple[str, Tuple[str, ...]]] = LAYERS,
               mpi_doors: Sequence[str] = MPI_DOORS) -> List[Violation]:
    """Every import in ``root/package`` that points upwards or reaches MPI outside its door."""
    found: List[Violation] = []
    for path in sorted((root / package).rglob("*.py")):
        module, _ = _module_name(path, root)
        own = layer_of(module, layers)
        for imported, line in imports_of(path, root):
            if imported == "mpi4py" or imported.startswith("mpi4py."):
                if module not in mpi_doors:
                    found.append(Violation(module, imported, line,
                                           f"only {', '.join(mpi_doors)} may import mpi4py"))
                continue
            if not (imported == package or imported.startswith(package + ".")):
                continue
            theirs = layer_of(imported, layers)
            if own is None or theirs is None:
                missing = module if own is None else imported
                found.append(Violation(module, imported, line,
                                       f"{missing} is in no layer of the contract"))
            elif theirs[0] > own[0]:
                found.append(Violation(module, imported, line,
                                       f"layer {own[1]!r} may not import layer {theirs[1]!r}"))
    return found


def layer_table(layers: Sequence[Tuple[str, Tuple[str, ...]]] = LAYERS) -> Dict[str, List[str]]:
    return {name: list(prefixes) for name, prefixes in layers}
