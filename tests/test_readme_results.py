"""README.md's results table is taken from the scale table that benchmarks/scale_sim.py writes
to docs/results/scale_sim.md: every row it shows is a row of that file, and every figure under
a column name is the file's figure under the same name. A figure the file does not hold would
be a figure nobody measured."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "docs/results/scale_sim.md"
#: The columns that name a row of the scale table.
ROW_KEY = ("topology", "ranks", "ranks are")


def _tables(text: str) -> List[List[str]]:
    tables: List[List[str]] = []
    current: List[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line.strip())
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _rows(table: List[str]) -> Tuple[List[str], List[Dict[str, str]]]:
    """The header and the rows (header name -> cell) of a Markdown table."""
    header = _cells(table[0])
    assert len(set(header)) == len(header), f"a column name repeats: {header}"
    return header, [dict(zip(header, _cells(line))) for line in table[2:]]


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


def test_readme_results_table_is_taken_from_the_scale_table() -> None:
    section = _section((ROOT / "README.md").read_text(encoding="utf-8"), "Results")
    assert f"]({SOURCE})" in section, f"the Results section does not name {SOURCE}"
    assert "benchmarks/scale_sim.py" in section, "the Results section names no command"
    tables = _tables(section)
    assert len(tables) == 1, f"the Results section should hold one table, found {len(tables)}"
    header, shown = _rows(tables[0])
    assert shown, "the README's results table has no rows"
    source = (ROOT / SOURCE).read_text(encoding="utf-8")
    assert source.startswith("# scale_sim: "), f"{SOURCE} is not the scale table's file"
    (made,) = _tables(_section(source, "Allreduce time"))
    made_header, made_rows = _rows(made)
    assert all(k in header for k in ROW_KEY), f"the README's table lacks {ROW_KEY}"
    unknown = [h for h in header if h not in made_header]
    assert not unknown, f"README columns that {SOURCE} does not have: {unknown}"
    by_key = {tuple(r[k] for k in ROW_KEY): r for r in made_rows}
    for row in shown:
        key = tuple(row[k] for k in ROW_KEY)
        assert key in by_key, f"README row {key} is not a row of {SOURCE} (rerun, copy again)"
        differ = {h: (row[h], by_key[key][h]) for h in header if row[h] != by_key[key][h]}
        assert not differ, (f"README row {key} differs from {SOURCE} "
                            f"(README, file): {differ}")
