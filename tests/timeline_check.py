"""Reading and checking a horotopo timeline file the way trace viewers need it."""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Dict, List, Set, Tuple

# Timestamps are rounded to 1 ns (0.001 us); spans that touch may differ by that much.
_EPS = 0.0015


def load_trace(path: str) -> Dict[str, Any]:
    """The file as JSON, checked (see :func:`check_trace`); raises AssertionError if bad."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    check_trace(doc)
    return doc


def check_trace(doc: Dict[str, Any]) -> None:
    """Assert what chrome://tracing and Perfetto need: a ``traceEvents`` list of known event
    kinds, every row and named lane declared by ``M`` events, ``B``/``E`` balanced per track
    and never ending before they begin, and the spans of each track properly nested (a partial
    overlap is drawn wrongly or dropped by Perfetto)."""
    events = doc["traceEvents"]
    assert isinstance(events, list) and events, "no traceEvents"
    named_pids: Set[int] = set()
    named_tids: Set[Tuple[int, int]] = set()
    spans: Dict[Tuple[int, int], List[Tuple[float, float]]] = defaultdict(list)
    stacks: Dict[Tuple[int, int], List[float]] = defaultdict(list)
    for ev in events:
        ph = ev["ph"]
        assert ph in ("B", "E", "X", "M", "i"), ev
        if ph == "M":
            if ev["name"] == "process_name":
                named_pids.add(ev["pid"])
            elif ev["name"] == "thread_name":
                named_tids.add((ev["pid"], ev["tid"]))
            continue
        track = (ev["pid"], ev["tid"])
        assert ev["pid"] in named_pids, f"event on an undeclared row: {ev}"
        assert track[1] == 0 or track in named_tids, f"event on an unnamed lane: {ev}"
        ts = float(ev["ts"])
        assert ts >= 0, ev
        if ph == "B":
            assert ev.get("name"), ev
            stacks[track].append(ts)
        elif ph == "E":
            assert stacks[track], f"E without B: {ev}"
            start = stacks[track].pop()
            assert ts >= start, f"span ends before it begins: {ev}"
            spans[track].append((start, ts))
        elif ph == "X":
            assert ev["dur"] >= 0, ev
            spans[track].append((ts, ts + float(ev["dur"])))
    open_tracks = {t: len(s) for t, s in stacks.items() if s}
    assert not open_tracks, f"B without E on tracks {open_tracks}"
    for track, intervals in spans.items():
        stack: List[Tuple[float, float]] = []
        for start, end in sorted(intervals, key=lambda iv: (iv[0], -iv[1])):
            while stack and stack[-1][1] <= start + _EPS:
                stack.pop()
            assert not stack or end <= stack[-1][1] + _EPS, (
                f"spans overlap without nesting on track {track}: {stack[-1]} and "
                f"{(start, end)}")
            stack.append((start, end))


def rows(doc: Dict[str, Any]) -> Dict[str, int]:
    """Row (process) name -> pid."""
    return {ev["args"]["name"]: ev["pid"] for ev in doc["traceEvents"]
            if ev["ph"] == "M" and ev["name"] == "process_name"}


def lanes(doc: Dict[str, Any], pid: int) -> Dict[str, int]:
    """Lane (thread) name -> tid, on row ``pid``."""
    return {ev["args"]["name"]: ev["tid"] for ev in doc["traceEvents"]
            if ev["ph"] == "M" and ev["name"] == "thread_name" and ev["pid"] == pid}


def names_on(doc: Dict[str, Any], pid: int, tid: int = 0) -> List[str]:
    """Names of the B and X events on one track, in file order."""
    return [ev["name"] for ev in doc["traceEvents"]
            if ev["ph"] in ("B", "X") and ev["pid"] == pid and ev["tid"] == tid]


def events_named(doc: Dict[str, Any], name: str, pid: int) -> List[Dict[str, Any]]:
    return [ev for ev in doc["traceEvents"]
            if ev.get("name") == name and ev["pid"] == pid and ev["ph"] in ("B", "X")]
