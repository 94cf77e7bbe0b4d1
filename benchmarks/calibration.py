#!/usr/bin/env python
"""What ``horotopo calibrate`` measures on this machine, how long it takes, and how much a
cheaper measurement (the two extreme chunk sizes, one call each) would cost at init.

    python benchmarks/calibration.py [--runs 3] [--markdown [PATH]]

Runs the calibration's in-process measurement (:func:`horotopo.cli.calibrate_cmd.measure`
over a mirrored peer) ``--runs`` times, in full and cheap, and prints JSON: each run's wall
time and fitted figures, and the rows of the last full run. ``--markdown`` also writes
docs/results/calibration.md, with the built-in profile's figures and their sources.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from horotopo import costs
from horotopo.cli.calibrate_cmd import MirrorPeer, fit_costs, measure
from horotopo.params import ENGINE

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

CHEAP_CHUNKS = (ENGINE.cost_chunks[0], ENGINE.cost_chunks[-1])


def timed_fit(chunks, repeats: int) -> Dict[str, Any]:
    t0 = time.perf_counter()
    rows = measure(MirrorPeer(), repeats, chunks)
    wall = time.perf_counter() - t0
    per_message, per_byte = fit_costs(rows)
    return {"wall_s": wall, "per_message_s": per_message, "per_byte_s": per_byte, "rows": rows}


def markdown(path: str, doc: Dict[str, Any]) -> None:
    fmt = results_doc.fmt
    runs: List[Dict[str, Any]] = [dict(r, kind=kind) for kind in ("full", "cheap")
                                  for r in doc[kind]]
    run_table = results_doc.md_table(runs, [
        ("measurement", lambda r: r["kind"]),
        ("wall (ms)", lambda r: fmt(r["wall_s"], ".1f", 1e3)),
        ("per message (us)", lambda r: fmt(r["per_message_s"], ".2f", 1e6)),
        ("per received byte (ns)", lambda r: fmt(r["per_byte_s"], ".4f", 1e9))])
    row_table = results_doc.md_table(doc["full"][-1]["rows"], [
        ("chunk (B)", lambda r: r["chunk_bytes"]), ("messages", lambda r: r["messages"]),
        ("received (B)", lambda r: r["received_bytes"]),
        ("CPU (ms)", lambda r: fmt(r["cpu_s"], ".3f", 1e3))])
    profile = costs.DEFAULT_PROFILE
    built_in = results_doc.md_table(
        [{"name": name, "value": getattr(profile, name), "unit": unit,
          "source": profile.sources[name]} for name, unit in costs.FIGURES],
        [("figure", lambda r: f"`{r['name']}`"), ("value", lambda r: f"{r['value']:.4g}"),
         ("unit", lambda r: r["unit"]), ("source", lambda r: r["source"])])
    results_doc.write(
        path, "calibration: the engine's software costs measured on this machine",
        [("Runs", run_table), ("Rows of the last full run", row_table),
         ("The built-in profile (charged without a calibration file)", built_in)],
        summary=(f"`horotopo calibrate`'s in-process measurement, {len(doc['full'])} runs: "
                 f"full ({len(ENGINE.cost_chunks)} chunk sizes, {doc['repeats']} calls each) "
                 f"and cheap "
                 f"({len(CHEAP_CHUNKS)} chunk sizes, 1 call each). Wall time is the "
                 "measurement's alone (not the interpreter's start)."),
        command=results_doc.command_line())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="calls per row of a full run")
    results_doc.add_markdown_option(ap, "calibration")
    args = ap.parse_args()
    doc: Dict[str, Any] = {"repeats": args.repeats, "full": [], "cheap": []}
    for k in range(args.runs):
        doc["full"].append(timed_fit(ENGINE.cost_chunks, args.repeats))
        doc["cheap"].append(timed_fit(CHEAP_CHUNKS, 1))
        full, cheap = doc["full"][-1], doc["cheap"][-1]
        print(f"run {k + 1}: full {full['wall_s'] * 1e3:.0f} ms "
              f"({full['per_message_s'] * 1e6:.2f} us, {full['per_byte_s'] * 1e9:.4f} ns/B); "
              f"cheap {cheap['wall_s'] * 1e3:.0f} ms ({cheap['per_message_s'] * 1e6:.2f} us, "
              f"{cheap['per_byte_s'] * 1e9:.4f} ns/B)", file=sys.stderr, flush=True)
    print(json.dumps(doc))
    if args.markdown:
        markdown(args.markdown, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
