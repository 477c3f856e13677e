"""Responsiveness of the TUI with a 24-layer GPT stack loaded (504 stages).

For every step of the stack's last schedule block (96 on 24 layers), two times from the
step being applied (as the palette applies it): until the screen has been redrawn with
the new graph, steps, history and status line, the cost pane saying it is simulating
(the UI's answer to the key); and until the new timeline and the cost pane's figures
have been drawn (simulated in a worker once the screen is drawn). Prints the median, the
90th percentile (nearest rank: 90% of the steps took at most that) and the maximum of
each, against the goals: a median under 50 ms for the screen, under 100 ms for the
timeline.

    /work/venv/bin/python bench/bench_tui.py [--layers 24] [--steps N (default: all)]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
import time
from pathlib import Path

from cocoviz.samples.gpt import gpt_stack
from cocoviz.tui.app import create_app


async def _settle(pilot) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


SCREEN_GOAL_MS = 50.0
TIMELINE_GOAL_MS = 100.0


async def run(layers: int, steps: int | None) -> tuple[list[float], list[float]]:
    text = gpt_stack(layers)
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(f"gpt{layers}.coco", text=text, state_root=Path(tmp))
        screen: list[float] = []
        timeline: list[float] = []
        async with app.run_test(size=(160, 50)) as pilot:
            await _settle(pilot)
            assert app.wb.base is not None, "the stack did not parse"
            schedule = app.wb.base.schedules[-1].steps
            for step in schedule[:steps]:
                app.selected = step.args[0]
                await _settle(pilot)
                drawn = asyncio.Event()
                t0 = time.perf_counter()
                ok = app.apply_step(str(step))
                app.call_after_refresh(drawn.set)
                await drawn.wait()
                screen.append((time.perf_counter() - t0) * 1000)
                if not ok:
                    raise SystemExit(f"step {step} failed: {app.wb.failed}")
                await _settle(pilot)
                assert app.timeline_drawn_at > t0, "the timeline was not redrawn"
                timeline.append((app.timeline_drawn_at - t0) * 1000)
        return screen, timeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument(
        "--steps", type=int, default=None, help="time only the first N steps (default: all)"
    )
    args = ap.parse_args()
    screen, timeline = asyncio.run(run(args.layers, args.steps))
    print(f"gpt{args.layers} ({len(screen)} steps)")
    print(f"  step → screen redrawn:   {stats(screen)}  (goal: median < {SCREEN_GOAL_MS:.0f} ms)")
    print(
        f"  step → timeline redrawn: {stats(timeline)}  (goal: median < {TIMELINE_GOAL_MS:.0f} ms)"
    )


def p90(xs: list[float]) -> float:
    """The 90th percentile by nearest rank: the smallest time that at least 90% of the
    samples do not exceed (a sample, never interpolated)."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.9 * len(xs)) - 1)]


def stats(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.1f} ms, p90 {p90(xs):.1f} ms, max {max(xs):.1f} ms"


if __name__ == "__main__":
    main()
