"""Results files: one Markdown file per benchmark under docs/results/, written by the benchmark.

Every file opens with a stamp saying when, from which commit, on what machine and by which
command line its figures were made, so a reader can tell whether they still describe the code.
Benchmarks call :func:`add_markdown_option` on their parser and :func:`write` at the end.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "docs" / "results"

Column = Tuple[str, Callable[[Dict[str, Any]], Any]]


def default_path(benchmark: str) -> Path:
    """Where ``benchmark``'s results file lives: docs/results/<benchmark>.md."""
    return RESULTS_DIR / f"{benchmark}.md"


def add_markdown_option(parser: argparse.ArgumentParser, benchmark: str) -> None:
    """``--markdown [PATH]``: also write the results file (default docs/results/<benchmark>.md)."""
    parser.add_argument("--markdown", nargs="?", const=str(default_path(benchmark)),
                        default=None, metavar="PATH",
                        help=f"also write the results as Markdown, stamped with the date, "
                             f"commit and machine (default path "
                             f"{default_path(benchmark).relative_to(ROOT)})")


def _run(cmd: Sequence[str], timeout: float = 30.0) -> Optional[str]:
    """stdout of ``cmd``, or None when it cannot run or fails (the stamp then says unknown)."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> str:
    """``git rev-parse --short HEAD``, with ``+dirty`` when tracked files have uncommitted
    changes (untracked files, such as the results file being written, do not count)."""
    # A copy of the tree sent elsewhere (the GPU machine gets one, with a .git that need not
    # match it) is told its commit.
    given = os.environ.get("HOROTOPO_RESULTS_COMMIT")
    if given:
        return f"{given} (given by HOROTOPO_RESULTS_COMMIT)"
    head = _run(["git", "rev-parse", "--short", "HEAD"])
    if head is None:
        return "unknown (not a git checkout)"
    changes = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + ("+dirty" if changes else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory() -> str:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 2 ** 20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _os_name() -> str:
    try:
        with open("/etc/os-release") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"') + f", {platform.system()} " \
                        f"{platform.release()}"
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}"


def _mpi_library() -> str:
    """The MPI library's own version line. Asked in a child process unless this process has
    MPI loaded already, so that benchmarks which do not use MPI do not initialise it."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        text = mpi.Get_library_version()
    else:
        text = _run([sys.executable, "-c",
                     "from mpi4py import MPI; print(MPI.Get_library_version())"])
        if text is None:
            return "not available (mpi4py does not load)"
    return " ".join(text.strip().splitlines()[0].split())


def _gpu() -> str:
    if shutil.which("nvidia-smi") is None:
        return "none"
    text = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    if not text:
        return "none (nvidia-smi finds no GPU)"
    names = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{len(names)} x {names[0]}" if len(set(names)) == 1 else "; ".join(names)


def machine() -> Dict[str, str]:
    """The machine, without its host name: CPU, cores, memory, OS, Python, MPI, GPU."""
    return {"CPU": _cpu_model(), "cores": str(os.cpu_count()), "memory": _memory(),
            "OS": _os_name(), "Python": platform.python_version(), "MPI": _mpi_library(),
            "GPU": _gpu()}


def command_line(argv: Optional[Sequence[str]] = None, ranks: Optional[int] = None) -> str:
    """The command that produced the results, as one would type it from the repository root.

    ``ranks``: the MPI world size, for benchmarks run under ``mpiexec`` (which the process
    itself cannot see)."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = sys.argv[0]
    args = list(sys.argv[1:] if argv is None else argv)
    words = ["python", shown] + args
    if ranks is not None:
        words = ["mpiexec", "-n", str(ranks)] + words
    return shlex.join(words)


# Taken when the benchmark starts: the code it runs is the code of that moment, even if the
# tree changes while it runs.
_STARTED = (datetime.datetime.now(datetime.timezone.utc), commit(), os.getloadavg()[0])


def stamp(command: str) -> str:
    """The Markdown lines that open every results file."""
    started, started_commit, load_at_start = _STARTED
    lines = [f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')} (start of the run)",
             f"- commit: `{started_commit}`"]
    lines += [f"- {key}: {value}" for key, value in machine().items()]
    # Wall times on a shared machine depend on what else runs there.
    lines.append(f"- load average (1 min): {load_at_start:.1f} at the start, "
                 f"{os.getloadavg()[0]:.1f} at the end")
    lines.append(f"- command: `{command}`")
    return "\n".join(lines)


def md_table(rows: Sequence[Dict[str, Any]], columns: Sequence[Column]) -> str:
    """A Markdown table: one row per ``rows`` entry, one column per (header, cell function)."""
    # the first column names the row (left), the others hold figures (right)
    align = [" --- "] + [" ---: "] * (len(columns) - 1)
    out = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "|".join(align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(cell(r)) for _, cell in columns) + " |")
    return "\n".join(out)


def key_value_table(values: Dict[str, Any]) -> str:
    """A two-column Markdown table of named figures (floats to 4 significant digits)."""
    rows = [{"key": k, "value": f"{v:.4g}" if isinstance(v, float) else v}
            for k, v in values.items()]
    return md_table(rows, [("figure", lambda r: r["key"]), ("value", lambda r: r["value"])])


def fmt(value: Optional[float], spec: str, scale: float = 1.0) -> str:
    """``value * scale`` formatted with ``spec``, or ``-`` for a missing value."""
    return "-" if value is None else format(value * scale, spec)


def write(path: str, title: str, sections: List[Tuple[str, str]], *,
          summary: str = "", command: Optional[str] = None) -> Path:
    """Write the results file: title, stamp, an optional summary paragraph, then each
    (heading, Markdown body) section. Returns the path written."""
    target = Path(path)
    parts = [f"# {title}", "", "Generated by the benchmark itself (`--markdown`); do not edit.",
             "", stamp(command or command_line())]
    if summary:
        parts += ["", summary.strip()]
    for heading, body in sections:
        if heading:
            parts += ["", f"## {heading}"]
        parts += ["", body.strip()]
    text = "\n".join(parts) + "\n"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"results: {target}", file=sys.stderr, flush=True)
    return target


def write_table(path: str, title: str, rows: Sequence[Dict[str, Any]],
                columns: Sequence[Column], *, summary: str = "",
                command: Optional[str] = None) -> Path:
    """:func:`write` for the common case: one table of ``rows``."""
    return write(path, title, [("", md_table(rows, columns))], summary=summary, command=command)
