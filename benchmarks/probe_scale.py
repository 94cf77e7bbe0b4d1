"""The probe by hosts at scale, in the simulator: simulated time, host-pair accuracy, shared links.

    python benchmarks/probe_scale.py --ranks 128,256,1024 \
        --cluster racks:hosts_per_rack=4,gpus=8,oversub=4 --cluster sites:gpus=8,wan_gbps=10

For each generated cluster and rank count, every rank runs ``horotopo.probe.probe`` (quick
mode, the hosts scheme) over the simulated transport, each rank's host named as the generator
declares it (:func:`horotopo.probe.hostinfer.generated_hosts`). It reports:

- the probe's simulated seconds, its tests and the leaders' rounds, and the wall time;
- host pairs within 15% of the declared rate alone (the tightest link of the declared route,
  between the two hosts' first ranks);
- every rack uplink (each direction) and the WAN link: found when a shared link the probe
  reports carries traffic from (to) a set of hosts behind that link only, at least half of
  them, with its capacity within 15% of the declared one;
- the plan made from the measured topology against the plan made from the declared one, both
  planned for ``--size`` and each judged on both networks, the declared one and the measured
  one (the probe's document, as the planner reads it): their trees' rates in the model
  (:func:`horotopo.plan.modelled_rate_on`, free of the simulator's effects) and, with
  ``--simulate``, the simulated time of one ``--size`` allreduce over each plan's trees on the
  declared network (``--chunk``: a larger chunk, fewer messages, where the plan's own would
  take the simulator too long). What the probe decides is the trees; which algorithm runs is
  the chooser's, on either topology. Target: the probed plan within 10% of the declared
  plan's time on each network.

``--save DIR`` writes each probe's document to DIR/NAME.json; ``--probed DIR`` reads it back
instead of probing again where DIR holds one (a probe of 1024 ranks takes about an hour of
wall time here), and the results name the file by its SHA-256. ``--point SPEC@RANKS`` adds one
cluster at one rank count to the ``--cluster`` x ``--ranks`` grid.

The simulated transport charges the probe's messages their software cost per message, but not
the per-byte receive cost the engine pays for its reductions and copies (the probe's receives
land in place: ``--recv-cost`` charges it anyway). ``--json`` prints the rows as JSON;
``--markdown [PATH]`` also writes the table to docs/results/probe_scale.md.
"""
from __future__ import annotations

import argparse
import hashlib
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
import json
import multiprocessing
import os
import sys
from pathlib import Path
import time
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from horotopo.cli.simulate_cmd import simulate
from horotopo.generate import generate
from horotopo.plan import Plan, format_size, make_plan, modelled_rate_on, parse_size
from horotopo.probe import probe
from horotopo.probe.hostinfer import generated_hosts
from horotopo.simulation.runner import run_simulated
from horotopo.topology import GBPS_TO_BPS, Topology, from_dict
from horotopo.transport.simulated import DEFAULT_COSTS, SimCosts

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared results writer
import results as results_doc  # noqa: E402

WITHIN = 0.15
#: The probed plan's time may exceed the declared plan's by this much.
PLAN_WITHIN = 0.10


def _neighbours(doc: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """node -> {neighbour: link}."""
    out: Dict[str, Dict[str, Any]] = {}
    for link in doc["links"]:
        a, b = link["ends"]
        out.setdefault(a, {})[b] = link
        out.setdefault(b, {})[a] = link
    return out


def _rate(link: Dict[str, Any], forward: bool) -> float:
    g = link["gbps"]
    return float(g if not isinstance(g, list) else g[0 if forward else 1])


def declared_links(doc: Dict[str, Any], host_names: List[str]) -> List[Dict[str, Any]]:
    """The links whose sharing the probe should find: each rack's uplink that its hosts' NICs
    can fill (both ways) and the WAN link (both ways), as {name, hosts behind it, out gbps,
    in gbps}: the most that can cross it, so the least of the link, the NICs behind it and
    what the other racks of its site can take in (give out) together."""
    nb = _neighbours(doc)
    switches = set(doc["switches"])
    host_set = set(host_names)
    tor_of = {}
    for h in host_names:
        tors = [x for x in nb[h] if x in switches and x not in host_set]
        tor_of[h] = tors[0]
    racks = []
    for tor in sorted(set(tor_of.values())):
        behind = {i for i, h in enumerate(host_names) if tor_of[h] == tor}
        ups = [x for x in nb[tor] if x in switches and x not in host_set and "tor" not in x]
        link = nb[tor][ups[0]]
        fwd = link["ends"][0] == tor
        nics = sum(_rate(nb[host_names[i]][tor], nb[host_names[i]][tor]["ends"][0] == tor)
                   for i in behind)
        # what the rack can push out (take in) at most: its uplink or its NICs
        racks.append({"name": f"uplink {tor}", "hosts": behind, "spine": ups[0], "nics": nics,
                      "out": min(nics, _rate(link, fwd)), "in": min(nics, _rate(link, not fwd))})
    found = []
    for r in racks:
        if min(r["out"], r["in"]) >= r["nics"]:
            continue  # never a bottleneck: the hosts behind it cannot fill it
        # Every transfer out of the rack also crosses the other racks' links in: with one
        # other rack (under the same spine) both are in series, and only the lesser shows.
        others = [x for x in racks if x is not r and x["spine"] == r["spine"]]
        found.append(dict(r, out=min(r["out"], sum(x["in"] for x in others) or r["out"]),
                          **{"in": min(r["in"], sum(x["out"] for x in others) or r["in"])}))
    spines = [s for s in switches if s.endswith("spine")]
    if len(spines) == 2 and spines[1] in nb[spines[0]]:
        link = nb[spines[0]][spines[1]]
        a = link["ends"][0]
        prefix = a[: -len("spine")]
        side = {i for i, h in enumerate(host_names) if h.startswith(prefix)}
        found.append({"name": "WAN", "hosts": side, "out": _rate(link, True),
                      "in": _rate(link, False)})
    return found


def _matches(shared: List[Dict[str, Any]], hosts: Set[int], out: bool, gbps: float
             ) -> Tuple[bool, float]:
    """(found within 15%, the closest capacity among the candidates or nan)."""
    best = float("nan")
    for s in shared:
        side = set(s["from"] if out else s["to"])
        if side and side <= hosts and 2 * len(side) >= len(hosts):
            if not np.isfinite(best) or abs(s["gbps"] - gbps) < abs(best - gbps):
                best = float(s["gbps"])
    return bool(np.isfinite(best) and abs(best - gbps) <= WITHIN * gbps), best


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def compare_plans(topo: Topology, measured: Dict[str, Any], size: int, simulated: bool,
                  chunk: Optional[int], timeout_s: float) -> Dict[str, Any]:
    """The plan made from the measured document against the one made from the declared
    topology, both for ``size`` bytes and each judged on both networks: the modelled rate of
    each one's trees on the declared network (``*_model_MBps``) and on the measured one
    (``*_measured_MBps``), and with ``simulated`` an allreduce over them simulated on the
    declared network."""
    plans: Dict[str, Plan] = {}
    out: Dict[str, Any] = {}
    networks = {"declared": topo, "probed": from_dict(measured)}
    for kind, model in networks.items():
        w0 = time.perf_counter()
        plans[kind] = make_plan(model, size=size)
        out[f"{kind}_planner_s"] = time.perf_counter() - w0
        out[f"{kind}_trees"] = len(plans[kind].trees)
        out[f"{kind}_model_MBps"] = modelled_rate_on(plans[kind], topo) / 1e6
        out[f"{kind}_measured_MBps"] = modelled_rate_on(plans[kind], networks["probed"]) / 1e6
        _say(f"# {kind} plan: {out[f'{kind}_trees']} trees, "
             f"{out[f'{kind}_model_MBps']:.1f} MB/s on the declared network, "
             f"{out[f'{kind}_measured_MBps']:.1f} on the measured one (model), planned "
             f"in {out[f'{kind}_planner_s']:.1f} s")
    out["model_ratio"] = out["declared_model_MBps"] / out["probed_model_MBps"]
    out["measured_ratio"] = out["declared_measured_MBps"] / out["probed_measured_MBps"]
    if simulated:
        for kind, plan in plans.items():
            res = simulate(topo, size, "declared", algorithms=("tree",), plan=plan,
                           chunk_bytes=chunk, timeout_s=timeout_s,
                           progress=lambda m, k=kind: _say(f"[{k} plan] {m}"))
            row = res["rows"][0]
            out[f"{kind}_sim_s"] = row["time_s"]
            out[f"{kind}_wrong"] = row["wrong"]
            out["chunk_bytes"] = row["chunk_bytes"] if chunk else None
            _say(f"# {kind} plan simulated: {row['time_s'] * 1e3:.1f} ms, {row['wrong']} wrong")
        out["sim_ratio"] = out["probed_sim_s"] / out["declared_sim_s"]
    return out


def _saved(probed: str, name: str) -> Optional[Tuple[Dict[str, Any], str]]:
    """The probe's document ``name`` saved under ``probed`` (``--save``) and its SHA-256, or
    None where there is none."""
    path = os.path.join(probed, f"{name}.json") if probed else ""
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        raw = f.read()
    return json.loads(raw), hashlib.sha256(raw).hexdigest()


def run(spec: str, n: int, recv_cost: bool, timeout_s: float, save: str = "",
        size: int = 0, simulated: bool = False, chunk: Optional[int] = None,
        probed: str = "") -> Dict[str, Any]:
    doc = generate(spec, n)
    topo = from_dict(doc)
    hosts = generated_hosts(doc)
    costs = DEFAULT_COSTS if recv_cost else SimCosts(DEFAULT_COSTS.per_message_s, 0.0)

    def body(t: Any) -> Any:
        with t.true_size():
            return probe(t, "quick", hosts=hosts, scheme="hosts",
                         progress=_say if t.rank == 0 else None)

    saved = _saved(probed, doc["name"])
    wall: Optional[float] = None
    messages: Optional[int] = None
    if saved is None:
        w0 = time.perf_counter()
        sim = run_simulated(topo, body, costs=costs, timeout_s=timeout_s)
        wall, messages = time.perf_counter() - w0, int(sim.messages)
        probed_doc = sim.results[0]
    else:
        probed_doc = saved[0]
        _say(f"# {doc['name']}: the probe's document saved in {probed} (sha256 {saved[1]})")
    meta = probed_doc["probe"]
    if save and saved is None:
        os.makedirs(save, exist_ok=True)
        with open(os.path.join(save, f"{doc['name']}.json"), "w") as f:
            json.dump(probed_doc, f)
    members = meta["members"]
    measured = np.array([[np.nan if v is None else v for v in row] for row in meta["host_gbps"]])
    h = len(members)
    good = total = 0
    worst = 0.0
    for a in range(h):
        for b in range(h):
            if a != b:
                want = topo.pair_capacity_Bps(members[a][0], members[b][0]) / GBPS_TO_BPS
                err = abs(measured[a, b] - want) / want
                good += int(err <= WITHIN)
                total += 1
                worst = max(worst, float(err))
    links = []
    for link in declared_links(doc, meta["hosts"]):
        for out in (True, False):
            ok, got = _matches(meta["shared_hosts"], link["hosts"], out,
                               link["out" if out else "in"])
            links.append({"link": f"{link['name']} {'out' if out else 'in'}",
                          "declared_gbps": link["out" if out else "in"], "found_gbps": got,
                          "found": ok})
    return {"cluster": spec, "name": doc["name"], "ranks": n, "hosts": h,
            "probe_s": meta["seconds"], "leaders_s": meta["leaders_seconds"],
            "local_s": meta["local_seconds"], "tests": meta["tests"], "rounds": meta["rounds"],
            "pairs_within": good, "pairs": total, "worst_pair_error": worst,
            "links_found": sum(x["found"] for x in links), "links": len(links),
            "link_rows": links, "trusted": meta["trusted"],
            "groups": len(meta["host_groups"]), "wall_s": wall, "messages": messages,
            "saved_sha256": None if saved is None else saved[1],
            "plans": compare_plans(topo, probed_doc, size, simulated, chunk, timeout_s)
            if size else None}


def _run_point(point: Tuple[str, int], settings: Tuple[Any, ...]) -> Dict[str, Any]:
    return run(point[0], point[1], *settings)


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="64,128,256")
    ap.add_argument("--cluster", action="append",
                    help="generator spec (repeatable; default racks with oversub 4 and sites)")
    ap.add_argument("--recv-cost", action="store_true",
                    help="charge the simulator's per-byte receive cost to the probe too")
    ap.add_argument("--timeout", type=float, default=3600.0, help="wall seconds per run")
    ap.add_argument("--size", default="64M",
                    help="the allreduce both plans are made for and judged at (0: no plans)")
    ap.add_argument("--simulate", action="store_true",
                    help="also simulate one --size allreduce of each plan on the declared "
                         "network (minutes at 1024 ranks)")
    ap.add_argument("--chunk", default=None,
                    help="the simulated allreduces' chunk (default: each plan's own)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="points simulated at once, each in a process of its own")
    ap.add_argument("--json", action="store_true")
    results_doc.add_markdown_option(ap, "probe_scale")
    ap.add_argument("--save", default="", metavar="DIR",
                    help="write each run's probe record (the document's 'probe' part: host "
                         "figures, group tests, shared links) to DIR/NAME.json")
    ap.add_argument("--probed", default="", metavar="DIR",
                    help="read the probe's document from DIR/NAME.json (written by --save) "
                         "instead of probing, where DIR holds one")
    ap.add_argument("--point", action="append", default=[], metavar="SPEC@RANKS",
                    help="one more cluster at one rank count, beside the --cluster x --ranks "
                         "grid (repeatable)")
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size) if args.size != "0" else 0
        chunk = parse_size(args.chunk) if args.chunk else None
    except ValueError as exc:
        ap.error(str(exc))
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: needs at least 1")
    if args.simulate and not size:
        ap.error("--simulate needs plans: a --size above 0")
    if args.probed and not os.path.isdir(args.probed):
        ap.error(f"--probed {args.probed}: no such folder")
    clusters = args.cluster or ["racks:hosts_per_rack=4,gpus=8,oversub=4",
                                "sites:gpus=8,wan_gbps=10"]
    points = [(spec, int(n)) for spec in clusters for n in args.ranks.split(",")]
    for point in args.point:
        spec, at, ranks = point.rpartition("@")
        if not at or not spec or not ranks.isdigit() or int(ranks) < 2:
            ap.error(f"--point {point!r}: needs SPEC@RANKS, RANKS a count of at least 2")
        points.append((spec, int(ranks)))
    settings = (args.recv_cost, args.timeout, args.save, size, args.simulate, chunk,
                args.probed)
    rows = []
    # Each point is a simulation of its own, in a process of its own where --jobs allows:
    # a 1024-rank point takes many minutes of one core.
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) \
            if args.jobs > 1 else nullcontext() as pool:
        done = (pool.map(_run_point, points, [settings] * len(points)) if pool is not None
                else (_run_point(p, settings) for p in points))
        for row in done:
            rows.append(row)
            print(f"# {row['name']}: {row['probe_s']:.2f} s simulated, pairs "
                  f"{row['pairs_within']}/{row['pairs']}, links {row['links_found']}/"
                  f"{row['links']}, wall {results_doc.fmt(row['wall_s'], '.1f')} s\n"
                  f"# row {json.dumps(row)}",
                  file=sys.stderr, flush=True)
    columns: List[results_doc.Column] = [
        ("cluster", lambda r: r["name"]), ("ranks", lambda r: r["ranks"]),
        ("hosts", lambda r: r["hosts"]), ("probe s (sim)", lambda r: f"{r['probe_s']:.2f}"),
        ("leaders s", lambda r: f"{r['leaders_s']:.2f}"), ("rounds", lambda r: r["rounds"]),
        ("tests", lambda r: r["tests"]),
        ("host pairs within 15%", lambda r: f"{r['pairs_within']}/{r['pairs']} "
         f"({100 * r['pairs_within'] / max(r['pairs'], 1):.0f}%)"),
        ("links found within 15%", lambda r: f"{r['links_found']}/{r['links']}"),
        ("wall s", lambda r: "saved" if r["saved_sha256"] else f"{r['wall_s']:.0f}")]
    plan_rows = [r for r in rows if r["plans"]]
    simulated = any("sim_ratio" in r["plans"] for r in plan_rows)
    plan_columns: List[results_doc.Column] = [
        ("cluster", lambda r: r["name"]), ("ranks", lambda r: r["ranks"]),
        ("declared trees", lambda r: r["plans"]["declared_trees"]),
        ("probed trees", lambda r: r["plans"]["probed_trees"]),
        ("declared plan MB/s, declared net",
         lambda r: f"{r['plans']['declared_model_MBps']:.1f}"),
        ("probed plan MB/s, declared net", lambda r: f"{r['plans']['probed_model_MBps']:.1f}"),
        ("probed / declared time, declared net",
         lambda r: f"{r['plans']['model_ratio']:.3f}"),
        ("declared plan MB/s, measured net",
         lambda r: f"{r['plans']['declared_measured_MBps']:.1f}"),
        ("probed plan MB/s, measured net",
         lambda r: f"{r['plans']['probed_measured_MBps']:.1f}"),
        ("probed / declared time, measured net",
         lambda r: f"{r['plans']['measured_ratio']:.3f}")]
    if simulated:
        plan_columns += [
            ("declared ms (sim)", lambda r: results_doc.fmt(r["plans"].get("declared_sim_s"),
                                                            ".1f", 1e3)),
            ("probed ms (sim)", lambda r: results_doc.fmt(r["plans"].get("probed_sim_s"),
                                                          ".1f", 1e3)),
            ("probed / declared time (sim)",
             lambda r: results_doc.fmt(r["plans"].get("sim_ratio"), ".3f")),
            ("chunk", lambda r: format_size(r["plans"]["chunk_bytes"])
             if r["plans"].get("chunk_bytes") else "plan's")]
    plan_columns += [("planner s (declared / probed)",
                      lambda r: f"{r['plans']['declared_planner_s']:.1f}"
                                f" / {r['plans']['probed_planner_s']:.1f}")]
    judged = [("model_ratio", "the declared network, model"),
              ("measured_ratio", "the measured network, model")]
    if simulated:
        judged.append(("sim_ratio", "the declared network, simulated"))
    slow_plans = [f"{r['name']}: the probed plan takes {r['plans'][ratio]:.3f}x the declared "
                  f"plan's time ({how})" for r in plan_rows for ratio, how in judged
                  if r["plans"].get(ratio, 0.0) > 1 + PLAN_WITHIN]
    saved_rows = [f"{r['name']}: the probe's document read from {args.probed}/{r['name']}.json "
                  f"(sha256 {r['saved_sha256']}), written by an earlier run's --save"
                  for r in rows if r["saved_sha256"]]
    missed = [f"{r['name']}: {x['link']} {x['declared_gbps']:g} gbps not found (closest "
              f"{x['found_gbps']:.3f})" for r in rows for x in r["link_rows"] if not x["found"]]
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
    else:
        print(results_doc.md_table(rows, columns))
        if plan_rows:
            print()
            print(results_doc.md_table(plan_rows, plan_columns))
        for line in missed + slow_plans + saved_rows:
            print(f"# {line}")
    if args.markdown:
        results_doc.write(
            args.markdown, "probe_scale: the probe by hosts at scale, simulated",
            [("", results_doc.md_table(rows, columns)
              + "".join(f"\n\n- {m}" for m in saved_rows)),
             ("Shared links not found", "\n".join(f"- {m}" for m in missed) or "None."),
             (f"Plans at {format_size(size)}: probed against declared", (
                 "Each plan judged on the declared network and on the measured one (the "
                 "probe's document as the planner reads it). Target: the probed plan's time "
                 f"within {PLAN_WITHIN:.0%} of the declared plan's on each.\n\n"
                 + results_doc.md_table(plan_rows, plan_columns) + "\n\n"
                 + ("\n".join(f"- {m}" for m in slow_plans) or "Every row meets the target."))
              if plan_rows else "Not compared (--size 0).")],
            summary="Every rank runs the quick probe over the simulated transport. Host pairs: "
                    "within 15% of the declared rate alone; links: each rack uplink and WAN "
                    "direction found with its capacity within 15%. Probe times are simulated; "
                    "wall time is this machine's.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
