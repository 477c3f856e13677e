"""The numpy reference of routing by index on one rank's arrays (docs/language.md,
routing): `gather`, `scatter_add`, `topk`/`topk_indices` and `capacity_slots`. Every
function takes and returns the rank's arrays in their compute types (indices int64);
the emitted kernels (cocoviz/emit/routing.py) compute the same numbers in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.generic]


def gather(x: Array, idx: Array, d: int) -> Array:
    """result[b…, i…, r…] = x[b…, idx[b…, i…], r…]; an index outside [0, n) gives 0."""
    xs = x.shape
    B, N, R = math.prod(xs[:d]), xs[d], math.prod(xs[d + 1 :])
    ish = idx.shape[d:]
    M = math.prod(ish)
    xf = x.reshape(B, N, R)
    i = idx.reshape(B, M).astype(np.int64)
    valid = (i >= 0) & (i < N)
    safe = np.where(valid, i, 0)
    out = np.take_along_axis(xf, safe[:, :, None], axis=1)
    out = np.where(valid[:, :, None], out, np.zeros((), dtype=x.dtype))
    return out.reshape(tuple(xs[:d]) + tuple(ish) + tuple(xs[d + 1 :]))


def scatter_add(
    shape: Sequence[int], dtype: npt.DTypeLike, idx: Array, src: Array, d: int
) -> Array:
    """result[b…, n, r…] = Σ over the index positions i… (in row-major order) with
    idx[b…, i…] = n of src[b…, i…, r…] (a dimension of src of extent 1 among the index
    dimensions is the same row for every index); an index outside [0, n) adds nothing.
    Accumulated in `dtype` (the result's compute type), starting from 0."""
    B, N, R = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1 :])
    ish = idx.shape[d:]
    M = math.prod(ish)
    full = tuple(shape[:d]) + tuple(ish) + tuple(shape[d + 1 :])
    s = np.broadcast_to(src, full).reshape(B, M, R).astype(dtype)
    i = idx.reshape(B, M).astype(np.int64)
    out = np.zeros((B, N, R), dtype=dtype)
    valid = (i >= 0) & (i < N)
    # in index order, one addition at a time, as the emitted loop adds them
    for m in range(M):
        rows = np.nonzero(valid[:, m])[0]
        out[rows, i[rows, m], :] += s[rows, m, :]
    return out.reshape(tuple(shape))


def topk_order(x: Array, k: int, d: int) -> npt.NDArray[np.int64]:
    """The positions along `d` of the k largest entries, largest first; equal values in
    ascending position order (int64)."""
    xm = np.moveaxis(x, d, -1)
    key = -xm.astype(np.float64) if np.issubdtype(xm.dtype, np.floating) else -xm.astype(np.int64)
    order = np.argsort(key, axis=-1, kind="stable")[..., :k].astype(np.int64)
    return np.moveaxis(order, -1, d)


def topk(x: Array, k: int, d: int) -> Array:
    return np.take_along_axis(x, topk_order(x, k, d), axis=d)


def capacity_slots(expert: Array, E: int, C: int) -> Array:
    """Each (token t, choice j) of expert[…, T, K]: its slot e·C + c in the [E·C] buffer
    of its expert e, or -1 when dropped or not routed (e outside [0, E)). c counts the
    earlier assignments to e in the group (the leading dimensions), choice-major — every
    token's first choice before any second choice — and in token order within a choice
    (GShard's cumsum over a one-hot); c ≥ C drops."""
    *lead, T, K = expert.shape
    G = math.prod(lead)
    e = expert.reshape(G, T, K).astype(np.int64)
    out = np.full((G, T, K), -1, dtype=np.int64)
    used = np.zeros((G, E), dtype=np.int64)
    experts = np.arange(E)
    for j in range(K):
        ej = e[:, :, j]
        onehot = (ej[:, :, None] == experts[None, None, :]).astype(np.int64)  # [G, T, E]
        pos = np.cumsum(onehot, axis=1) - 1 + used[:, None, :]
        routed = (ej >= 0) & (ej < E)
        c = np.take_along_axis(pos, np.where(routed, ej, 0)[:, :, None], axis=2)[:, :, 0]
        keep = routed & (c < C)
        out[:, :, j] = np.where(keep, ej * C + c, -1)
        used += onehot.sum(axis=1)
    return out.reshape(expert.shape)
