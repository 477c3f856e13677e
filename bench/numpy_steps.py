"""Hand-written mpi4py + numpy optimizer steps for samples/adam, lamb and sgd: what a
user would write without cocoviz, the baseline of bench/bench_emitted.py.

`update(name, g, w, m, v, lo, hi, params, group_norm)` applies one step to the elements
``[lo, hi)`` of the replicated state, given the summed gradient of those elements
(f32, already reduced across ranks); it returns the new (w, m, v) of that range. The
same function runs in-process (checked against the cocoviz reference) and under
mpiexec (timed), where ``ar_c`` allreduces the whole gradient and every rank updates
everything, and ``fused`` reduce-scatters, updates its slice and allgathers the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

F32 = np.float32
Arr = Any

PARAMS: dict[str, dict[str, float]] = {
    "adam": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "t": 1.0},
    "lamb": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "wd": 0.01},
    "sgd": {"lr": 0.01, "mu": 0.9},
}
HAS_V = {"adam": True, "lamb": True, "sgd": False}
GRAD_DTYPE = {"adam": np.float16, "lamb": np.float32, "sgd": np.float32}


def update(
    name: str,
    g: Arr,
    w: Arr,
    m: Arr,
    v: Arr | None,
    p: dict[str, float],
    allsum: Callable[[float], float] = lambda x: x,
) -> tuple[Arr, Arr, Arr | None]:
    """One step on a range; `allsum` sums a scalar over the ranks (lamb's norms)."""
    if name == "sgd":
        m1 = F32(p["mu"]) * m + g
        return w - F32(p["lr"]) * m1, m1, None
    assert v is not None
    b1, b2 = F32(p["beta1"]), F32(p["beta2"])
    m1 = b1 * m + (F32(1) - b1) * g
    v1 = b2 * v + (F32(1) - b2) * g * g
    if name == "adam":
        t = F32(p["t"])
        mh = m1 / (F32(1) - b1**t)
        vh = v1 / (F32(1) - b2**t)
        return w - F32(p["lr"]) * mh / (np.sqrt(vh) + F32(p["eps"])), m1, v1
    r = m1 / (F32(1) - b1) / (np.sqrt(v1 / (F32(1) - b2)) + F32(p["eps"])) + F32(p["wd"]) * w
    rn = F32(np.sqrt(allsum(float(np.dot(r.astype(np.float64), r.astype(np.float64))))))
    wn = F32(np.sqrt(allsum(float(np.dot(w.astype(np.float64), w.astype(np.float64))))))
    return w - F32(p["lr"]) * (wn / rn) * r, m1, v1


# The timed script (run under mpiexec): argv = name schedule n iters.
SCRIPT = """
import json, sys, time
import numpy as np
from mpi4py import MPI
sys.path.insert(0, {bench!r})
from numpy_steps import GRAD_DTYPE, HAS_V, PARAMS, update
name, sched, n, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
comm = MPI.COMM_WORLD
G, r = comm.size, comm.rank
rng = np.random.default_rng(r)
g = rng.random(n, dtype=np.float32).astype(GRAD_DTYPE[name])
w = np.ones(n, np.float32); m = np.zeros(n, np.float32)
v = np.zeros(n, np.float32) if HAS_V[name] else None
p = PARAMS[name]
allsum = lambda x: comm.allreduce(x, op=MPI.SUM)
times = []
for it in range(iters + 3):
    comm.Barrier()
    t0 = time.perf_counter()
    gw = g.astype(np.float32)  # f16 gradients travel widened to f32, as cocoviz does
    if sched == "ar_c":
        gs = np.empty_like(gw)
        comm.Allreduce(gw, gs, op=MPI.SUM)
        w2, m2, v2 = update(name, gs, w, m, v, p)
    else:
        k = n // G
        gs = np.empty(k, np.float32)
        comm.Reduce_scatter_block(gw, gs, op=MPI.SUM)
        sl = slice(r * k, (r + 1) * k)
        ws, m2, v2 = update(name, gs, w[sl], m[sl], None if v is None else v[sl], p, allsum)
        w2 = np.empty_like(w)
        comm.Allgather(np.ascontiguousarray(ws), w2)
    comm.Barrier()
    if it >= 3:
        times.append(time.perf_counter() - t0)
if r == 0:
    print(json.dumps(times))
"""
