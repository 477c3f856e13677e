"""Lowering: syntax → typed, immutable `Program` (docs/language.md).

Name resolution, `-D` overrides, `--ranks` overrides, operator resolution and argument
checks, dropout ids, groups from printed `fused { }` / `overlapped { }` blocks, then
type/layout inference. Name errors are collected and reported together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import heapq
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cocoviz.errors import (
    DiagnosticBag,
    InputError,
    Span,
    UsageError,
    did_you_mean,
    shown_value,
)
from cocoviz.ir import axes, routing
from cocoviz.ir import syntax_tree as syn
from cocoviz.ir.collectives import collective
from cocoviz.ir.infer import Inferencer, check_divisible, check_updates, program_env
from cocoviz.ir.nodes import (
    BINARY_CALLS,
    CALL_NAMES,
    COLLECTIVES,
    CONSTANTS,
    PERMUTES,
    REDUCTIONS,
    ROUTING,
    ROWWISE,
    UNARY_CALLS,
    WHOLE_RHS,
    DimDecl,
    Expr,
    Grid,
    Group,
    GroupKind,
    Input,
    Op,
    Param,
    Program,
    ReduceOp,
    ScheduleBlock,
    Stage,
)
from cocoviz.ir.syntax import parse_module
from cocoviz.ir.types import (
    DTYPE_NAMES,
    LOCAL,
    REPLICATED,
    DType,
    Layout,
    Shape,
    Size,
    TensorType,
    numel,
    sliced,
    tp_local_shape,
)

LAYOUT_WORDS = ("replicated", "local", "sliced")
_WHOLE_RHS_OR_UPDATE = WHOLE_RHS | {Op.UPDATE}
REDUCE_WORDS = {
    "+": ReduceOp.SUM,
    "*": ReduceOp.PROD,
    "max": ReduceOp.MAX,
    "min": ReduceOp.MIN,
    "avg": ReduceOp.AVG,
}


# Sizes and integers are 64-bit in emitted code; keep every product of sizes in range.
_MAX_SIZE = 2**62
MAX_RANKS = 1 << 20
"""Ranks of a program (T×P for a grid): the reference and the simulator model every
rank, and a million ranks is beyond any machine cocoviz targets."""

_INT_ARG = re.compile(r"-?[0-9]+")  # ASCII digits only: `int()` also takes '٣' and '²'


def _int_arg(text: str) -> int | None:
    """A command-line integer: ASCII digits (an optional '-'), not absurdly long."""
    if not _INT_ARG.fullmatch(text) or len(text) > syn.MAX_NUMBER_DIGITS:
        return None
    return int(text)


@dataclass(frozen=True)
class RanksOverride:
    """`--ranks N` or `--ranks dp=D,tp=T,pp=P` (any subset of the named axes)."""

    n: int | None = None
    tp: int | None = None
    pp: int | None = None
    axes: tuple[tuple[str, int], ...] = ()
    """The named axes as given (`tp`/`pp` repeat two of them)."""

    @staticmethod
    def parse(text: str) -> RanksOverride:
        text = text.strip()
        n = _int_arg(text)
        if n is not None:
            return RanksOverride(n=n)
        items = [p.split("=", 1) for p in text.replace(" ", "").split(",")]
        names = [i[0] for i in items]
        if (
            items
            and all(len(i) == 2 for i in items)
            and set(names) <= set(GRID_AXES)
            and len(set(names)) == len(names) >= 2
        ):
            values = [_int_arg(i[1]) for i in items]
            if all(v is not None for v in values):
                axes = tuple((nm, int(v)) for nm, v in zip(names, values, strict=True))  # type: ignore[arg-type]
                d = dict(axes)
                return RanksOverride(tp=d.get("tp"), pp=d.get("pp"), axes=axes)
        raise UsageError(
            f"--ranks expects N or tp=T,pp=P, got '{shown_value(text)}'",
            hint="for example --ranks 8, --ranks tp=4,pp=2 or --ranks dp=2,tp=4: a whole "
            "grid of two or more of the axes dp, tp, pp (digits 0-9)",
        )


def parse_defines(items: list[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items or []:
        name, eq, val = item.partition("=")
        name, val = name.strip(), val.strip()
        v = _int_arg(val)
        if not eq or not name.isidentifier() or v is None:
            hint = "for example -D H=1024 (a name, '=', and digits 0-9)"
            if eq and name.isidentifier() and _INT_ARG.fullmatch(val):
                hint = f"the value has {len(val.lstrip('-')):,} digits; sizes are at most 2^62"
            raise UsageError(f"-D expects NAME=INTEGER, got '{shown_value(item)}'", hint=hint)
        if v <= 0:
            raise UsageError(f"-D {name}: sizes must be positive, got {v}")
        if v > _MAX_SIZE:
            raise UsageError(f"-D {name}: {v} is too large (sizes are at most 2^62)")
        out[name] = v
    return out


class _AlreadyReported(Exception):
    """A declaration depends on one whose error is already reported."""


def _int(num: syn.Num, what: str, positive: bool = True) -> int:
    if not num.is_int:
        raise InputError(f"{what} must be an integer, got '{num.text}'", num.span)
    v = int(num.text)
    if positive and v <= 0:
        raise InputError(f"{what} must be positive, got {v}", num.span)
    if v > _MAX_SIZE:
        raise InputError(f"{what} is too large: {v} (at most 2^62)", num.span)
    return v


def _check_number(e: Expr) -> Expr:
    """A literal must be finite and, if an integer, fit in 64 bits."""
    v = e.value
    if isinstance(v, float) and not math.isfinite(v):
        raise InputError("number out of range: it overflows a 64-bit float", e.span)
    if isinstance(v, int) and not -(2**63) <= v < 2**63:
        raise InputError("integer out of range: it does not fit in 64 bits", e.span)
    return e


def _source_words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) if len(text) < 100_000 else set()


def _default_program_name(path: str) -> str:
    """The file stem, made an identifier so that the printed `program NAME` parses."""
    if path in ("<input>", ""):
        return "program"
    stem = re.sub(r"[^A-Za-z0-9_]", "_", Path(path).stem) or "program"
    return "_" + stem if stem[0].isdigit() else stem


@dataclass
class _Declared:
    """What a module's statements declare, before any stage is resolved or typed."""

    name: str
    grid: Grid | None = None
    grid_span: Span | None = None
    dim_values: dict[str, tuple[int, Span]] = field(default_factory=dict)
    params: list[Param] = field(default_factory=list)
    param_names: list[str] = field(default_factory=list)
    """Every declared param name, those whose declaration failed included."""
    input_stmts: list[syn.InputStmt] = field(default_factory=list)
    assigns: list[syn.Assign] = field(default_factory=list)
    """Every stage, those inside printed groups included, in source order."""
    groups_syntax: list[syn.FusedStmt | syn.OverlappedStmt] = field(default_factory=list)
    outputs: list[syn.Name] = field(default_factory=list)
    schedules: list[ScheduleBlock] = field(default_factory=list)


class _Lowerer:
    def __init__(
        self,
        module: syn.Module,
        defines: Mapping[str, int],
        ranks: RanksOverride | None,
    ) -> None:
        self.module = module
        self.defines = dict(defines)
        self.ranks = ranks
        self.bag = DiagnosticBag()
        self.bound: dict[str, Span | None] = {}
        self.assign: syn.Assign | None = None  # the stage being resolved
        self.bad_dims: set[str] = set()  # dimensions whose declaration failed
        self.dropouts = 0  # the dropout calls of the stage being resolved, so far
        self.dim_sizes: dict[str, Size] = {}  # the Size of each dimension name (as _size makes it)
        self.shapes: dict[Shape, Shape] = {}  # the inputs' shapes, one object per value
        self.input_types: dict[tuple[Any, ...], TensorType] = {}
        """The type of each distinct declaration (`_declared_type`) checked so far."""

    @functools.cached_property
    def source_names(self) -> set[str]:
        """The words of the source (only a hint needs them: found when first asked)."""
        return _source_words(self.module.source.text)

    # --- declarations -----------------------------------------------------------------
    def _bind(self, name: syn.Name) -> None:
        if name.text in self.bound:
            raise InputError(
                f"'{name.text}' is already defined",
                name.span,
                notes=[("first defined here", self.bound[name.text])],
                hint="each name is assigned once; pick a new name",
            )
        self.bound[name.text] = name.span

    def lower(self) -> Program:
        decl = self._declarations()
        dims = self._dims(decl.dim_values)
        self.dims = {d.name: d.value for d in dims}
        self.grid = self._apply_ranks_override(decl.grid, decl.grid_span)
        typed_inputs = self._inputs(decl.input_stmts)
        groups = self._groups(decl.groups_syntax)
        raw, defined, later = self._resolve_stages(decl)
        out_names = self._outputs(decl.outputs, {a.name.text for a, _ in raw}, defined, later)
        self.bag.raise_if_any()
        prog = Program(
            name=decl.name,
            grid=self.grid,
            dims=tuple(dims),
            params=tuple(decl.params),
            inputs=tuple(typed_inputs),
            stages=(),
            outputs=(),
            schedules=tuple(decl.schedules),
            source=self.module.source,
        )
        prog = dataclasses.replace(
            prog,
            stages=self._typed_stages(prog, raw),
            outputs=tuple(out_names),
            groups=tuple(groups),
            source_names=frozenset(self.bound),
        )
        check_updates(prog)
        if prog.grid.has_dp:
            axes.check_updates(prog)
        prog = _order_reads_before_updates(prog)
        if prog.groups:
            _check_groups(prog, decl.groups_syntax)
        return prog

    def _declarations(self) -> _Declared:
        """One pass over the statements: what each declares, in source order (binding
        errors of dimensions, params and inputs are collected)."""
        decl = _Declared(_default_program_name(self.module.source.path))
        name_set = False
        bag = self.bag
        for st in self.module.statements:
            if isinstance(st, syn.ProgramStmt):
                if name_set:
                    bag.add(InputError("a second 'program' statement", st.span))
                decl.name, name_set = st.name.text, True
            elif isinstance(st, syn.RanksStmt):
                if decl.grid is not None:
                    raise InputError(
                        "a second 'ranks' statement",
                        st.span,
                        notes=[("first here", decl.grid_span)],
                    )
                decl.grid, decl.grid_span = self._grid(st), st.span
            elif isinstance(st, syn.DimStmt):
                for dn, dv in st.items:
                    try:
                        self._bind(dn)
                        decl.dim_values[dn.text] = (_int(dv, f"dimension '{dn.text}'"), dn.span)
                    except InputError as err:
                        self.bad_dims.add(dn.text)
                        bag.add(err)
            elif isinstance(st, syn.ParamStmt):
                for pn, pt, pv, neg in st.items:
                    decl.param_names.append(pn.text)
                    try:
                        self._bind(pn)
                        decl.params.append(self._param(pn, pt, pv, neg))
                    except InputError as err:
                        bag.add(err)
            elif isinstance(st, syn.InputStmt):
                try:
                    self._bind(st.name)
                    decl.input_stmts.append(st)
                except InputError as err:
                    bag.add(err)
            elif isinstance(st, syn.Assign):
                decl.assigns.append(st)
            elif isinstance(st, syn.FusedStmt):
                decl.groups_syntax.append(st)
                decl.assigns.extend(st.items)
            elif isinstance(st, syn.OverlappedStmt):
                decl.groups_syntax.append(st)
                for it in st.items:
                    if isinstance(it, syn.FusedStmt):
                        decl.assigns.extend(it.items)
                    else:
                        decl.assigns.append(it)
            elif isinstance(st, syn.OutputStmt):
                decl.outputs.extend(st.names)
            elif isinstance(st, syn.ScheduleStmt):
                if any(s.name == st.name.text for s in decl.schedules):
                    bag.add(InputError(f"schedule '{st.name.text}' is defined twice", st.name.span))
                decl.schedules.append(ScheduleBlock(st.name.text, st.steps, st.span))
        return decl

    def _dims(self, dim_values: dict[str, tuple[int, Span]]) -> list[DimDecl]:
        """The declared dimensions with `-D` overrides applied (a `-D` naming no dimension
        is a usage error)."""
        for d in self.defines:
            if d not in dim_values:
                raise UsageError(
                    f"-D {d}: the program has no dimension named '{d}'",
                    hint=did_you_mean(d, dim_values)
                    or (
                        "its dimensions are " + ", ".join(dim_values)
                        if dim_values
                        else "it declares no dimensions"
                    ),
                )
        return [DimDecl(n, self.defines.get(n, v), span) for n, (v, span) in dim_values.items()]

    def _inputs(self, input_stmts: list[syn.InputStmt]) -> list[Input]:
        """The typed inputs; errors are collected (a size naming a failed dimension is
        already reported)."""
        typed_inputs: list[Input] = []
        for ist in input_stmts:
            try:
                typed_inputs.append(self._input(ist))
            except _AlreadyReported:
                pass
            except InputError as err:
                self.bag.add(err)
        return typed_inputs

    def _groups(self, groups_syntax: list[syn.FusedStmt | syn.OverlappedStmt]) -> list[Group]:
        """The printed `fused { }` / `overlapped { }` blocks as groups; errors are collected."""
        groups: list[Group] = []
        for g in groups_syntax:
            try:
                groups.append(_group(g))
            except InputError as err:
                self.bag.add(err)
        return groups

    def _resolve_stages(
        self, decl: _Declared
    ) -> tuple[list[tuple[syn.Assign, Expr]], set[str], dict[str, syn.Assign]]:
        """Every stage's expression with its names resolved and its dropouts tagged, the
        names defined by the end, and the stages by name.

        Every stage is resolved before any is typed, so that all name errors (in
        declarations too) are reported together. A declaration that failed still binds
        its name, so that it causes no second error where it is used.
        """
        defined = set(decl.param_names) | {i.name.text for i in decl.input_stmts}
        later = {a.name.text: a for a in decl.assigns}
        raw: list[tuple[syn.Assign, Expr]] = []
        for a in decl.assigns:
            try:
                self._bind(a.name)
            except InputError as err:
                self.bag.add(err)
                continue
            self.assign = a
            self.dropouts = 0
            try:
                raw.append((a, self._expr(a.expr, defined, later, a.name.text, top=True)))
            except _AlreadyReported:
                pass  # a reshape size naming a failed dimension
            except InputError as err:
                self.bag.add(err)
            defined.add(a.name.text)
        return raw, defined, later

    def _outputs(
        self,
        outputs: list[syn.Name],
        stage_names: set[str],
        defined: set[str],
        later: dict[str, syn.Assign],
    ) -> list[str]:
        """The `output` names that are stages; the others are collected as errors (one
        whose stage failed is already reported)."""
        bag = self.bag
        out_names: list[str] = []
        for o in outputs:
            if o.text in out_names:
                bag.add(InputError(f"output '{o.text}' is listed twice", o.span))
            elif o.text in stage_names:
                out_names.append(o.text)
            elif o.text in later:
                pass  # its stage failed; that error is reported
            elif o.text in defined or o.text in self.dims:
                bag.add(
                    InputError(
                        f"output '{o.text}' is not a stage",
                        o.span,
                        hint="outputs name stages; to output an input unchanged, name a copy "
                        f"of it: {o.text}_out = {o.text} * 1"
                        if o.text in defined
                        else "outputs name stages",
                    )
                )
            else:
                bag.add(
                    InputError(
                        f"unknown output '{o.text}'",
                        o.span,
                        hint=did_you_mean(o.text, stage_names),
                    )
                )
        return out_names

    def _typed_stages(self, prog: Program, raw: list[tuple[syn.Assign, Expr]]) -> tuple[Stage, ...]:
        """Type and layout inference of the resolved stages, in source order, over the
        declarations of `prog`."""
        env = program_env(prog)
        inf = Inferencer(prog.grid, env, {i.name for i in prog.inputs}, memoize=True)
        stages: list[Stage] = []
        for a, expr in raw:
            typed = inf.infer(expr)
            env[a.name.text] = typed.type
            stages.append(Stage(a.name.text, typed, a.span))
        return tuple(stages)

    def _grid(self, st: syn.RanksStmt) -> Grid:
        if st.n is not None:
            return _checked_grid(Grid(_int(st.n, "the rank count")), st.span)
        assert st.grid is not None
        vals: dict[str, int] = {}
        for name, num in st.grid:
            if name.text not in GRID_AXES:
                raise InputError(
                    f"unknown axis '{name.text}' in the ranks grid",
                    name.span,
                    hint=did_you_mean(name.text, GRID_AXES)
                    or "axes: dp (data), tp (tensor), pp (pipeline); e.g. ranks dp=2, tp=4",
                )
            if name.text in vals:
                raise InputError(
                    f"axis '{name.text}' is given twice in the ranks grid",
                    name.span,
                    hint="each axis appears at most once: ranks dp=D, tp=T, pp=P",
                )
            vals[name.text] = _int(num, name.text)
        return _checked_grid(_make_grid(tuple(vals.items())), st.span)

    def _apply_ranks_override(self, grid: Grid | None, span: Span | None) -> Grid:
        r = self.ranks
        if r is None:
            if grid is None:
                stmts = self.module.statements
                first = next((st for st in stmts if isinstance(st, syn.ProgramStmt)), None)
                if first is None and stmts:
                    first = stmts[0]
                raise InputError(
                    "the program does not say how many ranks it runs on",
                    getattr(first, "span", None) or Span(self.module.source, 1, 1, 1, 2),
                    hint="add `ranks N` (or `ranks tp=T, pp=P`) after `program`, or pass --ranks",
                )
            return grid
        named = r.axes or tuple(
            (a, v) for a, v in (("tp", r.tp), ("pp", r.pp)) if v is not None
        )
        if named:
            for name, v in named:
                if v <= 0:
                    raise UsageError(
                        "--ranks: tp and pp must be positive"
                        if {a for a, _ in named} == {"tp", "pp"}
                        else f"--ranks: {name} must be positive"
                    )
            # the named axes are the whole grid (an axis left out has size 1)
            return _checked_grid(_make_grid(named), None)
        assert r.n is not None
        if r.n <= 0:
            raise UsageError("--ranks must be positive")
        if grid is not None and grid.is_grid:
            # every axis but tp keeps its size: T = N / (D·P)
            rest = grid.world // grid.tp
            if r.n % rest and not grid.has_dp:
                raise UsageError(
                    f"--ranks {r.n}: the program has pp={grid.pp} pipeline stages, which do "
                    f"not divide {r.n}",
                    hint=f"use a multiple of {grid.pp}, or --ranks tp=T,pp=P",
                )
            if r.n % rest:
                others = " × ".join(f"{a}={grid.size(a)}" for a in grid.axes if a != "tp")
                raise UsageError(
                    f"--ranks {r.n}: the program's other axes ({others}) hold {rest} ranks "
                    f"per tp index, which does not divide {r.n}",
                    hint=f"use a multiple of {rest}, or name the axes: --ranks "
                    + ",".join(f"{a}={grid.size(a)}" for a in grid.axes),
                )
            axes = tuple((a, r.n // rest if a == "tp" else grid.size(a)) for a in grid.axes)
            if "tp" not in grid.axes:
                axes = (*axes, ("tp", r.n // rest))
            return _checked_grid(_make_grid(axes), None)
        return _checked_grid(Grid(r.n), None)

    def _param(self, pn: syn.Name, pt: syn.Name, pv: syn.Num, neg: bool) -> Param:
        dt = DType.parse(pt.text)
        if dt is None:
            raise InputError(
                f"unknown dtype '{pt.text}'",
                pt.span,
                hint=did_you_mean(pt.text, DTYPE_NAMES) or "dtypes: " + " ".join(DTYPE_NAMES),
            )
        v: float | int = pv.value
        if isinstance(v, float) and not math.isfinite(v):
            raise InputError(f"param '{pn.text}': default out of range", pv.span)
        if neg:
            v = -v
        if not dt.is_float:
            if not pv.is_int:
                raise InputError(
                    f"param '{pn.text}' is {dt.value} but its default is not an integer", pv.span
                )
            bits = 8 * dt.itemsize
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            if not lo <= v <= hi:
                raise InputError(
                    f"param '{pn.text}': default {v} is out of range for {dt.value} ([{lo}, {hi}])",
                    pv.span,
                )
        else:
            try:
                v = float(v)
            except OverflowError:
                v = math.inf
            top = _FLOAT_MAX.get(dt.value, math.inf)
            if not abs(v) <= top:
                raise InputError(
                    f"param '{pn.text}': default {v:g} is out of range for {dt.value}", pv.span
                )
        return Param(pn.text, dt, v, pn.span)

    def _size(self, se: syn.SizeExpr) -> Size:
        factors = se.factors
        if len(factors) == 1:
            # most sizes are one dimension name: one Size object per name serves all
            # (sizes are values; a large program declares thousands of inputs)
            size = self.dim_sizes.get(factors[0].text)
            if size is not None and isinstance(factors[0], syn.Name):
                return size
            size = self._size_of(se)
            if isinstance(factors[0], syn.Name):
                self.dim_sizes[factors[0].text] = size
            return size
        return self._size_of(se)

    def _size_of(self, se: syn.SizeExpr) -> Size:
        value = 1
        texts: list[str] = []
        for f in se.factors:
            if isinstance(f, syn.Num):
                value *= _int(f, "a size")
                texts.append(f.text)
            else:
                if f.text in self.bad_dims:
                    raise _AlreadyReported()
                if f.text not in self.dims:
                    raise InputError(
                        f"unknown dimension '{f.text}'",
                        f.span,
                        hint=did_you_mean(f.text, self.dims) or "declare it: dim NAME = SIZE",
                    )
                value *= self.dims[f.text]
                texts.append(f.text)
        if value > _MAX_SIZE:
            raise InputError(
                f"size {'*'.join(texts)} = {value} is too large (at most 2^62 elements)",
                se.span,
            )
        return Size("*".join(texts), value)

    def _input(self, st: syn.InputStmt) -> Input:
        # A large program declares thousands of inputs with a handful of distinct types
        # (every layer's weights alike): each distinct declaration is checked and typed
        # once. Only a declaration that passed is kept, and whether one passes does not
        # depend on the input's name, so the others fail with their own messages.
        key = _declared_type(st)
        ty = self.input_types.get(key)
        if ty is None:
            ty = self.input_types[key] = self._input_type(st)
        return Input(st.name.text, ty, st.name.span)

    def _input_type(self, st: syn.InputStmt) -> TensorType:
        dt = DType.parse(st.dtype.text)
        if dt is None:
            raise InputError(
                f"unknown dtype '{st.dtype.text}'",
                st.dtype.span,
                hint=did_you_mean(st.dtype.text, DTYPE_NAMES) or "dtypes: " + " ".join(DTYPE_NAMES),
            )
        shape = tuple([self._size(s) for s in st.sizes])
        # one tuple per distinct shape: inference then finds equal shapes by identity
        shape = self.shapes.setdefault(shape, shape)
        if numel(shape) > _MAX_SIZE:
            raise InputError(
                f"input '{st.name.text}' has {numel(shape)} elements, too many (at most 2^62)",
                st.span,
            )
        if st.layout_over is not None or st.more_layouts:
            return self._grid_input_type(st, dt, shape)
        layout = _input_layout(st, shape)
        check_divisible(
            shape, layout, self.grid.group, st.layout_span or st.span, f"input '{st.name.text}'"
        )
        return TensorType(dt, shape, layout, self._input_stage(st))

    def _grid_input_type(self, st: syn.InputStmt, dt: DType, shape: Shape) -> TensorType:
        """An input with layouts over named axes: `sliced(1) local(over=dp)`; an axis
        without a layout is replicated (docs/language.md, rank grids)."""
        specs = [syn.AxisLayout(st.layout, st.layout_arg, st.layout_over, st.layout_span or st.span)]
        specs += st.more_layouts
        by_axis: dict[str, syn.AxisLayout] = {}
        what = f"input '{st.name.text}'"
        for spec in specs:
            axis = "tp" if spec.over is None else self.axis(spec.over, "a layout")
            if axis in by_axis:
                raise InputError(
                    f"{what} has two layouts over the {axis} axis",
                    spec.span,
                    hint="give each axis at most one layout; an axis without one is replicated",
                )
            by_axis[axis] = spec

        def layout_of(spec: syn.AxisLayout, of: Shape) -> Layout:
            return _input_layout(dataclasses.replace(st, layout=spec.word, layout_arg=spec.arg), of)

        tp_layout = REPLICATED
        if "tp" in by_axis:
            tp_layout = layout_of(by_axis["tp"], shape)
            check_divisible(shape, tp_layout, self.grid.group, by_axis["tp"].span, what)
        dp_layout = REPLICATED
        if "dp" in by_axis:
            # a dp layout describes a tp rank's part (docs/language.md, rank grids)
            view = tp_local_shape(shape, tp_layout, self.grid.group)
            dp_layout = layout_of(by_axis["dp"], view)
            axes.check_divisible_dp(
                TensorType(dt, view, dp_layout), dp_layout, self.grid.dp, by_axis["dp"].span, what
            )
        return TensorType(dt, shape, tp_layout, self._input_stage(st), dp_layout)

    def axis(self, name: syn.Name, what: str) -> str:
        """The grid axis `over=NAME` names (docs/language.md, rank grids)."""
        grid = self.grid
        if not grid.is_grid:
            raise InputError(
                f"over={name.text}: {what} over a named axis needs a rank grid, but this "
                f"program runs on `ranks {grid.world}`",
                name.span,
                hint=f"declare the axes, e.g. ranks dp=2, tp={max(1, grid.world // 2)}",
            )
        if name.text == "pp" and "pp" in grid.axes:
            raise InputError(
                f"over=pp: {what} runs within one pipeline stage; the pp axis is crossed "
                "only by send",
                name.span,
                hint="name the dp or tp axis, or move the value with send(x)",
            )
        if name.text not in grid.axes:
            known = [a for a in grid.axes if a != "pp"]
            raise InputError(
                f"unknown axis '{name.text}': this program's grid has the axes "
                f"{', '.join(grid.axes)}",
                name.span,
                hint=did_you_mean(name.text, known)
                or (f"declare it in the ranks statement: ranks {name.text}=N, …"
                    if name.text in GRID_AXES else "axes: " + ", ".join(known)),
            )
        return name.text

    def _input_stage(self, st: syn.InputStmt) -> int:
        """The pipeline stage of `input ... @stage K` (0 without `@stage`)."""
        if st.stage is None:
            return 0
        assert st.stage_kw is not None
        if st.stage_kw.text != "stage":
            raise InputError(f"expected '@stage K', got '@{st.stage_kw.text}'", st.stage_kw.span)
        if not self.grid.is_grid:
            raise InputError(
                "'@stage' needs a pipeline grid",
                st.stage_kw.span,
                hint="declare ranks tp=T, pp=P",
            )
        pstage = _int(st.stage, "a pipeline stage", positive=False)
        if pstage >= self.grid.pp:
            raise InputError(
                f"pipeline stage {pstage} does not exist (pp = {self.grid.pp})", st.stage.span
            )
        return pstage

    # --- expressions ------------------------------------------------------------------
    def _expr(
        self, node: Any, defined: set[str], later: dict[str, Any], stage: str, top: bool
    ) -> Expr:
        if isinstance(node, Expr):
            if node.op is Op.REF:
                assert node.name is not None
                if node.name not in defined:
                    # name errors are collected, so that all of them are reported at once
                    self.bag.add(self._name_error(node, defined, later, stage))
                return node
            if node.op is Op.CONST:
                return _check_number(node)
            if node.op is Op.NEG and isinstance(node.args[0], Expr) and node.args[0].op is Op.CONST:
                v = node.args[0].value
                assert v is not None
                return _check_number(Expr(Op.CONST, value=-v, span=node.span))
            args = tuple([self._expr(a, defined, later, stage, False) for a in node.args])
            if args == node.args:
                return node
            return Expr(node.op, args, span=node.span)
        if isinstance(node, syn.Call):
            return self._call(node, defined, later, stage, top)
        if isinstance(node, syn.Cmp):
            raise InputError(
                f"a comparison ('{node.op.value}') is only allowed as the first argument of where()",
                node.span,
                hint="for example where(x > 0, x, 0)",
            )
        if isinstance(node, syn.RedTok):
            raise InputError(
                f"'{node.text}' is only allowed as the operator of a collective", node.span
            )
        if isinstance(node, syn.Kw):
            raise InputError(f"unexpected keyword argument '{node.name.text}'", node.span)
        if isinstance(node, syn.TypeArg):
            raise InputError(
                f"a type ('{node.dtype.text}[…]') is only an argument of zeros, ones, full "
                "and iota",
                node.span,
                hint="for example zeros(f32[B, H])",
            )
        raise InputError("unexpected expression", getattr(node, "span", None))

    def _name_error(
        self, node: Expr, defined: set[str], later: dict[str, Any], stage: str
    ) -> InputError:
        name = node.name
        assert name is not None
        if name == stage:
            return InputError(
                f"stage '{stage}' refers to itself",
                node.span,
                hint="each name is assigned once; name the new value differently",
            )
        if name in later:
            return InputError(
                f"'{name}' is used before it is defined",
                node.span,
                notes=[("defined here", later[name].span)],
                hint="stages must be defined before their uses",
            )
        if name in self.dims:
            return InputError(
                f"'{name}' is a dimension, not a value",
                node.span,
                hint="dimensions size tensors; use a param for a runtime scalar",
            )
        if name in CALL_NAMES:
            return InputError(
                f"'{name}' is a function, not a value",
                node.span,
                hint=f"call it: {name}(...)",
            )
        return InputError(
            f"unknown name '{name}'",
            node.span,
            hint=did_you_mean(name, defined),
        )

    def _name_it_first(self, c: syn.Call, stage: str) -> str:
        """The fix for a collective or matmul inside an expression: the two stages to write."""
        a = self.assign
        generic = f"name it first: `t = {c.name.text}(...)`, then use t here"
        src = self.module.source
        if a is None or c.span.line != c.span.end_line or a.span.line != a.span.end_line:
            return generic
        line = src.line(a.span.line)
        call = line[c.span.col - 1 : c.span.end_col - 1]
        fresh = f"{stage}_{c.name.text}"
        k = 2
        while fresh in self.bound or fresh in self.source_names:
            fresh, k = f"{stage}_{c.name.text}_{k}", k + 1
        rhs_start = a.expr.span.col - 1 if getattr(a.expr, "span", None) else None
        if rhs_start is None:
            return generic
        rhs = line[rhs_start : a.span.end_col - 1]
        rest = rhs.replace(call, fresh, 1)
        return (
            "name it first, so that a schedule can refer to it:\n"
            f"    {fresh} = {call}\n"
            f"    {stage} = {rest}"
        )

    def _call(
        self, c: syn.Call, defined: set[str], later: dict[str, Any], stage: str, top: bool
    ) -> Expr:
        fname = c.name.text
        op = CALL_NAMES.get(fname)
        if op is None:
            raise InputError(
                f"unknown function '{fname}'",
                c.name.span,
                hint=did_you_mean(fname, CALL_NAMES),
            )
        if op in _WHOLE_RHS_OR_UPDATE and not top:
            raise InputError(
                f"{fname}(...) must be the whole right-hand side of a named stage",
                c.span,
                hint=self._name_it_first(c, stage),
            )
        a = _CallArgs(c, op, lambda node: self._expr(node, defined, later, stage, False))
        if op in COLLECTIVES:
            return self._collective_call(a)
        if op is Op.MATMUL or op is Op.UPDATE:
            a.arity(2, "a, b" if op is Op.MATMUL else "t, e")
            a.no_kw()
            return Expr(op, (a.sub(a.pos[0]), a.sub(a.pos[1])), span=c.span)
        if op is Op.RESHAPE:
            return self._reshape_call(a)
        if op in PERMUTES:
            return _permute_call(a)
        if op in ROUTING:
            return routing.lower_call(self, a)
        if op in (Op.MEAN, Op.AMIN) or (op in (Op.SUM, Op.AMAX) and "dim" in a.kws):
            return _axis_reduction_call(a)
        if op in CONSTANTS:
            return self._constant_call(a)
        if op is Op.CAST:
            return _cast_call(a)
        if op is Op.DROPOUT:
            # its stable id `<stage>#<k>`: k counts the stage's dropout calls in source
            # order (of their opening `dropout(`), so it is taken before the operand's
            tag = f"{stage}#{self.dropouts}"
            self.dropouts += 1
            return _dropout_call(a, tag)
        if op is Op.SLICE:
            over = self._over_kw(a)
            if over is not None:
                a.kws.pop("over")
            e = _slice_call(a)
            return _replace_expr(e, tag="dp") if over == "dp" else e
        if op in ROWWISE:
            return _rowwise_call(a)
        if op is Op.WHERE:
            return _where_call(a)
        if op in REDUCTIONS or op in UNARY_CALLS:
            a.no_kw()
            a.arity(1, "x")
            return Expr(op, (a.sub(a.pos[0]),), span=c.span)
        if op in BINARY_CALLS:
            a.no_kw()
            a.arity(2, "a, b")
            return Expr(op, (a.sub(a.pos[0]), a.sub(a.pos[1])), span=c.span)
        raise InputError(f"'{fname}' cannot be used here", c.span)  # pragma: no cover

    def _collective_call(self, a: _CallArgs) -> Expr:
        """`allreduce(OP, x)`, `reducescatter(OP, x)`, `reduce(OP, x, root=0)`,
        `allgather(x)`, `broadcast(x, root=0)`, ..."""
        op = a.op
        row = collective(op)
        rop: ReduceOp | None = None
        if row.reduces:
            a.arity(2, "OP, x" + (", root=0" if row.rooted else ""))
            rop = self._reduce_op(a.pos[0], a.fname)
            x = a.pos[1]
        else:
            a.arity(1, "x" + (", root=0" if row.rooted else ""))
            x = a.pos[0]
        value: float | int | None = None
        tag: str | None = None
        over = self._over_kw(a)
        if over is not None and (row.reslices or row.result is None):
            raise InputError(
                f"{a.fname}(…, over={over}) is not supported yet: only allreduce, "
                "reducescatter, allgather, broadcast and reduce run over a named axis",
                a.kws["over"].span,
                hint=f"leave over= out ({a.fname} runs over tp)",
            )
        if row.reslices:
            a.no_kw(("to", "from"))
            if "to" not in a.kws:
                raise InputError(
                    f"{a.fname} needs the dimension to slice the result along: to=",
                    a.call.span,
                    hint=f"for example {a.fname}(x, to=1); from= (optional) names the "
                    "dimension x is sliced along",
                )
            value = self._dim_literal(a, "to")
            if "from" in a.kws:
                tag = str(self._dim_literal(a, "from"))
        elif row.rooted:
            a.no_kw(("root", "over"))
            value = 0
            if "root" in a.kws:
                rv = a.literal(a.kws["root"].value, "root")
                if not isinstance(rv, int):
                    raise InputError(f"{a.fname}: root must be an integer", a.kws["root"].span)
                value = rv
        else:
            a.no_kw(("over",) if over is not None else ())
        if over == "dp":
            tag = "dp"  # the axis of a collective other than alltoall (Expr.tag)
        return Expr(op, (a.sub(x),), rop=rop, value=value, tag=tag, span=a.call.span)

    def _over_kw(self, a: _CallArgs) -> str | None:
        """The axis `over=AXIS` names (None without over=)."""
        kw = a.kws.get("over")
        if kw is None:
            return None
        v = kw.value
        if not (isinstance(v, Expr) and v.op is Op.REF and v.name):
            raise InputError(
                f"{a.fname}: over= names an axis of the rank grid, such as over=dp",
                kw.span,
            )
        return self.axis(syn.Name(v.name, v.span or kw.span), f"{a.fname}")

    @staticmethod
    def _dim_literal(a: _CallArgs, key: str) -> int:
        """An integer dimension keyword (`to=1`, `from=-1`)."""
        v = a.literal(a.kws[key].value, key)
        if not isinstance(v, int):
            raise InputError(f"{a.fname}: {key} must be an integer dimension", a.kws[key].span)
        return v

    def _reshape_call(self, a: _CallArgs) -> Expr:
        """`reshape(x, S1, S2, …)`: each size a dimension name, an integer literal or a
        product of them, kept with its source text like an input's shape."""
        a.no_kw()
        if len(a.pos) < 2:
            raise InputError(
                f"reshape takes the value and its new sizes (reshape(x, S1, S2, …)), "
                f"got {len(a.pos)} argument{'s' if len(a.pos) != 1 else ''}",
                a.call.span,
            )
        sizes = tuple(self._size_arg(node) for node in a.pos[1:])
        return Expr(a.op, (a.sub(a.pos[0]),), shape_arg=sizes, span=a.call.span)

    def type_arg(
        self, node: Any, span: Span | None, message: str, example: str
    ) -> tuple[DType, tuple[Size, ...]]:
        """A `T[DIMS]` call argument (docs/language.md, constants and routing): its dtype
        and shape; `message` and `example` say what the call wanted when it is not one."""
        if not isinstance(node, syn.TypeArg):
            raise InputError(message, getattr(node, "span", span), hint=f"for example {example}")
        dt = DType.parse(node.dtype.text)
        if dt is None:
            raise InputError(
                f"unknown dtype '{node.dtype.text}'",
                node.dtype.span,
                hint=did_you_mean(node.dtype.text, DTYPE_NAMES)
                or "dtypes: " + " ".join(DTYPE_NAMES),
            )
        return dt, tuple(self._size(se) for se in node.sizes)

    def _constant_call(self, a: _CallArgs) -> Expr:
        """`zeros(T[DIMS])`, `ones(T[DIMS])`, `full(T[DIMS], value)`, `iota(T[DIMS],
        dim=d)` (docs/language.md, constants)."""
        op, fname = a.op, a.fname
        sig = {Op.FULL: "T[DIMS], value", Op.IOTA: "T[DIMS], dim=d"}.get(op, "T[DIMS]")
        a.no_kw(("dim",) if op is Op.IOTA else ())
        a.arity(2 if op is Op.FULL else 1, sig)
        dt, shape = self.type_arg(
            a.pos[0],
            a.call.span,
            f"{fname}: the first argument must be a type such as f32[B, H]",
            f"{fname}({sig.replace('T[DIMS]', 'f32[B, H]')})",
        )
        value: float | int | None = None
        if op is Op.FULL:
            node = a.pos[1]
            value = a.literal(node, "the value")
            span = getattr(node, "span", a.call.span)
            if not dt.is_float and value != int(value):
                raise InputError(
                    f"full: {value!r} is not an integer, and the constant is {dt.value}",
                    span,
                    hint=f"use a float dtype, e.g. full(f32[…], {value!r})",
                )
            if not dt.is_float:
                value = int(value)
            if abs(value) > _FLOAT_MAX.get(dt.value, math.inf):
                raise InputError(f"full: {value!r} is out of range for {dt.value}", span)
        if op is Op.IOTA:
            if "dim" in a.kws:
                d = a.literal(a.kws["dim"].value, "dim")
                if not isinstance(d, int):
                    raise InputError("iota: dim must be an integer dimension", a.kws["dim"].span)
            elif len(shape) == 1:
                d = 0
            else:
                raise InputError(
                    f"iota needs the dimension it counts along (dim=) for a shape of rank "
                    f"{len(shape)}",
                    a.call.span,
                    hint="for example iota(i32[B, H], dim=1): every row holds 0, 1, …, H-1",
                )
            if not -len(shape) <= d < len(shape):
                raise InputError(
                    f"iota: dim={d} is out of range for a shape of rank {len(shape)}",
                    a.kws["dim"].span,
                    hint=f"dimensions are 0…{len(shape) - 1} (or -1…-{len(shape)})"
                    if shape
                    else "a scalar has no dimension to count along",
                )
            value = d + len(shape) if d < 0 else d
        return Expr(op, (), value=value, dtype_arg=dt, shape_arg=shape, span=a.call.span)

    def _size_arg(self, node: Any) -> Size:
        """A size written as a call argument: `H`, `8`, `E*C` (a product of names and
        integer literals), checked like a size of an input's shape."""
        factors: list[Expr] = []

        def flatten(n: Any) -> None:
            if isinstance(n, Expr) and n.op is Op.MUL:
                flatten(n.args[0])
                flatten(n.args[1])
            elif isinstance(n, Expr) and n.op is Op.REF:
                factors.append(n)
            elif isinstance(n, Expr) and n.op is Op.CONST and isinstance(n.value, int):
                if n.value < 1:
                    raise InputError(f"a size must be positive, got {n.value}", n.span)
                factors.append(n)
            else:
                raise InputError(
                    "reshape: a size must be a dimension name, an integer literal or a "
                    "product of them",
                    getattr(n, "span", None),
                    hint="for example reshape(x, E*C, H)",
                )

        flatten(node)
        value = 1
        texts: list[str] = []
        for f in factors:
            if f.op is Op.CONST:
                assert isinstance(f.value, int)
                value *= f.value
                texts.append(str(f.value))
                continue
            name = str(f.name)
            if name in self.bad_dims:
                raise _AlreadyReported()
            if name not in self.dims:
                raise InputError(
                    f"unknown dimension '{name}'",
                    f.span,
                    hint=did_you_mean(name, self.dims) or "declare it: dim NAME = SIZE",
                )
            value *= self.dims[name]
            texts.append(name)
        if value > _MAX_SIZE:
            raise InputError(
                f"size {'*'.join(texts)} = {value} is too large (at most 2^62 elements)",
                getattr(node, "span", None),
            )
        return Size("*".join(texts), value)

    def _reduce_op(self, node: Any, fname: str) -> ReduceOp:
        if isinstance(node, syn.RedTok):
            return REDUCE_WORDS[node.text]
        if isinstance(node, Expr) and node.op is Op.REF and node.name in REDUCE_WORDS:
            return REDUCE_WORDS[node.name]
        raise InputError(
            f"{fname}: the first argument must be a reduction operator (+ * max min avg)",
            getattr(node, "span", None),
            hint=f"for example {fname}(+, x)",
        )


def _declared_type(st: syn.InputStmt) -> tuple[Any, ...]:
    """All that an `input` statement says about the type of its value, as source text:
    its dtype, sizes, layout and pipeline stage (not its name, nor where it is)."""
    arg, stage_kw, stage = st.layout_arg, st.stage_kw, st.stage
    return (
        st.dtype.text,
        tuple([tuple([f.text for f in s.factors]) for s in st.sizes]),
        st.layout.text,
        None if arg is None else (arg[0].text, arg[1]),
        None if stage_kw is None else stage_kw.text,
        None if stage is None else stage.text,
        None if st.layout_over is None else st.layout_over.text,
        tuple(
            (m.word.text, None if m.arg is None else (m.arg[0].text, m.arg[1]),
             None if m.over is None else m.over.text)
            for m in st.more_layouts
        ),
    )


def _input_layout(st: syn.InputStmt, shape: Shape) -> Layout:
    """The layout an `input` statement declares for a value of `shape`."""
    word = st.layout.text
    layout: Layout
    if word not in LAYOUT_WORDS:
        raise InputError(
            f"unknown layout '{word}'",
            st.layout.span,
            hint=did_you_mean(word, LAYOUT_WORDS)
            or "layouts: replicated, local, sliced, sliced(d)",
        )
    if st.layout_arg is not None and word != "sliced":
        raise InputError(f"layout '{word}' takes no argument", st.layout.span)
    if word == "replicated":
        layout = REPLICATED
    elif word == "local":
        layout = LOCAL
    elif st.layout_arg is None:
        layout = sliced(None, shape)
    else:
        num, neg = st.layout_arg
        d = _int(num, "a sliced dimension", positive=False) * (-1 if neg else 1)
        if not -len(shape) <= d < len(shape):
            raise InputError(
                f"sliced({d}) is out of range for '{st.name.text}' of rank {len(shape)}",
                num.span,
                hint=f"dimensions are 0…{len(shape) - 1} (or -1…-{len(shape)})"
                if shape
                else "a scalar cannot be sliced",
            )
        layout = sliced(d, shape)
    if layout.is_sliced and not shape:
        raise InputError(f"scalar input '{st.name.text}' cannot be sliced", st.layout.span)
    return layout


class _CallArgs:
    """The arguments of one call, with the checks every function's arguments share."""

    def __init__(self, call: syn.Call, op: Op, sub: Callable[[Any], Expr]) -> None:
        self.call = call
        self.op = op
        self.fname = call.name.text
        self.pos = [a for a in call.args if not isinstance(a, syn.Kw)]
        self.kws = {a.name.text: a for a in call.args if isinstance(a, syn.Kw)}
        self.sub = sub
        """Resolves an argument expression (name errors are collected)."""

    def arity(self, n: int, sig: str) -> None:
        """Exactly `n` positional arguments (`sig`: the signature the message shows)."""
        if len(self.pos) != n:
            fname = self.fname
            hint = None
            if self.op in COLLECTIVES and collective(self.op).reduces and len(self.pos) == 1:
                hint = f"the reduction operator (+ * max min avg) comes first, e.g. {fname}(+, x)"
            raise InputError(
                f"{fname} takes {n} argument{'s' if n != 1 else ''} ({fname}({sig})), "
                f"got {len(self.pos)}",
                self.call.span,
                hint=hint,
            )

    def no_kw(self, allowed: tuple[str, ...] = ()) -> None:
        """No keyword arguments but those `allowed`."""
        for k, kw in self.kws.items():
            if k not in allowed:
                raise InputError(
                    f"{self.fname} has no keyword argument '{k}'",
                    kw.name.span,
                    hint=("it accepts: " + ", ".join(allowed)) if allowed else None,
                )

    def literal(self, node: Any, what: str) -> float | int:
        """A number literal argument, finite and in range like every literal."""
        if isinstance(node, Expr) and node.op is Op.CONST and node.value is not None:
            return _check_number(node).value  # type: ignore[return-value]
        if (
            isinstance(node, Expr)
            and node.op is Op.NEG
            and node.args[0].op is Op.CONST
            and node.args[0].value is not None
        ):
            return -_check_number(node.args[0]).value  # type: ignore[operator]
        raise InputError(
            f"{self.fname}: {what} must be a number literal", getattr(node, "span", self.call.span)
        )


def _cast_call(a: _CallArgs) -> Expr:
    """`cast(T, x)`: T is a dtype name."""
    a.arity(2, "T, x")
    a.no_kw()
    t = a.pos[0]
    dt = DType.parse(t.name) if isinstance(t, Expr) and t.op is Op.REF and t.name else None
    if dt is None:
        raise InputError(
            "cast: the first argument must be a dtype (" + " ".join(DTYPE_NAMES) + ")",
            getattr(t, "span", a.call.span),
        )
    return Expr(a.op, (a.sub(a.pos[1]),), dtype_arg=dt, span=a.call.span)


def _dropout_call(a: _CallArgs, tag: str) -> Expr:
    """`dropout(x, p)`, optionally `id=STAGE, k=K` (the tag of a dropout a step copied,
    which replaces the stable id `tag` the call is given in its stage)."""
    a.no_kw(("id", "k"))
    a.arity(2, "x, p")
    p = a.literal(a.pos[1], "the probability p")
    if not 0 <= p < 1:
        raise InputError(
            f"dropout: p must be in [0, 1), got {p}", getattr(a.pos[1], "span", a.call.span)
        )
    if "id" in a.kws:
        idv = a.kws["id"].value
        if not (isinstance(idv, Expr) and idv.op is Op.REF):
            raise InputError("dropout: id= must name the source stage", a.kws["id"].span)
        k = a.literal(a.kws["k"].value, "k") if "k" in a.kws else 0
        tag = f"{idv.name}#{int(k)}"
    return Expr(a.op, (a.sub(a.pos[0]),), value=float(p), tag=tag, span=a.call.span)


def _permute_call(a: _CallArgs) -> Expr:
    """`transpose(x, d0, d1)` or `permute(x, p0, p1, …)`: the dimensions are integer
    literals (negative ones count from the end), checked against x's rank by inference."""
    a.no_kw()
    sig = "x, d0, d1" if a.op is Op.TRANSPOSE else "x, p0, p1, …"
    if a.op is Op.TRANSPOSE:
        a.arity(3, sig)
    elif len(a.pos) < 2:
        raise InputError(
            f"permute takes the value and a permutation of its dimensions ({a.fname}({sig})), "
            f"got {len(a.pos)} argument{'s' if len(a.pos) != 1 else ''}",
            a.call.span,
            hint="for example permute(x, 1, 0, 2) puts dimension 1 first",
        )
    dims: list[str] = []
    for node in a.pos[1:]:
        v = a.literal(node, "a dimension")
        if not isinstance(v, int):
            raise InputError(
                f"{a.fname}: a dimension must be an integer, got {v!r}",
                getattr(node, "span", a.call.span),
            )
        dims.append(str(v))
    return Expr(a.op, (a.sub(a.pos[0]),), tag=",".join(dims), span=a.call.span)


def _replace_expr(e: Expr, **changes: Any) -> Expr:
    return dataclasses.replace(e, **changes)


_AXIS_OPS = {Op.SUM: Op.SUM_DIM, Op.MEAN: Op.MEAN, Op.AMAX: Op.AMAX_DIM, Op.AMIN: Op.AMIN}


def _axis_reduction_call(a: _CallArgs) -> Expr:
    """`sum/mean/amax/amin(x, dim=d, keepdim=true|false)`: a reduction along dimension d
    (an integer literal; negative counts from the end)."""
    a.no_kw(("dim", "keepdim"))
    a.arity(1, "x, dim=d, keepdim=false")
    if "dim" not in a.kws:
        raise InputError(
            f"{a.fname} needs the dimension to reduce: dim=",
            a.call.span,
            hint=f"for example {a.fname}(x, dim=-1); sum(x) and amax(x) without dim= reduce "
            "the whole tensor to a scalar",
        )
    d = a.literal(a.kws["dim"].value, "dim")
    if not isinstance(d, int):
        raise InputError(f"{a.fname}: dim must be an integer dimension", a.kws["dim"].span)
    keep = False
    if "keepdim" in a.kws:
        kv = a.kws["keepdim"].value
        if isinstance(kv, Expr) and kv.op is Op.REF and kv.name in ("true", "false"):
            keep = kv.name == "true"
        elif isinstance(kv, Expr) and kv.op is Op.CONST and kv.value in (0, 1):
            keep = kv.value == 1
        else:
            raise InputError(
                f"{a.fname}: keepdim must be true or false", a.kws["keepdim"].span
            )
    return Expr(
        _AXIS_OPS[a.op],
        (a.sub(a.pos[0]),),
        value=d,
        tag="keepdim" if keep else None,
        span=a.call.span,
    )


def _slice_call(a: _CallArgs) -> Expr:
    """`slice(x)` or `slice(x, d)`."""
    a.no_kw()
    if len(a.pos) not in (1, 2):
        raise InputError(
            f"slice takes 1 or 2 arguments (slice(x) or slice(x, d)), got {len(a.pos)}",
            a.call.span,
        )
    d = None
    if len(a.pos) == 2:
        dv = a.literal(a.pos[1], "the dimension")
        if not isinstance(dv, int):
            raise InputError("slice: the dimension must be an integer", a.call.span)
        d = dv
    return Expr(a.op, (a.sub(a.pos[0]),), value=d, span=a.call.span)


_ROWWISE_SIGNATURES: dict[Op, tuple[int, str, float | None]] = {
    Op.LAYERNORM: (3, "x, gamma, beta, eps=1e-5", 1e-5),
    Op.RMSNORM: (2, "x, gamma, eps=1e-6", 1e-6),
    Op.SOFTMAX: (1, "x", None),
}
"""Positional arguments, the signature messages show, and the default eps."""


def _rowwise_call(a: _CallArgs) -> Expr:
    """`layernorm(x, gamma, beta, eps=…)`, `rmsnorm(x, gamma, eps=…)`, `softmax(x)`."""
    n, sig, eps = _ROWWISE_SIGNATURES[a.op]
    a.arity(n, sig)
    a.no_kw(("eps",) if eps is not None else ())
    if "eps" in a.kws:
        eps = float(a.literal(a.kws["eps"].value, "eps"))
    return Expr(a.op, tuple(a.sub(x) for x in a.pos), value=eps, span=a.call.span)


def _where_call(a: _CallArgs) -> Expr:
    """`where(c, a, b)`: c is a comparison."""
    a.no_kw()
    a.arity(3, "c, a, b")
    cond = a.pos[0]
    if not isinstance(cond, syn.Cmp):
        raise InputError(
            "where: the first argument must be a comparison such as x > 0",
            getattr(cond, "span", a.call.span),
        )
    cexpr = Expr(cond.op, (a.sub(cond.lhs), a.sub(cond.rhs)), span=cond.span)
    return Expr(a.op, (cexpr, a.sub(a.pos[1]), a.sub(a.pos[2])), span=a.call.span)


GRID_AXES = ("dp", "tp", "pp")
"""The named axes of a rank grid (docs/language.md, rank grids)."""


def _make_grid(axes: tuple[tuple[str, int], ...]) -> Grid:
    """The grid of `ranks A=n, …` (axes in written order, each at most once)."""
    d = dict(axes)
    names = tuple(a for a, _ in axes)
    # the two-axis grid of before keeps its printed form (tp first)
    order = () if set(names) == {"tp", "pp"} else names
    return Grid(d.get("tp", 1), d.get("pp", 1), True, d.get("dp", 1), order)


def _checked_grid(grid: Grid, span: Span | None) -> Grid:
    """`grid`, when its world is at most `MAX_RANKS` (`span`: the `ranks` statement;
    None for `--ranks`)."""
    if grid.world <= MAX_RANKS:
        return grid
    what = f"{' × '.join(grid.axes)} = {grid.world}" if grid.is_grid else str(grid.world)
    message = f"too many ranks: {what} (at most {MAX_RANKS:,})"
    if span is None:
        raise UsageError(f"--ranks: {message}")
    raise InputError(message, span)


def _order_reads_before_updates(program: Program) -> Program:
    """Every read of an updated input is ordered before the write (docs/language.md, layout inference).

    A read written after `u = update(t, e)` in the source still sees the old value of
    `t`: the stages are put in a stable topological order of data and ordering edges, so
    such a read moves before the update. Only a read that also depends on the update
    (`y = t + u`) cannot be ordered, and is an error.
    """
    updates = program.updates()
    if not updates:
        return program
    _check_reads_of_updates(program, updates)
    out = _stable_order(program)
    if [x.name for x in out] == [x.name for x in program.stages]:
        return program
    return dataclasses.replace(program, stages=tuple(out))


def _check_reads_of_updates(program: Program, updates: dict[str, str]) -> None:
    """No stage both reads an updated input (`updates`: input → its update stage) and
    depends on that update."""
    from cocoviz.ir.graph import data_deps

    dd = data_deps(program)
    ancestors: dict[str, set[str]] = {}
    for st in program.stages:  # source order is a topological order of data edges
        acc: set[str] = set()
        for d in dd[st.name]:
            acc |= ancestors[d] | {d}
        ancestors[st.name] = acc
    by_name = {st.name: st for st in program.stages}
    for st in program.stages:
        for e in st.expr.walk():
            if e.op is not Op.REF or e.name not in updates:
                continue
            u = by_name[updates[e.name]]
            if u.name != st.name and u.name in ancestors[st.name]:
                raise InputError(
                    f"'{st.name}' reads the old value of '{e.name}' but also depends on its "
                    f"update '{u.name}'",
                    e.span or st.span,
                    notes=[(f"'{e.name}' is updated in place here", u.span)],
                    hint=f"every read of '{e.name}' runs before '{u.name}' overwrites it; read "
                    f"'{u.name}' for the new value",
                )


def _stable_order(program: Program) -> list[Stage]:
    """The stages in the topological order of data and ordering edges that keeps source
    order wherever the edges allow."""
    from cocoviz.ir.graph import deps

    by_name = {st.name: st for st in program.stages}
    order = {st.name: i for i, st in enumerate(program.stages)}
    edges = deps(program)
    indeg = {n: len(ds) for n, ds in edges.items()}
    succ: dict[str, list[str]] = {n: [] for n in edges}
    for n, ds in edges.items():
        for x in ds:
            succ[x].append(n)
    ready = [n for n, k in indeg.items() if k == 0]
    out: list[Stage] = []
    heap = [(order[n], n) for n in ready]
    heapq.heapify(heap)
    while heap:
        _, n = heapq.heappop(heap)
        out.append(by_name[n])
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                heapq.heappush(heap, (order[m], m))
    if len(out) != len(program.stages):  # pragma: no cover - excluded by the check above
        raise InputError("the stages cannot be ordered: a cycle through an update")
    return out


def _group(st: Any) -> Group:
    """A printed `fused { }` or `overlapped chunks=K { }` block as a group (whether the
    group is legal is checked by `_check_groups`, as for a `fuse` or `overlap` step)."""
    if isinstance(st, syn.FusedStmt):
        if not st.items:
            raise InputError("an empty 'fused' block", st.span, hint="list the fused stages in it")
        if len(st.items) < 2:
            raise InputError(
                "a 'fused' block needs at least two stages",
                st.span,
                hint="remove the block around a lone stage",
            )
        return Group(GroupKind.FUSED, tuple(a.name.text for a in st.items))
    assert isinstance(st, syn.OverlappedStmt)
    if st.chunks_kw.text not in ("chunks", "shards"):
        raise InputError(
            f"expected 'chunks=K' or 'shards=G', got '{st.chunks_kw.text}'", st.chunks_kw.span
        )
    if len(st.items) < 2:
        raise InputError(
            "an 'overlapped' block needs at least two members (stages or fused blocks)",
            st.span,
        )
    items: list[str | Group] = []
    for it in st.items:
        items.append(_group(it) if isinstance(it, syn.FusedStmt) else it.name.text)
    kw = st.chunks_kw.text
    return Group(GroupKind.OVERLAPPED, tuple(items), _int(st.chunks, kw), by_shard=kw == "shards")


def _check_groups(program: Program, blocks: list[syn.FusedStmt | syn.OverlappedStmt]) -> None:
    """Printed groups hold exactly what the `fuse` and `overlap` steps would make of
    them (same rules, members and order), so that a program read from text meets every
    invariant of a scheduled one. `blocks` are the source blocks of `program.groups`."""
    from cocoviz.ir.transforms.step import group_error

    for gi, block in enumerate(blocks):
        err = group_error(program, gi)
        if err is None:
            continue
        word = "fused" if isinstance(block, syn.FusedStmt) else "overlapped"
        notes = [(d.message, d.span) for d in err.diagnostics[1:]]
        if err.span is not None:
            notes.insert(0, ("at this stage", err.span))
        notes.extend(err.diagnostics[0].notes)
        raise InputError(
            f"this '{word}' block is not a legal group: {err.message.split(': ', 1)[-1]}",
            block.span,
            hint=err.hint,
            notes=notes,
        )


def lower(
    module: syn.Module,
    defines: Mapping[str, int] | None = None,
    ranks: RanksOverride | None = None,
) -> Program:
    return _Lowerer(module, defines or {}, ranks).lower()


def load_program(
    text: str,
    path: str = "<input>",
    defines: Mapping[str, int] | None = None,
    ranks: RanksOverride | None = None,
) -> Program:
    """Parse and lower a `.coco` text."""
    with _no_gc():
        return lower(parse_module(text, path), defines, ranks)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing and lowering allocate many small,
    acyclic objects, and the collections this triggers took a sixth of the time of a
    large program."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_FLOAT_MAX = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38}
"""Largest finite value of each float dtype (f64: any finite float)."""


def read_source(path: str | Path, what: str = "program") -> str:
    """The text of a source file, read with a bound: at most `MAX_SOURCE_BYTES` (so that
    `/dev/zero`, a runaway pipe or a huge file ends in a diagnostic, not an exhausted
    memory), UTF-8, newlines normalized as text mode would (`\r\n` and `\r` → `\n`)."""
    from cocoviz import fsio

    p = Path(path)
    kind = ".coco file" if what == "program" else f"{what} file"
    try:
        return fsio.read_text(p, kind, syn.MAX_SOURCE_BYTES)
    except fsio.ReadError as err:
        if err.reason == "missing":
            raise InputError(f"{p}: no such file", hint=_nearby(p)) from None
        if err.reason == "too-large":
            size = fsio.size_text(syn.MAX_SOURCE_BYTES)
            raise InputError(
                f"{p}: too large: a {what} file may hold at most {size}",
                hint="is it the right file? (a device such as /dev/zero never ends)",
            ) from None
        raise


def load_file(
    path: str | Path,
    defines: Mapping[str, int] | None = None,
    ranks: RanksOverride | None = None,
) -> Program:
    return load_program(read_source(path), str(path), defines, ranks)


def _nearby(p: Path) -> str | None:
    try:
        names = [q.name for q in (p.parent if str(p.parent) else Path(".")).iterdir()]
    except OSError:
        return None
    return did_you_mean(p.name, names)
