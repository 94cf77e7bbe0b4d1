"""docs/topology.md stays true: its examples plan, its error is what the CLI says, its lists
and bounds are the package's."""
import json
import re
from pathlib import Path

import pytest

from horotopo import topology as T
from horotopo.cli import main
from horotopo.generate import GENERATORS

DOC = Path(__file__).resolve().parents[1] / "docs" / "topology.md"


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _examples():
    return [json.loads(block) for block in _blocks("json")]


def test_the_doc_has_a_declared_and_a_measured_example():
    kinds = ["measured" if "bandwidth_gbps" in doc else "declared" for doc in _examples()]
    assert kinds == ["declared", "measured"]


@pytest.mark.parametrize("index", [0, 1])
def test_every_example_plans(tmp_path, capsys, index):
    doc = _examples()[index]
    path = tmp_path / f"{doc['name']}.json"
    path.write_text(json.dumps(doc))
    assert main(["plan", str(path), "--size", "1M", "-q"]) == 0
    out = capsys.readouterr().out
    assert f"plan for {doc['name']}: {len(doc['ranks'])} ranks" in out and "verdict:" in out


def test_the_error_shown_is_the_one_the_cli_prints(tmp_path, capsys, monkeypatch):
    doc = _examples()[0]
    doc["links"][3]["gbps"] = -1
    monkeypatch.chdir(tmp_path)
    Path("two-racks.json").write_text(json.dumps(doc))
    assert main(["plan", "two-racks.json", "-q"]) == 2
    line = capsys.readouterr().err.strip()
    assert [line] == [b.strip() for b in _blocks("text")]


def test_the_bundled_and_generator_names_are_the_packages():
    text = DOC.read_text()
    section = text.split("## Bundled topologies")[1].split("##")[0]
    assert re.findall(r"^\| `([\w-]+)` \|", section, flags=re.M) == T.bundled_names()
    generated = text.split("## Generated clusters")[1].split("##")[0]
    assert all(f"`{name}`" in generated for name in GENERATORS)


def test_the_bounds_stated_are_the_loaders():
    text = " ".join(DOC.read_text().split())
    assert T.BASE_FILE_BYTES == 1 << 20 and T.BYTES_PER_RANK_PAIR == 1 << 10
    assert T.BYTES_PER_RANK == 4 << 10 and T.MAX_FILE_BYTES == 1 << 30
    assert ("at most 1 MiB plus 1 KiB per rank pair" in text
            and "1 MiB plus 4 KiB per rank for a file without `bandwidth_gbps`" in text
            and "at most 1 GiB for any job" in text)
    assert f"nested at most {T.MAX_DEPTH} deep" in text
