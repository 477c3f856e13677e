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
'many'``). Units are the ones people quote: GB/s (10^9 B/s), TFLOP/s, microseconds.
Every shipped number carries its source in a comment of the TOML file, and
docs/cost-model.md collects them.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from cocoviz.errors import InputError
from cocoviz.ir.types import DTYPE_NAMES

DEFAULT_PROFILE = "h100-dgx"


class ProfileError(InputError):
    """A hardware profile that cannot be used (an unknown name, a bad file), with a
    message naming file and field; an input error (exit 1) wherever it surfaces."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None):
        super().__init__(message, hint="fix the field named above" if field else None)
        self.path = path
        self.field = field


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
class NcclSpec:
    """NCCL's tuning model of a profile: channels, latencies, bandwidth factors."""

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


@dataclass(frozen=True)
class OverlapSpec:
    """How communication running beside a kernel slows it."""

    compute_slowdown_nvlink: float
    compute_slowdown_net: float
    hbm_bytes_per_reduce_byte: float
    hbm_bytes_per_copy_byte: float


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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{where}: no such hardware profile file", path=where) from None
    except OSError as exc:
        raise ProfileError(f"{where}: cannot read: {exc.strerror}", path=where) from None
    raw = _parse_toml(text, where)
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
        raw = _merge(_parse_toml(shipped.read_text(encoding="utf-8"), f"{base}.toml"), raw)
    return _build(raw, where)


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{where}: not valid TOML: {exc}", path=where) from None


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


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
        return value

    def number(
        self, key: str, *, low: float = 0.0, high: float = math.inf, zero: bool = False
    ) -> float:
        return self._check_number(key, self._get(key), low=low, high=high, zero=zero)

    def _check_number(self, key: str, value: Any, *, low: float, high: float, zero: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise self.error(key, f"expected a finite number, got {value!r}")
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


def _per_dtype(t: _Table) -> PerDType:
    result = PerDType(**{d: t.number(d) for d in DTYPE_NAMES})
    t.done()
    return result


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
        arch=g.string("arch", ("volta", "ampere", "hopper", "blackwell")),
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
    lat = c.table("hw_latency_us")
    caps = c.table("caps_gbps")
    nccl = NcclSpec(
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
        base_latency_us=_per_algo(c.table("base_latency_us")),
        hw_latency_us=(
            _per_algo(lat.table("nvlink")),
            _per_algo(lat.table("pci")),
            _per_algo(lat.table("net")),
        ),
        ll_max_bw=_per_scale(caps, "ll_max_bw"),
        per_ch_max_ring_ll128_bw=_per_scale(caps, "per_ch_max_ring_ll128_bw"),
        per_ch_max_tree_ll128_bw=_per_scale(caps, "per_ch_max_tree_ll128_bw"),
        per_ch_max_tree_bw=_per_scale(caps, "per_ch_max_tree_bw"),
        per_ch_max_nvls_tree_bw=_per_scale_zero(caps, "per_ch_max_nvls_tree_bw"),
    )
    if nccl.nvls and node.intra_link is not Link.NVLINK:
        raise c.error("nvls", 'NVLS needs intra_link = "nvlink"')
    if nccl.nvls and nccl.nvls_efficiency == 0:
        raise c.error("nvls_efficiency", "must be greater than 0 when nvls = true")
    if nccl.nvls and nccl.nvls_channels == 0:
        raise c.error("nvls_channels", "must be at least 1 when nvls = true")
    lat.done()
    caps.done()
    c.done()

    o = top.table("overlap")
    overlap = OverlapSpec(
        compute_slowdown_nvlink=o.number("compute_slowdown_nvlink", high=0.9, zero=True),
        compute_slowdown_net=o.number("compute_slowdown_net", high=0.9, zero=True),
        hbm_bytes_per_reduce_byte=o.number("hbm_bytes_per_reduce_byte", zero=True),
        hbm_bytes_per_copy_byte=o.number("hbm_bytes_per_copy_byte", zero=True),
    )
    o.done()

    d = top.table("device")
    device = DeviceSpec(
        peer_gbps=d.number("peer_gbps"), barrier_us=d.number("barrier_us", zero=True)
    )
    d.done()
    top.done()
    return Hardware(name, description, where, gpu, node, nccl, overlap, device)
