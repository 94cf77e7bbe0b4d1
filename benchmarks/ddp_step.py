"""A DDP training step on an emulated cluster: backend "horotopo" and the hook against gloo.

    python benchmarks/ddp_step.py [TOPOLOGY.json] [--hidden 1024 --layers 4 --batch 32
                                   --rounds 3 --steps 2] [--json] [--local -np N]

The job: an MLP (``--layers`` square hidden layers of ``--hidden`` units and a 10-way head;
the default has 4.2M parameters, 16.8 MB of float32 gradients per step) trained with
DistributedDataParallel on synthetic data, ``--batch`` rows per rank, under three variants in
the same MPI job:

- ``gloo``: DDP on a gloo process group (torch's own CPU allreduce, a ring over TCP);
- ``horotopo``: DDP on the "horotopo" backend (``init_process_group("horotopo")``);
- ``gloo+hook``: DDP on the gloo group with horotopo's ``allreduce_hook`` reducing the buckets.

The variants alternate: after two warm-up steps each (DDP builds its buckets in the first
and rebuilds them, with a broadcast, in the second), every round runs ``--steps`` steps of
each variant, starting with a different variant each round (so none always follows the
same one). A step is forward, backward (DDP reduces the gradients during it) and an SGD step,
timed on rank 0 between two barriers on the gloo group. images/s is the global batch
(``--batch`` x ranks) times the steps over their summed time; the ratio is a variant's
images/s over gloo's. Every variant starts from the same weights and sees the same data, so
after the run its parameters must equal gloo's up to rounding: the table gives the largest
difference, and a difference past 1e-3 fails the run (the timing would not be of a correct
reduction).

By default the ranks run on the emulated cluster of the topology (the bundled racks-2x3: two
racks of three hosts, 1 gbps host links, a 0.25 gbps uplink), built with network namespaces
and tc (needs root; see docs/emulation.md); horotopo plans on the
declared topology (``HOROTOPO_TOPOLOGY``) instead of probing. ``--local`` runs plain local
ranks instead (``-np``, default 2), where the links are this machine's memory.

``--markdown [PATH]`` also writes the table to docs/results/ddp_step.md.

Exit status: 0 when the run finished and every variant matched gloo's parameters; 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOPOLOGY = ROOT / "horotopo" / "data" / "topologies" / "racks-2x3.json"
VARIANTS = ("gloo", "horotopo", "gloo+hook")
WHAT = {"gloo": ("gloo", "DDP's allreduce"), "horotopo": ("horotopo", "DDP's allreduce"),
        "gloo+hook": ("gloo", "horotopo allreduce_hook")}
#: The largest parameter difference from gloo's that still counts as the same training.
TOLERANCE = 1e-3
PREFIX = "htddp"  # emulated cluster's names: apart from the main job's and a user's `ht`


def _log(msg: str) -> None:
    sys.stdout.flush()
    print(f"[ddp_step] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line (see the module's notes; ``--help`` prints them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + "\n\n" +
                                "\n\n".join(__doc__.split("\n\n")[2:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topology", nargs="?", default=str(DEFAULT_TOPOLOGY),
                   help="declared topology to emulate (default: the bundled racks-2x3)")
    p.add_argument("--hidden", type=int, default=1024, help="units per hidden layer (1024)")
    p.add_argument("--layers", type=int, default=4, help="hidden layers (4)")
    p.add_argument("--batch", type=int, default=32, help="rows per rank per step (32)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of alternation (3)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant a round (2)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")
    p.add_argument("--local", action="store_true",
                   help="plain local ranks instead of the emulated cluster (no root needed)")
    p.add_argument("-np", type=int, default=2, help="ranks with --local (2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", default="127.0.0.1:29500", help=argparse.SUPPRESS)
    results_doc.add_markdown_option(p, "ddp_step")
    args = p.parse_args(argv)
    for name in ("hidden", "layers", "batch", "rounds", "steps", "np"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


# ------------------------------------------------------------------------------ the ranks


def _model(hidden: int, layers: int) -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)  # every rank and every variant starts from the same weights
    mods: List[Any] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(hidden, 10))


def worker(args: argparse.Namespace) -> int:
    """One rank: build the three DDP models, alternate them, print rank 0's JSON."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import horotopo.torch as hvd
    import horotopo.torch.distributed as htd

    torch.set_num_threads(1)  # several ranks share the cores
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    dist.init_process_group("horotopo", init_method=f"tcp://{args.master}", rank=me,
                            world_size=n)
    gloo = dist.new_group(backend="gloo")
    models = {"gloo": DDP(_model(args.hidden, args.layers), process_group=gloo),
              "horotopo": DDP(_model(args.hidden, args.layers)),
              "gloo+hook": DDP(_model(args.hidden, args.layers), process_group=gloo)}
    models["gloo+hook"].register_comm_hook(htd.hook_state(gloo), htd.allreduce_hook)
    opts = {v: torch.optim.SGD(m.parameters(), lr=0.01) for v, m in models.items()}
    loss_fn = torch.nn.CrossEntropyLoss()
    done = {v: 0 for v in VARIANTS}  # steps so far: the data of step k is the same everywhere
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}

    def step(variant: str) -> float:
        gen = torch.Generator().manual_seed(1000 * done[variant] + me)
        x = torch.randn(args.batch, args.hidden, generator=gen)
        y = torch.randint(0, 10, (args.batch,), generator=gen)
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        opts[variant].zero_grad()
        loss_fn(models[variant](x), y).backward()
        opts[variant].step()
        dist.barrier(group=gloo)
        done[variant] += 1
        return time.perf_counter() - t0

    for v in VARIANTS:
        for _ in range(2):
            step(v)  # warm-up (see the module's notes)
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for v in order:
            times[v] += [step(v) for _ in range(args.steps)]
    params = {v: torch.cat([p.detach().reshape(-1) for p in m.parameters()])
              for v, m in models.items()}
    deviation = {v: float((params[v] - params["gloo"]).abs().max()) for v in VARIANTS}
    if me == 0:
        nparams = int(params["gloo"].numel())
        rows = []
        for v in VARIANTS:
            total = sum(times[v])
            rows.append({"variant": v, "process_group": WHAT[v][0], "reducer": WHAT[v][1],
                         "steps": len(times[v]), "seconds": total,
                         "images_per_s": args.batch * n * len(times[v]) / total,
                         "step_ms_median": 1e3 * sorted(times[v])[len(times[v]) // 2],
                         "max_param_diff_vs_gloo": deviation[v]})
        gloo_rate = rows[0]["images_per_s"]
        for row in rows:
            row["ratio_vs_gloo"] = row["images_per_s"] / gloo_rate
        print(json.dumps({"ranks": n, "params": nparams, "gradient_bytes": 4 * nparams,
                          "batch_per_rank": args.batch, "rounds": args.rounds,
                          "steps_per_round": args.steps, "rows": rows}), flush=True)
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------ the driver


def report(doc: Dict[str, Any], where: str) -> str:
    """The nccl-tests-like table of a run's JSON document."""
    lines = [f"# ddp_step: DDP on {doc['ranks']} ranks, {where}; MLP of "
             f"{doc['params'] / 1e6:.2f}M parameters ({doc['gradient_bytes'] / 1e6:.1f} MB of "
             f"float32 gradients), batch {doc['batch_per_rank']} per rank, "
             f"{doc['rounds']} rounds x {doc['steps_per_round']} steps per variant",
             f"# {'variant':<10} {'process group':<14} {'reducer':<24} {'images/s':>9} "
             f"{'step ms':>8} {'vs gloo':>8} {'max|dp|':>9}"]
    for row in doc["rows"]:
        lines.append(f"  {row['variant']:<10} {row['process_group']:<14} {row['reducer']:<24} "
                     f"{row['images_per_s']:>9.1f} {row['step_ms_median']:>8.0f} "
                     f"{row['ratio_vs_gloo']:>7.2f}x {row['max_param_diff_vs_gloo']:>9.1e}")
    return "\n".join(lines)


def markdown(path: str, doc: Dict[str, Any], where: str) -> None:
    """The results file: the report's table, one row per variant."""
    columns: List[results_doc.Column] = [
        ("variant", lambda r: r["variant"]), ("process group", lambda r: r["process_group"]),
        ("reducer", lambda r: r["reducer"]), ("images/s", lambda r: f"{r['images_per_s']:.1f}"),
        ("step (ms, median)", lambda r: f"{r['step_ms_median']:.0f}"),
        ("vs gloo", lambda r: f"{r['ratio_vs_gloo']:.2f}x"),
        ("max param difference vs gloo", lambda r: f"{r['max_param_diff_vs_gloo']:.1e}")]
    results_doc.write_table(
        path, "ddp_step: a DistributedDataParallel step, horotopo against gloo", doc["rows"],
        columns, summary=f"DDP on {doc['ranks']} ranks, {where}; MLP of "
                         f"{doc['params'] / 1e6:.2f}M parameters ({doc['gradient_bytes'] / 1e6:.1f}"
                         f" MB of float32 gradients), batch {doc['batch_per_rank']} per rank, "
                         f"{doc['rounds']} rounds x {doc['steps_per_round']} steps per variant, "
                         f"alternating.")


def _document(stdout: str) -> Dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{") and '"rows"' in line:
            return json.loads(line)
    raise RuntimeError("the ranks printed no JSON document with 'rows'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drive(args: argparse.Namespace) -> int:
    """Run the ranks (emulated or local), then print the table or the JSON document."""
    from horotopo_launch.emulate import EmulatedCluster, available
    from horotopo_launch.mpi import Job, command_line, detect, format_command

    topology = Path(args.topology).resolve()
    worker_argv = [sys.executable, str(Path(__file__).resolve()), "--worker",
                   "--hidden", str(args.hidden), "--layers", str(args.layers),
                   "--batch", str(args.batch), "--rounds", str(args.rounds),
                   "--steps", str(args.steps)]
    env = {"HOROTOPO_TOPOLOGY": str(topology)}
    try:
        if args.local:
            where = "plain local ranks"
            argv = worker_argv + ["--master", f"127.0.0.1:{_free_port()}"]
            env.pop("HOROTOPO_TOPOLOGY")  # the topology's links are not these ranks'
            cmd, launcher_env = command_line(detect(), Job(np=args.np, command=argv))
            _log("command: " + format_command(cmd, launcher_env))
            proc = subprocess.run(cmd, env={**os.environ, **env, **launcher_env},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  timeout=args.timeout)
        else:
            ok, why = available()
            if not ok:
                _log(f"cannot emulate {topology.name}: {why}; run with --local for plain local "
                     f"ranks")
                return 1
            with EmulatedCluster(topology, prefix=PREFIX) as cluster:
                where = f"emulated {topology.stem}"
                # torch's store and gloo reach rank 0 over the emulated network: by address
                # (every namespace has the same host name) and on the cluster's bridge.
                argv = worker_argv + ["--master", f"{cluster.host_addresses()[0]}:29517"]
                env["GLOO_SOCKET_IFNAME"] = cluster.iface
                _log(f"emulated {len(cluster.nodes)} namespaces; command: "
                     + format_command(*cluster.command(argv, env=env)))
                proc = cluster.run(argv, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        _log(f"the run did not finish within {args.timeout:.0f} s")
        return 1
    if proc.returncode != 0:
        _log(f"the ranks failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
             f"\n{proc.stdout[-2000:]}")
        return 1
    doc = _document(proc.stdout)
    doc["where"] = where
    print(json.dumps(doc) if args.json else report(doc, where))
    if args.markdown:
        markdown(args.markdown, doc, where)
    bad = [r["variant"] for r in doc["rows"] if r["max_param_diff_vs_gloo"] > TOLERANCE]
    if bad:
        _log(f"{', '.join(bad)} ended more than {TOLERANCE:g} away from gloo's parameters: "
             f"the reduction is wrong, the timings do not count")
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return worker(args) if args.worker else drive(args)


if __name__ == "__main__":
    sys.exit(main())
