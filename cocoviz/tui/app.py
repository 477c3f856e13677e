"""The cocoviz terminal UI: one screen to edit a program, step its schedule, and see
the graph, the timeline, the cost and the code change.

`create_app` is the one factory the CLI (`cocoviz tui`, bare `cocoviz`) and the tests
use. The app owns the program and its step history; widgets display what they are
given and post messages; parsing, simulation and code generation run in workers, and
an exception in one is shown in an error panel while the app keeps running.
"""

from __future__ import annotations

import shlex
import time
import traceback
from collections.abc import Iterable
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Container, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from cocoviz import samples
from cocoviz.emit.lower import EmitError
from cocoviz.errors import CocovizError
from cocoviz.ir.nodes import Program
from cocoviz.ir.summary import summarize
from cocoviz.tui import backend, state, teach
from cocoviz.tui.backend import Emitted, History, PaletteEntry
from cocoviz.tui.timeline_rows import TimelineRows, format_time
from cocoviz.tui.widgets.code import CodeView
from cocoviz.tui.widgets.cost import CostSummary
from cocoviz.tui.widgets.dialogs import PathDialog, RestoreDialog
from cocoviz.tui.widgets.emit_dialog import EmitDialog, EmitRequest
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.help import HelpScreen
from cocoviz.tui.widgets.history import HistoryList
from cocoviz.tui.widgets.palette import StepPalette
from cocoviz.tui.widgets.source import SourceEditor
from cocoviz.tui.widgets.timeline import TimelineView

NARROW = 120  # below this many columns the panes share the screen in a 2×2 grid
COMPARE_MODES = ("off", "previous", "unscheduled")
NO_PROGRAM = "no program: fix the error in the source"


class ErrorPanel(Static):
    """An unexpected failure in a worker, shown until dismissed (click or `x`)."""

    DEFAULT_CSS = """
    ErrorPanel {
        dock: bottom; height: auto; max-height: 12; display: none;
        background: $error 30%; border-top: heavy $error; padding: 0 1;
    }
    ErrorPanel.-shown { display: block; }
    """

    def show_error(self, title: str, detail: str) -> None:
        self.update(f"[b]{title}[/b] — press x to dismiss\n{detail}")
        self.add_class("-shown")

    def on_click(self) -> None:
        self.remove_class("-shown")


class TeachPanel(Static):
    """Teach mode's explanation of the current step."""

    DEFAULT_CSS = """
    TeachPanel {
        height: auto; max-height: 14; display: none; padding: 0 1;
        border-top: heavy $accent; background: $boost;
    }
    TeachPanel.-shown { display: block; }
    """


class CocovizApp(App[None]):
    """Edit a program, step its schedule, watch graph, timeline, cost and code."""

    TITLE = "cocoviz"
    CSS_PATH = "app.tcss"
    AUTO_FOCUS = "GraphView"
    """The graph, not the editor, has the focus at start, so letter keys are commands."""

    BINDINGS = [
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("u", "undo", "Undo step"),
        Binding("U,ctrl+r", "redo", "Redo step", key_display="U"),
        Binding("b", "compare", "Before/after"),
        Binding("e", "emit", "Emit"),
        Binding("t", "teach", "Teach"),
        Binding("n", "teach_next", "Next lesson", show=False),
        Binding("p", "teach_prev", "Previous lesson", show=False),
        Binding("c", "copy_command", "Copy as command", show=False),
        Binding("ctrl+s", "save_sched", "Save .sched", show=False),
        Binding("x", "dismiss_error", "Dismiss error", show=False),
        Binding("i", "edit", "Edit source", show=False),
        Binding("g", "focus_graph", "Focus graph", show=False),
        Binding("z", "zoom_pane", "Zoom pane", show=False),
        Binding("ctrl+o", "view('code')", "Code view", show=False),
        Binding("ctrl+l", "view('timeline')", "Timeline view", show=False),
        Binding("f12", "screenshot", "Save screenshot", show=False),
        *[
            Binding(str(k), f"palette_key({k})", f"Apply step {k} of the palette", show=False)
            for k in range(1, 10)
        ],
    ]

    selected: reactive[str | None] = reactive(None, init=False)
    """The selected stage, shared by graph, source, timeline and palette."""

    compare_mode: reactive[str] = reactive("off", init=False)
    """Timeline comparison: off, against the previous step, or against the unscheduled."""

    teaching: reactive[bool] = reactive(False, init=False)
    """Whether teach mode is on."""

    def __init__(
        self,
        text: str,
        *,
        label: str,
        key: str,
        command_file: str,
        file_path: Path | None = None,
        steps: list[str] | None = None,
        teach_steps: list[str] | None = None,
        teach_mode: bool = False,
        hw: str | None = None,
        state_root: Path | None = None,
        target: str = "cuda",
    ) -> None:
        super().__init__()
        self.initial_text = text
        self.label = label
        self.key = key
        self.command_file = command_file
        self.file_path = file_path
        self.initial_steps = list(steps or [])
        self.teach_steps_given = teach_steps
        self.start_teaching = teach_mode
        self.hw = hw or backend.default_hw()
        self.state_root = state_root
        self.target = target  # of the code pane and the emit dialog: "cuda" or "cpu"

        self.text = text
        self.base: Program | None = None  # the last program that parsed
        self.history: History | None = None
        self.failed: tuple[str, str] | None = None
        self.teach_steps: list[str] = []
        self._parse_gen = 0
        self._timelines: dict[int, tuple[Program, TimelineRows]] = {}
        self._code: dict[tuple[int, str], tuple[Program, Emitted | str]] = {}
        """Emitted files by (step, target), or why there are none (a "not supported")."""
        self._sim_note = ""
        self.last_emit: tuple[Emitted, backend.WriteResult] | None = None
        """What the emit dialog last wrote (the tree and the writer's report)."""
        self.timeline_drawn_at = 0.0  # perf_counter() when a new timeline reached the screen

    # --- layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Container(id="main"):
            with Vertical(id="left", classes="pane"):
                yield SourceEditor(self.initial_text, id="source")
            with Vertical(id="center", classes="pane"):
                yield GraphView(id="graph")
            with Vertical(id="side", classes="pane"):
                yield CostSummary(id="cost")
                yield StepPalette(id="palette")
                yield HistoryList(id="history")
            with TabbedContent(id="views", initial="tab-timeline"):
                with TabPane("timeline", id="tab-timeline"):
                    yield TimelineView(id="timeline")
                with TabPane("code", id="tab-code"):
                    yield CodeView(id="code")
        yield TeachPanel(id="teach")
        yield ErrorPanel(id="error")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#left").border_title = f"source · {self.label}"
        self.query_one("#center").border_title = "graph"
        self.query_one("#cost").border_title = "cost"
        self.query_one("#palette").border_title = "steps"
        self.query_one("#history").border_title = "history"
        self._apply_size(self.size.width)
        self.query_one(GraphView).focus()
        self._start_parse(self.initial_text, steps=self.initial_steps, first=True)

    def on_resize(self, event: object) -> None:
        self._apply_size(self.size.width)

    def _apply_size(self, width: int) -> None:
        narrow = width < NARROW
        self.query_one("#main").set_class(narrow, "-narrow")
        cost = self.query_one(CostSummary)
        if cost.compact != narrow:
            cost.compact = narrow
            self._refresh_cost()

    # --- parsing -----------------------------------------------------------------------
    def _start_parse(self, text: str, steps: list[str] | None = None, first: bool = False) -> None:
        self._parse_gen += 1
        self._parse(text, self._parse_gen, steps, first)

    @work(thread=True, exclusive=True, group="parse", exit_on_error=False, description="parse")
    def _parse(self, text: str, gen: int, steps: list[str] | None, first: bool) -> None:
        try:
            program: Program | None = backend.parse(text, self.label)
            error: CocovizError | None = None
        except CocovizError as err:
            program, error = None, err
        self.call_from_thread(self._parsed, text, gen, program, error, steps, first)

    def _parsed(
        self,
        text: str,
        gen: int,
        program: Program | None,
        error: CocovizError | None,
        steps: list[str] | None,
        first: bool,
    ) -> None:
        if gen != self._parse_gen:
            return  # a newer text is being parsed
        self.text = text
        editor = self.query_one(SourceEditor)
        if error is not None:
            editor.diagnostics = error.diagnostics
            self.query_one("#center").border_subtitle = "showing the last program that parsed"
            self._autosave()
            return
        assert program is not None
        editor.diagnostics = ()
        editor.status = (
            f"ok: {program.name}, {len(program.stages)} stages on {program.grid.world} ranks"
        )
        self.query_one("#center").border_subtitle = ""
        replay = (
            steps
            if steps is not None
            else (self.history.steps[: self.history.index] if self.history else [])
        )
        self.base = program
        self._timelines.clear()
        self._code.clear()
        self.failed = None
        self.history = History(program, self.hw)
        for s in replay:
            try:
                self.history.apply(s)
            except CocovizError as err:
                self.failed = (s, err.message)
                break
        if first:
            self.teach_steps = (
                self.teach_steps_given
                if self.teach_steps_given is not None
                else backend.schedule_steps(program, None)
            )
            self._offer_autosave()
            if self.start_teaching:
                self.teaching = True
        if self.selected is None or not program.has_stage(self.selected):
            self.selected = self._default_selection()
        self._refresh_all()
        self._autosave()

    def _default_selection(self) -> str | None:
        program = self.program
        if program is None or not program.stages:
            return None
        for s in program.stages:
            if s.is_collective:
                return s.name
        return program.stages[0].name

    @property
    def program(self) -> Program | None:
        """The program at the current step."""
        if self.history is not None:
            return self.history.current
        return self.base

    # --- refreshing the panes ----------------------------------------------------------
    def _refresh_all(self) -> None:
        program = self.program
        graph = self.query_one(GraphView)
        graph.show(program, "no program: fix the error in the source")
        if (
            self.selected is not None
            and program is not None
            and not program.has_stage(self.selected)
        ):
            self.selected = self._default_selection()
        graph.selected = self.selected
        self._refresh_history()
        self._refresh_palette()
        self._refresh_cost()
        self._refresh_teach()
        self._start_sim()
        if self.query_one(TabbedContent).active == "tab-code":
            self._start_code()

    def _refresh_history(self) -> None:
        hist = self.query_one(HistoryList)
        if self.history is None:
            hist.show([], 0, None)
            return
        hist.show(self.history.steps, self.history.index, self.failed)

    def _refresh_palette(self) -> None:
        palette = self.query_one(StepPalette)
        if self.history is None:
            palette.show([], NO_PROGRAM)
            return
        if self.selected is None:
            palette.show([], "select a stage in the graph")
            return
        try:
            entries: list[PaletteEntry] = self.history.legal(self.selected)
        except CocovizError as err:
            palette.show([], err.message)
            return
        palette.show(entries, f"for {self.selected}:")

    def _refresh_cost(self) -> None:
        program = self.program
        cur = self._timeline_for(self.history.index if self.history else 0)
        base = self._timeline_for(0)
        self.query_one(CostSummary).show(
            summarize(program) if program is not None else None,
            cur.figures if cur else None,
            base.figures if base else None,
            self._sim_note or ("simulating…" if program is not None else ""),
            self.hw,
        )

    def _timeline_for(self, index: int) -> TimelineRows | None:
        hit = self._timelines.get(index)
        if hit is None or self.history is None and index != 0:
            return None
        program = self._program_at(index)
        return hit[1] if program is not None and hit[0] is program else None

    def _program_at(self, index: int) -> Program | None:
        if self.history is None:
            return self.base if index == 0 else None
        return self.history.program_at(index)

    def _compare_index(self) -> int | None:
        cur = self.history.index if self.history else 0
        if self.compare_mode == "previous":
            return cur - 1 if cur > 0 else None
        if self.compare_mode == "unscheduled":
            return 0 if cur > 0 else None
        return None

    def _start_sim(self) -> None:
        wanted = [self.history.index if self.history else 0, 0]
        c = self._compare_index()
        if c is not None:
            wanted.append(c)
        todo = []
        for i in dict.fromkeys(wanted):
            p = self._program_at(i)
            if p is not None and self._timeline_for(i) is None:
                todo.append((i, p))
        if todo:
            self._simulate(todo)
        else:
            self._show_timeline()

    @work(thread=True, exclusive=True, group="sim", exit_on_error=False, description="simulate")
    def _simulate(self, todo: list[tuple[int, Program]]) -> None:
        results: list[tuple[int, Program, TimelineRows]] = []
        note = ""
        for i, p in todo:
            try:
                results.append((i, p, backend.simulate(p, self.hw)))
            except CocovizError as err:
                note = f"cannot simulate: {err.message}"
                break
        self.call_from_thread(self._simulated, results, note)

    def _simulated(self, results: list[tuple[int, Program, TimelineRows]], note: str) -> None:
        for i, p, rows in results:
            self._timelines[i] = (p, rows)
        self._sim_note = note
        self._show_timeline()
        self._refresh_cost()
        self._refresh_teach()

    def _show_timeline(self) -> None:
        view = self.query_one(TimelineView)
        cur_i = self.history.index if self.history else 0
        cur = self._timeline_for(cur_i)
        ci = self._compare_index()
        compare = self._timeline_for(ci) if ci is not None else None
        label = "unscheduled" if ci == 0 else f"step {ci}" if ci is not None else ""
        view.label = f"step {cur_i}" if cur_i else "unscheduled"
        view.show(cur, self._sim_note or "simulating…", compare, label)
        view.selected = self.selected
        if cur is not None:
            self.call_after_refresh(self._timeline_drawn)
        title = "timeline"
        if cur is not None:
            title += f" · {format_time(cur.makespan)} on {self.hw}"
            if compare is not None:
                title += f" · vs {label}"
            elif self.compare_mode != "off" and ci is None:
                title += f" · b: vs {self.compare_mode} (from step 1)"
        self.query_one("#views").border_title = title

    def _timeline_drawn(self) -> None:
        self.timeline_drawn_at = time.perf_counter()

    def _start_code(self) -> None:
        """Emit the current and the previous step for the code pane's target (cached)."""
        if self.base is None:
            self._show_code()
            return
        i = self.history.index if self.history else 0
        todo = []
        for j in (i, i - 1):
            p = self._program_at(j) if j >= 0 else None
            hit = self._code.get((j, self.target))
            if p is not None and (hit is None or hit[0] is not p):
                steps = self.history.steps[:j] if self.history else []
                todo.append((j, p, steps))
        if todo:
            self._emit_code(self.base, self.target, todo)
        else:
            self._show_code()

    @work(thread=True, exclusive=True, group="code", exit_on_error=False, description="emit")
    def _emit_code(
        self, unscheduled: Program, target: str, todo: list[tuple[int, Program, list[str]]]
    ) -> None:
        results: list[tuple[int, Program, Emitted | str]] = []
        for j, p, steps in todo:
            try:
                out: Emitted | str = backend.emitted_files(
                    p,
                    unscheduled,
                    target,
                    steps,
                    self.hw,  # type: ignore[arg-type]
                )
            except EmitError as err:
                out = f"not supported by the {target} emitter: {err.message}" + (
                    f" (hint: {err.hint})" if err.hint else ""
                )
            except CocovizError as err:
                out = f"cannot emit: {err.message}"
            results.append((j, p, out))
        self.call_from_thread(self._code_done, target, results)

    def _code_done(self, target: str, results: list[tuple[int, Program, Emitted | str]]) -> None:
        for j, p, out in results:
            self._code[(j, target)] = (p, out)
        self._show_code()

    def _show_code(self) -> None:
        view = self.query_one(CodeView)
        if self.base is None:
            view.show(None, None, self.target, NO_PROGRAM)
            return
        i = self.history.index if self.history else 0
        cur = self._code.get((i, self.target))
        prev = self._code.get((i - 1, self.target)) if i > 0 else None
        if cur is None or cur[0] is not self._program_at(i):
            view.show(None, None, self.target, f"generating the {self.target} code…")
            return
        if isinstance(cur[1], str):
            view.show(None, None, self.target, cur[1])
            return
        previous = prev[1] if prev is not None and isinstance(prev[1], Emitted) else None
        view.show(cur[1], previous, self.target, "")

    @on(CodeView.TargetChanged)
    def _code_target(self, event: CodeView.TargetChanged) -> None:
        self.target = event.target
        self._start_code()

    def _refresh_teach(self) -> None:
        panel = self.query_one(TeachPanel)
        panel.set_class(self.teaching, "-shown")
        if not self.teaching:
            return
        steps = self.teach_steps
        if not steps:
            panel.update("This program has no schedule block to teach. Press t to leave.")
            return
        i = self.history.index if self.history else 0
        head = f"[b]Teach mode[/b] — step {i} of {len(steps)}"
        if self.history is None:
            panel.update(f"{head}\n{NO_PROGRAM}")
            return
        if i == 0:
            body = teach.INTRO + f"\n\nFirst step: [b]{steps[0]}[/b]"
        else:
            step = self.history.steps[i - 1]
            before, after = self.history.program_at(i - 1), self.history.program_at(i)
            tb, ta = self._timeline_for(i - 1), self._timeline_for(i)
            if tb is None and ta is not None and i - 1 not in self._timelines:
                self._simulate([(i - 1, before)])
            text = teach.explain(
                step, before, after, tb.figures if tb else None, ta.figures if ta else None
            )
            nxt = (
                f"\n\nNext: [b]{steps[i]}[/b] (n)"
                if i < len(steps)
                else "\n\nThat was the last step."
            )
            body = f"[b]{step}[/b]\n{text}{nxt}"
        panel.update(f"{head}\n{body}")

    # --- selection ---------------------------------------------------------------------
    def watch_selected(self, name: str | None) -> None:
        self.query_one(GraphView).selected = name
        self.query_one(TimelineView).selected = name
        line = None
        if name is not None and self.base is not None and self.base.has_stage(name):
            span = self.base.stage(name).span
            line = span.line if span is not None else None
        editor = self.query_one(SourceEditor)
        editor.selected_line = line
        if line is not None and not editor.text_area.has_focus:
            editor.go_to_line(line)
        self._refresh_palette()

    @on(GraphView.StageSelected)
    @on(TimelineView.StagePicked)
    def _select(self, event: GraphView.StageSelected | TimelineView.StagePicked) -> None:
        program = self.program
        if program is not None and program.has_stage(event.name):
            self.selected = event.name

    @on(SourceEditor.CursorOnLine)
    def _cursor_line(self, event: SourceEditor.CursorOnLine) -> None:
        if self.base is None:
            return
        for s in self.base.stages:
            if s.span is not None and s.span.line == event.line:
                if self.program is not None and self.program.has_stage(s.name):
                    self.selected = s.name
                return

    @on(SourceEditor.Edited)
    def _edited(self, event: SourceEditor.Edited) -> None:
        if event.text != self.text:
            self._start_parse(event.text)

    # --- steps -------------------------------------------------------------------------
    def apply_step(self, step: str) -> bool:
        """Apply a step; a failure is shown in the history and a notification."""
        if self.history is None:
            self.notify(NO_PROGRAM, severity="warning")
            return False
        try:
            self.history.apply(step)
        except CocovizError as err:
            self.failed = (step, err.message + (f" (hint: {err.hint})" if err.hint else ""))
            self._refresh_history()
            self.notify(f"{step}: {err.message}", title="step not applied", severity="error")
            return False
        self.failed = None
        self._after_step()
        return True

    def _after_step(self) -> None:
        self._refresh_all()
        self._autosave()

    @on(StepPalette.StepChosen)
    def _chosen(self, event: StepPalette.StepChosen) -> None:
        self.apply_step(event.step)

    @on(HistoryList.JumpTo)
    def _jump(self, event: HistoryList.JumpTo) -> None:
        if self.history is not None and event.index != self.history.index:
            self.history.jump(event.index)
            self._after_step()

    def action_palette_key(self, n: int) -> None:
        step = self.query_one(StepPalette).step_for_key(n)
        if step is None:
            self.notify(f"no step {n} in the palette", severity="warning")
            return
        self.apply_step(step)

    def action_undo(self) -> None:
        if self.history is None or not self.history.undo():
            self.notify("nothing to undo", severity="warning")
            return
        self._after_step()

    def action_redo(self) -> None:
        if self.history is None or not self.history.redo():
            self.notify("nothing to redo", severity="warning")
            return
        self._after_step()

    def command_line(self) -> str:
        """The `cocoviz apply` command equivalent to the current step."""
        steps = self.history.steps[: self.history.index] if self.history else []
        parts = ["cocoviz", "apply", shlex.quote(self.command_file)]
        parts += [shlex.quote(s) for s in steps]
        return " ".join(parts)

    def action_copy_command(self) -> None:
        cmd = self.command_line()
        self.copy_to_clipboard(cmd)
        self.notify(cmd, title="copied to the clipboard")

    def action_save_sched(self) -> None:
        if self.history is None:
            self.notify(NO_PROGRAM, severity="warning")
            return
        stem = self.base.name if self.base else "schedule"
        self.push_screen(
            PathDialog("Save the steps as a .sched file", f"{stem}.sched"), self._save_to
        )

    def _save_to(self, path: str | None) -> None:
        if not path or self.history is None:
            return
        try:
            self.history.save(Path(path))
        except (OSError, CocovizError) as err:
            self.notify(str(err), title="not saved", severity="error")
            return
        self.notify(f"saved {self.history.index} steps to {path}")

    # --- compare, teach, emit ----------------------------------------------------------
    def action_compare(self) -> None:
        i = COMPARE_MODES.index(self.compare_mode)
        self.compare_mode = COMPARE_MODES[(i + 1) % len(COMPARE_MODES)]

    def watch_compare_mode(self, mode: str) -> None:
        # At the unscheduled program there is nothing to compare with; the timeline's
        # title says what is compared once there is.
        self._start_sim()

    def action_teach(self) -> None:
        self.teaching = not self.teaching

    def watch_teaching(self, on: bool) -> None:
        if on and self.history is not None and self.teach_steps:
            # Teach from the start: the unscheduled program, then each step of the block.
            if self.history.steps[: self.history.index] != self.teach_steps[: self.history.index]:
                self.history.jump(0)
                self._after_step()
        if on and self.compare_mode == "off":
            self.compare_mode = "previous"
        self._refresh_teach()

    def action_teach_next(self) -> None:
        if not self.teaching:
            self.teaching = True
            return
        if self.history is None:
            return
        i = self.history.index
        if i >= len(self.teach_steps):
            self.notify("that was the last step of the schedule")
            return
        if (
            self.history.steps[:i] == self.teach_steps[:i]
            and len(self.history.steps) > i
            and self.history.steps[i] == self.teach_steps[i]
        ):
            self.history.redo()
            self._after_step()
        else:
            self.apply_step(self.teach_steps[i])

    def action_teach_prev(self) -> None:
        if self.teaching:
            self.action_undo()

    def action_emit(self) -> None:
        if self.program is None:
            self.notify("fix the source first", severity="warning")
            return
        default = f"./{self.program.name}-{self.target}"
        self.push_screen(EmitDialog(default, self.target), self._emit_requested)

    def _emit_requested(self, req: EmitRequest | None) -> None:
        if req is None or self.program is None or self.base is None:
            return
        steps = self.history.steps[: self.history.index] if self.history else []
        self._emit(self.program, self.base, steps, req)

    @work(thread=True, group="emit", exit_on_error=False, description="emit to a directory")
    def _emit(
        self, program: Program, unscheduled: Program, steps: list[str], req: EmitRequest
    ) -> None:
        try:
            out, res = backend.emit_to(
                Path(req.directory),
                program,
                unscheduled,
                req.target,  # type: ignore[arg-type]
                steps,
                self.hw,
                req.force,
            )
        except EmitError as err:
            self.call_from_thread(
                self.notify,
                err.message + (f"\nhint: {err.hint}" if err.hint else ""),
                title=f"not supported by the {req.target} emitter",
                severity="error",
                timeout=12,
            )
            return
        except CocovizError as err:  # the writer's refusal of a foreign directory
            self.call_from_thread(
                self.notify,
                err.message + (f"\nhint: {err.hint}" if err.hint else ""),
                title="not emitted",
                severity="error",
                timeout=12,
            )
            return
        except OSError as err:
            self.call_from_thread(
                self.notify,
                f"{req.directory}: {err.strerror or err}",
                title="not emitted",
                severity="error",
                timeout=12,
            )
            return
        summary = f"{len(res.written)} written, {len(res.unchanged)} unchanged" + (
            f", {len(res.removed)} removed" if res.removed else ""
        )
        self.last_emit = (out, res)
        self.call_from_thread(
            self.notify,
            f"{res.directory} ({req.target}): {summary}\nbuild: make -C {res.directory}",
            title="emitted",
        )

    # --- autosave ----------------------------------------------------------------------
    def _autosave(self) -> None:
        steps = tuple(self.history.steps[: self.history.index]) if self.history else ()
        try:
            state.write(state.Autosave(self.key, self.text, steps, time.time()), self.state_root)
        except OSError as err:
            self.query_one(ErrorPanel).show_error("autosave failed", str(err))

    def _offer_autosave(self) -> None:
        saved = state.read(self.key, self.state_root)
        if saved is None:
            return
        if saved.source == self.initial_text and list(saved.steps) == self.initial_steps:
            return

        def restore(ok: bool | None) -> None:
            if not ok:
                return
            self.query_one(SourceEditor).set_text(saved.source)
            self._start_parse(saved.source, steps=list(saved.steps))

        self.push_screen(RestoreDialog(self.label, saved.describe()), restore)

    # --- workers -----------------------------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state is WorkerState.ERROR:
            err = event.worker.error
            detail = "".join(traceback.format_exception_only(type(err), err)).strip() if err else ""
            self.query_one(ErrorPanel).show_error(
                f"internal error in {event.worker.group or 'a worker'} (a cocoviz bug)",
                detail + "\nThe app keeps running; please report this with the program.",
            )
            if event.worker.group == "sim":
                self._sim_note = "the simulation failed (see the error panel)"
                self._refresh_cost()

    def action_dismiss_error(self) -> None:
        self.query_one(ErrorPanel).remove_class("-shown")

    # --- focus, views, help --------------------------------------------------------------
    def action_edit(self) -> None:
        self.query_one(SourceEditor).text_area.focus()

    def action_focus_graph(self) -> None:
        self.query_one(GraphView).focus()

    def action_view(self, which: str) -> None:
        self.query_one(TabbedContent).active = f"tab-{which}"

    @on(TabbedContent.TabActivated)
    def _tab(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "tab-code":
            self._start_code()

    def action_zoom_pane(self) -> None:
        screen = self.screen
        if screen.maximized is not None:
            screen.minimize()
        elif screen.focused is not None:
            screen.maximize(screen.focused)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.key_descriptions()))

    def action_screenshot(self) -> None:
        path = self.save_screenshot(path=".")
        self.notify(f"saved {path}")

    def key_descriptions(self) -> list[tuple[str, str]]:
        out = []
        seen = set()
        for b in self.BINDINGS:
            assert isinstance(b, Binding)
            if b.action.startswith("palette_key"):
                continue
            keys = b.key_display or b.key.replace("question_mark", "?")
            if b.description not in seen:
                seen.add(b.description)
                out.append((keys.replace(",", " / "), b.description))
        out.append(("1 … 9", "apply that step of the palette"))
        out.append(("tab / shift+tab", "move between panes"))
        out.append(("ctrl+p", "command palette: every action by name"))
        out.append(("ctrl+q", "quit"))
        return out

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in self.BINDINGS:
            assert isinstance(b, Binding)
            if b.action.startswith("palette_key"):
                continue
            action = b.action

            async def run(action: str = action) -> None:
                await self.run_action(action)

            yield SystemCommand(b.description, f"key: {b.key_display or b.key}", run)


def create_app(
    file: str | Path | None = None,
    *,
    text: str | None = None,
    schedule: str | None = None,
    teach_mode: bool = False,
    hw: str | None = None,
    state_root: Path | None = None,
    target: str = "cuda",
) -> CocovizApp:
    """The app for a file, a sample name, or the default sample (`file` None).

    `schedule` (a block name or a `.sched` file) is applied at start; in teach mode the
    schedule to teach is that block (the last block when none is given) and the app
    starts unscheduled. Raises CocovizError when the file cannot be read.
    """
    file_path: Path | None = None
    if file is None:
        name = samples.DEFAULT
        text = samples.text(name) if text is None else text
        label, key, command_file = f"{name}.coco", f"sample:{name}", name
    else:
        p = Path(file)
        stem = p.name[: -len(".coco")] if p.name.endswith(".coco") else p.name
        if not p.exists() and "/" not in str(file) and stem in samples.names():
            text = samples.text(stem) if text is None else text
            label, key, command_file = f"{stem}.coco", f"sample:{stem}", stem
        else:
            if text is None:
                from cocoviz.ir.lower import read_source

                text = read_source(p)
            file_path = p
            label, key, command_file = p.name, str(p.resolve()), str(file)
    steps: list[str] = []
    teach_steps: list[str] | None = None
    if schedule:
        if schedule.endswith(".sched"):
            chosen = backend.read_sched_file(Path(schedule))
        else:
            chosen = backend.schedule_steps(backend.parse(text, label), schedule)
        if teach_mode:
            teach_steps = chosen
        else:
            steps = chosen
    return CocovizApp(
        text,
        label=label,
        key=key,
        command_file=command_file,
        file_path=file_path,
        steps=steps,
        teach_steps=teach_steps,
        teach_mode=teach_mode,
        hw=hw,
        state_root=state_root,
        target=target,
    )
