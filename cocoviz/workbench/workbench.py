"""The workbench: a program being edited and scheduled, and everything shown of it.

It holds the source text and its parse generation (the last program that parsed, the
current error), the step history (a `cocoviz.schedule.Session`: a refused step is a
`StepFailure` value, docs/schedules.md, Sessions), the simulated timeline and the
emitted code of each step (cached per program, so an edited source or a dropped branch
of the history never shows a stale one), the timeline comparison, teach mode and the
autosave. The terminal UI displays it; nothing here imports Textual or rich.

Threads. Simulating, emitting and parsing are slow, so a UI runs them in workers in
three phases: on the UI's thread it asks for the work (`begin_parse`,
`timelines_to_simulate`, `code_jobs`, `emit_job`, `cached_palette`), in a worker it runs
the *worker-safe* methods (`parse`, `simulate`, `emit_code`, `write`, `find_palette`,
`run_best`: they read only their arguments and the immutable `hw`, `source` and `view`,
and change nothing), and back on the UI's thread it hands the result over (`accept`,
`store_timelines`, `store_code`, `store_palette`, `store_best`). Every other
method reads or changes the workbench and belongs to one thread, the UI's.
"""

from __future__ import annotations

import functools
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Generic, Literal, NamedTuple, TypeVar

from cocoviz.emit.emitter import MIN_ARCH, Emitted, Target, emit
from cocoviz.emit.lower import EmitError
from cocoviz.emit.plan import Collectives
from cocoviz.emit.targets import DEFAULT_TARGET, TARGET_NAMES, target_spec
from cocoviz.emit.toolchain import Toolchain, find_toolchain
from cocoviz.emit.writer import WriteResult, write_tree
from cocoviz.errors import CocovizError, UsageError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program, unscheduled
from cocoviz.schedule import PaletteEntry, Session, StepFailure, block_steps, palette
from cocoviz.schedule.tune import (
    Candidate,
    SweepResult,
    TuneProgress,
    main_dimension,
    sweep,
    sweep_values,
    tune,
)
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.predict import simulate as simulate_timeline
from cocoviz.sim.timeline import Summary, Timeline
from cocoviz.timefmt import format_time
from cocoviz.workbench import state, teach
from cocoviz.workbench.source import Source

__all__ = [
    "COMPARE_MODES",
    "NO_PROGRAM",
    "Accepted",
    "NoBest",
    "CodeJob",
    "CodeOptions",
    "CodePair",
    "CompareMode",
    "Comparison",
    "Parsed",
    "Refused",
    "Simulated",
    "SweepJob",
    "TeachNote",
    "Workbench",
    "Written",
    "emitted_files",
]

V = TypeVar("V")
"""What the UI draws of a timeline (the TUI: its rows), made once per simulated step."""

CompareMode = Literal["off", "previous", "unscheduled"]
COMPARE_MODES: tuple[CompareMode, ...] = ("off", "previous", "unscheduled")
NO_PROGRAM = "no program: fix the error in the source"


# --- values handed between the UI's thread and its workers ----------------------------------


@dataclass(frozen=True)
class Parsed:
    """A text and what parsing it gave: a program, or the error (with diagnostics)."""

    text: str
    program: Program | None
    error: CocovizError | None


class Accepted(Enum):
    """What handing a parse over changed."""

    STALE = "stale"
    """A newer text is being parsed; nothing changed."""
    ERROR = "error"
    """The text has an error (`Workbench.error`); the last program that parsed stays."""
    OPENED = "opened"
    """The first text parsed: the program is open (teach steps set, autosave to offer)."""
    PARSED = "parsed"
    """A new program, with the applied steps replayed on it."""


@dataclass(frozen=True)
class Simulated(Generic[V]):
    """What a simulation worker hands back: per program its timeline and the UI's view
    of it, in order, up to the first program the simulator refused (`note` says why)."""

    done: tuple[tuple[Program, Timeline, V], ...]
    note: str = ""


GPU_ARCHES: tuple[str, ...] = tuple(
    a
    for a in ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
    if int(a[3:]) >= MIN_ARCH
)
"""The CUDA architectures the code pane cycles through (``cocoviz emit --arch``)."""
COLLECTIVES_MODES: tuple[Collectives, ...] = ("nccl", "nccl-device")
"""How a GPU target runs its collectives (``cocoviz emit --collectives``,
docs/codegen.md)."""


@dataclass(frozen=True)
class CodeOptions:
    """What the code is emitted for: a target of `cocoviz.emit.targets.TARGETS` and, for
    a GPU target, the collectives mode and the CUDA architecture (docs/codegen.md)."""

    target: Target = DEFAULT_TARGET
    collectives: Collectives = "nccl"
    arch: str = "sm_90"

    @staticmethod
    def of(options: Target | CodeOptions) -> CodeOptions:
        """`options`, or a target's name with the defaults; a CPU target's collectives
        and architecture are the defaults (they do not change its code)."""
        opts = CodeOptions(options) if isinstance(options, str) else options
        if not opts.gpu and (opts.collectives, opts.arch) != ("nccl", "sm_90"):
            return CodeOptions(opts.target)
        return opts

    @property
    def gpu(self) -> bool:
        return target_spec(self.target).gpu

    def describe(self) -> str:
        """`cuda · nccl · sm_90`, or `cpu`."""
        if not self.gpu:
            return self.target
        return f"{self.target} · {self.collectives} · {self.arch}"

    def next_target(self) -> CodeOptions:
        i = TARGET_NAMES.index(self.target) if self.target in TARGET_NAMES else -1
        nxt = TARGET_NAMES[(i + 1) % len(TARGET_NAMES)]
        return CodeOptions(nxt, self.collectives, self.arch)

    def next_collectives(self) -> CodeOptions:
        """The next collectives mode (a GPU target's; a CPU target's is unchanged)."""
        if not self.gpu:
            return self
        i = COLLECTIVES_MODES.index(self.collectives)
        nxt = COLLECTIVES_MODES[(i + 1) % len(COLLECTIVES_MODES)]
        return CodeOptions(self.target, nxt, self.arch)

    def next_arch(self) -> CodeOptions:
        """The next architecture of `GPU_ARCHES` (a CPU target's is unchanged)."""
        if not self.gpu:
            return self
        i = GPU_ARCHES.index(self.arch) if self.arch in GPU_ARCHES else -1
        return CodeOptions(self.target, self.collectives, GPU_ARCHES[(i + 1) % len(GPU_ARCHES)])


@dataclass(frozen=True)
class CodeJob:
    """Code to emit: a step's program, the program as parsed (`reference`, the check's
    baseline), the steps that lead from one to the other (recorded in the manifest), the
    target and, for a GPU target, the collectives mode and architecture."""

    program: Program
    reference: Program
    steps: tuple[str, ...]
    target: Target
    collectives: Collectives = "nccl"
    arch: str = "sm_90"

    @property
    def options(self) -> CodeOptions:
        return CodeOptions(self.target, self.collectives, self.arch)


class Written(NamedTuple):
    """An emitted tree and what writing it did."""

    emitted: Emitted
    result: WriteResult


@dataclass(frozen=True)
class Refused:
    """Why nothing was written: a title and the message to show."""

    title: str
    message: str


@dataclass(frozen=True)
class Comparison(Generic[V]):
    """The timeline of the current step and the one it is compared with."""

    index: int
    current: V | None
    """None while it is being simulated (or when it cannot be)."""
    against: int | None
    """The step compared with; None when the mode is off or there is none yet."""
    compare: V | None

    @property
    def label(self) -> str:
        """The current step's name: `step 2`, or `unscheduled`."""
        return f"step {self.index}" if self.index else "unscheduled"

    @property
    def against_label(self) -> str:
        if self.against is None:
            return ""
        return f"step {self.against}" if self.against else "unscheduled"


@dataclass(frozen=True)
class CodePair:
    """The current step's code for a target and the previous step's, for the diff."""

    current: Emitted | str | None
    """The files, why there are none (a "not supported"), or None while generating."""
    previous: Emitted | None


@dataclass(frozen=True)
class SweepJob:
    """A crossover sweep to run: the program as parsed, its text, the dimension varied
    (`cocoviz.schedule.tune.main_dimension`) and its sizes."""

    base: Program
    text: str
    dim: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class NoBest:
    """Why the tuner gave no best schedule to teach (`Workbench.run_best`)."""

    message: str
    stopped: bool = False
    """The search ended before it had tried every candidate (cancelled, or out of
    time): its fastest so far is not the tuner's best, so nothing is taught from it."""


@dataclass(frozen=True)
class TeachNote:
    """Teach mode's explanation of the current step.

    `total` 0: there is no schedule to teach. `program` False: the source does not
    parse. At the start `step` is None and `text` the introduction; after a step, `text`
    says what it changed in the graph and the timeline and why. `next_step` is None
    after the last one.
    """

    position: int
    total: int
    program: bool = True
    step: str | None = None
    text: str = ""
    next_step: str | None = None
    goal: str = ""
    """What the steps lead to: the tuner's best schedule with its predicted time (as
    `cocoviz tune` ranks it first), or the schedule block taught."""


# --- code generation ------------------------------------------------------------------------


@functools.cache
def _toolchain() -> Toolchain:
    """Where nvcc, NCCL and MPI are (the Makefile's defaults); looked up once."""
    return find_toolchain()


def emitted_files(
    program: Program,
    reference: Program,
    target: Target,
    steps: Sequence[str],
    hw: Hardware,
    collectives: Collectives = "nccl",
    arch: str = "sm_90",
) -> Emitted:
    """The files `cocoviz emit` writes for `program` (a step of `reference`, the
    program as parsed), in memory (docs/codegen.md). Raises EmitError (a CocovizError) for what the emitter
    cannot lower."""
    return emit(
        program,
        unscheduled(reference),
        target=target,
        collectives=collectives,
        arch=arch,
        schedule_steps=tuple(steps),
        toolchain=_toolchain(),
        hw=hw,
    )


def _hinted(err: CocovizError, sep: str) -> str:
    return err.message + (f"{sep}{err.hint}" if err.hint else "")


# --- the workbench --------------------------------------------------------------------------


class Workbench(Generic[V]):
    """A program being edited and scheduled on one hardware profile.

    `view` turns a simulated timeline into what the UI draws of it (made in the
    simulation worker, cached with the timeline). With `teach`, teach mode is on once
    the source has parsed. Teach mode walks to the tuner's best schedule (the first row
    of `cocoviz tune`; README.md, The terminal UI) unless a schedule was named at open;
    with `teach_best` False it walks to the program's last schedule block instead.
    """

    def __init__(
        self,
        source: Source,
        *,
        hw: Hardware,
        view: Callable[[Timeline], V],
        teach: bool = False,
        teach_best: bool = True,
        state_root: Path | None = None,
    ) -> None:
        self.source = source
        self.hw = hw
        self.view = view
        self.state_root = state_root
        """Where the autosave goes (None: the user's state directory)."""
        self.text = source.text
        """The text last handed over, whether it parsed or not."""
        self.base: Program | None = None
        """The last program that parsed (unscheduled)."""
        self.error: CocovizError | None = None
        """Why the text last handed over does not parse."""
        self.session: Session | None = None
        """The steps applied to `base`; None until a text has parsed."""
        self.failed: StepFailure | None = None
        """The last step refused (cleared by the next applied one, or a new program)."""
        self.teach_steps: list[str] = []
        """The steps teach mode walks: the schedule named at open, else the tuner's best
        (`teach_best`) or the program's last schedule block."""
        self.teaching = False
        self.teach_best = teach_best
        """Teach the tuner's best schedule (found by `run_best`, `store_best`) unless a
        schedule was named at open."""
        self.best: Candidate | None = None
        """The tuner's best schedule of `base` (its first row), once tuned."""
        self._tuned: Program | None = None
        """The program `best` was looked for on (found or not)."""
        self.teach_waiting = False
        """Teach mode was asked for and waits for the tuner (`best_job`)."""
        self._user: Session | None = None
        """The user's own steps while teach mode walks its steps beside them."""
        self.compare_mode: CompareMode = "off"
        self.sim_note = ""
        """Why there is no timeline (the simulator's refusal, or a failed worker)."""
        self._teach_at_open = teach
        self._gen = 0
        self._replay: list[str] | None = None
        self._timelines: dict[int, tuple[Program, Timeline, V]] = {}
        """By the identity of the program simulated."""
        self._code: dict[
            tuple[int, tuple[str, ...], CodeOptions], tuple[Program, Emitted | str]
        ] = {}
        """By (identity of the program, steps, code options)."""
        self._palette: tuple[Program, dict[str, list[PaletteEntry] | str]] | None = None
        self._crossover: tuple[Program, SweepResult | str] | None = None
        """The crossover sweep of `base` (or why there is none)."""
        self._crossover_running: Program | None = None
        """The program whose sweep a worker runs now."""

    # --- parsing --------------------------------------------------------------------------
    def begin_parse(self, text: str, steps: Sequence[str] | None = None) -> int:
        """Start a parse generation for `text`; its result is handed to `accept` with the
        number returned. `steps` are applied to the program once it parses (None: the
        steps applied now)."""
        self._gen += 1
        self._replay = list(steps) if steps is not None else None
        return self._gen

    def parse(self, text: str) -> Parsed:
        """Parse and lower `text` (worker-safe)."""
        try:
            return Parsed(text, load_program(text, self.source.label), None)
        except CocovizError as err:
            return Parsed(text, None, err)

    def accept(self, gen: int, parsed: Parsed) -> Accepted:
        """Hand over the parse of generation `gen`. A new program replaces the old one:
        the steps are replayed on it (up to the first refused, then `failed`) and every
        cached timeline and code is dropped."""
        if gen != self._gen:
            return Accepted.STALE
        self.text = parsed.text
        self.error = parsed.error
        if parsed.program is None:
            return Accepted.ERROR
        replay = self._replay if self._replay is not None else self.applied_steps
        if self._tuned is not None:  # the same program keeps its best; another is tuned again
            same = parsed.program == self._tuned
            self._tuned = parsed.program if same else None
            self.best = self.best if same else None
        self.base = parsed.program
        self.session = Session(parsed.program, self.hw)
        if self._user is not None:  # the user's own steps, beside teach mode's
            self._user = self._replayed(self._user)
        self._timelines.clear()
        self._code.clear()
        self._palette = None
        self.failed = None
        for step in replay:
            outcome = self.session.apply(step)
            if isinstance(outcome, StepFailure):
                self.failed = outcome
                break
        if gen > 1:
            return Accepted.PARSED
        self._choose_teach_steps()
        if self._teach_at_open:
            if self.best_job() is not None:
                self.teach_waiting = True
            else:
                self.set_teaching(True)
        return Accepted.OPENED

    def _replayed(self, session: Session) -> Session:
        """`session`'s applied steps replayed on `base` (up to the first refused)."""
        assert self.base is not None
        again = Session(self.base, self.hw)
        for step in session.steps:
            if isinstance(again.apply(str(step)), StepFailure):
                break
        return again

    def _choose_teach_steps(self) -> None:
        given = self.source.teach_steps
        if given is not None:
            self.teach_steps = list(given)
        elif self.teach_best and self.best is not None:
            self.teach_steps = list(self.best.steps)
        elif self.teach_best and self._tuned is not self.base:
            self.teach_steps = []  # until the tuner has run
        elif self.base is not None:
            self.teach_steps = [str(s) for s in block_steps(self.base, None)]

    # --- the program and its steps --------------------------------------------------------
    @property
    def program(self) -> Program | None:
        """The program at the current step (None until a text has parsed)."""
        return self.session.program if self.session is not None else None

    @property
    def position(self) -> int:
        """How many steps are applied (0: the unscheduled program)."""
        return self.session.position if self.session is not None else 0

    @property
    def applied_steps(self) -> list[str]:
        """The applied steps as resolved (`overlap` with its chunk count)."""
        return [str(s) for s in self.session.steps] if self.session is not None else []

    @property
    def recorded_steps(self) -> list[str]:
        """Every recorded step, applied or undone."""
        if self.session is None:
            return []
        return [str(h.step) for h in self.session.history]

    def program_at(self, i: int) -> Program | None:
        """The program after the first `i` recorded steps (None: no program, or no such
        step)."""
        if self.session is None or not 0 <= i <= len(self.session.history):
            return None
        return self.session.program_at(i)

    def apply(self, step: str) -> Program | StepFailure:
        """Apply a step after the current one (dropping the undone ones); a refused step
        is returned, recorded as `failed`, and changes nothing else."""
        if self.session is None:
            self.failed = StepFailure(step, UsageError(NO_PROGRAM))
            return self.failed
        outcome = self.session.apply(step)
        if isinstance(outcome, StepFailure):
            self.failed = outcome
        else:
            self.failed = None
            self._forget_dropped()
        return outcome

    def apply_from_start(self, steps: Sequence[str]) -> Program | StepFailure:
        """Go back to the unscheduled program and apply `steps` (a schedule block chosen
        by name): the program after them, or the first one refused (the steps before it
        stay applied)."""
        if self.session is None:
            self.failed = StepFailure(", ".join(steps), UsageError(NO_PROGRAM))
            return self.failed
        self.session.jump(0)
        outcome: Program | StepFailure = self.session.program
        for step in steps:
            outcome = self.apply(step)
            if isinstance(outcome, StepFailure):
                break
        return outcome

    def undo(self) -> bool:
        return self.session is not None and self.session.undo()

    def redo(self) -> bool:
        return self.session is not None and self.session.redo()

    def jump(self, i: int) -> bool:
        """Go to step `i` of the recorded ones; False when that is where it is already
        (or there is no such step)."""
        if self.session is None or i == self.position or self.program_at(i) is None:
            return False
        self.session.jump(i)
        return True

    def palette(self, stage: str) -> list[PaletteEntry] | str:
        """The steps offered for `stage` at the current step (docs/schedules.md), or why
        there are none; cached per program. On a large program this takes long (a UI
        finds it in a worker: `cached_palette`, `find_palette`, `store_palette`)."""
        program = self.program
        if program is None:
            return NO_PROGRAM
        hit = self.cached_palette(stage)
        if hit is None:
            hit = self.find_palette(program, stage)
            self.store_palette(program, stage, hit)
        return hit

    def cached_palette(self, stage: str) -> list[PaletteEntry] | str | None:
        """`palette(stage)` when it is known for the current program, else None."""
        program = self.program
        if program is None:
            return NO_PROGRAM
        if self._palette is None or self._palette[0] is not program:
            return None
        return self._palette[1].get(stage)

    def find_palette(self, program: Program, stage: str) -> list[PaletteEntry] | str:
        """The steps offered for `stage` of `program`, or why there are none
        (worker-safe)."""
        try:
            return palette(program, stage, self.hw)
        except CocovizError as err:
            return err.message

    def store_palette(
        self, program: Program, stage: str, entries: list[PaletteEntry] | str
    ) -> None:
        """Keep `find_palette`'s result while `program` is the current step's (the
        palettes of one program at a time are kept)."""
        if program is not self.program:
            return
        if self._palette is None or self._palette[0] is not program:
            self._palette = (program, {})
        self._palette[1][stage] = entries

    def command_line(self) -> str:
        """The `cocoviz apply` command that gives the current step."""
        parts = ["cocoviz", "apply", shlex.quote(self.source.command_file)]
        parts += [shlex.quote(s) for s in self.applied_steps]
        return " ".join(parts)

    def save_sched(self, path: Path) -> int:
        """Write the applied steps as a `.sched` file; returns how many. Raises OSError,
        or CocovizError (no program, or a path the writer refuses)."""
        if self.session is None:
            raise UsageError(NO_PROGRAM)
        self.session.save(path)
        return self.position

    # --- stages ---------------------------------------------------------------------------
    def default_selection(self) -> str | None:
        """The stage selected at first: the first collective, else the first stage."""
        program = self.program
        if program is None or not program.stages:
            return None
        for s in program.stages:
            if s.is_collective:
                return s.name
        return program.stages[0].name

    def has_stage(self, name: str) -> bool:
        """Whether the current program has stage `name`."""
        return self.program is not None and self.program.has_stage(name)

    def source_line(self, name: str) -> int | None:
        """The source line of stage `name`, if the text declares it."""
        if self.base is None or not self.base.has_stage(name):
            return None
        span = self.base.stage(name).span
        return span.line if span is not None else None

    def stage_on_line(self, line: int) -> str | None:
        """The stage declared on source line `line`, if the current program has it."""
        if self.base is None:
            return None
        for s in self.base.stages:
            if s.span is not None and s.span.line == line:
                return s.name if self.has_stage(s.name) else None
        return None

    # --- timelines ------------------------------------------------------------------------
    def timeline(self, i: int) -> V | None:
        """The view of step `i`'s timeline, when it has been simulated."""
        hit = self._timeline_entry(i)
        return hit[2] if hit is not None else None

    def summary(self, i: int) -> Summary | None:
        """The simulator's summary of step `i`, when it has been simulated."""
        hit = self._timeline_entry(i)
        return hit[1].summary if hit is not None else None

    def _timeline_entry(self, i: int) -> tuple[Program, Timeline, V] | None:
        program = self.program_at(i)
        if program is None:
            return None
        hit = self._timelines.get(id(program))
        return hit if hit is not None and hit[0] is program else None

    def compare_index(self) -> int | None:
        """The step the timeline is compared with (None: no comparison now)."""
        cur = self.position
        if self.compare_mode == "previous":
            return cur - 1 if cur > 0 else None
        if self.compare_mode == "unscheduled":
            return 0 if cur > 0 else None
        return None

    def cycle_compare(self) -> CompareMode:
        """The next comparison: off → previous step → unscheduled → off."""
        i = COMPARE_MODES.index(self.compare_mode)
        self.compare_mode = COMPARE_MODES[(i + 1) % len(COMPARE_MODES)]
        return self.compare_mode

    def comparison(self) -> Comparison[V]:
        cur = self.position
        against = self.compare_index()
        compare = self.timeline(against) if against is not None else None
        return Comparison(cur, self.timeline(cur), against, compare)

    def timelines_to_simulate(self) -> list[Program]:
        """The programs whose timelines are shown and not simulated yet: the current
        step, the unscheduled one, the one compared with and, teaching, the previous."""
        wanted = [self.position, 0]
        against = self.compare_index()
        if against is not None:
            wanted.append(against)
        if self.teaching and self.position > 0:
            wanted.append(self.position - 1)
        todo: dict[int, Program] = {}
        for i in wanted:
            program = self.program_at(i)
            if program is not None and self.timeline(i) is None:
                todo.setdefault(id(program), program)
        return list(todo.values())

    def simulate(self, programs: Iterable[Program]) -> Simulated[V]:
        """Simulate each program on `hw` (worker-safe)."""
        done: list[tuple[Program, Timeline, V]] = []
        for program in programs:
            try:
                tl = simulate_timeline(program, self.hw)
            except CocovizError as err:
                return Simulated(tuple(done), f"cannot simulate: {err.message}")
            done.append((program, tl, self.view(tl)))
        return Simulated(tuple(done))

    def store_timelines(self, simulated: Simulated[V]) -> None:
        """Keep the timelines of programs still in the history; `sim_note` becomes the
        batch's note."""
        live = self._live()
        for program, tl, view in simulated.done:
            if id(program) in live:
                self._timelines[id(program)] = (program, tl, view)
        self.sim_note = simulated.note

    # --- the crossover sweep --------------------------------------------------------------
    def crossover(self) -> SweepResult | str | None:
        """The crossover sweep of the program as parsed over its main dimension (`tune
        --sweep`: per size the tuned best and each schedule block's time), why there is
        none, or None while it has not been run."""
        hit = self._crossover
        return hit[1] if hit is not None and hit[0] is self.base else None

    def crossover_job(self) -> SweepJob | None:
        """The sweep to run for the program as parsed (None: no program, done, or being
        run); it counts as being run until `store_crossover` gets its result."""
        base = self.base
        if base is None or self.crossover() is not None or self._crossover_running is base:
            return None
        dim = main_dimension(base)
        if dim is None:
            self._crossover = (base, "no collective names a dimension to sweep")
            return None
        self._crossover_running = base
        return SweepJob(base, self.text, dim, sweep_values(base.shape_env[dim]))

    def run_crossover(self, job: SweepJob) -> SweepResult | str:
        """Tune the program at each size of the job (worker-safe); a size the program
        does not accept (a slice that does not divide) is left out."""
        programs: dict[int, Program] = {}
        reason = ""
        for value in job.values:
            try:
                programs[value] = load_program(job.text, self.source.label, {job.dim: value})
            except CocovizError as err:
                reason = reason or f"{job.dim} = {value}: {err.message}"
        if len(programs) < 2:
            return f"cannot sweep {job.dim}: {reason or 'fewer than two sizes'}"
        try:
            return sweep(programs.__getitem__, job.dim, list(programs), self.hw)
        except CocovizError as err:
            return f"cannot sweep {job.dim}: {err.message}"

    def store_crossover(self, job: SweepJob, result: SweepResult | str) -> None:
        """Keep the sweep while its program is the one parsed."""
        if self._crossover_running is job.base:
            self._crossover_running = None
        if job.base is self.base:
            self._crossover = (job.base, result)

    # --- code -----------------------------------------------------------------------------
    def code_jobs(self, options: Target | CodeOptions) -> list[CodeJob]:
        """The current and the previous step's code for `options` (a target's name, or
        the target with its collectives mode and architecture), where not emitted yet."""
        opts = CodeOptions.of(options)
        jobs: list[CodeJob] = []
        if self.base is None:
            return jobs
        recorded = self.recorded_steps
        for j in (self.position, self.position - 1):
            program = self.program_at(j)
            steps = tuple(recorded[:j])
            if program is not None and self._code_entry(program, steps, opts) is None:
                jobs.append(
                    CodeJob(program, self.base, steps, opts.target, opts.collectives, opts.arch)
                )
        return jobs

    def emit_code(self, jobs: Iterable[CodeJob]) -> list[tuple[CodeJob, Emitted | str]]:
        """Emit each job in memory (worker-safe); what the emitter refuses is a message."""
        out: list[tuple[CodeJob, Emitted | str]] = []
        for job in jobs:
            files: Emitted | str
            try:
                files = self._emitted(job)
            except EmitError as err:
                files = f"not supported by the {job.target} emitter: {err.message}" + (
                    f" (hint: {err.hint})" if err.hint else ""
                )
            except CocovizError as err:
                files = f"cannot emit: {err.message}"
            out.append((job, files))
        return out

    def _emitted(self, job: CodeJob) -> Emitted:
        return emitted_files(
            job.program,
            job.reference,
            job.target,
            job.steps,
            self.hw,
            collectives=job.collectives,
            arch=job.arch,
        )

    def store_code(self, results: Iterable[tuple[CodeJob, Emitted | str]]) -> None:
        live = self._live()
        for job, files in results:
            if id(job.program) in live and job.reference is self.base:
                key = (id(job.program), job.steps, CodeOptions.of(job.options))
                self._code[key] = (job.program, files)

    def code(self, options: Target | CodeOptions) -> CodePair:
        """The current step's code for `options` and the previous step's (when emitted)."""
        opts = CodeOptions.of(options)
        recorded = self.recorded_steps
        i = self.position
        current = self._code_at(i, recorded, opts)
        previous = self._code_at(i - 1, recorded, opts) if i > 0 else None
        return CodePair(current, previous if isinstance(previous, Emitted) else None)

    def _code_at(self, j: int, recorded: list[str], opts: CodeOptions) -> Emitted | str | None:
        program = self.program_at(j)
        if program is None:
            return None
        return self._code_entry(program, tuple(recorded[:j]), opts)

    def _code_entry(
        self, program: Program, steps: tuple[str, ...], opts: CodeOptions
    ) -> Emitted | str | None:
        hit = self._code.get((id(program), steps, opts))
        return hit[1] if hit is not None and hit[0] is program else None

    def emit_job(self, options: Target | CodeOptions) -> CodeJob | None:
        """The current step's code for `options`, to write (None: no program)."""
        if self.session is None or self.base is None:
            return None
        opts = CodeOptions.of(options)
        return CodeJob(
            self.session.program,
            self.base,
            tuple(self.applied_steps),
            opts.target,
            opts.collectives,
            opts.arch,
        )

    def write(self, job: CodeJob, directory: str | Path, force: bool = False) -> Written | Refused:
        """Emit `job` and write the tree into `directory` atomically (worker-safe). The
        writer refuses a non-empty directory cocoviz did not write, unless `force`."""
        try:
            out = self._emitted(job)
            return Written(out, write_tree(directory, out.files, force=force))
        except EmitError as err:
            return Refused(f"not supported by the {job.target} emitter", _hinted(err, "\nhint: "))
        except CocovizError as err:  # the writer's refusal of a foreign directory
            return Refused("not emitted", _hinted(err, "\nhint: "))
        except OSError as err:
            return Refused("not emitted", f"{directory}: {err.strerror or err}")

    # --- teach mode -----------------------------------------------------------------------
    def best_job(self) -> Program | None:
        """The program to tune before teach mode can start (the tuner's best is taught and
        not known yet), else None."""
        if not self.teach_best or self.source.teach_steps is not None or self.base is None:
            return None
        return self.base if self._tuned is not self.base else None

    def run_best(
        self,
        program: Program,
        progress: Callable[[TuneProgress], None] | None = None,
        stop: Callable[[], bool] | None = None,
        budget_s: float | None = None,
    ) -> Candidate | NoBest:
        """The tuner's best schedule of `program` (worker-safe: `tune`, as `cocoviz tune`
        runs it), or why there is none. A search that ended before it tried every
        candidate (`stop()` said so, or `budget_s` ran out) gives no best: the fastest
        schedule found so far is not the one `cocoviz tune` ranks first."""
        try:
            result = tune(program, self.hw, progress=progress, stop=stop, budget_s=budget_s)
        except CocovizError as err:
            return NoBest(err.message)
        if not result.complete:
            why = "it was cancelled" if result.stopped == "stopped" else "its time ran out"
            return NoBest(
                f"the tuner stopped after {result.evaluated} candidate(s) ({why}), before it "
                "had tried every schedule: teach mode did not start",
                stopped=True,
            )
        if not result.candidates:
            return NoBest("the tuner found no schedule")
        return result.best

    def store_best(self, program: Program, best: Candidate | NoBest) -> None:
        """Hand over `run_best`'s result for `program` (ignored when the program changed
        since); teach mode's steps become the best schedule's. A search stopped before
        its end stores nothing: the program is tuned again when teach mode is asked for
        again, and the request waiting for it is dropped."""
        if program is not self.base:
            return
        if isinstance(best, NoBest) and best.stopped:
            self.teach_waiting = False
            return
        self._tuned = program
        self.best = best if isinstance(best, Candidate) else None
        self.sim_note = best.message if isinstance(best, NoBest) else self.sim_note
        self._choose_teach_steps()

    def set_teaching(self, on: bool) -> bool:
        """Turn teach mode on or off; True when the step shown changed.

        On, it teaches from the start beside the user's steps: when the applied steps are
        the first steps taught it goes on from them, else the user's session is put aside
        and teach mode starts from the unscheduled program in a session of its own. Off,
        the user's session comes back as it was. It compares with the previous step. The
        tuner's best, when taught and not known yet, is found here (`best_job` lets a UI
        find it in a worker first)."""
        self.teach_waiting = False
        if on and self.best_job() is not None:
            base = self.best_job()
            assert base is not None
            self.store_best(base, self.run_best(base))
            if self.best_job() is not None:  # the tuner stopped early: nothing to teach
                return False
        moved = False
        if not on and self.teaching and self._user is not None:
            self.session, self._user = self._user, None
            self.failed = None
            moved = True
        self.teaching = on
        if on and self.session is not None and self.teach_steps:
            if self.applied_steps != self.teach_steps[: self.position]:
                self._user = self.session
                self.session = Session(self.session.initial, self.hw)
                self.failed = None
                moved = True
        if on and self.compare_mode == "off":
            self.compare_mode = "previous"
        return moved

    @property
    def user_steps(self) -> list[str]:
        """The user's own applied steps (put aside while teach mode walks its own)."""
        if self._user is not None:
            return [str(s) for s in self._user.steps]
        return self.applied_steps

    @property
    def teach_finished(self) -> bool:
        """Whether every step taught is applied."""
        return self.position >= len(self.teach_steps)

    def teach_next(self) -> Program | StepFailure | None:
        """The next step taught: redone when it is the next recorded step, else applied.
        None when there is no program or no next step."""
        if self.session is None or self.teach_finished:
            return None
        i, taught, recorded = self.position, self.teach_steps, self.recorded_steps
        if recorded[:i] == taught[:i] and len(recorded) > i and recorded[i] == taught[i]:
            self.session.redo()
            return self.session.program
        return self.apply(taught[i])

    def teach_goal(self) -> str:
        """What the steps taught lead to, in the model's numbers."""
        best = self.best
        if best is not None and self.teach_steps == list(best.steps):
            base = self.summary(0)
            speedup = ""
            if base is not None and best.time_s > 0:
                speedup = f", {base.makespan_s / best.time_s:.2f}× over as written"
            return (
                f"the tuner's best schedule on {self.hw.name}, {best.title}: "
                f"{format_time(best.time_s)}{speedup} (the first row of `cocoviz tune`)"
            )
        return "the schedule block taught"

    def teach_note(self) -> TeachNote:
        """The explanation of the current step (teach.py's words, the model's numbers)."""
        taught, i = self.teach_steps, self.position
        goal = self.teach_goal() if taught else ""
        if not taught:
            return TeachNote(i, 0)
        if self.session is None:
            return TeachNote(i, len(taught), program=False, goal=goal)
        if i == 0:
            return TeachNote(0, len(taught), text=teach.INTRO, next_step=taught[0], goal=goal)
        step = self.recorded_steps[i - 1]
        before, after = self.session.program_at(i - 1), self.session.program_at(i)
        text = teach.explain(
            step, before, after, self.summary(i - 1), self.summary(i), self.hw.name
        )
        return TeachNote(
            i,
            len(taught),
            step=step,
            text=text,
            next_step=taught[i] if i < len(taught) else None,
            goal=goal,
        )

    # --- autosave -------------------------------------------------------------------------
    def autosave(self, text: str | None = None) -> Path:
        """Save the text and the applied steps (raises OSError). `text`: the editor's
        text when it has an edit not handed over yet (the app is quitting)."""
        saved_text = self.text if text is None else text
        save = state.Autosave(self.source.key, saved_text, tuple(self.user_steps), time.time())
        return state.write(save, self.state_root)

    def saved(self) -> state.Autosave | None:
        """The autosave of an earlier session on this source, when it differs from what
        was opened (to offer it back)."""
        saved = state.read(self.source.key, self.state_root)
        if saved is None:
            return None
        if saved.source == self.source.text and saved.steps == self.source.steps:
            return None
        return saved

    # --- caches ---------------------------------------------------------------------------
    def _live(self) -> set[int]:
        """The identities of the programs in the history."""
        if self.session is None:
            return set()
        return {id(self.session.initial)} | {id(h.after) for h in self.session.history}

    def _forget_dropped(self) -> None:
        """Drop what was cached of the programs of an abandoned branch of the history."""
        live = self._live()
        self._timelines = {k: v for k, v in self._timelines.items() if k in live}
        self._code = {k: v for k, v in self._code.items() if k[0] in live}
