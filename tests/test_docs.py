"""The documentation stays true to the code and self-contained.

- docs/settings.md is what its generating command writes from the settings registry today;
- README.md stays short enough to read from the top;
- nothing in the repository points at files outside it;
- every relative link in README.md and docs/ leads to a file that exists;
- every results file under docs/results/ carries the stamp its benchmark writes.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from horotopo.cli.config_cmd import SETTINGS_DOC_COMMAND, settings_document

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300

# Spelled in pieces so that this file does not match its own search.
OUTSIDE_REFERENCES = ("../" + "shared", "DESIGN" + ".md")
SEARCHED = ("README.md", "docs", "horotopo", "launch", "benchmarks", "tests", "setup.cfg")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache"}
SKIPPED_SUFFIXES = {".gz", ".png", ".so", ".pyc", ".o", ".whl"}

# [text](target) and ![alt](target), the target up to whitespace or ")"; [label]: target
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _text_files() -> Iterator[Path]:
    for name in SEARCHED:
        top = ROOT / name
        if top.is_file():
            yield top
            continue
        if not top.is_dir():
            continue
        for path in sorted(top.rglob("*")):
            if (path.is_file() and path.suffix not in SKIPPED_SUFFIXES
                    and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts)):
                yield path


def _markdown_files() -> List[Path]:
    files = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    return files + sorted((ROOT / "docs").rglob("*.md"))


def _links(text: str) -> List[str]:
    """Link targets outside code blocks and inline code (where brackets are not links)."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def _is_relative(target: str) -> bool:
    return not (re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#")
                or target.startswith("/"))


def broken_links() -> List[Tuple[str, str]]:
    """(markdown file, link target) for every relative link whose file does not exist."""
    broken = []
    for md in _markdown_files():
        for target in _links(md.read_text(encoding="utf-8")):
            if not _is_relative(target):
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            if path and not (md.parent / path).exists():
                broken.append((str(md.relative_to(ROOT)), target))
    return broken


def test_settings_doc_is_current() -> None:
    path = ROOT / "docs" / "settings.md"
    assert path.exists(), f"docs/settings.md is missing; write it with: {SETTINGS_DOC_COMMAND}"
    assert path.read_text(encoding="utf-8") == settings_document(), (
        f"docs/settings.md differs from the settings registry; regenerate it with: "
        f"{SETTINGS_DOC_COMMAND}")


def test_settings_doc_lists_every_setting() -> None:
    from horotopo import config

    document = settings_document()
    missing = [s.name for s in config.declared() if f"`{s.name}`" not in document]
    assert not missing, f"settings missing from the generated document: {missing}"


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, at most {README_MAX_LINES}: move detail into docs/")


def test_nothing_points_outside_the_repository() -> None:
    found = []
    for path in _text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary data, not prose or code
        for number, line in enumerate(text.splitlines(), 1):
            for ref in OUTSIDE_REFERENCES:
                if ref in line:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {ref}")
    assert not found, "references to files outside the repository:\n" + "\n".join(found)


def test_relative_links_resolve() -> None:
    broken = broken_links()
    assert not broken, "links to files that do not exist:\n" + "\n".join(
        f"{md}: {target}" for md, target in sorted(set(broken)))


RESULTS = sorted((ROOT / "docs" / "results").glob("*.md"))


@pytest.mark.skipif(not RESULTS, reason="no results file has been written yet")
@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_results_files_are_stamped(path: Path) -> None:
    head = path.read_text(encoding="utf-8").splitlines()[:20]
    for field in ("- date: ", "- commit: `", "- CPU: ", "- command: `"):
        assert any(line.startswith(field) for line in head), (
            f"{path.relative_to(ROOT)} has no '{field.strip()}' line: results files are "
            f"written by their benchmark's --markdown, not by hand")


def test_link_parser_finds_relative_links_only() -> None:
    text = ("[a](docs/x.md) ![p](img/p.png \"title\") [web](https://e.org) [top](#top)\n"
            "`[code](not/a/link.md)`\n```\n[fenced](no.md)\n```\n[ref]: docs/y.md\n")
    assert [t for t in _links(text) if _is_relative(t)] == ["docs/x.md", "img/p.png",
                                                            "docs/y.md"]


def test_a_benchmark_writes_a_stamped_results_file(tmp_path: Path) -> None:
    """``--markdown PATH``: the file opens with the stamp, then the benchmark's own table."""
    import subprocess
    import sys

    out = tmp_path / "planner_scale.md"
    argv = ["benchmarks/planner_scale.py", "--ranks", "16", "--generators",
            "sites:gpus=8,wan_gbps=10", "--markdown", str(out)]
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# planner_scale")
    stamp = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
             for line in text.splitlines() if line.startswith("- ")}
    assert stamp["- command"] == "`python " + " ".join(argv) + "`"
    assert stamp["- commit"].strip("`").split("+")[0].isalnum()
    for field in ("- date", "- CPU", "- cores", "- memory", "- OS", "- Python", "- MPI", "- GPU"):
        assert stamp.get(field), f"no {field[2:]} in the stamp"
    assert "| sites-16-wan10 | 16 |" in text


def test_the_architecture_doc_names_every_module() -> None:
    """docs/architecture.md gives every module its layer; a new module needs its row there."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = sorted((ROOT / "horotopo").rglob("*.py")) + sorted((ROOT / "launch").rglob("*.py"))
    assert len(modules) > 50
    missing = [path.relative_to(ROOT).as_posix() for path in modules
               if f"`{path.relative_to(ROOT).as_posix()}`" not in doc]
    assert not missing, "docs/architecture.md has no row for: " + ", ".join(missing)
