"""The network model that the planner optimizes.

A :class:`Topology` is what both JSON forms (``docs/topology.md``, and the JSON Schema
``horotopo/data/topology.schema.json``) load into: the ranks, a list of
capacitated resources, and for every ordered rank pair ``(i, j)`` the route of resources that a
transfer ``i -> j`` consumes. In the paper's notation (Zhang, Wu, Li, INFOCOM 2021) the
resources are the links ``e`` with capacities ``c_e``; a route is the set of links a logical
arc crosses.

- Declared form (hosts, switches, links): every link gives two directed resources; a pair routes
  over a shortest path (fewest hops, then least latency). Ranks on one host share memory, which
  is not a constraint, so their route is empty.
- Measured form (what ``horotopo probe`` writes): the pair resource ``(i, j)``, plus ``i``'s
  egress and ``j``'s ingress when given, plus every shared bottleneck that lists the pair.

Capacities are held in bytes/s; JSON files speak gbps (1e9 bits/s).
"""
from __future__ import annotations

import gc
import hashlib
import itertools
import json
import math
import reprlib
from collections import abc
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import networkx as nx
import numpy as np

GBPS_TO_BPS = 1e9 / 8.0

__all__ = ["Topology", "TopologyError", "load", "load_for_job", "resolve", "from_dict",
           "check_schema", "schema", "GBPS_TO_BPS", "bundled", "bundled_names", "file_budget",
           "plural", "run_positions"]


class TopologyError(ValueError):
    """A topology file or document that cannot be used; the message names the field."""


def plural(count: int, noun: str) -> str:
    """``plural(1, "rank")`` -> ``"1 rank"``, ``plural(2, "rank")`` -> ``"2 ranks"``: a count
    in the package's messages, here at the bottom of the layers so that every layer has it."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


@dataclass(frozen=True)
class Topology:
    """An immutable network model over ``n`` ranks.

    Attributes
    ----------
    name : str
        Name from the file.
    hosts : tuple of str
        ``hosts[i]`` is the host that rank ``i`` runs on.
    resources : tuple of str
        Human-readable names of the capacitated resources (``"a->torA"``, ``"pair 0->3"``...).
    capacity_Bps : tuple of float
        Capacity of each resource, bytes/s (the paper's ``c_e``).
    routes : sequence of sequence of tuple of int
        ``routes[i][j]`` lists the resource indices that a transfer ``i -> j`` consumes.
        ``routes[i][i]`` is empty. A declared topology's is a :class:`HostRoutes`.
    latency_s : tuple of tuple of float
        One-way latency of ``i -> j`` in seconds (0 on the diagonal).
    kind : str
        ``"declared"`` or ``"measured"``.
    source : str
        The canonical JSON document that this was loaded from (so ``to_json`` round-trips).
    """

    name: str
    hosts: Tuple[str, ...]
    resources: Tuple[str, ...]
    capacity_Bps: Tuple[float, ...]
    routes: Sequence[Sequence[Tuple[int, ...]]]
    latency_s: Sequence[Sequence[float]]
    kind: str
    source: str

    @property
    def n(self) -> int:
        return len(self.hosts)

    def to_json(self) -> Dict[str, Any]:
        return json.loads(self.source)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Topology":
        return from_dict(doc)

    @cached_property
    def capacity_array(self) -> np.ndarray:
        """``capacity_Bps`` as a read-only float array, converted once: a measured topology
        has a resource per ordered pair of ranks (a million at 1024 ranks, 40-65 ms a
        conversion), and a plan reads its capacities a dozen times."""
        cap = np.asarray(self.capacity_Bps, dtype=float)
        cap.flags.writeable = False
        return cap

    @cached_property
    def digest(self) -> str:
        # hashed once: a measured topology's source is ~90 MB at 1024 ranks (0.2 s a hash)
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def route(self, i: int, j: int) -> Tuple[int, ...]:
        """The resources a transfer ``i -> j`` consumes, without building row ``i`` of a
        table that computes its entries on access (a declared topology at thousands of ranks)."""
        pair = getattr(self.routes, "pair", None)
        return pair(i, j) if pair is not None else tuple(self.routes[i][j])

    def latency(self, i: int, j: int) -> float:
        """The latency of ``i -> j`` in seconds, read the way :meth:`route` reads a route."""
        pair = getattr(self.latency_s, "pair", None)
        return float(pair(i, j) if pair is not None else self.latency_s[i][j])

    @cached_property
    def host_route_csr(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int,
                                      np.ndarray, np.ndarray]:
        """A declared topology's :class:`HostRoutes` as arrays: ``(node, attach, up, down,
        width, ptr, idx)``, the core path between attachment nodes ``a`` and ``b`` being
        ``idx[ptr[a * width + b]:ptr[a * width + b + 1]]``. Built once per topology, since
        every route table of a plan's arcs (:meth:`arc_routes`) reads it."""
        routes = self.routes
        width = len(routes.core)
        flat = [path for row in routes.core for path in row]
        ptr = np.zeros(len(flat) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(p) for p in flat])
        idx = np.fromiter((r for p in flat for r in p), dtype=np.int64, count=int(ptr[-1]))
        return (np.asarray(routes.node), np.asarray(routes.attach), np.asarray(routes.up),
                np.asarray(routes.down), width, ptr, idx)

    @cached_property
    def host_route_figures(self) -> Tuple[np.ndarray, ...]:
        """A declared topology's :class:`HostRoutes` as the arrays arc figures are read from:
        ``(node, attach, up rate, down rate, core rate, leaf latency, core latency)``, a
        missing leaf link's rate being infinite. Built once per topology, since every tree
        profile (:mod:`horotopo.packing.profiles`) reads it."""
        routes, lat = self.routes, self.latency_s
        cap = self.capacity_array
        leaf_rate = lambda side: np.where(np.asarray(side) >= 0,
                                          cap[np.maximum(np.asarray(side), 0)], math.inf)
        core_rate = np.array([[min((cap[r] for r in path), default=math.inf) for path in row]
                              for row in routes.core], dtype=float).reshape(
                                  len(routes.core), len(routes.core))
        return (np.asarray(routes.node), np.asarray(routes.attach), leaf_rate(routes.up),
                leaf_rate(routes.down), core_rate, np.asarray(lat.leaf, dtype=float),
                np.asarray(lat.core, dtype=float).reshape(core_rate.shape))

    def arc_routes(self, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """CSR of the routes of the arcs ``keys`` (``i * n + j``): ``(ptr, resources)``, arc
        ``a``'s route being ``resources[ptr[a]:ptr[a + 1]]``.

        A declared topology's :class:`HostRoutes` is read in closed form (leaf link out, path
        between attachment nodes, leaf link in), so no ``n x n`` table is built; a measured
        one's routes are looked up once per distinct arc and kept, since the candidate plans
        of one planning run share most of their arcs.
        """
        keys = np.asarray(keys, dtype=np.int64)
        if isinstance(self.routes, HostRoutes):
            return self._host_arc_routes(keys)
        return self._route_store.lookup(keys)

    def _host_arc_routes(self, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        n = self.n
        tails, heads = keys // n, keys % n
        node, attach, up, down, width, ptr, idx = self.host_route_csr
        far = node[tails] != node[heads]
        pair = attach[tails] * width + attach[heads]
        core_len = np.where(far, ptr[pair + 1] - ptr[pair], 0)
        head = (far & (up[tails] >= 0)).astype(np.int64)
        tail = (far & (down[heads] >= 0)).astype(np.int64)
        out_ptr = np.zeros(len(keys) + 1, dtype=np.int64)
        out_ptr[1:] = np.cumsum(head + core_len + tail)
        res = np.empty(int(out_ptr[-1]), dtype=np.int64)
        start = out_ptr[:-1]
        has = head > 0
        res[start[has]] = up[tails[has]]
        # the core path of arc a fills res[start[a] + head[a] : ... + core_len[a]]
        arc = np.repeat(np.arange(len(keys)), core_len)
        offset = np.arange(len(arc)) - np.repeat(np.cumsum(core_len) - core_len, core_len)
        res[start[arc] + head[arc] + offset] = idx[ptr[pair[arc]] + offset]
        has = tail > 0
        res[out_ptr[1:][has] - 1] = down[heads[has]]
        return out_ptr, res

    @cached_property
    def _route_store(self) -> "_RouteStore":
        return _RouteStore(self)

    def arc_latencies(self, keys: np.ndarray) -> np.ndarray:
        """The latency in seconds of each arc ``keys`` (``i * n + j``), as :meth:`latency`
        reads it."""
        keys = np.asarray(keys, dtype=np.int64)
        if getattr(self.latency_s, "pair", None) is None:
            return self._latency_array.ravel()[keys]
        n = self.n
        return np.fromiter((self.latency(int(k) // n, int(k) % n) for k in keys), dtype=float,
                           count=len(keys))

    @cached_property
    def _latency_array(self) -> np.ndarray:
        return np.asarray(self.latency_s, dtype=float).reshape(self.n, self.n)

    def pair_capacity_Bps(self, i: int, j: int) -> float:
        """The rate ``i -> j`` gets alone: its tightest resource (inf for same-host ranks)."""
        return min((self.capacity_Bps[r] for r in self.route(i, j)), default=math.inf)

    def describe(self) -> str:
        lines = [f"topology {self.name!r} ({self.kind}): {plural(self.n, 'rank')} on "
                 f"{plural(len(set(self.hosts)), 'host')}, "
                 f"{plural(len(self.resources), 'resource')}"]
        for r, (res, cap) in enumerate(zip(self.resources, self.capacity_Bps)):
            lines.append(f"  [{r}] {res:<24} {cap * 8 / 1e9:8.3f} gbps")
        return "\n".join(lines)


BUNDLED_DIR = Path(__file__).parent / "data" / "topologies"
SCHEMA_PATH = Path(__file__).parent / "data" / "topology.schema.json"

#: Nesting a topology file may have: a valid one nests 5 deep (``/shared/0/pairs/0/1``).
MAX_DEPTH = 16
#: Bytes a topology file may take whatever the job: about 3,000 ranks' measured matrices.
MAX_FILE_BYTES = 1 << 30
#: Bytes a topology file may take for a job of n ranks: this plus BYTES_PER_RANK_PAIR * n**2
#: for a measured one, which holds n**2 rates and latencies, written at up to ~50 bytes each
#: with the shared bottlenecks' pairs; plus BYTES_PER_RANK * n for a declared one, whose links
#: and hosts grow with n alone. Twenty times what a real file needs, so that only a file for
#: another job, or no topology at all, is refused by its size.
BASE_FILE_BYTES = 1 << 20
BYTES_PER_RANK_PAIR = 1 << 10
BYTES_PER_RANK = 4 << 10


def bundled_names() -> List[str]:
    """Names of the topology files shipped with the package (``racks-2x3``, ``slow-nic``...)."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.json"))


def bundled(name: str) -> Path:
    """Path of a topology file shipped with the package (``racks-2x3``, ``slow-nic``...)."""
    path = BUNDLED_DIR / f"{name}.json"
    if "/" in name or not path.is_file():
        raise TopologyError(f"no bundled topology {name!r}; bundled: "
                            f"{', '.join(bundled_names())}")
    return path


def resolve(spec: Union[str, Path]) -> Path:
    """The topology file that ``spec`` names: a path, else the name of a bundled topology.

    What the CLI's TOPOLOGY argument and ``HOROTOPO_TOPOLOGY`` both take. A file that exists
    wins over a bundled name.

    Raises
    ------
    TopologyError
        Neither a file nor a bundled name; the message lists the bundled names.
    """
    path = Path(spec)
    if path.is_file():
        return path
    text = str(spec)
    if "/" not in text and not text.endswith(".json"):
        if (BUNDLED_DIR / f"{text}.json").is_file():
            return bundled(text)
        raise TopologyError(f"{text!r} is neither a topology file nor a bundled topology; "
                            f"bundled: {', '.join(bundled_names())}")
    if path.is_dir():
        raise TopologyError(f"topology file {path}: is a folder")
    raise TopologyError(f"topology file {path}: cannot read: no such file")


def file_budget(nranks: Optional[int] = None, measured: bool = True) -> int:
    """The most bytes a topology file may take for a job of ``nranks`` ranks (None: any job),
    in the measured form or the declared one."""
    if nranks is None:
        return MAX_FILE_BYTES
    grows = BYTES_PER_RANK_PAIR * nranks * nranks if measured else BYTES_PER_RANK * nranks
    return min(MAX_FILE_BYTES, BASE_FILE_BYTES + grows)


def load(spec: Union[str, Path], nranks: Optional[int] = None) -> Topology:
    """Load a topology file of either form (a path, or a bundled name: :func:`resolve`).

    The checks run cheapest first, so that a file that cannot serve is refused before anything
    is built from it: its size against :func:`file_budget`; its JSON (no NaN or Infinity) and
    nesting (:data:`MAX_DEPTH`); with ``nranks``, its number of ranks against the job's; the
    JSON Schema ``horotopo/data/topology.schema.json``; then what a schema cannot say (the
    links connect the hosts, the matrices are ranks x ranks...). Every error names the file,
    and the field as a JSON pointer (``/links/3/gbps``).

    Raises
    ------
    TopologyError
        The first check that fails, in one line.
    """
    path = resolve(spec)
    where = f"topology file {path}"
    try:
        doc = parse(path, nranks)
        if nranks is not None:
            _check_rank_count(doc, nranks)
        check_schema(doc)
        return from_dict(doc)
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from None


def load_for_job(spec: Union[str, Path], nranks: int) -> Topology:
    """Load the topology a job of ``nranks`` ranks runs on (``HOROTOPO_TOPOLOGY``).

    :func:`load` with the job's size: a file for another number of ranks is refused after
    reading only its size, or its JSON, never after building its network, so that a wrong
    file costs at most what a right one would.
    """
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise ValueError(f"nranks must be a positive int, got {nranks!r}")
    return load(spec, nranks)


def parse(path: Path, nranks: Optional[int] = None) -> Any:
    """The JSON document in ``path``, within :func:`file_budget` and :data:`MAX_DEPTH`."""
    try:
        size = path.stat().st_size
        _check_size(size, nranks, measured=True)
        data = path.read_bytes()
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror or exc}") from None
    if b'"bandwidth_gbps"' not in data:  # so not the measured form: the tighter budget
        _check_size(size, nranks, measured=False)
    if _nesting(data) > MAX_DEPTH:
        raise TopologyError(f"not a topology: nested more than {MAX_DEPTH} levels")
    collecting = gc.isenabled()
    # Millions of new containers would wake the cycle collector again and again, its older
    # generations' passes walking the containers made so far: a large file would spend most
    # of its parse in the collector, for objects that hold no cycles.
    gc.disable()
    try:
        return json.loads(data.decode(), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise TopologyError(f"not valid JSON: not UTF-8 text ({exc.reason} at byte "
                            f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(f"not valid JSON: {exc.msg} at line {exc.lineno} column "
                            f"{exc.colno}") from None
    except RecursionError:  # only in text that is not JSON, which _nesting may misread
        raise TopologyError("not valid JSON: nested deeper than the parser goes") from None
    finally:
        if collecting:
            gc.enable()


def _check_size(size: int, nranks: Optional[int], measured: bool) -> None:
    budget = file_budget(nranks, measured)
    if size > budget:
        job = "any job" if nranks is None else f"a job of {plural(nranks, 'rank')}"
        form = "" if measured else "declared "  # the measured budget is any form's
        raise TopologyError(f"{size} bytes, more than a {form}topology for {job} can need "
                            f"(at most {budget}); is it the file for another job?")


def _no_constant(name: str) -> Any:
    raise TopologyError(f"not valid JSON: {name} is not a JSON number")


def _nesting(data: bytes) -> int:
    """How deep the arrays and objects of JSON text ``data`` nest, read without parsing it
    (a 200,000-deep file must be refused before the parser recurses into it)."""
    if b"\\" in data:
        # escapes parse left to right and only "\\" has a backslash second: after these two
        # replacements no quote is escaped
        data = data.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    text = np.frombuffer(data, np.uint8)
    in_string = np.bitwise_xor.accumulate((text == ord('"')).view(np.uint8))
    outside = in_string == 0
    opens = ((text == ord("[")) | (text == ord("{"))) & outside
    closes = ((text == ord("]")) | (text == ord("}"))) & outside
    brackets = np.flatnonzero(opens | closes)
    if not len(brackets):
        return 0
    return int(np.cumsum(np.where(opens[brackets], 1, -1), dtype=np.int64).max())


def _check_rank_count(doc: Any, nranks: int) -> None:
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    if isinstance(ranks, list) and len(ranks) != nranks:
        raise TopologyError(f"the topology has {plural(len(ranks), 'rank')} but this job has "
                            f"{nranks}")


_validator: Any = None


def check_schema(doc: Any) -> None:
    """Check ``doc`` against the topology JSON Schema; the error names the JSON pointer.

    Arrays of plain numbers (the measured matrices' rows) and of rank pairs are checked by a
    test that passes only what their item schema passes, and by the validator only where that
    test fails: the validator descends into every entry in Python, which on the n**2 entries
    of a measured file would cost several times the rest of the load.
    """
    global _validator
    if _validator is None:
        _validator = _make_validator()
    error = _best_error(_validator, doc)
    if error is not None:
        pointer = "".join(f"/{p}" for p in error.absolute_path) or "top level"
        raise TopologyError(f"{pointer}: {_short_message(error)}")


def schema() -> Dict[str, Any]:
    """The topology JSON Schema (draft 2020-12) shipped with the package."""
    return json.loads(SCHEMA_PATH.read_text())


def _make_validator() -> Any:
    import jsonschema  # imported on the first file load: a tenth of a second

    base = jsonschema.Draft202012Validator
    slow_items = base.VALIDATORS["items"]

    def items(validator: Any, item_schema: Any, instance: Any, parent: Any) -> Any:
        every = _quick_test(item_schema)
        if every is not None and validator.is_type(instance, "array") and every(instance):
            return
        yield from slow_items(validator, item_schema, instance, parent)

    cls = jsonschema.validators.extend(base, {"items": items})
    return cls(schema())


_JSON_TYPES = {"null": type(None), "number": (int, float), "integer": int, "string": str}
_quick_tests: Dict[str, Any] = {}


def _quick_test(item_schema: Any) -> Any:
    """A test that passes only values valid under ``item_schema``, for the schemas made of
    ``type`` (scalars or arrays), ``minimum``, ``minItems``, ``maxItems`` and ``items`` alone;
    None for any other schema. It takes the whole array of items at once."""
    key = json.dumps(item_schema, sort_keys=True)
    if key not in _quick_tests:
        test = _compile_test(item_schema)
        _quick_tests[key] = None if test is None else test.every
    return _quick_tests[key]


class _ScalarTest:
    """Values of some JSON scalar types, numbers at least ``low``."""

    def __init__(self, types: frozenset, low: float):
        self.types, self.low = types, low

    def every(self, values: List[Any]) -> bool:
        if not set(map(type, values)) <= self.types:
            return False
        if self.low == -math.inf:
            return True
        numbers = [v for v in values if type(v) in (int, float)]
        return not numbers or min(numbers) >= self.low


class _ArrayTest:
    """Arrays of ``low`` to ``high`` items that all pass ``items``."""

    def __init__(self, items: Any, low: float, high: float):
        self.items, self.low, self.high = items, low, high

    def every(self, values: List[Any]) -> bool:
        low, high = self.low, self.high
        if not all(type(x) is list and low <= len(x) <= high for x in values):
            return False
        return self.items is None or self.items.every(list(itertools.chain.from_iterable(values)))


def _compile_test(s: Any) -> Any:
    if not isinstance(s, dict) or not set(s) <= {"type", "minimum", "minItems", "maxItems",
                                                 "items"}:
        return None
    kinds = s.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds:
        return None
    if kinds == ["array"]:
        inner = _compile_test(s["items"]) if "items" in s else None
        if inner is None and "items" in s:
            return None
        return _ArrayTest(inner, s.get("minItems", 0), s.get("maxItems", math.inf))
    if set(s) - {"type", "minimum"} or not all(k in _JSON_TYPES for k in kinds):
        return None
    types: set = set()
    for k in kinds:
        t = _JSON_TYPES[k]
        types.update(t if isinstance(t, tuple) else (t,))
    # type() is exact, so a bool (not a JSON number) is not an int here; NaN never reaches a
    # test: the parser refuses it.
    return _ScalarTest(frozenset(types), s.get("minimum", -math.inf))


def _best_error(validator: Any, doc: Any) -> Any:
    from jsonschema.exceptions import best_match, by_relevance

    # the first errors are enough to name one; a broken matrix yields one per entry
    errors = list(itertools.islice(validator.iter_errors(doc), 64))
    order = {id(e): k for k, e in enumerate(errors)}
    relevance = by_relevance()

    def key(error: Any) -> tuple:
        # as jsonschema ranks them, but of two errors equally deep, the first in the file
        rank = relevance(error)
        return (rank[0], -order.get(id(error), 0), *rank[2:])

    return best_match(errors, key=key)


def _short_message(error: Any) -> str:
    """The validator's message, with a long value it quotes cut to a few elements."""
    message = error.message
    if isinstance(error.instance, (list, dict)):
        full = repr(error.instance)
        if message.startswith(full):
            message = reprlib.repr(error.instance) + message[len(full):]
    return message


def from_dict(doc: Any) -> Topology:
    """Build a Topology from a parsed JSON document of either form."""
    if not isinstance(doc, dict):
        raise TopologyError(f"top level: must be a JSON object, got {_kind(doc)}")
    if "bandwidth_gbps" in doc:
        return _measured(doc)
    if "links" in doc:
        return _declared(doc)
    raise TopologyError("top level: neither a declared topology (needs 'links') nor a measured "
                        "one (needs 'bandwidth_gbps')")


# ---------------------------------------------------------------------------------------------
# validation helpers: each names the field it checks


def _kind(x: Any) -> str:
    return "null" if x is None else type(x).__name__


def _positive(x: Any, field: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise TopologyError(f"{field}: must be a positive finite number, got {x!r}")
    if x <= 0:
        raise TopologyError(f"{field}: must be positive, got {x!r}")
    return float(x)


def _nonnegative(x: Any, field: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise TopologyError(f"{field}: must be a non-negative finite number, got {x!r}")
    if x < 0:
        raise TopologyError(f"{field}: must not be negative, got {x!r}")
    return float(x)


def _list(x: Any, field: str, length: Optional[int] = None) -> list:
    if not isinstance(x, list):
        raise TopologyError(f"{field}: must be a list, got {_kind(x)}")
    if length is not None and len(x) != length:
        raise TopologyError(f"{field}: must have {length} entries (one per rank), got {len(x)}")
    return x


def _name(doc: Mapping[str, Any]) -> str:
    name = doc.get("name", "unnamed")
    if not isinstance(name, str):
        raise TopologyError(f"/name: must be a string, got {_kind(name)}")
    return name


def _ranks(doc: Mapping[str, Any]) -> List[str]:
    if "ranks" not in doc:
        raise TopologyError("/ranks: missing (the host of each rank)")
    ranks = _list(doc["ranks"], "/ranks")
    if not ranks:
        raise TopologyError("/ranks: must list at least one rank")
    for i, h in enumerate(ranks):
        if not isinstance(h, str) or not h:
            raise TopologyError(f"/ranks/{i}: must be a non-empty host name, got {h!r}")
    return ranks


def _canonical(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# declared form


def _declared(doc: Mapping[str, Any]) -> Topology:
    known = {"name", "switches", "links", "ranks"}
    for key in doc:
        if key not in known:
            raise TopologyError(f"/{key}: unknown field in a declared topology "
                                f"(known: {', '.join(sorted(known))})")
    name = _name(doc)
    switches = _list(doc.get("switches", []), "/switches")
    for i, s in enumerate(switches):
        if not isinstance(s, str) or not s:
            raise TopologyError(f"/switches/{i}: must be a non-empty name, got {s!r}")
    if len(set(switches)) != len(switches):
        raise TopologyError("/switches: names must be unique")
    links = _list(doc["links"], "/links")
    ranks = _ranks(doc)

    graph = nx.DiGraph()
    graph.add_nodes_from(switches)
    resources: List[str] = []
    capacity: List[float] = []
    seen = set()
    for k, link in enumerate(links):
        field = f"/links/{k}"
        if not isinstance(link, dict):
            raise TopologyError(f"{field}: must be an object, got {_kind(link)}")
        for key in link:
            if key not in ("ends", "gbps", "latency_ms"):
                raise TopologyError(f"{field}/{key}: unknown field (known: ends, gbps, latency_ms)")
        ends = _list(link.get("ends"), f"{field}/ends")
        if len(ends) != 2 or not all(isinstance(e, str) and e for e in ends):
            raise TopologyError(f"{field}/ends: must be two node names, got {ends!r}")
        a, b = ends
        if a == b:
            raise TopologyError(f"{field}/ends: a link cannot join {a!r} to itself")
        if frozenset(ends) in seen:
            raise TopologyError(f"{field}/ends: a second link between {a!r} and {b!r}")
        seen.add(frozenset(ends))
        if "gbps" not in link:
            raise TopologyError(f"{field}/gbps: missing")
        gbps = link["gbps"]
        if isinstance(gbps, list):
            if len(gbps) != 2:
                raise TopologyError(f"{field}/gbps: an asymmetric link takes [a->b, b->a], "
                                    f"got {len(gbps)} values")
            ab = _positive(gbps[0], f"{field}/gbps/0")
            ba = _positive(gbps[1], f"{field}/gbps/1")
        else:
            ab = ba = _positive(gbps, f"{field}/gbps")
        lat = _nonnegative(link.get("latency_ms", 0.0), f"{field}/latency_ms") / 1e3
        for u, v, rate in ((a, b, ab), (b, a, ba)):
            graph.add_edge(u, v, resource=len(resources), latency=lat)
            resources.append(f"{u}->{v}")
            capacity.append(rate * GBPS_TO_BPS)

    switch_set = set(switches)
    for i, h in enumerate(ranks):
        if h in switch_set:
            raise TopologyError(f"/ranks/{i}: {h!r} is a switch; ranks run on hosts")
        if h not in graph:
            raise TopologyError(f"/ranks/{i}: host {h!r} is not an end of any link")
    if graph.number_of_nodes() == 0:
        raise TopologyError("/links: must list at least one link")
    if not nx.is_weakly_connected(graph):
        parts = sorted((sorted(c) for c in nx.weakly_connected_components(graph)), key=len)
        raise TopologyError(f"/links: the graph is disconnected; {parts[0]} cannot reach "
                            f"{parts[-1]}")

    routes, latency = _declared_routes(graph, ranks)
    return Topology(name=name, hosts=tuple(ranks), resources=tuple(resources),
                    capacity_Bps=tuple(capacity), routes=routes, latency_s=latency,
                    kind="declared", source=_canonical(doc))


class _PairTable(abc.Sequence):
    """An ``n x n`` table read as ``table[i][j]`` whose entries ``pair(i, j)`` computes."""

    def __len__(self) -> int:
        return len(self.node)  # type: ignore[attr-defined]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self[k] for k in range(len(self))[i])
        return _Row(self, range(len(self))[i])

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key() == other._key()  # type: ignore

    def __hash__(self) -> int:
        return hash(self._key())


class _Row(abc.Sequence):
    """Row ``i`` of a :class:`_PairTable`: ``row[j]`` computes one entry (no n-long tuple)."""

    def __init__(self, table: _PairTable, i: int):
        self.table, self.i = table, i

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return tuple(self[k] for k in range(len(self))[j])
        return self.table.pair(self.i, range(len(self))[j])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, abc.Sequence) and tuple(self) == tuple(other)


class HostRoutes(_PairTable):
    """``routes[i][j]`` of a declared topology, computed on access from its parts.

    A rank on a *leaf* node (one link, to a node with more) reaches everything through that
    link, so ``route(i, j) = up[i] + core[attach[i]][attach[j]] + down[j]`` (the leaf links
    left out when ``i`` or ``j`` is not on a leaf), and ``()`` for two ranks on one node. Only
    the shortest paths between attachment nodes are stored: at 4096 ranks on 512 hosts that is
    512**2 routes instead of 4096**2, which would take minutes to build and gigabytes to hold.
    Per rank: ``node``, ``attach`` (index into ``core`` of the node its routes leave from),
    ``up``/``down`` (its leaf link's resource out of / into its node, -1 if not a leaf).
    """

    def __init__(self, node: Sequence[int], attach: Sequence[int], up: Sequence[int],
                 down: Sequence[int], core: Sequence[Sequence[Tuple[int, ...]]]):
        self.node, self.attach = tuple(node), tuple(attach)
        self.up, self.down = tuple(up), tuple(down)
        self.core = tuple(tuple(row) for row in core)

    def pair(self, i: int, j: int) -> Tuple[int, ...]:  # what a transfer i -> j consumes
        if self.node[i] == self.node[j]:
            return ()
        head = (self.up[i],) if self.up[i] >= 0 else ()
        tail = (self.down[j],) if self.down[j] >= 0 else ()
        return head + self.core[self.attach[i]][self.attach[j]] + tail

    def _key(self) -> tuple:
        return (self.node, self.attach, self.up, self.down, self.core)


class _HostLatency(_PairTable):
    """``latency_s[i][j]`` of a declared topology, from the parts of its :class:`HostRoutes`."""

    def __init__(self, routes: HostRoutes, leaf: Sequence[float],
                 core: Sequence[Sequence[float]]):
        self.node, self.attach = routes.node, routes.attach
        self.leaf, self.core = tuple(leaf), tuple(tuple(row) for row in core)

    def pair(self, i: int, j: int) -> float:
        if self.node[i] == self.node[j]:
            return 0.0
        return self.leaf[i] + self.core[self.attach[i]][self.attach[j]] + self.leaf[j]

    def _key(self) -> tuple:
        return (self.node, self.attach, self.leaf, self.core)


def _declared_routes(graph: "nx.DiGraph", ranks: Sequence[str]
                     ) -> Tuple[HostRoutes, _HostLatency]:
    """Routes and latencies of a declared topology (see :class:`HostRoutes`)."""
    nodes = sorted(set(ranks))
    degree = {v: len(set(graph.successors(v))) for v in graph}
    leaf = {v: next(iter(graph.successors(v))) for v in nodes
            if degree[v] == 1 and degree[next(iter(graph.successors(v)))] > 1}
    attach_nodes = sorted({leaf.get(v, v) for v in nodes})
    where = {v: k for k, v in enumerate(attach_nodes)}
    core_graph = graph.subgraph([v for v in graph if v not in leaf])
    # Fewest hops first, then least latency, so that routes are deterministic and match
    # what a layer-2 tree of switches would do.
    weight = {e: 1.0 + 1e-6 * graph.edges[e]["latency"] for e in core_graph.edges}
    nx.set_edge_attributes(graph, weight, "w")
    core: List[List[Tuple[int, ...]]] = []
    core_lat: List[List[float]] = []
    for src in attach_nodes:
        paths = nx.single_source_dijkstra_path(core_graph, src, weight="w")
        edges = [list(zip(paths[dst], paths[dst][1:])) for dst in attach_nodes]
        core.append([tuple(graph.edges[e]["resource"] for e in path) for path in edges])
        core_lat.append([sum(graph.edges[e]["latency"] for e in path) for path in edges])
    node_index = {v: k for k, v in enumerate(nodes)}
    up = [graph.edges[h, leaf[h]]["resource"] if h in leaf else -1 for h in ranks]
    down = [graph.edges[leaf[h], h]["resource"] if h in leaf else -1 for h in ranks]
    routes = HostRoutes([node_index[h] for h in ranks], [where[leaf.get(h, h)] for h in ranks],
                        up, down, core)
    latency = _HostLatency(routes, [graph.edges[h, leaf[h]]["latency"] if h in leaf else 0.0
                                    for h in ranks], core_lat)
    return routes, latency


# ---------------------------------------------------------------------------------------------
# measured form


def _matrix(x: Any, field: str, n: int, positive: bool) -> List[List[Optional[float]]]:
    rows = _list(x, field, n)
    out: List[List[Optional[float]]] = []
    for i, row in enumerate(rows):
        row = _list(row, f"{field}/{i}", n)
        vals: List[Optional[float]] = []
        for j, v in enumerate(row):
            f = f"{field}/{i}/{j}"
            if i == j:
                if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
                    raise TopologyError(f"{f}: the diagonal must be null or a number, got {v!r}")
                vals.append(None)
            else:
                vals.append(_positive(v, f) if positive else _nonnegative(v, f))
        out.append(vals)
    return out


def _measured(doc: Mapping[str, Any]) -> Topology:
    known = {"name", "ranks", "bandwidth_gbps", "latency_ms", "egress_gbps", "ingress_gbps",
             "shared", "probe"}
    for key in doc:
        if key not in known:
            raise TopologyError(f"/{key}: unknown field in a measured topology "
                                f"(known: {', '.join(sorted(known))})")
    name = _name(doc)
    ranks = _ranks(doc)
    n = len(ranks)
    bw = _matrix(doc["bandwidth_gbps"], "/bandwidth_gbps", n, positive=True)
    if "latency_ms" in doc:
        lat = _matrix(doc["latency_ms"], "/latency_ms", n, positive=False)
    else:
        lat = [[0.0] * n for _ in range(n)]

    resources: List[str] = []
    capacity: List[float] = []
    pair_res = [[-1] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i != j:
                pair_res[i][j] = len(resources)
                resources.append(f"pair {i}->{j}")
                capacity.append(bw[i][j] * GBPS_TO_BPS)  # type: ignore[operator]
    extra: List[List[List[int]]] = [[[] for _ in range(n)] for _ in range(n)]
    for key, label, is_src in (("egress_gbps", "egress", True), ("ingress_gbps", "ingress", False)):
        if key not in doc or doc[key] is None:
            continue
        caps = _list(doc[key], f"/{key}", n)
        for k, v in enumerate(caps):
            if v is None:
                continue
            r = len(resources)
            resources.append(f"{label} {k}")
            capacity.append(_positive(v, f"/{key}/{k}") * GBPS_TO_BPS)
            for other in range(n):
                if other != k:
                    i, j = (k, other) if is_src else (other, k)
                    extra[i][j].append(r)
    for s, group in enumerate(_list(doc.get("shared", []), "/shared")):
        field = f"/shared/{s}"
        if not isinstance(group, dict):
            raise TopologyError(f"{field}: must be an object, got {_kind(group)}")
        for key in group:
            if key not in ("pairs", "gbps", "label"):
                raise TopologyError(f"{field}/{key}: unknown field (known: pairs, gbps, label)")
        if "gbps" not in group:
            raise TopologyError(f"{field}/gbps: missing")
        cap = _positive(group["gbps"], f"{field}/gbps")
        pairs = _list(group.get("pairs"), f"{field}/pairs")
        if not pairs:
            raise TopologyError(f"{field}.pairs: must list at least one [i, j] pair")
        r = len(resources)
        resources.append(str(group.get("label", f"shared {s}")))
        capacity.append(cap * GBPS_TO_BPS)
        for p, pair in enumerate(pairs):
            pf = f"{field}/pairs/{p}"
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
                raise TopologyError(f"{pf}: must be [i, j] rank indices, got {pair!r}")
            i, j = pair
            if not (0 <= i < n and 0 <= j < n):
                raise TopologyError(f"{pf}: rank index out of range 0..{n - 1}: {pair!r}")
            if i == j:
                raise TopologyError(f"{pf}: a pair needs two different ranks, got {pair!r}")
            if r not in extra[i][j]:
                extra[i][j].append(r)
    routes = tuple(tuple((pair_res[i][j], *extra[i][j]) if i != j else () for j in range(n))
                   for i in range(n))
    latency = tuple(tuple((lat[i][j] or 0.0) / 1e3 if i != j else 0.0 for j in range(n))
                    for i in range(n))
    return Topology(name=name, hosts=tuple(ranks), resources=tuple(resources),
                    capacity_Bps=tuple(capacity), routes=routes, latency_s=latency,
                    kind="measured", source=_canonical(doc))


def measured_document(name: str, hosts: Sequence[str], bandwidth_gbps: Sequence[Sequence[Any]],
                      latency_ms: Optional[Sequence[Sequence[Any]]] = None,
                      egress_gbps: Optional[Sequence[Optional[float]]] = None,
                      ingress_gbps: Optional[Sequence[Optional[float]]] = None,
                      shared: Optional[Sequence[Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """Assemble a measured-form document (what the probe writes), validated by loading it."""
    doc: Dict[str, Any] = {"name": name, "ranks": list(hosts),
                           "bandwidth_gbps": [list(r) for r in bandwidth_gbps]}
    if latency_ms is not None:
        doc["latency_ms"] = [list(r) for r in latency_ms]
    if egress_gbps is not None:
        doc["egress_gbps"] = list(egress_gbps)
    if ingress_gbps is not None:
        doc["ingress_gbps"] = list(ingress_gbps)
    if shared:
        doc["shared"] = [dict(s) for s in shared]
    from_dict(doc)
    return doc


def run_positions(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Positions of the entries of runs ``starts[i] .. starts[i] + counts[i]``, run after run:
    the gather of CSR rows (or routes) in numpy alone, without a Python loop per row."""
    counts = np.asarray(counts, dtype=np.int64)
    before = np.cumsum(counts) - counts
    return (np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(before, counts)
            + np.repeat(np.asarray(starts, dtype=np.int64), counts))


class _RouteStore:
    """The routes of a measured topology's arcs read so far, as a CSR over their sorted keys:
    a lookup of arcs already read costs no Python per arc."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.keys = np.zeros(0, dtype=np.int64)
        self.ptr = np.zeros(1, dtype=np.int64)
        self.res = np.zeros(0, dtype=np.int64)

    def lookup(self, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        at = np.searchsorted(self.keys, keys)
        known = at < len(self.keys)
        known[known] = self.keys[at[known]] == keys[known]
        if not known.all():
            self._add(np.unique(keys[~known]))
            at = np.searchsorted(self.keys, keys)
        lo, count = self.ptr[at], self.ptr[at + 1] - self.ptr[at]
        out_ptr = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(count, out=out_ptr[1:])
        return out_ptr, self.res[run_positions(lo, count)]

    def _add(self, keys: np.ndarray) -> None:
        n, routes = self.topology.n, self.topology.routes
        found = [routes[i][j] for i, j in zip((keys // n).tolist(), (keys % n).tolist())]
        ptr = np.zeros(len(found) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(r) for r in found])
        res = np.fromiter(itertools.chain.from_iterable(found), dtype=np.int64,
                          count=int(ptr[-1]))
        # merged with the arcs read before, kept sorted by key
        all_keys = np.concatenate([self.keys, keys])
        all_ptr = np.concatenate([self.ptr[:-1], ptr[:-1] + len(self.res)])
        all_count = np.concatenate([np.diff(self.ptr), np.diff(ptr)])
        all_res = np.concatenate([self.res, res])
        order = np.argsort(all_keys, kind="stable")
        count = all_count[order]
        self.keys = all_keys[order]
        self.ptr = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(count, out=self.ptr[1:])
        self.res = all_res[run_positions(all_ptr[order], count)]
