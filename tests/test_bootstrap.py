"""init() wiring without MPI: the settings it reads and the model of HOROTOPO_PROBE=off."""
import pytest

from horotopo.bootstrap import DEFAULT_PROBE, BootstrapError, read_env, uniform_document
from horotopo.plan import ring_plan
from horotopo.topology import from_dict


def test_defaults_probe_quick_without_a_file():
    assert read_env({}) == (DEFAULT_PROBE, None) == ("quick", None)


@pytest.mark.parametrize("value, mode", [("off", "off"), ("QUICK", "quick"), (" full ", "full"),
                                         ("", "quick")])
def test_probe_values(value, mode):
    assert read_env({"HOROTOPO_PROBE": value}) == (mode, None)


def test_topology_path_is_passed_through():
    assert read_env({"HOROTOPO_TOPOLOGY": "/x/t.json", "HOROTOPO_PROBE": "off"}) == \
        ("off", "/x/t.json")


@pytest.mark.parametrize("env, words", [
    ({"HOROTOPO_PROBE": "fast"}, ["HOROTOPO_PROBE='fast'", "off, quick, full"]),
    ({"HOROTOPO_PROBE": "1"}, ["HOROTOPO_PROBE", "off, quick, full"]),
    ({"HOROTOPO_TOPOLOGY": "  "}, ["HOROTOPO_TOPOLOGY", "empty"]),
])
def test_bad_values_name_the_variable_and_the_choices(env, words):
    with pytest.raises(BootstrapError) as err:
        read_env(env)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_uniform_model_plans_a_ring(n):
    topo = from_dict(uniform_document(n))
    assert topo.n == n and topo.kind == "measured"
    plan = ring_plan(topo)
    assert plan.n == n and len(plan.trees) == n
    assert "HOROTOPO_PROBE=off" in topo.name
