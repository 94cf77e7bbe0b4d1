"""README.md's results table is a copy of a table that a benchmark wrote under docs/results/;
a figure in it that the benchmark's file does not hold would be a figure nobody measured."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tables(text: str) -> list[list[str]]:
    tables: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line.strip())
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _results_section(readme: str) -> str:
    match = re.search(r"^## Results\n(.*?)(?=^## )", readme, flags=re.M | re.S)
    assert match, "README.md has no '## Results' section"
    return match.group(1)


def test_readme_results_table_is_copied_from_its_results_file() -> None:
    section = _results_section((ROOT / "README.md").read_text(encoding="utf-8"))
    sources = re.findall(r"\]\((docs/results/[^)]+\.md)\)", section)
    assert sources, "the Results section names no docs/results/ file it copies from"
    tables = _tables(section)
    assert len(tables) == 1, f"the Results section should hold one table, found {len(tables)}"
    source_lines = set()
    for source in sources:
        for table in _tables((ROOT / source).read_text(encoding="utf-8")):
            source_lines.update(table)
    missing = [line for line in tables[0] if line not in source_lines]
    assert not missing, (f"README.md's results rows not in {', '.join(sources)} "
                         f"(rerun the benchmark and copy its table): {missing}")
