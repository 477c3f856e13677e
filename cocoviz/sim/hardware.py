"""Hardware profiles: the numbers the cost model runs on.

A profile is a TOML file. Four ship with cocoviz (``list_profiles()``): ``v100-dgx2``,
``a100-dgx``, ``h100-dgx`` (the default) and ``h200-hgx``; a user may pass a path to
their own file instead of a name. A user file may start from a shipped profile with
``base = "h100-dgx"`` and override only the fields it names::

    base = "h100-dgx"
    name = "h100-4nic"
    [node]
    nics_per_node = 4

``load_profile(name_or_path) -> Hardware`` returns a frozen, hashable value. A missing,
misspelled, mistyped or out-of-range field raises ``ProfileError`` whose message names
the file and the dotted field (``h100.toml: field 'gpu.sms': expected an integer, got
'many'``), with a note at the line of the user's file that sets it (or at a TOML syntax
error's line). Every field is checked where the file is read, with one rule per kind on
top of the field's own range: a number is finite and 0 or between ``MIN_NUMBER`` and
``MAX_NUMBER`` in magnitude (so no product or quotient of a few of them overflows or
divides by zero), an integer at most ``MAX_INTEGER``, a string free of control
characters. Units are the ones people quote: GB/s (10^9 B/s), TFLOP/s, microseconds.
Every shipped number carries its source in a comment of the TOML file, and
docs/cost-model.md collects them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from cocoviz import fsio
from cocoviz.errors import InputError, Source, Span, shown_value
from cocoviz.ir.types import DTYPE_NAMES

DEFAULT_PROFILE = "h100-dgx"

ARCHS = ("volta", "ampere", "hopper", "blackwell", "cpu")
"""``gpu.arch``: a GPU generation (it picks NCCL's per-architecture caps), or ``cpu`` for a
machine whose ranks are CPU cores talking through MPI (``cocoviz calibrate --local``)."""


class ProfileError(InputError):
    """A hardware profile that cannot be used (an unknown name, a bad file), with a
    message naming file and field; an input error (exit 1) wherever it surfaces."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        field: str | None = None,
        hint: str | None = None,
        toml_position: tuple[int, int] | None = None,
    ):
        super().__init__(message, hint=hint or ("fix the field named above" if field else None))
        self.path = path
        self.field = field
        self.toml_position = toml_position
        """(line, column) of a TOML syntax error."""


class Algo(StrEnum):
    """NCCL algorithms the model knows (``p2p`` is NCCL's send/recv path;
    ``symmetric`` the NCCL ≥ 2.27 kernels for buffers registered as symmetric windows)."""

    TREE = "tree"
    RING = "ring"
    NVLS = "nvls"
    NVLS_TREE = "nvls_tree"
    PAT = "pat"
    SYMMETRIC = "symmetric"
    P2P = "p2p"


class Proto(StrEnum):
    """NCCL protocols, spelled as ``NCCL_PROTO`` spells them."""

    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


class Link(StrEnum):
    """NCCL's hardware latency classes (``NCCL_HW_NVLINK``, ``_PCI``, ``_NET``)."""

    NVLINK = "nvlink"
    PCI = "pci"
    NET = "net"


@dataclass(frozen=True)
class PerDType:
    """One number per cocoviz dtype."""

    f16: float
    bf16: float
    f32: float
    f64: float
    i32: float
    i64: float

    def __getitem__(self, dtype: str) -> float:
        if dtype not in DTYPE_NAMES:
            raise KeyError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPE_NAMES)})")
        value: float = getattr(self, dtype)
        return value


@dataclass(frozen=True)
class PerHalf:
    """Per 16-bit float dtype, a conversion each way: to the f32 a kernel computes in
    (widen, a read) and back (narrow, a write)."""

    f16_widen: float = 0.0
    f16_narrow: float = 0.0
    bf16_widen: float = 0.0
    bf16_narrow: float = 0.0


@dataclass(frozen=True)
class HalfSlowdown:
    """Per 16-bit float dtype, how many times slower its conversions run in a loop that
    stays scalar (``[gpu.scalar_convert_slowdown]``)."""

    f16: float = 1.0
    bf16: float = 1.0


@dataclass(frozen=True)
class PerProto:
    """One number per NCCL protocol: LL, LL128, Simple (NCCL's array order)."""

    ll: float
    ll128: float
    simple: float

    def __getitem__(self, proto: Proto) -> float:
        if proto is Proto.SIMPLE:
            return self.simple
        return self.ll128 if proto is Proto.LL128 else self.ll


@dataclass(frozen=True)
class PerAlgo:
    """Per-protocol latencies for the algorithms that have NCCL latency entries."""

    tree: PerProto
    ring: PerProto
    nvls: PerProto
    nvls_tree: PerProto
    pat: PerProto

    def __getitem__(self, algo: Algo) -> PerProto:
        if algo is Algo.RING or algo is Algo.P2P:
            return self.ring  # NCCL's p2p runs the ring primitives on one peer
        if algo is Algo.TREE:
            return self.tree
        if algo is Algo.NVLS_TREE:
            return self.nvls_tree
        if algo is Algo.PAT:
            return self.pat
        return self.nvls


@dataclass(frozen=True)
class PerScale:
    """NCCL's per-node-count tables: 1 node, 2 nodes, 3 or more nodes."""

    n1: float
    n2: float
    n4: float

    def at(self, nnodes: int) -> float:
        return self.n1 if nnodes <= 1 else self.n2 if nnodes == 2 else self.n4


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of a profile: SMs, memory bandwidth, peaks and launch costs."""

    arch: str
    sms: int
    hbm_gbps: float
    launch_overhead_us: float
    kernel_gap_us: float
    matmul_tflops: PerDType
    vector_tflops: PerDType
    matmul_efficiency: float
    matmul_k_half: float
    matmul_tiles: tuple[tuple[int, int, float], ...]
    vector_efficiency: float
    hbm_efficiency: tuple[tuple[float, float], ...]
    hbm_efficiency_floor: float
    convert_ns: PerHalf = PerHalf()
    """Time to convert one element of a 16-bit float to the f32 a kernel computes in, and
    back, ns per rank (``[gpu.convert_ns]``: ``f16 = [widen, narrow]``; 0, the default:
    free next to the memory traffic, as the GPUs' conversion instructions are). The CPU
    target converts in software (``cocoviz calibrate --local`` fits them:
    docs/cost-model.md, this machine)."""
    libm_call_ns: float = 0.0
    """Time of one call of a math library function (exp, log, tanh, pow: one per element
    of ``exp``, ``log``, ``tanh``, ``sigmoid``, ``gelu``, ``pow`` and ``softmax``) beside the
    FLOPs, ns per rank (``[gpu] libm_call_ns``; 0, the default: the GPUs' special-function
    units are in the FLOPs). The CPU target calls libm one element at a time and the loop
    around the call does not vectorize (``cocoviz calibrate --local`` fits it on a kernel
    of ``exp``: docs/cost-model.md, this machine)."""
    sum_chain_ns: float = 0.0
    """Time per element a kernel's ``sum``, ``norm`` or ``amax`` accumulates, beside the
    FLOPs, ns per rank (``[gpu] sum_chain_ns``; 0, the default: a GPU's block reduction
    is in its FLOPs). The CPU target adds each element into 8 lanes of doubles in a fixed
    order, so every add waits for the one before it in its lane: the loop runs at the
    add's latency, not the SIMD rate (``cocoviz calibrate --local`` fits it on a norm in
    the caches: docs/cost-model.md, this machine)."""
    scalar_slowdown: float = 1.0
    """How many times slower a kernel that calls libm per element does its FLOPs
    (``[gpu] scalar_slowdown``, at least 1; 1, the default): on the CPU target the loop
    around the call runs one element at a time, so the arithmetic beside it loses its SIMD
    lanes too (fitted on an f32 kernel of exp and arithmetic)."""
    scalar_convert_slowdown: HalfSlowdown | None = None
    """The same for its f16 and bf16 conversions, each its own (``[gpu.scalar_convert_slowdown]
    f16 = …, bf16 = …``, at least 1; absent: ``scalar_slowdown`` for both). Rounding to
    f16 in software loses far more without SIMD than bf16's shift does (fitted on f16 and
    bf16 kernels of exp)."""


@dataclass(frozen=True)
class NodeSpec:
    """One node of a profile: GPUs per node and the links between them."""

    gpus_per_node: int
    cpu_vendor: str
    intra_link: Link
    nvlink_links: int
    nvlink_link_gbps: float
    pci_gbps: float
    nics_per_node: int
    nic_gbps: float
    net_efficiency: float


@dataclass(frozen=True)
class MeasuredSpec:
    """What NCCL's tuner does not model, fitted to published nccl-tests sweeps
    (docs/cost-model.md, "Measured terms"). NCCL picks the algorithm and protocol with
    its own tuning model; these terms turn the chosen entry's estimate into the time a
    measurement shows."""

    hop_latency_scale: float
    """Measured per-hop latency inside a node ÷ NCCL's ``hwLat`` (1: NCCL's constant)."""
    channel_gbps: float
    """Bus bandwidth one channel (one CTA) can carry with the Simple protocol, GB/s: what
    a call trimmed to few channels gets (LL carries half of it, LL128 120/128)."""
    ring_fill_mib: float
    """Pipeline fill and drain of a ring (and PAT) at full depth, as MiB moved at the
    call's own rate."""
    ring_fill_half_mib: float
    """Size at which a ring's fill reaches half its depth, MiB."""
    nvls_fill_mib: float
    """Pipeline fill and drain of NVLS / NVLS_TREE at full depth, MiB at the call's rate."""
    nvls_fill_half_mib: float
    """Size at which the NVLS fill reaches half its depth, MiB."""
    p2p_nvlink_efficiency: float
    """A send/recv pair's rate inside a node ÷ the ring's bus bandwidth (NVLink: fewer
    channels per peer; CPU ranks: MPI's send path against the shared-memory collectives)."""
    net_congestion: float
    """Network bandwidth lost per doubling of the node count beyond two."""
    base_latency_scale: PerProto = PerProto(1.0, 1.0, 1.0)
    """Measured fixed cost of a call ÷ NCCL's ``baseLat``, per protocol (1: NCCL's
    constant; a profile may give one number for all three)."""
    net_hop_latency_us: float = 0.0
    """Measured latency of one inter-node step beyond NCCL's ``hwLat[NET]``, µs: the
    switch hops and queues of the fabric, paid per network step of a ring, twice per
    level of a tree."""
    net_fill_mib: float = 0.0
    """Pipeline fill of a tree across nodes per level climbed or descended, MiB at the
    call's rate (the form of the ring fill)."""
    net_fill_half_mib: float = 8.0
    """Size at which that fill reaches half its depth, MiB."""
    ll_bw_scale: float = 1.0
    """Measured LL bandwidth ÷ NCCL's LL estimate (``min(llMaxBw, busBw/2)``): NCCL's cap
    ranks LL, the wire decides what it carries."""
    ring_fill_steps: float = 0.0
    """How the ring fill's half size follows the ring's length: ``ring_fill_half_mib ×
    (n / 8) ** ring_fill_steps`` for n ranks (0: the same at every n; 1: the fill
    follows the bytes per ring step, S / n)."""
    p2p_ll_gbps: float = 0.0
    """Rate of a channel of a p2p LL message, GB/s: a message runs on the channels NCCL's
    p2p plan gives it (``collectives.p2p_plan``: one up to 16 KiB a peer; from 2.22 to
    2.28 up to the per-peer channels, LL up to 512 KiB on the 8-GPU profiles;
    ``addP2pToPlan``, ``src/enqueue.cc``). 0: no such cap."""
    p2p_ll_peer_hops: float = 1.0
    """Hops of latency an LL alltoall pays per peer beyond the first (1: one each, the
    grouped send/recv loop; less: peers that run side by side)."""
    p2p_latency_scale: float = 1.0
    """A p2p call's (send/recv, alltoall) measured fixed cost ÷ the one the ring's
    constants give it: NCCL's p2p kernel is not the ring's (it has no tuner entry)."""


@dataclass(frozen=True)
class NcclSpec:
    """NCCL's tuning model of a profile: channels, latencies, bandwidth factors."""

    version: str
    """The NCCL release the profile models ("2.29.2"): selects the version-dependent
    tuning constants (``nccl_tuning``) and the algorithms that exist (PAT ≥ 2.23,
    symmetric kernels ≥ 2.27, NVLS ≥ 2.17)."""
    launch_us: float
    """Host time of one NCCL call issued outside a CUDA graph (enqueue + kernel launch):
    exposed when each call waits for the previous one (``blocking``)."""
    measured: MeasuredSpec
    pat_bw_factor: float
    """NCCL's PAT bus-bandwidth factor (0.85 before 2.28.3, 0.75 since)."""
    channels: int
    ring_plateau: float
    net_overhead_us: float
    net_latency_us: float
    nvls: bool
    nvls_efficiency: float
    nvls_channels: int
    nvls_min_ranks: int
    collnet: bool
    """CollNet (network SHARP) is available: NCCL needs it for multi-node NVLS."""
    pat: bool
    """NCCL's PAT algorithm (2.23+) for reducescatter/allgather, one GPU per node."""
    symmetric: bool
    """NCCL's symmetric-memory kernels (2.27+) for registered buffers, one NVLink domain."""
    algorithms: tuple[Algo, ...]
    """The algorithms the runs allow (``NCCL_ALGO``); empty: every one NCCL has. Point-to-
    point (send/recv, alltoall) is not an algorithm NCCL_ALGO restricts."""
    protocols: tuple[Proto, ...]
    """The protocols the runs allow (``NCCL_PROTO``); empty: all three."""
    base_latency_us: PerAlgo
    hw_latency_us: tuple[PerAlgo, PerAlgo, PerAlgo]  # indexed by Link order
    ll_max_bw: PerScale
    per_ch_max_ring_ll128_bw: PerScale
    per_ch_max_tree_ll128_bw: PerScale
    per_ch_max_tree_bw: PerScale
    per_ch_max_nvls_tree_bw: PerScale

    def hw_latency(self, link: Link) -> PerAlgo:
        nvlink, pci, net = self.hw_latency_us
        return nvlink if link is Link.NVLINK else net if link is Link.NET else pci

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        return parse_nccl_version(self.version)


@dataclass(frozen=True)
class ReduceNs:
    """``[overlap.reduce_ns]``: ns per element a rank reads in a reduction collective
    (the G parts of each element it combines), by dtype: f16, bf16, and f32 for every
    other dtype; 0 (the default): the collective's rate alone prices it (GPU profiles:
    NCCL combines in registers as the bytes arrive). The CPU target combines in f32 in
    tiles, one element at a time, whatever the storage size: its cost per element, not per
    byte, decides while the parts are in cache (docs/cost-model.md, "This machine")."""

    f32: float = 0.0
    f16: float = 0.0
    bf16: float = 0.0
    far: float = 0.0
    """ns more per element when the parts come from beyond the caches, whatever the dtype
    (its share by the parts' reuse distance on the memory curve, `_combine_s`): a CPU
    core's combine loop, which hides the memory behind its arithmetic in cache, waits for
    it once the parts are in DRAM (0: the dtype's cost alone)."""

    def of(self, dtype: str) -> float:
        return self.f16 if dtype == "f16" else self.bf16 if dtype == "bf16" else self.f32


@dataclass(frozen=True)
class OverlapSpec:
    """How communication running beside a kernel slows it."""

    compute_slowdown_nvlink: float
    compute_slowdown_net: float
    hbm_bytes_per_reduce_byte: float
    hbm_bytes_per_copy_byte: float
    reduce_ns: ReduceNs = ReduceNs()
    peer_dirty_ns: float = 0.0
    """ns per byte a collective reads from a peer's buffer that the peer wrote in this step
    (``[overlap] peer_dirty_ns``; 0: no term). On CPU ranks such a line lies modified in
    the writer's cache: the reader takes it from there, and the writer's next store
    takes it back (docs/cost-model.md, this machine). GPUs read peers over NVLink, where
    nothing of the kind shows: their profiles leave it out."""


@dataclass(frozen=True)
class DeviceSpec:
    """The device-initiated (nccl-device) collectives of a profile."""

    peer_gbps: float
    barrier_us: float


@dataclass(frozen=True)
class Hardware:
    """A machine: GPUs in NVLink nodes joined by a network."""

    name: str
    description: str
    source: str
    gpu: GpuSpec
    node: NodeSpec
    nccl: NcclSpec
    overlap: OverlapSpec
    device: DeviceSpec

    def __hash__(self) -> int:
        # Hashing every nested table on each memoized model call is slow; equal
        # profiles share name and source, and equality still compares everything.
        return hash((self.name, self.source))

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def nvlink_gbps(self) -> float:
        """Per-GPU NVLink bandwidth per direction in NCCL units (links × NCCL per-link bw)."""
        return self.node.nvlink_links * self.node.nvlink_link_gbps

    @property
    def intra_gbps(self) -> float:
        """Per-GPU bandwidth to the other GPUs of its node."""
        return self.nvlink_gbps if self.node.intra_link is Link.NVLINK else self.node.pci_gbps

    @property
    def nic_effective_gbps(self) -> float:
        """What one NIC delivers to NCCL (line rate × NCCL's NET efficiency)."""
        return self.node.nic_gbps * self.node.net_efficiency

    def net_gbps(self, ranks_per_node: int) -> float:
        """Network bandwidth per node available to ``ranks_per_node`` GPUs of a communicator.

        Each GPU uses the NICs next to it; a node's GPUs share its NICs evenly.
        """
        nics = math.ceil(ranks_per_node * self.node.nics_per_node / self.node.gpus_per_node)
        return min(self.node.nics_per_node, max(1, nics)) * self.nic_effective_gbps


# ---------------------------------------------------------------------------------------
# NCCL's version-dependent tuning constants (src/graph/tuning.cc at each release tag)


_VERSION_DIGITS = 6
"""The most digits a part of an NCCL version may have (NCCL's own have one or two)."""


def parse_nccl_version(text: str) -> tuple[int, int, int]:
    """``"2.29.2"`` → ``(2, 29, 2)``; ``"2.21"`` → ``(2, 21, 0)``. A ValueError names the text."""
    parts = text.strip().split(".")
    if not 2 <= len(parts) <= 3 or not all(
        p.isascii() and p.isdigit() and len(p) <= _VERSION_DIGITS for p in parts
    ):
        raise ValueError(f'expected an NCCL version like "2.29.2", got {shown_value(text)!r}')
    major, minor, patch = (int(p) for p in [*parts, "0"][:3])
    return major, minor, patch


def _pa(
    tree, ring, nvls=(0.0, 0.0, 0.0), nvls_tree=(0.0, 0.0, 0.0), pat=(0.0, 0.0, 0.0)
) -> PerAlgo:
    return PerAlgo(*(PerProto(*t) for t in (tree, ring, nvls, nvls_tree, pat)))


@dataclass(frozen=True)
class NcclTuning:
    """One NCCL release's latency tables (``baseLat``/``hwLat``, later
    ``ncclTunerConstantsDefaults``), [LL, LL128, Simple] per algorithm."""

    since: tuple[int, int, int]
    tag: str
    """The release tag the numbers were read at."""
    base: PerAlgo
    nvlink: PerAlgo
    pci: PerAlgo
    net: PerAlgo
    hopper_ll_max_bw_1node: float
    """``llMaxBws`` Hopper row, one node: 87.7 (a copy of Ampere's) before 2.21, then 141."""
    pat_bw_factor: float


# NVLS rows: NCCL 2.18 put NVLS's fixed cost in baseLat (23 µs) and 0 in hwLat; the model
# keeps it in the NVLink hwLat entry (its NVLS latency is the intra-node entry), which is
# the same number on one node. 2.6.4's CollNet row is dropped (no CollNet in the model).
NCCL_TUNINGS: tuple[NcclTuning, ...] = (
    NcclTuning((2, 6, 0), "v2.6.4-1",
               base=_pa((4.4, 4.4, 0.0), (3.6, 3.6, 8.4)),
               nvlink=_pa((0.5, 1.9, 28.0), (0.4, 2.5, 5.7)),
               pci=_pa((1.0, 1.9, 28.0), (1.0, 2.5, 5.7)),
               net=_pa((5.0, 7.5, 50.0), (0.9, 2.5, 6.6)),
               hopper_ll_max_bw_1node=87.7, pat_bw_factor=0.85),
    NcclTuning((2, 18, 0), "v2.18.3-1",
               base=_pa((6.8, 14.0, 0.0), (6.6, 14.0, 8.4)),
               nvlink=_pa((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 23.0), (0, 0, 23.0)),
               pci=_pa((1.0, 1.9, 6.0), (1.0, 2.5, 5.7)),
               net=_pa((5.0, 8.5, 14.0), (2.7, 4.0, 14.0), (0, 0, 18.0), (0, 0, 19.0)),
               hopper_ll_max_bw_1node=87.7, pat_bw_factor=0.85),
    NcclTuning((2, 19, 0), "v2.19.3-1 (= v2.20.5-1)",
               base=_pa((6.8, 14.0, 0.0), (6.6, 14.0, 8.4)),
               nvlink=_pa((0.6, 1.25, 28.0), (0.6, 1.9, 3.4), (0, 0, 23.0), (0, 0, 23.0)),
               pci=_pa((1.0, 1.9, 28.0), (1.0, 2.5, 5.7)),
               net=_pa((5.0, 8.5, 28.0), (2.7, 4.0, 14.0), (0, 0, 18.0), (0, 0, 14.0)),
               hopper_ll_max_bw_1node=87.7, pat_bw_factor=0.85),
    NcclTuning((2, 21, 0), "v2.21.5-1",
               base=_pa((6.8, 14.0, 0.0), (6.6, 14.0, 8.4)),
               nvlink=_pa((0.6, 1.25, 28.0), (0.6, 1.9, 3.4), (0, 0, 25.0), (0, 0, 25.0)),
               pci=_pa((1.0, 1.9, 28.0), (1.0, 2.5, 5.7)),
               net=_pa((5.0, 8.5, 28.0), (2.7, 4.0, 14.0), (0, 0, 18.0), (0, 0, 14.0)),
               hopper_ll_max_bw_1node=141.0, pat_bw_factor=0.85),
    NcclTuning((2, 23, 0), "v2.23.4-1 (to v2.28.7-1; PAT x0.75 from v2.28.3-1)",
               base=_pa((6.8, 14.0, 8.4), (6.6, 14.0, 8.4), pat=(8.0, 8.0, 8.0)),
               nvlink=_pa((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 25.0), (0, 0, 25.0), (0, 0, 4.0)),
               pci=_pa((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), pat=(0, 0, 4.0)),
               net=_pa((5.0, 8.5, 14.0), (2.7, 4.0, 14.0), (0, 0, 18.0), (0, 0, 14.0), (0, 0, 14.0)),
               hopper_ll_max_bw_1node=141.0, pat_bw_factor=0.85),
    NcclTuning((2, 28, 3), "v2.28.3-1",
               base=_pa((6.8, 14.0, 8.4), (6.6, 14.0, 8.4), pat=(8.0, 8.0, 8.0)),
               nvlink=_pa((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 25.0), (0, 0, 25.0), (0, 0, 4.0)),
               pci=_pa((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), pat=(0, 0, 4.0)),
               net=_pa((5.0, 8.5, 14.0), (2.7, 4.0, 14.0), (0, 0, 18.0), (0, 0, 14.0), (0, 0, 14.0)),
               hopper_ll_max_bw_1node=141.0, pat_bw_factor=0.75),
    NcclTuning((2, 28, 9), "v2.28.9-1 (to master, v2.30)",
               base=_pa((6.8, 14.0, 8.4), (6.6, 14.0, 8.4), pat=(8.0, 8.0, 8.0)),
               nvlink=_pa((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 25.0), (0, 0, 25.0), (0, 0, 4.0)),
               pci=_pa((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), pat=(0, 0, 4.0)),
               net=_pa((5.0, 8.5, 14.0), (2.7, 4.0, 14.0), (0, 0, 18.0), (0, 0, 20.9), (0, 0, 14.0)),
               hopper_ll_max_bw_1node=141.0, pat_bw_factor=0.75),
)  # fmt: skip
"""Read at each tag of NVIDIA/nccl; a version gets the latest entry at or below it.
Releases 2.7–2.17 are not tabulated (``nccl_tuning`` refuses them)."""

# ncclTunerConstantsDefaults rows that do not change from 2.18 to master (the Volta row
# is what 2.6.4's rules would need too; perf-data §1.2). [1 node, 2 nodes, >= 3 nodes]
_PER_CH_MAX = {  # arch: (ring LL128, tree LL128, tree, NVLS tree)
    "volta": ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (26.5, 18.5, 10.0), (26.5, 18.5, 10.0)),
    "ampere": ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (24.0, 23.6, 17.8), (24.0, 23.6, 17.8)),
    "hopper": ((36.7, 36.7, 36.7), (36.7, 36.7, 29.0), (38.7, 41.4, 36.0), (0.0, 57.7, 45.5)),
    "blackwell": ((40.0, 40.0, 40.0), (55.6, 31.67, 20.0), (70.0, 42.8, 24.0), (0.0, 96.0, 80.0)),
}
_PER_CH_MAX["cpu"] = _PER_CH_MAX["volta"]  # unused: a cpu profile runs ring/Simple and p2p
_LL_MAX_1NODE = {"volta": 39.0, "ampere": 87.7, "blackwell": 282.0, "cpu": 39.0}
_LL_MAX_MULTINODE = {"intel": (39.0, 20.4), "amd": (22.5, 19.0)}  # llMaxBws CPU rows


def nccl_tuning(version: str) -> NcclTuning:
    """The tuning constants of an NCCL release (``NCCL_TUNINGS``)."""
    v = parse_nccl_version(version)
    if v < NCCL_TUNINGS[0].since or (2, 7, 0) <= v < (2, 18, 0):
        raise ValueError(
            f"NCCL {version} is not tabulated: the model knows 2.6.4 (CoCoNet's) and 2.18 onwards"
        )
    return [t for t in NCCL_TUNINGS if t.since <= v][-1]


def nccl_caps(version: str, arch: str, cpu_vendor: str) -> tuple[PerScale, ...]:
    """``llMaxBw`` and the per-channel caps (ring LL128, tree LL128, tree, NVLS tree) of an
    architecture under an NCCL release: the 1-node LL cap is the GPU's row, multi-node
    ones the CPU vendor's (``tuning.cc`` index1)."""
    tuning = nccl_tuning(version)
    ll1 = tuning.hopper_ll_max_bw_1node if arch == "hopper" else _LL_MAX_1NODE[arch]
    ll2, ll4 = _LL_MAX_MULTINODE["amd" if cpu_vendor == "amd" else "intel"]
    return (PerScale(ll1, ll2, ll4), *(PerScale(*row) for row in _PER_CH_MAX[arch]))


# ---------------------------------------------------------------------------------------
# Loading


def list_profiles() -> list[str]:
    """Names of the profiles shipped with cocoviz."""
    folder = resources.files("cocoviz.sim") / "profiles"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def default_hardware() -> Hardware:
    """The profile a caller that names none gets (`DEFAULT_PROFILE`)."""
    return load_profile(DEFAULT_PROFILE)


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> Hardware:
    """Load a shipped profile by name, or a user's TOML file by path."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text or "\\" in text:
        return _load_file(Path(text))
    if text in list_profiles():
        return _load_shipped(text)
    known = ", ".join(list_profiles())
    hint = difflib.get_close_matches(text, list_profiles(), n=1)
    did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
    raise ProfileError(
        f"unknown hardware profile '{text}'{did_you_mean}; known profiles: {known}; "
        "or give the path of a .toml file"
    )


@cache
def _load_shipped(name: str) -> Hardware:
    resource = resources.files("cocoviz.sim") / "profiles" / f"{name}.toml"
    where = f"{name}.toml"
    return _build(_parse_toml(resource.read_text(encoding="utf-8"), where), where)


def _load_file(path: Path) -> Hardware:
    where = str(path)
    try:
        text = fsio.read_toml_text(
            path, "hardware profile file", lambda m: ProfileError(m, path=where)
        )
    except FileNotFoundError:
        raise ProfileError(f"{where}: no such hardware profile file", path=where) from None
    except OSError as exc:
        raise ProfileError(f"{where}: cannot read: {exc.strerror}", path=where) from None
    except ValueError as exc:  # tomllib: an integer of more than 4300 digits
        raise ProfileError(f"{where}: not valid TOML: {exc}", path=where) from None
    return parse_profile(text, where)


def parse_profile(text: str, where: str) -> Hardware:
    """A profile from the text of a TOML file (``where`` names it in errors): what
    ``load_profile`` does with a user's file once read. An error about a field the text
    sets carries a note that points at its line."""
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write
    try:
        return _from_text(text, where)
    except ProfileError as err:
        raise _located(err, text, where) from None


def _from_text(text: str, where: str) -> Hardware:
    raw = _parse_toml(text, where)
    if not raw:
        raise ProfileError(
            f"{where}: the file holds no field: not a hardware profile",
            path=where,
            hint='a profile may start from a shipped one: base = "h100-dgx", then the '
            "fields it changes",
        )
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or base not in list_profiles():
            known = ", ".join(list_profiles())
            raise ProfileError(
                f"{where}: field 'base': expected the name of a shipped profile ({known}), "
                f"got {base!r}",
                path=where,
                field="base",
            )
        shipped = resources.files("cocoviz.sim") / "profiles" / f"{base}.toml"
        raw = _merge(_without_overridden_layers(
            _parse_toml(shipped.read_text(encoding="utf-8"), f"{base}.toml"), raw), raw)  # fmt: skip
    return _build(raw, where)


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(
            f"{where}: not valid TOML: {exc}",
            path=where,
            hint="a profile is a TOML file (https://toml.io): fix the line shown, or start "
            'from a shipped profile (base = "h100-dgx")',
            toml_position=_toml_position(str(exc)),
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ProfileError(f"{where}: not valid TOML: {exc}", path=where) from None


_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)")


def _toml_position(message: str) -> tuple[int, int] | None:
    """(line, column) of a ``tomllib`` error ("... (at line 7, column 10)")."""
    m = _TOML_AT.search(message)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _located(err: ProfileError, text: str, where: str) -> ProfileError:
    """``err`` with a note at the line of ``text`` it is about: the TOML syntax error's
    position, or the line that sets the field (the table's header for a field that is
    missing from it). An error about a field the text does not set (one a ``base``
    profile gives) is left as it is."""
    source = Source(where, text)
    note: tuple[str, Span] | None = None
    if err.toml_position is not None:
        line, col = err.toml_position
        if 0 < line <= len(source.lines):
            note = ("here", Span(source, line, col, line, col + 1))
    elif err.field is not None and err.path == where:
        note = _field_note(source, err.field)
    if note is None:
        return err
    err.diagnostics = tuple(dataclasses.replace(d, notes=(*d.notes, note)) for d in err.diagnostics)
    return err


def _key_parts(key: str) -> tuple[str, ...]:
    """A dotted TOML key (``nccl.measured.upto."2.23"``, spaces around the dots allowed)
    split into its parts, quotes removed; () when it is not a plain key."""
    parts: list[str] = []
    for m in re.finditer(r'\s*(?:"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([A-Za-z0-9_-]+))\s*(\.|$)', key):
        parts.append(next(g for g in m.groups()[:3] if g is not None))
        if m.group(4) == "":
            return tuple(parts)
    return ()


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
_ASSIGN = re.compile(r'^\s*((?:"(?:[^"\\]|\\.)*"|\'[^\']*\'|[A-Za-z0-9_.\s-])+?)\s*=')


def _field_note(source: Source, field: str) -> tuple[str, Span] | None:
    """Where ``source`` sets the dotted ``field`` (its ``key = value`` line), else, for a
    field missing from a table, that table's ``[header]`` line; None when neither is in
    the text (a field of the base profile, an inline table)."""
    want = _key_parts(field)
    if not want:
        return None
    table: tuple[str, ...] = ()
    header: tuple[str, Span] | None = None
    for no, line in enumerate(source.lines, 1):
        if m := _HEADER.match(line):
            table = _key_parts(m.group(1))
            if table == want:
                return (f"'{field}' is set here", Span(source, no, 1, no, len(line) + 1))
            if table == want[:-1] and header is None:
                name = ".".join(want[:-1])
                header = (f"the table '{name}' is here", Span(source, no, 1, no, len(line) + 1))
            continue
        if (m := _ASSIGN.match(line)) and (*table, *_key_parts(m.group(1))) == want:
            span = Span(source, no, m.start(1) + 1, no, len(line.rstrip()) + 1)
            return (f"'{field}' is set here", span)
    return header


def _without_overridden_layers(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with every measured term that ``override`` sets taken out of the base's
    ``[nccl.measured.upto."X"]`` tables: a term the user gives (a calibrate fit, at the
    user's NCCL release) holds at every release, where the base's layer would replace it."""
    mine = (
        override.get("nccl", {}).get("measured", {})
        if isinstance(override.get("nccl"), dict)
        else {}
    )
    layers = base.get("nccl", {}).get("measured", {}).get("upto")
    if not isinstance(mine, dict) or not isinstance(layers, dict):
        return base
    keep = {
        release: {k: v for k, v in table.items() if k not in mine}
        for release, table in layers.items()
        if isinstance(table, dict)
    }
    nccl = dict(base["nccl"])
    nccl["measured"] = {**nccl["measured"], "upto": keep}
    return {**base, "nccl": nccl}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


MAX_NUMBER = 1e15
"""The largest magnitude of a number in a profile (a rate, a time, a byte count): far
above any machine's, far enough below overflow that products of a few of them stay finite."""
MIN_NUMBER = 1e-9
"""The smallest magnitude of a nonzero number in a profile: a rate this small is a typo, and
one that underflows to 0 would divide by zero."""
MAX_INTEGER = 1 << 20
"""The largest integer field (SMs, GPUs per node, channels, links, NICs)."""


def _shown_int(value: int) -> str:
    """An integer as a message shows it: in full up to 24 digits, else its length."""
    if value.bit_length() > 10_000:  # str() refuses more than 4300 digits
        return f"an integer of about {value.bit_length() * 3 // 10} digits"
    digits = len(str(abs(value)))
    return f"{value:,}" if digits <= 24 else f"an integer of {digits} digits"


class _Table:
    """A TOML table read field by field; remembers which keys it used."""

    def __init__(self, data: dict[str, Any], prefix: str, where: str):
        self.data = data
        self.prefix = prefix
        self.where = where
        self.used: set[str] = set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def error(self, key: str, problem: str) -> ProfileError:
        field = self._name(key)
        return ProfileError(
            f"{self.where}: field '{field}': {problem}", path=self.where, field=field
        )

    def _get(self, key: str) -> Any:
        self.used.add(key)
        if key not in self.data:
            spare = [k for k in self.data if k not in self.used]
            close = difflib.get_close_matches(key, spare, n=1)
            hint = f" ('{self._name(close[0])}' is not a field: a misspelling?)" if close else ""
            raise self.error(key, f"missing{hint}")
        return self.data[key]

    def table(self, key: str) -> _Table:
        value = self._get(key)
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {value!r}")
        return _Table(value, f"{self._name(key)}.", self.where)

    def string(self, key: str, choices: tuple[str, ...] | None = None) -> str:
        value = self._get(key)
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        if any(not c.isprintable() for c in value):
            shown = repr(value) if len(value) <= 60 else repr(value[:60]) + "…"
            raise self.error(
                key, f"must not hold control characters (a newline, an escape), got {shown}"
            )
        if choices is not None and value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def integer(self, key: str, minimum: int = 1) -> int:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        if value > MAX_INTEGER:
            raise self.error(key, f"must be at most {MAX_INTEGER:,}, got {_shown_int(value)}")
        return value

    def number(
        self, key: str, *, low: float = 0.0, high: float = math.inf, zero: bool = False
    ) -> float:
        return self._check_number(key, self._get(key), low=low, high=high, zero=zero)

    def _check_number(self, key: str, value: Any, *, low: float, high: float, zero: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {value!r}")
        if isinstance(value, int) and abs(value) > MAX_NUMBER:
            raise self.error(
                key, f"out of range: at most {MAX_NUMBER:g} in magnitude, got {_shown_int(value)}"
            )
        number = float(value)
        if not math.isfinite(number):
            raise self.error(key, f"expected a finite number, got {value!r}")
        if number != 0 and not MIN_NUMBER <= abs(number) <= MAX_NUMBER:
            raise self.error(
                key,
                f"out of range: a profile's numbers are 0 or between {MIN_NUMBER:g} and "
                f"{MAX_NUMBER:g} in magnitude, got {number:g}",
            )
        if number < low or number > high or (number == low and not zero):
            rng = f"{'at least' if zero else 'greater than'} {low:g}"
            if math.isfinite(high):
                rng += f" and at most {high:g}"
            raise self.error(key, f"must be {rng}, got {number:g}")
        return number

    def fraction(self, key: str) -> float:
        return self.number(key, low=0.0, high=1.0)

    def numbers(self, key: str, count: int, *, zero: bool = True) -> tuple[float, ...]:
        value = self._get(key)
        if not isinstance(value, list) or len(value) != count:
            raise self.error(key, f"expected a list of {count} numbers, got {value!r}")
        return tuple(self._check_number(key, v, low=0.0, high=math.inf, zero=zero) for v in value)

    def rows(self, key: str, width: int) -> tuple[tuple[float, ...], ...]:
        value = self._get(key)
        if (
            not isinstance(value, list)
            or not value
            or any(not isinstance(r, list) or len(r) != width for r in value)
        ):
            raise self.error(
                key,
                f"expected a non-empty list of [{', '.join(['x'] * width)}] rows, got {value!r}",
            )
        return tuple(
            tuple(self._check_number(key, v, low=0.0, high=math.inf, zero=False) for v in row)
            for row in value
        )

    def done(self) -> None:
        for key in self.data:
            if key not in self.used:
                close = difflib.get_close_matches(key, [k for k in self.used], n=1)
                hint = f" (did you mean '{self._name(close[0])}'?)" if close else ""
                raise self.error(key, f"unknown field{hint}")


def _choices(t: _Table, key: str, kind: Any, exclude: Any = None) -> tuple[Any, ...]:
    """An optional list of enum spellings (``algorithms = ["ring", "tree"]``); absent or
    empty: no restriction."""
    if key not in t.data:
        return ()
    value = t.data[key]
    t.used.add(key)
    names = [m.value for m in kind if m is not exclude]
    if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
        raise t.error(key, f"expected a list of names ({', '.join(names)}), got {value!r}")
    out = []
    for v in value:
        match = next((m for m in kind if m is not exclude and m.value.lower() == v.lower()), None)
        if match is None:
            raise t.error(key, f"expected names among {', '.join(names)}, got {v!r}")
        out.append(match)
    return tuple(dict.fromkeys(out))


def _per_proto_or_one(t: _Table, key: str, default: float) -> PerProto:
    """An optional per-protocol field: absent (``default``), one number for all three
    protocols, or ``[LL, LL128, Simple]``."""
    if key not in t.data:
        return PerProto(default, default, default)
    if isinstance(t.data[key], list):
        ll, ll128, simple = t.numbers(key, 3, zero=False)
        return PerProto(ll, ll128, simple)
    one = t.number(key)
    return PerProto(one, one, one)


def _per_proto(t: _Table, key: str) -> PerProto:
    ll, ll128, simple = t.numbers(key, 3)
    return PerProto(ll, ll128, simple)


def _per_algo(t: _Table) -> PerAlgo:
    result = PerAlgo(
        tree=_per_proto(t, "tree"),
        ring=_per_proto(t, "ring"),
        nvls=_per_proto(t, "nvls"),
        nvls_tree=_per_proto(t, "nvls_tree"),
        pat=_per_proto(t, "pat"),
    )
    t.done()
    return result


def _per_scale(t: _Table, key: str) -> PerScale:
    n1, n2, n4 = t.numbers(key, 3, zero=False)
    return PerScale(n1, n2, n4)


def _per_scale_zero(t: _Table, key: str) -> PerScale:
    """A per-scale table where 0 means "unused" (NCCL's perChMaxNVLSTreeBws at 1 node)."""
    n1, n2, n4 = t.numbers(key, 3, zero=True)
    return PerScale(n1, n2, n4)


def _half_slowdown(t: _Table) -> HalfSlowdown:
    """``[gpu.scalar_convert_slowdown]``: f16 and bf16, each at least 1 (default 1)."""
    values = {d: t.number(d, low=1.0, zero=True) for d in ("f16", "bf16") if d in t.data}
    t.done()
    return HalfSlowdown(**values)


def _per_half(t: _Table) -> PerHalf:
    """``[gpu.convert_ns]``: ns per element for f16 and bf16, each optional (0), one
    number for both ways or ``[widen, narrow]``."""
    values: dict[str, float] = {}
    for d in ("f16", "bf16"):
        if d not in t.data:
            continue
        if isinstance(t.data[d], list):
            values[f"{d}_widen"], values[f"{d}_narrow"] = t.numbers(d, 2)
        else:
            values[f"{d}_widen"] = values[f"{d}_narrow"] = t.number(d, zero=True)
    t.done()
    return PerHalf(**values)


def _reduce_ns(t: _Table) -> ReduceNs:
    """``[overlap.reduce_ns]``: f32, f16, bf16 and far, each optional (0)."""
    names = ("f32", "f16", "bf16", "far")
    result = ReduceNs(**{d: t.number(d, zero=True) for d in names if d in t.data})
    t.done()
    return result


def _per_dtype(t: _Table) -> PerDType:
    result = PerDType(**{d: t.number(d) for d in DTYPE_NAMES})
    t.done()
    return result


def _measured(m: _Table) -> MeasuredSpec:
    """``[nccl.measured]`` as read (every field checked; unknown ones refused)."""
    out = MeasuredSpec(
        hop_latency_scale=m.number("hop_latency_scale"),
        channel_gbps=m.number("channel_gbps"),
        ring_fill_mib=m.number("ring_fill_mib", zero=True),
        ring_fill_half_mib=m.number("ring_fill_half_mib"),
        nvls_fill_mib=m.number("nvls_fill_mib", zero=True),
        nvls_fill_half_mib=m.number("nvls_fill_half_mib"),
        p2p_nvlink_efficiency=m.number("p2p_nvlink_efficiency", high=4.0),
        net_congestion=m.number("net_congestion", high=0.5, zero=True),
        base_latency_scale=_per_proto_or_one(m, "base_latency_scale", 1.0),
        net_hop_latency_us=(
            m.number("net_hop_latency_us", zero=True) if "net_hop_latency_us" in m.data else 0.0
        ),
        ll_bw_scale=m.number("ll_bw_scale") if "ll_bw_scale" in m.data else 1.0,
        net_fill_mib=m.number("net_fill_mib", zero=True) if "net_fill_mib" in m.data else 0.0,
        net_fill_half_mib=(m.number("net_fill_half_mib") if "net_fill_half_mib" in m.data else 8.0),
        ring_fill_steps=(
            m.number("ring_fill_steps", zero=True, high=4.0) if "ring_fill_steps" in m.data else 0.0
        ),
        p2p_ll_gbps=(m.number("p2p_ll_gbps", zero=True) if "p2p_ll_gbps" in m.data else 0.0),
        p2p_ll_peer_hops=(
            m.number("p2p_ll_peer_hops", zero=True) if "p2p_ll_peer_hops" in m.data else 1.0
        ),
        p2p_latency_scale=(m.number("p2p_latency_scale") if "p2p_latency_scale" in m.data else 1.0),
    )
    m.done()
    return out


class _Layered(_Table):
    """A table read through another: the fields of ``over`` replace the base's, and an
    error names the table each field came from."""

    def __init__(self, base: _Table, over: dict[str, Any], over_prefix: str):
        super().__init__({**base.data, **over}, base.prefix, base.where)
        self.over = over
        self.over_prefix = over_prefix

    def _name(self, key: str) -> str:
        return f"{self.over_prefix}{key}" if key in self.over else super()._name(key)


def _measured_for(m: _Table, version: tuple[int, int, int]) -> MeasuredSpec:
    """The measured terms that apply at NCCL ``version``: ``[nccl.measured]``, with each
    ``[nccl.measured.upto."X"]`` table whose release X is ``version`` or later laid over
    it, latest X first, so the earliest such release decides (terms fitted on sweeps of an
    older release than the profile's: docs/cost-model.md, "Measured terms")."""
    upto = m.data.get("upto", {})
    m.used.add("upto")
    if not isinstance(upto, dict):
        raise m.error("upto", f'expected tables like [nccl.measured.upto."2.23"], got {upto!r}')
    plain = _Table({k: v for k, v in m.data.items() if k != "upto"}, m.prefix, m.where)
    measured = _measured(plain)  # the profile's own release: every field checked
    layers: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
    for release, table in upto.items():
        prefix = f'{m.prefix}upto."{release}".'
        try:
            at = parse_nccl_version(release)
        except ValueError as exc:
            raise ProfileError(f"{m.where}: table '{m.prefix}upto': {exc}", path=m.where,
                               field=f"{m.prefix}upto") from None  # fmt: skip
        if not isinstance(table, dict) or "upto" in table:
            raise ProfileError(
                f"{m.where}: field '{prefix[:-1]}': expected a table of measured terms, "
                f"got {table!r}", path=m.where, field=prefix[:-1],
            )  # fmt: skip
        _measured(_Layered(plain, table, prefix))  # every layer is checked, used or not
        if version <= at:
            layers.append((at, table))
    merged: dict[str, Any] = {}
    for _, table in sorted(layers, key=lambda layer: layer[0], reverse=True):
        merged.update(table)
    return _measured(_Layered(plain, merged, m.prefix)) if merged else measured


def _build(raw: dict[str, Any], where: str) -> Hardware:
    top = _Table(raw, "", where)
    name = top.string("name")
    description = top.string("description")

    g = top.table("gpu")
    eff = g.table("efficiency")
    hbm_points = eff.rows("hbm", 2)
    if any(e > 1.0 for _, e in hbm_points):
        raise eff.error("hbm", "efficiencies must be at most 1")
    if list(hbm_points) != sorted(hbm_points):
        raise eff.error("hbm", "rows must be sorted by size")
    tiles = eff.rows("matmul_tiles", 3)
    for tm, tn, te in tiles:
        if tm != int(tm) or tn != int(tn) or te > 1.0:
            raise eff.error("matmul_tiles", "expected [tile_m, tile_n, efficiency ≤ 1] rows")
    gpu = GpuSpec(
        arch=g.string("arch", ARCHS),
        sms=g.integer("sms"),
        hbm_gbps=g.number("hbm_gbps"),
        launch_overhead_us=g.number("launch_overhead_us", zero=True),
        kernel_gap_us=g.number("kernel_gap_us", zero=True),
        matmul_tflops=_per_dtype(g.table("matmul_tflops")),
        vector_tflops=_per_dtype(g.table("vector_tflops")),
        matmul_efficiency=eff.fraction("matmul"),
        matmul_k_half=eff.number("matmul_k_half", zero=True),
        matmul_tiles=tuple((int(tm), int(tn), te) for tm, tn, te in tiles),
        vector_efficiency=eff.fraction("vector"),
        hbm_efficiency=tuple((b, e) for b, e in hbm_points),
        hbm_efficiency_floor=eff.fraction("hbm_floor"),
        convert_ns=_per_half(g.table("convert_ns")) if "convert_ns" in g.data else PerHalf(),
        libm_call_ns=g.number("libm_call_ns", zero=True) if "libm_call_ns" in g.data else 0.0,
        sum_chain_ns=g.number("sum_chain_ns", zero=True) if "sum_chain_ns" in g.data else 0.0,
        scalar_slowdown=g.number("scalar_slowdown", low=1.0, zero=True)
        if "scalar_slowdown" in g.data
        else 1.0,
        scalar_convert_slowdown=_half_slowdown(g.table("scalar_convert_slowdown"))
        if "scalar_convert_slowdown" in g.data
        else None,
    )
    eff.done()
    g.done()

    n = top.table("node")
    node = NodeSpec(
        gpus_per_node=n.integer("gpus_per_node"),
        cpu_vendor=n.string("cpu_vendor", ("intel", "amd", "arm", "other")),
        intra_link=Link(n.string("intra_link", (Link.NVLINK.value, Link.PCI.value))),
        nvlink_links=n.integer("nvlink_links", minimum=0),
        nvlink_link_gbps=n.number("nvlink_link_gbps", zero=True),
        pci_gbps=n.number("pci_gbps"),
        nics_per_node=n.integer("nics_per_node"),
        nic_gbps=n.number("nic_gbps"),
        net_efficiency=n.fraction("net_efficiency"),
    )
    if node.intra_link is Link.NVLINK and node.nvlink_links * node.nvlink_link_gbps == 0:
        raise n.error("nvlink_links", "intra_link is nvlink but the node has no NVLink bandwidth")
    n.done()

    c = top.table("nccl")
    version = c.string("version")
    try:
        tuning = nccl_tuning(version)
    except ValueError as exc:
        raise c.error("version", str(exc)) from None
    v = parse_nccl_version(version)
    caps_default = nccl_caps(version, gpu.arch, node.cpu_vendor)
    # The tuning tables come from the NCCL version; a profile may still give a whole table
    # to override it (a patched NCCL, a measured latency).
    base_latency = (
        _per_algo(c.table("base_latency_us")) if "base_latency_us" in c.data else tuning.base
    )
    if "hw_latency_us" in c.data:
        lat = c.table("hw_latency_us")
        hw_latency = (
            _per_algo(lat.table("nvlink")),
            _per_algo(lat.table("pci")),
            _per_algo(lat.table("net")),
        )
        lat.done()
    else:
        hw_latency = (tuning.nvlink, tuning.pci, tuning.net)
    if "caps_gbps" in c.data:
        caps = c.table("caps_gbps")
        cap_values: tuple[PerScale, ...] = (
            _per_scale(caps, "ll_max_bw"),
            _per_scale(caps, "per_ch_max_ring_ll128_bw"),
            _per_scale(caps, "per_ch_max_tree_ll128_bw"),
            _per_scale(caps, "per_ch_max_tree_bw"),
            _per_scale_zero(caps, "per_ch_max_nvls_tree_bw"),
        )
        caps.done()
    else:
        cap_values = caps_default
    measured = _measured_for(c.table("measured"), v)
    nccl = NcclSpec(
        version=version,
        launch_us=c.number("launch_us", zero=True),
        measured=measured,
        pat_bw_factor=tuning.pat_bw_factor,
        channels=c.integer("channels"),
        ring_plateau=c.number("ring_plateau"),
        net_overhead_us=c.number("net_overhead_us", zero=True),
        net_latency_us=c.number("net_latency_us", zero=True),
        nvls=c.boolean("nvls"),
        nvls_efficiency=c.number("nvls_efficiency", high=1.0, zero=True),
        nvls_channels=c.integer("nvls_channels", minimum=0),
        nvls_min_ranks=c.integer("nvls_min_ranks", minimum=2),
        collnet=c.boolean("collnet"),
        pat=c.boolean("pat"),
        symmetric=c.boolean("symmetric"),
        algorithms=_choices(c, "algorithms", Algo, exclude=Algo.P2P),
        protocols=_choices(c, "protocols", Proto),
        base_latency_us=base_latency,
        hw_latency_us=hw_latency,
        ll_max_bw=cap_values[0],
        per_ch_max_ring_ll128_bw=cap_values[1],
        per_ch_max_tree_ll128_bw=cap_values[2],
        per_ch_max_tree_bw=cap_values[3],
        per_ch_max_nvls_tree_bw=cap_values[4],
    )
    if nccl.nvls and node.intra_link is not Link.NVLINK:
        raise c.error("nvls", 'NVLS needs intra_link = "nvlink"')
    if nccl.nvls and nccl.nvls_efficiency == 0:
        raise c.error("nvls_efficiency", "must be greater than 0 when nvls = true")
    if nccl.nvls and nccl.nvls_channels == 0:
        raise c.error("nvls_channels", "must be at least 1 when nvls = true")
    # An algorithm exists only from the release that brought it: the flags say what the
    # machine supports, the version what the library can run.
    nccl = dataclasses.replace(
        nccl,
        nvls=nccl.nvls and v >= (2, 17, 0),
        pat=nccl.pat and v >= (2, 23, 0),
        symmetric=nccl.symmetric and v >= (2, 27, 0),
    )
    c.done()

    o = top.table("overlap")
    overlap = OverlapSpec(
        compute_slowdown_nvlink=o.number("compute_slowdown_nvlink", high=0.9, zero=True),
        compute_slowdown_net=o.number("compute_slowdown_net", high=0.9, zero=True),
        hbm_bytes_per_reduce_byte=o.number("hbm_bytes_per_reduce_byte", zero=True),
        hbm_bytes_per_copy_byte=o.number("hbm_bytes_per_copy_byte", zero=True),
        reduce_ns=_reduce_ns(o.table("reduce_ns")) if "reduce_ns" in o.data else ReduceNs(),
        peer_dirty_ns=(
            o.number("peer_dirty_ns", zero=True) if "peer_dirty_ns" in o.data else 0.0
        ),
    )
    o.done()

    d = top.table("device")
    device = DeviceSpec(
        peer_gbps=d.number("peer_gbps"), barrier_us=d.number("barrier_us", zero=True)
    )
    d.done()
    top.done()
    return Hardware(name, description, where, gpu, node, nccl, overlap, device)


def hbm_efficiency(hw: Hardware, nbytes: float) -> float:
    """Achievable fraction of HBM bandwidth for a kernel moving ``nbytes``.

    Piecewise linear in log10(bytes) through the profile's points, flat beyond the last;
    below the first it continues the first segment's slope down to ``hbm_floor``.
    """
    points = hw.gpu.hbm_efficiency
    floor = hw.gpu.hbm_efficiency_floor
    if nbytes <= 0:
        return floor
    x = math.log10(nbytes)
    xs = [math.log10(b) for b, _ in points]
    ys = [e for _, e in points]
    if x >= xs[-1]:
        return ys[-1]
    if len(xs) == 1:
        return ys[0] if x >= xs[0] else floor
    if x <= xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0]) if xs[1] > xs[0] else 0.0
        return max(floor, ys[0] - slope * (xs[0] - x))
    for i in range(len(xs) - 1):
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return ys[-1]
