#!/usr/bin/env python
"""Synthetic-data training throughput, in the style of Horovod's pytorch_synthetic_benchmark.

A small CNN (or MLP) trains on one fixed random batch per rank. Gradients are averaged either
by horotopo's DistributedOptimizer (hooks, name-based negotiation, response cache, fusion, tree
allreduce) or by a plain per-gradient ``MPI_Allreduce`` after ``backward()``, the way a script
without Horovod would do it. ``--mode both`` (the default) builds one model of each kind from
the same initial weights and alternates their timed iterations in the same run, so the two
figures share the machine's conditions; it also reports how far the two models drifted apart
(only floating-point summation order differs) and checks that every rank holds the same
weights.

    horotopo-run -np 4 python examples/pytorch_synthetic_benchmark.py
    mpiexec -n 4 python examples/pytorch_synthetic_benchmark.py --json
    mpiexec -n 4 python examples/pytorch_synthetic_benchmark.py --mpi-allreduce   # MPI only

In ``both`` mode horotopo's background thread keeps cycling (one tiny allreduce per
``HOROVOD_CYCLE_TIME``) during the MPI iterations too; ``--mode mpi`` runs without horotopo.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import timeit
from typing import Any, Dict, List

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=6)
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="horotopo mode: compress gradients to float16 for the allreduce")
    p.add_argument("--mode", choices=("both", "horotopo", "mpi"), default="both")
    p.add_argument("--mpi-allreduce", action="store_true",
                   help="same as --mode mpi: plain MPI_Allreduce of each gradient, no horotopo")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (rank 0)")
    args = p.parse_args(argv)
    if args.mpi_allreduce:
        args.mode = "mpi"
    return args


def make_model(kind: str) -> nn.Module:
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 512), nn.ReLU(),
                         nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


class Runner:
    """One model, its optimizer and how one training step averages gradients."""

    def __init__(self, mode: str, args: argparse.Namespace, comm: Any, hvd: Any) -> None:
        torch.manual_seed(args.seed)           # identical initial weights in both modes
        self.mode = mode
        self.model = make_model(args.model)
        opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.comm, self.hvd = comm, hvd
        if mode == "horotopo":
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
            compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
            opt = hvd.DistributedOptimizer(opt, named_parameters=self.model.named_parameters(),
                                           compression=compression)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        else:
            for p in self.model.state_dict().values():
                comm.Bcast(p.numpy(), root=0)
        self.opt = opt
        self.size = comm.Get_size()

    def step(self, data: torch.Tensor, target: torch.Tensor) -> None:
        self.opt.zero_grad()
        loss = F.cross_entropy(self.model(data), target)
        loss.backward()
        if self.mode == "mpi":
            from mpi4py import MPI

            for p in self.model.parameters():
                grad = p.grad.numpy()
                self.comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
                grad /= self.size
        self.opt.step()

    def flat(self) -> np.ndarray:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).numpy()


def summarize(rates: List[float], comm: Any) -> Dict[str, float]:
    """Per-rank mean img/s and its 95% interval, averaged over ranks; the total is size x."""
    mean = float(np.mean(rates))
    conf = 1.96 * float(np.std(rates))
    both = np.array([mean, conf])
    out = np.empty_like(both)
    from mpi4py import MPI

    comm.Allreduce(both, out, op=MPI.SUM)
    n = comm.Get_size()
    return {"img_per_s_per_rank": out[0] / n, "ci95_per_rank": out[1] / n,
            "total_img_per_s": out[0]}


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from mpi4py import MPI

    hvd = None
    if args.mode != "mpi":
        import horotopo.torch as hvd_module

        hvd = hvd_module
        hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()

    def log(msg: str) -> None:
        if rank == 0:
            print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    modes = ["horotopo", "mpi"] if args.mode == "both" else [args.mode]
    runners = {m: Runner(m, args, comm, hvd) for m in modes}
    gen = torch.Generator().manual_seed(args.seed + rank)
    data = torch.randn(args.batch_size, 3, 32, 32, generator=gen)
    target = torch.randint(0, 10, (args.batch_size,), generator=gen)
    nparams = sum(p.numel() for p in runners[modes[0]].model.parameters())
    log(f"Model: {args.model} ({nparams} parameters, "
        f"{len(list(runners[modes[0]].model.parameters()))} gradient tensors)")
    log(f"Batch size: {args.batch_size}, ranks: {size}, modes: {', '.join(modes)}")
    if hvd is not None and rank == 0:
        from horotopo.api.basics import runtime

        plan = runtime().plan
        log(f"horotopo plan: {len(plan.trees)} trees over {plan.n} ranks "
            f"({plan.topology_name or 'topology'}), digest {plan.digest}")

    for m in modes:
        for _ in range(args.num_warmup_batches):
            runners[m].step(data, target)
    rates: Dict[str, List[float]] = {m: [] for m in modes}
    for it in range(args.num_iters):
        for m in modes:            # alternate, so both modes see the same conditions
            comm.Barrier()
            t = timeit.timeit(lambda: runners[m].step(data, target),
                              number=args.num_batches_per_iter)
            rate = args.batch_size * args.num_batches_per_iter / t
            rates[m].append(rate)
            log(f"Iter #{it} {m:>8}: {rate:.1f} img/sec per rank")

    result: Dict[str, Any] = {"ranks": size, "model": args.model, "parameters": nparams,
                              "batch_size": args.batch_size, "threads": args.threads,
                              "fp16_allreduce": args.fp16_allreduce,
                              "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", 1.0))}
    for m in modes:
        result[m] = summarize(rates[m], comm)
        log(f"{m}: img/sec per rank {result[m]['img_per_s_per_rank']:.1f} "
            f"+-{result[m]['ci95_per_rank']:.1f}; total img/sec on {size} ranks "
            f"{result[m]['total_img_per_s']:.1f}")
    if len(modes) == 2:
        result["ratio_horotopo_over_mpi"] = (result["horotopo"]["total_img_per_s"]
                                             / result["mpi"]["total_img_per_s"])
        drift = float(np.max(np.abs(runners["horotopo"].flat() - runners["mpi"].flat())))
        result["max_param_diff_horotopo_vs_mpi"] = drift
        log(f"horotopo / MPI_Allreduce throughput: {result['ratio_horotopo_over_mpi']:.3f}; "
            f"largest weight difference between the two models: {drift:.3g}")
    in_sync: Dict[str, bool] = {}
    for m in modes:
        mine = runners[m].flat()
        root = mine.copy()
        comm.Bcast(root, root=0)
        same = np.array([int(np.array_equal(mine, root))], dtype=np.int64)
        every = np.empty_like(same)
        comm.Allreduce(same, every, op=MPI.MIN)
        in_sync[m] = bool(every[0])
    result["params_in_sync"] = in_sync
    log("weights identical on every rank: "
        + ", ".join(f"{m} {'yes' if ok else 'NO'}" for m, ok in in_sync.items()))
    if hvd is not None:
        from horotopo.api.basics import runtime

        result["runtime_stats_rank0"] = dict(runtime().stats)
        result["engine_last_algorithm"] = getattr(runtime()._engine, "last_algorithm", None)
        log(f"horotopo runtime (rank 0): {result['runtime_stats_rank0']}, engine algorithm "
            f"for the last fused buffer: {result['engine_last_algorithm']}")
    if args.json and rank == 0:
        print(json.dumps(result))
    comm.Free()
    if hvd is not None:
        hvd.shutdown()
    # Only horotopo promises bitwise-identical results on every rank; MPI_Allreduce does not.
    return 0 if in_sync.get("horotopo", True) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
