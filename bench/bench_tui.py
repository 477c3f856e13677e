"""Responsiveness of the TUI with a 24-layer GPT stack loaded (504 stages).

For each step of the stack's schedule, two times from the step being applied (as the
palette applies it): until the screen has been redrawn with the new graph, palette,
history and cost (the UI's answer to the key), and until the new timeline has been
drawn (the simulation runs in a worker meanwhile). Prints medians and 90th
percentiles; the goal is a median under 150 ms for the screen.

    /work/venv/bin/python bench/bench_tui.py [--layers 24] [--steps 24]
"""

from __future__ import annotations

import argparse
import asyncio
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


async def run(layers: int, steps: int) -> tuple[list[float], list[float]]:
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
    ap.add_argument("--steps", type=int, default=24, help="how many schedule steps to time")
    args = ap.parse_args()
    screen, timeline = asyncio.run(run(args.layers, args.steps))

    def stats(xs: list[float]) -> str:
        xs = sorted(xs)
        p90 = xs[int(0.9 * (len(xs) - 1))]
        return f"median {statistics.median(xs):.1f} ms, p90 {p90:.1f} ms, max {xs[-1]:.1f} ms"

    print(f"gpt{args.layers} ({len(screen)} steps)")
    print(f"  step → screen redrawn:   {stats(screen)}  (goal: median < 150 ms)")
    print(f"  step → timeline redrawn: {stats(timeline)}")


if __name__ == "__main__":
    main()
