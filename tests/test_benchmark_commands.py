"""The benchmarks a reader is pointed at exist, load, and take the options the docs give them.

The benchmarks are scripts outside the package, so nothing else imports them: a renamed
package function breaks one silently until someone runs it. These checks read the scripts as
text and load each one in a child process (its module body, not its main), so the test process
itself imports nothing from ``benchmarks/``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
COMMAND = re.compile(r"python3? benchmarks/([\w-]+\.py)((?:[ \t]+[^\s`|]+)*)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def documented_commands(text: str) -> List[Tuple[str, List[str]]]:
    """``(script, options)`` of every ``python benchmarks/NAME.py ...`` command in ``text``."""
    return [(m.group(1), OPTION.findall(m.group(2))) for m in COMMAND.finditer(text)]


def unknown_options(commands: List[Tuple[str, List[str]]],
                    sources: Dict[str, str]) -> Set[str]:
    """The documented ``script option`` pairs whose script is missing or never names the
    option as a quoted string (how argparse declares it)."""
    bad = set()
    for script, options in commands:
        source = sources.get(script)
        if source is None:
            bad.add(f"{script} (no such benchmark)")
            continue
        bad.update(f"{script} {opt}" for opt in options
                   if f'"{opt}"' not in source and f"'{opt}'" not in source)
    return bad


def _docs() -> Dict[str, str]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in files}


def test_the_check_finds_a_missing_option_and_a_missing_script():
    sources = {"predict_check.py": 'ap.add_argument("--ranks")'}
    text = ("run `python benchmarks/predict_check.py --ranks 64 --sizes 1M` and\n"
            "`python benchmarks/gone.py --x`")
    assert unknown_options(documented_commands(text), sources) == {
        "predict_check.py --sizes", "gone.py (no such benchmark)"}


def test_every_documented_benchmark_command_uses_options_the_benchmark_has():
    # the options every benchmark takes from the shared results writer (--markdown) count
    shared = (BENCHMARKS / "results.py").read_text()
    sources = {p.name: p.read_text() + shared for p in BENCHMARKS.glob("*.py")}
    bad = {f"{doc}: {item}" for doc, text in _docs().items()
           for item in unknown_options(documented_commands(text), sources)}
    assert not bad, sorted(bad)


def test_every_benchmark_loads():
    # Each script's module body runs (its imports) under another __name__, so no main runs.
    code = ("import runpy, sys, traceback\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "bad = []\n"
            "scripts = sys.argv[2:]\n"
            "for path in scripts:\n"
            "    try:\n"
            "        sys.argv[:] = [path]\n"
            "        runpy.run_path(path, run_name='loaded_by_test')\n"
            "    except BaseException as exc:\n"
            "        bad.append(f'{path}: {type(exc).__name__}: {exc}')\n"
            "print('\\n'.join(bad) or 'every benchmark loaded')\n"
            "sys.exit(1 if bad else 0)\n")
    scripts = sorted(str(p) for p in BENCHMARKS.glob("*.py"))
    # memory_allreduce re-executes itself unless the allocator setting it needs is there
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS), *scripts],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    # the last line also shows that no script ended the process while loading
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1:] == ["every benchmark loaded"], \
        proc.stdout[-3000:] + proc.stderr[-3000:]
