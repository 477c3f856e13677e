"""Time of one NCCL collective, after NCCL's own tuning model.

NCCL fills a table ``time[algo][proto]`` for every collective and runs the cheapest
entry (``src/graph/tuning.cc``, ``src/enqueue.cc``); this module reproduces that table
from a ``Hardware`` profile::

    time = latency + nbytes / algBw
    latency = base[algo][proto] + steps × hopLatency  (+ inter-node terms)
    algBw  = busBw × nRanks / nSteps       (ring: nSteps = 2(n−1) AR, n−1 RS/AG, n otherwise)
    algBw  = busBw / 2                      (tree)

``nbytes`` is always the size of the full logical buffer, as nccl-tests counts it: the
allreduce buffer, the *gathered* allgather output, the *unreduced* reducescatter input,
the broadcast/reduce buffer, the message of a send. ``CollCost.bus_bw_gbps`` is the
bus bandwidth nccl-tests would print (``algBw × 2(n−1)/n`` for allreduce, ``× (n−1)/n``
for reducescatter/allgather, ``× 1`` otherwise), so model and measurement compare
directly. A world rank r runs on node ⌊r / ranks_per_node⌋; a communicator that spans
nodes runs its rings and trees over the network and takes the network's bandwidth and
latency terms.

Functions the simulator calls:

- ``collective_time(hw, coll, nbytes, nranks, *, algo=None, proto=None,
  ranks_per_node=None) -> CollCost`` — the cheapest (or the forced) algorithm/protocol.
- ``collective_candidates(...) -> list[CollCost]`` — every enabled choice, cheapest first.
- ``p2p_time(hw, nbytes, *, same_node) -> CollCost`` — one point-to-point message.
- ``scalar_allreduce(hw, nranks, *, nbytes=4, ranks_per_node=None) -> CollCost`` — the
  implicit reduction of a norm or sum (latency-bound).
- ``device_kernel_time(hw, nranks, *, reduce_bytes, gather_bytes, compute_s=0, sms=None)
  -> DeviceKernelCost`` — one ``nccl-device`` fused RS→compute→AG kernel.

NCCL ranks the choices by its own model (``CollCost.tuner_time_s``, with the tuning
constants of the profile's NCCL version); ``time_s`` is the chosen entry with the
measured terms NCCL's model leaves out (``hw.nccl.measured``: channels that carry
bandwidth, per-hop latency, pipeline fill, the p2p pair rate, network congestion;
docs/cost-model.md, "Measured terms").

Times are in seconds; bandwidths in GB/s (10^9 B/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from cocoviz.errors import InputError
from cocoviz.ir.collectives import Collective, collective, collective_named
from cocoviz.ir.nodes import Op
from cocoviz.ir.types import DType
from cocoviz.sim.hardware import Algo, Hardware, Link, Proto, hbm_efficiency

__all__ = [
    "Algo",
    "Coll",
    "CollCost",
    "CostModelError",
    "DeviceKernelCost",
    "Proto",
    "bus_factor",
    "collective_candidates",
    "collective_time",
    "device_kernel_time",
    "emitted_buffers_registered",
    "p2p_time",
    "scalar_allreduce",
]


class CostModelError(InputError, ValueError):
    """A question the model cannot answer (an unavailable algorithm, an impossible
    layout): an input error (exit 1), and a ValueError for callers that try a value."""


_COLL_OF: dict[Op, Coll] = {}
"""`Coll.of` of each operator asked for (an enum lookup by value is a slow call)."""


class Coll(StrEnum):
    """The collectives the cost model prices: each row of the collectives table
    (`cocoviz.ir.collectives`) names its member in ``cost_name``; the formulas below are
    what a new member needs. Spelled as the .coco language spells them (``sendrecv`` is
    ``send``)."""

    ALLREDUCE = "allreduce"
    REDUCESCATTER = "reducescatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    SENDRECV = "sendrecv"
    ALLTOALL = "alltoall"

    @classmethod
    def of(cls, op: Op) -> Coll:
        """The cost model's name of a collective operator."""
        found = _COLL_OF.get(op)
        if found is None:
            found = _COLL_OF[op] = cls(collective(op).cost_name)
        return found

    @property
    def row(self) -> Collective:
        """This collective's row of the collectives table."""
        row = collective_named(self.value)
        assert row is not None, f"{self.value} has no row in the collectives table"
        return row

    @classmethod
    def parse(cls, text: str | Coll) -> Coll:
        """A cost-model name, a DSL spelling (``send``), or ``recv``/``p2p``."""
        if isinstance(text, Coll):
            return text
        key = text.strip().lower().replace("_", "").replace("-", "")
        row = collective_named({"recv": "sendrecv", "p2p": "sendrecv"}.get(key, key))
        try:
            return cls(row.cost_name if row is not None else key)
        except ValueError:
            known = ", ".join(c.value for c in cls)
            raise CostModelError(f"unknown collective {text!r} (expected one of {known})") from None


def _parse_algo(text: str | Algo) -> Algo:
    if isinstance(text, Algo):
        return text
    try:
        return Algo(text.strip().lower())
    except ValueError:
        known = ", ".join(a.value for a in Algo)
        raise CostModelError(f"unknown algorithm {text!r} (expected one of {known})") from None


def _parse_proto(text: str | Proto) -> Proto:
    if isinstance(text, Proto):
        return text
    for proto in Proto:
        if proto.value.lower() == text.strip().lower():
            return proto
    known = ", ".join(p.value for p in Proto)
    raise CostModelError(f"unknown protocol {text!r} (expected one of {known})")


def bus_factor(coll: Coll | str, nranks: int) -> float:
    """nccl-tests' busBw / algBw factor (``doc/PERFORMANCE.md``)."""
    c = Coll.parse(coll)
    if nranks <= 1:
        return 1.0
    if c is Coll.ALLREDUCE:
        return 2.0 * (nranks - 1) / nranks
    if c in (Coll.REDUCESCATTER, Coll.ALLGATHER, Coll.ALLTOALL):
        return (nranks - 1) / nranks
    return 1.0


@dataclass(frozen=True)
class CollCost:
    """The predicted cost of one collective call, as NCCL would run it."""

    coll: Coll
    nbytes: int
    nranks: int
    nnodes: int
    algo: Algo
    proto: Proto
    time_s: float
    """Whole call on the GPU, as a measurement shows it: latency_s + transfer_s."""
    latency_s: float
    """The size-independent part: NCCL's ``lat`` with the measured per-hop latency."""
    transfer_s: float
    """The size-dependent part: ``nbytes / (model_alg_bw × efficiency)``, i.e. the bytes at
    the channels' rate plus the pipeline fill (and, across nodes, congestion)."""
    model_alg_bw_gbps: float
    """NCCL's asymptotic algorithm bandwidth for this choice (``bw[coll][algo][proto]``)."""
    channels: int
    """CTAs (one SM each) the call occupies after NCCL trims channels for small sizes."""
    link: Link
    """The slowest link class the call crosses."""
    tuner_latency_s: float = 0.0
    """NCCL's own latency entry (``comm->latencies``), before the measured terms."""
    tuner_time_s: float = 0.0
    """NCCL's own estimate (``ncclTopoGetAlgoTime``): what NCCL ranks the choices by."""
    efficiency: float = 1.0
    """Bandwidth achieved at this size ÷ NCCL's ``model_alg_bw_gbps`` (fewer channels,
    pipeline fill, network congestion; 1.0: NCCL's model exactly)."""
    launch_s: float = 0.0
    """Host time to issue the call outside a CUDA graph (``nccl.launch_us``): added by a
    caller whose calls wait for each other (``blocking``), hidden otherwise."""

    @property
    def alg_bw_gbps(self) -> float:
        """nbytes / time, as nccl-tests reports ``algbw``."""
        return self.nbytes / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def bus_bw_gbps(self) -> float:
        """algbw × the nccl-tests factor, as nccl-tests reports ``busbw``."""
        return self.alg_bw_gbps * bus_factor(self.coll, self.nranks)

    @property
    def label(self) -> str:
        return f"{self.algo.value}/{self.proto.value}"


@dataclass(frozen=True)
class _Topo:
    """Where the ranks of a collective sit: how many, per node, and on how many nodes."""

    nranks: int
    ranks_per_node: int
    nnodes: int


def _topology(hw: Hardware, nranks: int, ranks_per_node: int | None) -> _Topo:
    if nranks < 1:
        raise CostModelError(f"a collective needs at least 1 rank, got {nranks}")
    gpn = hw.node.gpus_per_node
    rpn = min(nranks, gpn) if ranks_per_node is None else ranks_per_node
    if rpn < 1 or rpn > gpn:
        raise CostModelError(
            f"ranks_per_node must be between 1 and {gpn} (GPUs per node on {hw.name}), got {rpn}"
        )
    rpn = min(rpn, nranks)
    return _Topo(nranks, rpn, math.ceil(nranks / rpn))


_SEARCH_SPEEDS = {
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
"""The per-channel speeds NCCL's graph search tries inside a node (``sm90SpeedArrayIntra``,
``sm100SpeedArrayIntra``; every other GPU ``speedArrayIntra``: ``_SEARCH_SPEEDS_OTHER``;
``src/graph/search.cc``, v2.18.3-1 to v2.29.2-1) [V]."""
_SEARCH_SPEEDS_OTHER = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
_SEARCH_MAX_CHANNELS = 32
"""``MAXCHANNELS / 2``: the channels a ring or tree search may find before NCCL doubles them."""


def _search_gbps(hw: Hardware) -> float:
    """NCCL's ``nChannels × bwIntra`` of the ring and tree graphs inside an NVLink node, which
    its tuner ranks algorithms with (``ncclTopoCompute``, ``src/graph/search.cc``) [V]: the
    search tries the architecture's speeds and keeps the graph of most bandwidth, as many
    channels of one speed as the links carry — a multiple of a speed, at most the links'
    rate (H100: 18 × 20.6 = 370.8 GB/s of NVLink, 12 × 30 = 360 for the graph)."""
    links = hw.intra_gbps
    if hw.node.intra_link is not Link.NVLINK:
        return links
    speeds = _SEARCH_SPEEDS.get(hw.gpu.arch, _SEARCH_SPEEDS_OTHER)
    best = max(min(int(links / s + 1e-9), _SEARCH_MAX_CHANNELS) * s for s in speeds)
    return best if best > 0 else links


def _graph_bw(hw: Hardware, topo: _Topo, search: bool = False) -> float:
    """NCCL's ``nChannels × bw`` for a ring or tree graph: the per-rank link rate (``search``:
    the search's, which NCCL's tuner ranks with: ``_search_gbps``)."""
    intra = _search_gbps(hw) if search else hw.intra_gbps
    if topo.nnodes == 1:
        return intra
    inter = hw.net_gbps(topo.ranks_per_node)
    return inter if topo.ranks_per_node == 1 else min(intra, inter)


# NCCL src/graph/tuning.cc: "Trees are not perfectly sticking to the model for medium
# sizes." Powers of two from 64 B to 256 MiB, [LL, LL128, Simple].
_TREE_CORRECTION: dict[Proto, tuple[float, ...]] = {
    Proto.LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    Proto.LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    Proto.SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}  # fmt: skip

# NCCL's threads per CTA and bytes per thread before a channel is added (src/include/
# device.h, comm.h; perf-data §1.1, §1.4).
_THREADS = {Proto.LL: 512, Proto.LL128: 640, Proto.SIMPLE: 512}
_THREAD_THRESHOLD = {Proto.LL: 8, Proto.LL128: 8, Proto.SIMPLE: 64}


def _nsteps(coll: Coll, nranks: int) -> int:
    if coll is Coll.ALLREDUCE:
        return 2 * (nranks - 1)
    if coll in (Coll.REDUCESCATTER, Coll.ALLGATHER):
        return nranks - 1
    return nranks


def _available(
    hw: Hardware, coll: Coll, topo: _Topo, symmetric: bool = False
) -> list[tuple[Algo, Proto]]:
    """NCCL's enabled (algorithm, protocol) pairs for this call, after its enable rules
    (``ncclTopoTuneModel`` and the NVLS/PAT model init in ``src/graph/tuning.cc``)."""
    pairs = _nccl_pairs(hw, coll, topo, symmetric)
    algos, protos = hw.nccl.algorithms, hw.nccl.protocols
    return [
        (a, p)
        for a, p in pairs
        if (not algos or a is Algo.P2P or a in algos) and (not protos or p in protos)
    ]


def _nccl_pairs(hw: Hardware, coll: Coll, topo: _Topo, symmetric: bool) -> list[tuple[Algo, Proto]]:
    """Every pair NCCL enables for the call, before the profile's NCCL_ALGO/NCCL_PROTO."""
    if coll in (Coll.SENDRECV, Coll.ALLTOALL):
        return [(Algo.P2P, Proto.LL), (Algo.P2P, Proto.SIMPLE)]
    pairs = [(Algo.RING, p) for p in Proto]
    if coll is Coll.ALLREDUCE:
        pairs += [(Algo.TREE, p) for p in Proto]
    if _nvls_ok(hw, coll, topo):
        pairs.append((Algo.NVLS, Proto.SIMPLE))
    if _nvls_tree_ok(hw, coll, topo):
        pairs.append((Algo.NVLS_TREE, Proto.SIMPLE))
    if _pat_ok(hw, coll, topo):
        pairs.append((Algo.PAT, Proto.SIMPLE))
    if symmetric and _symmetric_ok(hw, coll, topo):
        pairs.append((Algo.SYMMETRIC, Proto.SIMPLE))
    return pairs


_NVLS_COLLS = (Coll.ALLREDUCE, Coll.REDUCESCATTER, Coll.ALLGATHER)


def _nvls_hw_ok(hw: Hardware, topo: _Topo) -> bool:
    """NVLink SHARP on this machine for a communicator with this many ranks per node
    (NCCL needs at least two NVLS channels; below ``nvls_min_ranks`` per node NVLS does
    not beat the ring and NCCL does not choose it)."""
    c = hw.nccl
    return c.nvls and c.nvls_channels >= 2 and topo.ranks_per_node >= c.nvls_min_ranks


def _nvls_ok(hw: Hardware, coll: Coll, topo: _Topo) -> bool:
    # NVLS serves allreduce, reducescatter and allgather; across nodes NCCL runs NVLS only
    # with CollNet (network SHARP) underneath.
    if coll not in _NVLS_COLLS or not _nvls_hw_ok(hw, topo):
        return False
    return topo.nnodes == 1 or hw.nccl.collnet


def _nvls_tree_ok(hw: Hardware, coll: Coll, topo: _Topo) -> bool:
    # NVLS_TREE: allreduce only, more than one node (NCCL disables it on one node).
    return coll is Coll.ALLREDUCE and topo.nnodes > 1 and _nvls_hw_ok(hw, topo)


def _pat_ok(hw: Hardware, coll: Coll, topo: _Topo) -> bool:
    # NCCL's ncclPatEnable: reducescatter/allgather, one GPU per node (nNodes == nRanks).
    return (
        hw.nccl.pat
        and coll in (Coll.REDUCESCATTER, Coll.ALLGATHER)
        and topo.ranks_per_node == 1
        and topo.nranks > 1
    )


def _symmetric_ok(hw: Hardware, coll: Coll, topo: _Topo) -> bool:
    # NCCL >= 2.27 symmetric kernels: registered windows, all ranks in one NVLink domain.
    return (
        hw.nccl.symmetric
        and coll in _NVLS_COLLS
        and topo.nnodes == 1
        and hw.node.intra_link is Link.NVLINK
    )


def _why_unavailable(hw: Hardware, coll: Coll, topo: _Topo, algo: Algo, proto: Proto | None) -> str:
    if algo is Algo.P2P or coll in (Coll.SENDRECV, Coll.ALLTOALL):
        return (
            f"{coll.value} runs only as p2p (LL or Simple), and p2p only serves sendrecv "
            "and alltoall"
        )
    if algo is Algo.TREE:
        return "tree serves only allreduce"
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        if coll not in _NVLS_COLLS:
            return f"{algo.value} serves only allreduce, reducescatter and allgather"
        if algo is Algo.NVLS_TREE and coll is not Coll.ALLREDUCE:
            return "nvls_tree serves only allreduce (reducescatter/allgather use nvls)"
        if not hw.nccl.nvls:
            return f"{hw.name} has no NVLink SHARP (NVLS)"
        if algo is Algo.NVLS_TREE and topo.nnodes == 1:
            return "nvls_tree spans nodes; on one node NCCL runs nvls"
        if algo is Algo.NVLS and topo.nnodes > 1 and not hw.nccl.collnet:
            what = "nvls_tree" if coll is Coll.ALLREDUCE else "ring or pat"
            return (
                f"nvls across nodes needs CollNet (network SHARP), which {hw.name} does not "
                f"have (collnet = false); across nodes NCCL runs {what}"
            )
        if topo.ranks_per_node < hw.nccl.nvls_min_ranks:
            return (
                f"{algo.value} is used only with at least {hw.nccl.nvls_min_ranks} ranks "
                f"per node on {hw.name}"
            )
        if proto is not Proto.SIMPLE:
            return f"{algo.value} runs only the Simple protocol"
    if algo is Algo.PAT:
        if coll not in (Coll.REDUCESCATTER, Coll.ALLGATHER):
            return "pat serves only reducescatter and allgather"
        if not hw.nccl.pat:
            return f"{hw.name}'s NCCL has no PAT (pat = false)"
        if topo.ranks_per_node != 1:
            return "pat runs only with one GPU per node (NCCL's ncclPatEnable)"
        if proto is not Proto.SIMPLE:
            return "pat runs only the Simple protocol"
    if algo is Algo.SYMMETRIC:
        if coll not in _NVLS_COLLS:
            return "symmetric kernels serve only allreduce, reducescatter and allgather"
        if not hw.nccl.symmetric:
            return f"{hw.name}'s NCCL has no symmetric-memory kernels (symmetric = false)"
        if topo.nnodes > 1 or hw.node.intra_link is not Link.NVLINK:
            return "symmetric kernels need all ranks in one NVLink domain"
        if proto is not None and proto is not Proto.SIMPLE:
            return "symmetric kernels are modelled with the Simple protocol only"
        return "symmetric kernels run only on registered buffers (pass symmetric=True)"
    return f"{algo.value}/{proto.value if proto else '*'} is not available for {coll.value}"


_NVLS_CHANNEL_ALGOS = (Algo.NVLS, Algo.NVLS_TREE, Algo.SYMMETRIC)


def _channels(hw: Hardware, algo: Algo, proto: Proto, nbytes: int, nranks: int) -> int:
    """NCCL trims channels while ``nBytes < nc × nThreads × threadThreshold``."""
    most = hw.nccl.nvls_channels if algo in _NVLS_CHANNEL_ALGOS else hw.nccl.channels
    threshold = _THREAD_THRESHOLD[proto] * (
        nranks if algo is Algo.RING and proto is Proto.LL else 1
    )
    return max(1, min(most, nbytes // (_THREADS[proto] * threshold)))


def _bus_bw(
    hw: Hardware, coll: Coll, topo: _Topo, algo: Algo, proto: Proto, search: bool = False
) -> float:
    """NCCL's bus bandwidth for one algorithm/protocol (``ncclTopoTuneModel``; ``search``:
    on the graph NCCL's search found, as its tuner has it: ``_graph_bw``)."""
    caps = hw.nccl
    nodes = topo.nnodes
    bw = _graph_bw(hw, topo, search)
    if algo is Algo.RING:
        if proto is Proto.LL:
            return min(caps.ll_max_bw.at(nodes), bw * 0.5)
        if proto is Proto.LL128:
            return min(bw * 0.92, caps.channels * caps.per_ch_max_ring_ll128_bw.at(nodes))
        return bw
    if algo is Algo.TREE:
        bw = min(bw * 0.92, caps.channels * caps.per_ch_max_tree_bw.at(nodes))
        if proto is Proto.LL:
            return min(bw / 3.8, caps.ll_max_bw.at(nodes))
        if proto is Proto.LL128:
            scale = 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0
            return min(bw * scale, caps.channels * caps.per_ch_max_tree_ll128_bw.at(nodes))
        return bw
    if algo is Algo.P2P:
        if topo.nnodes > 1:
            bw = hw.nic_effective_gbps  # one GPU, its own NIC
        return min(caps.ll_max_bw.at(nodes), bw * 0.5) if proto is Proto.LL else bw
    if algo is Algo.PAT:
        return bw * caps.pat_bw_factor  # NCCL: PAT busBw × 0.85 (< 2.28.3) or 0.75
    if algo is Algo.NVLS_TREE:
        # NCCL: min(intra NVLS, inter × 2 on ≤ 2 nodes, perChMaxNVLSTreeBw × nCh). The intra
        # term is the single-node NVLS allreduce bus bandwidth of this many ranks per node.
        g = topo.ranks_per_node
        intra = _nvls_allreduce_alg_bw(hw, g) * bus_factor(Coll.ALLREDUCE, g)
        inter = hw.net_gbps(g) * (2.0 if nodes <= 2 else 1.0)
        return min(intra, inter, caps.nvls_channels * caps.per_ch_max_nvls_tree_bw.at(nodes))
    if algo is Algo.NVLS:
        # reducescatter/allgather (allreduce has its own rule in _alg_bw): NCCL's
        # intra × (ppn−1)/ppn, and across nodes (CollNet) the node's NICs.
        g = topo.ranks_per_node
        intra = hw.nvlink_gbps * caps.nvls_efficiency * (g - 1) / g
        return intra if nodes == 1 else min(intra, hw.net_gbps(g))
    raise AssertionError(f"no bus bandwidth rule for {algo}")


def _nvls_allreduce_alg_bw(hw: Hardware, n: int) -> float:
    """NVLS AllReduce on n GPUs of one node: each GPU pushes its whole buffer into the
    switch (multimem.ld_reduce reads every GPU's copy of a shard) and takes its reduced
    shard back, then multicasts the shard (multimem.st). Per GPU that is S + S/n each way,
    so algBw = B·n/(n+1), with B the NVLink rate derated by NCCL's nvlsEfficiency. [D]
    (sjeaugey, NVIDIA/nccl-tests#212: algbw = busbw·n/(n+1)); matches the 8x H200
    GPU-count sweep within 4%."""
    return hw.nvlink_gbps * hw.nccl.nvls_efficiency * n / (n + 1)


def _symmetric_alg_bw(hw: Hardware, coll: Coll, n: int) -> float:
    """NCCL's symmetric kernels (registered windows, one NVLink domain): an allreduce on
    an NVLS machine uses multimem like NVLS; otherwise each rank loads (reducescatter) or
    stores (allgather) its (n−1)/n over the peer links at the ``nccl-device`` kernel's
    peer bandwidth, an allreduce doing both. [D]"""
    if coll is Coll.ALLREDUCE and hw.nccl.nvls:
        return _nvls_allreduce_alg_bw(hw, n)
    per_phase = hw.device.peer_gbps * n / (n - 1)
    return per_phase / 2 if coll is Coll.ALLREDUCE else per_phase


def _alg_bw(
    hw: Hardware,
    coll: Coll,
    topo: _Topo,
    algo: Algo,
    proto: Proto,
    nbytes: int,
    search: bool = False,
) -> float:
    n = topo.nranks
    if algo is Algo.NVLS and coll is Coll.ALLREDUCE:
        return _nvls_allreduce_alg_bw(hw, n)
    if algo is Algo.SYMMETRIC:
        return _symmetric_alg_bw(hw, coll, n)
    bus = _bus_bw(hw, coll, topo, algo, proto, search)
    if algo is Algo.TREE:
        alg = bus * 0.5
        index = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
        if 0 <= index < len(_TREE_CORRECTION[proto]):
            alg *= _TREE_CORRECTION[proto][index]
        return alg
    if coll is Coll.ALLTOALL:
        return _alltoall_alg_bw(hw, topo, proto)
    if algo is Algo.P2P:
        # One send/recv pair inside a node runs below the ring's rate: over NVLink on fewer
        # channels per peer (measured ~0.8 of it), between CPU ranks through MPI's copies
        # (hw.nccl.measured.p2p_nvlink_efficiency, fitted by calibrate --local).
        if topo.nnodes == 1:
            return bus * hw.nccl.measured.p2p_nvlink_efficiency
        return bus
    return bus * n / _nsteps(coll, n)


_P2P_NVLINK_EFFICIENCY = 0.9
"""[D] NCCL's grouped p2p over NVLink against its ring rate: 335 GB/s alltoall busBw on
4 H100s at 500 MB (NVIDIA/nccl#2169, NCCL 2.30) against the ring's 370."""


def _alltoall_alg_bw(hw: Hardware, topo: _Topo, proto: Proto) -> float:
    """NCCL's AlltoAll is one grouped send/recv to every peer, all in flight at once
    (``ncclAlltoAll`` since 2.28; the grouped ncclSend/ncclRecv loop before). A rank
    keeps 1/n of its buffer, sends (ppn−1)/n over NVLink and (n−ppn)/n over the network,
    and the slower part decides: algBw = 1 / max(intra share / NVLink rate, network
    share / the rank's NIC rate). An alltoall cannot spread one GPU's traffic over
    several NICs (sjeaugey, NVIDIA/nccl-tests#267), so a rank gets its nearest NIC, or
    its share of one NIC where GPUs outnumber NICs. Over NVLink, p2p runs at
    `_P2P_NVLINK_EFFICIENCY` of the ring's rate; an alltoall of two ranks on one node is a
    send/recv pair (one peer, on the channels of one peer) and runs at the pair's measured
    share, ``measured.p2p_nvlink_efficiency``, as a sendrecv does. Two nodes give busBw ≈
    2 × the per-GPU network rate, n nodes n/(n−1) × (sjeaugey, NVIDIA/nccl-tests#130)."""
    n, ppn = topo.nranks, topo.ranks_per_node
    pair = _one_nvlink_peer(hw, topo)
    share = hw.nccl.measured.p2p_nvlink_efficiency if pair else _P2P_NVLINK_EFFICIENCY
    intra = hw.intra_gbps * share
    if proto is Proto.LL:
        intra = min(hw.nccl.ll_max_bw.at(topo.nnodes), intra * 0.5)
    per_gpu_net = min(hw.nic_effective_gbps, hw.net_gbps(ppn) / ppn)
    if proto is Proto.LL:  # LL carries 8 bytes of data in 16 on every link
        per_gpu_net *= 0.5
    slowest = (ppn - 1) / n / intra
    if topo.nnodes > 1:
        slowest = max(slowest, (n - ppn) / n / per_gpu_net)
    return 1.0 / slowest if slowest > 0 else intra


def _latency_us(
    hw: Hardware,
    coll: Coll,
    topo: _Topo,
    algo: Algo,
    proto: Proto,
    nbytes: int,
    measured: bool = False,
) -> float:
    """NCCL's latency table entry (``ncclTopoTuneModel`` + ``ncclTopoGetAlgoTime``);
    ``measured``: with the measured terms — the base × ``base_latency_scale``, each hop
    inside a node × ``hop_latency_scale`` (the base and hops of a p2p call ×
    ``p2p_latency_scale`` more), each network step + ``net_hop_latency_us``."""
    c = hw.nccl
    m = c.measured
    intra_link = hw.node.intra_link
    base = c.base_latency_us[algo][proto] * (m.base_latency_scale[proto] if measured else 1.0)
    hop_scale = m.hop_latency_scale
    if algo is Algo.P2P:
        base *= m.p2p_latency_scale if measured else 1.0
        hop_scale *= m.p2p_latency_scale
    intra = c.hw_latency(intra_link)[algo][proto] * (hop_scale if measured else 1.0)
    net_hop = m.net_hop_latency_us if measured else 0.0
    inter_algo = Algo.TREE if topo.ranks_per_node == 1 and algo is not Algo.P2P else algo
    inter = c.hw_latency(Link.NET)[inter_algo][proto] + c.net_latency_us + net_hop
    if proto is Proto.SIMPLE:
        inter += c.net_latency_us  # flush
    nodes = topo.nnodes
    if algo is Algo.P2P and coll is Coll.ALLTOALL:
        # [D] one p2p handshake, then a hop of latency per further peer (NCCL schedules
        # the peers of a grouped send/recv in rounds over its p2p channels).
        # With Simple the peers' messages run side by side on their own channels: one
        # hop inside the node (aiconfigurator's H100 sweeps: ~12 µs at 32 KiB per peer on
        # 2, 4 and 8 GPUs alike). With LL each further peer costs
        # ``measured.p2p_ll_peer_hops`` of a hop (1: in rounds; ncclAlltoAll, 2.28+, runs
        # them side by side: fitted ~0.2 on the 2.29.2 sweeps, docs/cost-model.md).
        further = max(0, topo.ranks_per_node - 2) * (m.p2p_ll_peer_hops if measured else 1.0)
        peers = min(1, topo.ranks_per_node - 1) + (further if proto is Proto.LL else 0.0)
        hops = peers * intra + (topo.nranks - topo.ranks_per_node) * (
            inter if nodes > 1 else 0.0
        ) / max(1, topo.ranks_per_node)
        return base + hops
    if algo is Algo.P2P:
        return base + (intra if nodes == 1 else inter)
    if algo is Algo.NVLS:
        return intra + (inter if nodes > 1 else 0.0)
    if algo is Algo.NVLS_TREE:
        return base + intra + 2 * int(math.log2(nodes)) * inter
    if algo is Algo.PAT:
        inter = c.hw_latency(Link.NET)[Algo.PAT][proto] + 2 * c.net_latency_us + net_hop
        return base + int(math.log2(nodes)) * inter / 3.5 + 2.8 * topo.nranks
    if algo is Algo.SYMMETRIC:
        # [D] the nccl-device kernel's fixed cost: a launch and two LSA barriers.
        return hw.gpu.launch_overhead_us + 2 * hw.device.barrier_us
    if algo is Algo.TREE:
        return base + 2 * ((topo.ranks_per_node - 1) * intra + int(math.log2(nodes)) * inter)
    # Ring
    if coll in (Coll.BROADCAST, Coll.REDUCE):
        # NVSwitch rings are duplicated channels (graph->sameChannels): one hop of latency.
        return base + (intra if nodes == 1 else c.hw_latency(Link.NET)[Algo.RING][proto] + net_hop)
    nsteps = _nsteps(coll, topo.nranks)
    overhead = 0.0
    if nodes > 1:
        overhead = c.net_overhead_us * (3.0 if proto is Proto.SIMPLE else 1.0)
    inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if coll is Coll.ALLREDUCE else nodes - 1)
    lat = base + (nsteps - inter_steps) * max(intra, overhead) + inter_steps * inter
    if (
        proto is Proto.SIMPLE
        and nodes > 1
        and coll is Coll.ALLREDUCE
        and nbytes // (c.channels * topo.nranks) >= 64
    ):
        lat *= c.ring_plateau
    return lat


_FILL_ALGOS = {
    Algo.RING: "ring",
    Algo.PAT: "ring",
    Algo.NVLS: "nvls",
    Algo.NVLS_TREE: "nvls",
}
"""Which measured pipeline-fill term an algorithm pays (tree has NCCL's own mid-size
correction; p2p and the symmetric kernels have none)."""

_MIB = float(1 << 20)

_FILL_REFERENCE_RANKS = 8
"""The ring length at which ``ring_fill_half_mib`` is the half size (the 8-GPU sweeps
the shipped profiles' fill was fitted on); ``ring_fill_steps`` scales it for others."""


def _fill_bytes(
    hw: Hardware,
    algo: Algo,
    nbytes: int,
    proto: Proto = Proto.SIMPLE,
    coll: Coll | None = None,
    nnodes: int = 1,
    nranks: int = _FILL_REFERENCE_RANKS,
) -> float:
    """Pipeline fill and drain that NCCL's model leaves out, as extra bytes at the call's
    own rate, fitted to measured sweeps: ``D · S / (S + S_f)``. Below ``S_f`` it grows
    with the size (a lower mid-size bandwidth); above it the pipeline is full and it costs
    a fixed ``D`` bytes' time; for a ring (and PAT) of ``nranks`` the half size is
    ``S_f × (nranks / 8) ** ring_fill_steps`` (a short ring's fill saturates sooner). [fit]
    A tree across nodes (tree, NVLS_TREE) fills once more
    per level it climbs and descends: ``2·⌊log2 nodes⌋ · D_net · S / (S + S_net)``."""
    m = hw.nccl.measured
    extra = 0.0
    if algo in (Algo.TREE, Algo.NVLS_TREE) and nnodes > 1 and nbytes > 0:
        levels = 2 * int(math.log2(nnodes))
        extra = levels * m.net_fill_mib * _MIB * nbytes / (nbytes + m.net_fill_half_mib * _MIB)
    family = _FILL_ALGOS.get(algo)
    if algo is Algo.P2P and proto is Proto.SIMPLE and coll is Coll.ALLTOALL:
        family = "ring"  # the same Simple FIFO pipeline
    if family is None or nbytes <= 0:
        return extra
    depth, half = (
        (
            m.ring_fill_mib,
            m.ring_fill_half_mib * (nranks / _FILL_REFERENCE_RANKS) ** m.ring_fill_steps,
        )
        if family == "ring"
        else (m.nvls_fill_mib, m.nvls_fill_half_mib)
    )
    return extra + depth * _MIB * nbytes / (nbytes + half * _MIB)


def _congestion(hw: Hardware, topo: _Topo, algo: Algo) -> float:
    """Network bandwidth kept on this many nodes: ``(1 − net_congestion)`` per doubling of
    the node count beyond two (deeper fabrics, more flows per link). [fit]"""
    if topo.nnodes <= 2 or algo in (Algo.NVLS, Algo.SYMMETRIC):
        return 1.0
    return (1.0 - hw.nccl.measured.net_congestion) ** math.log2(topo.nnodes / 2)


_PROTO_PAYLOAD = {Proto.LL: 0.5, Proto.LL128: 120.0 / 128.0, Proto.SIMPLE: 1.0}


def _channel_share(
    hw: Hardware, coll: Coll, topo: _Topo, algo: Algo, proto: Proto, channels: int
) -> float:
    """The share of NCCL's bandwidth that the channels left after trimming can carry.
    NCCL's bus bandwidth is ``nChannels × bw`` (``tuning.cc``), but ``enqueue.cc`` runs a
    small call on fewer channels: ``nc`` of them carry at most ``nc × channel_gbps`` (LL
    half of it, LL128 120/128). [V rule; channel_gbps fitted]"""
    if algo in (Algo.P2P, Algo.SYMMETRIC) or coll is Coll.ALLTOALL:
        return 1.0
    bus = _bus_bw(hw, coll, topo, algo, proto) if algo not in (Algo.NVLS,) else None
    if bus is None:
        g = topo.ranks_per_node
        bus = _nvls_allreduce_alg_bw(hw, g) * bus_factor(Coll.ALLREDUCE, g)
    if algo is Algo.NVLS and coll is not Coll.ALLREDUCE:
        bus = _bus_bw(hw, coll, topo, algo, proto)
    carried = channels * hw.nccl.measured.channel_gbps * _PROTO_PAYLOAD[proto]
    return min(1.0, carried / bus) if bus > 0 else 1.0


def _memory_alg_bw(
    hw: Hardware,
    coll: Coll,
    topo: _Topo,
    nbytes: int,
    in_place: bool = False,
    reuse: tuple[float, float] = (0.0, 0.0),
) -> float:
    """The rate memory allows: every byte a rank puts on the wire is read and written
    ``overlap.hbm_bytes_per_copy_byte`` times in memory (``hbm_bytes_per_reduce_byte`` for a
    reduction; an allreduce reduces half its bytes and copies the other half), at the
    achievable memory bandwidth for that traffic. An allgather out of place also copies
    the rank's own block into place (NCCL's local copy; the CPU target's copy of every
    part): all ``nbytes``, where in place (``in_place``, and the allgather that ends an
    allreduce) it copies only the wire's. On a GPU memory outruns NVLink and the network,
    so the link decides; on CPU ranks whose "link" is a copy through shared memory, memory
    does (a reduce-scatter then costs 3/2 of an allgather in place). ``reuse``: the reuse
    distances of what the call reads and of the storage it writes (``Context.reuse``):
    half its traffic at the curve's rate for each (the larger of it and the traffic). [D]"""

    o = hw.overlap
    k = {
        Coll.ALLREDUCE: (o.hbm_bytes_per_reduce_byte + o.hbm_bytes_per_copy_byte) / 2,
        Coll.REDUCESCATTER: o.hbm_bytes_per_reduce_byte,
        Coll.REDUCE: o.hbm_bytes_per_reduce_byte,
    }.get(coll, o.hbm_bytes_per_copy_byte)
    wire = bus_factor(coll, topo.nranks) if topo.nranks > 1 else 1.0
    if coll is Coll.ALLGATHER and not in_place:
        wire = 1.0  # the own block too
    if k <= 0 or wire <= 0:
        return math.inf
    traffic = nbytes * wire * k
    inverse = sum(0.5 / hbm_efficiency(hw, max(traffic, d)) for d in reuse)
    return hw.gpu.hbm_gbps / inverse / (k * wire)


def _p2p_ll_alg_bw(hw: Hardware, coll: Coll, topo: _Topo, nbytes: int) -> float:
    """The rate of a p2p call on LL (``measured.p2p_ll_gbps`` a channel; 0: no cap): a
    peer's message runs on the channels NCCL gives it (``p2p_plan``), and the peers'
    messages side by side, so an alltoall of S (S/n per peer, on c channels each) takes
    ``(S/n) / (c × p2p_ll_gbps)``. [fit: 3-6 GB/s a channel on H100 and A100,
    docs/cost-model.md]"""
    gbps = hw.nccl.measured.p2p_ll_gbps
    per_peer = _message_bytes(coll, topo, nbytes)
    if gbps <= 0 or per_peer <= 0:
        return math.inf
    _, channels = p2p_plan(hw, topo, per_peer)
    return gbps * channels * nbytes / per_peer


def _one_nvlink_peer(hw: Hardware, topo: _Topo) -> bool:
    """Two ranks on one NVLink node: each rank sends to one peer and receives from it, the
    transfer of a send/recv pair, at the pair's measured share of the ring rate
    (``measured.p2p_nvlink_efficiency``)."""
    return topo.nranks == 2 and topo.nnodes == 1 and hw.node.intra_link is Link.NVLINK


def _is_pair(hw: Hardware, topo: _Topo, algo: Algo) -> bool:
    """A ring or tree that is a send/recv pair (``_one_nvlink_peer``); a 2-rank alltoall
    takes the pair's share in its own rate (``_alltoall_alg_bw``)."""
    return algo in (Algo.RING, Algo.TREE) and _one_nvlink_peer(hw, topo)


def _far_share(hw: Hardware, span: float) -> float:
    """How far beyond the caches data of this reuse distance (or traffic) lies: 0 where
    the memory curve gives the cached rate, 1 where it gives its last (lowest) point,
    between as its time per byte is between (`hbm_efficiency`)."""
    last = hw.gpu.hbm_efficiency[-1][1]
    if last >= 1.0:
        return 0.0
    return min(1.0, max(0.0, (1.0 / hbm_efficiency(hw, span) - 1.0) / (1.0 / last - 1.0)))


def _combine_s(
    hw: Hardware,
    coll: Coll,
    nbytes: int,
    topo: _Topo,
    dtype: str,
    reuse: tuple[float, float] = (0.0, 0.0),
) -> float:
    """The time a rank spends combining a reduction's parts at ``overlap.reduce_ns`` per
    element read (a reduce-scatter or reduce reads all ``nbytes``: G parts of each element
    it owns; ``reduce_ns.far`` more per element by how far beyond the caches its input
    lies, `_far_share` of the input's reuse distance ``reuse[0]``), and, for an
    allreduce, the allgather of the result after it, at the memory rate
    (`_memory_alg_bw`); 0 without the term. The CPU target's shared-memory collectives:
    their transfer is the larger of this and the byte-priced time, so a 16-bit reduction
    in cache costs what its f32 elements cost, and one from DRAM more than its bytes at
    the DRAM rate (a core's combine loop waits for the memory it hid in cache). [fit]"""
    ns = hw.overlap.reduce_ns.of(dtype)
    if ns <= 0 or coll not in (Coll.ALLREDUCE, Coll.REDUCESCATTER, Coll.REDUCE):
        return 0.0
    ns += hw.overlap.reduce_ns.far * _far_share(hw, max(float(nbytes), reuse[0]))
    combine_s = nbytes / DType(dtype).itemsize * ns * 1e-9
    if coll is Coll.ALLREDUCE:
        in_place = _memory_alg_bw(hw, Coll.ALLGATHER, topo, nbytes, True, reuse)
        combine_s += nbytes / (in_place * 1e9)
    return combine_s


def _peer_dirty_s(hw: Hardware, coll: Coll, nbytes: int, topo: _Topo, dirty: bool) -> float:
    """The time a rank spends on the bytes it reads from peers that they wrote in this step
    (``overlap.peer_dirty_ns`` each; 0 without the term): of a collective whose input a
    stage of the step wrote (``dirty``), the (n−1)/n of ``nbytes`` that lie with the
    peers. [fit: CPU ranks, docs/cost-model.md]"""
    ns = hw.overlap.peer_dirty_ns
    n = topo.nranks
    if not dirty or ns <= 0 or n < 2 or coll not in _PEER_READS:
        return 0.0
    return (n - 1) / n * nbytes * ns * 1e-9


_PEER_READS = frozenset({Coll.ALLGATHER, Coll.REDUCESCATTER, Coll.REDUCE, Coll.ALLREDUCE})


def _cost(
    hw: Hardware,
    coll: Coll,
    nbytes: int,
    topo: _Topo,
    algo: Algo,
    proto: Proto,
    dtype: str = "f32",
    in_place: bool = False,
    reuse: tuple[float, float] = (0.0, 0.0),
    dirty: bool = False,
) -> CollCost:
    alg_bw = _alg_bw(hw, coll, topo, algo, proto, nbytes)
    tuner_latency_us = _latency_us(hw, coll, topo, algo, proto, nbytes)
    tuner_transfer_s = nbytes / (_alg_bw(hw, coll, topo, algo, proto, nbytes, search=True) * 1e9)
    channels = _channels(hw, algo, proto, nbytes, topo.nranks)
    latency_us = (
        _latency_us(hw, coll, topo, algo, proto, nbytes, measured=True)
        if algo is not Algo.SYMMETRIC
        else tuner_latency_us
    )
    rate = (
        alg_bw * _channel_share(hw, coll, topo, algo, proto, channels) * _congestion(hw, topo, algo)
    )
    if _is_pair(hw, topo, algo):
        rate *= hw.nccl.measured.p2p_nvlink_efficiency
    if proto is Proto.LL:
        rate *= hw.nccl.measured.ll_bw_scale
    rate = min(rate, _memory_alg_bw(hw, coll, topo, nbytes, in_place, reuse))
    if algo is Algo.P2P and proto is Proto.LL:
        rate = min(rate, _p2p_ll_alg_bw(hw, coll, topo, nbytes))
    steps_of = topo.nranks if algo in (Algo.RING, Algo.PAT) else _FILL_REFERENCE_RANKS
    fill = _fill_bytes(hw, algo, nbytes, proto, coll, topo.nnodes, steps_of)
    combine_s = _combine_s(hw, coll, nbytes, topo, dtype, reuse)
    transfer_s = max((nbytes + fill) / (rate * 1e9), combine_s)
    transfer_s += _peer_dirty_s(hw, coll, nbytes, topo, dirty)
    link = Link.NET if topo.nnodes > 1 else hw.node.intra_link
    return CollCost(
        coll=coll,
        nbytes=nbytes,
        nranks=topo.nranks,
        nnodes=topo.nnodes,
        algo=algo,
        proto=proto,
        time_s=latency_us * 1e-6 + transfer_s,
        latency_s=latency_us * 1e-6,
        transfer_s=transfer_s,
        model_alg_bw_gbps=alg_bw,
        channels=channels,
        link=link,
        tuner_latency_s=tuner_latency_us * 1e-6,
        tuner_time_s=tuner_latency_us * 1e-6 + tuner_transfer_s,
        efficiency=tuner_transfer_s / transfer_s if transfer_s > 0 else 1.0,
        launch_s=hw.nccl.launch_us * 1e-6,
    )


def collective_candidates(
    hw: Hardware,
    coll: Coll | str,
    nbytes: int,
    nranks: int,
    *,
    algo: Algo | str | None = None,
    proto: Proto | str | None = None,
    ranks_per_node: int | None = None,
    symmetric: bool = False,
    dtype: str = "f32",
    in_place: bool = False,
    reuse: tuple[float, float] = (0.0, 0.0),
    dirty: bool = False,
) -> list[CollCost]:
    """Every enabled algorithm/protocol for this call, cheapest first.

    ``algo``/``proto`` restrict the choice the way ``NCCL_ALGO``/``NCCL_PROTO`` do; a
    restriction that leaves nothing raises ``CostModelError`` saying why. ``symmetric``:
    the buffers are registered symmetric windows, which adds NCCL's symmetric kernels.
    ``dtype``: the elements' type, for a reduction's per-element cost
    (``overlap.reduce_ns``, `_combine_s`). ``in_place``: an allgather whose rank's own
    block already lies in the output (`_memory_alg_bw`; nccl-tests' out-of-place column
    is the default). ``reuse``: the reuse distances of its input and output storage
    (`_memory_alg_bw`; the simulator passes them on CPU ranks). ``dirty``: a stage of the
    step wrote its input, so the peers' parts come from their caches (`_peer_dirty_s`).
    """
    c = Coll.parse(coll)
    want_algo = _parse_algo(algo) if algo is not None else None
    want_proto = _parse_proto(proto) if proto is not None else None
    return list(
        _candidates(
            hw,
            c,
            nbytes,
            nranks,
            want_algo,
            want_proto,
            ranks_per_node,
            symmetric,
            dtype,
            in_place,
            reuse,
            dirty,
        )
    )


@lru_cache(maxsize=1 << 16)
def _candidates(
    hw: Hardware,
    c: Coll,
    nbytes: int,
    nranks: int,
    want_algo: Algo | None,
    want_proto: Proto | None,
    ranks_per_node: int | None,
    symmetric: bool = False,
    dtype: str = "f32",
    in_place: bool = False,
    reuse: tuple[float, float] = (0.0, 0.0),
    dirty: bool = False,
) -> tuple[CollCost, ...]:
    """``collective_candidates`` on parsed arguments, memoized: simulators ask again and again."""
    if nbytes < 0:
        raise CostModelError(f"a collective moves a non-negative number of bytes, got {nbytes}")
    topo = _topology(hw, 2 if c is Coll.SENDRECV else nranks, ranks_per_node)
    pairs = [
        (a, p)
        for a, p in _available(hw, c, topo, symmetric)
        if (want_algo is None or a is want_algo) and (want_proto is None or p is want_proto)
    ]
    if not pairs:
        restricted = [
            (a, p)
            for a, p in _nccl_pairs(hw, c, topo, symmetric)
            if (want_algo is None or a is want_algo) and (want_proto is None or p is want_proto)
        ]
        if restricted:
            allowed = [a.value for a in hw.nccl.algorithms] + [p.value for p in hw.nccl.protocols]
            why = f"the profile allows only {', '.join(allowed)} (nccl.algorithms, nccl.protocols)"
        elif want_algo is not None:
            why = _why_unavailable(hw, c, topo, want_algo, want_proto)
        else:
            why = f"protocol {want_proto} is not available for {c.value}"
        raise CostModelError(f"cannot run {c.value} on {topo.nranks} ranks of {hw.name}: {why}")
    if topo.nranks == 1 or nbytes == 0:
        simple = [(a, p) for a, p in pairs if p is Proto.SIMPLE and a in (Algo.RING, Algo.P2P)]
        a, p = (simple or pairs)[0]
        return (_zero_cost(c, nbytes, topo, a, p, hw),)
    costs = [_cost(hw, c, nbytes, topo, a, p, dtype, in_place, reuse, dirty) for a, p in pairs]
    if c in (Coll.SENDRECV, Coll.ALLTOALL):
        # NCCL's p2p has no tuner entry: LL for the sizes ``p2p_plan`` gives it.
        return tuple(sorted(costs, key=lambda k: _p2p_rank(hw, k, topo)))
    # NCCL runs the entry its own model ranks cheapest, whatever it then takes.
    return tuple(sorted(costs, key=lambda k: k.tuner_time_s))


P2P_LL_THRESHOLD = 16384
"""NCCL's ``NCCL_P2P_LL_THRESHOLD`` default: the LL bytes of a p2p message per channel
(``p2p_plan``) [V]."""

_P2P_LL_PER_PEER = ((2, 22, 0), (2, 29, 0))
"""The releases whose ``addP2pToPlan`` runs a p2p message on LL while it is at most
``P2P_LL_THRESHOLD`` × the channels per peer (``thresholdLL``, v2.22.3-1 to v2.28.9-1);
before them a message was cut into parts of at least 64 KiB and a part of at most
``P2P_LL_THRESHOLD`` ran LL (v2.18.3-1 to v2.21.5-1), and from 2.29 its channels are
counted first and LL runs while it carries at most ``P2P_LL_THRESHOLD`` a channel
(v2.29.2-1): LL up to 16 KiB either way [V]."""

_LL_STEP = 8 * 512 * 16
"""An LL step (``buffSizes[LL] / NCCL_STEPS``: 8 lines × 512 threads × 16 bytes, of a
512 KiB buffer in 8 steps) [V]."""

_P2P_CHUNK = {Link.NVLINK: 1 << 19, Link.PCI: 1 << 17, Link.NET: 1 << 17}
"""``NCCL_P2P_{NVL,PCI,NET}_CHUNKSIZE`` defaults: a Simple p2p step on all-NVLink
nodes, on PCI, and across nodes (``src/init.cc``) [V]."""


def _pow2_up(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def p2p_channels_per_peer(hw: Hardware, topo: _Topo) -> tuple[int, int]:
    """NCCL's p2p channels and channels per peer (``ncclTopoComputeP2pChannels``,
    ``ncclTopoGetNchannels`` in ``src/graph/paths.cc``) [V]: the p2p channels are the
    collective ones (at most 32) rounded up to a power of two; a peer over NVLink gets two
    channels per NVLink of its path, one over PCI two, one across nodes two (halved while
    the ranks would need more than four rounds of the p2p channels; [D] one NIC); the
    channels per peer are the least of the peers', rounded up to a power of two and at
    most the p2p channels."""
    p2p = _pow2_up(max(1, min(hw.nccl.channels, 32)))
    if hw.node.intra_link is Link.NVLINK:
        peer = 2 * max(1, hw.node.nvlink_links)
    else:
        peer = 2
    if topo.nnodes > 1:
        net = 2
        while net * topo.nranks > p2p * 4 and net > 1:
            net //= 2
        peer = min(peer, net)
    return p2p, min(_pow2_up(peer), p2p)


def p2p_plan(hw: Hardware, topo: _Topo, nbytes: int) -> tuple[Proto, int]:
    """The protocol and channels of one peer's message of ``nbytes`` in a grouped
    send/recv (``addP2pToPlan`` and ``scheduleP2pTasksToPlan``, ``src/enqueue.cc``) [V].
    A message gets a channel per part of at least a step/8 (a step/2 across nodes), up to
    the per-peer channels halved while the peers would need more than the p2p channels,
    and more only past parts of 32 steps (one across nodes). From 2.22 to 2.28 LL runs
    while the message is at most ``P2P_LL_THRESHOLD`` × the channels per peer (512 KiB
    on the 8-GPU profiles, its parts counted in LL steps); otherwise while it is at most
    ``P2P_LL_THRESHOLD`` a channel, its channels counted in Simple steps (LL ends at
    16 KiB: ``_P2P_LL_PER_PEER``)."""
    p2p, per_peer = p2p_channels_per_peer(hw, topo)
    least = per_peer
    while least * topo.nranks > p2p and least > 1:
        least //= 2
    link = Link.NET if topo.nnodes > 1 else hw.node.intra_link
    simple_step = _P2P_CHUNK.get(link, 1 << 17)

    def channels(step: int) -> int:
        if nbytes <= 0:
            return 1
        min_part = step // 2 if topo.nnodes > 1 else step // 8
        max_part = step if topo.nnodes > 1 else step * 32
        n = max(1, min(least, -(-nbytes // min_part)))
        part = max(min_part, -(-nbytes // n))
        while part > max_part and n <= per_peer // 2:
            n *= 2
            part = -(-nbytes // n)
        return n

    since, until = _P2P_LL_PER_PEER
    if since <= hw.nccl.version_tuple < until:
        if nbytes <= per_peer * P2P_LL_THRESHOLD:
            return Proto.LL, channels(_LL_STEP)
        return Proto.SIMPLE, channels(simple_step)
    n = channels(simple_step)
    return (Proto.LL, n) if nbytes <= n * P2P_LL_THRESHOLD else (Proto.SIMPLE, n)


def _message_bytes(coll: Coll, topo: _Topo, nbytes: int) -> int:
    """The bytes of one peer's message of a p2p call: an alltoall of S sends S/n a peer."""
    return nbytes // topo.nranks if coll is Coll.ALLTOALL else nbytes


def _p2p_rank(hw: Hardware, cost: CollCost, topo: _Topo) -> tuple[int, float]:
    wanted, _ = p2p_plan(hw, topo, _message_bytes(cost.coll, topo, cost.nbytes))
    return (0 if cost.proto is wanted else 1, cost.tuner_time_s)


def _zero_cost(c: Coll, nbytes: int, topo: _Topo, a: Algo, p: Proto, hw: Hardware) -> CollCost:
    """One rank or no bytes: NCCL returns without moving data."""
    return CollCost(
        c, nbytes, topo.nranks, topo.nnodes, a, p, 0.0, 0.0, 0.0, 0.0, 0, hw.node.intra_link
    )


def collective_time(
    hw: Hardware,
    coll: Coll | str,
    nbytes: int,
    nranks: int,
    *,
    algo: Algo | str | None = None,
    proto: Proto | str | None = None,
    ranks_per_node: int | None = None,
    symmetric: bool = False,
    dtype: str = "f32",
    in_place: bool = False,
    reuse: tuple[float, float] = (0.0, 0.0),
    dirty: bool = False,
) -> CollCost:
    """The cost of one collective as NCCL would run it: its cheapest allowed choice.

    ``nbytes`` is the full logical buffer (see the module docstring); ``ranks_per_node``
    defaults to filling nodes (``min(nranks, gpus_per_node)``). For ``sendrecv`` the call
    is one pair of ranks and ``nranks`` is ignored; pass ``ranks_per_node=1`` for a pair
    on two nodes (or use ``p2p_time``). ``symmetric=True`` prices a call on registered
    symmetric windows (NCCL ≥ 2.27 adds its symmetric kernels to the choice); the
    simulator passes ``emitted_buffers_registered(collectives)``. ``dtype``, ``in_place``,
    ``reuse`` and ``dirty``: as `collective_candidates`.
    """
    return collective_candidates(
        hw,
        coll,
        nbytes,
        nranks,
        algo=algo,
        proto=proto,
        ranks_per_node=ranks_per_node,
        symmetric=symmetric,
        dtype=dtype,
        in_place=in_place,
        reuse=reuse,
        dirty=dirty,
    )[0]


def emitted_buffers_registered(collectives: str) -> bool:
    """Whether the code ``cocoviz emit`` writes for this lowering passes registered
    (symmetric-window) buffers to its NCCL collective calls, so NCCL may pick its
    symmetric kernels.

    Both do (issue 15): the send, receive and staging buffers of every allreduce,
    reducescatter and allgather on the tp group, and the values of every cross-rank
    scalar reduction, are allocated with ``ncclMemAlloc`` and registered with
    ``ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)`` (``registered_window`` in
    the manifest, ``buffers_registered`` per collective); ``nccl-device``'s fused kernels
    use windows of their own. ``collective_time`` still offers the symmetric kernels only
    where NCCL has them (>= 2.27, one NVLink domain, the three collectives).
    ``tests/test_sim_algorithms.py`` checks this against emitted manifests.
    """
    if collectives not in ("nccl", "nccl-device"):
        raise CostModelError(f"unknown collectives lowering {collectives!r}")
    return True


def p2p_time(hw: Hardware, nbytes: int, *, same_node: bool = True) -> CollCost:
    """One point-to-point message of ``nbytes`` from one rank to another: an
    ``ncclSend``/``ncclRecv`` pair inside a node (NVLink) or across nodes (one NIC).

    The function the timeline prices a pipeline hop or a shard-decomposed overlap's
    1/G-sized neighbour message with. NCCL's tuner has no p2p entry; the model takes the
    ring's base latency and one hop of the protocol (LL or Simple, the cheaper by NCCL's
    constants; inside a node the hop × ``measured.hop_latency_scale``) and the rate of the
    link the pair crosses: inside a node NVLink × ``measured.p2p_nvlink_efficiency``
    (measured ~0.8 of the ring rate: a pair runs on fewer channels), across nodes the
    NIC next to the GPU. ``time_s`` is the GPU time; ``launch_s`` the host time to issue it
    outside a CUDA graph.
    """
    return collective_time(hw, Coll.SENDRECV, nbytes, 2, ranks_per_node=2 if same_node else 1)


def scalar_allreduce(
    hw: Hardware, nranks: int, *, nbytes: int = 4, ranks_per_node: int | None = None
) -> CollCost:
    """The small allreduce behind an implicit reduction (``norm``, ``sum``, ``amax``).

    Latency-bound: NCCL runs it with LL, whose cost is its base latency plus one hop per
    ring step.
    """
    return collective_time(hw, Coll.ALLREDUCE, nbytes, nranks, ranks_per_node=ranks_per_node)


@dataclass(frozen=True)
class DeviceKernelCost:
    """One ``nccl-device`` fused kernel (NCCL device API, load/store over NVLink)."""

    time_s: float
    launch_s: float
    barrier_s: float
    read_s: float
    compute_s: float
    write_s: float
    sms: int
    peer_gbps: float
    """The peer load/store bandwidth the kernel's SMs achieve."""


def device_kernel_time(
    hw: Hardware,
    nranks: int,
    *,
    reduce_bytes: int,
    gather_bytes: int,
    compute_s: float = 0.0,
    sms: int | None = None,
    graph: bool = False,
) -> DeviceKernelCost:
    """A fused RS→compute→AG as one kernel on the NCCL device API (``graph=True``: a node
    of the iteration's CUDA graph, so the GPU-side gap instead of a host launch).

    Each rank loads its owned 1/n of ``reduce_bytes`` from the n−1 peers' windows and
    reduces it, runs the fused computation on its shard (``compute_s``, a roofline time
    without launch), and stores its 1/n of ``gather_bytes`` into every peer. An LSA
    barrier opens the kernel (peers' inputs are ready) and one separates the reads from
    the writes into peers, so the three phases add up::

        t = launch + 2·barrier + read + compute + write
        read  = reduce_bytes·(n−1)/n / peer_bw      write = gather_bytes·(n−1)/n / peer_bw
        peer_bw = device.peer_gbps · min(1, sms / nccl.channels)

    (the SMs NCCL needs to saturate NVLink are taken as its channel count). Only one
    NVLink domain: more ranks than GPUs per node raise ``CostModelError``.
    """
    if nranks < 1:
        raise CostModelError(f"a fused kernel needs at least 1 rank, got {nranks}")
    if nranks > hw.node.gpus_per_node:
        raise CostModelError(
            f"nccl-device needs all ranks in one NVLink domain: {nranks} ranks > "
            f"{hw.node.gpus_per_node} GPUs per node on {hw.name}"
        )
    if reduce_bytes < 0 or gather_bytes < 0 or compute_s < 0:
        raise CostModelError("byte counts and compute time must be non-negative")
    used = hw.gpu.sms if sms is None else sms
    if not 1 <= used <= hw.gpu.sms:
        raise CostModelError(f"sms must be between 1 and {hw.gpu.sms}, got {used}")
    peer = hw.device.peer_gbps * min(1.0, used / hw.nccl.channels)
    remote = (nranks - 1) / nranks
    read_s = reduce_bytes * remote / (peer * 1e9)
    write_s = gather_bytes * remote / (peer * 1e9)
    launch_s = (hw.gpu.kernel_gap_us if graph else hw.gpu.launch_overhead_us) * 1e-6
    barrier_s = 2 * hw.device.barrier_us * 1e-6 if nranks > 1 else 0.0
    return DeviceKernelCost(
        time_s=launch_s + barrier_s + read_s + compute_s + write_s,
        launch_s=launch_s,
        barrier_s=barrier_s,
        read_s=read_s,
        compute_s=compute_s,
        write_s=write_s,
        sms=used,
        peer_gbps=peer,
    )
