"""The exact text of each precondition failure: message, hint, and where it points
(the step in its schedule block, with a note at the offending stage)."""

from __future__ import annotations

import pytest
from transforms_util import ROOT

from cocoviz.errors import ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import StepCall
from cocoviz.ir.transforms import from_call
from cocoviz.schedule import apply_block


def refused(text: str, block: str = "s") -> ScheduleError:
    """The error of schedule block `block` of a program text."""
    program = load_program(text, "t.coco")
    sched = next(b for b in program.schedules if b.name == block)
    with pytest.raises(ScheduleError) as info:
        apply_block(program, sched)
    return info.value


def with_schedule(sample: str, *steps: str) -> str:
    text = (ROOT / "samples" / f"{sample}.coco").read_text()
    return text + "\nschedule s {\n" + "\n".join(f"  {s}" for s in steps) + "\n}\n"


def where(err: ScheduleError) -> tuple[int, int] | None:
    return (err.span.line, err.span.col) if err.span else None


def note_lines(err: ScheduleError) -> list[tuple[str, int]]:
    return [(n, s.line) for n, s in err.diagnostics[0].notes if s is not None]


def last_line(text: str) -> int:
    """The line of the last step of the appended block."""
    return len(text.splitlines()) - 1


def test_split_of_a_non_allreduce() -> None:
    text = with_schedule("megatron_mlp", "split(layer)")
    err = refused(text)
    assert err.message == "split: 'layer' (matmul, f16[B, S, H] local) is not an allreduce"
    assert err.hint == "split applies to an allreduce; the allreduces here are sum"
    assert where(err) == (last_line(text), 3)
    assert note_lines(err) == [("'layer' is defined here", 16)]


def test_reorder_with_a_local_operand() -> None:
    err = refused(
        """program local_operand
ranks 4
dim N = 64
input g : f32[N] local
input l : f32[N] local
g1 = allreduce(+, g)
y = g1 * 2 + l
output y
schedule s {
  split(g1)
  reorder(g1)
}
"""
    )
    assert err.message == (
        "reorder: 'y' reads 'l', which is local (f32[N] local): on slices it would combine "
        "sliced and local values"
    )
    assert err.hint == "reduce 'l' first (allreduce or reducescatter)"
    assert where(err) == (11, 3)
    assert note_lines(err) == [("'y' is defined here", 7)]


def test_reorder_of_a_non_closed_region() -> None:
    text = with_schedule("megatron_attention_out", "split(attn)", "reorder(attn, out)")
    err = refused(text)
    assert err.message == (
        "reorder: the region is not closed: 'h' (elementwise, f16[B, S, H] replicated) lies "
        "between 'attn' and 'out' but is not in it"
    )
    assert err.hint == "list it too: reorder(attn, h, out)"
    assert where(err) == (last_line(text), 3)
    assert note_lines(err) == [("'h' is defined here", 22)]


def test_reorder_of_a_non_allgather_says_split_first() -> None:
    err = refused(with_schedule("sgd", "reorder(g1)"))
    assert err.message == "reorder: 'g1' (allreduce, f32[N] replicated) is not an allgather or alltoall"
    assert err.hint == "split it first: split(g1), then reorder(g1)"


def test_fuse_closing_a_cycle_through_an_existing_group() -> None:
    # CoCoNet's cycle check could never fire; here p → q and r → s with {q, r} fused.
    err = refused(
        """program cyc
ranks 4
dim N = 64
input x : f32[N] replicated
p = x + 1
q = p * 2
r = x * 3
s = r + 1
output q, s
schedule s {
  fuse(q, r)
  fuse(p, s)
}
"""
    )
    assert err.message == (
        "fuse: the group would close a cycle through the existing fused group {q, r}: "
        "p → {q, r} → s (that group runs as one unit, so it would have to run both after and "
        "before the new one)"
    )
    assert err.hint == "include that group's stages in this fuse, or fuse fewer stages"
    assert where(err) == (12, 3)
    assert note_lines(err) == [("'q' is defined here", 6)]


def test_two_collectives_in_one_fused_group() -> None:
    text = with_schedule("pipeline_stage", "split(sum)", "reorder(sum)", "fuse(sum_rs, recv)")
    err = refused(text)
    assert err.message == (
        "fuse: the group would hold two collectives, reducescatter 'sum_rs' and send 'recv'; a "
        "fused group holds one reducescatter (with the allgathers that end it) or one send"
    )
    assert err.hint == "fuse them separately; overlap(…) pipelines consecutive collectives"
    assert where(err) == (last_line(text), 3)
    assert note_lines(err) == [("'recv' is defined here", 20)]


def test_fuse_refuses_matmul_and_unsplit_allreduce_with_hints() -> None:
    err = refused(with_schedule("megatron_mlp", "fuse(layer, sum)"))
    assert err.message == (
        "fuse: 'layer' (matmul, f16[B, S, H] local) is a matmul; a fused group holds no matmul"
    )
    assert err.hint == "use overlap(layer, …) to stream its chunks into the next stage"
    err = refused(with_schedule("megatron_mlp", "fuse(sum, out)"))
    assert err.message == (
        "fuse: 'sum' (allreduce, f16[B, S, H] replicated) is an unsplit allreduce, which "
        "cannot take computation inside it"
    )
    assert err.hint == "split first: split(sum), then reorder(sum)"


OVERLAP_PROGRAM = """program ol
ranks 4
dim M = 64, K = 32, N = 16
input a : f32[M, K] replicated
input b : f32[K, N] replicated
c = matmul(a, b)
s = sum(c)
output s
schedule s {
  STEP
}
"""


def test_overlap_with_a_consumer_that_cannot_be_chunked() -> None:
    err = refused(OVERLAP_PROGRAM.replace("STEP", "overlap(c, s, chunks=4)"))
    assert err.message == (
        "overlap: 's' (sum, f32[] replicated) cannot run chunk by chunk: it reduces a whole "
        "tensor to a scalar, which needs every chunk"
    )
    assert err.hint == "leave it out of the overlapped group"
    assert where(err) == (10, 3)
    assert note_lines(err) == [("'s' is defined here", 7)]


def test_overlap_chunks_must_divide_rows() -> None:
    err = refused(OVERLAP_PROGRAM.replace("STEP", "overlap(c, s, chunks=5)"))
    assert err.message == (
        "overlap: chunks=5 does not divide the 64 rows of 'c' ([M, N]; rows are all dimensions "
        "but the last)"
    )
    assert err.hint == "legal: chunks=2, 4, 8, 16, 32, 64"


def test_overlap_refuses_a_slice_leaving_the_group() -> None:
    err = refused(
        with_schedule("megatron_mlp", "split(sum)", "reorder(sum)", "overlap(layer, sum_rs)")
    )
    assert err.message == (
        "overlap: 'sum_rs' is sliced and read by 'out_s' outside the group; inside an "
        "overlapped group slices are laid out chunk by chunk, so no slice may leave it"
    )


def test_asslice_of_a_whole_read() -> None:
    err = refused(with_schedule("adam", "asslice(m)"))
    assert err.message == (
        "asslice: 'm1' reads all of 'm', not a slice of it: every use must be slice(m) or the "
        "target of its update"
    )
    assert err.hint == "move 'm1' across the allgather first (reorder), so that it reads slice(m)"


@pytest.mark.parametrize(
    ("step", "message", "hint"),
    [
        ("splt(sum)", "unknown step 'splt'", "did you mean 'split'?"),
        (
            "frobnicate(sum)",
            "unknown step 'frobnicate'",
            "the steps are split, reorder, asslice, dce, fuse, overlap, decompose",
        ),
        (
            "split(sum, out)",
            "split: takes one stage (an allreduce), got 2 arguments",
            "usage: split(STAGE)  — STAGE is an allreduce",
        ),
        ("dce(x)", "dce: takes no arguments, got 1 argument", "usage: dce()"),
        (
            "fuse(out)",
            "fuse: takes two or more stages, got 1 argument",
            "usage: fuse(STAGE, STAGE, …)",
        ),
        (
            "overlap(layer, sum, chunk=4)",
            "overlap: unknown keyword 'chunk'",
            "did you mean 'chunks'?",
        ),
        (
            "split(sum, chunks=2)",
            "split: unknown keyword 'chunks'",
            "split takes no keyword arguments",
        ),
    ],
)
def test_step_call_errors(step: str, message: str, hint: str) -> None:
    from cocoviz.ir.syntax import parse_steps

    (call,) = parse_steps(step)
    with pytest.raises(ScheduleError) as info:
        from_call(call)
    assert (info.value.message, info.value.hint) == (message, hint)


def test_unknown_stage_points_at_the_argument() -> None:
    text = with_schedule("megatron_mlp", "split(summ)")
    err = refused(text)
    assert err.message == "split: no stage named 'summ'"
    assert err.hint == "did you mean 'sum'?"
    assert where(err) == (last_line(text), 9)


def test_steps_without_location_point_at_the_stage() -> None:
    from cocoviz.ir.transforms import Split

    program = load_program((ROOT / "samples" / "sgd.coco").read_text(), "sgd.coco")
    with pytest.raises(ScheduleError) as info:
        Split(stage="m1").apply(program)
    assert where(info.value) == (17, 1)
    assert info.value.diagnostics[0].notes == ()


def test_from_call_builds_the_named_transformation() -> None:
    t = from_call(StepCall("overlap", ("a", "b"), (("chunks", 8),)))
    assert str(t) == "overlap(a, b, chunks=8)"
    assert str(from_call(StepCall("overlap", ("a", "b")))) == "overlap(a, b, chunks=4)"


def test_a_broken_invariant_is_an_internal_error_naming_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses
    from typing import ClassVar

    from cocoviz.errors import InternalError
    from cocoviz.ir.nodes import Program as P
    from cocoviz.ir.transforms.base import Edit
    from cocoviz.ir.transforms.step import Transformation

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Swap(Transformation):
        """A buggy step: moves the last stage first (it then reads later stages)."""

        name: ClassVar[str] = "swap"
        signature: ClassVar[str] = "swap()"

        def step(self) -> StepCall:
            return StepCall("swap")

        def rewrite(self, program: P) -> Edit:
            stages = program.stages[-1:] + program.stages[:-1]
            return Edit(dataclasses.replace(program, stages=stages), moved={s.name for s in stages})

    program = load_program((ROOT / "samples" / "sgd.coco").read_text(), "sgd.coco")
    with pytest.raises(InternalError) as info:
        Swap().apply(program)
    assert str(info.value) == (
        "IR invariant broken after step `swap()`: the program no longer type-checks: "
        "unknown name 'm1'"
    )
    # The incremental checks of large programs find it too.
    monkeypatch.setenv("COCOVIZ_VERIFY", "fast")
    with pytest.raises(InternalError) as info:
        Swap().apply(program)
    assert str(info.value) == (
        "IR invariant broken after step `swap()`: 'w1' reads 'm1', which comes after it"
    )
