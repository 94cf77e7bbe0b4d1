"""``python -m horotopo`` / ``horotopo``: the command line.

Each subcommand lives in its own module with ``add_parser(subparsers)``; the module registers its
handler with ``set_defaults(func=...)``. The handler returns the process exit code.

A mistake of the user's (a bad argument, a topology file that cannot be used, a folder that does
not exist, a bad setting) ends the command with one line on stderr,
``horotopo COMMAND: error: WHAT``, and exit status 2: handlers raise :class:`CommandError` (or let
a :class:`~horotopo.topology.TopologyError` or :class:`~horotopo.config.ConfigError` through) and
:func:`main` prints it. Any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import List, NoReturn, Optional

from ..config import ConfigError
from ..plan import parse_size
from ..topology import TopologyError

__all__ = ["CommandError", "USER_ERRORS", "SUBCOMMANDS", "build_parser", "main",
           "positive_size", "writable_path"]

SUBCOMMANDS = ["plan_cmd", "probe_cmd", "config_cmd", "simulate_cmd", "doctor_cmd", "calibrate_cmd"]

#: Exit status of a command the user got wrong (argparse's own convention).
USAGE_EXIT = 2


class CommandError(Exception):
    """A mistake in what the user asked for; the message names it in one line."""


#: What :func:`main` reports as the user's mistake: one line, exit status 2, no traceback.
USER_ERRORS = (CommandError, TopologyError, ConfigError)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: the command, then what is wrong."""

    def error(self, message: str) -> NoReturn:
        # "argument --size: must be positive" reads better as "--size must be positive"
        message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="horotopo",
        description="Topology-adaptive allreduce: plan reduce/broadcast tree packings for a "
                    "network, and measure the network they run on.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue  # a subcommand that is not part of this build
            raise
        module.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"horotopo {args.command}: error: {message}", file=sys.stderr, flush=True)
        return USAGE_EXIT


def positive_size(text: str) -> int:
    """An argparse type: a byte count such as ``64M`` (K, M, G binary), at least one byte."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    try:
        value = parse_size(text)
    except (ValueError, OverflowError):
        # parse_size reads "nan" and "1e999" as numbers that no byte count can be
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use a number with an "
                                         f"optional K, M or G, e.g. 64M") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def writable_path(option: str, path: str) -> Path:
    """``path`` for an output option, checked before any work: its folder must exist.

    Raises
    ------
    CommandError
        The folder is missing or is not a folder, or ``path`` is a folder.
    """
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise CommandError(f"{option} {path}: the folder {str(folder)!r} {what}")
    if target.is_dir():
        raise CommandError(f"{option} {path}: is a folder; give a file name")
    return target


def write_text(option: str, path: str, text: str) -> None:
    """Write an output file; a failure is the user's (a read-only folder, a full disk)."""
    try:
        writable_path(option, path).write_text(text)
    except OSError as exc:
        raise CommandError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
