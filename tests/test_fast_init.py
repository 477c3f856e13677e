"""The frozen dataclasses whose `__init__` is written by hand (parsing and inference make
tens of thousands of them, and the generated frozen `__init__` sets each field through
`object.__setattr__`) must stay what the dataclass declares: the same parameters in the
same order with the same defaults, every field set, and objects equal to ones built the
generated way. A field added to the class and not to its `__init__` fails here."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from cocoviz.errors import Source, Span
from cocoviz.ir import syntax
from cocoviz.ir.nodes import Expr, Op
from cocoviz.ir.types import REPLICATED, DType, Size, TensorType
from cocoviz.sim.workload import COMPUTE, KernelSpec, Kind, Operation

HAND_WRITTEN = [
    Span,
    Expr,
    TensorType,
    syntax.Name,
    syntax.Num,
    syntax.Call,
    syntax.SizeExpr,
    syntax.InputStmt,
    syntax.Assign,
    Operation,
]


def _generated_init(cls: type) -> Any:
    """The `__init__` `dataclass` would have made for `cls` (on a copy of it)."""
    ns = {f.name: f for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in cls.__dict__.items() if k in ns or k == "__annotations__"}
    copy = type(cls.__name__, (), {**fields, "__module__": cls.__module__})
    return dataclasses.dataclass(frozen=True)(copy)


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_hand_written_init_matches_the_fields(cls: type) -> None:
    assert "__init__" in cls.__dict__, f"{cls.__name__} no longer writes its __init__"
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default, f"{cls.__name__}.{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            pytest.fail(f"{cls.__name__}.{f.name}: a default factory needs the generated init")
        else:
            assert p.default is inspect.Parameter.empty, f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_hand_written_init_sets_every_field_as_the_generated_one(cls: type) -> None:
    src = Source("t.coco", "x = y\n")
    span = Span(src, 1, 1, 1, 2)
    name = syntax.Name("x", span)
    samples: dict[type, dict[str, Any]] = {
        Span: {"source": src, "line": 1, "col": 1, "end_line": 1, "end_col": 6},
        Expr: {"op": Op.REF, "name": "x", "span": span},
        TensorType: {"dtype": DType.F32, "shape": (Size("4", 4),), "layout": REPLICATED},
        syntax.Name: {"text": "x", "span": span},
        syntax.Num: {"text": "2", "span": span},
        syntax.Call: {"name": name, "args": (name,), "span": span},
        syntax.SizeExpr: {"factors": (name,), "span": span},
        syntax.Assign: {"name": name, "expr": name, "span": span},
        Operation: {
            "name": "x",
            "stage": "x",
            "members": ("x",),
            "needs": frozenset({"y"}),
            "makes": ("x",),
            "stream": COMPUTE,
            "kind": Kind.COMPUTE,
            "pstage": 0,
            "spec": KernelSpec(1.0, 2.0, "f16"),
            "flops": 1.0,
            "nbytes": 2.0,
            "detail": "1 stage",
            "sync": True,
            "dest": 1,
            "batch_key": "4:sum",
        },  # fmt: skip
    }
    if cls is syntax.InputStmt:
        params = list(inspect.signature(cls.__init__).parameters)[1:]
        samples[cls] = {p: name if p == "name" else span if p == "span" else None for p in params}
    kwargs = samples[cls]
    made = cls(**kwargs)
    reference = _generated_init(cls)(**kwargs)
    for f in dataclasses.fields(cls):
        assert getattr(made, f.name) == getattr(reference, f.name), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, None)
