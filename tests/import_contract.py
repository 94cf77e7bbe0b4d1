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
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

# Lowest first. A module belongs to the layer of its longest matching prefix. A dotted prefix
# names a module and, for a package, every module under it; the bare package name "horotopo"
# names the package's own __init__ only, so that a module left out of every layer is reported
# rather than falling into the top layer.
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("foundation", ("horotopo.config", "horotopo.params", "horotopo.costs", "horotopo.timeline",
                    "horotopo.topology", "horotopo.generate", "horotopo.ops", "horotopo.buffers",
                    "horotopo.gpu.env", "horotopo.gpu.elementwise", "horotopo.gpu.kernels",
                    "horotopo.gpu.staging", "horotopo.transport.wire", "horotopo.transport.poll",
                    "horotopo.transport.types")),
    # the simulated transport stands on SimGrid's engine, actors and requests
    ("transport", ("horotopo.transport", "horotopo.gpu", "horotopo.simulation.support",
                   "horotopo.simulation.actors", "horotopo.simulation.pending",
                   "horotopo.simulation.collectives")),
    ("probe", ("horotopo.probe",)),
    ("simulation", ("horotopo.simulation",)),
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
            if module == prefix or "." in prefix and module.startswith(prefix + "."):
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


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but the bodies of ``if TYPE_CHECKING:``, which never run."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: pathlib.Path, root: pathlib.Path, *, at_runtime_only: bool = False
               ) -> Iterator[Tuple[str, int]]:
    """Every absolute module name ``path`` imports (relative imports resolved), with its line:
    at module level and inside functions alike.

    ``from pkg import x`` yields ``pkg.x`` (x may be a submodule), so a module that imports a
    sibling module through its package (``from horotopo import config``) is judged by the
    sibling, not by the package's ``__init__``. ``at_runtime_only`` leaves out the imports
    under ``if TYPE_CHECKING:``, which type checkers read and Python never runs.
    """
    _, package = _module_name(path, root)
    tree = ast.parse(path.read_text(), str(path))
    for node in (_runtime_nodes(tree) if at_runtime_only else ast.walk(tree)):
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
    paths = sorted((root / package).rglob("*.py"))
    modules = {_module_name(path, root)[0] for path in paths}
    for path in paths:
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
            theirs = layer_of(_owning_module(imported, modules), layers)
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


def _owning_module(imported: str, modules: Set[str]) -> str:
    """The module that ``imported`` names or holds (``horotopo.plan.Plan`` -> ``horotopo.plan``);
    ``imported`` itself when no module of the package matches."""
    target = imported
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or imported


def import_graph(root: pathlib.Path, package: str = "horotopo") -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports when it runs (functions' imports counted).

    An imported name that is no module (``from .plan import Plan``) counts as its module.
    """
    paths = sorted((root / package).rglob("*.py"))
    modules = {_module_name(path, root)[0] for path in paths}
    graph: Dict[str, Set[str]] = {module: set() for module in modules}
    for path in paths:
        module, _ = _module_name(path, root)
        for imported, _line in imports_of(path, root, at_runtime_only=True):
            target = _owning_module(imported, modules)
            if target in modules and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[FrozenSet[str]]:
    """The import cycles of ``graph``: each group of modules that import each other, directly
    or through one another (a strongly connected part of more than one module), sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[FrozenSet[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # Tarjan's algorithm, iterative: the package's chains are deeper than Python's stack
        # allows for recursion only on a bad day, but a test should not depend on that.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.add(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(frozenset(part))
    return sorted(found, key=sorted)
