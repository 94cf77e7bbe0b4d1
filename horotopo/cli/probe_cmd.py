"""``horotopo probe``: measure the network between the ranks (run it under mpiexec).

Rank 0 prints the bandwidth and latency matrices in the style of nccl-tests (or the document as
JSON with ``--json``) and writes the measured topology with ``-o``; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, Optional

from . import CommandError, writable_path, write_text
from .. import config
from ..probe.config import ProbeConfig

__all__ = ["add_parser", "run", "measure"]



def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``probe`` subcommand."""
    p = subparsers.add_parser(
        "probe", help="measure the links between the ranks (under mpiexec)",
        description="Measure latency and bandwidth between every pair of ranks, host egress and "
                    "ingress limits and shared bottlenecks, and write the measured topology. "
                    "Run it under mpiexec: mpiexec -n 8 python -m horotopo probe -o topo.json")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the measured topology (JSON) here (rank 0)")
    p.add_argument("--quick", action="store_true",
                   help="shorter transfers and fewer repeats (what init() runs by default)")
    p.add_argument("--name", help="name of the topology document (default probed-<n>)")
    p.add_argument("--json", action="store_true",
                   help="print the document as JSON on stdout instead of the table")
    p.add_argument("--max-bytes", metavar="SIZE",
                   help="largest message per transfer, e.g. 4M (default: quick 4M, full 16M)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="seconds a wait may take before it is an error naming the pair "
                        "(default 10)")
    p.add_argument("--concurrent-pairs", action="store_true",
                   help="run the disjoint pairs of each round at once: n/2 times faster, but "
                        "understates pairs that share an uplink")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)
    return p


def measure(transport: Any, mode: str, *, name: Optional[str] = None, quiet: bool = False,
            command: str = "horotopo probe", **overrides: Any) -> Optional[Dict[str, Any]]:
    """The probe over ``transport``, collective, with progress on rank 0's stderr unless
    ``quiet``; closes the transport. A probe error ends the whole job (``command`` names it in
    the message). Returns the measured document (None on ranks the hosts scheme leaves out)."""
    from ..probe import ProbeError, probe

    rank = transport.rank

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        doc = probe(transport, mode, name=name,
                    progress=progress if rank == 0 and not quiet else None, **overrides)
    except (ProbeError, ValueError) as exc:
        print(f"{command}: error on rank {rank}: {exc}", file=sys.stderr, flush=True)
        # Transfers to a dead or unreachable peer cannot be cancelled, and MPI_Finalize would
        # wait for them: abort the job so that it never hangs.
        transport.abort(1)
        raise SystemExit(1)  # pragma: no cover - Abort does not return
    transport.close()
    return doc


def run(args: argparse.Namespace) -> int:
    """Handler of ``horotopo probe``: collective over MPI.COMM_WORLD; returns the exit code."""
    from ..plan import parse_size
    from ..probe import format_report
    from ..transport import MPITransport

    transport = MPITransport.world()
    rank = transport.rank
    overrides: Dict[str, Any] = {}
    problem: Optional[str] = None
    wait_s = config.reliability_params_or_defaults().probe_arguments_timeout_s
    try:
        overrides["params"] = config.probe_params()
        config.reliability_params()
        if args.max_bytes is not None:
            # the probe's own first and smallest sizes, lowered to fit under the cap
            overrides["max_bytes"] = parse_size(args.max_bytes)
            overrides["start_bytes"] = min(ProbeConfig.start_bytes, overrides["max_bytes"])
            overrides["min_bytes"] = min(ProbeConfig.min_bytes, overrides["start_bytes"])
        if args.timeout is not None:
            overrides["timeout_s"] = args.timeout
        if args.concurrent_pairs:
            overrides["concurrent_pairs"] = True
        if rank == 0 and args.output:
            writable_path("-o", args.output)  # before the probe, not after its minutes
    except (ValueError, CommandError) as exc:
        problem = str(exc)
    # Rank 0 alone writes the output: its verdict on the arguments is every rank's, so that
    # all stop together and the job says it once.
    verdict = transport.broadcast_bytes((problem or "").encode() if rank == 0 else None, 0,
                                        wait_s,
                                        "probe: checking the arguments")
    if verdict:
        transport.close()
        if rank == 0:
            raise CommandError(verdict.decode())
        return 2

    doc = measure(transport, "quick" if args.quick else "full", name=args.name,
                  quiet=args.quiet, command="horotopo probe", **overrides)
    if rank == 0:
        if args.output:
            write_text("-o", args.output, json.dumps(doc, indent=1) + "\n")
            if not args.quiet:
                print(f"[probe] wrote {args.output}", file=sys.stderr, flush=True)
        print(json.dumps(doc, indent=1) if args.json else format_report(doc), flush=True)
    return 0
