"""Every refusal rule of every schedule step: a program the step refuses, the message it
refuses with, and the line of docs/schedules.md that states the rule.

The table is checked against the code: every `error(…)` a step can raise (found by
reading cocoviz/ir/transforms/) must be produced by some row, so a rule added without a
row here — or a row whose rule was dropped — fails. tests/test_transforms_errors.py
checks the full text (hint, location, notes) of the main ones.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from cocoviz.errors import ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program
from cocoviz.ir.transforms.asslice import AsSlice
from cocoviz.ir.transforms.decompose import Decompose
from cocoviz.ir.transforms.fuse import Fuse
from cocoviz.ir.transforms.overlap import Overlap
from cocoviz.ir.transforms.step import Transformation
from cocoviz.schedule import apply_block

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMS = ROOT / "cocoviz" / "ir" / "transforms"
DOC = ROOT / "docs" / "schedules.md"


@dataclass(frozen=True)
class Refusal:
    id: str
    program: str
    """Program text without its header (ranks 4 unless it says otherwise)."""
    steps: tuple[str, ...]
    """Applied in order; every step but the last must apply, the last is refused."""
    message: str
    """A fragment of the refusal's message (after the `step:` prefix)."""
    doc: str
    """A fragment of docs/schedules.md stating the rule (whitespace-insensitive)."""


def _program(body: str) -> str:
    head = "" if body.lstrip().startswith("ranks") else "ranks 4\n"
    return f"program t\n{head}{body}"


SGD = """dim N = 64
input g : f32[N] local
input w : f32[N] replicated
g1 = allreduce(+, g)
w1 = update(w, w - 0.1 * g1)
output w1
"""

MM = """dim M = 16, K = 8, N = 8
input x : f32[M, K] local
input w : f32[K, N] replicated
p = matmul(x, w)
s = allreduce(+, p)
y = s * 2
output y
"""

ADAM_LIKE = """dim N = 64
input g : f32[N] local
input w : f32[N] replicated
input m : f32[N] replicated
g1 = allreduce(+, g)
m1 = update(m, 0.9 * m + 0.1 * g1)
mh = m1 * 2
w1 = update(w, w - 0.1 * mh)
output w1
"""

PIPE = """ranks tp=2, pp=2
dim N = 64
input g : f32[N] local
g1 = allreduce(+, g)
h = g1 * 2
r = send(h)
y = r + 1
output y
"""

GATHER_MM = """dim S = 16, H = 8, F = 8
input x : f32[S, H] sliced
input w : f32[H, F] replicated
xg = allgather(x)
h = matmul(xg, w)
output h
"""

A2A = """dim P = 4, R = 8, H = 8
input x : f32[P, R, H] sliced(1)
y = alltoall(x, to=2)
z = y * 2
output z
"""

R = Refusal
CASES: list[Refusal] = [
    # ------------------------------------------------------------------ split
    R("split-not-allreduce", MM, ("split(p)",), "'p' (matmul, f32[M, N] local) is not an allreduce",
      "Requires: `s` is an `allreduce`"),
    R("split-reduce", """dim N = 64
input g : f32[N] local
r = reduce(+, g, root=1)
output r
""", ("split(r)",), "'r' (reduce, f32[N] local) is not an allreduce", "Requires: `s` is an `allreduce`"),
    R("split-not-divisible", SGD.replace("N = 64", "N = 6"), ("split(g1)",),
      "has 6 elements, which do not divide by the 4 ranks", "whose element count divides by the group size G"),
    R("split-overlapped", MM, ("overlap(p, s, chunks=2)", "split(s)"),
      "'s' is in an overlapped group; split it before overlapping", "and is not in an overlapped group"),
    # ------------------------------------------------------------------ reorder
    R("reorder-not-allgather", SGD, ("split(g1)", "reorder(g1_rs)"),
      "(reducescatter, f32[N] sliced) is not an allgather or alltoall", "Requires: `ag` is an allgather"),
    R("reorder-over-dp-local", """ranks dp=2, tp=2
dim N = 64
input x : f32[N] sliced(over=dp)
input l : f32[N] local(over=dp)
xg = allgather(x, over=dp)
y = xg * l
output y
""", ("reorder(xg)",), "'y' reads 'l', which is local",
      "a value local over dp stops them, as a local one over tp does"),
    R("reorder-grouped-gather", MM, ("split(s)", "overlap(s_rs, s, chunks=2)", "reorder(s)"),
      "'s' is in a overlapped group; reorder before fusing or overlapping",
      "holds no other collective than `send` and no grouped stage"),
    R("reorder-nothing-reads", SGD.replace("w1 = update(w, w - 0.1 * g1)\noutput w1", "output g1"),
      ("split(g1)", "reorder(g1)"), "nothing reads 'g1', so there is nothing to move across it",
      "the region is not empty"),
    R("reorder-nothing-movable", MM.replace("y = s * 2", "y = matmul(s, w2)").replace(
        "input w : f32[K, N] replicated", "input w : f32[K, N] replicated\ninput w2 : f32[N, N] replicated"),
      ("split(s)", "reorder(s)"), "nothing can move across 's'", "the region is not empty"),
    R("reorder-lists-gather", SGD, ("split(g1)", "reorder(g1, g1)"),
      "'g1' is the allgather itself; list the stages to move across it",
      "the listed stages are distinct and do not include `ag` itself"),
    R("reorder-listed-twice", SGD, ("split(g1)", "reorder(g1, w1, w1)"), "'w1' is listed twice",
      "the listed stages are distinct"),
    R("reorder-cannot-move", MM.replace("y = s * 2", "q = s * 2\ny = allreduce(+, q)"),
      ("split(s)", "reorder(s, q, y)"), "cannot move 'y': 'y' (allreduce",
      "holds no other collective than `send`"),
    R("reorder-after-update", """dim N = 64
input v : f32[N] sliced
vg = allgather(v)
v1 = update(v, v * 0.5)
y = vg + 1
output y, v1
""", ("reorder(vg, y)",), "'y' comes after 'v1', which updates 'v' in place: on slices it would read 'v' after the update",
      "no member comes after the update of an input that `ag`'s operand reads"),
    R("reorder-not-closed", MM.replace("y = s * 2", "t = s + 1\nu = t * 2\ny = s * u"),
      ("split(s)", "reorder(s, y)"), "the region is not closed", "is *closed*"),
    R("reorder-not-connected", SGD.replace("output w1", "z = w * 2\noutput w1, z"),
      ("split(g1)", "reorder(g1, z)"), "no listed stage reads 'g1': the region is not connected to it",
      "reads `ag`"),
    R("reorder-independent-sliced", """dim N = 64
input g : f32[N] local
input v : f32[N] sliced
g1 = allreduce(+, g)
z = v * 2
y = g1 + z
output y
""", ("split(g1)", "reorder(g1, z, y)"), "'z' does not depend on 'g1', so it may join the region only if its other operands are replicated or scalar",
      "a member that does not depend on `ag` reads only replicated or scalar values"),
    R("reorder-local-operand", """dim N = 64
input g : f32[N] local
input l : f32[N] local
g1 = allreduce(+, g)
y = g1 * 2 + l
output y
""", ("split(g1)", "reorder(g1)"), "reads 'l', which is local",
      "no member reads a local value"),
    R("reorder-partial-sums", """dim B = 8, H = 16
input x : f32[B, H] sliced(1)
g = allgather(x)
m = sum(g, dim=1, keepdim=true)
output m
""", ("reorder(g)",), "'m' would hold partial sums on each rank (local) once moved before 'g'",
      "a member stays complete or partial as it was"),
    R("reorder-alltoall-partial-becomes-whole", """dim A = 8, B = 8
input x : f32[A, B] sliced(1)
h = alltoall(x, from=1, to=0)
m = mean(h, dim=0, keepdim=true)
y = h * 2
output m, y
""", ("reorder(h, m)",), "'m' would hold the whole value once moved before 'h'",
      "holds partial sums that\non the moved layout would be whole"),
    R("reorder-alltoall-comes-back-otherwise", """dim A = 8, B = 8, C = 8
input x : f32[A, B, C] sliced(0)
h = alltoall(x, from=0, to=1)
t = permute(h, 0, 2, 1)
output t
""", ("reorder(h)",), "'t' would not come back as it was",
      "every live-out comes back by the collective with the\ntype it had"),
    R("reorder-illegal-on-slices", """dim R = 2, N = 8
input g : f32[R, N] local
g1 = allreduce(+, g)
y = softmax(g1)
output y
""", ("split(g1)", "reorder(g1, y)"), "'y' would not be legal on slices", "every member is legal on its new layout"),
    # ------------------------------------------------------------------ asslice
    R("asslice-no-input-named", SGD, ("asslice(q)",), "no input named 'q'", "Requires: `t` is a replicated input"),
    R("asslice-of-a-stage", SGD, ("asslice(g1)",), "'g1' is a stage; asslice takes program inputs",
      "Requires: `t` is a replicated input"),
    R("asslice-listed-twice", SGD, ("split(g1)", "reorder(g1)", "asslice(w, w)"), "'w' is listed twice",
      "each input named once"),
    R("asslice-not-replicated", SGD, ("asslice(g)",), "input 'g' is local, not replicated",
      "Requires: `t` is a replicated input"),
    R("asslice-over-dp", """ranks dp=2, tp=2
dim N = 64
input g : f32[N] local(over=dp)
input w : f32[N] replicated
gs = reducescatter(+, g, over=dp)
w1 = update(w, slice(w, over=dp) - 0.1 * gs)
wf = allgather(w1, over=dp)
output wf
""", ("asslice(w)",), "asslice of 'w', laid out or gathered over dp, is not supported yet",
      "`asslice` of an input that it, a reader or its update lays out over dp"),
    R("asslice-whole-read", SGD, ("asslice(w)",), "'w1' reads all of 'w', not a slice of it",
      "every read of `t` is `slice(t)` with one slicing"),
    R("asslice-two-ways", """dim R = 4, N = 16
input g : f32[R, N] local
input w : f32[R, N] replicated
g1 = allreduce(+, g)
a = slice(w) * 2
b = slice(w, 1) * 3
output a, b
""", ("asslice(w)",), "'w' is sliced two ways", "every read of `t` is `slice(t)` with one slicing"),
    R("asslice-update-not-sliced", """dim N = 64
input g : f32[N] local
input w : f32[N] replicated
g1 = allreduce(+, g)
a = slice(w) * 2
w1 = update(w, g1 * 0.5)
output a, w1
""", ("asslice(w)",), "its update 'w1' writes a replicated value into 'w'",
      "the update writes a value with that slicing"),
    R("asslice-nothing-to-slice", SGD.replace("input w : f32[N] replicated", "input w : f32[N] replicated\ninput v : f32[N] replicated"), ("asslice(v)",), "'v' is not read through slice(v)",
      "every read of `t` is `slice(t)` with one slicing, or `t` is the target of its update"),
    # ------------------------------------------------------------------ fuse
    R("fuse-listed-twice", SGD, ("fuse(g1, g1)",), "'g1' is listed twice", "A fuse names at least two distinct stages"),
    R("fuse-cycle", """dim N = 64
input x : f32[N] replicated
p = x + 1
q = p * 2
r = x * 3
s = r + 1
output q, s
""", ("fuse(q, r)", "fuse(p, s)"), "the group would close a cycle through the existing fused group {q, r}",
      "It must not close a cycle through an existing fused group"),
    R("fuse-matmul", MM, ("split(s)", "fuse(p, s_rs)"), "'p' (matmul, f32[M, N] local) is a matmul; a fused group holds no matmul",
      "A group holds no `matmul`"),
    R("fuse-unsplit-allreduce", SGD, ("fuse(g1, w1)",), "is an unsplit allreduce", "no unsplit `allreduce`"),
    R("fuse-alltoall", A2A, ("fuse(y, z)",), "cannot be fused; fusable communication", "An alltoall is never fused"),
    R("fuse-two-collectives", PIPE, ("split(g1)", "reorder(g1)", "fuse(g1_rs, r)"), "the group would hold two collectives",
      "at most one reducescatter or send"),
    R("fuse-allgather-alone", SGD, ("split(g1)", "reorder(g1)", "fuse(w1_s, w1)"),
      "allgather 'w1' can end a fused group only after a reducescatter", "the allgathers gather group values and end the group"),
    R("fuse-rs-reads-inside", """dim N = 64
input g : f32[N] local
h = g * 2
hs = reducescatter(+, h)
y = hs + 1
output y
""", ("fuse(h, y)",), "the reducescatter 'hs' reads 'h' from inside the group; in a fused collective the reducescatter comes first",
      "The reducescatter comes first: it reads no value computed inside the group"),
    R("fuse-allgather-of-outside", SGD.replace("w1 = update(w, w - 0.1 * g1)", "w1 = update(w, w - 0.1 * g1)\nv = allgather(g1_x)")
      .replace("w1 = update", "g1_x = slice(w) * 2\nw1 = update"), ("split(g1)", "fuse(g1_rs, v)"),
      "gathers 'g1_x', which is not computed in the group", "the allgathers gather group values and end the group"),
    R("fuse-reads-own-allgather", ADAM_LIKE, ("split(g1)", "reorder(g1, m1)", "fuse(g1_rs, w1)"),
      "reads the allgather 'm1' inside the group; the allgathers end a fused collective",
      "No stage of the group may read one of its allgathers"),
    R("fuse-send-both-sides", PIPE, ("fuse(h, y)",), "the group computes both before the send 'r' and after it",
      "computation → send"),
    R("fuse-send-other-stage", PIPE.replace("y = r + 1", "y = r + 1\nz = g1 * 3").replace("output y", "output y, z"),
      ("fuse(r, y, z)",), "runs on pipeline stage 0, but the group computes on the receiving stage 1",
      "computation on the receiving pipeline stage"),
    R("fuse-overlapped", MM, ("overlap(p, s, chunks=2)", "fuse(s, y)"),
      "'s' is in an overlapped group; fuse stages before overlapping them", "fuse stages before overlapping them"),
    # ------------------------------------------------------------------ overlap
    R("overlap-one-chunk", MM, ("overlap(p, s, chunks=1)",), "chunks must be at least 2, got 1", "K ≥ 2 divides the rows"),
    R("overlap-not-reading", MM.replace("y = s * 2", "y = s * 2\nz = x * 3").replace("output y", "output y, z"),
      ("overlap(p, z, chunks=2)",), "'z' does not read the output of 'p'", "each reading its predecessor's output"),
    R("overlap-rows", MM, ("overlap(p, s, chunks=3)",), "chunks=3 does not divide the 16 rows of 'p'", "K ≥ 2 divides the rows"),
    R("overlap-listed-twice", MM, ("overlap(p, s, s, chunks=2)",), "'s' is listed twice", "at least two distinct items"),
    R("overlap-already", MM, ("overlap(p, s, chunks=2)", "overlap(s, y, chunks=2)"), "'s' is already in an overlapped group",
      "none already overlapped"),
    R("overlap-same-fused-group", MM, ("split(s)", "reorder(s)", "fuse(s_rs, y)", "overlap(s_rs, y, chunks=2)"),
      "name the same fused group", "two names of one fused group are one item"),
    R("overlap-cannot-chunk", MM.replace("y = s * 2", "y = s * sum(s)"), ("overlap(p, s, y, chunks=2)",),
      "cannot run chunk by chunk", "every stage can run chunk by chunk"),
    R("overlap-sliced-rows-read", """dim M = 16, N = 8
input x : f32[M, N] replicated
input v : f32[M, N] local
vr = reducescatter(+, v)
vg = allgather(vr)
y = x + vg
output y
""", ("reorder(vg, y)", "overlap(y_s, y, chunks=2)"), "sliced by rows outside the group",
      "no value sliced *by rows* outside the group is read inside"),
    R("overlap-slice-escapes", MM, ("split(s)", "reorder(s)", "overlap(p, s_rs, chunks=2)"),
      "'s_rs' is sliced and read by 'y_s' outside the group", "no sliced value made inside the group is read outside it"),
    R("overlap-rs-chunk", MM.replace("M = 16", "M = 4").replace("N = 8", "N = 2"), ("split(s)", "reorder(s)", "fuse(s_rs, y)", "overlap(p, s_rs, chunks=4)"),
      "each chunk of the reducescatter 's_rs' has 2 elements, which do not divide by the 4 ranks",
      "a chunked reducescatter has numel/K divisible by G"),
    R("overlap-rowwise-rows", """dim M = 8, K = 8, N = 16
input x : f32[M, K] local
input w : f32[K, N] replicated
p = matmul(x, w)
s = allreduce(+, p)
y = softmax(s)
output y
""", ("split(s)", "reorder(s)", "fuse(s_rs, y)", "overlap(p, s_rs, chunks=4)"),
      "works on whole rows, but each chunk's 2 rows do not divide by the 4 ranks",
      "rows/K divides by G when a row-wise op runs on slices"),
    R("overlap-between", MM.replace("y = s * 2", "t = s + 1\ny = s * t"), ("overlap(p, s, y, chunks=2)",),
      "lies between", "no stage outside lies between items"),
    R("overlap-a2a-chunk-op", A2A.replace("z = y * 2", "z = dropout(y, 0.1)"), ("overlap(y, z, chunks=2)",),
      "cannot run chunk by chunk in a group with an alltoall", "no member reduces to a scalar, reshapes, or reads"),
    R("overlap-a2a-dim0", A2A, ("overlap(y, z, chunks=8)",), "chunks=8 does not divide dimension 0 of 'y'",
      "K must divide that extent"),
    # ------------------------------------------------------------------ decompose
    R("decompose-over-dp", """ranks dp=2, tp=2
dim N = 64, K = 16
input x : f32[N, K] replicated local(over=dp)
input w : f32[K, N] replicated
y = matmul(x, w)
g = reducescatter(+, y, over=dp)
z = g * 2
output z
""", ("decompose(y, g)",), "a collective over dp, is not supported yet",
      "A collective over dp (docs/language.md, rank grids) is not decomposed yet"),
    R("decompose-neither", SGD, ("split(g1)", "decompose(g1_rs, g1)"), "is neither an allgather nor a matmul",
      "an allgather and a matmul reading it"),
    R("decompose-not-matmul", GATHER_MM.replace("h = matmul(xg, w)", "h = xg * 2").replace(
        "input w : f32[H, F] replicated\n", ""), ("decompose(xg, h)",), "is not a matmul", "an allgather and a matmul reading it"),
    R("decompose-batched", """dim B = 4, S = 8, H = 8, F = 8
input x : f32[B, S, H] sliced
input w : f32[B, H, F] replicated
xg = allgather(x)
h = matmul(xg, w)
output h
""", ("decompose(xg, h)",), "is a batched matmul", "the matmul's right operand has rank 2"),
    R("decompose-not-reading", GATHER_MM.replace("h = matmul(xg, w)", "h = matmul(w2, w)\nz = xg * 2").replace(
        "input w : f32[H, F] replicated", "input w : f32[H, F] replicated\ninput w2 : f32[S, H] replicated").replace(
        "output h", "output h, z"), ("decompose(xg, h)",), "does not read 'xg' as an operand", "reading it as exactly one operand"),
    R("decompose-both-operands", """dim S = 8
input x : f32[S, S] sliced
xg = allgather(x)
h = matmul(xg, xg)
output h
""", ("decompose(xg, h)",), "reads 'xg' as both operands", "reading it as exactly one operand"),
    R("decompose-result-sliced", """dim S = 16, H = 8, F = 8
input x : f32[H, F] sliced
input a : f32[S, H] sliced
xg = allgather(x)
h = matmul(a, xg)
output h
""", ("decompose(xg, h)",), "'h' is sliced; decompose writes each shard's product into a result whose rows every rank holds", "the matmul's result is not sliced by rows"),
    R("decompose-shards", """dim S = 2, H = 8, F = 8
input x : f32[S, H] sliced
input w : f32[H, F] replicated
xg = allgather(x)
h = matmul(xg, w)
output h
""", ("decompose(xg, h)",), "cannot split the left operand of 'h'", "the shards are blocks of rows, columns or the contraction"),
    R("decompose-not-rs", MM, ("decompose(p, s)",), "is not a reducescatter", "a matmul and a reducescatter of its result"),
    R("decompose-rs-other", MM.replace("s = allreduce(+, p)", "q = p * 2\ns = allreduce(+, q)").replace("y = s * 2", "y = s * 2 + p"),
      ("split(s)", "decompose(p, s_rs)"), "does not reduce 'p' itself", "a matmul and a reducescatter of its result"),
    R("decompose-result-read", MM.replace("y = s * 2", "y = s * 2 + p"), ("split(s)", "decompose(p, s_rs)"),
      "is read by 'y'", "the matmul's result is read only by the reducescatter, is not an output"),
    R("decompose-rows", MM.replace("M = 16", "M = 6"), ("split(s)", "decompose(p, s_rs)"),
      "the 6 rows of 'p'", "its rows divide by G"),
    R("decompose-mm-overlapped", MM, ("split(s)", "reorder(s)", "fuse(s_rs, y)", "overlap(p, s_rs, chunks=2)", "decompose(p, s_rs)"),
      "'p' is already in an overlapped group", "neither already grouped"),
    R("decompose-rs-overlapped", MM, ("split(s)", "reorder(s)", "overlap(s_rs, y_s, y, chunks=2)", "decompose(p, s_rs)"),
      "'s_rs' is already in an overlapped group", "neither already grouped"),
    R("decompose-ag-fused", """dim S = 16, H = 8, F = 8
input x : f32[S, H] local
input w : f32[H, F] replicated
s = allreduce(+, x)
t = s * 2
h = matmul(t, w)
output h
""", ("split(s)", "reorder(s, t)", "fuse(s_rs, t)", "decompose(t, h)"),
      "'t' is in the fused group", "decompose before fusing an allgather"),
    R("decompose-between", """dim S = 8
input x : f32[S, S] sliced
xg = allgather(x)
q = xg * 2
h = matmul(xg, q)
output h
""", ("decompose(xg, h)",), "lies between", "no stage outside lies between the two"),
    R("overlap-cycle", """dim M = 16, K = 8, N = 8
input x : f32[M, K] local
input x2 : f32[M, N] local
input w : f32[K, N] replicated
p = matmul(x, w)
f1 = p * 3
f2 = x2 * 2
y = p + f2
s = allreduce(+, y)
output s, f1
""", ("fuse(f1, f2)", "overlap(p, y, s, chunks=2)"), "the group would close a cycle through the fused group",
      "no stage outside lies between items"),
    R("decompose-transpose-inside", """dim B = 16, H = 8, F = 8
input x : f32[B, H] local
input dy : f32[B, F] local
gw = matmul(transpose(x, 0, 1), dy)
gs = reducescatter(+, gw)
output gs
""", ("decompose(gw, gs)",), "multiplies a transpose of its operand", "make the transpose a stage of its own"),
    # ------------------------------------------------------------------ any step
    R("no-stage-named", SGD, ("split(g2)",), "no stage named 'g2'", "Every step refuses a name that is not a stage of the program"),
    R("input-not-stage", SGD, ("split(g)",), "'g' is an input, not a stage", "an input or a param where a stage is expected"),
    R("param-not-stage", SGD.replace("dim N = 64", "dim N = 64\nparam lr: f32 = 0.1"), ("split(lr)",),
      "'lr' is a param, not a stage", "an input or a param where a stage is expected"),
    R("breaks-group", MM.replace("y = s * 2", "y = s + r").replace("input w : f32[K, N] replicated", "input w : f32[K, N] replicated\ninput r : f32[M, N] replicated"),
      ("split(s)", "reorder(s)", "fuse(s_rs, y)", "overlap(p, s_rs, chunks=2)", "asslice(r)"), "it would break the overlapped group",
      "would leave an existing fused or overlapped group breaking the rules of the step that made it"),
]  # fmt: skip


@dataclass(frozen=True)
class ApiRefusal:
    """A refusal only a caller of the Python API can meet: the step's text form is
    refused earlier, by its argument count (cocoviz/ir/transforms/__init__.py)."""

    id: str
    program: str
    step: Transformation
    message: str
    doc: str


API_CASES: list[ApiRefusal] = [
    ApiRefusal("fuse-one-stage", SGD, Fuse(stages=("g1",)), "name at least two stages",
               "The group is the convex hull"),
    ApiRefusal("overlap-one-item", MM, Overlap(items=("p",), chunks=2), "name at least two items",
               "Requires: at least two distinct items"),
    ApiRefusal("decompose-three-items", GATHER_MM, Decompose(items=("xg", "h", "h")), "name two items",
               "Requires: two stages"),
    ApiRefusal("asslice-no-input", SGD, AsSlice(tensors=()), "name at least one input",
               "Requires: `t` is a replicated input"),
]  # fmt: skip

UNREACHABLE = {
    ("decompose.py", "'{}' is {}, not partial sums"):
        "a reducescatter of a sliced value is refused by the layout rules before any step",
    ("decompose.py", "'{}' is not the first stage of its fused group"):
        "fuse puts a group's reducescatter first (it reads nothing computed in the group)",
    ("asslice.py", "the gather '{}' of '{}' is in an overlapped group; asslice before overlapping"):
        "overlap refuses the group such a gather ends: the sliced update it gathers would "
        "be the new value of an input, made inside the group",
}  # fmt: skip
"""Refusals kept as defences although no program that other rules accept reaches them:
(file, the message with each interpolation as {}) → why."""


def _refusal(case: Refusal) -> ScheduleError:
    text = _program(case.program) + "\nschedule ok {\n" + "\n".join(case.steps[:-1]) + "\n}\n"
    text += "schedule s {\n" + "\n".join(case.steps) + "\n}\n"
    program = load_program(text, "t.coco")
    blocks = {b.name: b for b in program.schedules}
    if len(case.steps) > 1:
        apply_block(program, blocks["ok"])  # the steps before the refused one apply
    with pytest.raises(ScheduleError) as info:
        apply_block(program, blocks["s"])
    return info.value


def _api_refusal(case: ApiRefusal) -> ScheduleError:
    program: Program = load_program(_program(case.program), "t.coco")
    with pytest.raises(ScheduleError) as info:
        case.step.apply(program)
    return info.value


@cache
def _message(case_id: str) -> str:
    case = next((c for c in CASES if c.id == case_id), None)
    if case is not None:
        return _refusal(case).message
    return _api_refusal(next(c for c in API_CASES if c.id == case_id)).message


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_step_refuses_through_the_api(case: ApiRefusal) -> None:
    message = _message(case.id)
    assert message.startswith(f"{case.step.name}: "), message
    assert case.message in message, message


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_step_refuses(case: Refusal) -> None:
    message = _message(case.id)
    step = case.steps[-1].split("(", 1)[0]
    assert message.startswith(f"{step}: "), message
    assert case.message in message, message


def _normal(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("case", [*CASES, *API_CASES], ids=[c.id for c in [*CASES, *API_CASES]])
def test_refusal_is_documented(case: Refusal | ApiRefusal) -> None:
    assert _normal(case.doc) in _normal(DOC.read_text(encoding="utf-8")), case.doc


def _template(node: ast.expr) -> str | None:
    """The message of an `error(…)` call with each interpolated part as `{}` (a message
    held in a variable is all `{}`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)  # type: ignore[misc]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _template(node.left), _template(node.right)
        return a + b if a is not None and b is not None else None
    return "{}"


def _regex(template: str) -> str:
    return ".*".join(re.escape(part) for part in template.split("{}"))


def refusal_sites() -> list[tuple[str, int, str]]:
    """(file, line, message template) of every refusal a step raises with `error(…)`."""
    out = []
    for path in sorted(TRANSFORMS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "error"
                and node.args
            ):
                tpl = _template(node.args[0])
                assert tpl is not None, f"{path.name}:{node.lineno}"
                out.append((path.name, node.lineno, tpl))
    return out


def test_every_refusal_in_the_code_has_a_case() -> None:
    sites = refusal_sites()
    assert len(sites) > 60  # the scan sees the steps' refusals
    messages = [_message(c.id).split(": ", 1)[1] for c in [*CASES, *API_CASES]]
    missing = [
        f"{f}:{line}: {tpl}"
        for f, line, tpl in sites
        if (f, tpl) not in UNREACHABLE
        and not any(re.fullmatch(_regex(tpl), m, re.S) for m in messages)
    ]
    assert not missing, "refusals without a case in CASES:\n" + "\n".join(missing)
    stale = set(UNREACHABLE) - {(f, tpl) for f, _, tpl in sites}
    assert not stale, f"UNREACHABLE names refusals the code no longer has: {stale}"


def test_the_coverage_check_can_fail() -> None:
    """A refusal with no case is reported: the templates match only their own messages."""
    messages = [_message(c.id).split(": ", 1)[1] for c in CASES if c.id != "fuse-rs-reads-inside"]
    tpl = next(t for f, _, t in refusal_sites() if f == "fuse.py" and "comes first" in t)
    assert not any(re.fullmatch(_regex(tpl), m, re.S) for m in messages)
