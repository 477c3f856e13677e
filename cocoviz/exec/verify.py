"""Reference equivalence of a program and its scheduled form (docs/semantics-notes.md, `cocoviz verify`).

Both programs run in the reference with the same inputs (the shared generator with one
seed, or the same given global arrays); every output and every updated input of the
original is compared by name (an updated input by the input's name, as every dump names
it: `cocoviz.exec.dumps`), as global values, with the dtype's tolerance
(`numerics.compare`: ``|a − b| ≤ atol + rtol·|b|``, NaN positions must match).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cocoviz import numerics as nx
from cocoviz.exec.dumps import dumped_values
from cocoviz.exec.reference import (
    RunResult,
    check_limits,
    estimate_bytes,
    estimate_work,
    run_reference,
)
from cocoviz.ir.nodes import Program
from cocoviz.ir.types import format_shape, shape_values

__all__ = ["VerifyReport", "VerifyRow", "verify_programs"]


@dataclass(frozen=True)
class VerifyRow:
    """One compared value."""

    name: str
    kind: str
    """"output", "updated input", or "value" (an intermediate, with ``all_names``)."""
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool
    n_bad: int = 0
    note: str = ""
    """Why the row failed when no numbers could be compared, or the first bad element."""


@dataclass(frozen=True)
class VerifyReport:
    original: str
    scheduled: str
    ranks: str
    seed: int
    rows: tuple[VerifyRow, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def format_report(self) -> str:
        """A table: one line per compared value, then a verdict."""
        head = ("name", "kind", "dtype", "max abs", "max rel", "")
        body = [
            (
                r.name,
                r.kind,
                r.dtype,
                f"{r.max_abs:.3g}",
                f"{r.max_rel:.3g}",
                "ok" if r.ok else ("MISMATCH" + (f" ({r.note})" if r.note else "")),
            )
            for r in self.rows
        ]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
        lines = [
            f"verify {self.scheduled} against {self.original} (ranks {self.ranks}, "
            f"seed {self.seed})",
            "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(),
        ]
        for row in body:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        bad = sum(not r.ok for r in self.rows)
        lines.append(
            f"ok: {len(self.rows)} value(s) agree"
            if not bad
            else f"mismatch: {bad} of {len(self.rows)} value(s) differ"
        )
        return "\n".join(lines) + "\n"


def _missing(name: str, kind: str, dtype: str, why: str) -> VerifyRow:
    return VerifyRow(name, kind, dtype, float("nan"), float("nan"), False, 0, why)


def _compare(name: str, kind: str, a: RunResult, b: RunResult) -> VerifyRow:
    ta, tb = a.type_of(name), b.type_of(name)
    dt = ta.dtype.value
    if ta.dtype != tb.dtype or shape_values(ta.shape) != shape_values(tb.shape):
        return _missing(
            name,
            kind,
            dt,
            f"type changed: {dt}{format_shape(ta.shape, True)} vs "
            f"{tb.dtype.value}{format_shape(tb.shape, True)}",
        )
    if ta.layout.is_local != tb.layout.is_local:
        return _missing(name, kind, dt, f"layout changed from {ta.layout} to {tb.layout}")
    expected = a.global_value(name)
    actual = b.global_value(name)
    res = compare_chunked(actual, expected, dt)
    note = ""
    if not res.ok and res.first_bad is not None:
        idx = np.unravel_index(res.first_bad, expected.shape) if expected.ndim else ()
        note = (
            f"{res.n_bad} element(s), first at {list(map(int, idx))}: "
            f"{actual.reshape(-1)[res.first_bad]!r} vs {expected.reshape(-1)[res.first_bad]!r}"
        )
    return VerifyRow(name, kind, dt, res.max_abs, res.max_rel, res.ok, res.n_bad, note)


_CHUNK = 1 << 20


def compare_chunked(actual: np.ndarray, expected: np.ndarray, dtype: str) -> nx.CompareResult:
    """`numerics.compare` over blocks of 2^20 elements (bounded temporaries); bit-identical
    arrays agree at once (same bits: equal values and the same NaN positions)."""
    a, b = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare arrays of shapes {a.shape} and {b.shape}")
    if a.dtype == b.dtype and np.array_equal(
        a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    ):
        return nx.CompareResult(True, 0.0, 0.0, 0, 0)
    fa, fb = a.reshape(-1), b.reshape(-1)
    ok, max_abs, max_rel, n_bad, nan_bad, first = True, 0.0, 0.0, 0, 0, None
    for lo in range(0, max(fa.size, 1), _CHUNK):
        r = nx.compare(fa[lo : lo + _CHUNK], fb[lo : lo + _CHUNK], dtype)
        ok &= r.ok
        max_abs, max_rel = max(max_abs, r.max_abs), max(max_rel, r.max_rel)
        n_bad += r.n_bad
        nan_bad += r.nan_mismatch
        if first is None and r.first_bad is not None:
            first = lo + r.first_bad
    return nx.CompareResult(ok, max_abs, max_rel, n_bad, nan_bad, first)


def check_pair_limits(
    original: Program, scheduled: Program, max_mem: int | None, max_work: int | None = None
) -> int:
    """Refuse (UsageError, exit 2) when the two reference runs together would need more than
    `max_mem` bytes (default 4 GiB) or `max_work` operations; return the memory estimate."""
    need = estimate_bytes(original) + estimate_bytes(scheduled)
    work = estimate_work(original) + estimate_work(scheduled)
    check_limits(
        original,
        max_mem,
        need=need,
        what=f"verifying '{scheduled.name}'",
        max_work=max_work,
        work=work,
    )
    return need


def _check_inputs(original: Program, scheduled: Program) -> list[VerifyRow]:
    rows = []
    for i in original.inputs:
        try:
            j = scheduled.input(i.name)
        except KeyError:
            rows.append(
                _missing(i.name, "input", i.ty.dtype.value, "not an input of the scheduled program")
            )
            continue
        if i.ty.dtype != j.ty.dtype or shape_values(i.ty.shape) != shape_values(j.ty.shape):
            rows.append(
                _missing(
                    i.name,
                    "input",
                    i.ty.dtype.value,
                    "declared differently in the scheduled program",
                )
            )
    return rows


def verify_programs(
    original: Program,
    scheduled: Program,
    seed: int = 0,
    max_mem: int | None = None,
    *,
    max_work: int | None = None,
    inputs: Mapping[str, npt.ArrayLike] | None = None,
    all_names: bool = False,
) -> VerifyReport:
    """Run both programs with the same inputs and compare, by name and as global values,
    every output and every updated input of the original (an updated input holds the
    value of its update stage). One missing from the scheduled program is a failed row.
    With `all_names`, every other stage name the two programs share is compared too.

    Raises UsageError (exit 2) when the runs would exceed `max_mem` (default 4 GiB) or
    `max_work`, before running anything.
    """
    if original.grid != scheduled.grid:
        raise ValueError(
            f"the programs run on different grids ({original.grid} and {scheduled.grid})"
        )
    check_pair_limits(original, scheduled, max_mem, max_work)
    rows = _check_inputs(original, scheduled)
    names = set(original.outputs) | set(original.updates())
    if all_names:
        names |= {s.name for s in original.stages}
    # the pair was checked against the limits above, so each run alone fits them
    big = 1 << 62
    ra = run_reference(original, seed, inputs, max_mem=big, max_work=big, keep=names)
    rb = run_reference(
        scheduled, seed, inputs, max_mem=big, max_work=big, keep=names, preloaded=ra.initial
    )
    done: set[str] = set()
    sched_updates = scheduled.updates()
    for name in original.outputs:
        done.add(name)
        if name not in scheduled.outputs:
            rows.append(
                _missing(
                    name,
                    "output",
                    original.type_of(name).dtype.value,
                    "not an output of the scheduled program",
                )
            )
            continue
        rows.append(_compare(name, "output", ra, rb))
    for name in (d.name for d in dumped_values(original) if d.kind == "updated input"):
        done.add(name)
        if name not in sched_updates:
            rows.append(
                _missing(
                    name,
                    "updated input",
                    original.input(name).ty.dtype.value,
                    "not updated by the scheduled program",
                )
            )
            continue
        rows.append(_compare(name, "updated input", ra, rb))
    if all_names:
        for s in original.stages:
            if s.name not in done and scheduled.has_stage(s.name):
                rows.append(_compare(s.name, "value", ra, rb))
    return VerifyReport(original.name, scheduled.name, str(original.grid), seed, tuple(rows))
