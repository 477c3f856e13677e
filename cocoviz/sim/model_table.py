"""nccl-tests-style tables of the collective model, for comparison with measurements.

``cocoviz model-table --hw NAME|FILE --coll allreduce|reducescatter|allgather [--ranks N]``
prints one of these. Signatures::

    model_table(hw: Hardware, coll: Coll | str, nranks: int, algo: Algo | str | None = None,
                *, proto: Proto | str | None = None, ranks_per_node: int | None = None,
                dtype: str = "f32", min_bytes: int = 8, max_bytes: int = 16 << 30)
        -> list[Row]
    format_table(rows: Sequence[Row], *, title: str | None = None) -> str
    table_title(hw: Hardware, coll: Coll | str, nranks: int, ...) -> str

Sizes double from ``min_bytes`` to ``max_bytes`` (8 B to 16 GiB by default, as
``all_reduce_perf -b 8 -e 16G -f 2``). Columns follow nccl-tests: ``size`` is the full
buffer in bytes; ``count`` is elements per rank for allgather/reducescatter (nccl-tests'
``count``) and per buffer otherwise; sizes too small to give every rank an element are
skipped. ``time`` (µs), ``algbw`` and ``busbw`` (GB/s) are what nccl-tests would print if
the model were exact; the last columns say which algorithm/protocol NCCL's tuner picks
(the model's choice), how many channels (SMs) it runs on, and the efficiency the model
applies to NCCL's bandwidth at that size (``CollCost.efficiency``: fewer channels,
pipeline fill, network congestion).
``CostModelError`` (a ``ValueError``) reports an impossible request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cocoviz.ir.types import DTYPE_NAMES, DType
from cocoviz.sim.collectives import Algo, Coll, Proto, bus_factor, collective_time
from cocoviz.sim.hardware import Hardware

__all__ = ["Row", "format_table", "model_table", "table_title"]


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    size: int
    count: int
    dtype: str
    redop: str
    root: int
    time_us: float
    alg_bw: float
    bus_bw: float
    algo: str
    proto: str
    channels: int = 0
    """Channels (SMs) the call runs on after NCCL trims them for the size."""
    efficiency: float = 1.0
    """Bandwidth achieved ÷ NCCL's own algBw for the choice (``CollCost.efficiency``)."""


def model_table(
    hw: Hardware,
    coll: Coll | str,
    nranks: int,
    algo: Algo | str | None = None,
    *,
    proto: Proto | str | None = None,
    ranks_per_node: int | None = None,
    dtype: str = "f32",
    min_bytes: int = 8,
    max_bytes: int = 16 << 30,
) -> list[Row]:
    """The model's prediction for each size of an nccl-tests sweep."""
    c = Coll.parse(coll)
    dt = DType.parse(dtype)
    if dt is None:
        raise ValueError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPE_NAMES)})")
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    width = dt.itemsize
    group = nranks if c.row.count_per_rank else 1
    redop = "sum" if c.row.reduces else "none"
    root = 0 if c.row.rooted else -1
    rows: list[Row] = []
    size = min_bytes
    while size <= max_bytes:
        count = size // (width * group)
        if count > 0:
            nbytes = count * width * group
            cost = collective_time(
                hw, c, nbytes, nranks, algo=algo, proto=proto, ranks_per_node=ranks_per_node
            )
            alg_bw = cost.alg_bw_gbps
            rows.append(
                Row(
                    size=nbytes,
                    count=count,
                    dtype=dtype,
                    redop=redop,
                    root=root,
                    time_us=cost.time_s * 1e6,
                    alg_bw=alg_bw,
                    bus_bw=alg_bw * bus_factor(c, cost.nranks),
                    algo=cost.algo.value,
                    proto=cost.proto.value,
                    channels=cost.channels,
                    efficiency=cost.efficiency,
                )
            )
        size *= 2
    return rows


def table_title(
    hw: Hardware,
    coll: Coll | str,
    nranks: int,
    algo: Algo | str | None = None,
    *,
    proto: Proto | str | None = None,
    ranks_per_node: int | None = None,
) -> str:
    """A one-line description of what a table shows."""
    c = Coll.parse(coll)
    rpn = min(nranks, hw.gpus_per_node) if ranks_per_node is None else ranks_per_node
    nodes = -(-nranks // rpn)
    choice = (
        "cheapest algorithm" if algo is None and proto is None else f"{algo or '*'}/{proto or '*'}"
    )
    return (
        f"cocoviz model: {c.value} on {hw.name} (NCCL {hw.nccl.version}), {nranks} ranks on "
        f"{nodes} node{'s' if nodes != 1 else ''} ({rpn} per node), {choice}"
    )


def format_table(rows: Sequence[Row], *, title: str | None = None) -> str:
    """Plain text in the layout of nccl-tests' output (one direction: out-of-place)."""
    lines: list[str] = []
    if title:
        lines += [f"# {title}", "#"]
    header = [
        f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
        f"{'time':>8}  {'algbw':>7}  {'busbw':>7}  {'algo/proto':<16}{'ch':>3}  {'eff':>5}",
        f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  "
        f"{'(us)':>8}  {'(GB/s)':>7}  {'(GB/s)':>7}",
    ]
    lines += [line.rstrip() for line in header]
    for r in rows:
        lines.append(
            f"{r.size:>12}  {r.count:>12}  {_type_name(r.dtype):>8}  {r.redop:>6}  "
            f"{r.root:>6}  {_time(r.time_us):>8}  {r.alg_bw:>7.2f}  {r.bus_bw:>7.2f}  "
            f"{r.algo + '/' + r.proto:<16}{r.channels:>3}  {r.efficiency:>5.2f}"
        )
    if rows:
        average = sum(r.bus_bw for r in rows) / len(rows)
        lines += ["#", f"# Avg bus bandwidth    : {average:.3f}", "#"]
    return "\n".join(lines) + "\n"


def _type_name(dtype: str) -> str:
    """nccl-tests' name of a dtype (src/common.cu test_typenames)."""
    dt = DType.parse(dtype)
    return dt.facts.nccl_tests if dt is not None else dtype


def _time(us: float) -> str:
    """nccl-tests prints times with two decimals until they no longer fit."""
    return f"{us:.2f}" if us < 1e5 else f"{us:.1f}" if us < 1e6 else f"{us:.0f}"
