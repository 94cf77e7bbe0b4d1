"""``horotopo doctor``: measure the network under the job and say, in plain words, what is slow.

Run under the launcher, like the probe it runs (``horotopo-run -np 8 horotopo doctor`` or
``mpiexec -n 8 python -m horotopo doctor``). Every rank takes part in the probe; rank 0 then
diagnoses the measured document (:func:`horotopo.probe.diagnose.diagnose`), plans it as
``init()`` would, prints the report, and writes the JSON (the findings, the plan and the
measured document) and a picture of the measured network. The other ranks print nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import CommandError, writable_path, write_text
from .. import config
from ..params import ProbeParams
from ..probe.config import ProbeConfig
from ..probe.diagnose import Diagnosis, PlanSummary, diagnose, format_ranks, report_lines
from ..topology import plural

__all__ = ["add_parser", "run", "summarize_plan", "draw_network"]

PROG = "horotopo doctor"
#: Slow host pairs drawn at most (the JSON has them all).
DRAWN_LINKS = 40
SLOW_COLOUR = "#d62728"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``doctor`` subcommand."""
    p = subparsers.add_parser(
        "doctor", help="probe the network under the job and name what is slow (under mpiexec)",
        description="Measure the network between the ranks (as horotopo probe does) and report "
                    "each host's NIC in and out, the NICs, host pairs and shared links clearly "
                    "below their peers, the shared bottlenecks found, and the plan horotopo "
                    "would run with how much faster than ring it is predicted to be. Writes "
                    "the findings and the measured network as JSON and as a picture. Run it "
                    "under the launcher: horotopo-run -np 8 horotopo doctor",
        epilog="See docs/doctor.md for what each line means.")
    p.add_argument("--json", metavar="PATH", default="doctor.json",
                   help="write the findings, the plan and the measured document here "
                        "(default doctor.json)")
    p.add_argument("--png", metavar="PATH", default="doctor.png",
                   help="draw the measured network here (default doctor.png; needs matplotlib)")
    p.add_argument("--no-png", action="store_true", help="do not draw the picture")
    p.add_argument("--quick", action="store_true",
                   help="the probe's quick mode (what init() runs): shorter transfers, fewer "
                        "repeats; default: the full mode of horotopo probe")
    p.add_argument("--size", metavar="SIZE",
                   help="allreduce size the plan is made for and predicted at (default: "
                        "HOROVOD_FUSION_THRESHOLD, 128M unless set; K, M, G are binary)")
    p.add_argument("--max-bytes", metavar="SIZE",
                   help="largest message per probe transfer, e.g. 4M (default: quick 4M, full "
                        "16M)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="seconds a probe wait may take before it is an error naming the pair "
                        "(default 10)")
    p.add_argument("-q", "--quiet", action="store_true", help="no probe progress on stderr")
    p.set_defaults(func=run)
    return p


def _check(args: argparse.Namespace, ranks: int) -> Tuple[Optional[str], Dict[str, Any]]:
    """Rank 0's verdict on the arguments: (the problem in one line or None, probe overrides
    and the plan's size)."""
    from ..packing.alphabeta import target_size
    from ..plan import parse_size

    if ranks < 2:
        return ("needs at least 2 ranks to measure a network; run it under the launcher: "
                "horotopo-run -np N horotopo doctor (or mpiexec -n N python -m horotopo "
                "doctor), N >= 2"), {}
    settings: Dict[str, Any] = {}
    try:
        config.probe_params()
        config.reliability_params()
        if args.max_bytes is not None:
            top = parse_size(args.max_bytes)
            if top < 1:
                return f"--max-bytes must be positive, got {args.max_bytes}", {}
            settings["max_bytes"] = top
            # the probe's own first and smallest sizes, lowered to fit under the cap
            settings["start_bytes"] = min(ProbeConfig.start_bytes, top)
            settings["min_bytes"] = min(ProbeConfig.min_bytes, settings["start_bytes"])
        if args.size is not None:
            size = parse_size(args.size)
            if size < 1:
                return f"--size must be positive, got {args.size}", {}
            settings["size"] = target_size(size)
        else:
            settings["size"] = target_size(None)
    except (ValueError, OverflowError) as exc:
        return str(exc), {}
    if args.timeout is not None:
        if not (args.timeout > 0 and math.isfinite(args.timeout)):
            return f"--timeout must be a positive number of seconds, got {args.timeout}", {}
        settings["timeout_s"] = args.timeout
    outputs = [("--json", args.json)] + ([] if args.no_png else [("--png", args.png)])
    try:
        for option, path in outputs:
            writable_path(option, path)  # before the probe, not after its minutes
    except CommandError as exc:
        return str(exc), {}
    if not args.no_png:
        try:
            import matplotlib  # noqa: F401  (the picture needs it; know before probing)
        except ImportError:
            return ("the picture needs matplotlib (pip install 'horotopo[plot]'), or pass "
                    "--no-png"), {}
    return None, settings


def run(args: argparse.Namespace) -> int:
    """Handler of ``horotopo doctor``: collective over MPI.COMM_WORLD; returns the exit code."""
    from ..transport import MPITransport
    from .probe_cmd import measure

    transport = MPITransport.world()
    rank = transport.rank
    verdict = _check(args, transport.size) if rank == 0 else None
    # Only rank 0 writes, so only its disk counts; every rank stops together on a problem.
    problem, settings = transport.broadcast_object(
        verdict, 0, config.reliability_params_or_defaults().doctor_arguments_timeout_s,
        "doctor: arguments")
    if problem:
        if rank == 0:
            print(f"{PROG}: error: {problem}", file=sys.stderr, flush=True)
        transport.close()
        return 2
    size = settings.pop("size")
    probe_params = config.probe_params()

    doc = measure(transport, "quick" if args.quick else "full", quiet=args.quiet,
                  command=PROG, params=probe_params, **settings)
    if rank != 0:
        return 0
    return report(doc, size, json_path=args.json, png_path=None if args.no_png else args.png,
                  params=probe_params)


def summarize_plan(doc: Dict[str, Any], size: int) -> Tuple[PlanSummary, Dict[str, Any]]:
    """The plan ``init()`` would make of the measured document, for an allreduce of ``size``
    bytes, in figures (and the plan's own JSON)."""
    from ..plan import format_size, make_plan, ring_time
    from ..topology import from_dict

    plan = make_plan(from_dict(doc), size=size)
    forest = plan.planner.get("forest", {}) or {}
    summary = PlanSummary(trees=len(plan.trees), roots=tuple(t.root for t in plan.trees),
                          throughput_Bps=plan.throughput_Bps, ring_Bps=plan.ring_Bps,
                          size=size, size_label=format_size(size),
                          plan_s=plan.predict_time(size), ring_s=ring_time(plan, size),
                          forest=str(forest.get("chosen", "")))
    return summary, plan.to_json()


def report(doc: Dict[str, Any], size: int, json_path: str, png_path: Optional[str],
           params: Optional[ProbeParams] = None) -> int:
    """Rank 0's half: diagnose, plan, write the files and print the report. ``params``
    (default the environment's, :func:`horotopo.config.probe_params`) say what is clearly
    slow and how many slow links the text names."""
    params = config.probe_params() if params is None else params
    diagnosis = diagnose(doc, ratio=params.slow_ratio)
    summary, plan_doc = summarize_plan(doc, size)
    lines = report_lines(diagnosis, summary, doc.get("probe"), listed_links=params.listed_links)
    write_text("--json", json_path, json.dumps({"findings": diagnosis.to_json(),
                                                "plan": dict(summary.to_json(), plan=plan_doc),
                                                "measured": doc}, indent=1) + "\n")
    written = [json_path]
    if png_path is not None:
        try:
            draw_network(diagnosis, png_path, title=_title(diagnosis, summary))
        except OSError as exc:
            raise CommandError(f"--png {png_path}: cannot write: {exc.strerror or exc}") from None
        written.append(png_path)
    lines += ["", f"wrote {', '.join(written)}"]
    print("\n".join(lines), flush=True)
    return 0


def _title(d: Diagnosis, plan: PlanSummary) -> str:
    return (f"{d.name}: {plural(d.ranks, 'rank')} on {plural(len(d.hosts), 'host')}; plan of "
            f"{plural(plan.trees, 'tree')}, {plan.versus_ring()} for {plan.size_label} "
            f"(predicted)")


def _circle(k: int, count: int, radius: float) -> Tuple[float, float]:
    angle = 2 * math.pi * k / max(1, count) + math.pi / 2
    return radius * math.cos(angle), radius * math.sin(angle)


def draw_network(d: Diagnosis, path: str, title: str = "") -> None:
    """Draw the measured network to the image ``path`` (needs matplotlib): hosts around the
    core, each on a line labelled with its NIC out/in and coloured by its rate; the hosts
    behind a shared link gathered at a node of their own whose line to the core carries the
    link's rate; what is clearly below its peers in red (slow host pairs as dashed lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [h.name for h in d.hosts]
    groups: List[Tuple[str, ...]] = []
    for s in d.shared:
        if s.behind not in groups:
            groups.append(s.behind)
    groups.sort(key=len)  # the smallest (innermost) group a host is behind holds it
    home = {}
    for g, members in enumerate(groups):
        for name in members:
            home.setdefault(name, g)
    order = sorted(range(len(names)), key=lambda a: (home.get(names[a], len(groups)), a))
    pos = {names[a]: _circle(k, len(names), 1.0) for k, a in enumerate(order)}
    group_pos = []
    for members in groups:
        xs, ys = zip(*(pos[m] for m in members))
        x, y = sum(xs) / len(xs), sum(ys) / len(ys)
        norm = math.hypot(x, y) or 1.0
        group_pos.append((0.55 * x / norm, 0.55 * y / norm) if math.hypot(x, y) > 1e-9
                         else (0.0, 0.55))

    slow_nics = {h for s in d.slow if s.kind in ("nic out", "nic in") for h in s.hosts}
    slow_shared = {s.shared for s in d.slow if s.kind == "shared"}
    rates = [v for h in d.hosts for v in (h.out_gbps, h.in_gbps) if v is not None]
    top = max(rates, default=1.0)
    cmap = plt.get_cmap("viridis")
    many = len(names) > 48
    fig, ax = plt.subplots(figsize=(9, 9))
    label_box = dict(facecolor="white", edgecolor="none", alpha=0.75, pad=0.4)

    for h in d.hosts:
        x, y = pos[h.name]
        g = home.get(h.name)
        tx, ty = (0.0, 0.0) if g is None else group_pos[g]
        known = [v for v in (h.out_gbps, h.in_gbps) if v is not None]
        slow = h.name in slow_nics
        colour = SLOW_COLOUR if slow else cmap(min(known) / top if known else 0.0)
        ax.plot([x, tx], [y, ty], color=colour, linewidth=4.0 if slow else 2.0, zorder=1)
        if not many:
            text = " / ".join("-" if v is None else f"{v:.3g}" for v in (h.out_gbps, h.in_gbps))
            ax.text(x + 0.3 * (tx - x), y + 0.3 * (ty - y), text, fontsize=6.5, ha="center",
                    va="center", color=SLOW_COLOUR if slow else "#333333", bbox=label_box,
                    zorder=4)
    for g, members in enumerate(groups):
        gx, gy = group_pos[g]
        links = [(k, s) for k, s in enumerate(d.shared) if s.behind == members]
        slow = any(k in slow_shared for k, _ in links)
        colour = SLOW_COLOUR if slow else "#ff7f0e"
        ax.plot([gx, 0.0], [gy, 0.0], color=colour, linewidth=4.0 if slow else 2.5, zorder=1)
        text = "\n".join(f"{'out' if s.outgoing else 'in'} {s.gbps:.3g}" for _, s in links)
        ax.text(gx / 2, gy / 2, text, fontsize=7, ha="center", va="center", color=colour,
                bbox=label_box, zorder=4)
        ax.scatter([gx], [gy], s=260, marker="D", color="#fdd0a2", edgecolors=colour, zorder=3)
    for s in [s for s in d.slow if s.kind == "link"][:DRAWN_LINKS]:
        (xa, ya), (xb, yb) = pos[s.hosts[0]], pos[s.hosts[1]]
        ax.annotate("", xy=(xb, yb), xytext=(xa, ya), zorder=2,
                    arrowprops=dict(arrowstyle="->", color=SLOW_COLOUR, linestyle="--",
                                    shrinkA=10, shrinkB=10))
    ax.scatter([0.0], [0.0], s=900, marker="s", color="#c6dbef", edgecolors="#555555",
               zorder=3)
    ax.text(0.0, 0.0, "network", fontsize=7, ha="center", va="center", zorder=5)
    for h in d.hosts:
        x, y = pos[h.name]
        slow = h.name in slow_nics
        ax.scatter([x], [y], s=120 if many else 650, color="#fbb4b9" if slow else "#e5e5e5",
                   edgecolors=SLOW_COLOUR if slow else "#555555", zorder=3)
        if not many or slow:
            ax.text(x * 1.13, y * 1.13, f"{h.name}\n{format_ranks(h.ranks)}", fontsize=6.5,
                    ha="center", va="center", zorder=5)
    legend = (f"host lines: NIC out / in (gbps), coloured by rate (yellow fastest); diamonds: "
              f"hosts behind a shared link (its rate on the line to the core);\nred: clearly "
              f"below its peers (at least {d.ratio:g}x), dashed red arrows: slow host pairs")
    ax.set_title((title + "\n" if title else "") + legend, fontsize=8)
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
