"""horotopo.config: one registry of environment variables, strict parsing, and the only reader.

Also ``python -m horotopo config`` and the settings table of docs/settings.md, which is
generated from the registry and must match it.
"""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import List, Tuple

import pytest

from horotopo import config
from horotopo.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# The places outside horotopo/config.py that may touch os.environ, and why. Each passes an
# environment *through* to a child process; none reads a setting.
ENVIRON_ALLOWED = {
    # horotopo-run starts mpiexec with the launcher's own environment plus the job's variables.
    ("launch/cli.py", "env = dict(os.environ)"),
    # horotopo-run -x NAME forwards the user's variable NAME, whatever it is, to every rank.
    ("launch/cli.py", "elif name in os.environ:"),
    ("launch/cli.py", "env[name] = os.environ[name]"),
    # The emulated cluster starts mpiexec with this environment plus the job's variables.
    ("launch/emulate.py", "full_env = dict(os.environ)"),
}
_ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _environ_uses(path: Path) -> List[Tuple[int, str]]:
    """Lines of ``path`` whose code (not strings or comments) reaches os.environ or getenv."""
    out = []
    lines = path.read_text().splitlines()
    with path.open("rb") as fh:
        toks = [t for t in tokenize.tokenize(fh.readline)
                if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)]
    for prev, tok in zip(toks, toks[1:]):
        if tok.type != tokenize.NAME or tok.string not in _ENV_NAMES:
            continue
        # `x.environ` / `os.getenv` (any module) or `from os import environ`; a parameter that
        # happens to be named environ is a mapping handed in, not a read of the process's own.
        if prev.string in (".", "import", ","):
            out.append((tok.start[0], lines[tok.start[0] - 1].strip()))
    return out


def test_nothing_but_config_reads_the_environment():
    files = sorted((ROOT / "horotopo").rglob("*.py")) + sorted((ROOT / "launch").rglob("*.py"))
    assert len(files) > 20
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "horotopo/config.py":
            continue
        for line_no, line in _environ_uses(path):
            if (rel, line) not in ENVIRON_ALLOWED:
                found.append(f"{rel}:{line_no}: {line}")
    assert not found, ("read settings through horotopo.config.get (declare the variable in "
                       "horotopo/config.py), not os.environ:\n" + "\n".join(found))


def test_the_environ_scan_sees_reads_and_skips_strings(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('import os\nfrom os import getenv\n"os.environ in a string"\n'
                   "# os.environ in a comment\nx = os.environ.get('A')\n"
                   "def f(environ):\n    return environ.get('B')\n")
    assert [n for n, _ in _environ_uses(src)] == [2, 5]


def test_every_literal_get_names_a_declared_setting():
    """``config.get("X")`` anywhere in the code names a declared X (else it fails at run time)."""
    pattern = re.compile(r"config\.(?:get|lookup|parse)\(\s*\"([A-Z_]+)\"")
    names = set()
    for path in list((ROOT / "horotopo").rglob("*.py")) + list((ROOT / "launch").rglob("*.py")):
        names |= set(pattern.findall(path.read_text()))
    assert {"HOROVOD_CYCLE_TIME", "HOROTOPO_POLL_SLEEP_US", "HOROTOPO_MPIEXEC"} <= names
    assert sorted(n for n in names if n not in config.SETTINGS) == []


def test_every_variable_the_package_names_is_declared():
    """A HOROTOPO_*/HOROVOD_* variable named in horotopo/ or launch/ is in the registry.

    Horovod's dtype constants (HOROVOD_FLOAT32...) share the prefix but are no variables.
    """
    pattern = re.compile(r"\b((?:HOROTOPO|HOROVOD)_[A-Z][A-Z0-9_]*[A-Z0-9])\b")
    not_variables = re.compile(r"HOROVOD_(U?INT\d+|FLOAT\d+|BFLOAT16|BOOL)$")
    named = set()
    for path in list((ROOT / "horotopo").rglob("*.py")) + list((ROOT / "launch").rglob("*.py")):
        named |= set(pattern.findall(path.read_text()))
    undeclared = sorted(n for n in named if not not_variables.match(n)
                        and n not in config.SETTINGS)
    assert undeclared == []


@pytest.mark.parametrize("name, raw, allowed", [
    ("HOROTOPO_POLL_SLEEP_US", "abc", "a number >= 0"),
    ("HOROTOPO_POLL_SLEEP_US", "-1", "a number >= 0"),
    ("HOROTOPO_SPIN_POLLS", "1.5", "a whole number >= 0"),
    ("HOROVOD_CYCLE_TIME", "fast", "a number >= 0"),
    ("HOROVOD_CYCLE_TIME", "nan", "a number >= 0"),
    ("HOROTOPO_TIMEOUT_S", "0", "a number > 0"),
    ("HOROTOPO_TIMEOUT_S", "inf", "a number > 0"),
    ("HOROVOD_START_TIMEOUT", "-5", "a number > 0"),
    ("HOROVOD_FUSION_THRESHOLD", "64MB", "a whole number >= 0"),
    ("HOROTOPO_PROBE", "fast", "off, quick, full"),
    ("HOROTOPO_GPU_KERNELS", "cuda", "auto, native, fallback"),
    ("HOROVOD_LOG_LEVEL", "verbose", "trace, debug, info, warning, error, fatal"),
    ("HOROVOD_STALL_CHECK_DISABLE", "disabled", "1, true, yes, on, 0, false, no, off"),
])
def test_a_bad_value_names_the_variable_the_value_and_what_is_allowed(name, raw, allowed):
    with pytest.raises(ConfigError) as err:
        config.get(name, env={name: raw})
    assert f"{name}={raw!r}" in str(err.value)
    assert allowed in str(err.value)


def test_config_error_is_the_one_reliability_exports():
    from horotopo import reliability

    assert reliability.ConfigError is ConfigError and issubclass(ConfigError, ValueError)


def test_defaults_and_values():
    assert config.get("HOROVOD_CYCLE_TIME", env={}) == 1.0
    assert config.get("HOROVOD_CYCLE_TIME", env={"HOROVOD_CYCLE_TIME": " 2.5 "}) == 2.5
    assert config.get("HOROVOD_CYCLE_TIME", env={"HOROVOD_CYCLE_TIME": ""}) == 1.0
    assert config.get("HOROTOPO_SPIN_POLLS", env={"HOROTOPO_SPIN_POLLS": "7"}) == 7
    assert config.get("HOROTOPO_PROBE", env={"HOROTOPO_PROBE": "FULL"}) == "full"
    assert config.get("HOROTOPO_ADAPT", env={}) is None
    assert config.get("HOROTOPO_TOPOLOGY", env={"HOROTOPO_TOPOLOGY": "/t.json"}) == "/t.json"
    with pytest.raises(ConfigError, match="HOROTOPO_TOPOLOGY is set but empty"):
        config.get("HOROTOPO_TOPOLOGY", env={"HOROTOPO_TOPOLOGY": "  "})
    with pytest.raises(KeyError, match="HOROTOPO_NO_SUCH is not a declared setting"):
        config.get("HOROTOPO_NO_SUCH", env={})


@pytest.mark.parametrize("raw, want", [(w, True) for w in ("1", "true", "TRUE", "Yes", "on",
                                                              " on ")]
                         + [(w, False) for w in ("0", "false", "False", "NO", "off")])
def test_boolean_words(raw, want):
    assert config.get("HOROVOD_STALL_CHECK_DISABLE",
                      env={"HOROVOD_STALL_CHECK_DISABLE": raw}) is want


@pytest.mark.parametrize("raw", ["2", "y", "enable", "-1", "truthy"])
def test_anything_else_is_not_a_boolean(raw):
    with pytest.raises(ConfigError, match="HOROVOD_STALL_CHECK_DISABLE"):
        config.get("HOROVOD_STALL_CHECK_DISABLE", env={"HOROVOD_STALL_CHECK_DISABLE": raw})


def test_stall_check_disable_false_keeps_the_check(monkeypatch):
    from horotopo.api.runtime import env_settings

    assert env_settings({"HOROVOD_STALL_CHECK_DISABLE": "false"})["stall_check"] == 1.0
    assert env_settings({"HOROVOD_STALL_CHECK_DISABLE": "true"})["stall_check"] == 0.0
    assert env_settings({})["stall_check"] == 1.0


def test_the_launcher_aliases_are_read_and_must_agree():
    env = {"HOROTOPO_CYCLE_TIME": "4"}
    assert config.get("HOROVOD_CYCLE_TIME", env=env) == 4.0
    assert config.get("HOROVOD_CYCLE_TIME", env={**env, "HOROVOD_CYCLE_TIME": "4.0"}) == 4.0
    with pytest.raises(ConfigError, match="HOROVOD_CYCLE_TIME='5' and HOROTOPO_CYCLE_TIME='4' "
                                          "disagree"):
        config.get("HOROVOD_CYCLE_TIME", env={**env, "HOROVOD_CYCLE_TIME": "5"})
    with pytest.raises(ConfigError, match="HOROTOPO_LOG_LEVEL='loud'"):
        config.get("HOROVOD_LOG_LEVEL", env={"HOROTOPO_LOG_LEVEL": "loud"})


def test_transport_poll_settings_come_from_config(monkeypatch):
    """The bare `could not convert string to float` of HOROTOPO_POLL_SLEEP_US=abc is gone."""
    pytest.importorskip("mpi4py")
    from horotopo.transport.mpi import MPITransport

    class Comm:  # MPITransport reads its settings before it touches the communicator
        def Dup(self) -> "Comm":
            raise AssertionError("the settings should have been refused first")

    monkeypatch.setenv("HOROTOPO_POLL_SLEEP_US", "abc")
    with pytest.raises(ConfigError, match=r"HOROTOPO_POLL_SLEEP_US='abc': must be a number"):
        MPITransport(Comm())


def test_effective_says_where_each_value_came_from():
    rows = {r.setting.name: r for r in config.effective(
        {"HOROTOPO_CYCLE_TIME": "3", "HOROTOPO_PROBE": "off", "HOROTOPO_SPIN_POLLS": "x"})}
    assert len(rows) == len(config.declared())
    assert (rows["HOROVOD_CYCLE_TIME"].value, rows["HOROVOD_CYCLE_TIME"].source,
            rows["HOROVOD_CYCLE_TIME"].variable) == (3.0, "environment", "HOROTOPO_CYCLE_TIME")
    assert (rows["HOROTOPO_PROBE"].value, rows["HOROTOPO_PROBE"].source) == ("off", "environment")
    assert (rows["HOROTOPO_TIMEOUT_S"].value, rows["HOROTOPO_TIMEOUT_S"].source) == (60.0,
                                                                                      "default")
    assert rows["HOROTOPO_SPIN_POLLS"].source == "error"
    assert "HOROTOPO_SPIN_POLLS='x'" in rows["HOROTOPO_SPIN_POLLS"].error


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "horotopo", "config", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def _clean_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items()
            if not k.startswith(("HOROTOPO_", "HOROVOD_"))}


def test_cli_prints_values_and_sources():
    res = _cli(env={**_clean_env(), "HOROVOD_FUSION_THRESHOLD": "1024", "HOROTOPO_PROBE": "off"})
    assert res.returncode == 0, res.stderr
    lines = {line.split()[0]: line for line in res.stdout.splitlines()[1:]}
    assert set(lines) == {s.name for s in config.declared()}
    assert re.search(r"^HOROVOD_FUSION_THRESHOLD\s+1024\s+environment "
                     r"\(HOROVOD_FUSION_THRESHOLD\)$", lines["HOROVOD_FUSION_THRESHOLD"])
    assert re.search(r"^HOROTOPO_PROBE\s+off\s+environment", lines["HOROTOPO_PROBE"])
    assert re.search(r"^HOROVOD_CYCLE_TIME\s+1\s+default$", lines["HOROVOD_CYCLE_TIME"])


def test_cli_json_and_a_bad_value():
    res = _cli("--json", env={**_clean_env(), "HOROTOPO_CYCLE_TIME": "2",
                              "HOROTOPO_POLL_SLEEP_US": "abc"})
    assert res.returncode == 1
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["HOROVOD_CYCLE_TIME"]["value"] == 2.0
    assert rows["HOROVOD_CYCLE_TIME"]["source"] == "environment"
    assert rows["HOROVOD_CYCLE_TIME"]["variable"] == "HOROTOPO_CYCLE_TIME"
    assert rows["HOROTOPO_SPIN_POLLS"]["source"] == "default"
    assert rows["HOROTOPO_POLL_SLEEP_US"]["source"] == "error"
    assert "HOROTOPO_POLL_SLEEP_US='abc': must be a number >= 0" in res.stderr


def test_settings_table_is_generated_from_the_registry():
    res = _cli("--markdown", env=_clean_env())
    assert res.returncode == 0, res.stderr
    assert config.markdown_table() in res.stdout
    for s in config.declared():
        assert f"| `{s.name}`" in res.stdout
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert "python -m horotopo config --markdown" in doc
    assert config.markdown_table() in doc, ("docs/settings.md's table is stale: regenerate "
                                            "it with python -m horotopo config --markdown")


def test_markdown_table_rows_match_the_declarations():
    table = io.StringIO(config.markdown_table()).read().splitlines()
    assert len(table) == 2 + len([s for s in config.declared() if s.parameter is None])
    row = next(r for r in table if r.startswith("| `HOROTOPO_TIMEOUT_S`"))
    assert row == ("| `HOROTOPO_TIMEOUT_S` | float (s) | 60 | a number > 0 | "
                   + config.lookup("HOROTOPO_TIMEOUT_S").doc + " |")
