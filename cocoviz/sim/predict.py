"""A scheduled program's predicted run: ``simulate(program, hw) -> Timeline``.

The timeline itself comes from the event simulator (``cocoviz.sim.timeline``); this
module adds what needs more than one simulation — the speedup over the unscheduled
program (the baseline) and the warnings of ``cocoviz.sim.warnings``, which simulate the
alternatives of each step — so it sits above both.
"""

from __future__ import annotations

from cocoviz.ir.nodes import Program, unscheduled
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.timeline import ProgramRun, SimWarning, Timeline, makespan, summarize
from cocoviz.sim.warnings import schedule_warnings
from cocoviz.sim.workload import Context

# The baseline's makespan of the last programs simulated, by the identities of their
# stages: a step that only fuses or overlaps keeps every stage object, so its baseline is
# the previous step's. An entry holds its program, so the objects whose identities key it
# stay alive.
_BASELINES: dict[tuple[tuple[int, ...], Hardware, str], tuple[Program, float]] = {}
_BASELINES_KEPT = 16


def _baseline_makespan(program: Program, hw: Hardware, collectives: str) -> float:
    """``makespan(unscheduled(program))``, reused while the stages are the same objects
    (a key's identities are of live objects, so equal keys mean the same stages)."""
    key = (tuple(map(id, program.stages)), hw, collectives)
    hit = _BASELINES.get(key)
    if hit is not None:
        p = hit[0]
        if (p.grid, p.dims, p.params, p.inputs, p.outputs) == (
            program.grid,
            program.dims,
            program.params,
            program.inputs,
            program.outputs,
        ):
            return hit[1]
    base = unscheduled(program)
    t = makespan(base, hw, collectives)
    while len(_BASELINES) >= _BASELINES_KEPT:
        _BASELINES.pop(next(iter(_BASELINES)), None)
    _BASELINES[key] = (base, t)
    return t


def simulate(
    program: Program,
    hw: Hardware,
    *,
    collectives: str = "nccl",
    baseline: Program | Timeline | float | None = None,
    warnings: bool = True,
) -> Timeline:
    """Simulate one run of ``program`` on every rank.

    ``baseline`` is what the speedup compares against: the program before its schedule
    (a Program), an earlier Timeline, or a time in seconds; by default the same stages
    without fusion or overlap. ``warnings=False`` skips the analysis of slow steps.
    """
    ctx = Context(program, hw, collectives)
    run = ProgramRun(ctx)
    lanes = run.engine.lanes_out()
    if isinstance(baseline, Timeline):
        base_s: float | None = baseline.makespan
    elif isinstance(baseline, Program):
        base_s = makespan(baseline, hw, collectives)
    elif isinstance(baseline, int | float):
        base_s = float(baseline)
    else:
        base_s = _baseline_makespan(program, hw, collectives) if program.groups else None
        if base_s is None:
            base_s = run.engine.end
    summary = summarize(lanes, base_s)
    found: tuple[SimWarning, ...] = ()
    if warnings:
        found = tuple(schedule_warnings(ctx, summary))
    return Timeline(
        program=program.name,
        hardware=hw.name,
        collectives=collectives,
        tp=program.grid.tp,
        pp=program.grid.pp,
        dp=program.grid.dp,
        lanes=lanes,
        cross=tuple(run.engine.cross),
        summary=summary,
        warnings=found,
    )
