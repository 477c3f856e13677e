"""Helpers shared by the transformation tests."""

from __future__ import annotations

from pathlib import Path

from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.ir.nodes import Program
from cocoviz.ir.printer import format_program
from cocoviz.ir.transforms.base import Index, index

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p.stem for p in (ROOT / "samples").glob("*.coco"))

# Small sizes at which the reference runs every sample quickly, for each rank count tested.
SMALL = {
    "sgd": {"N": 96},
    "adam": {"N": 96},
    "lamb": {"N": 96},
    "megatron_mlp": {"B": 2, "S": 16, "H": 16},
    "megatron_attention_out": {"B": 2, "S": 16, "H": 16},
    "transformer_block": {"B": 2, "S": 16, "H": 16},
    "pipeline_stage": {"B": 2, "S": 16, "H": 16},
    "ulysses_attention": {"S": 64, "NH": 8, "D": 8},
    "moe_layer": {"R": 8, "T": 16, "E": 8, "C": 4, "H": 16, "F": 32},
    "megatron_sp_block": {"S": 16, "B": 2, "H": 16},
    "zero3_layer": {"T": 16, "H": 16, "F": 16},
    "zero1_tp_mlp": {"B": 8, "H": 16, "F": 32},  # the sample's "Small:" comment
    "moe_routed": {"R": 8, "T": 16, "E": 8, "C": 4, "H": 16, "F": 32},  # as moe_layer
}


def sample(name: str, defines: dict[str, int] | None = None, ranks: str | None = None) -> Program:
    r = RanksOverride.parse(ranks) if ranks else None
    return load_file(ROOT / "samples" / f"{name}.coco", defines, r)


def reparse(p: Program) -> Program:
    """Print and parse back (the result must equal `p`)."""
    return load_program(format_program(p), f"{p.name}.coco")


def assert_index_consistent(p: Program) -> None:
    """The cached (possibly derived) index agrees with one built from scratch."""
    derived, fresh = index(p), Index(p)
    assert derived.pos == fresh.pos
    assert derived.updates == fresh.updates
    assert derived.update_target == fresh.update_target
    assert all(derived.position(n) == i for i, n in enumerate(fresh.pos))
    groups = derived.group_table()
    assert groups == fresh.group_table()
    assert all(g is next(h for h in p.groups if h == g) for g in groups.values())
    assert derived.groups_exact == fresh.groups_exact
    assert derived.groups_sorted == fresh.groups_sorted
    names = set(fresh.pos) | set(fresh.inputs) | set(fresh.params)
    for n in names:
        assert derived.users(n) == fresh.users(n), n
