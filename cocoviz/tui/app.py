"""The cocoviz terminal UI: one screen to edit a program, step its schedule, and see
the graph, the timeline, the cost and the code change.

`create_app` is the one factory the CLI (`cocoviz tui`, bare `cocoviz`) and the tests
use. The app is layout, key bindings and message wiring: the program, its step history,
the timeline and code of each step, the comparison, teach mode and the autosave are a
`cocoviz.workbench.Workbench`, which the app draws. Widgets display what they are
given and post messages; parsing, simulation and code generation run in workers (the
workbench's worker-safe methods), and an exception in one is shown in an error panel
while the app keeps running. A step redraws the screen first (graph, steps, history,
cost); the simulation and the code generation start once it is drawn, and the garbage
collector waits until the timeline is (`bench/bench_tui.py` times both). The panes are sized by `cocoviz.tui.pane_layout` from the
terminal's size and their content (docs/architecture.md, layer 9).
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Container, Vertical
from textual.reactive import var
from textual.widgets import Static, TabbedContent, TabPane, Tabs
from textual.worker import Worker, WorkerState

from cocoviz.emit.emitter import Emitted
from cocoviz.errors import CocovizError
from cocoviz.ir.nodes import Program
from cocoviz.ir.summary import Summary, summarize
from cocoviz.schedule import PaletteEntry, StepFailure
from cocoviz.schedule.tune import SweepResult
from cocoviz.sim.hardware import DEFAULT_PROFILE, Hardware, load_profile
from cocoviz.timefmt import format_time
from cocoviz.tui import commands, keys, offload, pane_layout
from cocoviz.tui.pane_layout import Needs, PaneLayout
from cocoviz.tui.teaching import TeachMode, TeachPanel
from cocoviz.tui.timeline_rows import TimelineRows
from cocoviz.tui.widgets.code import CodeView
from cocoviz.tui.widgets.cost import CostSummary
from cocoviz.tui.widgets.dialogs import PathDialog, RestoreDialog
from cocoviz.tui.widgets.emit_dialog import EmitDialog, EmitRequest
from cocoviz.tui.widgets.footer import KeyFooter
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.history import HistoryList
from cocoviz.tui.widgets.palette import StepPalette
from cocoviz.tui.widgets.source import SourceEditor
from cocoviz.tui.widgets.timeline import TimelineView
from cocoviz.workbench import (
    NO_PROGRAM,
    Accepted,
    CodeJob,
    CodeOptions,
    Parsed,
    Refused,
    Simulated,
    SweepJob,
    Workbench,
    Written,
    open_source,
)


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


class CocovizApp(TeachMode):
    """Edit a program, step its schedule, watch graph, timeline, cost and code."""

    TITLE = "cocoviz"
    CSS_PATH = "app.tcss"
    BINDINGS = keys.APP_BINDINGS
    COMMANDS = TeachMode.COMMANDS | commands.PROVIDERS

    selected: var[str | None] = var(None, init=False)
    """The selected stage, shared by graph, source, timeline and palette (a `var`: its
    watcher redraws what shows it, not the whole screen)."""

    def __init__(self, workbench: Workbench[TimelineRows], *, target: str = "cuda") -> None:
        super().__init__()
        self.wb = workbench
        self.code_options = CodeOptions.of(target)
        """Of the code pane and the emit dialog: the target, collectives mode and arch."""
        self.last_emit: Written | None = None
        """What the emit dialog last wrote (the tree and the writer's report)."""
        self.timeline_drawn_at = 0.0  # perf_counter() when a new timeline reached the screen
        self.side_shown = True
        self.crossover_shown = False
        """The cost pane shows the crossover sweep (`w`) instead of the figures."""
        self._timeline_title = "timeline"
        """The side column (cost, steps, history) is shown (`s` collapses it)."""
        self.layout_plan: PaneLayout | None = None
        """How the panes are placed now (`cocoviz.tui.pane_layout`)."""
        self._layout_key: tuple[PaneLayout, bool] | None = None
        self._source_need = pane_layout.source_need(workbench.source.text.splitlines())
        self._scroll_source = False
        """Whether a new selection scrolls the source to its line (not at open)."""
        self._after_redraw_pending: set[str] = set()
        """The names of the methods waiting for the next redraw (`_after_redraw`)."""
        self._gc_paused = False
        """The garbage collector is paused for a step (`_pause_gc`)."""
        self._switch_interval = sys.getswitchinterval()
        """The interpreter's thread switch interval before the app ran (restored)."""
        self._summaries: dict[int, tuple[Program, Summary]] = {}
        """`summarize` of the programs shown last, by identity."""
        self._palettes: offload.LatestJob[tuple[Program, str], list[PaletteEntry] | str] = (
            offload.LatestJob(self, "palette", self._find_palette, self._palette_found)
        )
        """The palette of the selected stage of a large program, found in a worker."""

    @property
    def target(self) -> str:
        """The code pane's target (a name of `cocoviz.emit.targets.TARGET_NAMES`)."""
        return self.code_options.target

    # --- layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Container(id="main"):
            with Vertical(id="left", classes="pane"):
                yield SourceEditor(self.wb.source.text, id="source")
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
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#left").border_title = f"source · {self.wb.source.label}"
        self.query_one("#center").border_title = "graph"
        self.query_one("#cost").border_title = "cost"
        self.query_one("#palette").border_title = "steps"
        self.query_one("#history").border_title = "history"
        self._relayout()
        # The tabs' row is not a stop of Tab: ctrl+o and ctrl+l switch the views.
        self.query_one(TabbedContent).query_one(Tabs).can_focus = False
        self.query_one(GraphView).focus()
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, offload.SWITCH_INTERVAL_S))
        self._start_parse(self.wb.source.text, list(self.wb.source.steps))

    def on_resize(self, event: object) -> None:
        self._relayout()

    def _needs(self) -> Needs:
        drawing = self.query_one(GraphView).drawing
        return Needs(
            source_width=self._source_need,
            graph_width=(drawing.width + 1) if drawing is not None else 0,
            timeline_lines=self.query_one(TimelineView).content_lines(),
            code=self.query_one(TabbedContent).active == "tab-code",
        )

    def _relayout(self) -> None:
        """Place and size the panes for the terminal and their content (unchanged: no
        work, so the step → screen path pays nothing when the plan is the same)."""
        height = self.size.height - 1  # the footer
        for panel in (self.query_one(TeachPanel), self.query_one(ErrorPanel)):
            if panel.display and panel.has_class("-shown"):
                height -= panel.outer_size.height
        needs = self._needs()
        plan = pane_layout.plan(self.size.width, max(height, 10), needs, side=self.side_shown)
        # In the 2×2 grid the code takes the whole lower row while it shows.
        wide_code = plan.narrow and plan.side and needs.code
        if (plan, wide_code) == self._layout_key:
            return
        self._layout_key = (plan, wide_code)
        self.layout_plan = plan
        main = self.query_one("#main")
        left, side, views = (self.query_one(q) for q in ("#left", "#side", "#views"))
        main.set_class(plan.narrow, "-narrow")
        side.display = plan.side and not wide_code
        side.styles.row_span = 1
        ncols = len(plan.columns)
        main.styles.grid_size_columns = ncols
        main.styles.grid_size_rows = 2
        if plan.narrow:
            main.styles.grid_columns = " ".join(str(c) for c in plan.columns)
            left.styles.row_span = 1
            views.styles.column_span = 1 if side.display else 2
        else:
            cols = [str(c) for c in plan.columns]
            cols[1] = "1fr"  # the graph takes what is left
            main.styles.grid_columns = " ".join(cols)
            left.styles.row_span = 2
            views.styles.column_span = ncols - 1
        main.styles.grid_rows = f"1fr {plan.rows[1]}"
        self.query_one(SourceEditor).text_area.soft_wrap = plan.wrap
        cost = self.query_one(CostSummary)
        if cost.compact != plan.narrow:
            cost.compact = plan.narrow
            self._refresh_cost()

    # --- parsing -----------------------------------------------------------------------
    def _start_parse(self, text: str, steps: list[str] | None = None) -> None:
        self._parse(text, self.wb.begin_parse(text, steps))

    @work(thread=True, exclusive=True, group="parse", exit_on_error=False, description="parse")
    def _parse(self, text: str, gen: int) -> None:
        self.call_from_thread(self._parsed, gen, self.wb.parse(text))

    def _parsed(self, gen: int, parsed: Parsed) -> None:
        accepted = self.wb.accept(gen, parsed)
        if accepted is Accepted.STALE:
            return
        editor = self.query_one(SourceEditor)
        if parsed.program is None:
            editor.diagnostics = parsed.error.diagnostics if parsed.error else ()
            self.query_one("#center").border_subtitle = "showing the last program that parsed"
            self._autosave()
            return
        editor.diagnostics = ()
        self._source_need = pane_layout.source_need(parsed.text.splitlines())
        self.query_one("#center").border_subtitle = ""
        if accepted is Accepted.OPENED:
            editor.reveal_line(_first_statement(parsed.text))
            self._offer_autosave()
            if self.wb.teach_waiting:
                self._set_teaching(True)
        program = self.wb.program
        if program is not None and (self.selected is None or not program.has_stage(self.selected)):
            # The first selection leaves the source at its top (the program's header).
            self._scroll_source = accepted is not Accepted.OPENED
            self.selected = self.wb.default_selection()
        self._scroll_source = True
        self._after_step()

    # --- refreshing the panes ----------------------------------------------------------
    def _refresh_all(self) -> None:
        program = self.wb.program
        graph = self.query_one(GraphView)
        graph.show(program, NO_PROGRAM)
        self._refresh_status()
        if (
            self.selected is not None
            and program is not None
            and not program.has_stage(self.selected)
        ):
            self.selected = self.wb.default_selection()
        graph.selected = self.selected
        self._refresh_history()
        self._refresh_palette()
        self._refresh_cost()
        self._refresh_teach()
        # The simulation and the code generation start once the screen shows the step: a
        # worker thread holds the GIL for long stretches, and started before the redraw
        # it would slow the redraw down several times over. Until then the timeline pane
        # keeps the previous step's timeline and the cost pane says "simulating…".
        if self.wb.timelines_to_simulate():
            self._after_redraw(self._start_sim)
        else:
            self._show_timeline()
        if self.query_one(TabbedContent).active == "tab-code":
            self._after_redraw(self._start_code)

    def _after_redraw(self, work: Callable[[], None]) -> None:
        """Run `work` once the screen has been redrawn (once, however often asked before)."""
        if work.__name__ in self._after_redraw_pending:
            return
        self._after_redraw_pending.add(work.__name__)

        def run() -> None:
            self._after_redraw_pending.discard(work.__name__)
            work()

        self.call_after_refresh(run)

    def _refresh_status(self) -> None:
        """The line under the editor: the current step's program (its stages change with
        the steps), once the source parses."""
        program = self.wb.program
        if program is None:
            return
        at = f" at step {self.wb.position}" if self.wb.position else ""
        self.query_one(
            SourceEditor
        ).status = (
            f"ok: {program.name}{at}, {len(program.stages)} stages on {program.grid.world} ranks"
        )

    def _refresh_history(self) -> None:
        failed = self.wb.failed
        shown = (failed.step, _failure_text(failed)) if failed is not None else None
        self.query_one(HistoryList).show(self.wb.recorded_steps, self.wb.position, shown)

    def _refresh_palette(self) -> None:
        palette = self.query_one(StepPalette)
        program = self.wb.program
        if program is None:
            palette.show([], NO_PROGRAM)
            return
        if self.selected is None:
            palette.show([], "select a stage in the graph")
            return
        entries = self.wb.cached_palette(self.selected)
        if entries is None and offload.inline(len(program.stages)):
            entries = self.wb.palette(self.selected)
        if entries is None:  # a large program: found in a worker (`cocoviz.tui.offload`)
            palette.show([], f"finding the steps for {self.selected}…")
            self._palettes.request((program, self.selected))
        elif isinstance(entries, str):
            palette.show([], entries)
        else:
            palette.show(entries, f"for {self.selected}:")

    def _find_palette(self, job: tuple[Program, str]) -> list[PaletteEntry] | str:
        return self.wb.find_palette(*job)

    def _palette_found(self, job: tuple[Program, str], entries: list[PaletteEntry] | str) -> None:
        program, stage = job
        self.wb.store_palette(program, stage, entries)
        if program is self.wb.program and stage == self.selected:
            self._refresh_palette()

    def _refresh_cost(self) -> None:
        program = self.wb.program
        cost = self.query_one(CostSummary)
        if self.crossover_shown:
            job = self.wb.crossover_job()
            if job is not None:
                self._sweep(job)
            base, result = self.wb.base, self.wb.crossover()
            if base is None:
                cost.show_crossover(NO_PROGRAM, None)
            elif result is None or isinstance(result, str):
                cost.show_crossover(result, None)
            else:
                cost.show_crossover(result, base.shape_env.get(result.dim))
            return
        cur, base = self.wb.timeline(self.wb.position), self.wb.timeline(0)
        # While the step is simulated its counts are summarized with it (in the worker),
        # and the pane shows every figure once, with the timeline.
        pending = program is not None and cur is None and not self.wb.sim_note
        cost.show(
            self._summary_of(program, compute=not pending),
            cur.figures if cur else None,
            base.figures if base else None,
            self.wb.sim_note,
            self.wb.hw.name,
            pending=pending,
        )

    def _summary_of(self, program: Program | None, *, compute: bool = True) -> Summary | None:
        """`summarize(program)`, kept for the programs shown last (undo and redo); None
        when it is not known yet and not `compute`."""
        if program is None:
            return None
        hit = self._summaries.get(id(program))
        if hit is not None and hit[0] is program:
            return hit[1]
        if not compute:
            return None
        summary = summarize(program)
        self._keep_summary(program, summary)
        return summary

    def _keep_summary(self, program: Program, summary: Summary) -> None:
        if len(self._summaries) >= 16:
            del self._summaries[next(iter(self._summaries))]
        self._summaries[id(program)] = (program, summary)

    @work(thread=True, exclusive=True, group="sweep", exit_on_error=False, description="sweep")
    def _sweep(self, job: SweepJob) -> None:
        result = self.wb.run_crossover(job)
        self.call_from_thread(self._swept, job, result)

    def _swept(self, job: SweepJob, result: SweepResult | str) -> None:
        self.wb.store_crossover(job, result)
        self._refresh_cost()

    def _start_sim(self) -> None:
        todo = self.wb.timelines_to_simulate()
        if todo:
            self._simulate(todo)
        else:
            self._show_timeline()
        if self._gc_paused:
            self._after_redraw(self._resume_gc)

    @work(thread=True, exclusive=True, group="sim", exit_on_error=False, description="simulate")
    def _simulate(self, todo: list[Program]) -> None:
        simulated = self.wb.simulate(todo)
        summaries = [(p, summarize(p)) for p in todo]  # the cost pane's counts
        self.call_from_thread(self._simulated, simulated, summaries)

    def _simulated(
        self, simulated: Simulated[TimelineRows], summaries: list[tuple[Program, Summary]]
    ) -> None:
        for program, summary in summaries:
            self._keep_summary(program, summary)
        self.wb.store_timelines(simulated)
        self._show_timeline()
        self._refresh_cost()
        self._refresh_teach()

    def _show_timeline(self) -> None:
        view = self.query_one(TimelineView)
        shown = self.wb.comparison()
        cur, compare, label = shown.current, shown.compare, shown.against_label
        view.label = shown.label
        view.show(cur, self.wb.sim_note or "simulating…", compare, label)
        view.selected = self.selected
        title = "timeline"
        if cur is not None:
            self.call_after_refresh(self._timeline_drawn)
            title += f" · {format_time(cur.makespan)} on {self.wb.hw.name}"
            if compare is not None:
                title += f" · vs {label}"
            elif self.wb.compare_mode != "off" and shown.against is None:
                title += f" · b: vs {self.wb.compare_mode} (from step 1)"
        if self.query_one(TabbedContent).active != "tab-code":
            self.query_one("#views").border_title = title
        self._timeline_title = title
        self._relayout()

    def _timeline_drawn(self) -> None:
        self.timeline_drawn_at = time.perf_counter()

    def _start_code(self) -> None:
        """Emit the current and the previous step for the code pane's options (cached)."""
        jobs = self.wb.code_jobs(self.code_options)
        if jobs:
            self._emit_code(jobs)
        else:
            self._show_code()

    @work(thread=True, exclusive=True, group="code", exit_on_error=False, description="emit")
    def _emit_code(self, jobs: list[CodeJob]) -> None:
        self.call_from_thread(self._code_done, self.wb.emit_code(jobs))

    def _code_done(self, results: list[tuple[CodeJob, Emitted | str]]) -> None:
        self.wb.store_code(results)
        self._show_code()

    def _show_code(self) -> None:
        view = self.query_one(CodeView)
        opts = self.code_options
        self._code_title()
        if self.wb.base is None:
            view.show(None, None, opts, NO_PROGRAM)
            return
        code = self.wb.code(opts)
        if code.current is None:
            view.show(None, None, opts, f"generating the {opts.describe()} code…")
        elif isinstance(code.current, str):
            view.show(None, None, opts, code.current)
        else:
            view.show(code.current, code.previous, opts, "")

    def _code_title(self) -> None:
        """The views' title while the code tab shows: the code's options and their keys."""
        keys = "T target, N collectives, A arch" if self.code_options.gpu else "T target"
        self.query_one("#views").border_title = f"code · {self.code_options.describe()} · {keys}"

    @on(CodeView.OptionsChanged)
    def _code_options_changed(self, event: CodeView.OptionsChanged) -> None:
        self.code_options = event.options
        self._start_code()

    # --- selection ---------------------------------------------------------------------
    def watch_selected(self, name: str | None) -> None:
        self.query_one(GraphView).selected = name
        self.query_one(TimelineView).selected = name
        line = self.wb.source_line(name) if name is not None else None
        editor = self.query_one(SourceEditor)
        editor.selected_line = line
        if line is not None and self._scroll_source and not editor.text_area.has_focus:
            editor.go_to_line(line)
        self._refresh_palette()

    @on(GraphView.StageSelected)
    @on(TimelineView.StagePicked)
    def _select(self, event: GraphView.StageSelected | TimelineView.StagePicked) -> None:
        if self.wb.has_stage(event.name):
            self.selected = event.name

    @on(GraphView.LaidOut)
    def _laid_out(self) -> None:
        self._relayout()  # the graph's width is one of the panes' needs

    @on(SourceEditor.CursorOnLine)
    def _cursor_line(self, event: SourceEditor.CursorOnLine) -> None:
        name = self.wb.stage_on_line(event.line)
        if name is not None:
            self.selected = name

    @on(SourceEditor.Edited)
    def _edited(self, event: SourceEditor.Edited) -> None:
        if event.text != self.wb.text:
            self._start_parse(event.text)

    # --- steps -------------------------------------------------------------------------
    def apply_step(self, step: str) -> bool:
        """Apply a step; a failure is shown in the history and a notification."""
        self._pause_gc()
        if self.wb.session is None:
            self.notify(NO_PROGRAM, severity="warning")
            return False
        return self._stepped(self.wb.apply(step))

    def apply_schedule(self, steps: Sequence[str]) -> bool:
        """Apply a schedule's steps from the unscheduled program (the command palette)."""
        self._pause_gc()
        return self._stepped(self.wb.apply_from_start(steps))

    def open_program(self, file: str) -> None:
        """Open a file or a sample in place of the program (the command palette); the
        session so far is autosaved first, and offered back when it is opened again."""
        self._autosave()
        try:
            source = open_source(file)
        except CocovizError as err:
            self.notify(err.message, title="not opened", severity="error")
            return
        old = self.wb
        self.wb = Workbench(source, hw=old.hw, view=old.view, state_root=old.state_root)
        self.selected = None
        self._summaries.clear()
        self._source_need = pane_layout.source_need(source.text.splitlines())
        self.query_one(SourceEditor).set_text(source.text)
        self.query_one("#left").border_title = f"source · {source.label}"
        self._start_parse(source.text, list(source.steps))

    def _stepped(self, outcome: Program | StepFailure) -> bool:
        if isinstance(outcome, StepFailure):
            self._refresh_history()
            self.notify(
                f"{outcome.step}: {outcome.message}", title="step not applied", severity="error"
            )
            return False
        self._after_step()
        return True

    def _after_step(self) -> None:
        self._pause_gc()
        self._refresh_all()
        self._after_redraw(self._autosave)

    def _pause_gc(self) -> None:
        """Pause the cyclic garbage collector until the step's screen and timeline are
        drawn, as Textual pauses it while scrolling: with a large program's history in
        memory a full collection takes longer than the whole redraw, and it would land on
        most steps of a large program (the collector counts allocations, and a step
        allocates many). It runs once the user has the new state."""
        if not self._gc_paused and gc.isenabled():
            gc.disable()
            self._gc_paused = True
            self._after_redraw(self._resume_gc)

    def _resume_gc(self) -> None:
        """Resume the collector, unless a simulation is about to start or still runs
        (`_start_sim` and the simulation's end ask again)."""
        if "_start_sim" in self._after_redraw_pending:
            return
        if self._gc_paused and not any(
            w.group == "sim" and not w.is_finished for w in self.workers
        ):
            self._gc_paused = False
            program = self.wb.program
            if program is not None and not offload.inline(len(program.stages)):
                # A large program's objects (the steps' programs, timelines, drawings:
                # half a million on 10,000 stages) are left out of later collections: a
                # full collection walked them all, a second or more with the event loop
                # stopped. They are freed by their reference counts as ever; only cycles
                # among them would wait (`gc.freeze`, docs/architecture.md, layer 9).
                gc.freeze()
            gc.enable()

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)
        if self._gc_paused:
            self._gc_paused = False
            gc.enable()

    @on(StepPalette.StepChosen)
    def _chosen(self, event: StepPalette.StepChosen) -> None:
        self.apply_step(event.step)

    @on(HistoryList.JumpTo)
    def _jump(self, event: HistoryList.JumpTo) -> None:
        if self.wb.jump(event.index):
            self._after_step()

    def action_palette_key(self, n: int) -> None:
        step = self.query_one(StepPalette).step_for_key(n)
        if step is None:
            self.notify(f"no step {n} in the palette", severity="warning")
            return
        self.apply_step(step)

    def action_undo(self) -> None:
        if not self.wb.undo():
            self.notify("nothing to undo", severity="warning")
            return
        self._after_step()

    def action_redo(self) -> None:
        if not self.wb.redo():
            self.notify("nothing to redo", severity="warning")
            return
        self._after_step()

    def action_copy_command(self) -> None:
        cmd = self.wb.command_line()
        self.copy_to_clipboard(cmd)
        self.notify(cmd, title="copied to the clipboard")

    def action_save_sched(self) -> None:
        if self.wb.session is None:
            self.notify(NO_PROGRAM, severity="warning")
            return
        stem = self.wb.base.name if self.wb.base else "schedule"
        self.push_screen(
            PathDialog("Save the steps as a .sched file", f"{stem}.sched"), self._save_to
        )

    def _save_to(self, path: str | None) -> None:
        if not path or self.wb.session is None:
            return
        try:
            count = self.wb.save_sched(Path(path))
        except (OSError, CocovizError) as err:
            self.notify(str(err), title="not saved", severity="error")
            return
        self.notify(f"saved {count} steps to {path}")

    # --- compare, teach, emit ----------------------------------------------------------
    def action_compare(self) -> None:
        # At the unscheduled program there is nothing to compare with; the timeline's
        # title says what is compared once there is.
        self.wb.cycle_compare()
        self._start_sim()

    def action_crossover(self) -> None:
        self.crossover_shown = not self.crossover_shown
        title = f"crossover on {self.wb.hw.name}" if self.crossover_shown else "cost"
        self.query_one("#cost").border_title = title
        self._refresh_cost()

    def action_emit(self) -> None:
        program = self.wb.program
        if program is None:
            self.notify("fix the source first", severity="warning")
            return
        default = f"./{program.name}-{self.target}"
        self.push_screen(EmitDialog(default, self.target), self._emit_requested)

    def _emit_requested(self, req: EmitRequest | None) -> None:
        """Emit for the chosen target, with the code pane's collectives mode and arch."""
        if req is None:
            return
        opts = self.code_options
        job = self.wb.emit_job(CodeOptions(req.target, opts.collectives, opts.arch))
        if job is not None:
            self._emit(job, req.directory, req.force)

    @work(thread=True, group="emit", exit_on_error=False, description="emit to a directory")
    def _emit(self, job: CodeJob, directory: str, force: bool) -> None:
        self.call_from_thread(self._emitted, job, self.wb.write(job, directory, force))

    def _emitted(self, job: CodeJob, outcome: Written | Refused) -> None:
        if isinstance(outcome, Refused):
            self.notify(outcome.message, title=outcome.title, severity="error", timeout=12)
            return
        self.last_emit = outcome
        res = outcome.result
        summary = f"{len(res.written)} written, {len(res.unchanged)} unchanged" + (
            f", {len(res.removed)} removed" if res.removed else ""
        )
        self.notify(
            f"{res.directory} ({job.target}): {summary}\nbuild: make -C {res.directory}",
            title="emitted",
        )

    # --- autosave ----------------------------------------------------------------------
    def _autosave(self, text: str | None = None) -> None:
        try:
            self.wb.autosave(text)
        except OSError as err:
            self.query_one(ErrorPanel).show_error("autosave failed", str(err))

    def _offer_autosave(self) -> None:
        saved = self.wb.saved()
        if saved is None:
            return

        def restore(ok: bool | None) -> None:
            if not ok:
                return
            self.query_one(SourceEditor).set_text(saved.source)
            self._start_parse(saved.source, steps=list(saved.steps))

        given = self.wb.source.steps
        if given:
            replaces = f"the {len(given)} step(s) given with --schedule ({', '.join(given)})"
            keep = "Keep --schedule (d)"
        else:
            replaces = f"{self.wb.source.label} as it was opened, unscheduled"
            keep = ""
        if saved.source != self.wb.source.text:
            replaces += ", and the text with the autosaved edits"
        dialog = RestoreDialog(self.wb.source.label, saved.describe(), replaces, keep)
        self.push_screen(dialog, restore)

    # --- workers -----------------------------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "sim" and event.worker.is_finished:
            self._after_redraw(self._resume_gc)
        if event.state is WorkerState.ERROR:
            err = event.worker.error
            detail = "".join(traceback.format_exception_only(type(err), err)).strip() if err else ""
            self.query_one(ErrorPanel).show_error(
                f"internal error in {event.worker.group or 'a worker'} (a cocoviz bug)",
                detail + "\nThe app keeps running; please report this with the program.",
            )
            if event.worker.group == "sim":
                self.wb.sim_note = "the simulation failed (see the error panel)"
                self._refresh_cost()

    def action_dismiss_error(self) -> None:
        self.query_one(ErrorPanel).remove_class("-shown")

    # --- views ---------------------------------------------------------------------------
    @on(TabbedContent.TabActivated)
    def _tab(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "tab-code":
            self._start_code()
        else:
            self.query_one("#views").border_title = self._timeline_title
        self._relayout()

    def action_toggle_side(self) -> None:
        self.side_shown = not self.side_shown
        self._relayout()

    async def action_quit(self) -> None:
        """Quit; the session (with any edit not parsed yet) is autosaved first."""
        text = self.query_one(SourceEditor).text
        self._autosave(text if text != self.wb.text else None)
        self.exit()


def _first_statement(text: str) -> int:
    """The 1-based line of the first line that is neither blank nor a comment."""
    for i, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            return i
    return 1


def _failure_text(failed: StepFailure) -> str:
    """A refused step's reason as the history shows it: the message and the hint."""
    hint = failed.error.hint
    return failed.message + (f" (hint: {hint})" if hint else "")


def create_app(
    file: str | Path | None = None,
    *,
    text: str | None = None,
    schedule: str | None = None,
    teach_mode: bool = False,
    hw: str | Hardware | None = None,
    state_root: Path | None = None,
    target: str = "cuda",
) -> CocovizApp:
    """The app for a file, a sample name, or the default sample (`file` None).

    `schedule` (a block name or a `.sched` file) is applied at start; in teach mode the
    schedule to teach is that block (the tuner's best schedule when none is given, found
    in a worker) and the app starts unscheduled. `hw` is a `Hardware` value, or a profile name or TOML path parsed
    here, once. Raises CocovizError when the file or the profile cannot be read.
    """
    hardware = hw if isinstance(hw, Hardware) else load_profile(hw or DEFAULT_PROFILE)
    source = open_source(file, text=text, schedule=schedule, teach=teach_mode)
    workbench = Workbench(
        source,
        hw=hardware,
        view=TimelineRows.from_timeline,
        teach=teach_mode,
        state_root=state_root,
    )
    return CocovizApp(workbench, target=target)
