# Sourced by the Quickstart scripts, or by hand (`source launch/venv.sh`): makes .venv at the
# repository root, installs the project into it (editable, with MPICH from PyPI, the CPU build
# of torch and the test extras) and puts it first on PATH. Re-running is cheap: the install is
# skipped when setup.cfg and this file have not changed since the last one.
#
# It leaves the caller's shell as it found it: the work runs in a subshell with its own
# `set -euo pipefail`, so no option outlives it. A failure names the step that failed and
# returns non-zero; a script that sources this should stop on it (`source ... || exit 1`).
HOROTOPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$HOROTOPO_ROOT/.venv"
(
    set -euo pipefail
    trap 'echo "[horotopo] venv setup failed (status $?) at: $BASH_COMMAND" >&2' ERR
    py="${PYTHON:-python3}"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "[horotopo] creating $VENV" >&2
        "$py" -m venv "$VENV"
    fi
    stamp="$VENV/.horotopo-installed"
    want="$(cat "$HOROTOPO_ROOT/setup.cfg" "$HOROTOPO_ROOT/launch/venv.sh" | sha256sum |
            cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        echo "[horotopo] installing horotopo[mpich,test] into $VENV" >&2
        "$VENV/bin/python" -m pip install -q --upgrade pip >&2
        # Pinned first: an open torch range would pull a multi-GB CUDA build; 2.13.0 is the
        # CPU build.
        "$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
        "$VENV/bin/python" -m pip install -q -e "$HOROTOPO_ROOT[mpich,test]" >&2
        echo "$want" > "$stamp"
    fi
)
if [ $? -ne 0 ]; then
    # `return` when sourced; `exit` when run as `bash launch/venv.sh`
    return 1 2>/dev/null || exit 1
fi
export PATH="$VENV/bin:$PATH"
