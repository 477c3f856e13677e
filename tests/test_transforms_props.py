"""Properties of random step sequences on the samples: a legal step keeps the IR valid
(types, order, groups, print → parse) and the reference results; an illegal one is
refused with a ScheduleError, never anything else."""

from __future__ import annotations

import importlib.util

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transforms_util import SAMPLES, SMALL, reparse, sample

from cocoviz.errors import ScheduleError
from cocoviz.ir.nodes import Program, StepCall
from cocoviz.ir.transforms import REGISTRY, candidate_steps
from cocoviz.ir.transforms.base import index
from cocoviz.ir.transforms.retype import verify_program
from cocoviz.schedule import Session

HAS_REFERENCE = importlib.util.find_spec("cocoviz.exec.verify") is not None
GRIDS = {"pipeline_stage": "tp=2,pp=2", "zero1_tp_mlp": "dp=2,tp=2"}  # else 4 ranks
PROGRAMS = {name: sample(name, SMALL[name], GRIDS.get(name, "4")) for name in SAMPLES}


@st.composite
def step_for(draw: st.DrawFn, program: Program) -> StepCall | str:
    """A step that the palette would offer, or an arbitrary one over the program's names."""
    idx = index(program)
    names = list(idx.pos) + list(idx.inputs)
    if draw(st.booleans()):
        target = draw(st.sampled_from(names))
        options = candidate_steps(program, target)
        if options:
            t = draw(st.sampled_from(options))
            return t.step()
    kind = draw(st.sampled_from([*REGISTRY, "bogus"]))
    args = draw(st.lists(st.sampled_from([*names, "nosuch"]), max_size=4))
    kwargs: tuple[tuple[str, int], ...] = ()
    if kind == "overlap" and draw(st.booleans()):
        kwargs = (("chunks", draw(st.integers(0, 9))),)
    return StepCall(kind, tuple(args), kwargs)


def check_valid(before: Program, after: Program) -> None:
    verify_program(after)
    assert reparse(after) == after


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(name=st.sampled_from(SAMPLES), data=st.data())
def test_random_steps_are_applied_validly_or_refused(name: str, data: st.DataObject) -> None:
    original = PROGRAMS[name]
    session = Session(original)
    block = data.draw(st.sampled_from(original.schedules))
    session.apply_all(block.steps[: data.draw(st.integers(0, len(block.steps)))])
    for _ in range(data.draw(st.integers(1, 7))):
        step = data.draw(step_for(session.program))
        before = session.program
        try:
            after = session.apply_or_raise(step)
        except ScheduleError:
            assert session.program is before
            continue
        check_valid(before, after)
    final = session.program
    if HAS_REFERENCE and final is not original:
        from cocoviz.exec.verify import verify_programs

        report = verify_programs(original, final)
        assert report.ok, f"{session.steps}\n{report.format_report()}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SAMPLES), data=st.data())
def test_legal_steps_agree_with_apply(name: str, data: st.DataObject) -> None:
    from cocoviz.ir.transforms import legal_steps

    program = PROGRAMS[name]
    block = data.draw(st.sampled_from(program.schedules))
    k = data.draw(st.integers(0, len(block.steps)))
    session = Session.from_steps(program, block.steps[:k])
    idx = index(session.program)
    target = data.draw(st.sampled_from(list(idx.pos) + list(idx.inputs)))
    for option in legal_steps(session.program, target):
        result = Session(session.program).apply(option.step)
        assert isinstance(result, Program) == option.ok, (option, result)
