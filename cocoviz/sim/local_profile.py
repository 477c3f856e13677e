"""A ``cpu-mpi`` profile of this machine: what ``cocoviz calibrate --local`` fits.

The ranks of the emitted CPU target (``emit --target cpu``) are processes of one core
each (``OMP_NUM_THREADS=1``), whose collectives copy through shared memory and whose
point-to-point sends are MPI messages. The cost model prices them as it prices GPUs: a
rank is a "GPU" of one SM (``gpu.arch = "cpu"``), its memory is ``gpu.hbm_gbps``, the
shared memory between ranks is the intra-node link (``intra_link = "pci"``,
``node.pci_gbps``, held far above memory: ``LINK_GBPS``), and collectives run as NCCL's
ring with the Simple protocol (``nccl.algorithms = ["ring"]``, ``protocols =
["Simple"]``), each of its wire bytes read and written in memory
``overlap.hbm_bytes_per_{reduce,copy}_byte`` times (a reduce-scatter of T ranks reads T
blocks and writes one: (T+1)/(T−1) per wire byte; an allgather reads and writes each: 2,
and out of place its own block too; both fitted). A reduction also pays
``overlap.reduce_ns`` per element it reads, by dtype: the CPU target widens each part to f32 and combines in tiles, so in
cache a bf16 reduce-scatter costs what an f32 one of as many elements does, not half, and
an f16 one more (the transfer is the larger of the two prices), and
``overlap.reduce_ns.far`` more per element whose parts lie beyond the caches, whatever the
dtype (its share by their reuse distance on the memory curve: in cache the combine loop
hides the memory behind its arithmetic, from DRAM it waits for it). Memory runs at
``gpu.hbm_gbps`` while a kernel's traffic fits the caches and at the fitted fraction of
it beyond them (``CACHED_BYTES``, ``MID_BYTES``, ``DRAM_BYTES``: the profile's memory
curve; a value's reuse distance, the distinct bytes between two touches, picks its rate). A kernel
of f16 or bf16 computes in f32 and pays ``gpu.convert_ns`` for each 16-bit element it
reads (widens) or writes (narrows): the CPU target converts element by element in
software, and rounding to f16 costs several times what widening does. A rank is one
thread: the simulator runs its kernels, collectives and sends one at a time
(``gpu.arch = "cpu"``; docs/cost-model.md, the timeline simulator).

``MICRO`` are the micro-runs: small programs, each exercising one thing — the CPU
target's elementwise kernel (f32 over 4 MiB, in the caches, over 8 MiB, partly, and over
16 MiB, beyond them; a norm: a sum's chain of adds;
f16 and bf16, each read and written and read only, and f32 with an optimizer's
arithmetic; 16 tiny ones in a row: a call's fixed cost), its GEMM (f32, f16, bf16), allreduce
small, mid-size and large, reduce-scatter (f32, f16 and bf16 in the caches; f32 beyond
them, eight of distinct inputs in a row; f32 large),
allgather (in the caches, of a slice a kernel has just written: the peers' lines come
from their caches, and beyond them), a small alltoall (MPI's, with its own fixed
cost), and a
point-to-point send (not a small one: from one step to the next an MPI eager send
overlaps its receive, so its steady-state time is a copy, not a latency). ``cocoviz
calibrate --local`` emits, builds (once, cached) and times each, then ``fit_local`` moves the profile's rates and latencies until
``simulate`` of every micro program predicts its measured step time: the fit runs the
whole model (kernels, GEMMs, collectives, streams) exactly as ``cocoviz simulate --hw``
will. ``local_profile_toml`` writes the result as a complete profile.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program
from cocoviz.sim.calibrate import Calibration, Knob, Measured, fit_samples, toml_str
from cocoviz.sim.hardware import HalfSlowdown, Hardware, load_profile
from cocoviz.sim.timeline import makespan

__all__ = [
    "MICRO",
    "MicroProgram",
    "MicroSample",
    "fit_local",
    "local_knobs",
    "local_profile_toml",
    "micro_program",
    "starting_profile",
]


@dataclass(frozen=True)
class MicroProgram:
    """One micro-run: a program of the CPU target and what its time measures."""

    name: str
    measures: str
    text: str
    """The program, with ``{ranks}`` (and, for a send, ``{pp}``) to fill in."""
    pipeline: bool = False
    """A send between two pipeline stages (ranks tp=ranks/2, pp=2)."""


_MIB_F32 = 1 << 20

MICRO: tuple[MicroProgram, ...] = (
    MicroProgram(
        "ew_f32",
        "elementwise f32 kernel over 16 MiB: memory bandwidth",
        "program micro_ew_f32\nranks {ranks}\ndim N = 4194304\ninput x : f32[N] local\n"
        "y = x * 1.5 + 0.5\noutput y\n",
    ),
    MicroProgram(
        "ew_f32_mid",
        "elementwise f32 kernel over 8 MiB: memory bandwidth while the caches hold part of it",
        "program micro_ew_f32_mid\nranks {ranks}\ndim N = 2097152\ninput x : f32[N] local\n"
        "y = x * 1.5 + 0.5\noutput y\n",
    ),
    MicroProgram(
        "ew_f32_small",
        "elementwise f32 kernel over 4 MiB: memory bandwidth while the data stays in cache",
        "program micro_ew_f32_small\nranks {ranks}\ndim N = 1048576\ninput x : f32[N] local\n"
        "y = x * 1.5 + 0.5\noutput y\n",
    ),
    MicroProgram(
        "ew_f16",
        "elementwise f16 kernel over 8 MiB: conversions and memory",
        "program micro_ew_f16\nranks {ranks}\ndim N = 4194304\ninput x : f16[N] local\n"
        "y = x * 1.5 + 0.5\noutput y\n",
    ),
    MicroProgram(
        "ew_bf16",
        "elementwise bf16 kernel over 8 MiB: conversions and memory",
        "program micro_ew_bf16\nranks {ranks}\ndim N = 4194304\ninput x : bf16[N] local\n"
        "y = x * 1.5 + 0.5\noutput y\n",
    ),
    MicroProgram(
        "ew_f16_widen",
        "elementwise kernel reading f16 and writing f32 over 8 + 16 MiB: the widening alone",
        "program micro_ew_f16_widen\nranks {ranks}\ndim N = 4194304\ninput x : f16[N] local\n"
        "y = cast(f32, x) * 1.5 + 0.5\noutput y\n",
    ),
    MicroProgram(
        "ew_bf16_widen",
        "elementwise kernel reading bf16 and writing f32 over 8 + 16 MiB: the widening alone",
        "program micro_ew_bf16_widen\nranks {ranks}\ndim N = 4194304\ninput x : bf16[N] local\n"
        "y = cast(f32, x) * 1.5 + 0.5\noutput y\n",
    ),
    MicroProgram(
        "ew_math",
        "elementwise f32 kernel over 2 MiB (in the caches, where memory hides the least) "
        "with an optimizer's sqrt and division: arithmetic",
        "program micro_ew_math\nranks {ranks}\ndim N = 524288\ninput x : f32[N] local\n"
        "y = (x * 0.9 + 0.1) / (sqrt(x * x * 0.999 + 0.001) + 0.00000001)\noutput y\n",
    ),
    MicroProgram(
        "ew_exp",
        "elementwise f32 kernel of exp over 4 MiB (in the caches): a libm call per element",
        "program micro_ew_exp\nranks {ranks}\ndim N = 1048576\ninput x : f32[N] local\n"
        "y = exp(x * 0.001)\noutput y\n",
    ),
    MicroProgram(
        "ew_exp_math",
        "elementwise f32 kernel of exp and an optimizer's arithmetic over 4 MiB (in the "
        "caches): the arithmetic beside a libm call, without SIMD",
        "program micro_ew_exp_math\nranks {ranks}\ndim N = 1048576\ninput x : f32[N] local\n"
        "y = exp(x * 0.001) + (x * 0.9 + 0.1) / (sqrt(x * x * 0.999 + 0.001) + 0.00000001)\n"
        "output y\n",
    ),
    MicroProgram(
        "ew_f16_exp",
        "elementwise f16 kernel of exp over 2 MiB (in the caches): a libm call per element, "
        "and the f16 conversions beside it without SIMD",
        "program micro_ew_f16_exp\nranks {ranks}\ndim N = 1048576\ninput x : f16[N] local\n"
        "y = exp(x * 0.001)\noutput y\n",
    ),
    MicroProgram(
        "ew_bf16_exp",
        "elementwise bf16 kernel of exp over 2 MiB (in the caches): a libm call per element, "
        "and the bf16 conversions beside it without SIMD",
        "program micro_ew_bf16_exp\nranks {ranks}\ndim N = 1048576\ninput x : bf16[N] local\n"
        "y = exp(x * 0.001)\noutput y\n",
    ),
    MicroProgram(
        "ew_norm",
        "norm of an f32 array of 4 MiB (in the caches): a sum's adds, each waiting for the "
        "one before it in its lane",
        "program micro_ew_norm\nranks {ranks}\ndim N = 1048576\ninput x : f32[N] local\n"
        "y = norm(x)\noutput y\n",
    ),
    MicroProgram(
        "ew_tiny",
        "16 elementwise kernels one after another over 1 KiB each: the fixed cost of a kernel call",
        "program micro_ew_tiny\nranks {ranks}\ndim N = 256\ninput x : f32[N] local\n"
        + "".join(f"y{i} = {'x' if i == 0 else f'y{i - 1}'} * 1.5 + 0.5\n" for i in range(16))
        + "output y15\n",
    ),
    MicroProgram(
        "gemm_f32",
        "GEMM f32 [256, 256] x [256, 256]",
        "program micro_gemm_f32\nranks {ranks}\ndim M = 256, K = 256, N = 256\n"
        "input a : f32[M, K] local\ninput b : f32[K, N] local\ny = matmul(a, b)\noutput y\n",
    ),
    MicroProgram(
        "gemm_f16",
        "GEMM f16 [256, 256] x [256, 256]",
        "program micro_gemm_f16\nranks {ranks}\ndim M = 256, K = 256, N = 256\n"
        "input a : f16[M, K] local\ninput b : f16[K, N] local\ny = matmul(a, b)\noutput y\n",
    ),
    MicroProgram(
        "gemm_bf16",
        "GEMM bf16 [256, 256] x [256, 256]",
        "program micro_gemm_bf16\nranks {ranks}\ndim M = 256, K = 256, N = 256\n"
        "input a : bf16[M, K] local\ninput b : bf16[K, N] local\ny = matmul(a, b)\noutput y\n",
    ),
    MicroProgram(
        "allreduce_small",
        "allreduce of 1 KiB: a collective's fixed cost",
        "program micro_allreduce_small\nranks {ranks}\ndim N = 256\ninput g : f32[N] local\n"
        "s = allreduce(+, g)\noutput s\n",
    ),
    MicroProgram(
        "allreduce_mid",
        "allreduce of 4 MiB: a collective whose blocks stay in cache",
        "program micro_allreduce_mid\nranks {ranks}\ndim N = 1048576\n"
        "input g : f32[N] local\ns = allreduce(+, g)\noutput s\n",
    ),
    MicroProgram(
        "allreduce_large",
        "allreduce of 16 MiB (reduce-scatter + allgather through shared memory)",
        "program micro_allreduce_large\nranks {ranks}\ndim N = 4194304\n"
        "input g : f32[N] local\ns = allreduce(+, g)\noutput s\n",
    ),
    MicroProgram(
        "reducescatter_mid",
        "reduce-scatter of 4 MiB f32 (in the caches): the combine's cost per element",
        "program micro_reducescatter_mid\nranks {ranks}\ndim N = 1048576\n"
        "input g : f32[N] local\ns = reducescatter(+, g)\noutput s\n",
    ),
    MicroProgram(
        "reducescatter_f16",
        "reduce-scatter of 2 MiB f16: the combine's cost per f16 element (widened to f32)",
        "program micro_reducescatter_f16\nranks {ranks}\ndim N = 1048576\n"
        "input g : f16[N] local\ns = reducescatter(+, g)\noutput s\n",
    ),
    MicroProgram(
        "reducescatter_bf16",
        "reduce-scatter of 2 MiB bf16: the combine's cost per bf16 element (widened to f32)",
        "program micro_reducescatter_bf16\nranks {ranks}\ndim N = 1048576\n"
        "input g : bf16[N] local\ns = reducescatter(+, g)\noutput s\n",
    ),
    MicroProgram(
        "reducescatter_far",
        "8 reduce-scatters of 4 MiB f32, each of its own input: the combine's cost per "
        "element read from beyond the caches (48 MiB a rank between two reads of an input)",
        "program micro_reducescatter_far\nranks {ranks}\ndim N = 1048576\n"
        + "".join(f"input g{i} : f32[N] local\n" for i in range(8))
        + "".join(f"s{i} = reducescatter(+, g{i})\n" for i in range(8))
        + "".join(f"output s{i}\n" for i in range(8)),
    ),
    MicroProgram(
        "reducescatter_large",
        "reduce-scatter of 16 MiB",
        "program micro_reducescatter_large\nranks {ranks}\ndim N = 4194304\n"
        "input g : f32[N] local\ns = reducescatter(+, g)\noutput s\n",
    ),
    MicroProgram(
        "alltoall_small",
        "alltoall of 32 KiB a rank: MPI's all-to-all, a p2p call's fixed cost",
        "program micro_alltoall_small\nranks {ranks}\ndim A = 64, B = 256\n"
        "input x : f32[A, B] sliced(1)\ny = alltoall(x, to=0)\noutput y\n",
    ),
    MicroProgram(
        "allgather_mid",
        "allgather to 4 MiB (in the caches): the memory a copy moves per byte",
        "program micro_allgather_mid\nranks {ranks}\ndim N = 1048576\n"
        "input x : f32[N] sliced(0)\ns = allgather(x)\noutput s\n",
    ),
    MicroProgram(
        "allgather_dirty",
        "allgather to 4 MiB of a slice a kernel has just written: a peer's dirty lines",
        "program micro_allgather_dirty\nranks {ranks}\ndim N = 1048576\n"
        "input x : f32[N] sliced(0)\nx1 = x * 1.5 + 0.5\ns = allgather(x1)\noutput s\n",
    ),
    MicroProgram(
        "allgather_large",
        "allgather to 16 MiB",
        "program micro_allgather_large\nranks {ranks}\ndim N = 4194304\n"
        "input x : f32[N] sliced(0)\ns = allgather(x)\noutput s\n",
    ),
    MicroProgram(
        "send_large",
        "point-to-point send of 16 MiB between pipeline stages",
        "program micro_send_large\nranks tp={tp}, pp=2\ndim N = 4194304\n"
        "input x : f32[N] replicated\nr = send(x)\noutput r\n",
        pipeline=True,
    ),
)
"""The micro-runs of ``calibrate --local`` (module docstring)."""


LINK_GBPS = 1000.0
"""The "link" between ranks (``node.pci_gbps``), held far above memory and not fitted: a
collective of the CPU target is loads and stores through shared memory, so its memory
terms price it (``overlap.hbm_bytes_per_{copy,reduce}_byte`` at the rate of the memory
curve); a link rate fitted beside them prices the same micro-runs (the fit is not unique)
and, unlike memory, would not speed up in the caches. A send runs at this times
``nccl.measured.p2p_nvlink_efficiency`` (fitted on ``send_large``)."""

CACHED_BYTES = 8 << 20
"""A kernel moving up to this many bytes (ew_f32_small: 4 MiB read, 4 MiB written) runs at
the cached rate ``gpu.hbm_gbps``."""
MID_BYTES = 16 << 20
"""At this many bytes (ew_f32_mid: 8 MiB read, 8 MiB written) a kernel runs at
``gpu.hbm_gbps`` times the curve's first fitted efficiency: the caches of the two ranks
hold the data only in part."""
DRAM_BYTES = 32 << 20
"""From this many bytes (ew_f32: 16 MiB read, 16 MiB written) a kernel runs at
``gpu.hbm_gbps`` times the second: the working set no longer fits the caches. Between
the points the profile's curve interpolates in log(bytes) (docs/cost-model.md, this
machine). Measured on a 2-core VM with 32 MiB of L3 (f32 kernel, fastest of 8 rounds):
0.082–0.093 ns an element up to 12 MiB of traffic a rank, 0.109 at 16, 0.128 at 20, 0.164
at 24 and 0.222 at 32 MiB."""


class CurveKnob(Knob):
    """A fitted point of the memory curve ``gpu.hbm_efficiency``: the last (``dram``, at
    ``DRAM_BYTES``) or the one before it (``mid``, at ``MID_BYTES``); the points below
    stay at 1."""

    @property
    def _index(self) -> int:
        return -2 if self.field.endswith(".mid") else -1

    def get(self, hw: Hardware) -> float:
        return float(hw.gpu.hbm_efficiency[self._index][1])

    def set(self, hw: Hardware, value: float) -> Hardware:
        points = list(hw.gpu.hbm_efficiency)
        points[self._index] = (points[self._index][0], value)
        gpu = dataclasses.replace(hw.gpu, hbm_efficiency=tuple(points))
        return dataclasses.replace(hw, gpu=gpu)


class GapKnob(Knob):
    """A kernel call's fixed cost: ``gpu.kernel_gap_us`` and ``gpu.launch_overhead_us`` as
    one (on a CPU rank a kernel is a function call; launch and gap are the same cost)."""

    def set(self, hw: Hardware, value: float) -> Hardware:
        gpu = dataclasses.replace(hw.gpu, kernel_gap_us=value, launch_overhead_us=value)
        return dataclasses.replace(hw, gpu=gpu)


def micro_text(micro: MicroProgram, ranks: int) -> str:
    """The program of a micro-run on ``ranks`` ranks (a send: ranks/2 per stage)."""
    return micro.text.format(ranks=ranks, tp=max(1, ranks // 2))


@cache
def micro_program(name: str, ranks: int) -> Program:
    micro = next(m for m in MICRO if m.name == name)
    return load_program(micro_text(micro, ranks), f"<{name}>")


@dataclass(frozen=True)
class MicroSample:
    """A micro-run's measured step time."""

    name: str
    ranks: int
    time_s: float

    @property
    def label(self) -> str:
        return self.name


def _simulated(hw: Hardware, s: Measured) -> float:
    assert isinstance(s, MicroSample)
    return makespan(micro_program(s.name, s.ranks), hw)


# ---------------------------------------------------------------------------------------
# The profile


def _cpu_vendor() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "other"
    return "amd" if "AuthenticAMD" in text else "intel" if "GenuineIntel" in text else "other"


_ZERO_ALGOS = "tree = [0.0, 0.0, 0.0]\nnvls = [0.0, 0.0, 0.0]\nnvls_tree = [0.0, 0.0, 0.0]\npat = [0.0, 0.0, 0.0]"


def _toml(values: Mapping[str, object]) -> str:
    """The whole profile as TOML, from the values the fit works on."""
    v = dict(values)
    rates = "\n".join(
        f"{d} = {v['matmul_' + d]:.6g}" for d in ("f16", "bf16", "f32", "f64", "i32", "i64")
    )
    vectors = "\n".join(
        f"{d} = {v['vector_' + d]:.6g}" for d in ("f16", "bf16", "f32", "f64", "i32", "i64")
    )
    return f"""name = {toml_str(str(v["name"]))}
description = {toml_str(str(v["description"]))}

[gpu]                          # one rank: one CPU core (run.sh sets OMP_NUM_THREADS=1)
arch = "cpu"
sms = 1
hbm_gbps = {v["hbm_gbps"]:.6g}
launch_overhead_us = {v["kernel_gap_us"]:.6g}
kernel_gap_us = {v["kernel_gap_us"]:.6g}
libm_call_ns = {v["libm_call_ns"]:.6g}      # one exp/log/tanh/pow call per element, beside the FLOPs
scalar_slowdown = {v["scalar_slowdown"]:.6g}   # a kernel calling libm: its FLOPs, without SIMD
sum_chain_ns = {v["sum_chain_ns"]:.6g}      # per element a sum/norm/amax accumulates

[gpu.matmul_tflops]
{rates}

[gpu.vector_tflops]            # 16-bit floats compute in f32 on CPU ranks
{vectors}

[gpu.convert_ns]               # one f16/bf16 element to f32 and back: [widen, narrow]
f16 = [{v["f16_widen"]:.6g}, {v["f16_narrow"]:.6g}]
bf16 = [{v["bf16_widen"]:.6g}, {v["bf16_narrow"]:.6g}]

[gpu.scalar_convert_slowdown]  # a kernel calling libm: its conversions, without SIMD
f16 = {v["scalar_f16"]:.6g}
bf16 = {v["scalar_bf16"]:.6g}

[gpu.efficiency]               # the rates above are what the micro-runs achieved
matmul = 1.0
matmul_k_half = 0.0
matmul_tiles = [[1, 1, 1.0]]
vector = 1.0
hbm = [[1.0e3, 1.0], [{CACHED_BYTES:.6g}, 1.0], [{MID_BYTES:.6g}, {v["mid_efficiency"]:.6g}], [{DRAM_BYTES:.6g}, {v["dram_efficiency"]:.6g}]]
hbm_floor = {v["dram_efficiency"]:.6g}

[node]                         # the ranks of one machine; shared memory is the link
gpus_per_node = {v["ranks"]}
cpu_vendor = "{v["cpu_vendor"]}"
intra_link = "pci"
nvlink_links = 0
nvlink_link_gbps = 0.0
pci_gbps = {v["pci_gbps"]:.6g}
nics_per_node = 1
nic_gbps = 1.0
net_efficiency = 1.0

[nccl]                         # MPI in NCCL's terms: a ring, one protocol, one channel
version = "2.29.2"
launch_us = 0.0
algorithms = ["ring"]
protocols = ["Simple"]
channels = 1
ring_plateau = 1.0
net_overhead_us = 0.0
net_latency_us = 0.0
nvls = false
nvls_efficiency = 0.0
nvls_channels = 0
nvls_min_ranks = 2
collnet = false
pat = false
symmetric = false

[nccl.base_latency_us]         # a collective's fixed cost (the exchange and barrier around it)
ring = [{v["base_us"]:.6g}, {v["base_us"]:.6g}, {v["base_us"]:.6g}]
{_ZERO_ALGOS}

[nccl.hw_latency_us.nvlink]
ring = [0.0, 0.0, 0.0]
{_ZERO_ALGOS}

[nccl.hw_latency_us.pci]       # per ring step
ring = [{v["hop_us"]:.6g}, {v["hop_us"]:.6g}, {v["hop_us"]:.6g}]
{_ZERO_ALGOS}

[nccl.hw_latency_us.net]
ring = [0.0, 0.0, 0.0]
{_ZERO_ALGOS}

[nccl.measured]
hop_latency_scale = 1.0
channel_gbps = 1.0e6
ring_fill_mib = 0.0
ring_fill_half_mib = 1.0
nvls_fill_mib = 0.0
nvls_fill_half_mib = 1.0
p2p_nvlink_efficiency = {v["p2p_efficiency"]:.6g}
p2p_latency_scale = {v["p2p_latency_scale"]:.6g}    # an alltoall's (MPI's) fixed cost, over the ring's
net_congestion = 0.0

[overlap]                      # a rank is one thread: nothing overlaps (timeline)
compute_slowdown_nvlink = 0.9
compute_slowdown_net = 0.9
hbm_bytes_per_reduce_byte = {v["reduce_bytes"]:.6g}
hbm_bytes_per_copy_byte = {v["copy_bytes"]:.6g}
peer_dirty_ns = {v["peer_dirty_ns"]:.6g}            # per byte read from a peer that wrote it this step

[overlap.reduce_ns]            # per element a rank reads in a reduction collective
f32 = {v["reduce_ns_f32"]:.6g}
f16 = {v["reduce_ns_f16"]:.6g}
bf16 = {v["reduce_ns_bf16"]:.6g}
far = {v["reduce_ns_far"]:.6g}               # more per element read from beyond the caches

[device]
peer_gbps = {v["pci_gbps"]:.6g}
barrier_us = {v["base_us"]:.6g}
"""


def starting_profile(ranks: int, *, name: str | None = None) -> Hardware:
    """A cpu-mpi profile with typical values of one server core [A], the fit's start."""
    host = platform.node() or "localhost"
    values: dict[str, object] = {
        "name": name or f"cpu-mpi-{host}",
        "description": f"{ranks} MPI ranks of one core each on {host} (cocoviz calibrate --local)",
        "ranks": ranks,
        "cpu_vendor": _cpu_vendor(),
        "hbm_gbps": 8.0,
        "mid_efficiency": 1.0,
        "dram_efficiency": 1.0,
        "kernel_gap_us": 2.0,
        "pci_gbps": LINK_GBPS,
        "base_us": 10.0,
        "hop_us": 2.0,
        "p2p_efficiency": 1.0,
        "p2p_latency_scale": 1.0,
        "reduce_bytes": (ranks + 1) / (ranks - 1) if ranks > 1 else 3.0,
        "copy_bytes": 2.0,
        "reduce_ns_f32": 0.1,
        "reduce_ns_f16": 0.1,
        "reduce_ns_bf16": 0.1,
        "reduce_ns_far": 0.1,
        "peer_dirty_ns": 0.0,
        "f16_widen": 1.0,
        "f16_narrow": 1.0,
        "bf16_widen": 1.0,
        "bf16_narrow": 1.0,
        "libm_call_ns": 1.0,
        "scalar_slowdown": 1.0,
        "sum_chain_ns": 0.1,
        "scalar_f16": 1.0,
        "scalar_bf16": 1.0,
    }
    for d, rate in (
        ("f16", 0.004),
        ("bf16", 0.004),
        ("f32", 0.008),
        ("f64", 0.004),
        ("i32", 0.008),
        ("i64", 0.004),
    ):
        values["matmul_" + d] = rate
        values["vector_" + d] = rate
    with tempfile.TemporaryDirectory(prefix="cocoviz-local-") as tmp:
        path = Path(tmp) / "cpu-mpi.toml"
        path.write_text(_toml(values), encoding="utf-8")
        hw = load_profile(path)
    return dataclasses.replace(hw, source=f"<cpu-mpi {ranks} ranks>")


def local_knobs() -> tuple[Knob, ...]:
    """What the micro-runs fit: the cached memory rate and its efficiency once the data
    leaves the caches, arithmetic and GEMM rates, the per-kernel gap, the shared-memory
    link, a collective's fixed and per-step cost, a byte read from a peer that has just
    written it, and MPI's send rate."""
    return (
        Knob("gpu.hbm_gbps", 0.05, 1000.0),
        CurveKnob("gpu.hbm_efficiency.mid", 0.01, 1.0),
        CurveKnob("gpu.hbm_efficiency.dram", 0.01, 1.0),
        Knob("gpu.vector_tflops.f32", 1e-6, 10.0),
        Knob("gpu.libm_call_ns", 1e-3, 1e5),
        Knob("gpu.scalar_slowdown", 1.0, 1e3),
        Knob("gpu.sum_chain_ns", 0.0, 1e4, log=False, scale=0.1),
        Knob("gpu.scalar_convert_slowdown.f16", 1.0, 1e3),
        Knob("gpu.scalar_convert_slowdown.bf16", 1.0, 1e3),
        Knob("gpu.convert_ns.f16_widen", 1e-4, 1e4),
        Knob("gpu.convert_ns.f16_narrow", 1e-4, 1e4),
        Knob("gpu.convert_ns.bf16_widen", 1e-4, 1e4),
        Knob("gpu.convert_ns.bf16_narrow", 1e-4, 1e4),
        Knob("gpu.matmul_tflops.f32", 1e-6, 10.0),
        Knob("gpu.matmul_tflops.f16", 1e-6, 10.0),
        Knob("gpu.matmul_tflops.bf16", 1e-6, 10.0),
        GapKnob("gpu.kernel_gap_us", 0.0, 10000.0, log=False, scale=1.0),
        Knob("nccl.measured.base_latency_scale.simple", 0.001, 1000.0),
        Knob("nccl.measured.hop_latency_scale", 0.001, 1000.0),
        Knob("nccl.measured.p2p_nvlink_efficiency", 1e-5, 4.0),
        Knob("nccl.measured.p2p_latency_scale", 1e-3, 1e3),
        Knob("overlap.hbm_bytes_per_copy_byte", 0.5, 16.0),
        Knob("overlap.hbm_bytes_per_reduce_byte", 0.5, 16.0),
        Knob("overlap.reduce_ns.f32", 1e-4, 1e4),
        Knob("overlap.reduce_ns.f16", 1e-4, 1e4),
        Knob("overlap.reduce_ns.bf16", 1e-4, 1e4),
        Knob("overlap.reduce_ns.far", 0.0, 1e4, log=False, scale=0.1),
        Knob("overlap.peer_dirty_ns", 0.0, 1e3, log=False, scale=0.01),
    )


_SEEDS = (
    ("gpu.kernel_gap_us", "ew_tiny"),
    ("gpu.hbm_gbps", "ew_f32_small"),
    ("gpu.hbm_efficiency.mid", "ew_f32_mid"),
    ("gpu.hbm_efficiency.dram", "ew_f32"),
    ("gpu.vector_tflops.f32", "ew_math"),
    ("gpu.libm_call_ns", "ew_exp"),
    ("gpu.scalar_slowdown", "ew_exp_math"),
    ("gpu.sum_chain_ns", "ew_norm"),
    ("gpu.scalar_convert_slowdown.f16", "ew_f16_exp"),
    ("gpu.scalar_convert_slowdown.bf16", "ew_bf16_exp"),
    ("gpu.convert_ns.f16_widen", "ew_f16_widen"),
    ("gpu.convert_ns.f16_narrow", "ew_f16"),
    ("gpu.convert_ns.bf16_widen", "ew_bf16_widen"),
    ("gpu.convert_ns.bf16_narrow", "ew_bf16"),
    ("gpu.matmul_tflops.f32", "gemm_f32"),
    ("gpu.matmul_tflops.f16", "gemm_f16"),
    ("gpu.matmul_tflops.bf16", "gemm_bf16"),
    ("nccl.measured.base_latency_scale.simple", "allreduce_small"),
    ("overlap.hbm_bytes_per_copy_byte", "allgather_mid"),
    ("overlap.peer_dirty_ns", "allgather_dirty"),
    ("nccl.measured.p2p_nvlink_efficiency", "send_large"),
    ("nccl.measured.p2p_latency_scale", "alltoall_small"),
    ("overlap.reduce_ns.f32", "reducescatter_mid"),
    ("overlap.reduce_ns.f16", "reducescatter_f16"),
    ("overlap.reduce_ns.bf16", "reducescatter_bf16"),
    ("overlap.reduce_ns.far", "reducescatter_far"),
    ("overlap.hbm_bytes_per_reduce_byte", "reducescatter_large"),
)
"""Each knob and the micro-run that mostly decides it, in an order where the ones before
are settled: the joint fit starts from these one-at-a-time solutions (a kernel's time is
the larger of its memory and its arithmetic time, and a joint step from a poor start can
settle on the wrong side of that corner)."""


def _seed(base: Hardware, times: Mapping[str, float], ranks: int) -> Hardware:
    """Solve each knob of ``_SEEDS`` alone on its micro-run (bisection in log space)."""
    knobs = {k.field: k for k in local_knobs()}
    hw = base
    # over and over: a kernel's time is the larger of its memory and arithmetic time, so
    # the memory rate solved before the arithmetic rate is known may sit at a bound, and
    # knobs that share micro-runs (a libm call and the FLOPs slowed beside it) move
    # toward each other's values a pass at a time (two passes left the libm call 2x off)
    for field, name in _SEEDS * 8:
        if name not in times:
            continue
        knob, target = knobs[field], math.log(times[name])
        sample = MicroSample(name, ranks, times[name])

        def gap(
            x: float,
            knob: Knob = knob,
            sample: MicroSample = sample,
            hw: Hardware = hw,
            target: float = target,
        ) -> float:
            trial = dataclasses.replace(knob.set(hw, knob.from_x(x)), source=f"<seed {x}>")
            return math.log(_simulated(trial, sample)) - target

        lo, hi = knob.to_x(max(knob.low, 1e-9)), knob.to_x(knob.high)
        g_lo, g_hi = gap(lo), gap(hi)
        if g_lo * g_hi > 0:
            x = lo if abs(g_lo) < abs(g_hi) else hi
            here = knob.to_x(max(knob.get(hw), knob.low, 1e-9))
            if abs(min(g_lo, g_hi, key=abs)) >= abs(gap(here)) - 1e-9:
                continue  # no end fits better than where it is (its micro-run may not see it)
        else:
            for _ in range(48):
                mid = (lo + hi) / 2
                g_mid = gap(mid)
                if g_mid * g_lo > 0:
                    lo, g_lo = mid, g_mid
                else:
                    hi = mid
            x = (lo + hi) / 2
        hw = knob.set(hw, knob.from_x(x))
    return dataclasses.replace(hw, source=base.source)


def fit_local(times: Mapping[str, float], ranks: int, *, name: str | None = None) -> Calibration:
    """Fit a cpu-mpi profile to the micro-runs' measured step times (seconds, by name)."""
    unknown = sorted(set(times) - {m.name for m in MICRO})
    if unknown:
        raise ValueError(f"unknown micro-runs: {', '.join(unknown)}")
    base = _seed(starting_profile(ranks, name=name), times, ranks)
    samples = [MicroSample(n, ranks, t) for n, t in times.items()]
    return fit_samples(samples, base, local_knobs(), time_of=_simulated, iterations=60)


def local_profile_toml(cal: Calibration, ranks: int, measured: Sequence[tuple[str, float]]) -> str:
    """The fitted profile as a complete TOML file, with what was measured in its header."""
    hw = cal.hardware
    base_us = hw.nccl.base_latency_us.ring.simple * hw.nccl.measured.base_latency_scale.simple
    hop_us = hw.nccl.hw_latency_us[1].ring.simple * hw.nccl.measured.hop_latency_scale
    values: dict[str, object] = {
        "name": hw.name,
        "description": hw.description,
        "ranks": ranks,
        "cpu_vendor": hw.node.cpu_vendor,
        "hbm_gbps": hw.gpu.hbm_gbps,
        "mid_efficiency": hw.gpu.hbm_efficiency[-2][1],
        "dram_efficiency": hw.gpu.hbm_efficiency[-1][1],
        "kernel_gap_us": hw.gpu.kernel_gap_us,
        "pci_gbps": hw.node.pci_gbps,
        "base_us": base_us,
        "hop_us": hop_us,
        "p2p_efficiency": hw.nccl.measured.p2p_nvlink_efficiency,
        "p2p_latency_scale": hw.nccl.measured.p2p_latency_scale,
        "reduce_bytes": hw.overlap.hbm_bytes_per_reduce_byte,
        "copy_bytes": hw.overlap.hbm_bytes_per_copy_byte,
        "reduce_ns_f32": hw.overlap.reduce_ns.f32,
        "reduce_ns_f16": hw.overlap.reduce_ns.f16,
        "reduce_ns_bf16": hw.overlap.reduce_ns.bf16,
        "reduce_ns_far": hw.overlap.reduce_ns.far,
        "peer_dirty_ns": hw.overlap.peer_dirty_ns,
    }
    mm, vec = hw.gpu.matmul_tflops, hw.gpu.vector_tflops
    tied = {"f64": "f32", "i32": "f32", "i64": "f32"}
    vector_tied = {**tied, "f16": "f32", "bf16": "f32"}  # arithmetic in float
    for d in ("f16", "bf16", "f32", "f64", "i32", "i64"):
        src = tied.get(d, d)
        scale = 0.5 if d == "f64" else 1.0
        values["matmul_" + d] = getattr(mm, src) * scale
        values["vector_" + d] = getattr(vec, vector_tied.get(d, d)) * scale
    for field in ("f16_widen", "f16_narrow", "bf16_widen", "bf16_narrow"):
        values[field] = getattr(hw.gpu.convert_ns, field)
    values["libm_call_ns"] = hw.gpu.libm_call_ns
    values["scalar_slowdown"] = hw.gpu.scalar_slowdown
    values["sum_chain_ns"] = hw.gpu.sum_chain_ns
    halves = hw.gpu.scalar_convert_slowdown or HalfSlowdown(
        hw.gpu.scalar_slowdown, hw.gpu.scalar_slowdown
    )
    values["scalar_f16"], values["scalar_bf16"] = halves.f16, halves.bf16
    med, worst = cal.summary()
    header = [
        "# Written by `cocoviz calibrate --local`: a cpu-mpi profile of this machine, fitted so",
        "# that `cocoviz simulate` of each micro-run predicts its measured step time.",
        f"# {ranks} ranks; step-time error after the fit: median {med:.1%}, max {worst:.1%}.",
        "# micro-run                measured     fitted",
    ]
    fitted = {r.sample.label: r.model_time_s for r in cal.residuals}
    for label, t in measured:
        header.append(
            f"#   {label:<22} {t * 1e6:>9.1f} us {fitted.get(label, math.nan) * 1e6:>9.1f} us"
        )
    header.append("# f64 runs at half the f32 rate and integers at the f32 rate [A].")
    return "\n".join(header) + "\n\n" + _toml(values)
