"""The command palette's providers (ctrl+p): steps, schedules and samples, beside the
app's actions (`cocoviz.tui.keys.KeyModel.get_system_commands`).

- steps: every step legal on the current program, from any stage's palette, with the
  time the model predicts after it and against now (`split(sum)` finds the split of
  megatron_mlp's allreduce wherever the selection is);
- schedules: the program's schedule blocks, each with its predicted time, applied from
  the unscheduled program;
- samples: every sample by name and first comment line, opened in place of the program.

What they list is computed in a thread by `cocoviz.workbench.finder` (no Textual there).
They see the app as a `cocoviz.tui.host.ProgramHost`: the app imports them, they do not
import the app.
"""

from __future__ import annotations

import asyncio
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from cocoviz.timefmt import format_time
from cocoviz.tui.host import host_of
from cocoviz.workbench import finder


def _vs(after: float | None, now: float | None) -> str:
    """`predicted 553 µs (1.16× faster than now)`, or why there is no prediction."""
    if after is None:
        return "not predicted (a large program: apply it to see)"
    text = f"predicted {format_time(after)}"
    if now:
        ratio = now / after
        if abs(ratio - 1) < 0.005:
            text += " (no change)"
        else:
            way = f"{ratio:.2f}× faster" if ratio > 1 else f"{1 / ratio:.2f}× slower"
            text += f" ({way} than now)"
    return text


class StepCommands(Provider):
    """The steps legal on the current program, with their predicted times."""

    async def startup(self) -> None:
        app = host_of(self.app)
        self.choices: list[finder.StepChoice] = []
        self.now: float | None = None
        program, hw = app.wb.program, app.wb.hw
        if program is None:
            return
        self.now = await asyncio.to_thread(finder.predicted, program, [], hw)
        self.choices = await asyncio.to_thread(finder.step_choices, program, hw)

    def _hit_parts(self, c: finder.StepChoice) -> tuple[str, str]:
        note = f" {c.note}" if c.note else ""
        return f"step {c.step}", f"{_vs(c.makespan_s, self.now)} · for {c.stage}{note}"

    async def discover(self) -> Hits:
        app = host_of(self.app)
        for c in self.choices:
            text, help = self._hit_parts(c)
            yield DiscoveryHit(text, partial(app.apply_step, c.step), help=help)

    async def search(self, query: str) -> Hits:
        app = host_of(self.app)
        matcher = self.matcher(query)
        for c in self.choices:
            text, help = self._hit_parts(c)
            score = matcher.match(text)
            if score > 0:
                yield Hit(
                    score, matcher.highlight(text), partial(app.apply_step, c.step), help=help
                )


class ScheduleCommands(Provider):
    """The program's schedule blocks, applied from the unscheduled program."""

    async def startup(self) -> None:
        app = host_of(self.app)
        self.choices: list[finder.ScheduleChoice] = []
        self.now: float | None = None
        base, hw = app.wb.base, app.wb.hw
        if base is None:
            return
        self.now = await asyncio.to_thread(finder.predicted, base, [], hw)
        self.choices = await asyncio.to_thread(finder.schedule_choices, base, hw)

    def _hit_parts(self, c: finder.ScheduleChoice) -> tuple[str, str]:
        if c.makespan_s is None:
            time = "refused on this program"
        else:
            time = _vs(c.makespan_s, self.now).replace("than now", "than as written")
        return f"schedule {c.name}", f"{len(c.steps)} steps, {time}"

    async def discover(self) -> Hits:
        app = host_of(self.app)
        for c in self.choices:
            text, help = self._hit_parts(c)
            yield DiscoveryHit(text, partial(app.apply_schedule, c.steps), help=help)

    async def search(self, query: str) -> Hits:
        app = host_of(self.app)
        matcher = self.matcher(query)
        for c in self.choices:
            text, help = self._hit_parts(c)
            score = matcher.match(text)
            if score > 0:
                command = partial(app.apply_schedule, c.steps)
                yield Hit(score, matcher.highlight(text), command, help=help)


class SampleCommands(Provider):
    """Every sample, opened in place of the program (the session is autosaved first)."""

    async def startup(self) -> None:
        self.choices = await asyncio.to_thread(finder.sample_choices)

    async def search(self, query: str) -> Hits:
        app = host_of(self.app)
        matcher = self.matcher(query)
        for name, about in self.choices:
            text = f"open sample {name}"
            score = matcher.match(text)
            if score > 0:
                yield Hit(
                    score, matcher.highlight(text), partial(app.open_program, name), help=about
                )


PROVIDERS = frozenset({StepCommands, ScheduleCommands, SampleCommands})
"""The providers the app adds to Textual's (its actions)."""
