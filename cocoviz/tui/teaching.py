"""Teach mode in the app: `t` turns it on and off, `n` and `p` walk its steps, and the
panel under the panes explains each with the model's numbers.

With no schedule named (`cocoviz tui FILE --teach` without `--schedule`) it walks to the
tuner's best schedule, found first in a worker thread (`cocoviz.schedule.tune.tune`, as
`cocoviz tune` ranks it) while the panel shows how far the search is and the app answers
keys; `escape` (or `t` again) stops the search, and a stopped search is never taken for
the best. Teach mode runs in a session of its own beside the user's steps, which come
back when it is left (`cocoviz.workbench.Workbench.set_teaching`). The words are
`cocoviz.workbench.teach`'s.
"""

from __future__ import annotations

import time

from rich.markup import escape
from textual import work
from textual.widgets import Static
from textual.worker import get_current_worker

from cocoviz.ir.nodes import Program
from cocoviz.schedule.tune import Candidate, TuneProgress
from cocoviz.timefmt import format_time
from cocoviz.tui.keys import KeyModel
from cocoviz.workbench import NO_PROGRAM, NoBest

PROGRESS_EVERY_S = 0.1
"""The tuner's progress is shown at most this often (each update waits for the UI)."""

BAR_CELLS = 24


class TeachPanel(Static):
    """Teach mode's explanation of the current step."""

    DEFAULT_CSS = """
    TeachPanel {
        height: auto; max-height: 14; display: none; padding: 0 1;
        border-top: heavy $accent; background: $boost;
    }
    TeachPanel.-shown { display: block; }
    """

    def show_waiting(self, progress: TuneProgress | None = None) -> None:
        """The tuner is running: how far it is (once it has reported), and how to stop."""
        self.update(
            "[b]Teach mode[/b] — finding the tuner's best schedule (cocoviz tune)…"
            f"\n{escape(progress_line(progress))} · [b]esc[/b] stops the search"
        )
        self.add_class("-shown")


def progress_line(p: TuneProgress | None) -> str:
    """`[██████░░░░] 57 candidates simulated · region 2 of 5 · 1.2 s, about 3 s left`."""
    if p is None:
        return "starting"
    if p.regions > 1:
        done = p.regions_done / p.regions
    elif p.remaining_s is not None and p.elapsed_s + p.remaining_s > 0:
        done = p.elapsed_s / (p.elapsed_s + p.remaining_s)
    else:
        done = 0.0
    if p.phase == "check":
        done = 1.0
    full = round(max(0.0, min(1.0, done)) * BAR_CELLS)
    parts = [f"[{'█' * full}{'░' * (BAR_CELLS - full)}] {p.evaluated} candidates simulated"]
    if p.regions > 1:
        parts.append(f"region {min(p.regions_done + 1, p.regions)} of {p.regions}")
    if p.phase == "check":
        parts.append("checking the best on the whole program")
    left = f", about {format_time(p.remaining_s)} left" if p.remaining_s is not None else ""
    parts.append(f"{format_time(p.elapsed_s)}{left}")
    return " · ".join(parts)


class TeachMode(KeyModel):
    """The App's teach mode (mixed into `CocovizApp`, which has the workbench `wb`, the
    step and redraw methods these call, and a `TeachPanel`)."""

    def action_teach(self) -> None:
        if self.wb.teach_waiting:
            self.action_cancel_tune()
            return
        self._set_teaching(not self.wb.teaching)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_tune":  # shown in the footer only while the tuner runs
            return self.wb.teach_waiting
        return True

    def _set_teaching(self, on: bool) -> None:
        job = self.wb.best_job() if on else None
        if job is not None:  # the tuner's best is taught: found first, in a worker
            self.wb.teach_waiting = True
            self.query_one(TeachPanel).show_waiting()
            self.refresh_bindings()
            self._relayout()
            self._tune_best(job)
            return
        mode = self.wb.compare_mode
        if self.wb.set_teaching(on):
            self._after_step()
        elif self.wb.compare_mode != mode or self.wb.timelines_to_simulate():
            self._start_sim()
        self._refresh_teach()

    @work(thread=True, exclusive=True, group="tune", exit_on_error=False, description="tune")
    def _tune_best(self, program: Program) -> None:
        worker = get_current_worker()
        shown_at = -PROGRESS_EVERY_S

        def progress(p: TuneProgress) -> None:
            nonlocal shown_at
            now = time.monotonic()
            if now - shown_at >= PROGRESS_EVERY_S and not worker.is_cancelled:
                shown_at = now
                self.call_from_thread(self._tune_progress, program, p)

        best = self.wb.run_best(program, progress=progress, stop=lambda: worker.is_cancelled)
        if not worker.is_cancelled:  # cancelled: `action_cancel_tune` has said so
            self.call_from_thread(self._tuned, program, best)

    def _tune_progress(self, program: Program, p: TuneProgress) -> None:
        if self.wb.teach_waiting and program is self.wb.base:
            self.query_one(TeachPanel).show_waiting(p)

    def _tuned(self, program: Program, best: Candidate | NoBest) -> None:
        self.wb.store_best(program, best)
        if isinstance(best, NoBest):
            self.notify(escape(best.message), title="teach mode", severity="warning")
        if self.wb.teach_waiting and program is self.wb.base:
            self._set_teaching(True)
        elif not self.wb.teach_waiting:  # a stopped search: the panel goes
            self._refresh_teach()
            self._relayout()
        self.refresh_bindings()

    def action_cancel_tune(self) -> None:
        """Stop the search for the tuner's best (`escape` while teach mode waits for it):
        teach mode does not start, and asking again searches again."""
        if not self.wb.teach_waiting:
            return
        self.workers.cancel_group(self, "tune")
        self.wb.teach_waiting = False
        self.notify(
            "the tuner was stopped before it had tried every schedule: teach mode did not "
            "start (t searches again)",
            title="teach mode",
            severity="warning",
        )
        self._refresh_teach()
        self.refresh_bindings()
        self._relayout()

    def action_teach_next(self) -> None:
        if self.wb.teach_waiting:
            return
        if not self.wb.teaching:
            self._set_teaching(True)
            return
        if self.wb.session is None:
            return
        if self.wb.teach_finished:
            self.notify(escape(f"that was the last step: {self.wb.teach_goal()}"))
            return
        outcome = self.wb.teach_next()
        if outcome is not None:
            self._stepped(outcome)

    def action_teach_prev(self) -> None:
        if self.wb.teaching:
            self.action_undo()

    def _refresh_teach(self) -> None:
        panel = self.query_one(TeachPanel)
        panel.set_class(self.wb.teaching, "-shown")
        if not self.wb.teaching:
            return
        note = self.wb.teach_note()
        if not note.total:
            panel.update("This program has no schedule steps to teach. Press t to leave.")
            return
        goal = escape(note.goal)
        head = f"[b]Teach mode[/b] — step {note.position} of {note.total}, towards {goal}"
        if self.wb.user_steps != self.wb.applied_steps:
            head += " · your own steps come back when you leave (t)"
        if not note.program:
            body = NO_PROGRAM
        elif note.step is None:
            body = f"{escape(note.text)}\n\nFirst step: [b]{escape(note.next_step or '')}[/b]"
        else:
            nxt = (
                f"\n\nNext: [b]{escape(note.next_step)}[/b] (n)"
                if note.next_step is not None
                else f"\n\nThat was the last step: this is {goal}."
            )
            body = f"[b]{escape(note.step)}[/b]\n{escape(note.text)}{nxt}"
        panel.update(f"{head}\n{body}")
