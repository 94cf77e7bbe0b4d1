"""``horotopo config``: the effective settings (environment variables) and where each came from.

Reads through :mod:`horotopo.config`, so it shows exactly what a rank started with this
environment would use. ``--json`` prints a list of objects; ``--markdown`` prints
docs/settings.md (the declarations, not this environment's values). Exit status 1 when some
variable holds a value that init() would refuse.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List

from .. import config

__all__ = ["add_parser", "run", "format_table", "settings_document", "SETTINGS_DOC_COMMAND"]

#: The command that writes docs/settings.md; the file names it, and its check tells it.
SETTINGS_DOC_COMMAND = "python -m horotopo config --markdown > docs/settings.md"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``config`` subcommand."""
    p = subparsers.add_parser(
        "config", help="print the effective settings and where each came from",
        description="Print every HOROTOPO_*/HOROVOD_* setting: its effective value and whether "
                    "it came from the environment (naming the variable) or is the default.")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the settings as JSON")
    fmt.add_argument("--markdown", action="store_true",
                     help="print docs/settings.md: every setting's type, default, allowed "
                          "values and doc")
    p.set_defaults(func=run)
    return p


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(_show(v) for v in value)  # as the variable is written
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def format_table(rows: List[config.Effective]) -> str:
    """The plain-text table: name, value, source (and the error of a bad value)."""
    width = max(len(r.setting.name) for r in rows)
    lines = [f"{'setting':<{width}}  {'value':<16} source"]
    for r in rows:
        if r.source == "error":
            lines.append(f"{r.setting.name:<{width}}  {'(invalid)':<16} error: {r.error}")
            continue
        source = "default" if r.source == "default" else f"environment ({r.variable})"
        value = _show(r.value)
        if r.value is None and r.source == "default":
            value = f"- ({r.setting.show_default()})"
        lines.append(f"{r.setting.name:<{width}}  {value:<16} {source}")
    return "\n".join(lines) + "\n"


def settings_document() -> str:
    """docs/settings.md: the conventions every setting follows, then the registry's table."""
    bools = "/".join(config.TRUE_WORDS) + " or " + "/".join(config.FALSE_WORDS)
    return f"""# Settings

Generated from the registry in `horotopo/config.py` by `{SETTINGS_DOC_COMMAND}`; do not edit.

horotopo and `horotopo-run` are configured by the environment variables below. A value that
cannot work is refused with an error naming the variable, the value and what is allowed; it is
never silently replaced by the default.

- Unset, empty or blank means the default, except for a setting whose allowed values say
  "a non-empty string": there a blank value is an error.
- Booleans are strict: {bools}, in any case. Anything else is an error, so
  `HOROVOD_STALL_CHECK_DISABLE=false` means the check stays on.
- A setting may have aliases, the `HOROTOPO_*` spellings that `horotopo-run` sets next to
  Horovod's `HOROVOD_*` ones. When a name and its alias are both set, they must agree.

`python -m horotopo config` prints the value each setting takes in the current environment and
where it came from (`--json` for a script).

{config.markdown_table()}
## Parameters

Every tuning number of horotopo (the engine's, the adaptivity's, the probe's, the planner's, the
runtime's waits and the timeouts on peers) lives in the parameter objects of
`horotopo/params.py`, one field each, with the reason for its default; tests/test_params.py
fails on a number anywhere else that is not listed as a non-tuning constant. Each field is
overridden by the variable `HOROTOPO_<OBJECT>_<FIELD>` (the object's name without `Params`,
in capitals: `ProbeParams.slow_ratio` is `HOROTOPO_PROBE_SLOW_RATIO`), parsed as the field's
type (a tuple as numbers separated by commas) and checked by the object itself, together with
the object's other variables; `python -m horotopo config` lists them with the others. `init()`
and the commands build each object from the environment once and hand it down; code called
directly takes the defaults below unless given an object; an object that works per call (the
engine, a transport, the device kernels) reads its fields once, when it is built, so every
variable below reaches the code it tunes. A plan records the planner's fields
that differ from the defaults in its JSON (`planner.params`), and the engine and the plan's
predictions use the window of the parameters the plan was made with.

{config.parameters_markdown()}"""


def run(args: argparse.Namespace) -> int:
    """Handler of ``horotopo config``; returns 1 if any variable is invalid."""
    if args.markdown:
        sys.stdout.write(settings_document())
        return 0
    rows = config.effective()
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        sys.stdout.write(format_table(rows))
    bad = [r for r in rows if r.error is not None]
    for r in bad:
        print(f"horotopo config: {r.error}", file=sys.stderr)
    return 1 if bad else 0
