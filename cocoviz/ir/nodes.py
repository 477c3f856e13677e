"""IR node types. Programs are values: frozen dataclasses and tuples.

A `Program` is a list of named `Stage`s, each holding one expression tree (`Expr`) over
references to inputs, params and earlier stages. Types (dtype, global shape, layout,
pipeline stage) are filled in by inference (`cocoviz.ir.infer`), which also
canonicalizes (replicated operands of sliced values become `slice(x)`). Source spans are
excluded from equality, so a printed-and-reparsed program compares equal.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Union

from cocoviz.errors import Source, Span
from cocoviz.ir.collectives import COLLECTIVE_TABLE
from cocoviz.ir.types import REPLICATED, DType, Shape, TensorType


class Op(enum.Enum):
    """Expression operators; `.value` is the DSL spelling."""

    REF = "ref"
    CONST = "const"
    # elementwise
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    NEG = "neg"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    EXP = "exp"
    LOG = "log"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    GELU = "gelu"
    ABS = "abs"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    WHERE = "where"
    CAST = "cast"
    DROPOUT = "dropout"
    SLICE = "slice"
    # row-wise over the last dimension
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"
    SOFTMAX = "softmax"
    # whole-tensor reductions to a scalar
    SUM = "sum"
    NORM = "norm"
    AMAX = "amax"
    # whole right-hand side only
    MATMUL = "matmul"
    UPDATE = "update"
    RESHAPE = "reshape"
    # data movement: a permutation of the dimensions (`tag` holds the written dimensions)
    TRANSPOSE = "transpose"
    PERMUTE = "permute"
    # routing (docs/language.md, routing): GATHER/SCATTER_ADD `value` = the indexed
    # dimension, SCATTER_ADD `dtype_arg`/`shape_arg` = the result's type; TOPK and
    # TOPK_INDICES `value` = the dimension, `shape_arg` = (k,); CAPACITY_SLOTS
    # `shape_arg` = (E, C)
    GATHER = "gather"
    SCATTER_ADD = "scatter_add"
    TOPK = "topk"
    TOPK_INDICES = "topk_indices"
    CAPACITY_SLOTS = "capacity_slots"
    # reductions along one dimension (`value` = the dimension, `tag` = "keepdim" or None):
    # `sum(x, dim=d)` and `amax(x, dim=d)` are these, not the whole-tensor SUM and AMAX
    SUM_DIM = "sum(dim)"
    MEAN = "mean"
    AMAX_DIM = "amax(dim)"
    AMIN = "amin"
    # constants of a given type (`dtype_arg`, `shape_arg`): FULL `value` = the value,
    # IOTA `value` = the dimension it counts along
    ZEROS = "zeros"
    ONES = "ones"
    FULL = "full"
    IOTA = "iota"
    # collectives: one row each in cocoviz.ir.collectives.COLLECTIVE_TABLE
    ALLREDUCE = "allreduce"
    REDUCESCATTER = "reducescatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    SEND = "send"
    ALLTOALL = "alltoall"

    # Members are singletons compared by identity, so the identity hash is equivalent to
    # Enum's (a Python-level hash of the name) and several times cheaper: inference and
    # lowering test an op against sets and tables of ops at every node.
    __hash__ = object.__hash__


BINARY_INFIX = {Op.ADD, Op.SUB, Op.MUL, Op.DIV}
BINARY_CALLS = {Op.MAX, Op.MIN, Op.POW}
UNARY_CALLS = {
    Op.SQRT,
    Op.RSQRT,
    Op.EXP,
    Op.LOG,
    Op.TANH,
    Op.SIGMOID,
    Op.RELU,
    Op.GELU,
    Op.ABS,
}
COMPARISONS = {Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE}
ROWWISE = {Op.LAYERNORM, Op.RMSNORM, Op.SOFTMAX}
REDUCTIONS = {Op.SUM, Op.NORM, Op.AMAX}
PERMUTES = frozenset({Op.TRANSPOSE, Op.PERMUTE})
"""`transpose(x, d0, d1)` and `permute(x, p0, …)`: each rank permutes its own array."""
ROUTING = frozenset({Op.GATHER, Op.SCATTER_ADD, Op.TOPK, Op.TOPK_INDICES, Op.CAPACITY_SLOTS})
"""Routing by index (docs/language.md, routing): each a stage of its own that reads its
operands at data-dependent positions of the rank's arrays."""
AXIS_REDUCTIONS = frozenset({Op.SUM_DIM, Op.MEAN, Op.AMAX_DIM, Op.AMIN})
"""`sum/mean/amax/amin(x, dim=d, keepdim=…)`: a reduction along one dimension."""
AXIS_NAMES = {Op.SUM_DIM: "sum", Op.MEAN: "mean", Op.AMAX_DIM: "amax", Op.AMIN: "amin"}
"""How each reduction along a dimension is written."""
CONSTANTS = frozenset({Op.ZEROS, Op.ONES, Op.FULL, Op.IOTA})
"""`zeros/ones/full/iota(DTYPE[DIMS], …)`: values of a given type that read nothing."""
READS_OTHER_ELEMENTS = PERMUTES | AXIS_REDUCTIONS | ROUTING
"""Nodes that read their operand at other elements than their own (an emitter cannot
compute them element by element in the kernel that writes the operand)."""


def fill_value(e: Expr) -> float | int:
    """The value every element of a ZEROS, ONES or FULL node holds."""
    if e.op is Op.ZEROS:
        return 0
    if e.op is Op.ONES:
        return 1
    assert e.op is Op.FULL and e.value is not None
    return e.value
COLLECTIVES = frozenset(Op(c.name) for c in COLLECTIVE_TABLE)
"""The collective operators: the rows of the collectives table (each needs its member)."""
WHOLE_RHS = COLLECTIVES | ROUTING | {Op.MATMUL, Op.RESHAPE}
ELEMENTWISE = (
    BINARY_INFIX
    | BINARY_CALLS
    | UNARY_CALLS
    | COMPARISONS
    | {Op.NEG, Op.WHERE, Op.CAST, Op.DROPOUT, Op.SLICE}
)
CALL_NAMES = {
    op.value: op
    for op in Op
    if op not in BINARY_INFIX | COMPARISONS | {Op.REF, Op.CONST, Op.NEG, Op.SUM_DIM, Op.AMAX_DIM}
}


MAX_EXPR_DEPTH = 2_000
"""Operators and calls nested in one expression, on its deepest path (`x + x + … + x`
with 1,000 operators is 1,000 deep); the parser refuses deeper expressions."""

# The passes over an expression (lowering, inference, printing, the reference, the
# emitters) recurse a few frames per level; give them room for `MAX_EXPR_DEPTH` levels
# (expressions the schedule steps build by substitution can be a few times deeper).
_FRAMES_PER_LEVEL = 12
if sys.getrecursionlimit() < MAX_EXPR_DEPTH * _FRAMES_PER_LEVEL:
    sys.setrecursionlimit(MAX_EXPR_DEPTH * _FRAMES_PER_LEVEL)


class ReduceOp(enum.Enum):
    """Reduction operators of collectives; `.value` is the DSL spelling."""

    SUM = "+"
    PROD = "*"
    MAX = "max"
    MIN = "min"
    AVG = "avg"

    __hash__ = object.__hash__  # as Op's


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class Expr:
    """One expression node: an operator, its operands, and its few attributes.

    Attributes by op: REF `name`; CONST `value`; CAST `dtype_arg`; DROPOUT `value` = p and
    `tag` = stable id; LAYERNORM/RMSNORM `value` = eps; SLICE `value` = dim or None;
    BROADCAST/REDUCE `value` = root; ALLTOALL `value` = the `to` dimension and `tag` = the
    `from` dimension as text (both normal, non-negative, after inference; `tag` None
    before inference when the source omits `from=`); TRANSPOSE/PERMUTE `tag` = the
    written dimensions as comma-separated text (non-negative after inference; see
    `permutation`); SUM_DIM/MEAN/AMAX_DIM/AMIN `value` = the reduced dimension
    (non-negative after inference) and `tag` = "keepdim" when it is kept with extent 1;
    collectives with a reduction `rop`.
    """

    op: Op
    args: tuple[Expr, ...] = ()
    name: str | None = None
    value: float | int | None = None
    rop: ReduceOp | None = None
    dtype_arg: DType | None = None
    tag: str | None = None
    shape_arg: Shape | None = None
    ty: TensorType | None = None
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)

    def __init__(
        self,
        op: Op,
        args: tuple[Expr, ...] = (),
        name: str | None = None,
        value: float | int | None = None,
        rop: ReduceOp | None = None,
        dtype_arg: DType | None = None,
        tag: str | None = None,
        shape_arg: Shape | None = None,
        ty: TensorType | None = None,
        span: Span | None = None,
    ) -> None:
        # Parsing and inference make a node per operand: as Span's, the fields go
        # straight into __dict__, at a fraction of the cost of the generated frozen
        # __init__ (an object.__setattr__ call for each of the ten fields).
        d = self.__dict__
        d["op"] = op
        d["args"] = args
        d["name"] = name
        d["value"] = value
        d["rop"] = rop
        d["dtype_arg"] = dtype_arg
        d["tag"] = tag
        d["shape_arg"] = shape_arg
        d["ty"] = ty
        d["span"] = span

    @property
    def type(self) -> TensorType:
        assert self.ty is not None, f"untyped expression {self.op}"
        return self.ty

    def walk(self) -> Iterator[Expr]:
        """This node and all nodes below it, pre-order (without recursion: nested
        generators would cost time proportional to the depth for every node)."""
        todo = [self]
        while todo:
            e = todo.pop()
            yield e
            if e.args:
                todo.extend(reversed(e.args))

    def refs(self) -> Iterator[str]:
        for e in self.walk():
            if e.op is Op.REF and e.name is not None:
                yield e.name


# The names an expression reads live on the expression itself (a private attribute
# outside the dataclass fields, so equality, hashing and `dataclasses.replace` ignore
# it): computed once per expression object and dropped with it.
_READS_ATTR = "_cocoviz_reads"


def expr_reads(e: Expr) -> frozenset[str]:
    """The names `e` reads (`Expr.refs` as a set), cached on the expression object."""
    d = e.__dict__
    names: frozenset[str] | None = d.get(_READS_ATTR)
    if names is None:
        names = d[_READS_ATTR] = _refs(e)
    return names


def _refs(e: Expr) -> frozenset[str]:
    """One loop over the nodes (`Expr.refs` stacks two generators)."""
    ref_op = Op.REF
    if e.op is ref_op:
        return frozenset(() if e.name is None else (e.name,))
    found: list[str] = []
    todo = list(e.args)
    while todo:
        x = todo.pop()
        if x.op is ref_op:
            if x.name is not None:
                found.append(x.name)
        elif x.args:
            todo.extend(x.args)
    return frozenset(found)


def permutation(e: Expr) -> tuple[int, ...]:
    """The permutation of a typed TRANSPOSE or PERMUTE node: result dimension k is
    operand dimension ``perm[k]`` (docs/language.md, transpose and permute)."""
    assert e.tag is not None
    dims = tuple(int(x) for x in e.tag.split(","))
    if e.op is Op.PERMUTE:
        return dims
    rank = len(e.args[0].type.shape)
    d0, d1 = (d + rank if d < 0 else d for d in dims)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return tuple(perm)


def ref(name: str, span: Span | None = None) -> Expr:
    return Expr(Op.REF, name=name, span=span)


@dataclass(frozen=True)
class DimDecl:
    """`dim NAME = VALUE`: a named size."""

    name: str
    value: int
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Param:
    """A runtime scalar, replicated, with a default."""

    name: str
    dtype: DType
    default: float | int
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Input:
    """`input NAME : TYPE`: a value the program reads, with its type."""

    name: str
    ty: TensorType
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Stage:
    """A named value `name = expr`; its type is the expression's."""

    name: str
    expr: Expr
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def op(self) -> Op:
        return self.expr.op

    @property
    def ty(self) -> TensorType:
        return self.expr.type

    @property
    def is_collective(self) -> bool:
        return self.expr.op in COLLECTIVES


class GroupKind(enum.Enum):
    FUSED = "fused"
    OVERLAPPED = "overlapped"

    __hash__ = object.__hash__  # as Op's


GroupItem = Union[str, "Group"]


@dataclass(frozen=True)
class Group:
    """A fused group (stage names) or an overlapped group (stage names or fused groups).

    An overlapped group is either row-chunked (`overlap`: `chunks` = K) or decomposed by
    shard (`decompose`: `by_shard`, `chunks` = G, one step per shard; the group's
    geometry is `cocoviz.ir.shards.shard_plan`)."""

    kind: GroupKind
    items: tuple[GroupItem, ...]
    chunks: int | None = None
    by_shard: bool = False

    def stages(self) -> Iterator[str]:
        for it in self.items:
            if isinstance(it, Group):
                yield from it.stages()
            else:
                yield it


@dataclass(frozen=True)
class StepCall:
    """A schedule step as written: `name(arg, …, key=int)`."""

    name: str
    args: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, int], ...] = ()
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)
    arg_spans: tuple[Span | None, ...] = field(default=(), compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        parts = list(self.args) + [f"{k}={v}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})"


@dataclass(frozen=True)
class ScheduleBlock:
    """`schedule NAME { … }`: a named list of schedule steps."""

    name: str
    steps: tuple[StepCall, ...]
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Grid:
    """`ranks N` (tp=N, pp=1, not a grid) or `ranks dp=D, tp=T, pp=P` (any subset of
    the named axes, in any order: `order` keeps the written order for the printer).

    World ranks are numbered tp-fastest: rank = (pp·D + dp)·T + tp (docs/language.md,
    rank grids), so a tp group is T consecutive ranks and a dp group strides by T.
    """

    tp: int
    pp: int = 1
    is_grid: bool = False
    dp: int = 1
    order: tuple[str, ...] = ()

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def group(self) -> int:
        """Ranks a collective runs over by default (G: the tp axis)."""
        return self.tp

    @property
    def has_dp(self) -> bool:
        """The grid names a data-parallel axis (values then have a layout over dp)."""
        return "dp" in self.order

    @property
    def axes(self) -> tuple[str, ...]:
        """The axis names a program may write (`over=`), in the written order."""
        if not self.is_grid:
            return ()
        return self.order or ("tp", "pp")

    def size(self, axis: str) -> int:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp}[axis]

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of a world rank."""
        rest, tp = divmod(rank, self.tp)
        p, d = divmod(rest, self.dp)
        return p, d, tp

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def __str__(self) -> str:
        if not self.is_grid:
            return str(self.tp)
        return ", ".join(f"{a}={self.size(a)}" for a in self.axes)


@dataclass(frozen=True)
class Program:
    """A whole program: its grid, declarations, stages, outputs and schedule groups."""

    name: str
    grid: Grid
    dims: tuple[DimDecl, ...]
    params: tuple[Param, ...]
    inputs: tuple[Input, ...]
    stages: tuple[Stage, ...]
    outputs: tuple[str, ...]
    groups: tuple[Group, ...] = ()
    schedules: tuple[ScheduleBlock, ...] = ()
    source_names: frozenset[str] = field(default=frozenset(), compare=False, hash=False)
    source: Source | None = field(default=None, compare=False, hash=False, repr=False)

    # --- lookups -------------------------------------------------------------------
    # Each lookup is a dict built on first use and kept with the program (a program is
    # an immutable value, and `dataclasses.replace` makes a new one without them), so a
    # pass that looks up every stage costs linear time, not quadratic.
    @functools.cached_property
    def _stage_map(self) -> dict[str, Stage]:
        out: dict[str, Stage] = {}
        for s in self.stages:
            out.setdefault(s.name, s)
        return out

    @functools.cached_property
    def _decl_map(self) -> dict[str, Input | Param]:
        out: dict[str, Input | Param] = {}
        for i in self.inputs:
            out.setdefault(i.name, i)
        for p in self.params:
            out.setdefault(p.name, p)  # an input before a param of the same name
        return out

    @functools.cached_property
    def _group_map(self) -> dict[str, Group]:
        out: dict[str, Group] = {}
        for g in self.groups:
            for name in g.stages():
                out.setdefault(name, g)
        return out

    def stage(self, name: str) -> Stage:
        return self._stage_map[name]

    def has_stage(self, name: str) -> bool:
        return name in self._stage_map

    def input(self, name: str) -> Input:
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(name)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def type_of(self, name: str) -> TensorType:
        decl = self._decl_map.get(name)
        if isinstance(decl, Input):
            return decl.ty
        if decl is not None:
            return TensorType(decl.dtype, (), REPLICATED, None)
        return self.stage(name).ty

    def names(self) -> set[str]:
        """Every name bound in the program (dims, params, inputs, stages)."""
        return (
            {d.name for d in self.dims}
            | {p.name for p in self.params}
            | {i.name for i in self.inputs}
            | {s.name for s in self.stages}
        )

    def group_of(self, name: str) -> Group | None:
        """The top-level group holding stage `name`, if any."""
        return self._group_map.get(name)

    def updates(self) -> dict[str, str]:
        """Updated input name → the stage that names its new value."""
        out: dict[str, str] = {}
        for s in self.stages:
            if s.expr.op is Op.UPDATE:
                tgt = s.expr.args[0].name
                assert tgt is not None
                out[tgt] = s.name
        return out

    @property
    def shape_env(self) -> dict[str, int]:
        return {d.name: d.value for d in self.dims}


def unscheduled(program: Program) -> Program:
    """The same stages without fused or overlapped groups: the baseline the simulator
    compares a schedule against and the program the emitter's ``--check`` runs."""
    return dataclasses.replace(program, groups=())


__all__ = [
    "COLLECTIVES",
    "DType",
    "DimDecl",
    "Expr",
    "Grid",
    "Group",
    "GroupKind",
    "Input",
    "AXIS_NAMES",
    "AXIS_REDUCTIONS",
    "CONSTANTS",
    "Op",
    "PERMUTES",
    "ROUTING",
    "Param",
    "Program",
    "ReduceOp",
    "ScheduleBlock",
    "Shape",
    "Stage",
    "StepCall",
    "TensorType",
    "fill_value",
    "permutation",
    "unscheduled",
]
