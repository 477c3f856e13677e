"""What one rank does for each stage or group of a Program, as costed operations.

The simulator (``cocoviz.sim.timeline``) places operations on streams; this module
decides what the operations are and what each costs, from the cost model
(``collectives``, ``compute``) and per-rank sizes (a sliced value is 1/G of its global
size on each rank):

- an unfused compute stage is one kernel; a ``matmul`` is one GEMM on the per-rank
  shapes its layouts give (``[B·S, H/16] × [H/16, H]`` for Megatron's row-parallel
  layer); a stage holding an implicit scalar reduction of a sliced value is a partial
  kernel, the small collective ``<stage>.reduce``, and (when more follows the
  reduction) a finishing kernel;
- a fused compute group is one kernel whose memory traffic is what enters and leaves the
  group (intermediates stay in registers), cut into phases at reductions and at row-wise
  values other members consume (a grid-wide sync inside one cooperative kernel, or a
  new launch after a cross-rank ``.reduce``);
- a fused RS→C→AG (``--collectives nccl``) is the reducescatter, the fused kernel on the
  shard and the allgathers, all on the communication stream (as the emitter issues
  them); with ``nccl-device`` it is one kernel costed by ``device_kernel_time``;
- a ``send`` is a p2p transfer between the same tp index of two pipeline stages, over
  NVLink or the network depending on where the two world ranks sit;
- an overlapped group is lowered once per chunk with 1/K of every size (a matmul chunk is
  a GEMM on 1/K of the rows, with its own launch and tile quantization);
- a group decomposed by shard (``decompose``, ``overlapped shards=G``) is G steps of the
  ring (`lower_decomposed`, `cocoviz.ir.shards`): per step one point-to-point exchange of
  1/G of the collective's bytes with the ring neighbours, one GEMM of 1/G of the work,
  and for a reducescatter the add of the accumulator received.

Every operation carries a hashable ``spec`` from which its cost is computed (and cached),
so identical layers of a deep stack cost one evaluation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property, lru_cache

from cocoviz.batching import batch_runs
from cocoviz.errors import UsageError
from cocoviz.ir.collectives import Blocks, alltoall_copies
from cocoviz.ir.graph import dataflow, reduce_name, stage_reductions
from cocoviz.ir.nodes import (
    AXIS_REDUCTIONS,
    COLLECTIVES,
    REDUCTIONS,
    ROWWISE,
    Expr,
    Group,
    GroupKind,
    Op,
    Program,
    Stage,
    expr_reads,
)
from cocoviz.ir.shards import ShardPlan, shard_plan
from cocoviz.ir.summary import per_rank_numel
from cocoviz.ir.transforms.overlap import leading_chunks
from cocoviz.ir.types import (
    DType,
    LayoutKind,
    TensorType,
    block_dim,
    dp_view,
    numel,
    shape_values,
)
from cocoviz.sim.collectives import (
    Coll,
    CollCost,
    CostModelError,
    collective_time,
    device_kernel_time,
    emitted_buffers_registered,
    p2p_time,
)
from cocoviz.sim.compute import (
    NO_CONTENTION,
    Contention,
    comm_contention,
    kernel_time,
    matmul_time,
)
from cocoviz.sim.hardware import Hardware

COMPUTE = "compute"
COMM = "comm"
P2P = "p2p"
"""Send/recv inside an overlapped group: the world communicator's own stream, beside the
tp group's collectives on COMM (as the emitter issues them, docs/cost-model.md)."""
STREAMS = (COMPUTE, COMM, P2P)
COLLECTIVE_MODES = ("nccl", "nccl-device")


class Kind(StrEnum):
    """What an event is; the timeline colours by kind."""

    MATMUL = "matmul"
    COMPUTE = "compute"
    FUSED = "fused"
    COLLECTIVE = "collective"
    REDUCE = "reduce"
    P2P = "p2p"
    DEVICE = "fused-collective"

    @property
    def is_comm(self) -> bool:
        return self in COMM_KINDS


COMM_KINDS = frozenset({Kind.COLLECTIVE, Kind.REDUCE, Kind.P2P, Kind.DEVICE})

_UNPRICED = COLLECTIVES | {Op.MATMUL}
"""Operators `_expr_work` leaves to their own pricing (collectives, GEMMs)."""

# FLOPs per output element (per input element for reductions). Memory-bound either way;
# these only decide the rare compute-bound elementwise kernel.
_FLOPS = {
    Op.SQRT: 2, Op.RSQRT: 2, Op.EXP: 8, Op.LOG: 8, Op.TANH: 8, Op.SIGMOID: 8, Op.GELU: 10,
    Op.POW: 8, Op.DROPOUT: 10, Op.LAYERNORM: 8, Op.RMSNORM: 6, Op.SOFTMAX: 6, Op.NORM: 2,
    Op.REF: 0, Op.CONST: 0, Op.SLICE: 0, Op.UPDATE: 0,
    Op.TRANSPOSE: 0, Op.PERMUTE: 0,  # data movement: priced by the bytes it reads and writes
    # routing (docs/language.md): data movement too, no GEMM; topk compares each entry
    # once per kept one, capacity_slots counts one token at a time
    Op.GATHER: 0, Op.SCATTER_ADD: 1, Op.TOPK: 2, Op.TOPK_INDICES: 2, Op.CAPACITY_SLOTS: 2,
    Op.ZEROS: 0, Op.ONES: 0, Op.FULL: 0, Op.IOTA: 0,  # constants: folded, nothing read
}  # fmt: skip

_CALLS = frozenset({Op.EXP, Op.LOG, Op.TANH, Op.SIGMOID, Op.GELU, Op.POW, Op.SOFTMAX})
"""Operators the CPU target computes with a math library call per element (exp, log,
tanh, pow: sigmoid and softmax call exp, gelu tanh), priced at ``gpu.libm_call_ns``
beside their FLOPs (0 on GPU profiles)."""


# ---------------------------------------------------------------------------------------
# Cached cost evaluations


# Kernels and GEMMs are priced as nodes of the CUDA graph the emitted launcher replays
# each iteration (docs/cost-model.md, "CUDA graphs"): the GPU-side gap, no host launch.
@lru_cache(maxsize=65536)
def _kernel(
    hw: Hardware,
    flops: float,
    nbytes: float,
    dtype: str,
    c: Contention,
    launch: bool,
    converts: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    calls: float = 0.0,
    reuse: tuple[tuple[float, float, float], ...] = (),
    chained: float = 0.0,
    footprint: float = 0.0,
) -> float:
    return kernel_time(
        hw, flops, nbytes, dtype, contention=c, launch=launch, graph=True, converts=converts,
        calls=calls, reuse=reuse, chained=chained, footprint=footprint,
    )  # fmt: skip


@lru_cache(maxsize=65536)
def _matmul(hw: Hardware, m: int, n: int, k: int, dtype: str, c: Contention) -> float:
    return matmul_time(hw, m, n, k, dtype, contention=c, graph=True)


@lru_cache(maxsize=65536)
def _collective(
    hw: Hardware,
    coll: Coll,
    nbytes: int,
    nranks: int,
    rpn: int,
    symmetric: bool = False,
    dtype: str = "f32",
    in_place: bool = False,
    reuse: tuple[float, float] = (0.0, 0.0),
    dirty: bool = False,
) -> CollCost:
    return collective_time(
        hw,
        coll,
        nbytes,
        nranks,
        ranks_per_node=rpn,
        symmetric=symmetric,
        dtype=dtype,
        in_place=in_place,
        reuse=reuse,
        dirty=dirty,
    )


@lru_cache(maxsize=4096)
def _p2p(hw: Hardware, nbytes: int, same_node: bool) -> CollCost:
    return p2p_time(hw, nbytes, same_node=same_node)


# ---------------------------------------------------------------------------------------
# Operations


@dataclass(frozen=True)
class KernelSpec:
    """A non-GEMM kernel (or one phase of a fused kernel)."""

    flops: float
    nbytes: float
    dtype: str
    launch: bool = True
    sync_us: float = 0.0  # a grid-wide sync before this phase (cooperative kernel)
    converts: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """f16 elements read and written, bf16 elements read and written (``_converts``)."""
    calls: float = 0.0
    """Math library calls (``_CALLS``: one per element of exp, log, tanh, ...)."""
    reuse: tuple[tuple[float, float, float], ...] = ()
    """(bytes, reuse distance, line transfers per byte) of each value read and written
    (`Context.reuse`, `kernel_time`; on CPU ranks)."""
    chained: float = 0.0
    """Elements its ``sum``, ``norm`` and ``amax`` accumulate (`_chained`; on CPU ranks)."""
    footprint: float = 0.0
    """Distinct bytes it touches, a store into lines it reads counted once (on CPU ranks:
    the memory curve's size; 0: ``nbytes``)."""

    def time(self, hw: Hardware, c: Contention) -> float:
        t = _kernel(
            hw,
            self.flops,
            self.nbytes,
            self.dtype,
            c,
            self.launch,
            self.converts,
            self.calls,
            self.reuse,
            self.chained,
            self.footprint,
        )
        return t + self.sync_us * 1e-6


@dataclass(frozen=True)
class MatmulSpec:
    """A GEMM of one rank: ``[m, k] × [k, n]`` (``batch`` of them)."""

    m: int
    n: int
    k: int
    dtype: str
    batch: int = 1
    """GEMMs of a batched matmul (the rank's broadcast batch extent); modelled as one
    GEMM of ``batch·m`` rows (its CTA tiles fill the SMs the same way)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def nbytes(self) -> float:
        size = _ITEMSIZE_BY_NAME[self.dtype]
        per = self.m * self.k + self.k * self.n + self.m * self.n
        return float(self.batch * per * size)

    @property
    def shape_text(self) -> str:
        gemm = f"[{self.m}, {self.k}] x [{self.k}, {self.n}] {self.dtype}"
        return gemm if self.batch == 1 else f"{self.batch} x {gemm}"

    def time(self, hw: Hardware, c: Contention) -> float:
        return _matmul(hw, self.batch * self.m, self.n, self.k, self.dtype, c)


@dataclass(frozen=True)
class CollSpec:
    """A collective over the tp group of a pipeline stage (``nbytes``: NCCL's full buffer)."""

    coll: Coll
    nbytes: int
    nranks: int
    ranks_per_node: int
    symmetric: bool = False
    """On registered windows (`emitted_buffers_registered`): NCCL's symmetric kernels
    are candidates where they serve the call."""
    dtype: str = "f32"
    """The elements' type (a reduction's per-element cost, ``overlap.reduce_ns``)."""
    in_place: bool = False
    """An allgather into the buffer its rank's block already lies in (`gathers_in_place`)."""
    reuse: tuple[float, float] = (0.0, 0.0)
    """The reuse distances of its input and of the storage it writes (`Context.reuse`;
    on CPU ranks)."""
    dirty: bool = False
    """A stage of the step wrote its input (not a program input; on CPU ranks:
    ``overlap.peer_dirty_ns``)."""

    def cost(self, hw: Hardware) -> CollCost:
        return _collective(
            hw,
            self.coll,
            self.nbytes,
            self.nranks,
            self.ranks_per_node,
            self.symmetric,
            self.dtype,
            self.in_place,
            self.reuse,
            self.dirty,
        )


@dataclass(frozen=True)
class P2PSpec:
    """A send/recv of ``nbytes`` between two pipeline stages."""

    nbytes: int


@dataclass(frozen=True)
class ExchangeSpec:
    """One step's exchange of a decomposed group: every rank of the tp group sends
    ``nbytes`` to one ring neighbour while it receives as many from the other
    (`cocoviz.ir.shards`); ``same_node``: every ring neighbour sits on the rank's node."""

    nbytes: int
    same_node: bool

    def cost(self, hw: Hardware) -> CollCost:
        return exchange_cost(hw, self.nbytes, self.same_node)


def exchange_cost(hw: Hardware, nbytes: int, same_node: bool) -> CollCost:
    """The price of one ring step of a decomposed group: one point-to-point message of
    ``nbytes`` within a node (NVLink) or across nodes (a NIC), its latency included.

    The send and the receive of a step run at once on the two directions of the links
    (one ``ncclSend``/``ncclRecv`` pair in a group call), so a step costs one message.
    This is the seam to the model's point-to-point pricing: ``collectives.p2p_time``
    (the one send/recv of a pipeline hop); a dedicated single-message price (NVLink at a
    derated p2p rate) replaces it here, and only here."""
    return _p2p(hw, nbytes, same_node)


@dataclass(frozen=True)
class DeviceSpec:
    """A fused RS→C→AG as one ``nccl-device`` kernel."""

    nranks: int
    reduce_bytes: int
    gather_bytes: int
    compute: KernelSpec
    reductions: int = 0  # scalar reductions inside: one extra LSA barrier each

    def time(self, hw: Hardware) -> float:
        compute_s = self.compute.time(hw, NO_CONTENTION) if self.compute.nbytes else 0.0
        cost = device_kernel_time(
            hw,
            self.nranks,
            reduce_bytes=self.reduce_bytes,
            gather_bytes=self.gather_bytes,
            compute_s=compute_s,
            sms=min(hw.gpu.sms, hw.nccl.channels),
            graph=True,
        )
        return cost.time_s + self.reductions * hw.device.barrier_us * 1e-6


Spec = KernelSpec | MatmulSpec | CollSpec | P2PSpec | ExchangeSpec | DeviceSpec


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class Operation:
    """One thing a rank runs: it waits for ``needs``, then makes ``makes`` available.

    ``needs``/``makes`` are value keys: stage names, plus internal keys for partial
    results (``stage#partial``). ``pstage`` is the pipeline stage whose ranks run it
    (for p2p, the sender; ``dest`` is the receiver's). ``sync``: every rank of the tp
    group starts it together (a collective).
    """

    name: str
    stage: str
    members: tuple[str, ...]
    needs: frozenset[str]
    makes: tuple[str, ...]
    stream: str
    kind: Kind
    pstage: int | None
    spec: Spec
    flops: float = 0.0
    nbytes: float = 0.0
    detail: str = ""
    sync: bool = False
    dest: int | None = None
    batch_key: str = ""
    """Scalar reductions (``Kind.REDUCE``) with the same key can share one allreduce
    (`batch_reductions`): the accumulator's size and the reduction (sum or max)."""

    def __init__(
        self,
        name: str,
        stage: str,
        members: tuple[str, ...],
        needs: frozenset[str],
        makes: tuple[str, ...],
        stream: str,
        kind: Kind,
        pstage: int | None,
        spec: Spec,
        flops: float = 0.0,
        nbytes: float = 0.0,
        detail: str = "",
        sync: bool = False,
        dest: int | None = None,
        batch_key: str = "",
    ) -> None:
        # A simulation lowers an operation per stage: the fields go straight into
        # __dict__ (as Expr's, tests/test_fast_init.py), at a fraction of the cost of the
        # generated frozen __init__'s object.__setattr__ per field.
        d = self.__dict__
        d["name"] = name
        d["stage"] = stage
        d["members"] = members
        d["needs"] = needs
        d["makes"] = makes
        d["stream"] = stream
        d["kind"] = kind
        d["pstage"] = pstage
        d["spec"] = spec
        d["flops"] = flops
        d["nbytes"] = nbytes
        d["detail"] = detail
        d["sync"] = sync
        d["dest"] = dest
        d["batch_key"] = batch_key


# Facts of each dtype read on the hottest paths, one dict lookup each (the DType
# properties go through `facts`).
_ITEMSIZE = {d: d.itemsize for d in DType}
_IS_FLOAT = {d: d.is_float for d in DType}
_ITEMSIZE_BY_NAME = {d.value: d.itemsize for d in DType}
_NAME = {d: d.value for d in DType}


# ---------------------------------------------------------------------------------------
# Per-program context


@dataclass
class Context:
    """Facts about a program shared by every lowering: group size, uses, placement."""

    program: Program
    hw: Hardware
    collectives: str = "nccl"
    deps: dict[str, set[str]] = field(default_factory=dict)
    users: dict[str, list[str]] = field(default_factory=dict)
    reductions: dict[str, list[Expr]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.collectives not in COLLECTIVE_MODES:
            raise UsageError(
                f"unknown collectives lowering '{self.collectives}'",
                hint=f"use one of {', '.join(COLLECTIVE_MODES)}",
            )
        # (the reads behind both are cached on each expression: a program a schedule
        # made shares nearly all of them with the one it came from)
        self.deps, self.users = dataflow(self.program)
        updates = self.program.updates()
        stages = self.program.stages
        self.reductions = {}
        for s in stages:
            found = stage_reductions(s)
            if found:
                self.reductions[s.name] = list(found)
        self.outputs = set(self.program.outputs)
        self.updates = set(updates.values())
        self.written = {n for n, us in self.users.items() if len(us) > 1 or us[0] != n}
        """Values stored to memory: read by another stage, an output or an update."""
        self.written |= self.outputs | self.updates
        names = [s.name for s in stages]
        self.stage_names = set(names)
        self.by_name = dict(zip(names, stages, strict=True))
        """Each stage by its name (`stage`, without the call on hot paths)."""
        self.position = dict(zip(names, range(len(names)), strict=True))
        self.types: dict[str, TensorType] = {i.name: i.ty for i in self.program.inputs}
        """The type of each input and stage by name (params are not stored)."""
        self.types.update(zip(names, [s.expr.type for s in stages], strict=True))
        self.params = {p.name for p in self.program.params}
        self.group = self.program.grid.group
        """Ranks a collective runs over (G)."""
        self._ranks_per_node: dict[int, int] = {}
        self.model = (self.hw, self.collectives, self.program.grid)
        """What lowering reads of the model and the grid (`lower_stage`'s key)."""
        self.fused_ops: dict[tuple[int, int], tuple[Group, tuple[Operation, ...]]] = {}
        """`lower_item`'s operations of fused groups, by group and chunk count."""
        self.gemms: dict[str, tuple[Stage, MatmulSpec]] = {}
        """`matmul_dims` of each matmul stage asked for (with the stage it was for)."""
        self.chunk_ops: dict[tuple[str, int, int], tuple[Operation, ...]] = {}
        """`lower_stage`'s operations of a stage's chunk, by stage, chunk count and the
        chunk's GEMM rows (0 for a stage that is not a matmul: its chunks are alike)."""
        self.decomposed: dict[int, tuple[Group, tuple[tuple[int, Operation], ...]]] = {}
        """`lower_decomposed`'s operations of decomposed groups, by group."""

    def stage(self, name: str) -> Stage:
        return self.by_name[name]

    def node(self, rank: int) -> int:
        return rank // self.hw.gpus_per_node

    def ranks_per_node(self, pstage: int, axis: str = "tp") -> int:
        """How many ranks of the tp group (or the dp group, `axis` "dp") of ``pstage``'s
        dp replica 0 share the fullest node. World ranks are (pp·D + dp)·T + tp
        (docs/language.md, rank grids): a tp group is T consecutive ranks, a dp group
        strides by T, so it spans nodes once T fills one."""
        key = pstage if axis == "tp" else -1 - pstage
        found = self._ranks_per_node.get(key)
        if found is None:
            grid = self.program.grid
            t, base = grid.tp, pstage * grid.tp * grid.dp
            ranks = range(base, base + t) if axis == "tp" else range(base, base + t * grid.dp, t)
            counts: dict[int, int] = {}
            for r in ranks:
                counts[self.node(r)] = counts.get(self.node(r), 0) + 1
            found = self._ranks_per_node[key] = max(counts.values())
        return found

    def pstage_of(self, name: str) -> int:
        p = self.types[name].pstage
        return 0 if p is None else p

    @cached_property
    def reuse(self) -> dict[tuple[str, str], float]:
        """`_reuse_walk`'s distances."""
        return self._reuse_walk[0]

    @cached_property
    def in_place_stores(self) -> frozenset[str]:
        """The stages that store into lines they have just read (an update of what it
        reads: `_reuse_walk`): their stores add nothing to the distinct bytes a kernel
        touches (`KernelSpec.footprint`)."""
        return self._reuse_walk[1]

    @cached_property
    def _reuse_walk(self) -> tuple[dict[tuple[str, str], float], frozenset[str]]:
        """Reuse distances, steady state: for stage s reading value n, the distinct bytes a
        rank touches (each storage it reads or stores counted once, at its largest
        access, stage by stage in program order, one step after another) from the stage
        that last touched n — n and what that stage touched beside it, line by line
        between two lines of n — up to s: what the caches must hold for n to be still
        there (LRU's stack distance, as the memory curve's kernels measure it: y = f(x)
        again and again keeps x and y; a count of traffic, tried first, put a value read
        twice in between twice, and lamb's gradient 48 MiB away where 20 MiB lie between); for
        (s, s), those since the last touch
        of the storage s writes (an update's: its target's; an allgather in place writes
        the peers' blocks, which only the allgather of the step before touched): a store
        into lines the caches no longer hold fetches them first, and one into lines the
        stage has just read (an update of what it reads, whose fetch the read paid)
        writes them back before their next touch, as far off in the steady state (it was
        priced as a hit, 0: with the kernel's footprint below, an update over arrays
        that overflow the caches then ran at the cached rate, sgd as written 0.71 of
        measured). A fused kernel touches what it runs:
        a value one of its phases makes and reads again in that phase is neither stored
        nor read back, and one no stage outside the phase reads is not stored
        (`_compute_ops`). On CPU ranks they decide whether a kernel's operands and
        results, and a collective's, come from the caches or from memory (`kernel_time`,
        `collective_time`)."""
        phase_of = self._fused_phases
        order = []
        root: dict[str, str] = {}
        for s in self.program.stages:
            reads = _expr_work(self, s.expr)[0]
            reads.pop(s.name, None)
            out = self.per_rank_bytes(s.ty) if s.name in self.written else 0
            made = phase_of.get(s.name)
            if made is not None:
                reads = {n: b for n, b in reads.items() if n not in made}
                if not self.stored_from(s.name, made):
                    out = 0
            src = s.expr.args[0].name if s.expr.args else None
            if s.expr.op is Op.UPDATE and src is not None:
                root[s.name] = root.get(src, src)
            order.append((s.name, reads, out, root.get(s.name, s.name)))
        size: dict[str, float] = {}  # a storage's bytes: the most any stage touches
        for _, reads, out, home in order:
            for n, b in reads.items():
                r = root.get(n, n)
                size[r] = max(size.get(r, 0.0), float(b))
            size[home] = max(size.get(home, 0.0), float(out))
        # distinct bytes since a touch: each storage counted once, at its latest touch
        # (a Fenwick tree over the stage positions of both laps)
        slots = 2 * len(order) + 1
        tree = [0.0] * (slots + 1)

        def add(i: int, v: float) -> None:
            i += 1
            while i <= slots:
                tree[i] += v
                i += i & -i

        def upto(i: int) -> float:  # the bytes whose latest touch is before position i
            total = 0.0
            while i > 0:
                total += tree[i]
                i -= i & -i
            return total

        last: dict[str, int] = {}
        distance: dict[tuple[str, str], float] = {}
        in_place: set[str] = set()
        pos = 0
        for lap in range(2):  # the second lap sees the previous step's touches
            for name, reads, out, home in order:
                if lap:
                    now = upto(slots)
                    for n in reads:
                        r = root.get(n, n)
                        distance[(name, n)] = now - upto(last[r])
                    if out:
                        distance[(name, name)] = now - upto(last[home])
                        if any(root.get(n, n) == home for n in reads):
                            in_place.add(name)
                pos += 1
                touched = {root.get(n, n) for n in reads} | ({home} if out else set())
                for r in touched:
                    if r in last:
                        add(last[r], -size[r])
                    add(pos, size[r])
                    last[r] = pos
        return distance, frozenset(in_place)

    def stored_from(self, name: str, made: Collection[str]) -> bool:
        """Whether a kernel that makes the values ``made`` stores ``name``, one of them:
        an output, an update, or a value a stage outside the kernel reads."""
        return (
            name in self.outputs
            or name in self.updates
            or any(u not in made for u in self.users.get(name, ()))
        )

    @cached_property
    def _fused_phases(self) -> dict[str, frozenset[str]]:
        """Each compute member of a fused group of more than one stage: the members of
        its phase (`_phases`), which one loop makes and reads without memory between."""
        out: dict[str, frozenset[str]] = {}
        todo = list(self.program.groups)
        while todo:
            g = todo.pop()
            todo.extend(it for it in g.items if isinstance(it, Group))
            if g.kind is not GroupKind.FUSED:
                continue
            compute = sorted(
                (m for m in g.stages() if self.by_name[m].expr.op not in COLLECTIVES),
                key=self.position.__getitem__,
            )
            if len(compute) < 2:
                continue
            for phase in _phases(self, compute):
                members = frozenset(phase)
                for m in phase:
                    out[m] = members
        return out

    def per_rank_bytes(self, ty: TensorType) -> int:
        n = ty.numel
        if ty.layout.kind is LayoutKind.SLICED:  # as `per_rank_numel`
            n //= self.group
        if ty.dp.is_sliced:
            n //= self.program.grid.dp
        return n * _ITEMSIZE[ty.dtype]

    def stored_type(self, name: str) -> TensorType | None:
        """The type of an input or stage (None for a param: not read from memory)."""
        return self.types.get(name)

    def type_of(self, name: str) -> TensorType:
        ty = self.types.get(name)
        return ty if ty is not None else self.program.type_of(name)


def make_context(program: Program, hw: Hardware, collectives: str = "nccl") -> Context:
    return Context(program, hw, collectives)


# ---------------------------------------------------------------------------------------
# Work of expressions


def _expr_work(ctx: Context, e: Expr) -> tuple[dict[str, int], float, float, float]:
    """What an expression costs one rank: the bytes of each name it reads (``slice(x)``
    reads a slice; an update's target is written, not read), its FLOPs (collectives
    and GEMMs are priced on their own), its math library calls (``_CALLS``) and the
    elements its ``sum``, ``norm`` and ``amax`` accumulate (its part of a sliced operand:
    `kernel_time`'s ``chained``), in one walk."""
    params, group, types = ctx.params, ctx.group, ctx.types
    dp = ctx.program.grid.dp
    per_rank_bytes = ctx.per_rank_bytes
    reads: dict[str, int] = {}
    flops = calls = chained = 0.0
    todo = [e]
    while todo:
        node = todo.pop()
        op = node.op
        if op is Op.REF:
            name = node.name
            if name is not None and name not in params:
                ty = types.get(name)
                nb = per_rank_bytes(ty if ty is not None else ctx.type_of(name))
                if nb > reads.get(name, 0):
                    reads[name] = nb
            continue
        if op is Op.SLICE and node.args and node.args[0].op is Op.REF:
            name = node.args[0].name
            assert name is not None
            nb = per_rank_bytes(node.type)
            if nb > reads.get(name, 0):
                reads[name] = nb
            continue  # a slice and a reference: no FLOPs
        if op is Op.GATHER and node.args[0].op is Op.REF:
            # a gather reads the rows it selects, not its whole operand (bytes moved)
            name = node.args[0].name
            assert name is not None
            nb = min(per_rank_bytes(node.args[0].type), per_rank_bytes(node.type))
            if nb > reads.get(name, 0):
                reads[name] = nb
            todo.append(node.args[1])
            continue
        if op not in _UNPRICED:
            per = _FLOPS.get(op, 1)
            if per:
                ty = node.args[0].type if op in REDUCTIONS or op in AXIS_REDUCTIONS else node.type
                flops += per * per_rank_numel(ty, group, dp)
                # integer pow: a loop of its own; of scalars (pow(beta1, t)): once per
                # launch, before the loop (docs/codegen.md, "Fast loops (CPU)")
                if op in _CALLS and ty.dtype.is_float and ty.shape:
                    calls += per_rank_numel(ty, group, dp)
                if op in REDUCTIONS:
                    chained += per_rank_numel(ty, group, dp)
        if op is Op.UPDATE:
            todo.extend(node.args[1:])  # the target (a reference) costs no FLOPs either
        else:
            todo.extend(node.args)
    return reads, flops, calls, chained


def _has_cross_rank_reduction(ctx: Context, name: str) -> bool:
    return name in ctx.reductions


def _has_local_reduction(ctx: Context, name: str) -> bool:
    """Whether a stage reduces a value that is not sliced (cached on its expression)."""
    e = ctx.by_name[name].expr
    found: bool | None = e.__dict__.get(_LOCAL_REDUCTION_ATTR)
    if found is None:
        found = e.__dict__[_LOCAL_REDUCTION_ATTR] = any(
            n.op in REDUCTIONS and not n.args[0].type.layout.is_sliced for n in e.walk()
        )
    return found


_LOCAL_REDUCTION_ATTR = "_cocoviz_local_reduction"


def _wide_dtype(types: Iterable[TensorType]) -> str:
    """The widest float dtype among ``types`` (the first of equal widths), else f32."""
    best: DType | None = None
    size = 0
    for t in types:
        d = t.dtype
        if _IS_FLOAT[d] and (best is None or _ITEMSIZE[d] > size):
            best, size = d, _ITEMSIZE[d]
    return _NAME[best] if best is not None else "f32"


def matmul_dims(ctx: Context, stage: Stage) -> MatmulSpec:
    """Per-rank GEMM shape ``[m, k] × [k, n]`` of a ``matmul`` stage (docs/language.md, layout inference)."""
    hit = ctx.gemms.get(stage.name)
    if hit is None or hit[0] is not stage:
        hit = ctx.gemms[stage.name] = (stage, _matmul_dims(ctx, stage))
    return hit[1]


def _matmul_dims(ctx: Context, stage: Stage) -> MatmulSpec:
    a, b = stage.expr.args
    ta, tb = a.type, b.type
    g = ctx.group
    if len(tb.shape) > 2:
        # batched: the rank's part of the result is batch × [m, n]; K is split only
        # for local partial sums (a sliced on K)
        out = [x.value for x in stage.ty.shape]
        d = block_dim(stage.ty.layout, stage.ty.shape, g)
        if d is not None:
            out[d] //= g
        k = ta.shape[-1].value
        if block_dim(ta.layout, ta.shape, g) == len(ta.shape) - 1:
            k //= g
        return MatmulSpec(
            max(out[-2], 1), max(out[-1], 1), max(k, 1), stage.ty.dtype.value,
            batch=max(math.prod(out[:-2]), 1),
        )  # fmt: skip
    m = numel(ta.shape[:-1])
    k = ta.shape[-1].value
    n = tb.shape[-1].value
    k_split = False
    if ta.layout.is_sliced:
        d = block_dim(ta.layout, ta.shape, g)
        if d == len(ta.shape) - 1:
            k_split = True
        else:
            m //= g
    if tb.layout.is_sliced:
        d = block_dim(tb.layout, tb.shape, g)
        if d == 1:
            n //= g
        elif not k_split:
            k_split = True
    if k_split:
        k //= g
    return MatmulSpec(max(m, 1), max(n, 1), max(k, 1), stage.ty.dtype.value)


def output_rows(ctx: Context, name: str) -> int:
    """Global rows of a stage's value (all dimensions but the last, flattened)."""
    ty = ctx.by_name[name].ty
    return numel(ty.shape[:-1]) if ty.shape else 1


# ---------------------------------------------------------------------------------------
# Lowering


def _scaled(spec: KernelSpec, chunks: int) -> KernelSpec:
    if chunks == 1:
        return spec
    return KernelSpec(
        spec.flops / chunks,
        spec.nbytes / chunks,
        spec.dtype,
        spec.launch,
        spec.sync_us,
        _per_chunk(spec.converts, chunks),
        spec.calls / chunks,
        tuple((b / chunks, d, lines) for b, d, lines in spec.reuse),
        spec.chained / chunks,
        spec.footprint / chunks,
    )


def _per_chunk(
    converts: tuple[float, float, float, float], chunks: int
) -> tuple[float, float, float, float]:
    a, b, c, d = converts
    return (a / chunks, b / chunks, c / chunks, d / chunks)


def _converts(
    reads: Iterable[tuple[DType, float]], writes: Iterable[tuple[DType, float]] = ()
) -> tuple[float, float, float, float]:
    """The 16-bit float elements a kernel widens (``reads``) and narrows (``writes``),
    ``(dtype, bytes)`` each: (f16 read, f16 written, bf16 read, bf16 written)."""
    out = [0.0, 0.0, 0.0, 0.0]
    for way, moved in enumerate((reads, writes)):
        for d, nbytes in moved:
            if d is DType.F16:
                out[way] += nbytes / 2
            elif d is DType.BF16:
                out[2 + way] += nbytes / 2
    return out[0], out[1], out[2], out[3]


def _chunk_bytes(nbytes: int, chunks: int) -> int:
    return max(1, nbytes // chunks) if nbytes else 0


def gathers_in_place(ctx: Context, s: Stage) -> bool:
    """An allgather of a slice that an update made: the update writes this rank's block
    where it lies in the replicated target (over tp or dp), and the allgather fills in
    the others around it (docs/codegen.md, the table of ops: `update`), so no own block
    is copied (`collective_time`'s ``in_place``)."""
    if s.expr.op is not Op.ALLGATHER:
        return False
    src = s.expr.args[0].name
    return src is not None and src in ctx.by_name and ctx.by_name[src].expr.op is Op.UPDATE


def _coll_op(ctx: Context, name: str, chunks: int, needs: Iterable[str]) -> list[Operation]:
    s = ctx.by_name[name]
    x = s.expr.args[0].type
    pstage = ctx.pstage_of(name)
    if s.expr.op is Op.SEND:
        src = x.pstage if x.pstage is not None else 0
        nbytes = _chunk_bytes(ctx.per_rank_bytes(x), chunks)
        return [
            Operation(
                name=name,
                stage=name,
                members=(name,),
                needs=frozenset(needs),
                makes=(name,),
                stream=P2P if chunks > 1 else COMM,
                kind=Kind.P2P,
                pstage=src,
                spec=P2PSpec(nbytes),
                nbytes=nbytes,
                dest=pstage,
            )
        ]
    coll = Coll.of(s.expr.op)
    full = x.numel * x.dtype.itemsize
    group, rpn = ctx.group, ctx.ranks_per_node(pstage)
    if s.expr.tag == "dp":
        # over dp: a tp rank's part, over the D ranks of its dp group, placed T apart
        full = dp_view(x, ctx.group).numel * x.dtype.itemsize
        group, rpn = ctx.program.grid.dp, ctx.ranks_per_node(pstage, "dp")
    # nccl-tests' size of an alltoall is one rank's send buffer, not the global value.
    nbytes = _chunk_bytes(full // ctx.group if coll is Coll.ALLTOALL else full, chunks)
    reuse = (0.0, 0.0)
    dirty = False
    if ctx.hw.gpu.arch == "cpu":
        operand = s.expr.args[0].name or ""
        reuse = (ctx.reuse.get((name, operand), 0.0), ctx.reuse.get((name, name), 0.0))
        dirty = operand in ctx.by_name  # a stage wrote it, not the program's input
    spec = CollSpec(
        coll,
        nbytes,
        group,
        rpn,
        _registered(ctx, coll),
        x.dtype.value,
        gathers_in_place(ctx, s),
        reuse,
        dirty,
    )
    cost = spec.cost(ctx.hw)
    permuted = _needs_permute(ctx, s)
    ops = [
        Operation(
            name=name,
            stage=name,
            members=(name,),
            needs=frozenset(needs),
            makes=(f"{name}#gathered",) if permuted else (name,),
            stream=COMM,
            kind=Kind.COLLECTIVE,
            pstage=pstage,
            spec=spec,
            nbytes=nbytes,
            detail=f"{coll.value} {cost.label}, {cost.nnodes} node{'s' if cost.nnodes > 1 else ''}",
            sync=True,
        )
    ]
    if s.expr.op is Op.ALLTOALL and _alltoall_copies(ctx, s)[0] is not None:
        # The operand's blocks for each rank are packed in rank order first (docs/codegen.md).
        part = x.numel * x.dtype.itemsize // ctx.group
        k = _scaled(KernelSpec(0.0, 2.0 * part, x.dtype.value), chunks)
        packed = f"{name}#packed"
        ops.insert(
            0,
            Operation(
                name=f"{name}.pack",
                stage=name,
                members=(name,),
                needs=frozenset(needs),
                makes=(packed,),
                stream=COMM,
                kind=Kind.COMPUTE,
                pstage=pstage,
                spec=k,
                nbytes=k.nbytes,
                detail="pack the alltoall's blocks in rank order",
            ),
        )
        ops[1] = dataclasses.replace(ops[1], needs=frozenset({packed}))
    if permuted:
        # A sliced(d) gather (an alltoall's blocks) lands in a staging buffer and is permuted
        # into place (docs/codegen.md).
        out_bytes = s.ty.numel * s.ty.dtype.itemsize
        if s.expr.op is Op.ALLTOALL:
            out_bytes //= ctx.group
        k = _scaled(KernelSpec(0.0, 2.0 * out_bytes, s.ty.dtype.value), chunks)
        ops.append(
            Operation(
                name=f"{name}.permute",
                stage=name,
                members=(name,),
                needs=frozenset({f"{name}#gathered"}),
                makes=(name,),
                stream=COMM,
                kind=Kind.COMPUTE,
                pstage=pstage,
                spec=k,
                nbytes=k.nbytes,
                detail="unpack the alltoall's blocks"
                if s.expr.op is Op.ALLTOALL
                else "permute the gathered sliced(d) value",
            )
        )
    return ops


def _needs_permute(ctx: Context, s: Stage) -> bool:
    if s.expr.op is Op.ALLTOALL:
        return _alltoall_copies(ctx, s)[1] is not None
    if s.expr.op is not Op.ALLGATHER:
        return False
    x = s.expr.args[0].type
    lay = x.dp if s.expr.tag == "dp" else x.layout
    return lay.is_sliced and lay.dim is not None


def _alltoall_copies(ctx: Context, s: Stage) -> tuple[Blocks | None, Blocks | None]:
    x = s.expr.args[0].type
    return alltoall_copies(
        shape_values(x.shape), int(s.expr.tag or 0), int(s.expr.value or 0), ctx.group
    )


# Operations of whole (unchunked) stages, kept on the stage object itself (in its
# __dict__, outside the dataclass fields: equality, hashing and `dataclasses.replace`
# ignore it, and it goes with the stage): a scheduled program shares most of its stage
# objects with the program it was made from, and the simulator lowers both (the baseline
# of the speedup); a session's next step shares nearly all. Beyond the stage itself, its
# lowering reads the model (hardware, collectives, grid: `Context.model`), its ordering
# edges, whether its value is written out and the types of the names it reads (None for
# params, which are not read from memory): each entry holds those and the operations.
# Entries are compared in a list rather than hashed (the model is usually the very same
# tuple, and `==` on identical members is a pointer compare), the latest used first, and at
# most `_OPS_KEPT` of them: a fit (`calibrate`) simulates the same stages under thousands
# of trial profiles, and an unbounded list kept every one of them and compared each new
# profile with all of them (half of `calibrate --local`'s time).
_OPS_ATTR = "_cocoviz_lowered"
_OPS_KEPT = 16
_StageEntry = tuple[
    tuple[object, ...],
    set[str],
    bool,
    frozenset[str],
    tuple[TensorType | None, ...],
    tuple[Operation, ...],
]


def lower_stage(ctx: Context, name: str, chunks: int = 1, chunk: int = 0) -> list[Operation]:
    """An ungrouped stage (or an overlapped item that is a single stage)."""
    s = ctx.by_name[name]
    if chunks != 1:
        rows = 0
        if s.expr.op is Op.MATMUL:
            rows = _chunk_rows(matmul_dims(ctx, s).m, chunks)[chunk]
        key = (name, chunks, rows)
        found = ctx.chunk_ops.get(key)
        if found is None:
            found = ctx.chunk_ops[key] = tuple(_lower_stage(ctx, name, chunks, chunk))
        return list(found)
    entries: list[_StageEntry] | None = s.__dict__.get(_OPS_ATTR)
    if entries is None:
        entries = s.__dict__[_OPS_ATTR] = []  # Stage is frozen: its __dict__ is not
    preds = ctx.deps.get(name, set())
    writes = name in ctx.written
    reads = expr_reads(s.expr)
    stored = ctx.types.get
    types = tuple([stored(r) for r in reads])  # in the order of this very set
    model = ctx.model
    for i, entry in enumerate(entries):
        e_model, e_deps, e_writes, e_reads, e_types, ops = entry
        if (
            e_writes is writes
            and e_reads is reads
            and e_model == model
            and e_types == types
            and e_deps == preds
        ):
            if i:
                entries.insert(0, entries.pop(i))
            return list(ops)
    ops = tuple(_lower_stage(ctx, name, 1, 0))
    entries.insert(0, (model, set(preds), writes, reads, types, ops))
    del entries[_OPS_KEPT:]
    return list(ops)


def forget_lowered(program: Program) -> None:
    """Drop the operations `lower_stage` keeps on the stages of ``program`` (tests)."""
    for s in program.stages:
        s.__dict__.pop(_OPS_ATTR, None)


def _lower_stage(ctx: Context, name: str, chunks: int, chunk: int) -> list[Operation]:
    s = ctx.by_name[name]
    needs = ctx.deps.get(name, ())
    if s.expr.op in COLLECTIVES:
        return _coll_op(ctx, name, chunks, needs)
    pstage = ctx.pstage_of(name)
    if s.expr.op is Op.MATMUL:
        mm = matmul_dims(ctx, s)
        rows = _chunk_rows(mm.m, chunks)[chunk]
        spec = MatmulSpec(rows, mm.n, mm.k, mm.dtype, mm.batch)
        return [
            *_permuted_operands(ctx, s, pstage, needs),
            Operation(
                name=name,
                stage=name,
                members=(name,),
                needs=frozenset(needs),
                makes=(name,),
                stream=COMPUTE,
                kind=Kind.MATMUL,
                pstage=pstage,
                spec=spec,
                flops=spec.flops,
                nbytes=spec.nbytes,
                detail=spec.shape_text,
            ),
        ]
    return _compute_ops(ctx, (name,), pstage, COMPUTE, chunks, kind=Kind.COMPUTE)


def _permuted_operands(
    ctx: Context, s: Stage, pstage: int, needs: Iterable[str]
) -> list[Operation]:
    """A matmul operand written `transpose(x, …)` or `permute(x, …)`: the emitter copies
    it into a temporary first (docs/codegen.md), one memory-bound kernel that reads and
    writes the rank's part once."""
    ops: list[Operation] = []
    for i, a in enumerate(s.expr.args):
        if a.op not in (Op.TRANSPOSE, Op.PERMUTE):
            continue
        nbytes = float(2 * ctx.per_rank_bytes(a.type))
        spec = KernelSpec(0.0, nbytes, a.type.dtype.value, True, 0.0)
        ops.append(
            Operation(
                name=f"{s.name}.t{i + 1}",
                stage=s.name,
                members=(s.name,),
                needs=frozenset(needs),
                makes=(),
                stream=COMPUTE,
                kind=Kind.COMPUTE,
                pstage=pstage,
                spec=spec,
                nbytes=nbytes,
                detail=f"{a.op.value} of a matmul operand",
            )
        )
    return ops


def _chunk_rows(m: int, chunks: int) -> list[int]:
    size, extra = divmod(m, chunks)
    return [max(1, size + (1 if i < extra else 0)) for i in range(chunks)]


def _phases(ctx: Context, members: Sequence[str]) -> list[list[str]]:
    """Cut compute members into phases: a member consuming a reduction's result, or a
    row-wise value of another member, starts after a sync."""
    if len(members) == 1:
        return [list(members)]
    inside = set(members)
    phase: dict[str, int] = {}
    for m in members:
        p = 0
        for d in ctx.deps.get(m, ()):
            if d not in inside:
                continue
            cut = (
                _has_cross_rank_reduction(ctx, d)
                or _has_local_reduction(ctx, d)
                or ctx.by_name[d].expr.op in ROWWISE
            )
            p = max(p, phase[d] + (1 if cut else 0))
        phase[m] = p
    out: list[list[str]] = [[] for _ in range(max(phase.values(), default=0) + 1)]
    for m in members:
        out[phase[m]].append(m)
    return out


_REGISTERED_COLLS = frozenset({Coll.ALLREDUCE, Coll.REDUCESCATTER, Coll.ALLGATHER})
"""The collectives whose buffers the emitter registers (`cocoviz.emit.lower.REGISTERED_OPS`)."""


def _registered(ctx: Context, coll: Coll) -> bool:
    return coll in _REGISTERED_COLLS and emitted_buffers_registered(ctx.collectives)


def _compute_ops(
    ctx: Context,
    members: Sequence[str],
    pstage: int,
    stream: str,
    chunks: int,
    *,
    kind: Kind,
    label: str | None = None,
    first_launch: bool = True,
) -> list[Operation]:
    """Compute members as one kernel, in phases, with ``.reduce`` collectives between."""
    phases = _phases(ctx, members)
    ops: list[Operation] = []
    launch = first_launch
    base_label = label or (
        members[0] if len(members) == 1 else f"fused({members[0]}…{members[-1]})"
    )
    for pi, phase in enumerate(phases):
        types = [ctx.types[m] for m in phase]
        if len(phase) == 1:  # most kernels: one stage, nothing of it made inside
            (m,) = phase
            reads, flops, calls, chained = _expr_work(ctx, ctx.by_name[m].expr)
            reads.pop(m, None)
            writes = ctx.per_rank_bytes(types[0]) if m in ctx.written else 0
            written = {m: writes} if writes else {}
            phase_needs = set(ctx.deps.get(m, ()))
            phase_needs.discard(m)
        else:
            made = set(phase)
            reads = {}
            flops = calls = chained = 0.0
            for m in phase:
                m_reads, m_flops, m_calls, m_chained = _expr_work(ctx, ctx.by_name[m].expr)
                for n, b in m_reads.items():
                    if n not in made and b > reads.get(n, 0):
                        reads[n] = b
                flops += m_flops
                calls += m_calls
                chained += m_chained
            written = {}
            for m, ty in zip(phase, types, strict=True):
                if ctx.stored_from(m, made):
                    written[m] = ctx.per_rank_bytes(ty)
            writes = sum(written.values())
            phase_needs = set()
            for m in phase:
                phase_needs.update(ctx.deps.get(m, ()))
            phase_needs.difference_update(made)
        dtype = _wide_dtype(types)
        sync_us = 0.0 if launch else ctx.hw.gpu.kernel_gap_us
        nbytes = float(sum(reads.values()) + writes)
        converts = _converts(
            [
                (t.dtype, float(b))
                for n, b in reads.items()
                if (t := ctx.stored_type(n)) is not None
            ],
            [(ctx.types[m].dtype, float(b)) for m, b in written.items()],
        )
        reuse: tuple[tuple[float, float, float], ...] = ()
        footprint = 0.0
        if ctx.hw.gpu.arch == "cpu":  # only CPU ranks read it (`kernel_time`)
            far = ctx.reuse
            reuse = tuple(  # a value's distance where the phase first reads it
                (float(b), next((far[m, n] for m in phase if (m, n) in far), 0.0), 1.0)
                for n, b in sorted(reads.items())
            ) + tuple(  # a store into lines it read writes them back; a fresh one fetches too
                (float(b), far.get((m, m), 0.0), 1.0 if m in ctx.in_place_stores else 2.0)
                for m, b in written.items()
            )
            # an update stores into lines it has just read: they count once
            footprint = nbytes - sum(
                float(b) for m, b in written.items() if m in ctx.in_place_stores
            )
        spec = _scaled(
            KernelSpec(
                flops, nbytes, dtype, launch, sync_us, converts, calls, reuse, chained, footprint
            ),
            chunks,
        )
        reducing = [m for m in phase if m in ctx.reductions]
        # Values that wait for a cross-rank reduction are made by the reduce op.
        if reducing:
            direct = tuple(m for m in phase if m not in reducing)
            partial = tuple(f"{m}#partial" for m in reducing)
        else:
            direct, partial = tuple(phase), ()
        name = base_label if len(phases) == 1 else f"{base_label} phase {pi + 1}/{len(phases)}"
        ops.append(
            Operation(
                name=name,
                stage=phase[0],
                members=tuple(phase),
                needs=frozenset(phase_needs),
                makes=direct + partial,
                stream=stream,
                kind=kind,
                pstage=pstage,
                spec=spec,
                flops=spec.flops,
                nbytes=spec.nbytes,
                detail=f"{len(phase)} stage{'s' if len(phase) > 1 else ''}"
                + (f", phase {pi + 1} of {len(phases)}" if len(phases) > 1 else ""),
            )
        )
        for m in reducing:
            for k, e in enumerate(ctx.reductions[m]):
                rname = reduce_name(m, k)
                itemsize = e.type.dtype.itemsize
                spec_r = CollSpec(
                    Coll.ALLREDUCE,
                    itemsize,
                    ctx.group,
                    ctx.ranks_per_node(pstage),
                    _registered(ctx, Coll.ALLREDUCE),
                    e.type.dtype.value,
                )
                cost = spec_r.cost(ctx.hw)
                ops.append(
                    Operation(
                        name=rname,
                        stage=m,
                        members=(m,),
                        needs=frozenset({f"{m}#partial"}),
                        makes=(m,) if k == len(ctx.reductions[m]) - 1 else (f"{rname}#done",),
                        stream=COMM,
                        kind=Kind.REDUCE,
                        pstage=pstage,
                        spec=spec_r,
                        nbytes=itemsize,
                        detail=f"scalar {e.op.value} allreduce {cost.label}",
                        sync=True,
                        batch_key=f"{itemsize}:{'max' if e.op is Op.AMAX else 'sum'}",
                    )
                )
        launch = bool(reducing)
    return ops


def batch_reductions(ctx: Context, ops: Sequence[Operation]) -> list[Operation]:
    """What the emitter does with cross-rank scalar reductions (`cocoviz.emit.batch`, the
    same `batch_runs` rule): a ``.reduce`` waits past the compute ops after it on its
    pipeline stage that do not need what the run makes, up to the next ``.reduce`` with
    the same key, and the run of them is one allreduce of their values together (one
    launch latency instead of several)."""

    if not any(op.batch_key for op in ops):
        return list(ops)  # no scalar reduction to batch

    def key(op: Operation) -> Hashable | None:
        return (op.batch_key, op.pstage) if op.kind is Kind.REDUCE and op.batch_key else None

    def may_pass(t: Operation, run: list[Operation]) -> bool:
        made = {m for r in run for m in r.makes}
        return (
            t.kind in (Kind.COMPUTE, Kind.FUSED)
            and t.pstage == run[0].pstage
            and not (t.needs & made)
        )

    def merge(run: list[Operation]) -> Operation:
        r = run[0]
        assert isinstance(r.spec, CollSpec)
        spec = dataclasses.replace(r.spec, nbytes=sum(int(g.nbytes) for g in run))
        return dataclasses.replace(
            r,
            name=" + ".join(g.name for g in run),
            members=tuple(m for g in run for m in g.members),
            needs=frozenset().union(*(g.needs for g in run)),
            makes=tuple(m for g in run for m in g.makes),
            spec=spec,
            nbytes=float(spec.nbytes),
            detail=f"{len(run)} scalar reductions, one allreduce {spec.cost(ctx.hw).label}",
        )

    return batch_runs(ops, key, may_pass, merge)


def _group_lower(ctx: Context, g: Group, chunks: int, nccl_device: bool) -> list[Operation]:
    """A fused group: compute only, RS→C→AG, compute→send, or send→compute."""
    inside = set(g.stages())
    members = sorted(inside, key=ctx.position.__getitem__)
    needs: set[str] = set()
    for m in members:
        needs |= {d for d in ctx.deps.get(m, ()) if d not in inside}
    colls = [m for m in members if ctx.by_name[m].expr.op in COLLECTIVES]
    compute = [m for m in members if m not in colls]
    label = f"fused({members[0]}…{members[-1]})"
    pstage = ctx.pstage_of(compute[0]) if compute else ctx.pstage_of(members[0])
    rs = [m for m in colls if ctx.by_name[m].expr.op is Op.REDUCESCATTER]
    ags = [m for m in colls if ctx.by_name[m].expr.op is Op.ALLGATHER]
    # a collective over dp spans nodes: its fused group stays on the host API, as the
    # emitter keeps groups of other shapes there (docs/cost-model.md, rank grids)
    over_dp = any(ctx.by_name[m].expr.tag == "dp" for m in colls)
    if rs and nccl_device and not over_dp:
        return _device_lower(ctx, members, rs, ags, compute, needs, chunks, label)
    ops: list[Operation] = []
    stream = COMM if rs else COMPUTE
    head = [
        m
        for m in colls
        if m in rs or ctx.by_name[m].expr.op is Op.SEND and _before(ctx, m, compute)
    ]
    tail = [m for m in colls if m not in head]
    for m in head:
        ops += _coll_op(ctx, m, chunks, ctx.deps.get(m, set()))
    if compute:
        ops += _compute_ops(ctx, compute, pstage, stream, chunks, kind=Kind.FUSED, label=label)
    for m in tail:
        ops += _coll_op(ctx, m, chunks, ctx.deps.get(m, set()))
    return ops


def _before(ctx: Context, coll: str, compute: Sequence[str]) -> bool:
    """Whether a send in a fused group feeds its compute (send → compute on the receiver)."""
    return any(coll in ctx.deps.get(c, ()) for c in compute)


def _device_lower(
    ctx: Context,
    members: Sequence[str],
    rs: Sequence[str],
    ags: Sequence[str],
    compute: Sequence[str],
    needs: set[str],
    chunks: int,
    label: str,
    reduce: bool = True,
) -> list[Operation]:
    """A fused RS→C→AG as one nccl-device kernel; ``reduce=False``: the reducescatter
    already ran (a decomposed group made it), so the kernel computes and gathers."""
    hw = ctx.hw
    if ctx.group > hw.gpus_per_node:
        raise UsageError(
            f"--collectives nccl-device needs every rank of a group in one NVLink domain: "
            f"{ctx.group} ranks > {hw.gpus_per_node} GPUs per node on {hw.name}",
            hint="use --collectives nccl, or fewer ranks",
        )
    reduce_bytes = sum(
        ctx.by_name[m].expr.args[0].type.numel * ctx.by_name[m].expr.args[0].type.dtype.itemsize
        for m in rs
        if reduce
    )
    gather_bytes = sum(ctx.by_name[m].ty.numel * ctx.by_name[m].ty.dtype.itemsize for m in ags)
    flops = 0.0
    reads: dict[str, int] = {}
    made = set(members)
    for m in compute:
        m_reads, m_flops, _, _ = _expr_work(ctx, ctx.by_name[m].expr)  # a GPU kernel: no libm
        flops += m_flops
        for n, b in m_reads.items():
            if n not in made and b > reads.get(n, 0):
                reads[n] = b
    writes = sum(ctx.per_rank_bytes(ctx.by_name[m].ty) for m in compute if ctx.stored_from(m, made))
    kspec = KernelSpec(flops / chunks, (sum(reads.values()) + writes) / chunks,
                       _wide_dtype(ctx.by_name[m].ty for m in compute), launch=False)  # fmt: skip
    spec = DeviceSpec(
        ctx.group,
        _chunk_bytes(reduce_bytes, chunks),
        _chunk_bytes(gather_bytes, chunks),
        kspec,
        reductions=sum(len(ctx.reductions.get(m, ())) for m in compute),
    )
    pstage = ctx.pstage_of(members[0])
    return [
        Operation(
            name=label,
            stage=rs[0],
            members=tuple(members),
            needs=frozenset(needs),
            makes=tuple(members),
            stream=COMM,
            kind=Kind.DEVICE,
            pstage=pstage,
            spec=spec,
            flops=kspec.flops,
            nbytes=float(spec.reduce_bytes + spec.gather_bytes),
            detail="one nccl-device kernel: RS → compute → AG over NVLink load/store"
            if reduce
            else "one nccl-device kernel: compute → AG over NVLink load/store",
            sync=True,
        )
    ]


def lower_item(ctx: Context, item: str | Group, chunks: int = 1, chunk: int = 0) -> list[Operation]:
    """Operations for one top-level item of the contracted order (one chunk of it)."""
    if isinstance(item, str):
        return lower_stage(ctx, item, chunks, chunk)
    if item.kind is GroupKind.FUSED:
        # the same for every chunk of an overlapped group (each is 1/K of the sizes):
        # lowered once per chunk count (the entry keeps the group, so its id stays its own)
        key = (id(item), chunks)
        hit = ctx.fused_ops.get(key)
        if hit is None:
            hit = (item, tuple(_group_lower(ctx, item, chunks, ctx.collectives == "nccl-device")))
            ctx.fused_ops[key] = hit
        return list(hit[1])
    raise ValueError("overlapped groups are lowered chunk by chunk by lower_overlap")


def lower_overlap(ctx: Context, g: Group, chunks: int | None = None) -> list[list[Operation]]:
    """Per chunk, the operations of every item of an overlapped group in item order."""
    k = chunks if chunks is not None else (g.chunks or 1)
    out: list[list[Operation]] = []
    for c in range(k):
        ops: list[Operation] = []
        for it in g.items:
            ops += lower_item(ctx, it, k, c)
        out.append(ops)
    return out


def overlap_order(ctx: Context, g: Group, chunks: int | None = None) -> list[tuple[int, Operation]]:
    """Every operation of an overlapped group with its chunk, in the order the emitted
    program issues them: chunk by chunk, or, for a group that chunks dimension 0 (one
    with an alltoall), as a software pipeline in which chunk k issues item t − k at tick t,
    so chunk k+1's alltoall is queued before chunk k's return one (docs/schedules.md,
    overlap)."""
    k = chunks if chunks is not None else (g.chunks or 1)
    items = [[lower_item(ctx, it, k, c) for c in range(k)] for it in g.items]
    if not leading_chunks(ctx.program, tuple(g.stages())):
        return [(c, op) for c in range(k) for per in items for op in per[c]]
    out: list[tuple[int, Operation]] = []
    for t in range(k + len(items) - 1):
        for c in range(k):
            if 0 <= t - c < len(items):
                out.extend((c, op) for op in items[t - c][c])
    return out


# ---------------------------------------------------------------------------------------
# Shard-decomposed groups


def lower_decomposed(ctx: Context, g: Group) -> list[tuple[int, Operation]]:
    """Every operation of a group decomposed by shard (``overlapped shards=G``) with its
    step (-1 after the steps), in the order the ring runs them (docs/schedules.md,
    decompose; docs/cost-model.md):

    - gather (``xg = allgather(x)`` read by ``h = matmul(…)``): at step s the GEMM of the
      shard the rank holds, and (s < G−1) the exchange that sends that shard to one ring
      neighbour and receives the next from the other; the GEMM of step s+1 waits for it;
    - scatter (``p = matmul(…)``, ``ps = reducescatter(op, p)``): at step s the GEMM of
      one block of rows, (s ≥ 1) the add of the accumulator received in exchange s−1,
      and (s < G−1) the exchange that sends the sum on and receives the next
      accumulator; after the last add the rank holds its part of ``ps``. The add is a
      kernel between a receive and a send, so it is issued on the communication stream,
      as the fused kernel of an RS→C→AG is (`_group_lower`): the compute stream runs
      the GEMMs back to back. A fused group the reducescatter starts then runs on the
      rank's part.

    The steps are chained by value keys of their own (``xg#shard3``, ``ps#acc3``), so
    a step waits for exactly what the ring hands it."""
    hit = ctx.decomposed.get(id(g))
    if hit is None or hit[0] is not g:
        hit = ctx.decomposed[id(g)] = (g, tuple(_lower_decomposed(ctx, g)))
    return list(hit[1])


def decomposed_plan(ctx: Context, g: Group) -> ShardPlan:
    """The geometry of a decomposed group of ``ctx.program`` (`cocoviz.ir.shards`)."""
    return shard_plan(ctx.program, g)


def decomposed_work(ctx: Context, g: Group) -> tuple[float, float]:
    """The work of a decomposed group's own stages, each operation priced alone (no
    contention): (its step GEMMs, its exchanges). No timeline of the group can be shorter
    than either sum (the perfect-overlap bound): the GEMMs run one after the other on the
    compute stream, the exchanges one after the other on the communication stream."""
    gemms = comm = 0.0
    for step, op in lower_decomposed(ctx, g):
        if step < 0:
            continue  # the fused group after a decomposed reducescatter
        if isinstance(op.spec, ExchangeSpec):
            comm += op.spec.cost(ctx.hw).time_s
        elif isinstance(op.spec, MatmulSpec):
            gemms += duration(ctx.hw, op)
    return gemms, comm


def _lower_decomposed(ctx: Context, g: Group) -> list[tuple[int, Operation]]:
    plan = decomposed_plan(ctx, g)
    if plan.kind == "gather":
        return _lower_gather(ctx, plan)
    return _lower_scatter(ctx, g, plan)


def _ring_exchange(
    ctx: Context, plan: ShardPlan, nbytes: int, needs: Iterable[str], makes: tuple[str, ...]
) -> Operation:
    G = plan.group
    pstage = ctx.pstage_of(plan.collective)
    same_node = ctx.ranks_per_node(pstage) >= G
    spec = ExchangeSpec(nbytes, same_node)
    cost = spec.cost(ctx.hw)
    where = "NVLink" if same_node else "the network"
    if plan.kind == "gather":
        what = "a shard to rank r−1, the next from rank r+1"
    else:
        what = "the sum to rank r+1, the next accumulator from rank r−1"
    return Operation(
        name=plan.collective,
        stage=plan.collective,
        members=(plan.collective,),
        needs=frozenset(needs),
        makes=makes,
        stream=COMM,
        kind=Kind.P2P,
        pstage=pstage,
        spec=spec,
        nbytes=float(nbytes),
        detail=f"ring exchange ({G - 1} of them): {what}, over {where}, {cost.label}",
        sync=True,
    )


def _step_gemm(
    ctx: Context,
    plan: ShardPlan,
    step: int,
    needs: Iterable[str],
    makes: tuple[str, ...],
) -> Operation:
    mm = ctx.by_name[plan.matmul]
    gemm = plan.gemms[plan.shard_at(0, step)]  # every rank's GEMM of a step is alike
    spec = MatmulSpec(gemm.m, gemm.n, gemm.k, _NAME[mm.ty.dtype], gemm.batch)
    return Operation(
        name=mm.name,
        stage=mm.name,
        members=(mm.name,),
        needs=frozenset(needs),
        makes=makes,
        stream=COMPUTE,
        kind=Kind.MATMUL,
        pstage=ctx.pstage_of(mm.name),
        spec=spec,
        flops=spec.flops,
        nbytes=spec.nbytes,
        detail=f"{spec.shape_text}, 1/{plan.group} of the GEMM a step: "
        + ("the shard the rank holds" if plan.kind == "gather" else "one block of rows"),
    )


def _lower_gather(ctx: Context, plan: ShardPlan) -> list[tuple[int, Operation]]:
    G = plan.group
    ag, mm = ctx.by_name[plan.collective], ctx.by_name[plan.matmul]
    x = ag.expr.args[0].type
    shard_bytes = plan.shard_numel * _ITEMSIZE[x.dtype]
    x_needs = set(ctx.deps.get(ag.name, ()))
    mm_needs = {d for d in ctx.deps.get(mm.name, ()) if d != ag.name}
    # The shards arrive in a staging area of G slots in rank order, which is the gathered
    # value where each rank's part is one contiguous run of it; otherwise (a block of a
    # later dimension) it is permuted into place once, where something else reads it
    # (`cocoviz.exec.shard_pipeline` does the same).
    permuted = not _contiguous_parts(x, G) and (
        any(u != mm.name for u in ctx.users.get(ag.name, ()))
        or ag.name in ctx.outputs
        or ag.name in ctx.updates
    )
    rounds = plan.mode == "accumulate" and _ITEMSIZE[mm.ty.dtype] < 4 and _IS_FLOAT[mm.ty.dtype]

    def shard(s: int) -> str:
        return f"{ag.name}#shard{s}"

    ops: list[tuple[int, Operation]] = []
    for s in range(G):
        held = x_needs if s == 0 else {shard(s)}
        if s < G - 1:
            arrived: tuple[str, ...] = (shard(s + 1),)
            if s == G - 2:
                arrived += (f"{ag.name}#gathered",) if permuted else (ag.name,)
            ops.append((s, _ring_exchange(ctx, plan, shard_bytes, held, arrived)))
        makes = (mm.name,) if s == G - 1 and not rounds else ()
        ops.append((s, _step_gemm(ctx, plan, s, mm_needs | held, makes)))
    if permuted:
        k = KernelSpec(0.0, 2.0 * shard_bytes * G, _NAME[x.dtype])
        ops.append(
            (
                G - 1,
                Operation(
                    name=f"{ag.name}.permute",
                    stage=ag.name,
                    members=(ag.name,),
                    needs=frozenset({f"{ag.name}#gathered"}),
                    makes=(ag.name,),
                    stream=COMM,
                    kind=Kind.COMPUTE,
                    pstage=ctx.pstage_of(ag.name),
                    spec=k,
                    nbytes=k.nbytes,
                    detail="permute the gathered shards into place",
                ),
            )
        )
    if rounds:
        # half types accumulate the split contraction in f32 and round once
        n = per_rank_numel(mm.ty, ctx.group)
        k = KernelSpec(
            float(n),
            float(n * (4 + _ITEMSIZE[mm.ty.dtype])),
            _NAME[mm.ty.dtype],
            converts=_converts((), [(mm.ty.dtype, float(n * _ITEMSIZE[mm.ty.dtype]))]),
        )
        ops.append(
            (
                G - 1,
                Operation(
                    name=f"{mm.name}.round",
                    stage=mm.name,
                    members=(mm.name,),
                    needs=frozenset(),
                    makes=(mm.name,),
                    stream=COMPUTE,
                    kind=Kind.COMPUTE,
                    pstage=ctx.pstage_of(mm.name),
                    spec=k,
                    flops=k.flops,
                    nbytes=k.nbytes,
                    detail="round the f32 accumulator of the split contraction",
                ),
            )
        )
    return ops


def _contiguous_parts(ty: TensorType, group: int) -> bool:
    """Whether each rank's part of a value is one contiguous run of its global elements
    (`cocoviz.exec.layout.is_contiguous_chunk`'s rule)."""
    d = block_dim(ty.layout, ty.shape, group)
    return d is None or all(s.value == 1 for s in ty.shape[:d])


def _lower_scatter(ctx: Context, g: Group, plan: ShardPlan) -> list[tuple[int, Operation]]:
    G = plan.group
    mm, rs = ctx.by_name[plan.matmul], ctx.by_name[plan.collective]
    block_bytes = plan.shard_numel * _ITEMSIZE[rs.ty.dtype]
    mm_needs = set(ctx.deps.get(mm.name, ()))
    pstage = ctx.pstage_of(rs.name)
    # the received accumulator and the block read, the sum written (to be sent on)
    add = KernelSpec(
        float(plan.shard_numel),
        3.0 * block_bytes,
        _NAME[rs.ty.dtype],
        converts=_converts([(rs.ty.dtype, 2.0 * block_bytes)], [(rs.ty.dtype, float(block_bytes))]),
    )
    rop = rs.expr.rop.value if rs.expr.rop is not None else "+"

    def acc(s: int) -> str:  # the sum a rank holds after step s
        return f"{rs.name}#acc{s}"

    def received(s: int) -> str:  # the accumulator exchange s brings
        return f"{rs.name}#recv{s}"

    ops: list[tuple[int, Operation]] = []
    for s in range(G):
        block = acc(0) if s == 0 else f"{mm.name}#block{s}"
        makes = (block, mm.name) if s == G - 1 else (block,)
        ops.append((s, _step_gemm(ctx, plan, s, mm_needs, makes)))
        if s > 0:
            ops.append(
                (
                    s,
                    Operation(
                        name=f"{rs.name}.add",
                        stage=rs.name,
                        members=(rs.name,),
                        needs=frozenset({block, received(s - 1)}),
                        makes=(rs.name,) if s == G - 1 else (acc(s),),
                        stream=COMM,
                        kind=Kind.COMPUTE,
                        pstage=pstage,
                        spec=add,
                        flops=add.flops,
                        nbytes=add.nbytes,
                        detail=f"combine ({rop}) the accumulator received with the block",
                    ),
                )
            )
        if s < G - 1:
            ops.append((s, _ring_exchange(ctx, plan, block_bytes, {acc(s)}, (received(s),))))
    inner = next((it for it in g.items if isinstance(it, Group)), None)
    if inner is not None:
        ops += [(-1, op) for op in _scattered_rest(ctx, inner, rs.name)]
    return ops


def _scattered_rest(ctx: Context, inner: Group, rs: str) -> list[Operation]:
    """The fused group a decomposed reducescatter starts, on the scattered result: its
    computation and allgathers as `_group_lower` issues them, without the reducescatter."""
    if ctx.collectives != "nccl-device":
        return [op for op in _group_lower(ctx, inner, 1, False) if op.stage != rs]
    inside = set(inner.stages())
    members = sorted(inside, key=ctx.position.__getitem__)
    needs = {d for m in members for d in ctx.deps.get(m, ()) if d not in inside} | {rs}
    colls = [m for m in members if ctx.by_name[m].expr.op in COLLECTIVES]
    ags = [m for m in colls if ctx.by_name[m].expr.op is Op.ALLGATHER]
    compute = [m for m in members if m not in colls]
    label = f"fused({members[0]}…{members[-1]})"
    return _device_lower(ctx, members, [rs], ags, compute, needs, 1, label, reduce=False)


def item_name_of(item: str | Group) -> str:
    return item if isinstance(item, str) else next(iter(item.stages()))


def overlap_rows(ctx: Context, g: Group) -> int:
    return output_rows(ctx, item_name_of(g.items[0]))


def chunks_legal(ctx: Context, g: Group, k: int) -> bool:
    """Whether K chunks are legal for an overlapped group (docs/schedules.md, overlap)."""
    if k < 1:
        return False
    if leading_chunks(ctx.program, tuple(g.stages())):
        lead = ctx.by_name[item_name_of(g.items[0])].ty.shape
        return bool(lead) and lead[0].value % k == 0
    if overlap_rows(ctx, g) % k:
        return False
    rowwise = False
    for n in g.stages():
        s = ctx.by_name[n]
        if s.expr.op is Op.REDUCESCATTER:
            if (s.expr.args[0].type.numel // k) % ctx.group or s.expr.args[0].type.numel % k:
                return False
        if any(e.op in ROWWISE for e in s.expr.walk()):
            rowwise = True
    if rowwise and (overlap_rows(ctx, g) // k) % ctx.group:
        return False
    return True


def comm_contention_of(hw: Hardware, op: Operation) -> Contention:
    """What an operation running on the communication stream takes from compute."""
    spec = op.spec
    if isinstance(spec, CollSpec):
        return comm_contention(hw, spec.cost(hw))
    if isinstance(spec, P2PSpec):
        return comm_contention(hw, _p2p(hw, max(spec.nbytes, 1), True))
    if isinstance(spec, ExchangeSpec):
        return comm_contention(hw, spec.cost(hw))
    if isinstance(spec, DeviceSpec):
        dur = spec.time(hw)
        return Contention(
            sm_fraction=min(0.95, min(hw.gpu.sms, hw.nccl.channels) / hw.gpu.sms),
            hbm_gbps=(spec.reduce_bytes + spec.gather_bytes) * 2 / dur / 1e9 if dur else 0.0,
            interference=hw.overlap.compute_slowdown_nvlink,
        )
    if isinstance(spec, KernelSpec):
        dur = spec.time(hw, NO_CONTENTION)
        return Contention(
            sm_fraction=min(0.95, hw.nccl.channels / hw.gpu.sms),
            hbm_gbps=min(hw.gpu.hbm_gbps, spec.nbytes / dur / 1e9) if dur else 0.0,
            interference=hw.overlap.compute_slowdown_nvlink,
        )
    return NO_CONTENTION


def duration(hw: Hardware, op: Operation, contention: Contention = NO_CONTENTION) -> float:
    """Seconds an operation takes (a compute op under ``contention``)."""
    spec = op.spec
    if isinstance(spec, KernelSpec | MatmulSpec):
        return spec.time(hw, contention)
    if isinstance(spec, CollSpec | ExchangeSpec):
        return spec.cost(hw).time_s
    if isinstance(spec, DeviceSpec):
        return spec.time(hw)
    raise TypeError(f"{op.name}: p2p durations depend on the pair; use p2p_duration")


def p2p_duration(hw: Hardware, op: Operation, same_node: bool) -> CollCost:
    assert isinstance(op.spec, P2PSpec)
    return _p2p(hw, op.spec.nbytes, same_node)


def is_compute(op: Operation) -> bool:
    return isinstance(op.spec, KernelSpec | MatmulSpec)


CostFn = Callable[[Contention], float]

__all__ = [
    "COLLECTIVE_MODES",
    "COMM",
    "COMM_KINDS",
    "COMPUTE",
    "Context",
    "CostModelError",
    "ExchangeSpec",
    "Kind",
    "Operation",
    "chunks_legal",
    "comm_contention_of",
    "decomposed_plan",
    "decomposed_work",
    "duration",
    "exchange_cost",
    "lower_decomposed",
    "lower_item",
    "lower_overlap",
    "overlap_order",
    "make_context",
    "matmul_dims",
    "p2p_duration",
]
