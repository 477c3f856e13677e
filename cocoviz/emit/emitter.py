"""`emit`: a scheduled Program → the files of its output tree; `build`: run make there."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cocoviz.emit.lower import Collectives, lower_emit
from cocoviz.emit.manifest import manifest
from cocoviz.emit.render import EmitOptions, renderer_for
from cocoviz.emit.targets import DEFAULT_TARGET, TargetSpec, target_spec
from cocoviz.emit.toolchain import Toolchain, arch_number, find_toolchain
from cocoviz.errors import BuildError, UsageError
from cocoviz.ir.nodes import Program
from cocoviz.sim.hardware import Hardware, default_hardware
from cocoviz.sim.predict import simulate

Target = str
"""A target's name: one of `cocoviz.emit.targets.TARGET_NAMES`."""
MIN_ARCH = 75
"""CUDA 13 builds Turing (sm_75) and newer; Volta (sm_70) needs CUDA 12 or older."""


def check_arch(arch: str) -> None:
    """Refuse architectures CUDA 13 cannot build, with the reason (exit 2)."""
    try:
        n = arch_number(arch)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if n < MIN_ARCH:
        raise UsageError(
            f"--arch {arch}: CUDA 13 cannot build for this architecture "
            f"(Volta sm_70 support ended with CUDA 12; CUDA 13 starts at sm_{MIN_ARCH})",
            hint="use --arch sm_80 or newer; the v100-dgx2 hardware profile remains a "
            "model-only target for `cocoviz simulate`",
        )


@dataclass(frozen=True)
class Emitted:
    files: dict[str, str]
    binary: str


def _predicted(
    program: Program, collectives: str, hw: Hardware | None
) -> tuple[dict[str, float] | None, str | None]:
    """Per-stage predicted busy times (µs) from the cost model, with the hardware named."""
    try:
        tl = simulate(program, hw or default_hardware(), collectives=collectives, warnings=False)
    except Exception as e:  # noqa: BLE001 - a prediction must never break emitting
        return None, f"the cost model failed: {type(e).__name__}: {e}"
    rows = {r.name: r.busy_s * 1e6 for r in tl.summary.stages}
    rows["(makespan)"] = tl.summary.makespan_s * 1e6
    return rows, f"predicted by the cost model for {tl.hardware} (cocoviz simulate)"


def emit(
    scheduled: Program,
    reference: Program | None,
    *,
    target: Target = DEFAULT_TARGET,
    collectives: Collectives = "nccl",
    arch: str = "sm_90",
    schedule_name: str | None = None,
    schedule_steps: Sequence[str] = (),
    seed: int = 0,
    toolchain: Toolchain | None = None,
    hw: Hardware | None = None,
) -> Emitted:
    """The output tree of `scheduled` (and `reference`, the unscheduled program that
    ``--check`` compares against) for `target`; `hw` (default: the default profile) is
    the hardware the manifest's predicted times are for."""
    spec = target_spec(target)
    if spec.gpu:
        check_arch(arch)
    plan = lower_emit(scheduled, reference, collectives, schedule_name, schedule_steps, seed)
    tc = toolchain or find_toolchain()
    make_vars = tuple(tc.make_variables(arch).items())
    mpiexec = "mpiexec"
    if tc.mpi is not None and tc.mpi.mpiexec is not None:
        mpiexec = shlex.quote(str(tc.mpi.mpiexec))
    options = EmitOptions(
        target=target, arch=arch, make_vars=_make_vars(make_vars, spec), mpiexec=mpiexec
    )
    files = renderer_for(plan, options).files()
    predicted, note = _predicted(scheduled, collectives if spec.gpu else "nccl", hw)
    files[PROGRAM_FILE] = program_source(reference or scheduled, schedule_steps)
    names = [*files, "manifest.json"]
    files["manifest.json"] = manifest(plan, spec, arch, names, predicted, note)
    return Emitted(files, plan.file_stem)


PROGRAM_FILE = "program.coco"
"""The program a tree was lowered from (`program_source`), for `cocoviz check-tree`."""


def program_source(program: Program, steps: Sequence[str]) -> str:
    """The unscheduled program with its sizes and ranks as written, and the resolved steps
    of the schedule as the block `emitted`: what `cocoviz check-tree` runs the reference
    of (docs/codegen.md, "Inputs, dumps and check-tree")."""
    from cocoviz.ir.printer import format_program

    head = (
        "# Written by cocoviz emit: the program this tree was lowered from, at the sizes and\n"
        "# ranks it was emitted for; `cocoviz check-tree DIR` runs its numpy reference, and\n"
        "# `cocoviz run program.coco --schedule emitted` runs the schedule the tree runs.\n"
    )
    text = head + format_program(program, schedules=False)
    if steps:
        text += "\nschedule emitted {\n" + "".join(f"  {s}\n" for s in steps) + "}\n"
    return text


def _make_vars(items: tuple[tuple[str, str], ...], spec: TargetSpec) -> tuple[tuple[str, str], ...]:
    out = []
    for k, v in items:
        if spec.make_vars is not None and k not in spec.make_vars:
            continue
        if any(c in v for c in "\n\\#"):
            continue
        out.append((k, v))
    return tuple(out)


_MISSING_TOOL = re.compile(
    r"^(?:make(?:\[\d+\])?|(?:/bin/)?(?:ba)?sh(?:: (?:line )?\d+)?): (?P<tool>\S+): "
    r"(?:No such file or directory|(?:command )?not found)\s*$"
)
"""make's (or its shell's) report that a program a rule runs does not exist; make then
ends the rule with ``Error 127``."""


def missing_tools(output: str) -> list[str]:
    """The programs make could not run, in order, from make's output."""
    tools: list[str] = []
    for line in output.splitlines():
        m = _MISSING_TOOL.match(line.strip())
        if m and m.group("tool") not in tools:
            tools.append(m.group("tool"))
    return tools


def _missing_tool_hint(tool: str) -> str:
    name = Path(tool).name
    if name == "nvcc":
        return (
            f"{tool} does not exist: install the CUDA toolkit (nvcc; make and a C++ compiler "
            "too) and point CUDA_HOME (or NVCC) at it; without one, `emit --build --emulate` "
            "builds the CUDA program for CPU ranks and `emit --target cpu` emits C++/MPI"
        )
    if "mpi" in name:
        return (
            f"{tool} does not exist: install an MPI with its C++ compiler wrapper "
            "(`pip install mpich`, or set MPI_HOME / MPICXX)"
        )
    return f"{tool} does not exist: install it or point the Makefile's variable at it"


_MAKE_LINE = re.compile(r"^g?make(?:\[\d+\])?: ")
"""A line make writes itself (``make: *** [Makefile:17: sgd.o] Error 1``, ``make[1]:
Entering directory ...``), not the compiler."""
_COMPILER_ERROR = re.compile(
    r"\berror\b|\bfatal\b|undefined reference|multiple definition|cannot find -l"
    r"|No such file or directory|not found|unresolved external",
    re.IGNORECASE,
)
"""A line where a compiler, nvcc, ptxas or the linker reports an error: gcc/clang's
``file:line:col: error: ...``, nvcc's ``file(line): error: ...`` and ``nvcc fatal   :
...``, ld's ``undefined reference to ...``."""
_CONTEXT = re.compile(r"^\s+(?:\d+\s*)?\|")
"""gcc/clang's quoted source line and caret under an error (``  617 | this ...``)."""
MAX_SHOWN = 12
"""Compiler lines a failed build shows; `make -C DIR` shows the rest."""


def _is_error(line: str) -> bool:
    return not _MAKE_LINE.match(line) and _COMPILER_ERROR.search(line) is not None


def compiler_messages(output: str, fallback: str | None = None) -> list[str]:
    """The compiler's (or linker's) first error lines in make's output, each with the
    source line and caret gcc/clang print under it, then make's line naming the rule that
    failed. Where no line reads as an error, the last lines of `fallback` (make's standard
    error, not the commands it echoed; default: `output`) that make did not write."""
    lines = output.splitlines()
    shown: list[str] = []
    k = 0
    while k < len(lines) and len(shown) < MAX_SHOWN:
        ln = lines[k]
        k += 1
        if ln in shown or not (_is_error(ln) or _MISSING_TOOL.match(ln.strip())):
            continue
        shown.append(ln)
        while k < len(lines) and _CONTEXT.match(lines[k]) and len(shown) < MAX_SHOWN:
            shown.append(lines[k])
            k += 1
    if not shown:
        said = lines if fallback is None else fallback.splitlines()
        shown = [ln for ln in said if ln.strip() and not _MAKE_LINE.match(ln)][-MAX_SHOWN:]
    more = sum(1 for ln in lines[k:] if _is_error(ln) and ln not in shown)
    if more:
        shown.append(f"... and {more} more error line(s)")
    shown += [ln for ln in lines if _MAKE_LINE.match(ln) and "***" in ln][:1]
    return shown


def build(directory: Path, jobs: int = 2, extra: Sequence[str] = ()) -> str:
    """Run make in `directory`; raises BuildError (exit 5) with the compiler's first error
    lines (docs/codegen.md, "The output directory"), or make's own when a program it runs
    (nvcc, mpicxx, the host compiler) is missing."""
    try:
        res = subprocess.run(
            ["make", "-C", str(directory), f"-j{jobs}", *extra],
            capture_output=True,
            check=False,
        )
    except OSError as e:
        raise BuildError(
            f"cannot run make: {e.strerror}",
            hint="install make and a C++ compiler (e.g. `apt install make g++`)",
        ) from None
    # a compiler speaks the locale's encoding: bytes that are not UTF-8 are shown, not fatal
    stdout = res.stdout.decode("utf-8", errors="replace")
    stderr = res.stderr.decode("utf-8", errors="replace")
    if res.returncode != 0:
        output = f"{stderr}\n{stdout}"
        missing = missing_tools(output)
        shown = "\n".join(compiler_messages(output, fallback=stderr if stderr.strip() else None))
        full = f"run `make -C {directory}{''.join(' ' + shlex.quote(x) for x in extra)}` to see the full output"
        hint = "; ".join([*(_missing_tool_hint(t) for t in missing), full])
        raise BuildError(
            f"building the emitted code in {directory} failed (make exit {res.returncode}):\n{shown}",
            hint=hint,
        )
    return stdout + stderr
