"""Per-rank storage of a value and its global view (docs/semantics-notes.md).

For a `TensorType` and a group of G ranks:

- **replicated**: every rank stores the whole tensor; the global value is rank 0's copy
  (all ranks must agree bit for bit).
- **local**: every rank stores a full-shape tensor of its own; the global value is the
  stack ``[G, *shape]``; rank r's element i has global flat index ``r·numel + i``.
- **flat sliced**: rank r stores elements ``[r·numel/G, (r+1)·numel/G)`` of the row-major
  flattening. When that chunk is a block of the first non-unit dimension (`block_dim`)
  it is *viewed* with the block shape (same memory order), so it broadcasts like a
  `sliced(d)` block; otherwise it is 1-D.
- **sliced(d)**: rank r stores block r along dimension d (extent ``shape[d]/G``).

`rank_shape` gives the shape of a rank's array, `split_global`/`join_global` convert
between the global value and the per-rank arrays, and `global_flat_index` gives the
global flat index of each element a rank stores (dropout, inputs and broadcast operands
use it).

Inside an overlapped group that chunks rows (docs/schedules.md, overlap) chunk k of a
value on a rank is laid out as the emitter lays it out (`cocoviz.emit.plan.View`):
`chunk_positions` says which elements it holds, `locate` finds wanted elements among
held ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from cocoviz.ir.types import TensorType, block_dim, dp_view, shape_values

__all__ = [
    "alltoall_pack",
    "alltoall_unpack",
    "chunk_positions",
    "chunk_range",
    "chunked_slices",
    "global_flat_index",
    "global_shape",
    "grid_global_shape",
    "join_grid",
    "split_grid",
    "is_contiguous_chunk",
    "join_global",
    "locate",
    "rank_positions",
    "rank_shape",
    "rank_slices",
    "split_global",
    "take_rank_part",
]

Array = npt.NDArray[Any]
IndexArray = npt.NDArray[np.int64]


def global_shape(ty: TensorType, group: int) -> tuple[int, ...]:
    """Shape of the global value: the declared shape, or ``[G, *shape]`` for local."""
    shape = shape_values(ty.shape)
    return (group, *shape) if ty.layout.is_local else shape


def _block(ty: TensorType, group: int) -> int | None:
    return block_dim(ty.layout, ty.shape, group)


def rank_shape(ty: TensorType, group: int) -> tuple[int, ...]:
    """Shape of the array one rank stores."""
    shape = shape_values(ty.shape)
    lay = ty.layout
    if not lay.is_sliced:
        return shape
    d = _block(ty, group)
    if d is None:
        return (ty.numel // group,)
    return shape[:d] + (shape[d] // group,) + shape[d + 1 :]


def rank_slices(ty: TensorType, group: int, rank: int) -> tuple[slice, ...] | None:
    """For a block-partitioned sliced value: the index of rank's block in the global
    array; None for flat chunks that are not blocks and for non-sliced layouts."""
    d = _block(ty, group)
    if d is None:
        return None
    n = ty.shape[d].value // group
    return (slice(None),) * d + (slice(rank * n, (rank + 1) * n),)


def chunk_range(ty: TensorType, group: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's flat chunk for a flat-sliced value."""
    c = ty.numel // group
    return rank * c, (rank + 1) * c


def is_contiguous_chunk(ty: TensorType, group: int) -> bool:
    """Whether each rank's elements form one contiguous run of global flat indices
    (every layout except a block partition along a dimension after the first non-unit one)."""
    if not ty.layout.is_sliced:
        return True
    d = _block(ty, group)
    if d is None:
        return True
    return all(s.value == 1 for s in ty.shape[:d])


def take_rank_part(value: Array, ty: TensorType, group: int, rank: int) -> Array:
    """Rank's part of a global value (for local: its row of the ``[G, *shape]`` stack).

    For sliced layouts this is `slice(x)` semantics: a view where possible.
    """
    lay = ty.layout
    if lay.is_replicated:
        return value
    if lay.is_local:
        return value[rank]
    sl = rank_slices(ty, group, rank)
    if sl is not None:
        return value[sl]
    lo, hi = chunk_range(ty, group, rank)
    return value.reshape(-1)[lo:hi]


def alltoall_pack(part: Array, to: int, group: int) -> Array:
    """One rank's part of an all-to-all operand in destination order: the blocks of
    dimension `to`, block j (for rank j) after block j-1, flattened (MPI's and NCCL's
    ``sendbuf`` layout)."""
    blocks = np.split(np.asarray(part), group, axis=to)
    return np.concatenate([b.reshape(-1) for b in blocks])


def alltoall_unpack(recv: Array, out_shape: tuple[int, ...], frm: int, group: int) -> Array:
    """A rank's result part from its all-to-all receive buffer: source s's block lands
    in block s of dimension `frm` (`out_shape` is the rank's result shape)."""
    block = list(out_shape)
    block[frm] //= group
    parts = np.split(np.asarray(recv).reshape(-1), group)
    return np.concatenate([p.reshape(block) for p in parts], axis=frm)


def split_global(value: npt.ArrayLike, ty: TensorType, group: int) -> list[Array]:
    """The per-rank arrays of a global value (copies; replicated ranks get equal copies)."""
    v = np.asarray(value)
    expect = global_shape(ty, group)
    if v.shape != expect:
        raise ValueError(f"global value has shape {v.shape}, expected {expect} for {ty}")
    return [
        np.array(take_rank_part(v, ty, group, r)).reshape(rank_shape(ty, group))
        for r in range(group)
    ]


def join_global(per_rank: Sequence[npt.ArrayLike], ty: TensorType, group: int) -> Array:
    """The global value of per-rank arrays: the inverse of `split_global`.

    Replicated: rank 0's copy, after asserting every rank holds the same bits.
    """
    arrays = [np.asarray(a) for a in per_rank]
    if len(arrays) != group:
        raise ValueError(f"expected {group} per-rank arrays, got {len(arrays)}")
    want = rank_shape(ty, group)
    for r, a in enumerate(arrays):
        if a.shape != want:
            raise ValueError(f"rank {r} stores shape {a.shape}, expected {want} for {ty}")
    lay = ty.layout
    if lay.is_replicated:
        first = arrays[0]
        for r, a in enumerate(arrays[1:], start=1):
            if a is not first and not _same_bits(first, a):
                raise AssertionError(f"replicated value differs between rank 0 and rank {r} ({ty})")
        return first
    if lay.is_local:
        return np.stack(arrays)
    d = _block(ty, group)
    shape = shape_values(ty.shape)
    if d is None:
        return np.concatenate([a.reshape(-1) for a in arrays]).reshape(shape)
    return np.concatenate(arrays, axis=d)


def _same_bits(a: Array, b: Array) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(
        np.array_equal(
            np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
        )
    )


def global_flat_index(ty: TensorType, group: int, rank: int) -> IndexArray:
    """Global flat index of each element rank stores, in the rank's array shape.

    Replicated: the index into the global shape; local: the index into ``[G, *shape]``
    (``rank·numel + i``); sliced: the index the element has in the global tensor.
    """
    lay = ty.layout
    n = ty.numel
    shape = rank_shape(ty, group)
    if lay.is_replicated:
        return np.arange(n, dtype=np.int64).reshape(shape)
    if lay.is_local:
        return (np.arange(n, dtype=np.int64) + np.int64(rank * n)).reshape(shape)
    if is_contiguous_chunk(ty, group):
        lo, hi = chunk_range(ty, group, rank)
        return np.arange(lo, hi, dtype=np.int64).reshape(shape)
    sl = rank_slices(ty, group, rank)
    assert sl is not None
    return block_flat_index(shape_values(ty.shape), sl)


def block_flat_index(shape: tuple[int, ...], index: tuple[slice, ...]) -> IndexArray:
    """Global flat indices of the elements of ``x[index]`` for x of `shape`, built from
    per-dimension ranges (no temporary of the global size)."""
    strides = [1] * len(shape)
    for j in range(len(shape) - 2, -1, -1):
        strides[j] = strides[j + 1] * shape[j + 1]
    out: IndexArray = np.zeros((), dtype=np.int64)
    for j, n in enumerate(shape):
        sl = index[j] if j < len(index) else slice(None)
        lo, hi, _ = sl.indices(n)
        ax = np.arange(lo, hi, dtype=np.int64) * np.int64(strides[j])
        out = out[..., None] + ax
    return out


# ---------------------------------------------------------- overlapped groups (rows)


def chunked_slices(ty: TensorType) -> bool:
    """Whether a value of type `ty` made inside an overlapped group that chunks rows is laid
    out chunk by chunk: a flat `sliced` value (`sliced(0)` is its normal form). A value
    sliced along a later dimension keeps its blocks, like a whole value (the emitter's
    `chunked` and `block` views, `cocoviz.emit.body.view_of`)."""
    return ty.layout.is_sliced and not ty.layout.dim


def rank_positions(ty: TensorType, group: int, rank: int) -> IndexArray:
    """The position of each element `rank` stores, in storage order (flat): its row-major
    index in the value's declared shape — for a local value, in the rank's own tensor."""
    if ty.layout.is_local:
        return np.arange(ty.numel, dtype=np.int64)
    return global_flat_index(ty, group, rank).reshape(-1)


def chunk_positions(ty: TensorType, group: int, rank: int, chunks: int, k: int) -> IndexArray:
    """The positions (as `rank_positions`) of the elements of chunk `k` of a value of type
    `ty` that `rank` holds inside an overlapped group of `chunks` chunks that chunks rows,
    in storage order (docs/schedules.md, overlap; `cocoviz.emit.plan.View`):

    - a value laid out chunk by chunk (`chunked_slices`): in chunk k rank r holds the
      global elements from ``k·n/K + r·n/(K·G)`` on, ``n/(K·G)`` of them;
    - any other value: the k-th contiguous 1/K of the rank's storage — block k of the rows
      of a replicated or local value, or of the rank's block of a `sliced(d)` value.

    Chunk k of every value is the k-th 1/K of the rank's storage of it, which is why a
    matmul's rows, a collective's buffers and an elementwise kernel's elements line up."""
    n = ty.numel
    if chunked_slices(ty):
        c = n // (chunks * group)
        lo = k * (n // chunks) + rank * c
        return np.arange(lo, lo + c, dtype=np.int64)
    held = rank_positions(ty, group, rank)
    c = held.size // chunks
    return held[k * c : (k + 1) * c]


def locate(held: IndexArray, wanted: IndexArray) -> slice | IndexArray | None:
    """Where each of the `wanted` positions is among the `held` ones (both flat): None
    when they are the same sequence, a slice when they are a contiguous run of it, else
    an index array. Raises `LookupError` when a wanted position is not held."""
    if held.size == wanted.size and np.array_equal(held, wanted):
        return None
    if held.size == 0:
        if wanted.size == 0:
            return slice(0, 0)
        raise LookupError(f"position {int(wanted[0])} is not held (nothing is)")
    lo = int(held[0])
    if int(held[-1]) - lo == held.size - 1 and (held.size < 2 or bool(np.all(np.diff(held) == 1))):
        idx = wanted - np.int64(lo)
    else:
        order = np.argsort(held, kind="stable")
        srt = held[order]
        at = np.minimum(np.searchsorted(srt, wanted), srt.size - 1)
        if not np.array_equal(srt[at], wanted):
            miss = wanted[srt[at] != wanted]
            raise LookupError(f"position {int(miss[0])} is not held")
        idx = order[at]
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= held.size):
        bad = wanted[(idx < 0) | (idx >= held.size)]
        raise LookupError(f"position {int(bad[0])} is not held")
    if idx.size and int(idx[-1]) - int(idx[0]) == idx.size - 1:
        if idx.size < 2 or bool(np.all(np.diff(idx) == 1)):
            return slice(int(idx[0]), int(idx[0]) + idx.size)
    return idx.astype(np.int64, copy=False)


# ---------------------------------------------------------------------- grids with dp
# On a grid `ranks dp=D, tp=T, …` a pipeline stage holds D·T ranks, index d·T + t, and a
# value's dp layout spreads each tp rank's part over the D ranks of its dp group
# (docs/language.md, rank grids). The global value of a value local over dp is the stack
# ``[D, *tp_global]`` of every replica's.


def grid_global_shape(ty: TensorType, group: int, dp: int) -> tuple[int, ...]:
    """Shape of the global value on a grid with D = `dp` replicas."""
    shape = global_shape(ty, group)
    return (dp, *shape) if ty.dp.is_local else shape


def split_grid(value: npt.ArrayLike, ty: TensorType, group: int, dp: int) -> list[Array]:
    """The D·T per-rank arrays of a global value (index d·T + t)."""
    v = np.asarray(value)
    if ty.dp.is_local:
        out: list[Array] = []
        for d in range(dp):
            out += split_global(v[d], ty, group)
        return out
    tp_parts = split_global(v, ty, group)
    if ty.dp.is_replicated:
        return tp_parts * dp
    view = dp_view(ty, group)
    want = rank_shape(view, dp)
    return [
        np.array(take_rank_part(tp_parts[t], view, dp, d)).reshape(want)
        for d in range(dp)
        for t in range(group)
    ]


def join_grid(per_rank: Sequence[npt.ArrayLike], ty: TensorType, group: int, dp: int) -> Array:
    """The global value of D·T per-rank arrays: the inverse of `split_grid`."""
    arrays = [np.asarray(a) for a in per_rank]
    if len(arrays) != group * dp:
        raise ValueError(f"expected {group * dp} per-rank arrays, got {len(arrays)}")
    replicas = []
    if not ty.dp.is_sliced:
        replicas = [join_global(arrays[d * group : (d + 1) * group], ty, group) for d in range(dp)]
    if ty.dp.is_local:
        return np.stack(replicas)
    if ty.dp.is_replicated:
        for d, r in enumerate(replicas[1:], start=1):
            if r is not replicas[0] and not _same_bits(replicas[0], r):
                raise AssertionError(f"dp-replicated value differs between replica 0 and {d} ({ty})")
        return replicas[0]
    view = dp_view(ty, group)
    tp_shape = rank_shape(ty, group)
    tp_parts = [
        join_global([arrays[d * group + t] for d in range(dp)], view, dp).reshape(tp_shape)
        for t in range(group)
    ]
    return join_global(tp_parts, ty, group)
