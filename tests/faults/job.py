"""A small training loop with one fault injected on one rank, for the fault-injection suite.

Run under mpiexec, e.g. ``mpiexec -n 4 python tests/faults/job.py --fault sigstop-mid
--rank 1``: every rank runs ``--steps`` allreduces, and at step ``--at`` rank ``--rank``
suffers ``--fault`` (it prints ``fault-job: rank R strikes at <epoch seconds>`` first). Each
rank that gets through prints ``fault-job: rank R finished``; each
collective error a rank catches (the mismatch faults) is printed as ``fault-job: rank R got:
<message>``. tests/faults/cases.py says what each fault must lead to.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

import horotopo as hvd

#: The faults that strike one rank's process (the others run on).
PROCESS_FAULTS = ("sigstop", "sigstop-mid", "sigkill", "exit", "raise", "noinit")
#: The collectives that differ between ranks, each a call of its own (Horovod raises its
#: mismatch error on every rank and the job goes on).
MISMATCHES = ("dtype", "shape", "op", "scale", "root", "kind", "allgather-shape",
              "duplicate-name")


def main(argv: list) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fault", choices=("none", *PROCESS_FAULTS, "mismatches", "unnamed-differ"),
                    required=True)
    ap.add_argument("--rank", type=int, default=1, help="the rank that suffers the fault")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--at", type=int, default=5, help="the step at which the fault strikes")
    ap.add_argument("--elements", type=int, default=1 << 16)
    args = ap.parse_args(argv)

    if args.fault == "noinit" and _launcher_rank() == args.rank:
        _strikes(args.rank)
        sys.exit(0)  # horotopo imported, MPI never started: a script that fails before init
    hvd.init()
    me = hvd.rank()
    faulty = me == args.rank
    x = np.full(args.elements, float(me + 1), dtype=np.float32)
    for step in range(args.steps):
        if step == args.at:
            if args.fault == "mismatches":
                for kind in MISMATCHES:
                    _report(me, lambda: _mismatch(kind, x, faulty))
                continue
            if args.fault == "unnamed-differ":
                if faulty:
                    _strikes(me)
                    hvd.broadcast(x, root_rank=0)
                else:
                    hvd.allreduce(x, op=hvd.Sum)
                continue
            if faulty:
                _strikes(me)
                _strike(args.fault, x)
        hvd.allreduce(x, name="grad", op=hvd.Sum)
    hvd.shutdown()
    print(f"fault-job: rank {me} finished", flush=True)
    return 0


def _launcher_rank() -> int:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise SystemExit("fault-job: run me under mpiexec (no launcher rank in the environment)")


def _strikes(me: int) -> None:
    """Say when the fault strikes (the epoch clock, which the test reads too)."""
    print(f"fault-job: rank {me} strikes at {time.time():.3f}", flush=True)


def _strike(fault: str, x: np.ndarray) -> None:
    if fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault == "sigstop-mid":
        # The allreduce is under way on the background thread when the process stops.
        hvd.allreduce_async(x, name="mid", op=hvd.Sum)
        time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "exit":
        sys.exit(0)
    elif fault == "raise":
        raise RuntimeError("injected failure")


def _mismatch(kind: str, x: np.ndarray, faulty: bool) -> None:
    if kind == "dtype":
        hvd.allreduce(x.astype(np.float64) if faulty else x, name="m.dtype", op=hvd.Sum)
    elif kind == "shape":
        hvd.allreduce(x[:-1] if faulty else x, name="m.shape", op=hvd.Sum)
    elif kind == "op":
        hvd.allreduce(x, name="m.op", op=hvd.Max if faulty else hvd.Sum)
    elif kind == "scale":
        hvd.allreduce(x, name="m.scale", op=hvd.Sum, prescale_factor=2.0 if faulty else 1.0)
    elif kind == "root":
        hvd.broadcast(x, root_rank=1 if faulty else 0, name="m.root")
    elif kind == "kind":
        if faulty:
            hvd.broadcast(x, root_rank=0, name="m.kind")
        else:
            hvd.allreduce(x, name="m.kind", op=hvd.Sum)
    elif kind == "allgather-shape":
        rows = x.reshape(-1, 4 if not faulty else 2)
        hvd.allgather(rows, name="m.allgather")
    elif kind == "duplicate-name":
        # Every rank: a name submitted again while it is still pending on that rank.
        first = hvd.allreduce_async(x, name="m.dup", op=hvd.Sum)
        try:
            hvd.allreduce_async(x, name="m.dup", op=hvd.Sum)
        finally:
            hvd.synchronize(first)


def _report(me: int, call) -> None:
    try:
        call()
        print(f"fault-job: rank {me} got: no error", flush=True)
    except Exception as exc:  # noqa: BLE001 - the error is what this job reports
        print(f"fault-job: rank {me} got: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
