"""``source launch/venv.sh`` leaves the caller's shell as it found it, and fails clearly.

Each test sources a copy of the script in a repository of its own whose venv is already
installed (a stamp that matches), so nothing is installed: what is checked is the shell around
it.
"""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _repository(tmp_path: Path, installed: bool = True) -> Path:
    root = tmp_path / "repo"
    (root / "launch").mkdir(parents=True)
    shutil.copy(ROOT / "launch" / "venv.sh", root / "launch" / "venv.sh")
    shutil.copy(ROOT / "setup.cfg", root / "setup.cfg")
    if installed:
        (root / ".venv" / "bin").mkdir(parents=True)
        (root / ".venv" / "bin" / "python").symlink_to(sys.executable)
        stamp = hashlib.sha256((root / "setup.cfg").read_bytes()
                               + (root / "launch" / "venv.sh").read_bytes()).hexdigest()
        (root / ".venv" / ".horotopo-installed").write_text(stamp + "\n")
    return root


def _bash(script: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


# `set -o` and `shopt -p` as the caller sees them, before and after sourcing
_COMPARE = """
before="$(set -o; shopt -p)"
source "$REPO/launch/venv.sh"; status=$?
after="$(set -o; shopt -p)"
echo "status=$status"
[ "$before" = "$after" ] && echo "options unchanged" || diff <(echo "$before") <(echo "$after")
echo "still here"
"""


@pytest.mark.parametrize("caller_options", ["", "set -u", "set +e +u +o pipefail"])
def test_sourcing_keeps_the_callers_options(tmp_path, caller_options):
    root = _repository(tmp_path)
    out = _bash(caller_options + "\n" + _COMPARE + 'echo "PATH=$PATH"\necho "VENV=$VENV"',
                REPO=str(root))
    assert out.returncode == 0, out.stderr
    assert "status=0" in out.stdout and "options unchanged" in out.stdout, out.stdout
    assert f"PATH={root}/.venv/bin:" in out.stdout and f"VENV={root}/.venv" in out.stdout
    assert "installing" not in out.stderr  # the stamp is current: nothing to install


def test_a_failure_is_named_and_returns_without_closing_the_shell(tmp_path):
    root = _repository(tmp_path, installed=False)
    # the venv cannot be created: the shell that sourced the script must go on
    out = _bash(_COMPARE + 'echo "PATH=$PATH"', REPO=str(root), PYTHON="false")
    assert "status=1" in out.stdout and "options unchanged" in out.stdout, out
    assert "still here" in out.stdout
    assert "[horotopo] venv setup failed (status 1) at: \"$py\" -m venv \"$VENV\"" in out.stderr
    assert f"{root}/.venv/bin" not in out.stdout.split("PATH=")[1]


def test_a_sourcing_script_with_errexit_stops(tmp_path):
    root = _repository(tmp_path, installed=False)
    out = _bash('set -e\nsource "$REPO/launch/venv.sh"\necho "went on"', REPO=str(root),
                PYTHON="false")
    assert out.returncode != 0 and "went on" not in out.stdout
    assert "venv setup failed" in out.stderr
