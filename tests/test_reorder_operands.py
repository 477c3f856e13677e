"""`reorder` and the replicated operands of the stages it moves (docs/schedules.md,
reorder): replicated operands of the sliced shape become `slice(x)`; broadcast operands
(a bias `b[H]`) stay whole and are read at each element's global position — also in a
listed member that does not depend on the allgather. Checked on a size where a rank's
part is not a multiple of H (3·8 elements over 4 ranks: 6 each), where slicing the bias
would read the wrong elements."""

from __future__ import annotations

from cocoviz.exec import verify
from cocoviz.ir.lower import load_program
from cocoviz.ir.printer import format_stage
from cocoviz.schedule import apply_block

TEXT = """program bias
ranks 4
dim M = 3, H = 8
input g : f32[M, H] local
input b : f32[H] replicated
input r : f32[M, H] replicated
g1 = allreduce(+, g)
bb = b * 2
rr = r * 3
y = g1 + bb + rr
output y
schedule s {
  split(g1)
  reorder(g1, bb, rr, y)
}
"""


def test_a_broadcast_operand_stays_whole_and_a_full_one_is_sliced() -> None:
    original = load_program(TEXT, "bias.coco")
    scheduled = apply_block(original, original.schedules[0])
    stages = {s.name: format_stage(s) for s in scheduled.stages}
    assert stages["bb"] == "bb = b * 2", stages
    assert stages["rr"] == "rr = slice(r) * 3", stages
    assert scheduled.type_of("bb") == original.type_of("bb")  # still f32[H] replicated
    report = verify.verify_programs(original, scheduled)
    assert report.ok, report.format_report()
