"""The collectives table: every fact about a collective that more than one layer reads.

One `Collective` row per collective of the language (docs/language.md, operations and layout inference):
its DSL spelling (the value of its `Op` member in `cocoviz.ir.nodes`), whether it takes
a reduction operator and a root, the layout rule inference applies, what the cost model
calls it, the CoCoNet label token of tuned schedule names, the NCCL host call the CUDA
template issues, NCCL's count convention, the bytes one rank sends, and which schedule
steps accept it. Inference, the printer, the summary, the schedule steps, the simulator,
the executors, the emitter and the templates read these rows instead of listing
collectives themselves.

A new collective is a row here, its `Op` member, and the code that is genuinely new:
its cost formula (`cocoviz/sim/collectives.py`), its reference semantics
(`cocoviz/exec/reference.py`, `cocoviz/exec/mpi_worker.py`) and its lowering
(`cocoviz/emit/collectives.py`, the CPU template). docs/architecture.md lists the files.

This module imports nothing of cocoviz but `cocoviz.ir.types`: `cocoviz.ir.nodes`
builds `COLLECTIVES` from it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

from cocoviz.ir.types import FLAT, LOCAL, REPLICATED, Layout


class Operand(enum.Enum):
    """The layouts a collective accepts for its operand; `.value` reads in messages."""

    UNSLICED = "a local or replicated operand"
    SLICED = "a sliced operand"
    ANY = "an operand of any layout"

    def accepts(self, layout: Layout) -> bool:
        return self is Operand.ANY or layout.is_sliced is (self is Operand.SLICED)


@dataclass(frozen=True)
class Collective:
    """One collective of the language."""

    name: str
    """DSL spelling, and the value of its `Op` member."""
    reduces: bool
    """Takes a reduction operator first: ``allreduce(+, x)``."""
    rooted: bool
    """Takes ``root=`` (default 0): ``broadcast(x, root=1)``."""
    operand: Operand
    result: Layout | None
    """The result's layout; None: the operand's layout, on the next pipeline stage (the
    collective moves a value between pipeline stages instead of within a group)."""
    operand_hint: str | None
    """The hint when inference refuses the operand's layout."""
    cost_name: str
    """What the cost model calls it (a `cocoviz.sim.collectives.Coll` value)."""
    label: str
    """CoCoNet's token for it in tuned schedule names (``AR``, ``RS``, …)."""
    nccl: str
    """The NCCL host call of the CUDA target (``ncclSend`` + ``ncclRecv`` for send)."""
    count_per_rank: bool
    """NCCL's (and nccl-tests') ``count`` is one rank's part, not the whole buffer."""
    sent: Callable[[int, int, int], int]
    """Bytes one rank sends: ``sent(full, per_rank, G)`` for a full logical buffer of
    `full` bytes of which a rank holds `per_rank`, over a group of G ranks."""
    chunkable: bool
    """`overlap` may run it chunk by chunk."""
    fusable: bool
    """A fused group may hold it (as part of a reducescatter → compute → allgather or
    compute → send pattern: docs/schedules.md, `fuse`)."""
    reslices: bool = False
    """Takes ``to=`` (and optionally ``from=``): the result is the same global value,
    sliced along dimension ``to`` instead of the operand's (`result` is then unused)."""


def _ring_allreduce(full: int, per_rank: int, g: int) -> int:
    return 2 * (g - 1) * full // g


def _ring_part(full: int, per_rank: int, g: int) -> int:
    return (g - 1) * full // g


def _whole(full: int, per_rank: int, g: int) -> int:
    return full if g > 1 else 0


def _own_part(full: int, per_rank: int, g: int) -> int:
    return per_rank


def _all_but_own_block(full: int, per_rank: int, g: int) -> int:
    return (g - 1) * per_rank // g


COLLECTIVE_TABLE: tuple[Collective, ...] = (
    Collective(
        name="allreduce",
        reduces=True,
        rooted=False,
        operand=Operand.UNSLICED,
        result=REPLICATED,
        operand_hint="a sliced value is gathered with allgather",
        cost_name="allreduce",
        label="AR",
        nccl="ncclAllReduce",
        count_per_rank=False,
        sent=_ring_allreduce,
        chunkable=True,
        fusable=False,
    ),
    Collective(
        name="reducescatter",
        reduces=True,
        rooted=False,
        operand=Operand.UNSLICED,
        result=FLAT,
        operand_hint=None,
        cost_name="reducescatter",
        label="RS",
        nccl="ncclReduceScatter",
        count_per_rank=True,
        sent=_ring_part,
        chunkable=True,
        fusable=True,
    ),
    Collective(
        name="allgather",
        reduces=False,
        rooted=False,
        operand=Operand.SLICED,
        result=REPLICATED,
        operand_hint="allreduce combines local values; allgather concatenates slices",
        cost_name="allgather",
        label="AG",
        nccl="ncclAllGather",
        count_per_rank=True,
        sent=_ring_part,
        chunkable=True,
        fusable=True,
    ),
    Collective(
        name="broadcast",
        reduces=False,
        rooted=True,
        operand=Operand.UNSLICED,
        result=REPLICATED,
        operand_hint=None,
        cost_name="broadcast",
        label="BC",
        nccl="ncclBroadcast",
        count_per_rank=False,
        sent=_whole,
        chunkable=False,
        fusable=False,
    ),
    Collective(
        name="reduce",
        reduces=True,
        rooted=True,
        operand=Operand.UNSLICED,
        result=LOCAL,
        operand_hint=None,
        cost_name="reduce",
        label="R",
        nccl="ncclReduce",
        count_per_rank=False,
        sent=_whole,
        chunkable=False,
        fusable=False,
    ),
    Collective(
        name="send",
        reduces=False,
        rooted=False,
        operand=Operand.ANY,
        result=None,
        operand_hint=None,
        cost_name="sendrecv",
        label="P2P",
        nccl="ncclSend",
        count_per_rank=False,
        sent=_own_part,
        chunkable=True,
        fusable=True,
    ),
    Collective(
        name="alltoall",
        reduces=False,
        rooted=False,
        operand=Operand.SLICED,
        result=FLAT,
        operand_hint="alltoall re-slices a sliced value; slice(x, d) takes a replicated "
        "value's part",
        cost_name="alltoall",
        label="A2A",
        nccl="ncclAlltoAll",
        count_per_rank=True,
        sent=_all_but_own_block,
        chunkable=True,
        fusable=False,
        reslices=True,
    ),
)
"""Every collective, in the order the language documents them."""


@dataclass(frozen=True)
class Blocks:
    """A rank-local row-major array seen as ``[outer, extent, inner]`` cut into G blocks
    along `extent`: block j is ``[:, j·extent/G : (j+1)·extent/G, :]``."""

    outer: int
    extent: int
    inner: int


def alltoall_copies(
    shape: tuple[int, ...], frm: int, to: int, group: int
) -> tuple[Blocks | None, Blocks | None]:
    """The copies an alltoall of a value of global `shape` needs around the exchange, as
    the emitter writes them and the simulator prices them: (pack, unpack).

    MPI's and NCCL's alltoall send block j of the buffer to rank j and put what rank s
    sent in block s. Block j of dimension `to` of the operand's part is one contiguous
    block only when the dimensions before `to` hold one element (else: pack); the block
    from rank s belongs in block s of dimension `from` of the result's part, contiguous
    only when the dimensions before `from` hold one element (else: unpack). None: no copy.
    """
    local_in = list(shape)
    local_in[frm] //= group
    local_out = list(shape)
    local_out[to] //= group

    def blocks(local: list[int], d: int) -> Blocks | None:
        outer = math.prod(local[:d])
        return Blocks(outer, local[d], math.prod(local[d + 1 :])) if outer > 1 else None

    return blocks(local_in, to), blocks(local_out, frm)


_BY_NAME = {c.name: c for c in COLLECTIVE_TABLE}
_BY_COST_NAME = {c.cost_name: c for c in COLLECTIVE_TABLE}


def collective(op: enum.Enum) -> Collective:
    """The row of a collective `Op` of `cocoviz.ir.nodes` (KeyError for an operator that
    is not one): looked up by its value, so this table needs nothing of the nodes."""
    return _BY_NAME[op.value]


def collective_named(name: str) -> Collective | None:
    """The row whose DSL spelling or cost-model name is `name`, if any."""
    return _BY_NAME.get(name) or _BY_COST_NAME.get(name)


__all__ = [
    "COLLECTIVE_TABLE",
    "Blocks",
    "alltoall_copies",
    "Collective",
    "Operand",
    "collective",
    "collective_named",
]
