"""The topology file loader: the JSON Schema, errors that name the JSON pointer, and the cheap
checks that refuse a hopeless file before anything is built from it."""
import json
import pathlib

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horotopo import generate
from horotopo import topology as T
from horotopo.topology import TopologyError, bundled, bundled_names, load, load_for_job


def _write(tmp_path, doc, name="t.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _racks():
    return json.loads(bundled("racks-2x3").read_text())


def test_the_schema_is_valid_draft_2020_12():
    schema = T.schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("doc", [
    *[json.loads(bundled(name).read_text()) for name in bundled_names()],
    generate.random_declared(7, 3), generate.random_measured(5, 3), generate.racks([2, 3]),
    generate.uniform_star(4), generate.generate("racks:hosts_per_rack=2,gpus=2", 8),
    generate.generate("sites:gpus=2", 8)], ids=lambda d: d["name"])
def test_every_document_the_package_makes_meets_the_schema(doc):
    T.check_schema(doc)
    jsonschema.validate(doc, T.schema(), cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["links"][3].update(gbps=-1),
     "/links/3/gbps: -1 is less than or equal to the minimum of 0"),
    (lambda d: d["links"][3].update(gbps=[1, -2]), "/links/3/gbps/1: -2 is less than or equal"),
    (lambda d: d["links"][2].update(ends=["p2"]), "/links/2/ends: ['p2'] is too short"),
    (lambda d: d["links"][0].update(speed=2), "/links/0: Additional properties are not allowed"),
    (lambda d: d.update(colour="red"), "top level: Additional properties are not allowed"),
    (lambda d: d.pop("links"), "top level: 'links' is a required property"),
    (lambda d: d["ranks"].__setitem__(1, 7), "/ranks/1: 7 is not of type 'string'"),
    # what the schema cannot say, the loader's own checks say, in the same pointer form
    (lambda d: d["ranks"].append("ghost"), "/ranks/6: host 'ghost' is not an end of any link"),
    (lambda d: d["links"].append({"ends": ["p0", "tor0"], "gbps": 1}),
     "/links/7/ends: a second link between 'p0' and 'tor0'"),
])
def test_declared_errors_name_the_file_and_the_pointer(tmp_path, change, message):
    doc = _racks()
    change(doc)
    path = _write(tmp_path, doc, "x.json")
    with pytest.raises(TopologyError) as err:
        load(path)
    assert str(err.value).startswith(f"topology file {path}: {message}")


@pytest.mark.parametrize("change, message", [
    (lambda d: d["bandwidth_gbps"][1].__setitem__(0, "x"),
     "/bandwidth_gbps/1/0: 'x' is not of type 'number', 'null'"),
    (lambda d: d["bandwidth_gbps"][1].__setitem__(0, -1), "/bandwidth_gbps/1/0: must be positive"),
    (lambda d: d.update(shared=[{"pairs": [[0, 1], [1, -1]], "gbps": 1}]),
     "/shared/0/pairs/1/1: -1 is less than the minimum of 0"),
    (lambda d: d.update(shared=[{"pairs": [[0, 1], [1, 5]], "gbps": 1}]),
     "/shared/0/pairs/1: rank index out of range 0..2"),
    (lambda d: d.update(bandwidth_gbps=list(range(9))),
     "/bandwidth_gbps/0: 0 is not of type 'array'"),
    (lambda d: d["egress_gbps"].__setitem__(2, 0), "/egress_gbps/2"),
])
def test_measured_errors_name_the_pointer(tmp_path, change, message):
    doc = generate.random_measured(3, 1)
    change(doc)
    with pytest.raises(TopologyError, match="^topology file .*m.json: " + message.replace(
            "[", r"\[").replace("(", r"\(")):
        load(_write(tmp_path, doc, "m.json"))


def test_a_long_value_is_quoted_short(tmp_path):
    doc = _racks()
    doc["ranks"] = {f"r{i}": i for i in range(5000)}
    with pytest.raises(TopologyError) as err:
        load(_write(tmp_path, doc))
    assert "/ranks: {" in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize("text, message", [
    ('{"name": "x", "links": NaN}', "not valid JSON: NaN is not a JSON number"),
    ('{"name": "x", "links": [{"ends": ["a", "s"], "gbps": Infinity}]}',
     "not valid JSON: Infinity is not a JSON number"),
    ("{not json", "not valid JSON: Expecting property name"),
    (b"\xff\xfe{}", "not valid JSON: not UTF-8 text"),
    ("[" * 200_000 + "]" * 200_000, "not a topology: nested more than 16 levels"),
    ('{"ranks": ' + "[" * 17 + "]" * 17 + "}", "not a topology: nested more than 16 levels"),
])
def test_unparsable_files_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TopologyError) as err:
        load(path)
    assert str(err.value).startswith(f"topology file {path}: {message}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, depth", [
    (b'{"a": "[[[\\"[[["}', 1), (b'[[["\\\\"]]]', 3), (b'"x"', 0), (b"[]", 1),
    (b'{"a": [1, {"b": [[2]]}], "c": "}}}"}', 5), (b"[" * 100 + b"]" * 100, 100)])
def test_nesting_is_read_from_the_text(text, depth):
    assert T._nesting(text) == depth
    assert T._nesting(text) == _parsed_depth(json.loads(text))


def _parsed_depth(x):
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, list):
        return 1 + max(map(_parsed_depth, x), default=0)
    return 0


def test_the_rank_count_is_checked_before_the_schema_and_the_network(tmp_path, monkeypatch):
    def not_reached(*args, **kwargs):
        raise AssertionError("a file for another job must be refused before this")

    monkeypatch.setattr(T, "check_schema", not_reached)
    monkeypatch.setattr(T, "from_dict", not_reached)
    monkeypatch.setattr(T, "_declared", not_reached)
    with pytest.raises(TopologyError, match="the topology has 6 ranks but this job has 2"):
        load_for_job("racks-2x3", 2)
    doc = generate.random_measured(5, 2)
    with pytest.raises(TopologyError, match="the topology has 5 ranks but this job has 4"):
        load_for_job(_write(tmp_path, doc), 4)


def test_a_file_too_large_for_the_job_is_not_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:  # sparse: the size is what counts
        fh.truncate(T.file_budget(2) + 1)

    def not_reached(*args, **kwargs):
        raise AssertionError("the file's size alone must refuse it")

    monkeypatch.setattr(pathlib.Path, "read_bytes", not_reached)
    with pytest.raises(TopologyError, match=r"more than a topology for a job of 2 ranks"):
        load_for_job(path, 2)


def test_a_declared_file_gets_the_declared_budget_before_parsing(tmp_path, monkeypatch):
    # 40,000 links (1.5 MB) are past the declared budget of 64 ranks (linear in ranks) and
    # within the measured one (quadratic): refused unparsed
    n = 64
    path = tmp_path / "million.json"
    links = ",".join('{"ends": ["h%d", "s"], "gbps": 1}' % i for i in range(40_000))
    path.write_text('{"switches": ["s"], "links": [%s], "ranks": ["h0"]}' % links)
    assert T.file_budget(n, measured=False) < path.stat().st_size < T.file_budget(n)

    def not_reached(*args, **kwargs):
        raise AssertionError("a declared file past its budget must not be parsed")

    monkeypatch.setattr(T.json, "loads", not_reached)
    with pytest.raises(TopologyError, match="more than a declared topology for a job of 64 ranks"):
        load_for_job(path, n)


def test_load_for_job_takes_a_bundled_name_and_checks_its_argument():
    assert load_for_job("racks-2x3", 6).n == 6
    with pytest.raises(ValueError, match="nranks must be a positive int"):
        load_for_job("racks-2x3", 0)


def test_resolve_takes_files_first_then_bundled_names(tmp_path, monkeypatch):
    assert T.resolve("racks-2x3") == bundled("racks-2x3")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "racks-2x3").write_text(json.dumps(generate.uniform_star(3)))
    assert T.resolve("racks-2x3") == pathlib.Path("racks-2x3")
    with pytest.raises(TopologyError, match="'nope' is neither a topology file nor a bundled "
                                            "topology; bundled: racks-2x3, slow-nic"):
        T.resolve("nope")
    with pytest.raises(TopologyError, match="topology file nope.json: cannot read: no such"):
        T.resolve("nope.json")
    with pytest.raises(TopologyError, match="is a folder"):
        T.resolve(str(tmp_path) + "/")


# The quick test stands in for the validator on long arrays: it must never pass an array that
# the validator would refuse.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                     st.text(max_size=2))
_values = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=3), max_leaves=8)
_ITEM_SCHEMAS = [
    {"type": ["number", "null"]},
    {"type": "integer", "minimum": 0},
    {"type": "array", "items": {"type": ["number", "null"]}},
    {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0}},
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_ITEM_SCHEMAS), st.lists(_values, max_size=6))
def test_the_quick_test_passes_only_what_the_validator_passes(item_schema, values):
    every = T._quick_test(item_schema)
    assert every is not None
    valid = jsonschema.Draft202012Validator({"type": "array", "items": item_schema}).is_valid(
        values)
    if every(values):
        assert valid


def test_the_quick_test_declines_schemas_it_cannot_decide():
    assert T._quick_test({"$ref": "#/$defs/gbps"}) is None
    assert T._quick_test({"type": "number", "exclusiveMinimum": 0}) is None
    assert T._quick_test({"anyOf": [{"type": "null"}]}) is None
