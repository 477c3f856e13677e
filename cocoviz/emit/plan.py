"""The backend-neutral lowered form of a scheduled Program (what `lower.py` builds and
every renderer in `cocoviz/emit/` reads).

A `ProgramPlan` is what one rank executes: buffers (per-rank storage of every value
that needs memory, with aliases for in-place updates and collectives), and an ordered
list of steps — elementwise kernels whose bodies are SSA statements (`Stmt`), row
kernels, reduction finishes, matmuls, collectives and chunk loops. Every field is a
plain value (ints, C identifiers already sanitized, tags); renderers only add the
spellings of their backend (types, math functions, API calls).

Index conventions inside a kernel body, for element `i` of the launch:

- ``L`` is the element's index in the value's per-rank storage (the chunk offset added),
- ``E`` is its *global element index* in the value's global shape,
- ``D`` is its *generator index* (E, or ``tp·numel + E`` for a local value).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

from cocoviz.errors import CocovizError
from cocoviz.ir.collectives import collective_named
from cocoviz.ir.types import DType


class EmitError(CocovizError):
    """A program or schedule the emitter cannot lower, or a target it does not know
    (exit 1)."""


Collectives = Literal["nccl", "nccl-device"]
"""How the CUDA target runs its collectives: NCCL's host API, or fused groups on NCCL's
device API (docs/codegen.md)."""

ViewKind = Literal["replicated", "local", "flat", "block", "chunked"]
StreamName = Literal["main", "compute", "comm", "p2p"]
"""`comm`: the tp group's collectives; `p2p`: send/recv on the world communicator (inside
overlapped groups; docs/codegen.md)."""


@dataclass(frozen=True)
class View:
    """How one value's per-rank storage maps onto its global shape.

    ``block`` is `sliced(d)` with ``outer`` = product of the dimensions before d,
    ``extent`` = shape[d], ``inner`` = product after d; rank r holds block r of d.
    ``chunked`` is a flat slicing produced chunk by chunk inside an overlapped group:
    in chunk k rank r holds ``[k·numel/K + r·numel/(K·G), +numel/(K·G))``.
    """

    kind: ViewKind
    shape: tuple[int, ...]
    count: int
    outer: int = 1
    extent: int = 1
    inner: int = 1
    chunks: int = 1
    dp: Literal["replicated", "local", "sliced"] = "replicated"
    """The layout over dp on a grid with a dp axis (docs/language.md, rank grids):
    ``sliced`` is `sliced(over=dp)`, the flat 1/D of the tp part at ``dp·count``; the
    fields above then describe the tp part, of ``tp_count`` elements."""
    tp_count: int = 0
    """The tp part's count of a value sliced over dp (0 elsewhere)."""

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def sliced(self) -> bool:
        return self.kind in ("flat", "block", "chunked")

    @property
    def blk(self) -> int:
        """Block length along the sliced dimension (block views)."""
        part = self.tp_count or self.count
        return part // (self.outer * self.inner) if self.kind == "block" else 0


@dataclass(frozen=True)
class Offset:
    """An element offset ``const + per_rank·tp + per_chunk·k + per_dp·dp``."""

    const: int = 0
    per_rank: int = 0
    per_chunk: int = 0
    per_dp: int = 0
    """Times the rank's dp index: a part sliced over dp (docs/language.md, rank grids)."""

    @property
    def is_zero(self) -> bool:
        return self.const == 0 and self.per_rank == 0 and self.per_chunk == 0 and self.per_dp == 0


ZERO = Offset()


@dataclass(frozen=True)
class Buffer:
    """Per-rank storage. ``alias`` names the buffer whose memory this one uses, at
    ``offset``; ``addressing="global"`` means elements are stored at their global
    element index E of the aliased (replicated) buffer (a slice computed in place)."""

    cname: str
    source: str
    dtype: DType
    count: int
    pstage: int | None
    role: Literal["input", "stage", "temp", "partial", "acc", "staging"]
    alias: str | None = None
    offset: Offset = ZERO
    addressing: Literal["local", "global"] = "local"
    symmetric: bool = False
    """Allocated with ncclMemAlloc and registered as a window (nccl-device lowering)."""
    registered: bool = False
    """Passed to a host-API NCCL collective (allreduce, reducescatter, allgather, a
    scalar reduction): allocated with ncclMemAlloc and registered as a symmetric window
    (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC) so that NCCL >= 2.27 may choose
    its symmetric kernels (`cocoviz.emit.lower.registered_buffers`)."""


@dataclass(frozen=True)
class InputInit:
    """How an input is generated: its runs of consecutive generator indices."""

    buffer: str
    source: str
    dtype: DType
    view: View
    pstage: int | None
    local: bool
    """Generator index of a local value is ``tp·numel + E``."""
    updated: bool = False
    """The program updates it (state: `--check` draws it once, not every round)."""
    nonnegative: bool = False
    """It reaches the argument of sqrt, rsqrt, log or pow: `--check` draws it without a
    sign (docs/codegen.md, inputs and dumps)."""


@dataclass(frozen=True)
class OutputSpec:
    source: str
    buffer: str
    dtype: DType
    view: View
    pstage: int | None
    global_shape: tuple[int, ...]
    """Shape of the global value (``[G, *shape]`` for a local value)."""
    global_addressing: bool = False
    """The buffer aliases a replicated input and holds this rank's part at its global
    positions (a sliced update of a replicated input)."""
    normwise: bool = False
    """It depends on a sum whose order may differ between executors (a collective's, a
    matmul's: `cocoviz.exec.dumps.inexact_reason`): `--check` compares it normwise."""


@dataclass(frozen=True)
class Key:
    """A generator key computed once per run: ``key_for(tag, seed)``."""

    cname: str
    tag: str


@dataclass(frozen=True)
class DropoutConst:
    cname: str
    p: float
    dtype: DType


# --------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class Stmt:
    """One SSA statement of a kernel body. ``kind`` selects the template branch; the
    other fields are used as the kind needs (see `lower.BodyBuilder`).

    kinds: index_bcast (dst = Σ ((src / rs) % rd) · os over ``terms``), index_flat
    (dst = src − tp·a), index_block (global → local of a block view: a = extent·inner,
    b = inner, c = blk), index_local (dst = tp·a + src), index_chunk (dst = k·a + src),
    load, load_scalar, param, const, convert, unary, binary, compare, where, dropout,
    round, store, acc, route (a routing node's element: cocoviz/emit/routing.py).
    """

    kind: str
    dst: str = ""
    a: str = ""
    b: str = ""
    c: str = ""
    op: str = ""
    dtype: DType | None = None
    src_dtype: DType | None = None
    buffer: str = ""
    literal: str = ""
    n1: int = 0
    n2: int = 0
    n3: int = 0
    terms: tuple[tuple[int, int, int], ...] = ()
    buffer2: str = ""
    """A second buffer a `route` statement reads (its indices; cocoviz/emit/routing.py)."""
    dtype2: DType | None = None
    """The dtype of `buffer2`."""
    ints: tuple[int, ...] = ()
    """The extents and strides of a `route` statement."""


HOISTABLE = frozenset(
    {"param", "const", "convert", "round", "unary", "binary", "compare", "where", "load_scalar"}
)
"""Statement kinds that are pure functions of their operands (and, for ``param`` and
``load_scalar``, of values fixed for the whole launch)."""


def hoist(body: tuple[Stmt, ...]) -> tuple[tuple[Stmt, ...], tuple[Stmt, ...]]:
    """Splits a kernel body into the statements that read only params, literals and
    scalars computed before the launch (evaluated once per launch, before the loop) and
    the rest (evaluated per element). SSA statements are pure, so moving them changes
    neither the operations nor their order of evaluation within one element. A scalar
    that the body itself stores is not hoisted."""
    stored = {s.buffer for s in body if s.kind == "store"}
    invariant: set[str] = set()
    pre: list[Stmt] = []
    rest: list[Stmt] = []
    for s in body:
        ops = {s.a, s.b, s.c} - {""}
        if (
            s.kind in HOISTABLE
            and ops <= invariant
            and not (s.kind == "load_scalar" and s.buffer in stored)
        ):
            invariant.add(s.dst)
            pre.append(s)
        else:
            rest.append(s)
    return tuple(pre), tuple(rest)


@dataclass(frozen=True)
class Space:
    """The iteration space of a kernel launch: ``count`` elements of a value with
    `view`, chunk ``k`` of it when ``chunked_loop``."""

    view: View
    in_chunk_loop: bool = False

    @property
    def launch_count(self) -> int:
        if self.in_chunk_loop:
            return self.view.count // self.view.chunks
        return self.view.count


@dataclass(frozen=True)
class Reduction:
    """A whole-tensor reduction computed as partials inside a kernel."""

    kind: Literal["sum", "sumsq", "absmax"]
    var: str
    """The SSA variable accumulated per element."""
    partial: str
    """Buffer of per-block partials (CUDA) / the one accumulator (CPU), in acc dtype."""
    acc_dtype: DType


@dataclass(frozen=True)
class Kernel:
    """An elementwise kernel: one or more member stages computed per element."""

    cname: str
    stages: tuple[str, ...]
    space: Space
    body: tuple[Stmt, ...]
    reductions: tuple[Reduction, ...] = ()
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["kernel"] = "kernel"
    pre: tuple[Stmt, ...] = ()
    """Loop-invariant statements (`hoist`), evaluated once per launch before the loop."""


@dataclass(frozen=True)
class RowKernel:
    """layernorm / rmsnorm / softmax over rows of the last dimension."""

    cname: str
    stages: tuple[str, ...]
    op: Literal["layernorm", "rmsnorm", "softmax"]
    space: Space
    row_len: int
    x_body: tuple[Stmt, ...]
    """Computes ``x_var`` for element ``i`` (index in the launch)."""
    x_var: str
    gb_body: tuple[Stmt, ...]
    """Computes ``gamma_var`` / ``beta_var`` for element ``i``."""
    store_body: tuple[Stmt, ...]
    """Rounds and stores ``y_var`` (the normalized value, computed by the template)."""
    y_var: str
    gamma_var: str
    beta_var: str
    eps: float
    compute: DType
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["row"] = "row"


@dataclass(frozen=True)
class ReduceFinish:
    """Partials → one value → (cross-rank) → final scalar in the stage's buffer."""

    cname: str
    stage: str
    reduction: Reduction
    cross_rank: bool
    result: str
    result_dtype: DType
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["finish"] = "finish"


@dataclass(frozen=True)
class FinishBatch:
    """Consecutive cross-rank finishes whose partials are ready at the same point
    (`cocoviz.emit.batch`): each finish's partials → slot j of ``pack``, one allreduce
    of the ``len(finishes)`` values, then each final scalar from its slot."""

    cname: str
    finishes: tuple[ReduceFinish, ...]
    pack: str
    """Buffer of one value per finish, in ``acc_dtype``."""
    acc_dtype: DType
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["finishes"] = "finishes"


@dataclass(frozen=True)
class BatchDim:
    """One loop of a batched matmul: `extent` GEMMs, the operands `a_stride`,
    `b_stride` and the result `c_stride` elements apart (0: a broadcast operand)."""

    extent: int
    a_stride: int
    b_stride: int
    c_stride: int


@dataclass(frozen=True)
class Matmul:
    """C[m, n] = A[m, k] × B[k, n] on per-rank storage, row-major; with `batch`, one such
    GEMM per index of the batch loops (outermost first, adjacent loops merged where the
    strides allow, so a batch that is one strided batch has one loop)."""

    cname: str
    stage: str
    a: str
    b: str
    c: str
    m: int
    n: int
    k: int
    dtype: DType
    a_offset: Offset = ZERO
    c_offset: Offset = ZERO
    pstage: int | None = 0
    stream: StreamName = "main"
    b_offset: Offset = ZERO
    batch: tuple[BatchDim, ...] = ()
    kind: Literal["matmul"] = "matmul"
    lda: int = 0
    """Elements between rows of A (0: `k`, rows stored contiguously); likewise `ldb`
    (0: `n`) and `ldc` (0: `n`). A decomposed group's GEMM reads and writes blocks of
    larger arrays (`cocoviz.ir.shards.Gemm`)."""
    ldb: int = 0
    ldc: int = 0
    accumulate: bool = False
    """C += A × B (cuBLAS beta = 1): the partial products of a contraction split."""
    c_dtype: DType | None = None
    """C's dtype when it is not the operands' (an f32 accumulator of f16/bf16 operands)."""


@dataclass(frozen=True)
class Collective:
    cname: str
    stage: str
    op: str
    """The collective's DSL spelling: a row of `cocoviz.ir.collectives.COLLECTIVE_TABLE`."""
    rop: Literal["sum", "prod", "max", "min", "avg"] | None
    send: str
    recv: str
    count: int
    """NCCL's count: elements sent per rank (allgather), received per rank
    (reducescatter), sent to each peer (alltoall), or the whole buffer (allreduce,
    broadcast, reduce, send/recv)."""
    dtype: DType
    send_offset: Offset = ZERO
    recv_offset: Offset = ZERO
    inplace: bool = False
    root: int = 0
    peer_pstage: int = 0
    """send/recv: the pipeline stage of the peer (same tp index)."""
    comm: Literal["group", "world", "dp"] = "group"
    """`group`: the tp group; `dp`: the dp group (a collective written over=dp, on the
    rank's tp part; docs/language.md, rank grids); `world`: send/recv."""
    permute: View | None = None
    """allgather of a block-sliced value, alltoall whose source blocks are not whole
    rows of the result: receive into ``staging``, then block r of ``staging`` goes to
    block r of the view's dimension."""
    staging: str = ""
    pack: View | None = None
    """alltoall whose destination blocks are not contiguous in the operand: block j of
    the view's dimension is first copied to block j of ``pack_staging``, which is sent."""
    pack_staging: str = ""
    avg: bool = False
    """The sum of an `avg`: a kernel after it divides by the group size."""
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["collective"] = "collective"

    def __post_init__(self) -> None:
        if collective_named(self.op) is None:
            raise EmitError(f"'{self.op}' is not a collective of cocoviz.ir.collectives")


@dataclass(frozen=True)
class DeviceCollective:
    """A fused RS → compute → AG as one kernel on the NCCL device API (LSA)."""

    cname: str
    stages: tuple[str, ...]
    rop: Literal["sum", "prod", "max", "min", "avg"]
    src: str
    """The (symmetric) buffer reduced across peers."""
    src_dtype: DType
    shard: str
    """Where the reduced shard lands (the RS stage's buffer)."""
    space: Space
    """The shard's iteration space."""
    prologue: tuple[Stmt, ...]
    """Computes ``l_var`` (storage index of the shard element) and ``e_var`` (its global
    element index: where it lives in the reduced buffer and in every gathered buffer)."""
    l_var: str
    e_var: str
    body: tuple[Stmt, ...]
    """The fused compute on the shard (reads the shard through ``shard``)."""
    gathers: tuple[tuple[str, str, DType], ...]
    """(local shard buffer, symmetric destination, dtype) written to every peer."""
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["device"] = "device"
    pre: tuple[Stmt, ...] = ()
    """Loop-invariant statements of `body` (`hoist`), evaluated once per launch."""


RingSlot = Literal["shard", "next", "parity", "none"]
"""Which slot of a ring buffer a step of a decomposed group uses: the slot of the step's
shard `k`, of the next step's shard, of the step's parity (a double buffer), or the
start of the buffer."""


@dataclass(frozen=True)
class RingExchange:
    """Step `step` of a decomposed group's ring (docs/codegen.md, decomposed groups), at
    every step but the last: one grouped point-to-point exchange inside the tp group —
    `count` elements at slot `send_slot` of `send` go to rank (tp + `to`) mod G, and
    `count` elements from rank (tp − `to`) mod G land in slot `recv_slot` of `recv` (a slot
    is `count` elements)."""

    cname: str
    stage: str
    send: str
    send_slot: RingSlot
    recv: str
    recv_slot: RingSlot
    count: int
    dtype: DType
    to: int
    steps: int
    """G: the ring's length (the exchange runs at steps 0 … G − 2)."""
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["exchange"] = "exchange"


@dataclass(frozen=True)
class RingCombine:
    """Step `step` of a decomposed reduce-scatter: the block's partial product (`partial`,
    in its dtype, rounded as the matmul's result is) combined with the accumulator received
    from the previous rank (`received`; from the second step on), in the compute type
    `acc_dtype`; written to slot ``step mod 2`` of `acc` (sent on by the step's exchange),
    or at the last step rounded once into this rank's part of the result (`out`)."""

    cname: str
    stage: str
    partial: str
    partial_dtype: DType
    received: str
    acc: str
    acc_dtype: DType
    out: str
    out_dtype: DType
    count: int
    rop: Literal["sum", "prod", "max", "min", "avg"]
    steps: int
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["combine"] = "combine"


Step = Union[
    Kernel,
    RowKernel,
    ReduceFinish,
    FinishBatch,
    Matmul,
    Collective,
    DeviceCollective,
    RingExchange,
    RingCombine,
    "ChunkLoop",
]


@dataclass(frozen=True)
class ChunkItem:
    """One item of an overlapped group, issued per chunk on one stream."""

    label: str
    stream: StreamName
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class ChunkEdge:
    """Step `before` of a chunk waits for step `after` of the same chunk (indices into the
    chunk's steps, items flattened in order): one event per chunk, recorded on the
    stream of `after` and waited on by the stream of `before`, on the ranks of `stages`
    (None: every rank)."""

    after: int
    before: int
    stages: tuple[int, ...] | None = None
    carried: bool = False
    """A decomposed group's edge from a step of the previous iteration (`after` ran at
    step s − 1, `before` waits at step s, from s = 1 on)."""


@dataclass(frozen=True)
class Shards:
    """The ring of a decomposed group (`decompose`, `cocoviz.ir.shards.ShardPlan`): the
    loop runs G steps, and at step s rank tp works on shard (block) ``k = shard_at(tp, s)``
    — ``(tp + s) mod G`` (gather), ``(tp − s − 1) mod G`` (scatter); offsets ``per_chunk``
    of its steps are per shard k."""

    pattern: Literal["gather", "scatter"]
    mode: Literal["rows", "cols", "accumulate"]
    collective: str
    matmul: str


@dataclass(frozen=True)
class ChunkLoop:
    """``for k in 0..K``: each item's steps for chunk k, each on its stream; an event per
    chunk and edge between two streams (`edges`) releases the step that waits."""

    cname: str
    stages: tuple[str, ...]
    chunks: int
    items: tuple[ChunkItem, ...]
    pstage: int | None = 0
    stream: StreamName = "main"
    kind: Literal["chunks"] = "chunks"
    skewed: bool = False
    """Issued as a software pipeline (tick t: chunk k issues item t − k), for a group that
    chunks dimension 0 (`leading_chunks`); otherwise chunk by chunk."""
    edges: tuple[ChunkEdge, ...] = ()
    streams: tuple[StreamName, ...] = ()
    """The streams the loop's steps run on, in order of first use."""
    shards: Shards | None = None
    """A decomposed group (`decompose`): the loop runs its G steps around the ring
    (`chunks` = G), shard k of step s given by `Shards`; None: a chunked overlap."""


@dataclass(frozen=True)
class StageInfo:
    """For the manifest: what one source stage became."""

    name: str
    op: str
    layout: str
    kernels: tuple[str, ...] = ()
    collectives: tuple[str, ...] = ()
    streams: tuple[str, ...] = ()
    group: str | None = None
    chunks: int | None = None
    stored: bool = True
    shards: int | None = None
    """G of a decomposed group's member (None elsewhere)."""


@dataclass(frozen=True)
class ProgramPlan:
    """What one rank runs for one Program (scheduled or not)."""

    cname: str
    title: str
    buffers: tuple[Buffer, ...]
    inputs: tuple[InputInit, ...]
    outputs: tuple[OutputSpec, ...]
    steps: tuple[Step, ...]
    keys: tuple[Key, ...]
    dropouts: tuple[DropoutConst, ...]
    stages: tuple[StageInfo, ...]
    uses_matmul: bool = False
    uses_device_api: bool = False
    chunk_loops: int = 0
    groups: tuple[str, ...] = field(default=())
    updated: tuple[OutputSpec, ...] = field(default=())
    """Updated inputs after a run, named by the input (`source`): the update stage's
    buffer and view (`cocoviz.exec.dumps`)."""


@dataclass(frozen=True)
class ParamSpec:
    cname: str
    source: str
    dtype: DType
    default: float | int


@dataclass(frozen=True)
class EmitPlan:
    """Everything the renderers need: the scheduled program and the unscheduled one
    (for ``--check``), the grid and the options."""

    program: str
    """The program's name as written."""
    file_stem: str
    """Sanitized file stem for ``<program>.cu`` / ``.cpp``."""
    tp: int
    pp: int
    is_grid: bool
    dims: tuple[tuple[str, int], ...]
    params: tuple[ParamSpec, ...]
    scheduled: ProgramPlan
    reference: ProgramPlan | None
    """None when the scheduled program is the unscheduled one."""
    collectives: Collectives
    schedule_name: str | None
    schedule_steps: tuple[str, ...]
    seed: int = 0
    fallback: ProgramPlan | None = None
    """The scheduled program lowered with ``--collectives nccl``, when `scheduled` runs
    device-API kernels: every rank runs it instead where any rank lacks what the
    device-API lowering needs (docs/codegen.md, the nccl-device kernel on real hardware)."""
    dp: int = 1
    """D of a grid with a dp axis (1: none); world rank = (pp·D + dp)·T + tp."""
    has_dp: bool = False
    """The grid names a dp axis (`ranks dp=1, …` included): the trees split a dp
    communicator and run collectives over dp on it."""

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def plans(self) -> tuple[ProgramPlan, ...]:
        out = (self.scheduled,) if self.reference is None else (self.reference, self.scheduled)
        return out if self.fallback is None else (*out, self.fallback)
