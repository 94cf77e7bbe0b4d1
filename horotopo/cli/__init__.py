"""``python -m horotopo`` / ``horotopo``: the command line.

Each subcommand lives in its own module with ``add_parser(subparsers)``; the module registers its
handler with ``set_defaults(func=...)``. The handler returns the process exit code.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

SUBCOMMANDS = ["plan_cmd", "probe_cmd", "config_cmd", "simulate_cmd", "doctor_cmd"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horotopo",
        description="Topology-adaptive allreduce: plan reduce/broadcast tree packings for a "
                    "network, and measure the network they run on.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
