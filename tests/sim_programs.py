"""Scheduled programs written out in printed form (`fused { … }`, `overlapped chunks=K
{ … }`), so simulator tests do not depend on the schedule transformations."""

from __future__ import annotations

from cocoviz.ir.lower import RanksOverride, load_program
from cocoviz.ir.nodes import Program

ADAM_HEAD = """
program adam
ranks 16
dim N = 1048576
param lr: f32 = 0.001, beta1: f32 = 0.9, beta2: f32 = 0.999, eps: f32 = 1e-8, t: f32 = 1
input g : f16[N] local
input w : f32[N] replicated
"""

# AR-C: allreduce, then the update as one fused kernel.
ADAM_AR_C = (
    ADAM_HEAD
    + """
input m : f32[N] replicated
input v : f32[N] replicated
g1 = allreduce(+, g)
fused {
  gf = cast(f32, g1)
  m1 = update(m, beta1 * m + (1 - beta1) * gf)
  v1 = update(v, beta2 * v + (1 - beta2) * gf * gf)
  mh = m1 / (1 - pow(beta1, t))
  vh = v1 / (1 - pow(beta2, t))
  w1 = update(w, w - lr * mh / (sqrt(vh) + eps))
}
output w1
"""
)

_ADAM_RS_BODY = """
  g1_rs = reducescatter(+, g)
  gf = cast(f32, g1_rs)
  m1 = update(m, beta1 * m + (1 - beta1) * gf)
  v1 = update(v, beta2 * v + (1 - beta2) * gf * gf)
  mh = m1 / (1 - pow(beta1, t))
  vh = v1 / (1 - pow(beta2, t))
  w1_s = update(w, slice(w) - lr * mh / (sqrt(vh) + eps))
  w1 = allgather(w1_s)
"""

# RS-C-AG, unfused, and fuse(RS-C-AG).
ADAM_RS_C_AG = (
    ADAM_HEAD + "input m : f32[N] sliced\ninput v : f32[N] sliced\n" + _ADAM_RS_BODY + "output w1\n"
)
ADAM_FUSED = (
    ADAM_HEAD
    + "input m : f32[N] sliced\ninput v : f32[N] sliced\nfused {"
    + _ADAM_RS_BODY
    + "}\noutput w1\n"
)

MLP_HEAD = """
program megatron_mlp
ranks 16
dim B = 8, S = 1024, H = 3072
input w : f16[H, H]    sliced(0)
input b : f16[H]       replicated
input x : f16[B, S, H] sliced(2)
input r : f16[B, S, H] replicated
"""

MLP_AR_C = (
    MLP_HEAD
    + """
layer = matmul(x, w)
sum   = allreduce(+, layer)
out   = dropout(sum + b, 0.1) + r
output out
"""
)

# MM-fuse(RS-C-AG) and ol(MM, fuse(RS-C-AG)) with K chunks.
MLP_FUSED = (
    MLP_HEAD
    + """
layer = matmul(x, w)
fused {
  sum_rs = reducescatter(+, layer)
  out_s = dropout(sum_rs + b, 0.1) + slice(r)
  out = allgather(out_s)
}
output out
"""
)

MLP_OVERLAP = (
    MLP_HEAD
    + """
overlapped chunks=4 {
  layer = matmul(x, w)
  fused {
    sum_rs = reducescatter(+, layer)
    out_s = dropout(sum_rs + b, 0.1) + slice(r)
    out = allgather(out_s)
  }
}
output out
"""
)

# A scalar reduction of a sliced value, alone and fused with its consumer.
NORM = """
program nrm
ranks 8
dim N = 1048576
input x : f32[N] sliced
n = norm(x)
y = x * n
output y
"""

NORM_FUSED = """
program nrm
ranks 8
dim N = 1048576
input x : f32[N] sliced
fused {
  n = norm(x)
  y = x * n
}
output y
"""

# RS-P2P-C-AG on a pipeline grid: the slice crosses to stage 1, gathered there.
PIPE_RS = """
program pipe
ranks tp=8, pp=2
dim B = 8, S = 1024, H = 3072
input x : f16[B, S, H] sliced(2)
input w : f16[H, H]    sliced(0)
input b : f16[H]       replicated @stage 1
input r : f16[B, S, H] replicated @stage 1
layer = matmul(x, w)
sum_rs = reducescatter(+, layer)
recv = send(sum_rs)
out_s = dropout(recv + b, 0.1) + slice(r)
out = allgather(out_s)
output out
"""


def program(text: str, ranks: str | None = None, **defines: int) -> Program:
    return load_program(text, "test.coco", defines, RanksOverride.parse(ranks) if ranks else None)


def overlap_chunks(k: int, **defines: int) -> Program:
    return program(MLP_OVERLAP.replace("chunks=4", f"chunks={k}"), **defines)
