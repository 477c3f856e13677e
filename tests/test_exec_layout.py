"""Per-rank storage ↔ global value, and global flat indices (cocoviz.exec.layout)."""

from __future__ import annotations

import numpy as np
import pytest

from cocoviz.exec.layout import (
    global_flat_index,
    global_shape,
    is_contiguous_chunk,
    join_global,
    rank_shape,
    split_global,
)
from cocoviz.ir.types import FLAT, LOCAL, REPLICATED, DType, Layout, LayoutKind, Size, TensorType


def ty(shape: tuple[int, ...], layout: Layout) -> TensorType:
    return TensorType(DType.F32, tuple(Size(str(n), n) for n in shape), layout)


SLICED1 = Layout(LayoutKind.SLICED, 1)
SLICED2 = Layout(LayoutKind.SLICED, 2)

# (type, group, expected rank shape)
CASES = [
    (ty((4, 6), REPLICATED), 2, (4, 6)),
    (ty((4, 6), LOCAL), 2, (4, 6)),
    (ty((4, 6), FLAT), 2, (2, 6)),  # chunk = a block of dimension 0
    (ty((3, 8), FLAT), 4, (6,)),  # chunk of 6 crosses rows: 1-D
    (ty((1, 8, 6), FLAT), 4, (1, 2, 6)),  # first non-unit dimension
    (ty((4, 6), SLICED1), 3, (4, 2)),
    (ty((2, 3, 8), SLICED2), 4, (2, 3, 2)),
    (ty((2, 6, 4), SLICED1), 2, (2, 3, 4)),
]


@pytest.mark.parametrize(("t", "g", "shape"), CASES, ids=lambda x: str(x))
def test_rank_shape(t: TensorType, g: int, shape: tuple[int, ...]) -> None:
    assert rank_shape(t, g) == shape


@pytest.mark.parametrize(("t", "g", "shape"), CASES, ids=lambda x: str(x))
def test_global_flat_index_is_the_split_of_arange(
    t: TensorType, g: int, shape: tuple[int, ...]
) -> None:
    gs = global_shape(t, g)
    everything = np.arange(int(np.prod(gs)), dtype=np.int64).reshape(gs)
    parts = split_global(everything, t, g)
    for r in range(g):
        idx = global_flat_index(t, g, r)
        assert idx.dtype == np.int64
        assert idx.shape == shape
        np.testing.assert_array_equal(idx, parts[r])


@pytest.mark.parametrize(("t", "g", "shape"), CASES, ids=lambda x: str(x))
def test_split_join_round_trip(t: TensorType, g: int, shape: tuple[int, ...]) -> None:
    gs = global_shape(t, g)
    value = np.random.default_rng(1).standard_normal(gs).astype(np.float32)
    parts = split_global(value, t, g)
    assert [p.shape for p in parts] == [shape] * g
    np.testing.assert_array_equal(join_global(parts, t, g), value)


def test_flat_chunks_are_contiguous_runs() -> None:
    t = ty((3, 8), FLAT)
    idx = [global_flat_index(t, 4, r) for r in range(4)]
    np.testing.assert_array_equal(np.concatenate(idx), np.arange(24))
    assert is_contiguous_chunk(t, 4)
    assert not is_contiguous_chunk(ty((4, 6), SLICED1), 3)


def test_sliced_dim_indices() -> None:
    # x[4, 6] sliced(1) over 3 ranks: rank 1 holds columns 2 and 3 of every row.
    idx = global_flat_index(ty((4, 6), SLICED1), 3, 1)
    np.testing.assert_array_equal(idx, [[2, 3], [8, 9], [14, 15], [20, 21]])


def test_local_indices_index_the_stack() -> None:
    idx = global_flat_index(ty((2, 3), LOCAL), 4, 2)
    np.testing.assert_array_equal(idx, np.arange(12, 18).reshape(2, 3))
    assert global_shape(ty((2, 3), LOCAL), 4) == (4, 2, 3)


def test_join_replicated_requires_agreement() -> None:
    t = ty((2, 2), REPLICATED)
    a = np.zeros((2, 2), np.float32)
    b = a.copy()
    np.testing.assert_array_equal(join_global([a, b], t, 2), a)
    b[1, 1] = 1.0
    with pytest.raises(AssertionError, match="differs between rank 0 and rank 1"):
        join_global([a, b], t, 2)


def test_join_replicated_compares_bits_not_values() -> None:
    t = ty((1,), REPLICATED)
    # -0.0 == 0.0 but the bits differ; NaN != NaN but identical NaNs are the same bits.
    with pytest.raises(AssertionError):
        join_global([np.array([0.0], np.float32), np.array([-0.0], np.float32)], t, 2)
    nan = np.array([np.nan], np.float32)
    assert np.isnan(join_global([nan, nan.copy()], t, 2)[0])


def test_split_rejects_wrong_shape() -> None:
    with pytest.raises(ValueError, match="expected"):
        split_global(np.zeros((2, 3)), ty((2, 3), LOCAL), 4)
