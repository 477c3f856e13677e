"""Schedule transformations (docs/schedules.md): the registry, step parsing, and the legal-step
query used by the TUI palette and `cocoviz apply --explain`.

One module per transformation (`split`, `reorder`, `asslice`, `dce`, `fuse`,
`overlap`, `decompose`); the shared machinery lives in `base` (the `Transformation` base class, the
graph `Index`), `grouping` (hulls and cycles) and `retype` (incremental re-typing and
the IR invariant checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cocoviz.errors import CocovizError, ScheduleError, did_you_mean
from cocoviz.ir.nodes import COLLECTIVES, Op, Program, StepCall
from cocoviz.ir.transforms.asslice import AsSlice
from cocoviz.ir.transforms.base import Index, index
from cocoviz.ir.transforms.dce import DCE
from cocoviz.ir.transforms.decompose import Decompose
from cocoviz.ir.transforms.fuse import Fuse
from cocoviz.ir.transforms.overlap import DEFAULT_CHUNKS, Overlap
from cocoviz.ir.transforms.reorder import Reorder
from cocoviz.ir.transforms.split import Split
from cocoviz.ir.transforms.step import Transformation, made_by

REGISTRY: dict[str, type[Transformation]] = {
    t.name: t for t in (Split, Reorder, AsSlice, DCE, Fuse, Overlap, Decompose)
}
"""Step name → transformation class, in the order steps are usually applied."""

StepLike = StepCall | str | Transformation


def _arity_error(call: StepCall, cls: type[Transformation], what: str) -> ScheduleError:
    return ScheduleError(
        f"{call.name}: {what}, got {_count(len(call.args))}",
        call.span,
        hint=f"usage: {cls.signature}",
    )


def _count(n: int) -> str:
    return "no arguments" if n == 0 else f"{n} argument{'s' if n != 1 else ''}"


def _builders() -> dict[str, Callable[[StepCall], Transformation]]:
    def split(c: StepCall) -> Transformation:
        if len(c.args) != 1:
            raise _arity_error(c, Split, "takes one stage (an allreduce)")
        return Split(stage=c.args[0], call=c)

    def reorder(c: StepCall) -> Transformation:
        if not c.args:
            raise _arity_error(c, Reorder, "takes an allgather and optionally the stages to move")
        return Reorder(gather=c.args[0], region=tuple(c.args[1:]), call=c)

    def asslice(c: StepCall) -> Transformation:
        if not c.args:
            raise _arity_error(c, AsSlice, "takes one or more inputs")
        return AsSlice(tensors=tuple(c.args), call=c)

    def dce(c: StepCall) -> Transformation:
        if c.args:
            raise _arity_error(c, DCE, "takes no arguments")
        return DCE(call=c)

    def fuse(c: StepCall) -> Transformation:
        if len(c.args) < 2:
            raise _arity_error(c, Fuse, "takes two or more stages")
        return Fuse(stages=tuple(c.args), call=c)

    def overlap(c: StepCall) -> Transformation:
        if len(c.args) < 2:
            raise _arity_error(c, Overlap, "takes two or more stages or fused groups")
        chunks = dict(c.kwargs).get("chunks")
        return Overlap(items=tuple(c.args), chunks=chunks, call=c)

    def decompose(c: StepCall) -> Transformation:
        if len(c.args) != 2:
            raise _arity_error(
                c, Decompose, "takes two stages (an allgather and a matmul, or a matmul and a "
                "reducescatter)"
            )
        return Decompose(items=tuple(c.args), call=c)

    return {
        "split": split,
        "reorder": reorder,
        "asslice": asslice,
        "dce": dce,
        "fuse": fuse,
        "overlap": overlap,
        "decompose": decompose,
    }


_BUILDERS = _builders()
_KWARGS = {"overlap": ("chunks",)}


def from_call(call: StepCall) -> Transformation:
    """The transformation a written step names; ScheduleError for an unknown step, a
    wrong number of arguments or an unknown keyword."""
    build = _BUILDERS.get(call.name)
    if build is None:
        hint = did_you_mean(call.name, REGISTRY) or f"the steps are {', '.join(REGISTRY)}"
        raise ScheduleError(f"unknown step '{call.name}'", call.span, hint=hint)
    allowed = _KWARGS.get(call.name, ())
    for k, _v in call.kwargs:
        if k not in allowed:
            if allowed:
                hint = did_you_mean(k, allowed) or f"{call.name} takes {', '.join(allowed)}="
            else:
                hint = f"{call.name} takes no keyword arguments"
            raise ScheduleError(f"{call.name}: unknown keyword '{k}'", call.span, hint=hint)
    seen: set[str] = set()
    for k, _v in call.kwargs:
        if k in seen:
            raise ScheduleError(f"{call.name}: '{k}=' is given twice", call.span)
        seen.add(k)
    return build(call)


def parse_step(text: str, path: str = "<step>") -> StepCall:
    """One step written as text, e.g. `split(sum)`."""
    from cocoviz.ir.syntax import parse_steps

    steps = parse_steps(text, path)
    if len(steps) != 1:
        raise ScheduleError(
            f"expected one step, got {len(steps)}: '{text.strip()}'",
            hint="write one step, e.g. split(sum)",
        )
    return steps[0]


def as_transformation(step: StepLike) -> Transformation:
    if isinstance(step, Transformation):
        return step
    if isinstance(step, str):
        step = parse_step(step)
    return from_call(step)


# --- the legal-step query ----------------------------------------------------------------


@dataclass(frozen=True)
class StepOption:
    """A step that could be applied to a stage: `ok`, or the reason it is refused."""

    step: str
    ok: bool
    reason: str | None = None


def _try(program: Program, t: Transformation) -> StepOption:
    try:
        t.check(program)
    except CocovizError as err:
        reason = err.message
        prefix = f"{t.name}: "
        if reason.startswith(prefix):
            reason = reason[len(prefix) :]
        if err.hint:
            reason += f" ({err.hint})"
        return StepOption(str(t), False, reason)
    return StepOption(str(t), True, None)


def candidate_steps(program: Program, name: str) -> list[Transformation]:
    """The steps the palette offers for `name` (a stage or an input)."""
    idx = index(program)
    out: list[Transformation] = []
    if name in idx.inputs:
        return [AsSlice(tensors=(name,))]
    if not idx.is_stage(name):
        steps = made_by(program, name)
        if steps is not None:  # a name split or reorder makes (transforms/step.py, "names steps make")
            shown = "; ".join(str(s) for s in steps)
            raise ScheduleError(
                f"no stage named '{name}' yet: {shown} "
                f"{'makes it' if len(steps) == 1 else 'make it'}",
                hint=f"apply {shown} first",
            )
        hint = did_you_mean(name, [s.name for s in idx.stages] + list(idx.inputs))
        raise ScheduleError(f"no stage or input named '{name}'", hint=hint)
    s = idx.stage(name)
    out.append(Split(stage=name))
    out.append(Reorder(gather=name))
    tgt = idx.update_target.get(name)
    if tgt is not None:
        out.append(AsSlice(tensors=(tgt,)))
    neighbours = [p for p in sorted(idx.preds(name), key=idx.position)]
    users = idx.users(name)
    for p in neighbours:
        out.append(Fuse(stages=(p, name)))
    for u in users:
        out.append(Fuse(stages=(name, u)))
    # The fused collective: a reducescatter with the allgathers its computation feeds.
    if s.expr.op is Op.REDUCESCATTER:
        out.extend(Fuse(stages=(name, g)) for g in _reach(idx, name, Op.ALLGATHER, forward=True))
    if s.expr.op is Op.ALLGATHER:
        out.extend(
            Fuse(stages=(r, name)) for r in _reach(idx, name, Op.REDUCESCATTER, forward=False)
        )
    for p in neighbours:
        if name in idx.users(p):
            out.append(Overlap(items=(p, name), chunks=None))
    for u in users:
        out.append(Overlap(items=(name, u), chunks=None))
    if s.expr.op is Op.ALLGATHER and not users:
        out.append(DCE())
    return out


def _reach(idx: Index, start: str, op: Op, forward: bool, limit: int = 64) -> list[str]:
    """Stages with operation `op` reached from `start` through computation only."""
    found: list[str] = []
    seen = {start}
    todo = [start]
    while todo and len(seen) < limit:
        n = todo.pop()
        nxt = idx.users(n) if forward else sorted(idx.preds(n))
        for m in nxt:
            if m in seen:
                continue
            seen.add(m)
            e = idx.stage(m).expr.op
            if e is op:
                found.append(m)
            elif e not in COLLECTIVES and e is not Op.MATMUL:
                todo.append(m)
    return sorted(found, key=idx.position)


def legal_steps(program: Program, stage: str) -> list[StepOption]:
    """For a stage (or an input), every step the palette offers, with `ok` or the reason
    it does not apply. Legal steps come first, each kind in registry order."""
    options = [_try(program, t) for t in candidate_steps(program, stage)]
    seen: set[str] = set()
    unique = []
    for o in options:
        if o.step not in seen:
            seen.add(o.step)
            unique.append(o)
    return sorted(unique, key=lambda o: not o.ok)


__all__ = [
    "DEFAULT_CHUNKS",
    "REGISTRY",
    "AsSlice",
    "DCE",
    "Fuse",
    "Overlap",
    "Reorder",
    "Split",
    "StepOption",
    "Transformation",
    "as_transformation",
    "from_call",
    "legal_steps",
    "parse_step",
]
