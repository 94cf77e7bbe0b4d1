# Sourced by the Quickstart scripts: makes .venv at the repository root and installs the project
# into it (editable, with MPICH from PyPI, the CPU build of torch and the test extras). Re-running is cheap: the install is
# skipped when setup.cfg has not changed since the last one.
set -euo pipefail
HOROTOPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$HOROTOPO_ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "[horotopo] creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.horotopo-installed"
want="$(cat "$HOROTOPO_ROOT/setup.cfg" "$HOROTOPO_ROOT/launch/venv.sh" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    echo "[horotopo] installing horotopo[mpich,test] into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    # Pinned first: an open torch range would pull a multi-GB CUDA build; 2.13.0 is the CPU build.
    "$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
    "$VENV/bin/python" -m pip install -q -e "$HOROTOPO_ROOT[mpich,test]" >&2
    echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
