"""Teach mode in the app: `t` turns it on and off, `n` and `p` walk its steps, and the
panel under the panes explains each with the model's numbers.

With no schedule named (`cocoviz tui FILE --teach` without `--schedule`) it walks to the
tuner's best schedule, found first in a worker (`cocoviz.schedule.tune.tune`, as
`cocoviz tune` ranks it); it runs in a session of its own beside the user's steps, which
come back when it is left (`cocoviz.workbench.Workbench.set_teaching`). The words are
`cocoviz.workbench.teach`'s.
"""

from __future__ import annotations

from rich.markup import escape
from textual import work
from textual.widgets import Static
from textual.worker import get_current_worker

from cocoviz.ir.nodes import Program
from cocoviz.schedule.tune import Candidate
from cocoviz.tui.keys import KeyModel
from cocoviz.workbench import NO_PROGRAM


class TeachPanel(Static):
    """Teach mode's explanation of the current step."""

    DEFAULT_CSS = """
    TeachPanel {
        height: auto; max-height: 14; display: none; padding: 0 1;
        border-top: heavy $accent; background: $boost;
    }
    TeachPanel.-shown { display: block; }
    """

    def show_waiting(self) -> None:
        self.update("[b]Teach mode[/b] — finding the tuner's best schedule (cocoviz tune)…")
        self.add_class("-shown")


class TeachMode(KeyModel):
    """The App's teach mode (mixed into `CocovizApp`, which has the workbench `wb`, the
    step and redraw methods these call, and a `TeachPanel`)."""

    def action_teach(self) -> None:
        self._set_teaching(not self.wb.teaching)

    def _set_teaching(self, on: bool) -> None:
        job = self.wb.best_job() if on else None
        if job is not None:  # the tuner's best is taught: found first, in a worker
            self.wb.teach_waiting = True
            self.query_one(TeachPanel).show_waiting()
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
        best = self.wb.run_best(program, stop=lambda: worker.is_cancelled)
        self.call_from_thread(self._tuned, program, best)

    def _tuned(self, program: Program, best: Candidate | str) -> None:
        self.wb.store_best(program, best)
        if isinstance(best, str):
            self.notify(best, title="teach mode", severity="warning")
        if self.wb.teach_waiting and program is self.wb.base:
            self._set_teaching(True)

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
