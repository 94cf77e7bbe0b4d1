"""The probe's targets on the emulated cluster (root; network namespaces and tc shaping).

    python benchmarks/probe_accuracy.py [TOPOLOGY.json ...] [--racks 4,4] [--random N:SEED ...]
        [--quick] [--allreduce SIZE] [--iters K] [--json]

For every topology (default: the bundled racks-2x3, slow-nic and uniform-4) it builds the
emulated cluster, runs ``python -m horotopo probe`` across it (rank i on host ``ranks[i]``) and
prints:

- pairwise: every measured rate against the configured end-to-end rate of its route (pairs of
  ranks on one host are skipped: their route is unshaped), the worst error and how many pairs
  are within 15%;
- shared: what the probe found (groups, shared bottlenecks, binding host caps);
- optimum: the planned throughput on the probed model over that on the declared topology, and
  the plan made from the probe evaluated on the declared topology (its trees and shares) over
  the declared plan: the allreduce target in the model, free of measurement noise;
- with ``--allreduce SIZE``: the allreduce throughput of the plan made from the probe over that
  of the plan made from the declared topology, both measured in one MPI job, interleaved
  (``benchmarks/probe_allreduce.py``); and, to tell the trees from the chunk size (which the
  planner derives from latency), the probed plan's trees at the declared plan's chunk size.

Targets: pairwise within 15%, optimum within 15%, allreduce ratio at least 0.85.
``--json`` prints one JSON object per topology on stdout; progress goes to stderr.
``--markdown [PATH]`` also writes a table to docs/results/probe_accuracy.md.
Exit status 0 when every figure meets its target.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["racks-2x3", "slow-nic", "uniform-4"]
TOLERANCE = 0.15


def _log(msg: str) -> None:
    print(f"[probe_accuracy] {msg}", file=sys.stderr, flush=True)


def emulate_module() -> Any:
    """``horotopo_launch.emulate``, also when the package is not installed (run from a checkout)."""
    try:
        from horotopo_launch import emulate
        return emulate
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(
        "horotopo_launch", ROOT / "launch" / "__init__.py",
        submodule_search_locations=[str(ROOT / "launch")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["horotopo_launch"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    from horotopo_launch import emulate  # noqa: E402 - now importable
    return emulate


def probe_emulated(cluster: Any, quick: bool, timeout: float = 240.0) -> Dict[str, Any]:
    """Run ``horotopo probe --json`` on a built cluster; the measured-topology document."""
    argv = [sys.executable, "-m", "horotopo", "probe", "--json", "-q"]
    if quick:
        argv.append("--quick")
    result = cluster.run(argv, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"probe failed ({result.returncode}):\n{result.stdout[-2000:]}\n"
                           f"{result.stderr[-4000:]}")
    return json.loads(result.stdout)


def pairwise_errors(declared: Any, doc: Mapping[str, Any]) -> List[Tuple[int, int, float, float]]:
    """``(i, j, measured gbps, configured gbps)`` for every pair on two different hosts."""
    from horotopo.topology import GBPS_TO_BPS

    rows = []
    for i in range(declared.n):
        for j in range(declared.n):
            if i == j or declared.hosts[i] == declared.hosts[j]:
                continue
            want = declared.pair_capacity_Bps(i, j) / GBPS_TO_BPS
            rows.append((i, j, float(doc["bandwidth_gbps"][i][j]), want))
    return rows


def allreduce_ratio(cluster: Any, declared_plan: Any, probed_plan: Any, size: str, iters: int,
                    workdir: Path) -> Dict[str, Any]:
    """Allreduce of both plans in one interleaved job: times and probed / declared throughput."""
    paths = []
    same_chunk = probed_plan.with_chunk(declared_plan.chunk_bytes)
    for name, plan in (("declared", declared_plan), ("probed", probed_plan),
                       ("probed-same-chunk", same_chunk)):
        path = workdir / f"{name}-plan.json"
        path.write_text(json.dumps(plan.to_json()))
        paths.append(str(path))
    argv = [sys.executable, str(ROOT / "benchmarks" / "probe_allreduce.py"), *paths,
            "--size", size, "--iters", str(iters)]
    result = cluster.run(argv, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"allreduce job failed ({result.returncode}):\n"
                           f"{result.stderr[-4000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    dec, pro, same = out["plans"]
    return {"size": out["size"], "declared_GBps": dec["algbw_GBps"],
            "probed_GBps": pro["algbw_GBps"], "ratio": pro["algbw_GBps"] / dec["algbw_GBps"],
            "declared_chunk": declared_plan.chunk_bytes, "probed_chunk": probed_plan.chunk_bytes,
            "same_chunk_ratio": same["algbw_GBps"] / dec["algbw_GBps"],
            "declared_trees": len(declared_plan.trees), "probed_trees": len(probed_plan.trees),
            "wrong": dec["wrong"] + pro["wrong"] + same["wrong"]}


def evaluate(doc_in: Mapping[str, Any], quick: bool, allreduce: Optional[str], iters: int,
             prefix: str = "pa") -> Dict[str, Any]:
    """Probe one declared topology on the emulated cluster and compare; the report's row."""
    from horotopo.plan import make_plan, modelled_rate_on
    from horotopo.topology import from_dict

    emulate = emulate_module()
    declared = from_dict(dict(doc_in))
    row: Dict[str, Any] = {"topology": declared.name, "ranks": declared.n,
                           "mode": "quick" if quick else "full"}
    with emulate.EmulatedCluster(dict(doc_in), prefix=prefix) as cluster:
        t0 = time.perf_counter()
        doc = probe_emulated(cluster, quick)
        row["probe_wall_s"] = round(time.perf_counter() - t0, 2)
        row["probe_s"] = doc["probe"]["seconds"]
        pairs = pairwise_errors(declared, doc)
        errors = [abs(m - w) / w for _, _, m, w in pairs]
        row["pairs"] = len(pairs)
        row["pairs_within_15pct"] = sum(e <= TOLERANCE for e in errors)
        row["pair_error_max"] = round(max(errors, default=0.0), 4)
        worst = max(pairs, key=lambda p: abs(p[2] - p[3]) / p[3]) if pairs else None
        row["worst_pair"] = None if worst is None else {
            "pair": [worst[0], worst[1]], "measured_gbps": worst[2], "configured_gbps": worst[3]}
        row["groups"] = doc["probe"]["groups"]
        row["shared"] = [{"label": s.get("label"), "gbps": s["gbps"], "pairs": len(s["pairs"])}
                         for s in doc.get("shared", [])]
        row["egress_gbps"] = doc.get("egress_gbps")
        row["ingress_gbps"] = doc.get("ingress_gbps")
        probed = from_dict(doc)
        want, got = make_plan(declared), make_plan(probed)
        row["declared_optimum_MBps"] = round(want.throughput_Bps / 1e6, 3)
        row["probed_optimum_MBps"] = round(got.throughput_Bps / 1e6, 3)
        row["optimum_ratio"] = round(got.throughput_Bps / want.throughput_Bps, 4)
        # the probed plan on the declared network, in the model: the allreduce target
        # without measurement noise
        row["modelled_plan_ratio"] = round(modelled_rate_on(got, declared)
                                           / modelled_rate_on(want, declared), 4)
        if allreduce:
            work = Path(tempfile.mkdtemp(prefix="probe-accuracy-"))
            ar = allreduce_ratio(cluster, want, got, allreduce, iters, work)
            row["allreduce"] = {k: (round(v, 5) if isinstance(v, float) else v)
                                for k, v in ar.items()}
        row["document"] = doc
    return row


def verdict(row: Mapping[str, Any]) -> List[str]:
    """The targets this row misses (empty when it meets them all)."""
    misses = []
    if row["pairs_within_15pct"] < row["pairs"]:
        misses.append(f"{row['pairs'] - row['pairs_within_15pct']} pairs off by more than 15%")
    if abs(row["optimum_ratio"] - 1) > TOLERANCE:
        misses.append(f"optimum ratio {row['optimum_ratio']:.3f}")
    if row["modelled_plan_ratio"] < 1 - TOLERANCE:
        misses.append(f"modelled plan ratio {row['modelled_plan_ratio']:.3f}")
    if "allreduce" in row and row["allreduce"]["ratio"] < 1 - TOLERANCE:
        misses.append(f"allreduce ratio {row['allreduce']['ratio']:.3f}")
    if "allreduce" in row and row["allreduce"]["wrong"]:
        misses.append(f"{row['allreduce']['wrong']} wrong elements")
    return misses


def _topologies(args: argparse.Namespace) -> List[Dict[str, Any]]:
    from horotopo.generate import racks, random_declared
    from horotopo.topology import bundled

    docs = []
    for name in args.topologies or (DEFAULT if not (args.random or args.racks) else []):
        path = Path(name) if Path(name).exists() else bundled(name)
        docs.append(json.loads(path.read_text()))
    for spec in args.racks:
        docs.append(racks([int(v) for v in spec.split(",")]))
    for spec in args.random:
        n, seed = (int(v) for v in spec.split(":"))
        docs.append(random_declared(n, seed))
    return docs


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("topologies", nargs="*", help="declared topology files or bundled names")
    p.add_argument("--random", action="append", default=[], metavar="N:SEED",
                   help="add horotopo.generate.random_declared(N, SEED)")
    p.add_argument("--racks", action="append", default=[], metavar="A,B,...",
                   help="add horotopo.generate.racks([A, B, ...]) (1 gbps NICs, 0.25 uplinks)")
    p.add_argument("--quick", action="store_true", help="probe in quick mode")
    p.add_argument("--allreduce", metavar="SIZE",
                   help="also time both plans' allreduce of SIZE bytes (e.g. 8M)")
    p.add_argument("--iters", type=int, default=5, help="allreduce iterations per plan")
    p.add_argument("--json", action="store_true", help="one JSON object per topology")
    p.add_argument("--prefix", default="pa",
                   help="names of the emulated cluster's namespaces and links start with this, "
                        "apart from another emulated cluster's (pa)")
    results_doc.add_markdown_option(p, "probe_accuracy")
    args = p.parse_args(argv)
    emulate = emulate_module()
    ok, why = emulate.available()
    if not ok:
        _log(f"cannot emulate a cluster here: {why}")
        return 2
    failed = False
    done: List[Dict[str, Any]] = []
    for doc in _topologies(args):
        _log(f"{doc.get('name')}: building the cluster and probing")
        row = evaluate(doc, args.quick, args.allreduce, args.iters, prefix=args.prefix)
        misses = verdict(row)
        failed |= bool(misses)
        done.append({**row, "misses": misses})
        if args.json:
            print(json.dumps(row), flush=True)
            continue
        print(f"== {row['topology']} ({row['ranks']} ranks, {row['mode']} probe, "
              f"{row['probe_s']:.2f} s measured, {row['probe_wall_s']:.1f} s with start-up)")
        print(f"   pairwise: {row['pairs_within_15pct']}/{row['pairs']} within 15%, worst "
              f"error {row['pair_error_max'] * 100:.1f}% {row['worst_pair']}")
        print(f"   groups {row['groups']}, shared {row['shared']}")
        print(f"   optimum: probed {row['probed_optimum_MBps']:.3f} MB/s / declared "
              f"{row['declared_optimum_MBps']:.3f} MB/s = {row['optimum_ratio']:.3f}; probed "
              f"plan on the declared network (model) {row['modelled_plan_ratio']:.3f} of the "
              f"declared plan")
        if "allreduce" in row:
            ar = row["allreduce"]
            print(f"   allreduce {ar['size']} B: probed plan {ar['probed_GBps'] * 1e3:.2f} MB/s"
                  f" / declared plan {ar['declared_GBps'] * 1e3:.2f} MB/s = {ar['ratio']:.3f}"
                  f" ({ar['wrong']} wrong); chunks {ar['probed_chunk']} / "
                  f"{ar['declared_chunk']} B, trees {ar['probed_trees']} / "
                  f"{ar['declared_trees']}; probed trees at the declared chunk: "
                  f"{ar['same_chunk_ratio']:.3f}")
        print(f"   verdict: {'meets the targets' if not misses else '; '.join(misses)}",
              flush=True)
    if args.markdown:
        markdown(args.markdown, done)
    return 1 if failed else 0


def markdown(path: str, rows: List[Dict[str, Any]]) -> None:
    """The results file: one row per topology, the targets it missed in the last column."""
    fmt = results_doc.fmt

    def allreduce(r: Dict[str, Any], key: str, spec: str) -> str:
        return fmt(r["allreduce"][key], spec) if "allreduce" in r else "-"

    columns: List[results_doc.Column] = [
        ("topology", lambda r: r["topology"]), ("ranks", lambda r: r["ranks"]),
        ("probe", lambda r: r["mode"]), ("probe (s)", lambda r: fmt(r["probe_s"], ".2f")),
        ("pairs within 15%", lambda r: f"{r['pairs_within_15pct']}/{r['pairs']}"),
        ("worst pair error", lambda r: fmt(r["pair_error_max"], ".1f", 100) + "%"),
        ("probed / declared optimum", lambda r: fmt(r["optimum_ratio"], ".3f")),
        ("probed plan / declared plan (model)", lambda r: fmt(r["modelled_plan_ratio"], ".3f")),
        ("probed plan / declared plan (allreduce)", lambda r: allreduce(r, "ratio", ".3f")),
        ("#wrong", lambda r: allreduce(r, "wrong", "d")),
        ("verdict", lambda r: "meets the targets" if not r["misses"]
         else "; ".join(r["misses"]))]
    results_doc.write_table(
        path, "probe_accuracy: the probe on emulated clusters", rows, columns,
        summary="Targets: pairwise within 15%, optimum within 15%, allreduce ratio at least "
                "0.85. Ratios are probed over declared: the plan of what the probe measured "
                "against the plan of the topology as declared.")


if __name__ == "__main__":
    sys.exit(main())
