#!/usr/bin/env python3
"""The floor of a simulation's wall time: SimGrid's own cost per message, without horotopo.

The simulation runs pinned to one CPU, as horotopo's are (``HOROTOPO_SIM_CPU``; ``-1`` to
compare unpinned). SimGrid's Python bindings run every actor as an OS thread (``contexts/factory:thread``; the
bindings set it at import, since swapped contexts break pybind11, and asking for ``ucontext``
or ``raw`` aborts the first actor with pybind11's "loader_life_support: internal error"). Each
simcall (a post, a wait) hands control from the actor's thread to SimGrid's maestro and back,
and the GIL with it. This benchmark times bare actors in pairs, each sender posting ``--batch``
``put_async`` at a time and waiting for them all (``Comm.wait_all``), each receiver posting as
many ``get_async``: no horotopo code runs, so the figure is what any Python program pays per
message in this simulator, on the machine it runs on. A horotopo simulation of ``M`` messages
takes at least ``M`` times it (``horotopo simulate`` prints its messages).

    python benchmarks/simgrid_floor.py [--pairs 64] [--messages 512] [--batch 1,8,64] [--json]

Prints one row per batch size (wall microseconds per message, CPU per message), and the
wall-time floor of 2.1 million messages (a 64 MiB tree allreduce at 1024 ranks and 64 KiB
chunks: about ``2 n`` messages per chunk of the buffer). ``--markdown [PATH]`` also writes
the table to docs/results/simgrid_floor.md.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from horotopo.simulation.runner import pin_to_one_cpu  # noqa: E402
from horotopo.transport.simulated import load_simgrid  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

#: Messages of a 64 MiB allreduce at 1024 ranks in 64 KiB chunks over trees: 2 (n - 1) arcs
#: times 1024 chunks: 2.1 million.
MESSAGES_AT_1024 = 2 * 1023 * 1024


def _run(pairs: int, messages: int, batch: int, conn: Any) -> None:
    """One simulation (SimGrid holds one engine per process: run in a child), pinned to one
    CPU as horotopo's simulations are (``HOROTOPO_SIM_CPU=-1``: not pinned)."""
    cpu = pin_to_one_cpu()
    sg = load_simgrid()
    engine = sg.Engine(["floor", "--log=root.thres:critical"])
    zone = sg.NetZone.create_full_zone("floor")
    hosts = [zone.create_host(f"h{i}", 1e9) for i in range(2 * pairs)]
    for k in range(pairs):
        link = zone.create_split_duplex_link(f"l{k}", 1.25e9).set_latency(1e-6)
        zone.add_route(hosts[2 * k].netpoint, hosts[2 * k + 1].netpoint, None, None,
                       [sg.LinkInRoute(link, sg.LinkInRoute.Direction.UP)], True)
    zone.seal()

    def sender(k: int) -> None:
        box = sg.Mailbox.by_name(f"m{k}")
        for _ in range(0, messages, batch):
            sg.Comm.wait_all([box.put_async(k, 65536) for _ in range(batch)])

    def receiver(k: int) -> None:
        box = sg.Mailbox.by_name(f"m{k}")
        for _ in range(0, messages, batch):
            got = [box.get_async() for _ in range(batch)]  # (comm, handle): keep the handles
            sg.Comm.wait_all([comm for comm, _ in got])

    for k in range(pairs):
        sg.Actor.create(f"s{k}", hosts[2 * k], sender, k)
        sg.Actor.create(f"r{k}", hosts[2 * k + 1], receiver, k)
    w0, c0 = time.perf_counter(), time.process_time()
    engine.run()
    conn.send((time.perf_counter() - w0, time.process_time() - c0, cpu))
    conn.close()


def measure(pairs: int, messages: int, batch: int) -> Dict[str, Any]:
    """Wall and CPU seconds per message of ``pairs`` sender/receiver pairs, ``messages`` each
    (rounded down to whole batches)."""
    messages = messages // batch * batch
    if messages < 1:
        raise ValueError(f"--messages must be at least --batch ({batch})")
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run, args=(pairs, messages, batch, send))
    proc.start()
    send.close()
    try:
        wall, cpu, pinned = recv.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the simulation died (exit code {proc.exitcode})") from None
    proc.join()
    total = pairs * messages
    return {"pairs": pairs, "batch": batch, "messages": total, "wall_s": wall, "cpu_s": cpu,
            "pinned_cpu": pinned,
            "wall_us_per_message": wall / total * 1e6, "cpu_us_per_message": cpu / total * 1e6,
            "floor_s_at_1024": wall / total * MESSAGES_AT_1024}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=64, help="sender/receiver pairs (default 64)")
    ap.add_argument("--messages", type=int, default=512,
                    help="messages per pair (default 512)")
    ap.add_argument("--batch", default="1,8,64",
                    help="messages posted before each wait, comma-separated (default 1,8,64)")
    ap.add_argument("--json", action="store_true", help="print only JSON on stdout")
    results_doc.add_markdown_option(ap, "simgrid_floor")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batch.split(",") if b]
    except ValueError:
        ap.error(f"--batch: integers, got {args.batch!r}")
    if args.pairs < 1 or not batches or min(batches) < 1:
        ap.error("need --pairs >= 1 and batches >= 1")
    rows: List[Dict[str, Any]] = [measure(args.pairs, args.messages, b) for b in batches]
    fmt = results_doc.fmt
    columns: List[results_doc.Column] = [
        ("pairs", lambda r: r["pairs"]), ("batch", lambda r: r["batch"]),
        ("pinned to", lambda r: "-" if r["pinned_cpu"] is None else f"CPU {r['pinned_cpu']}"),
        ("messages", lambda r: r["messages"]),
        ("wall us/msg", lambda r: fmt(r["wall_us_per_message"], ".1f")),
        ("CPU us/msg", lambda r: fmt(r["cpu_us_per_message"], ".1f")),
        ("floor of 2.1 M messages (s)", lambda r: fmt(r["floor_s_at_1024"], ".0f"))]
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(results_doc.md_table(rows, columns))
    if args.markdown:
        results_doc.write(args.markdown, "simgrid_floor: SimGrid's own cost per message",
                          [("", results_doc.md_table(rows, columns))],
                          summary="Bare SimGrid actors in sender/receiver pairs, no horotopo "
                                  "code: the wall time any simulation pays per message here. "
                                  "The last column is the floor for a 64 MiB tree allreduce "
                                  "at 1024 ranks in 64 KiB chunks (2.1 million messages).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
