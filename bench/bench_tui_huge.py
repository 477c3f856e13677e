"""How fast the TUI answers keys on a huge program (issue 31, item 7: keys and `q`
answered within 100 ms on a 10,000-stage program).

    python bench/bench_tui_huge.py [--stages 10000] [--program chain|gpt] [--keys 40]
                                   [--reference 100]

Opens a program of `--stages` stages (`chain`: one elementwise stage after another, the
issue's case; `gpt`: `cocoviz.samples.gpt.gpt_stack` with as many layers as give about
that many stages) in the app (Pilot, 160x50) and, from the moment the app is mounted —
while the source is parsed, the graph laid out and the program simulated — presses a key
every 150 ms (`s`, `b`, `down` in the graph in turn: each changes something the bench
can read — the side column, the comparison, the selected stage and its palette) and
times each from the key event posted to its effect, polling every 2 ms on the event
loop (a blocked loop delays the poll: that is the time a user waits). A probe on the
loop also records how late a 10 ms sleep wakes (the longest stall). Once every worker
has finished and `--keys` keys are timed, `q` is pressed and timed until the app asks
to exit (its answer), and until it has closed. Prints the key times while the app was
busy (workers running) and after, the longest stall, and `q`'s time, against the goal of
100 ms; and, measured the same way in the same run, those of a program of `--reference`
stages (0: none), so that the cost of the size is read as a ratio on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

GOAL_MS = 100.0
KEY_EVERY_S = 0.15


def chain(n: int) -> str:
    """`n` chained elementwise stages on 4 ranks."""
    body = [f"s{i} = s{i - 1} * 2" for i in range(1, n)]
    head = ["ranks 4", "dim N = 64", "input x : f32[N] replicated", "s0 = x * 2"]
    return "\n".join([*head, *body, f"output s{n - 1}", ""])


def gpt(stages: int) -> str:
    """A GPT stack of about `stages` stages."""
    from cocoviz.ir.lower import load_program
    from cocoviz.samples.gpt import gpt_stack

    per_layer = len(load_program(gpt_stack(2), "gpt2").stages) / 2
    return gpt_stack(max(1, round(stages / per_layer)))


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.9 * len(xs)) - 1)]


def stats(xs: list[float]) -> str:
    if not xs:
        return "none"
    return (
        f"{len(xs)} keys: median {statistics.median(xs):.0f} ms, p90 {p90(xs):.0f} ms, "
        f"max {max(xs):.0f} ms"
    )


async def session(text: str, keys: int, limit_s: float, state: Path) -> dict[str, object]:
    from textual import events

    from cocoviz.tui.app import create_app

    path = state / "huge.coco"
    path.write_text(text)
    t_open = time.perf_counter()
    app = create_app(str(path), state_root=state)
    busy: list[float] = []
    idle: list[float] = []
    stalls: list[float] = []
    stop = False

    async def probe() -> None:
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            stalls.append((time.perf_counter() - t - 0.01) * 1000)

    def observers() -> list[tuple[str, Callable[[], object]]]:
        return [
            ("s", lambda: app.side_shown),
            ("b", lambda: app.wb.compare_mode),
            ("down", lambda: app.selected),  # the graph has the focus: the next stage
        ]

    async def timed(key: str, read: Callable[[], object]) -> float:
        before = read()
        t = time.perf_counter()
        app.post_message(events.Key(key, key if len(key) == 1 else None))
        while read() == before:
            if time.perf_counter() - t > 30:
                raise SystemExit(f"{key!r} had no effect in 30 s")
            await asyncio.sleep(0.002)
        return (time.perf_counter() - t) * 1000

    out: dict[str, object] = {}
    async with app.run_test(size=(160, 50)):
        mounted = time.perf_counter() - t_open
        task = asyncio.ensure_future(probe())
        i = 0
        graph_at = timeline_at = None
        start = time.perf_counter()
        while time.perf_counter() - start < limit_s:
            working = any(not w.is_finished for w in app.workers) or app.wb.program is None
            if graph_at is None and app.query_one("GraphView").drawing is not None:  # type: ignore[attr-defined]
                graph_at = time.perf_counter() - t_open
            if timeline_at is None and app.wb.timeline(app.wb.position) is not None:
                timeline_at = time.perf_counter() - t_open
            if not working and len(idle) >= keys and graph_at and timeline_at:
                break
            key, read = observers()[i % 3]
            i += 1
            if key == "down" and graph_at is None:  # nothing to move in yet
                key, read = observers()[0]
            (busy if working else idle).append(await timed(key, read))
            await asyncio.sleep(KEY_EVERY_S)
        t = time.perf_counter()
        app.post_message(events.Key("q", "q"))
        while not app._exit:  # the app has asked to exit: `q` is answered
            await asyncio.sleep(0.002)
        quit_ms = (time.perf_counter() - t) * 1000
        while app.is_running and time.perf_counter() - t < 60:
            await asyncio.sleep(0.002)
    closed_ms = (time.perf_counter() - t) * 1000
    stop = True
    await task
    out.update(
        mounted=mounted,
        graph_at=graph_at,
        timeline_at=timeline_at,
        busy=busy,
        idle=idle,
        stall=max(stalls, default=0.0),
        quit_ms=quit_ms,
        closed_ms=closed_ms,
    )
    return out


def report(title: str, r: dict[str, object]) -> float:
    """Print one session's figures; the worst key or `q` time, in ms."""

    def at(x: object) -> str:
        return f"{x:.1f} s" if isinstance(x, float) else "never"

    busy, idle, quit_ms = r["busy"], r["idle"], r["quit_ms"]
    assert isinstance(busy, list) and isinstance(idle, list) and isinstance(quit_ms, float)
    print(title)
    print(
        f"  app mounted {at(r['mounted'])}, graph drawn {at(r['graph_at'])}, "
        f"timeline drawn {at(r['timeline_at'])} after the start"
    )
    print(f"  keys while busy: {stats(busy)}")
    print(f"  keys once idle:  {stats(idle)}")
    print(f"  longest event-loop stall: {r['stall']:.0f} ms")
    print(f"  q answered (the app exits): {quit_ms:.0f} ms; closed {r['closed_ms']:.0f} ms")
    return max([*busy, *idle, quit_ms])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=10_000)
    ap.add_argument("--program", choices=("chain", "gpt"), default="chain")
    ap.add_argument("--keys", type=int, default=40, help="keys timed once the app is idle")
    ap.add_argument("--limit", type=float, default=300.0, help="give up after this many s")
    ap.add_argument(
        "--reference", type=int, default=100, help="stages of the program compared (0: none)"
    )
    args = ap.parse_args()
    make = chain if args.program == "chain" else gpt
    sizes = [args.stages] + ([args.reference] if args.reference else [])
    worst: dict[int, float] = {}
    idle: dict[int, float] = {}
    for n in sizes:
        text = make(n)
        with tempfile.TemporaryDirectory() as tmp:
            r = asyncio.run(session(text, args.keys, args.limit, Path(tmp)))
        title = f"{args.program}, {n} stages ({len(text.splitlines())} lines)"
        worst[n] = report(title, r)
        keys = r["idle"]
        assert isinstance(keys, list)
        idle[n] = statistics.median(keys) if keys else float("nan")
    n = args.stages
    verdict = "ok" if worst[n] < GOAL_MS else f"over the {GOAL_MS:.0f} ms goal"
    print(f"worst key or q on {n} stages: {worst[n]:.0f} ms ({verdict})")
    if args.reference:
        ref = args.reference
        print(
            f"median idle key, {n} vs {ref} stages: {idle[n]:.0f} vs {idle[ref]:.0f} ms "
            f"({idle[n] / idle[ref]:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
