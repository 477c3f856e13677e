"""Time of one compute kernel: a roofline with launch cost and shape-dependent GEMMs.

Elementwise, row-wise and reduction kernels are a roofline over the CUDA-core peak and
HBM, each derated by an achievable fraction::

    t = max(launch_overhead, kernel_gap + max(flops / (vector_peak·eff),
                                              bytes / (hbm·hbm_eff(bytes))))

Kernels issued back to back cost at least the host's launch time (the GPU waits for the
next launch) and otherwise their roofline plus the GPU-side gap between kernels. Kernels
that are nodes of a CUDA graph (``graph=True``: the emitted launcher captures one
iteration and launches it with one ``cudaGraphLaunch``) do not wait for the host: they
cost their roofline plus the GPU-side gap, and the host's launch is paid once per
iteration (``graph_launch_time``)::

    t_graph = kernel_gap + body
``hbm_eff`` rises with the bytes a kernel moves (Calculon's curve, interpolated in
log-size so time stays monotone in size).

A matmul ``[M, K] × [K, N]`` runs as CTA tiles ``tm × tn`` over the SMs; its compute
time is waves × tile time, which models tile quantization (ragged edge tiles) and wave
quantization (the last wave leaves SMs idle), times a K-dependent efficiency
``K / (K + k_half)`` for each tile's prologue/epilogue. Like cuBLAS's heuristics, the
model picks the best of the profile's tile shapes and of split-K 1–16. So Megatron's
``[B·S, H/16] × [H/16, H]`` (K = 192) is far below peak where a square GEMM is not.

Computation that overlaps communication runs on fewer SMs (the collective's channels
each hold one), loses a further fraction to interference (Calculon's processor usage),
and shares HBM with the collective's traffic: pass ``contention=comm_contention(hw,
cost)``.

Functions the simulator calls (times in seconds):

- ``kernel_time(hw, flops, nbytes, dtype, *, contention=NO_CONTENTION, launch=True)``
- ``matmul_time(hw, M, N, K, dtype, *, contention=NO_CONTENTION, launch=True)``
- ``matmul_cost(...) -> MatmulCost`` (the same with the chosen tile, waves, efficiency)
- ``chunked_matmul_times(hw, M, N, K, dtype, chunks, *, contention=..., launch=True)``
  and ``chunk_efficiency(hw, M, N, K, dtype, chunks)`` for K-chunk overlap
- ``comm_contention(hw, cost) -> Contention``, ``combine(*contentions)``
- ``graph_launch_time(hw)``: the host's launch of one CUDA graph (once per iteration)

Each of the first four takes ``graph=False``; ``graph=True`` prices a kernel or GEMM as a
node of a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from cocoviz.ir.types import DTYPE_NAMES, DType
from cocoviz.sim.collectives import CollCost
from cocoviz.sim.hardware import HalfSlowdown, Hardware, Link, hbm_efficiency

__all__ = [
    "NO_CONTENTION",
    "Contention",
    "MatmulCost",
    "chunk_efficiency",
    "chunked_matmul_times",
    "combine",
    "comm_contention",
    "graph_launch_time",
    "hbm_efficiency",
    "kernel_time",
    "matmul_cost",
    "matmul_efficiency",
    "matmul_time",
]


_SPLIT_K = (1, 2, 4, 8, 16)
_MIN_SPLIT_K_DEPTH = 128  # cuBLAS does not split K below one tile's depth of a few k-steps [A]
_PARTIAL_BYTES = 4  # split-K partial sums are f32, written and read back once each


@dataclass(frozen=True)
class Contention:
    """What concurrently running communication takes from a compute kernel."""

    sm_fraction: float = 0.0
    """Fraction of the SMs held by communication kernels (one per NCCL channel)."""
    hbm_gbps: float = 0.0
    """HBM bandwidth the communication consumes."""
    interference: float = 0.0
    """Fraction of compute throughput lost to overlap in total (Calculon's processor
    usage); the loss is the larger of this and ``sm_fraction``."""

    @property
    def compute_lost(self) -> float:
        return min(0.95, max(self.sm_fraction, self.interference))


NO_CONTENTION = Contention()


def combine(*contentions: Contention) -> Contention:
    """Several collectives running at once: SMs and HBM add up, interference does not."""
    return Contention(
        sm_fraction=min(0.95, sum(c.sm_fraction for c in contentions)),
        hbm_gbps=sum(c.hbm_gbps for c in contentions),
        interference=max((c.interference for c in contentions), default=0.0),
    )


def comm_contention(hw: Hardware, cost: CollCost) -> Contention:
    """The contention a running collective imposes on compute that overlaps it.

    SMs: one per channel. HBM: each byte a rank puts on the wire costs
    ``hbm_bytes_per_reduce_byte`` (reductions) or ``hbm_bytes_per_copy_byte`` bytes of
    HBM traffic, at the rank's wire rate (its bus bandwidth).
    """
    if cost.time_s <= 0:
        return NO_CONTENTION
    reduces = cost.coll.row.reduces
    per_byte = (
        hw.overlap.hbm_bytes_per_reduce_byte if reduces else hw.overlap.hbm_bytes_per_copy_byte
    )
    slowdown = (
        hw.overlap.compute_slowdown_net
        if cost.link is Link.NET
        else hw.overlap.compute_slowdown_nvlink
    )
    return Contention(
        sm_fraction=min(0.95, cost.channels / hw.gpu.sms),
        hbm_gbps=per_byte * cost.bus_bw_gbps,
        interference=slowdown,
    )


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPE_NAMES)})")


def _memory_s(
    hw: Hardware, nbytes: float, contention: Contention, span: float | None = None
) -> float:
    """``nbytes`` at the memory curve's rate for ``span`` bytes (default: nbytes)."""
    if nbytes <= 0:
        return 0.0
    bandwidth = hw.gpu.hbm_gbps * hbm_efficiency(hw, nbytes if span is None else span)
    available = max(0.1 * bandwidth, bandwidth - contention.hbm_gbps)
    return nbytes / (available * 1e9)


FRESH_LINES = 1.5
"""Line transfers per byte counted of the kernel the memory curve is fitted on (``y =
f(x)``, a fresh ``y``): a read moves its line in, a store into a line the kernel did not
read fetches it first and writes it back (write-allocate): 3 per 2 bytes counted."""


def _lines_s(
    hw: Hardware, nbytes: float, contention: Contention, span: float, lines: float
) -> float:
    """``nbytes`` a CPU kernel reads or stores, whose storage lies ``span`` bytes back, at
    ``lines`` transfers per byte beyond the caches (a read 1, a store into lines the
    kernel read 1, one into lines it did not 2): the cached rate, and of the memory
    curve's time beyond it the share those transfers are of the fitted kernel's."""
    cached = max(hw.gpu.hbm_efficiency, key=lambda point: point[1])[0]
    near = _memory_s(hw, nbytes, contention, span=cached)
    far = _memory_s(hw, nbytes, contention, span=max(span, cached))
    return near + lines / FRESH_LINES * (far - near)


def _with_launch(hw: Hardware, body_s: float, launch: bool, graph: bool = False) -> float:
    if not launch:
        return body_s
    if graph:  # the host launched the whole graph once: only the GPU-side gap is left
        return hw.gpu.kernel_gap_us * 1e-6 + body_s
    return max(hw.gpu.launch_overhead_us * 1e-6, hw.gpu.kernel_gap_us * 1e-6 + body_s)


def graph_launch_time(hw: Hardware) -> float:
    """Seconds of the host's ``cudaGraphLaunch`` of one iteration's graph: one launch,
    paid once per iteration instead of once per kernel (docs/cost-model.md)."""
    return hw.gpu.launch_overhead_us * 1e-6


def kernel_time(
    hw: Hardware,
    flops: float,
    nbytes: float,
    dtype: str = "f32",
    *,
    contention: Contention = NO_CONTENTION,
    launch: bool = True,
    graph: bool = False,
    converts: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    calls: float = 0.0,
    reuse: tuple[tuple[float, float, float], ...] = (),
    chained: float = 0.0,
    footprint: float = 0.0,
) -> float:
    """Roofline time of one non-matmul kernel (elementwise, row-wise, reduction).

    ``launch=False`` gives the body alone, for work inside a fused kernel; ``graph=True``
    prices it as a node of a CUDA graph (no host launch per kernel). ``converts``: the
    f16 elements the kernel reads and writes, then the bf16 ones, each widened to or
    narrowed from f32 at ``gpu.convert_ns`` (work beside the FLOPs). ``calls``: the math
    library calls it makes per element (exp, log, tanh, pow), each at
    ``gpu.libm_call_ns``; a kernel that makes them runs its FLOPs ``gpu.scalar_slowdown``
    times slower and its conversions ``gpu.scalar_convert_slowdown`` times (the CPU
    target's loop around a libm call does not vectorize). ``reuse``: (bytes, reuse
    distance, line transfers per byte beyond the caches) of the values it reads and of
    those it writes, the distance the bytes the rank touched since it last touched each (a
    read moves a line, a store into a line the kernel did not read fetches it and writes it
    back, one into a line it read writes it back: 1, 2, 1); on CPU ranks each moves at the
    memory curve's rate for the larger of its distance and the kernel's footprint
    (`_lines_s`: a value the caches no longer hold comes from memory, however small the
    kernel), the rest of the traffic at the footprint's. ``footprint``: the distinct bytes
    the kernel touches (an update's store into the lines it read counted once; 0:
    ``nbytes``), the size the memory curve prices. On CPU ranks the arithmetic of a 16-bit
    float kernel is f32's (the CPU target computes in float). ``chained``: the elements its
    ``sum``, ``norm`` and ``amax`` accumulate, each at ``gpu.sum_chain_ns`` beside the FLOPs.
    """
    _check_dtype(dtype)
    if flops < 0 or nbytes < 0:
        raise ValueError("flops and bytes must be non-negative")
    arith = "f32" if hw.gpu.arch == "cpu" and dtype in ("f16", "bf16") else dtype
    rate = hw.gpu.vector_tflops[arith] * 1e12 * hw.gpu.vector_efficiency
    ns = hw.gpu.convert_ns
    f16_s = (converts[0] * ns.f16_widen + converts[1] * ns.f16_narrow) * 1e-9
    bf16_s = (converts[2] * ns.bf16_widen + converts[3] * ns.bf16_narrow) * 1e-9
    if calls and hw.gpu.libm_call_ns > 0:
        # the loop calls libm element by element: the rest of its work runs without SIMD too
        slow = hw.gpu.scalar_slowdown
        halves = hw.gpu.scalar_convert_slowdown or HalfSlowdown(slow, slow)
        flops, f16_s, bf16_s = flops * slow, f16_s * halves.f16, bf16_s * halves.bf16
    convert_s = f16_s + bf16_s
    work_s = (flops / rate if flops else 0.0) + convert_s + calls * hw.gpu.libm_call_ns * 1e-9
    work_s += chained * hw.gpu.sum_chain_ns * 1e-9
    compute_s = work_s / (1.0 - contention.compute_lost) if work_s else 0.0
    if hw.gpu.arch == "cpu" and reuse and nbytes > 0:
        span = footprint or nbytes
        near = max(0.0, nbytes - sum(b for b, _, _ in reuse))
        memory_s = _memory_s(hw, near, contention, span=span) + sum(
            _lines_s(hw, b, contention, max(d, span), lines) for b, d, lines in reuse
        )
    else:
        memory_s = _memory_s(hw, nbytes, contention)
    return _with_launch(hw, max(compute_s, memory_s), launch, graph)


@dataclass(frozen=True)
class MatmulCost:
    """One GEMM as the model runs it."""

    time_s: float
    """Including launch (unless asked without)."""
    compute_s: float
    memory_s: float
    tile: tuple[int, int]
    split_k: int
    waves: int
    flops: float
    efficiency: float
    """Achieved FLOP/s over the dtype's peak, launch excluded."""


def matmul_cost(
    hw: Hardware,
    m: int,
    n: int,
    k: int,
    dtype: str = "f16",
    *,
    contention: Contention = NO_CONTENTION,
    launch: bool = True,
    graph: bool = False,
) -> MatmulCost:
    """``[m, k] × [k, n]`` (leading batch dimensions folded into m)."""
    return _matmul_cost(hw, m, n, k, dtype, contention, launch, graph)


@lru_cache(maxsize=1 << 16)
def _matmul_cost(
    hw: Hardware,
    m: int,
    n: int,
    k: int,
    dtype: str,
    contention: Contention,
    launch: bool,
    graph: bool,
) -> MatmulCost:
    _check_dtype(dtype)
    if m < 0 or n < 0 or k < 0:
        raise ValueError(f"matmul dimensions must be non-negative, got M={m} N={n} K={k}")
    flops = 2.0 * m * n * k
    size = DType(dtype).itemsize
    if flops == 0:
        memory_s = _memory_s(hw, m * n * size, contention)
        return MatmulCost(
            _with_launch(hw, memory_s, launch, graph), 0.0, memory_s, (0, 0), 1, 0, 0.0, 0.0
        )
    gpu = hw.gpu
    peak = gpu.matmul_tflops[dtype] * 1e12
    per_sm = peak * gpu.matmul_efficiency / gpu.sms
    sms = max(1, int(gpu.sms * (1.0 - contention.sm_fraction)))
    # Interference beyond the SMs the collective holds slows every remaining SM.
    extra = (1.0 - contention.sm_fraction) / (1.0 - contention.compute_lost)
    base_bytes = (m * k + k * n + m * n) * size
    shapes = {(tm, tn, te) for tm, tn, te in gpu.matmul_tiles} | {
        (tn, tm, te) for tm, tn, te in gpu.matmul_tiles
    }
    best: tuple[float, float, float, tuple[int, int], int, int] | None = None
    for tm, tn, tile_eff in sorted(shapes, key=lambda t: (-t[2], t[0], t[1])):
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        for split in _SPLIT_K:
            if split > 1 and (tiles * split > sms * 2 or k / split < _MIN_SPLIT_K_DEPTH):
                break
            depth = math.ceil(k / split)
            k_eff = depth / (depth + gpu.matmul_k_half)
            waves = math.ceil(tiles * split / sms)
            compute_s = waves * 2.0 * tm * tn * depth / (per_sm * tile_eff * k_eff) * extra
            partials = 2 * (split - 1) * m * n * _PARTIAL_BYTES if split > 1 else 0
            memory_s = _memory_s(hw, base_bytes + partials, contention)
            body = max(compute_s, memory_s)
            if best is None or body < best[0] - 1e-15:
                best = (body, compute_s, memory_s, (tm, tn), split, waves)
    assert best is not None
    body, compute_s, memory_s, tile, split, waves = best
    return MatmulCost(
        time_s=_with_launch(hw, body, launch, graph),
        compute_s=compute_s,
        memory_s=memory_s,
        tile=tile,
        split_k=split,
        waves=waves,
        flops=flops,
        efficiency=flops / body / peak,
    )


def matmul_time(
    hw: Hardware,
    m: int,
    n: int,
    k: int,
    dtype: str = "f16",
    *,
    contention: Contention = NO_CONTENTION,
    launch: bool = True,
    graph: bool = False,
) -> float:
    """Seconds for ``[m, k] × [k, n]``; see ``matmul_cost``."""
    return matmul_cost(hw, m, n, k, dtype, contention=contention, launch=launch, graph=graph).time_s


def matmul_efficiency(hw: Hardware, m: int, n: int, k: int, dtype: str = "f16") -> float:
    """Achieved fraction of the dtype's peak for this shape, launch excluded."""
    return matmul_cost(hw, m, n, k, dtype, launch=False).efficiency


def _chunk_rows(m: int, chunks: int) -> list[int]:
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    if chunks > max(m, 1):
        raise ValueError(f"cannot cut {m} rows into {chunks} chunks")
    size, extra = divmod(m, chunks)
    return [size + (1 if i < extra else 0) for i in range(chunks)]


def chunked_matmul_times(
    hw: Hardware,
    m: int,
    n: int,
    k: int,
    dtype: str,
    chunks: int,
    *,
    contention: Contention = NO_CONTENTION,
    launch: bool = True,
    graph: bool = False,
) -> tuple[float, ...]:
    """Times of the row chunks of ``[m, k] × [k, n]`` cut into ``chunks`` GEMMs.

    Overlap cuts the producer matmul into row chunks; each chunk is its own GEMM, so it
    pays a launch and its own tile/wave quantization.
    """
    return tuple(
        matmul_time(hw, rows, n, k, dtype, contention=contention, launch=launch, graph=graph)
        for rows in _chunk_rows(m, chunks)
    )


def chunk_efficiency(hw: Hardware, m: int, n: int, k: int, dtype: str, chunks: int) -> float:
    """Whole-GEMM time over the summed chunk times (1.0: chunking is free; lower: it costs)."""
    whole = matmul_time(hw, m, n, k, dtype)
    parts = sum(chunked_matmul_times(hw, m, n, k, dtype, chunks))
    return whole / parts if parts > 0 else 1.0
