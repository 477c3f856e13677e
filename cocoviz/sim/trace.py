"""Chrome / Perfetto trace export of a Timeline, and a validator of the format.

The JSON follows the Trace Event Format (the "JSON Array / Object Format" that
chrome://tracing, Perfetto UI and ui.perfetto.dev open):

- one process per rank: ``pid`` = world rank, with ``M`` events ``process_name``
  ("rank 3 (pp 0, tp 3)") and ``process_sort_index``;
- one thread per stream: ``tid`` 0 = compute, 1 = communication, named by ``thread_name``;
- each event an ``X`` (complete) slice: ``ts`` and ``dur`` in microseconds, ``cat`` its
  kind, ``args`` with bytes, FLOPs, stage, chunk, detail;
- each dependency that crosses streams, ranks or pipeline stages a flow: an ``s`` event
  inside the producing slice and an ``f`` event with ``bp: "e"`` inside the consuming
  slice, sharing a unique ``id``.

Times are rounded to whole nanoseconds first, so slices on one thread never overlap
through rounding.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cocoviz.sim.timeline import Event, Timeline
from cocoviz.sim.workload import COMM, COMPUTE, P2P

__all__ = [
    "MAX_TRACE_RANKS",
    "TID",
    "check_trace_path",
    "to_trace",
    "trace_ranks",
    "traced_ranks_text",
    "validate_trace",
    "write_trace",
]

MAX_TRACE_RANKS = 256
"""The most ranks a trace shows unless asked for more: the ranks of one lane run the same
timeline, so beyond this each pipeline stage shows its first ranks (a trace of 65,536
ranks would be over 100 MB, more than a trace viewer opens)."""

TID = {COMPUTE: 0, COMM: 1, P2P: 2}
_STREAM_NAMES = {COMPUTE: "compute stream", COMM: "communication stream", P2P: "send/recv stream"}
_EPS_NS = 1


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _us(ns: int) -> float:
    return ns / 1000.0


def _slice(e: Event) -> dict[str, Any]:
    ts = _ns(e.start)
    dur = max(0, _ns(e.end) - ts)
    args: dict[str, Any] = {"stage": e.stage, "bytes": e.bytes, "flops": e.flops}
    if len(e.members) > 1:
        args["stages"] = list(e.members)
    if e.chunk is not None:
        args["chunk"] = f"{e.chunk + 1}/{e.chunks}"
    if e.detail:
        args["detail"] = e.detail
    if e.peer is not None:
        args["peer_rank"] = e.peer
    if e.slowdown > 1.0005:
        args["slowdown"] = round(e.slowdown, 4)
    return {
        "name": e.label,
        "cat": e.kind.value,
        "ph": "X",
        "ts": _us(ts),
        "dur": _us(dur),
        "pid": e.rank,
        "tid": TID[e.stream],
        "args": args,
    }


def trace_ranks(timeline: Timeline) -> list[int]:
    """The ranks a trace shows by default: every rank up to `MAX_TRACE_RANKS`, else the
    first ranks of each lane (a pipeline stage), as many of each as fit."""
    if timeline.world <= MAX_TRACE_RANKS:
        return list(range(timeline.world))
    each = max(1, MAX_TRACE_RANKS // len(timeline.lanes))
    chosen: set[int] = set()
    for lane in timeline.lanes:
        chosen.update(lane.ranks[:each])
        if len(chosen) >= MAX_TRACE_RANKS:
            break
    return sorted(chosen)[:MAX_TRACE_RANKS]


def to_trace(timeline: Timeline, ranks: Iterable[int] | None = None) -> dict[str, Any]:
    """The trace as a JSON-serializable object (`trace_ranks` unless ``ranks`` is
    given)."""
    chosen = sorted(set(trace_ranks(timeline) if ranks is None else ranks))
    wanted = set(chosen)
    out: list[dict[str, Any]] = []
    spans: dict[tuple[int, int], tuple[int, int, int]] = {}  # (rank, i) → (ts, dur, tid)
    tp = timeline.tp
    used = {e.stream for lane in timeline.lanes for e in lane.events}
    for rank in chosen:
        out.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "args": {"name": f"rank {rank} (pp {rank // tp}, tp {rank % tp})"},
            }
        )
        out.append(
            {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}
        )
        for stream, tid in TID.items():
            if stream == P2P and stream not in used:
                continue  # a thread of its own only inside an overlapped pipeline
            out.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "args": {"name": _STREAM_NAMES[stream]},
                }
            )
            out.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        for i, e in enumerate(timeline.events_of(rank)):
            ev = _slice(e)
            out.append(ev)
            ts = _ns(e.start)
            spans[(rank, i)] = (ts, max(0, _ns(e.end) - ts), TID[e.stream])
    flow_id = 0
    for src, dst in timeline.flows(wanted):
        s_ts, s_dur, s_tid = spans[src]
        d_ts, d_dur, d_tid = spans[dst]
        flow_id += 1
        common = {"name": "dependency", "cat": "dependency", "id": flow_id}
        out.append(
            {
                **common,
                "ph": "s",
                # Inside the producer: at its end, or (a send and its concurrent
                # receive) at its start.
                "ts": _us(
                    s_ts + s_dur - min(_EPS_NS, s_dur // 2)
                    if s_ts + s_dur <= d_ts
                    else s_ts + min(_EPS_NS, s_dur // 2)
                ),
                "pid": src[0],
                "tid": s_tid,
            }
        )
        out.append(
            {
                **common,
                "ph": "f",
                "bp": "e",
                "ts": _us(d_ts + min(_EPS_NS, d_dur // 2)),
                "pid": dst[0],
                "tid": d_tid,
            }
        )
    return {
        "traceEvents": out,
        "displayTimeUnit": "ns",
        "otherData": {
            "program": timeline.program,
            "hardware": timeline.hardware,
            "collectives": timeline.collectives,
            "makespan_us": timeline.makespan * 1e6,
            "generator": "cocoviz simulate",
        },
    }


def write_trace(
    timeline: Timeline, path: str | Path, ranks: Iterable[int] | None = None, force: bool = False
) -> int:
    """Write the trace JSON through `fsio.write_file` (an existing file that is not a
    cocoviz trace is refused unless `force`); returns the number of trace events
    written (an OutputError when the system or the writer refuses the file)."""
    from cocoviz.fsio import write_file

    trace = to_trace(timeline, ranks)
    write_file(path, json.dumps(trace, separators=(",", ":")), force=force, ours=is_trace)
    return len(trace["traceEvents"])


def traced_ranks_text(timeline: Timeline) -> str:
    """'8 ranks', or '256 of 65,536 ranks (…)' when the trace leaves ranks out."""
    shown = len(trace_ranks(timeline))
    if shown == timeline.world:
        return f"{shown} ranks"
    return (
        f"{shown:,} of {timeline.world:,} ranks (the first of each set of ranks that run "
        f"the same timeline; at most {MAX_TRACE_RANKS} are traced)"
    )


def check_trace_path(path: str | Path, force: bool = False) -> None:
    """Refuse a trace path before the work that fills it, as `write_trace` would refuse
    it after (which checks again, then knowing every file the command read)."""
    from cocoviz.fsio import check_output

    check_output(path, force=force, ours=is_trace)


def is_trace(path: Path) -> bool:
    """Whether `path` is a trace cocoviz wrote (its `otherData` trailer names it)."""
    from cocoviz.fsio import read_tail

    tail = read_tail(path, 64 << 10)
    return tail is not None and b'"generator":"cocoviz' in tail


_REQUIRED = {
    "X": ("name", "ts", "dur", "pid", "tid"),
    "M": ("name", "pid", "args"),
    "s": ("name", "cat", "id", "ts", "pid", "tid"),
    "f": ("name", "cat", "id", "ts", "pid", "tid"),
}
_TOL = 1e-6  # µs


def validate_trace(trace: Any, ranks: Iterable[int] | None = None) -> list[str]:
    """Problems with a trace object (empty when it is well formed).

    Checks the fields each phase requires, one ``process_name`` per process and a
    ``thread_name`` per thread that holds slices, slices on one thread that nest or are
    disjoint, flow ids used by exactly one ``s`` and one ``f`` (with ``bp: "e"``), each
    inside a slice of its thread, and, given ``ranks``, exactly those processes.
    """
    problems: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["a trace is an object with a 'traceEvents' list"]
    events = trace["traceEvents"]
    proc_names: dict[Any, int] = {}
    thread_names: set[tuple[Any, Any]] = set()
    slices: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    flows: dict[Any, dict[str, list[dict[str, Any]]]] = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or "ph" not in ev:
            problems.append(f"event {i}: not an object with 'ph'")
            continue
        ph = ev["ph"]
        if ph not in _REQUIRED:
            problems.append(f"event {i}: unexpected phase {ph!r}")
            continue
        missing = [k for k in _REQUIRED[ph] if k not in ev]
        if missing:
            problems.append(f"event {i} ({ph}): missing {', '.join(missing)}")
            continue
        for k in ("ts", "dur"):
            if k in ev and (not isinstance(ev[k], int | float) or ev[k] < 0):
                problems.append(f"event {i} ({ph}): '{k}' must be a non-negative number")
        if ph == "M":
            if ev["name"] == "process_name":
                if not isinstance(ev["args"], dict) or not ev["args"].get("name"):
                    problems.append(f"event {i}: process_name without args.name")
                proc_names[ev["pid"]] = proc_names.get(ev["pid"], 0) + 1
            elif ev["name"] == "thread_name":
                if "tid" not in ev or not ev["args"].get("name"):
                    problems.append(f"event {i}: thread_name without tid or args.name")
                else:
                    thread_names.add((ev["pid"], ev["tid"]))
        elif ph == "X":
            slices.setdefault((ev["pid"], ev["tid"]), []).append(
                (float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]))
            )
        else:
            if ph == "f" and ev.get("bp") != "e":
                problems.append(f"event {i}: flow end without bp 'e' (binds to the next slice)")
            flows.setdefault(ev["id"], {"s": [], "f": []})[ph].append(ev)
    for pid, n in proc_names.items():
        if n != 1:
            problems.append(f"process {pid}: {n} process_name events")
    for key, spans in slices.items():
        if key[0] not in proc_names:
            problems.append(f"process {key[0]}: slices but no process_name")
        if key not in thread_names:
            problems.append(f"process {key[0]} thread {key[1]}: slices but no thread_name")
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple[float, float]] = []
        for a, b in spans:
            while stack and stack[-1][1] <= a + _TOL:
                stack.pop()
            if stack and b > stack[-1][1] + _TOL:
                problems.append(
                    f"process {key[0]} thread {key[1]}: slice at {a} µs overlaps the one "
                    f"at {stack[-1][0]} µs without nesting"
                )
            stack.append((a, b))
    starts = {k: sorted(v) for k, v in slices.items()}
    for fid, ends in flows.items():
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            problems.append(
                f"flow {fid}: {len(ends['s'])} start and {len(ends['f'])} end events "
                "(ids must be unique)"
            )
            continue
        for ph in ("s", "f"):
            ev = ends[ph][0]
            spans = starts.get((ev["pid"], ev["tid"]), [])
            ts = float(ev["ts"])
            j = bisect.bisect_right(spans, (ts + _TOL, float("inf")))
            # Slices on a thread nest or are disjoint: an enclosing one starts just before.
            near = spans[max(0, j - 8) : j]
            if not any(a - _TOL <= ts <= b + _TOL for a, b in near):
                problems.append(
                    f"flow {fid}: {ph} at {ts} µs on process {ev['pid']} thread {ev['tid']} "
                    "is inside no slice"
                )
    if ranks is not None:
        want = set(ranks)
        have = set(proc_names)
        if want != have:
            problems.append(f"processes {sorted(have)} do not match ranks {sorted(want)}")
    return problems
