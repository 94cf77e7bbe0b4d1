"""Fuzz the topology loader: any JSON value loads or raises TopologyError, nothing else."""
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from horotopo import generate
from horotopo.topology import Topology, TopologyError, from_dict

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 5),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=20)


def loads_or_rejects(doc):
    try:
        result = from_dict(doc)
    except TopologyError as exc:
        assert str(exc)
        return None
    assert isinstance(result, Topology)
    return result


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_json(doc):
    loads_or_rejects(doc)


KEYS_DECLARED = ["name", "switches", "links", "ranks"]
KEYS_MEASURED = ["name", "ranks", "bandwidth_gbps", "latency_ms", "egress_gbps", "ingress_gbps",
                 "shared"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), measured=st.booleans(), data=st.data())
def test_mutated_valid_documents(seed, measured, data):
    doc = generate.random_measured(3, seed) if measured else generate.random_declared(4, seed)
    keys = KEYS_MEASURED if measured else KEYS_DECLARED
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(keys))
        action = data.draw(st.sampled_from(["drop", "replace", "poke"]))
        if action == "drop":
            doc.pop(key, None)
        elif action == "replace":
            doc[key] = data.draw(json_values)
        elif isinstance(doc.get(key), list) and doc[key]:
            i = data.draw(st.integers(0, len(doc[key]) - 1))
            item = doc[key][i]
            if isinstance(item, dict) and item:
                field = data.draw(st.sampled_from(sorted(item)))
                item[field] = data.draw(json_values)
            elif isinstance(item, list) and item:
                item[data.draw(st.integers(0, len(item) - 1))] = data.draw(json_values)
            else:
                doc[key][i] = data.draw(json_values)
    topology = loads_or_rejects(json.loads(json.dumps(doc, allow_nan=True)))
    if topology is not None:
        assert all(c > 0 for c in topology.capacity_Bps)
        assert len(topology.routes) == topology.n
