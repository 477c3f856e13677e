"""The updated-state pattern (docs/schedules.md, reorder): an optimizer that also
outputs its updated state is scheduled with the default `reorder` region, because the
update of a replicated input whose gather `asslice` removes does not stop the region;
where the region still stops early, fuse's refusal names the reorder that works."""

from __future__ import annotations

import pytest
from transforms_util import ROOT

from cocoviz.cli import main
from cocoviz.errors import ScheduleError
from cocoviz.exec import verify
from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.ir.nodes import COLLECTIVES, Op, Program, ScheduleBlock
from cocoviz.ir.transforms import Reorder
from cocoviz.schedule import apply_block, apply_steps

PROGRAMS = ROOT / "tests" / "programs"
STATE = {"rmsprop": ("s",), "adam_state": ("m", "v"), "lamb_state": ("m", "v")}
CASES = [
    (name, ranks, block)
    for name in STATE
    for ranks in ("2", "4", "8")
    for block in ("rs_c_ag", "fused")
]

RMSPROP_HEAD = """program rmsprop_var
ranks 4
dim N = 96
param lr: f32 = 0.01, rho: f32 = 0.9, eps: f32 = 1e-8
input g : f32[N] local
input w : f32[N] replicated
input s : f32[N] replicated
"""


def program(name: str, ranks: str | None = None) -> Program:
    r = RanksOverride.parse(ranks) if ranks else None
    return load_file(PROGRAMS / f"{name}.coco", None, r)


def block(p: Program, name: str) -> ScheduleBlock:
    return next(b for b in p.schedules if b.name == name)


def moved_by_default(p: Program, gather: str) -> set[str]:
    """The computation stages of `p` that the default `reorder(gather)` moves onto
    slices (a sliced live-out `c` becomes `c_s`, gathered into `c`)."""
    after = Reorder(gather=gather).apply(p)
    return {
        s.name
        for s in p.stages
        if s.expr.op not in COLLECTIVES
        and (after.has_stage(f"{s.name}_s") or after.stage(s.name).ty.layout.is_sliced)
    }


# --- the pattern verifies with the default region --------------------------------------


@pytest.mark.parametrize(("name", "ranks", "sched"), CASES)
def test_updated_state_schedules_verify(name: str, ranks: str, sched: str) -> None:
    original = program(name, ranks)
    b = block(original, sched)
    reorders = [s for s in b.steps if s.name == "reorder"]
    assert [len(s.args) for s in reorders] == [1]  # the default region
    scheduled = apply_block(original, b)
    report = verify.verify_programs(original, scheduled)
    assert report.ok, report.format_report()
    # The state is stored sliced, its update is no longer gathered, and it is still an
    # output (now sliced: the same global value).
    for t in STATE[name]:
        assert next(i for i in scheduled.inputs if i.name == t).ty.layout.is_sliced
        upd = next(
            s for s in scheduled.stages if s.expr.op is Op.UPDATE and s.expr.args[0].name == t
        )
        assert upd.name in scheduled.outputs
        assert not any(
            s.expr.op is Op.ALLGATHER and s.expr.args[0].name == upd.name for s in scheduled.stages
        )


@pytest.mark.parametrize("name", list(STATE))
def test_fused_schedule_is_one_fused_collective(name: str) -> None:
    original = program(name)
    scheduled = apply_block(original, block(original, "fused"))
    assert len(scheduled.groups) == 1
    members = set(scheduled.groups[0].stages())
    ops = [s.expr.op for s in scheduled.stages if s.name in members]
    assert ops[0] is Op.REDUCESCATTER and ops[-1] is Op.ALLGATHER
    # Every stage runs inside the group, the weights' gather ending it.
    assert {s.name for s in scheduled.stages} == members


def test_default_region_of_rmsprop_reaches_the_weights() -> None:
    p = apply_steps(program("rmsprop"), ["split(gs)"])
    assert moved_by_default(p, "gs") == {"s1", "w1"}
    # The same program as the region listed by hand.
    assert Reorder(gather="gs").apply(p) == apply_steps(p, ["reorder(gs, s1, w1)"])


@pytest.mark.parametrize("name", list(STATE))
def test_cli_check_apply_and_verify(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(PROGRAMS / f"{name}.coco")
    steps = [str(s) for s in block(program(name), "fused").steps]
    assert main(["check", path]) == 0
    assert main(["apply", path, *steps]) == 0
    assert "fused {" in capsys.readouterr().out
    for ranks in ("2", "8"):
        assert main(["verify", path, "--schedule", "fused", "--ranks", ranks]) == 0


# --- where the region still stops ------------------------------------------------------


def split_gs(body: str) -> Program:
    p = load_program(RMSPROP_HEAD + body, "t.coco")
    return apply_steps(p, ["split(gs)"])


def test_state_read_whole_elsewhere_stops_the_region() -> None:
    # sn reads all of s: asslice(s) cannot apply, so s1 has to be gathered.
    p = split_gs(
        "sn = norm(s)\n"
        "gs = allreduce(+, g)\n"
        "s1 = update(s, rho * s + (1 - rho) * gs * gs)\n"
        "w1 = update(w, w - lr * gs / (sqrt(s1) + eps))\n"
        "output w1, s1, sn\n"
    )
    assert moved_by_default(p, "gs") == {"s1"}


def test_update_read_outside_the_region_stops_it() -> None:
    # q combines s1 with a local value, so it cannot move: s1 is gathered for it.
    p = split_gs(
        "gs = allreduce(+, g)\n"
        "s1 = update(s, rho * s + (1 - rho) * gs * gs)\n"
        "w1 = update(w, w - lr * gs / (sqrt(s1) + eps))\n"
        "q = s1 * g\n"
        "sr = allreduce(+, q)\n"
        "output w1, s1, sr\n"
    )
    assert moved_by_default(p, "gs") == {"s1"}


def test_output_that_is_not_an_update_stops_the_region() -> None:
    p = split_gs(
        "gs = allreduce(+, g)\n"
        "y = gs * 2\n"
        "z = y + 1\n"
        "s1 = update(s, rho * s + (1 - rho) * gs * gs)\n"
        "w1 = update(w, w - lr * gs / (sqrt(s1) + eps))\n"
        "output w1, s1, y, z\n"
    )
    assert moved_by_default(p, "gs") == {"y", "s1", "w1"}


def test_state_read_by_later_stages_in_the_region_moves_with_it() -> None:
    text = (
        "gs = allreduce(+, g)\n"
        "s1 = update(s, rho * s + (1 - rho) * gs * gs)\n"
        "w1 = update(w, w - lr * gs / (sqrt(s1) + eps))\n"
        "k = s1 * 2 + w1\n"
        "output w1, s1, k\n"
        "schedule fused {\n  split(gs)\n  reorder(gs)\n  asslice(s)\n  dce()\n  fuse(gs_rs, k)\n}\n"
    )
    p = split_gs(text)
    assert moved_by_default(p, "gs") == {"s1", "w1", "k"}
    for ranks in ("2", "4", "8"):
        original = load_program(RMSPROP_HEAD.replace("ranks 4", f"ranks {ranks}") + text, "t.coco")
        scheduled = apply_block(original, block(original, "fused"))
        report = verify.verify_programs(original, scheduled)
        assert report.ok, report.format_report()


def test_one_state_tensor_stops_the_region_and_the_other_does_not() -> None:
    # m is also read whole (mn): m1 stops the region; v1 does not.
    text = (PROGRAMS / "adam_state.coco").read_text()
    text = text.replace("g1 = allreduce(+, g)\n", "mn = norm(m)\ng1 = allreduce(+, g)\n")
    text = text.replace("output w1, m1, v1", "output w1, m1, v1, mn")
    p = apply_steps(load_program(text, "t.coco"), ["split(g1)"])
    assert moved_by_default(p, "g1") == {"gf", "m1", "v1", "vh"}


# --- the refusal names the region that works -------------------------------------------


def hinted_reorder(err: ScheduleError) -> str:
    assert err.hint is not None
    assert err.hint.startswith("reorder(")
    return err.hint[: err.hint.index(")") + 1]


@pytest.mark.parametrize(
    ("name", "steps", "message", "want"),
    [
        (
            "rmsprop",
            ["split(gs)", "reorder(gs, s1)", "asslice(s)", "dce()", "fuse(gs_rs, w1)"],
            "fuse: 'w1' reads the allgather 'gs' inside the group; the allgathers end a "
            "fused collective",
            "reorder(gs, s1, w1)",
        ),
        (
            "rmsprop",
            ["split(gs)", "fuse(gs_rs, w1)"],
            "fuse: 's1' reads the allgather 'gs' inside the group; the allgathers end a "
            "fused collective",
            "reorder(gs, s1, w1)",
        ),
        (
            # The region stopped early and g1 itself is gone (nothing reads it).
            "adam_state",
            ["split(g1)", "reorder(g1, gf, m1, v1)", "asslice(m, v)", "dce()", "fuse(g1_rs, w1)"],
            "fuse: 'mh' reads the allgather 'm1' inside the group; the allgathers end a "
            "fused collective",
            "reorder(g1, gf, m1, v1, mh, vh, w1)",
        ),
        (
            "lamb_state",
            ["split(g1)", "reorder(g1, m1, v1)", "asslice(m, v)", "dce()", "fuse(g1_rs, wn, w1)"],
            "fuse: 'r' reads the allgather 'm1' inside the group; the allgathers end a "
            "fused collective",
            "reorder(g1, m1, v1, r, rn, wn, w1)",
        ),
    ],
)
def test_refusal_names_the_reorder_that_works(
    name: str, steps: list[str], message: str, want: str
) -> None:
    original = program(name)
    with pytest.raises(ScheduleError) as info:
        apply_steps(original, steps)
    err = info.value
    assert err.message == message
    assert hinted_reorder(err) == want
    assert f"hint: {want}" in err.render()
    # The hinted region, as the schedule's reorder, makes the same fuse work.
    fixed = [s for s in steps if not s.startswith("reorder(")]
    fixed.insert(1, want)
    scheduled = apply_steps(original, fixed)
    assert len(scheduled.groups) == 1
    report = verify.verify_programs(original, scheduled)
    assert report.ok, report.format_report()


def test_refusal_after_an_early_default_region_names_the_working_region() -> None:
    # q reads s1 with a local value, so the default region stops at s1 (s1 has to be
    # gathered for q); fusing the weights' update is still possible with a listed region.
    text = RMSPROP_HEAD + (
        "gs = allreduce(+, g)\n"
        "s1 = update(s, rho * s + (1 - rho) * gs * gs)\n"
        "w1 = update(w, w - lr * gs / (sqrt(s1) + eps))\n"
        "q = s1 * g\n"
        "sr = allreduce(+, q)\n"
        "output w1, s1, sr\n"
    )
    original = load_program(text, "t.coco")
    with pytest.raises(ScheduleError) as info:
        apply_steps(original, ["split(gs)", "reorder(gs)", "fuse(gs_rs, w1)"])
    want = hinted_reorder(info.value)
    assert want == "reorder(gs, s1, w1)"
    steps = ("split(gs)", want, "fuse(gs_rs, w1)")
    scheduled = apply_steps(original, steps)
    report = verify.verify_programs(original, scheduled)
    assert report.ok, report.format_report()


def test_programs_are_the_samples_plus_state_outputs() -> None:
    # adam_state and lamb_state differ from the samples only in what they output (and
    # their sizes and schedules), so the samples' own schedules keep covering the rest.
    for name, sample in (("adam_state", "adam"), ("lamb_state", "lamb")):
        ours = load_file(PROGRAMS / f"{name}.coco")
        theirs = load_file(ROOT / "samples" / f"{sample}.coco", {"N": 96})
        assert ours.stages == theirs.stages
        assert set(ours.outputs) == set(theirs.outputs) | {"m1", "v1"}
