"""The numpy reference: a Program on G·P simulated ranks (docs/semantics-notes.md).

Every rank holds exactly what it would store (`layout.rank_shape`): sliced chunks, its
own local contents, a full replicated copy. Inputs come from the shared generator (each
rank generates only its part of the global index space) or from given global arrays.
Stages run in program order; fused and overlapped groups do not change values (a
transformation never changes a global value), so the reference ignores them.

Replicated values are computed once per pipeline stage and the one array is shared by the
ranks of the group (each would compute the same bits from the same operands); shared
arrays are read-only. The per-rank view is still exact: `RunResult.storage(name, rank)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from cocoviz import numerics as nx
from cocoviz.errors import InputError, UsageError, did_you_mean
from cocoviz.exec import ops
from cocoviz.exec.layout import (
    chunk_range,
    global_flat_index,
    global_shape,
    grid_global_shape,
    is_contiguous_chunk,
    join_global,
    join_grid,
    rank_shape,
    split_grid,
    take_rank_part,
)
from cocoviz.ir.nodes import COLLECTIVES, Expr, Op, Program, Stage
from cocoviz.ir.types import REPLICATED, TensorType, dp_view, format_shape

__all__ = [
    "DEFAULT_MAX_MEM",
    "DEFAULT_MAX_WORK",
    "RunResult",
    "check_limits",
    "estimate_bytes",
    "estimate_work",
    "run_reference",
]

Array = npt.NDArray[Any]

DEFAULT_MAX_MEM = 4 << 30
"""Default limit of `estimate_bytes` (4 GiB, `--max-mem`)."""

DEFAULT_MAX_WORK = 2 * 10**11
"""Default limit of `estimate_work` (`--max-work`): numpy's GEMM (f16 and bf16 through
f32) does about 25 G multiply-adds per CPU second here, so a run within it takes seconds,
not the hours a program at production size would (docs/semantics-notes.md, tolerances
and memory)."""

ELEMENT_WORK = 32
"""What one element of an operation other than matmul counts in `estimate_work`: numpy
does elementwise work (a temporary per operation, compute-type conversions) at about a
thirtieth of its GEMM's rate per operation (0.7 G elements against 25 G multiply-adds
per CPU second, measured on the samples)."""


@dataclass
class Stored:
    """One value on the ranks of its pipeline stage: arrays indexed by tp rank."""

    ty: TensorType
    arrays: list[Array]

    @property
    def pstage(self) -> int | None:
        return self.ty.pstage


@dataclass
class RunResult:
    """What a reference run leaves behind: every value's per-rank storage."""

    program: Program
    seed: int
    values: dict[str, Stored] = field(repr=False)
    initial: dict[str, Stored] = field(repr=False)

    @property
    def group(self) -> int:
        return self.program.grid.group

    def _stored(self, name: str) -> Stored:
        updates = self.program.updates()
        if name in updates:
            return self.values[updates[name]]
        if name in self.values:
            return self.values[name]
        hint = did_you_mean(name, self.values)
        raise KeyError(f"no value named '{name}'" + (f" ({hint})" if hint else ""))

    def global_value(self, name: str) -> Array:
        """The global value of a stage, an input or a param. An updated input gives the
        global value of its update stage (its value after the program); see `initial_value`
        for the value it started with."""
        s = self._stored(name)
        return self._join(s)

    def _join(self, s: Stored) -> Array:
        if self.program.grid.has_dp:
            return join_grid(s.arrays, s.ty, self.group, self.program.grid.dp)
        return join_global(s.arrays, s.ty, self.group)

    def initial_value(self, name: str) -> Array:
        """The global value an input started with."""
        s = self.initial[name]
        return self._join(s)

    def storage(self, name: str, rank: int) -> Array:
        """What world rank `rank` stores for `name` (world rank = (pp·D + dp)·T + tp)."""
        grid = self.program.grid
        if not 0 <= rank < grid.world:
            raise IndexError(f"rank {rank} is outside the world of {grid.world} ranks")
        s = self._stored(name)
        p, d, tp = grid.coords(rank)
        if s.pstage is not None and s.pstage != p:
            raise KeyError(
                f"'{name}' lives on pipeline stage {s.pstage}; rank {rank} is on stage {p}"
            )
        return s.arrays[d * grid.tp + tp]

    def type_of(self, name: str) -> TensorType:
        return self._stored(name).ty

    @property
    def outputs(self) -> dict[str, Array]:
        """Global values of the program's outputs."""
        return {n: self.global_value(n) for n in self.program.outputs}

    @property
    def updated_inputs(self) -> dict[str, Array]:
        """Global values of the updated inputs after the program."""
        return {n: self.global_value(n) for n in self.program.updates()}


# ---------------------------------------------------------------------- memory


def _stored_bytes(ty: TensorType, group: int) -> int:
    isz = ops.storage_dtype(ty.dtype).itemsize
    if ty.layout.is_local:
        return group * ty.numel * isz
    return ty.numel * isz


_GEN_CHUNK = 1 << 22
"""Elements the generator handles per numpy pass (numerics bounds its temporaries so)."""


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def _input_temp_bytes(ty: TensorType, group: int) -> int:
    """Generating one input: about 56 bytes of uint64/float64 temporaries per element,
    per pass of at most `_GEN_CHUNK` elements."""
    n = ty.numel if ty.layout.is_replicated else _numel(rank_shape(ty, group))
    return 56 * min(n, _GEN_CHUNK)


def _stage_temp_bytes(s: Stage, group: int) -> int:
    """Working memory while evaluating one stage: compute-type temporaries of the largest
    per-rank array involved, the generator's for dropout, the combine buffers of a
    collective, the f32 copies and product of a matmul."""
    ty = s.ty
    ct = max(nx.dtype_info(ty.dtype).compute.itemsize, 4)
    biggest = _numel(rank_shape(ty, group))
    dropout = False
    for e in s.expr.walk():
        if e.ty is not None:
            biggest = max(biggest, _numel(rank_shape(e.ty, group)))
        dropout |= e.op is Op.DROPOUT
    temp = 6 * biggest * ct
    if dropout:
        temp += 56 * min(biggest, _GEN_CHUNK)
    if s.expr.op in COLLECTIVES:
        temp += 2 * ty.numel * ct
    if s.expr.op is Op.MATMUL:
        a, b = s.expr.args
        temp += ct * (_numel(rank_shape(a.type, group)) + _numel(rank_shape(b.type, group)))
    return temp


def estimate_bytes(program: Program) -> int:
    """Peak memory of `run_reference(program)` (keeping every value): every stored value
    (replicated once per pipeline stage, local ×G, sliced ×1) plus the largest temporaries
    of one input's generation or one stage's evaluation."""
    g = program.grid.group
    total = sum(_stored_bytes(i.ty, g) for i in program.inputs)
    total += sum(_stored_bytes(s.ty, g) for s in program.stages)
    total *= program.grid.dp  # each dp replica's (an upper bound: dp-sliced are smaller)
    temp = max(
        [_input_temp_bytes(i.ty, g) for i in program.inputs]
        + [_stage_temp_bytes(s, g) for s in program.stages]
        + [0]
    )
    return total + temp


def estimate_work(program: Program) -> int:
    """The work of `run_reference(program)` over all its simulated ranks, in units of a
    GEMM operation: 2·M·N·K per matmul, `ELEMENT_WORK` per element of every other
    expression node (each dp replica counted: an upper bound)."""
    g = program.grid.group
    total = 0
    for s in program.stages:
        for e in s.expr.walk():
            if e.ty is None:
                continue
            n = _numel(rank_shape(e.ty, g))
            if e.op is Op.MATMUL:
                a = rank_shape(e.args[0].type, g)
                total += n * 2 * (a[-1] if a else 1)
            else:
                total += n * ELEMENT_WORK
    return total * g * program.grid.dp


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def check_limits(
    program: Program,
    max_mem: int | None = None,
    *,
    need: int | None = None,
    what: str = "",
    max_work: int | None = None,
    work: int | None = None,
) -> int:
    """Raise UsageError (exit 2) when the reference would need more than `max_mem` bytes
    (default `DEFAULT_MAX_MEM`) or more than `max_work` operations (default
    `DEFAULT_MAX_WORK`, `estimate_work`'s units); return the memory estimate (`need` and
    `work` override the estimates)."""
    limit = DEFAULT_MAX_MEM if max_mem is None else max_mem
    if need is None:
        need = estimate_bytes(program)
    what = what or f"evaluating '{program.name}'"
    dims = ", ".join(f"{d.name}={d.value}" for d in program.dims)
    example = (
        f"-D {program.dims[0].name}={max(1, program.dims[0].value // 4)}"
        if program.dims
        else "-D NAME=VALUE"
    )
    sizes = f"({program.grid.world} simulated ranks, {dims or 'no dims'})"
    if need > limit:
        raise UsageError(
            f"{what} in the reference needs about {_fmt_bytes(need)} {sizes}, more than "
            f"the limit of {_fmt_bytes(limit)}",
            hint=f"use smaller sizes ({example}) or fewer ranks (--ranks), or raise --max-mem",
        )
    work_limit = DEFAULT_MAX_WORK if max_work is None else max_work
    if work is None:
        work = estimate_work(program)
    if work > work_limit:
        raise UsageError(
            f"{what} in the reference is about {_fmt_count(work)} operations of work "
            f"{sizes}, more than the limit of {_fmt_count(work_limit)}"
            + (" (the default: seconds of CPU)" if max_work is None else ""),
            hint=f"use smaller sizes ({example}) or fewer ranks (--ranks), or raise --max-work",
        )
    return need


def _fmt_count(n: int) -> str:
    """1.2e13 as '12 T'; below 1,000 the number itself."""
    for unit, scale in (("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)


# ---------------------------------------------------------------------- inputs


def _generate(name: str, ty: TensorType, group: int, seed: int) -> list[Array]:
    dt = ty.dtype.value
    lay = ty.layout
    shape = rank_shape(ty, group)
    if lay.is_replicated:
        a = nx.generate_input(name, dt, ty.numel, seed).reshape(shape)
        a.flags.writeable = False
        return [a] * group
    if lay.is_local:
        n = ty.numel
        return [
            nx.generate_input(name, dt, group * n, seed, r * n, n).reshape(shape)
            for r in range(group)
        ]
    if is_contiguous_chunk(ty, group):
        out = []
        for r in range(group):
            lo, hi = chunk_range(ty, group, r)
            out.append(nx.generate_input(name, dt, ty.numel, seed, lo, hi - lo).reshape(shape))
        return out
    return [
        nx.generate_input_at(name, dt, seed, global_flat_index(ty, group, r)) for r in range(group)
    ]


def _given(name: str, value: Any, ty: TensorType, group: int) -> list[Array]:
    a = np.asarray(value)
    want = global_shape(ty, group)
    storage = ops.storage_dtype(ty.dtype)
    decl = f"{ty.dtype.value}{format_shape(ty.shape)} {ty.layout}"
    if a.dtype != storage:
        raise InputError(
            f"input '{name}' is declared {decl} (numpy {storage}), but the given array "
            f"has dtype {a.dtype}",
            hint=f"convert it first, e.g. x.astype(np.{storage})"
            + (" (bf16 values are stored as float32)" if ty.dtype.value == "bf16" else ""),
        )
    if a.shape != want:
        what = (
            "[G, *shape] (local inputs hold one row per rank)"
            if ty.layout.is_local
            else "its global shape"
        )
        raise InputError(
            f"input '{name}' is declared {decl}: expected an array of shape {list(want)} "
            f"({what}), got {list(a.shape)}",
        )
    if ty.dtype.value == "bf16":
        a = nx.round_bf16(a)
    if ty.layout.is_replicated:
        r0 = np.array(a)
        r0.flags.writeable = False
        return [r0] * group
    shape = rank_shape(ty, group)
    return [np.array(take_rank_part(a, ty, group, r)).reshape(shape) for r in range(group)]


def _grid_input(
    name: str,
    ty: TensorType,
    program: Program,
    seed: int,
    given: Mapping[str, Any],
    pre: Stored | None,
) -> list[Array]:
    """An input's D·T arrays on a grid with a dp axis (docs/language.md, rank grids)."""
    g, dp = program.grid.group, program.grid.dp
    if name in given:
        a = np.asarray(given[name])
        want = grid_global_shape(ty, g, dp)
        if a.shape != want:
            raise InputError(
                f"input '{name}' is declared {ty}: expected an array of shape {list(want)} "
                + (
                    "([D, …]: local over dp holds one value per dp replica) "
                    if ty.dp.is_local
                    else ""
                )
                + f"got {list(a.shape)}",
            )
        if ty.dp.is_replicated:
            return _given(name, a, ty, g) * dp
        storage = ops.storage_dtype(ty.dtype)
        if a.dtype != storage:
            raise InputError(
                f"input '{name}' is declared {ty} (numpy {storage}), but the given array "
                f"has dtype {a.dtype}",
                hint=f"convert it first, e.g. x.astype(np.{storage})",
            )
        if ty.dtype.value == "bf16":
            a = nx.round_bf16(a)
        return split_grid(a, ty, g, dp)
    if pre is not None and pre.ty == ty:
        return pre.arrays
    if pre is not None and _same_global(pre.ty, ty) and pre.ty.dp.is_local == ty.dp.is_local:
        return split_grid(join_grid(pre.arrays, pre.ty, g, dp), ty, g, dp)
    if ty.dp.is_local:
        shape = grid_global_shape(ty, g, dp)
        value = nx.generate_input(name, ty.dtype.value, _numel(shape), seed).reshape(shape)
        return split_grid(value, ty, g, dp)
    tp_parts = _generate(name, ty, g, seed)
    if ty.dp.is_replicated:
        return tp_parts * dp
    return split_grid(join_global(tp_parts, ty, g), ty, g, dp)


def _same_global(a: TensorType, b: TensorType) -> bool:
    """Whether values of the two types have the same global form (only the slicing or
    replication differs)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.pstage == b.pstage
        and a.layout.is_local == b.layout.is_local
    )


# ---------------------------------------------------------------------- the run


class _Ctx:
    """RankContext of one rank of one pipeline stage during one stage's evaluation."""

    def __init__(self, run: _Runner, pstage: int | None, rank: int) -> None:
        self.run = run
        self.pstage = pstage
        self._rank = rank
        """The rank's index in its pipeline stage: dp·T + tp (dp = 0 without a dp axis)."""

    @property
    def rank(self) -> int:
        return self._rank % self.run.group  # the tp rank: ops slice and combine over tp

    @property
    def group(self) -> int:
        return self.run.group

    @property
    def dp(self) -> int:
        """Ranks of the dp axis (1 without one)."""
        return self.run.dp

    @property
    def dp_rank(self) -> int:
        return self._rank // self.run.group

    @property
    def seed(self) -> int:
        return self.run.seed

    def lookup(self, name: str) -> Array:
        s = self.run.values[name]
        return s.arrays[self._rank]

    def combine(self, e: Expr, partial: Array) -> Array:
        return self.run.combined[e][self._rank // self.run.group]


class _Runner:
    def __init__(self, program: Program, seed: int) -> None:
        self.program = program
        self.seed = seed
        self.group = program.grid.group
        self.dp = program.grid.dp
        self.world = self.group * self.dp
        """Ranks of a pipeline stage: D·T, index dp·T + tp (docs/language.md, rank grids)."""
        self.values: dict[str, Stored] = {}
        self.combined: dict[Expr, list[Array]] = {}
        """Each implicit reduction's combined value, by dp replica."""

    def _arrays(self, e: Expr, ty: TensorType) -> list[Array]:
        """Every rank's value of `e`: computed once per dp replica when replicated over
        tp (shared by its T ranks), once for all when replicated over dp too."""
        g = self.group
        if ty.layout.is_replicated:
            if ty.dp.is_replicated:
                v = ops.stage_value(e, _Ctx(self, ty.pstage, 0))
                v.flags.writeable = False
                return [v] * self.world
            out: list[Array] = []
            for d in range(self.dp):
                v = ops.stage_value(e, _Ctx(self, ty.pstage, d * g))
                v.flags.writeable = False
                out += [v] * g
            return out
        return [ops.stage_value(e, _Ctx(self, ty.pstage, r)) for r in range(self.world)]

    def run_stage(self, s: Stage) -> None:
        e = s.expr
        ty = s.ty
        if e.op in COLLECTIVES:
            self.values[s.name] = Stored(ty, self._collective(e))
            return
        self._precombine(e)
        self.values[s.name] = Stored(ty, self._arrays(e, ty))

    def _precombine(self, e: Expr) -> None:
        """Implicit reductions of sliced values in `e`, innermost first: every rank's
        partial, combined in rank order (the cross-rank step `_Ctx.combine` returns)."""
        self.combined = {}
        for red in ops.implicit_reductions(e):
            if red in self.combined:
                continue
            x = red.args[0]
            acc = ops.accumulation_dtype(x.type.dtype)
            g = self.group
            self.combined[red] = [
                ops.combine_ranks(
                    [
                        ops.reduction_partial_of(red, _Ctx(self, x.type.pstage, d * g + t))
                        for t in range(g)
                    ],
                    ops.partial_rop(red.op),
                    acc,
                )
                for d in range(self.dp)
            ]

    def _operand(self, x: Expr) -> list[Array]:
        if x.op is Op.REF:
            assert x.name is not None
            return list(self.values[x.name].arrays)
        self._precombine(x)
        return self._arrays(x, x.type)

    def _collective(self, e: Expr) -> list[Array]:
        (x,) = e.args
        arrays = self._operand(x)
        semantics = ops.COLLECTIVE_SEMANTICS[e.op]
        g, dp = self.group, self.dp
        if dp == 1:
            return semantics(arrays, e)
        out: list[Array] = [np.empty(0)] * self.world
        if e.tag == "dp":
            # over dp: the D ranks with the same tp index, on their tp parts (dp views)
            xv = Expr(Op.REF, name=x.name, ty=dp_view(x.type, g))
            ev = Expr(e.op, (xv,), rop=e.rop, value=e.value, ty=dp_view(e.type, g))
            for t in range(g):
                for d, a in enumerate(semantics(arrays[t::g], ev)):
                    out[d * g + t] = a
            return out
        for d in range(dp):  # over tp, within each dp replica
            out[d * g : (d + 1) * g] = semantics(arrays[d * g : (d + 1) * g], e)
        return out


def run_reference(
    program: Program,
    seed: int = 0,
    inputs: Mapping[str, npt.ArrayLike] | None = None,
    *,
    params: Mapping[str, float | int] | None = None,
    max_mem: int | None = None,
    max_work: int | None = None,
    keep: Iterable[str] | None = None,
    preloaded: Mapping[str, Stored] | None = None,
) -> RunResult:
    """Run `program` on its G·P simulated ranks.

    `inputs` maps input names to global values (shape ``[G, *shape]`` for local inputs,
    numpy dtype of the declared type: float16 for f16, float32 for bf16); inputs not
    given come from the shared generator with `seed`. `params` overrides param defaults.
    Raises InputError for a bad input and UsageError when the estimated memory exceeds
    `max_mem` (default 4 GiB) or the estimated work `max_work` (`DEFAULT_MAX_WORK`).

    By default every value stays available afterwards. With `keep` (names), only those,
    the outputs and the updated inputs are kept, and other values are freed after their
    last use. `preloaded` supplies the inputs of an earlier run (`RunResult.initial`), so
    that `verify` generates them once; an input stored with another slicing is re-split
    from its global value.
    """
    check_limits(program, max_mem, max_work=max_work)
    g = program.grid.group
    given = dict(inputs or {})
    known = {i.name for i in program.inputs}
    for name in given:
        if name not in known:
            hint = did_you_mean(name, known)
            raise InputError(
                f"'{program.name}' has no input named '{name}' (inputs: "
                f"{', '.join(sorted(known)) or 'none'})",
                hint=hint,
            )
    run = _Runner(program, seed)
    for p in program.params:
        value = p.default
        if params and p.name in params:
            value = params[p.name]
        a = ops.round_to(np.asarray(value), p.dtype)
        a.flags.writeable = False
        run.values[p.name] = Stored(TensorType(p.dtype, (), REPLICATED, None), [a] * run.world)
    if params:
        for name in params:
            if not any(q.name == name for q in program.params):
                raise InputError(
                    f"'{program.name}' has no param named '{name}'",
                    hint=did_you_mean(name, [q.name for q in program.params]),
                )
    for i in program.inputs:
        pre = preloaded.get(i.name) if preloaded else None
        if program.grid.has_dp:
            run.values[i.name] = Stored(i.ty, _grid_input(i.name, i.ty, program, seed, given, pre))
            continue
        if i.name in given:
            arrays = _given(i.name, given[i.name], i.ty, g)
        elif pre is not None and pre.ty == i.ty:
            arrays = pre.arrays
        elif pre is not None and _same_global(pre.ty, i.ty):
            arrays = _given(i.name, join_global(pre.arrays, pre.ty, g), i.ty, g)
        else:
            arrays = _generate(i.name, i.ty, g, seed)
        run.values[i.name] = Stored(i.ty, arrays)
    initial = {i.name: run.values[i.name] for i in program.inputs}
    last_use = _last_uses(program) if keep is not None else {}
    kept = set(keep or ()) | set(program.outputs) | set(program.updates().values())
    for k, s in enumerate(program.stages):
        run.run_stage(s)
        for name in [n for n, last in last_use.items() if last == k and n not in kept]:
            run.values.pop(name, None)
    return RunResult(program, seed, run.values, initial)


def _last_uses(program: Program) -> dict[str, int]:
    """Name → index of the last stage that reads it (stages nobody reads: their own)."""
    last: dict[str, int] = {}
    for k, s in enumerate(program.stages):
        last.setdefault(s.name, k)
        for n in s.expr.refs():
            last[n] = k
    return last
