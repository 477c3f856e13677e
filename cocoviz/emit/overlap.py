"""Groups of the emitter's lowering (docs/codegen.md, what each construct becomes): a
fused group lowered as shared kernels (or one nccl-device kernel), an overlapped group
as a `ChunkLoop` whose items run chunk by chunk, each operation on the stream of its
communicator — the tp group's collectives on `comm`, send/recv on `p2p` (the world
communicator), computation on `compute` — with an event for each edge between two
streams (`chunk_edges`); a decomposed group (`overlapped shards=G`) as a `ChunkLoop`
over the steps of its ring (`cocoviz.emit.shards`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cocoviz.emit import plan as pl
from cocoviz.emit.shards import ShardLowering
from cocoviz.ir.nodes import COLLECTIVES, Group, GroupKind, Op
from cocoviz.ir.transforms.overlap import leading_chunks


class GroupLowering(ShardLowering):
    """Fused, overlapped and decomposed groups."""

    def lower_group(self, g: Group) -> list[pl.Step]:
        if g.by_shard:
            return self.lower_decomposed(g)
        if g.kind is GroupKind.FUSED:
            members = [s.name for s in self.p.stages if s.name in set(g.stages())]
            label = "fused " + ", ".join(members)
            if self.collectives == "nccl-device":
                dev = self.device_fused(members, None)
                if dev is not None:
                    return dev
                self._device_fallback(members)
            return self.lower_units(members, None, label, fused=True)
        assert g.chunks is not None
        self._chunk_loops += 1
        items: list[pl.ChunkItem] = []
        all_stages: list[str] = []
        for it in g.items:
            if isinstance(it, Group):
                members = [s.name for s in self.p.stages if s.name in set(it.stages())]
                has_comm = any(self.p.stage(m).expr.op in COLLECTIVES for m in members)
                stream: pl.StreamName = "comm" if has_comm else "compute"
                if any(self.p.stage(m).expr.op is Op.SEND for m in members):
                    # send → computation: the send/recv on the world communicator's stream,
                    # the computation on the compute stream (below, per step)
                    stream = "compute"
                steps: list[pl.Step] | None = None
                if self.collectives == "nccl-device":
                    steps = self.device_fused(members, g.chunks)
                    if steps is None:
                        self._device_fallback(members)
                if steps is None:
                    steps = self.lower_units(
                        members, g.chunks, "fused " + ", ".join(members), fused=True
                    )
                label = "fused(" + ", ".join(members) + ")"
            else:
                members = [it]
                op = self.p.stage(it).expr.op
                stream = "comm" if op in COLLECTIVES else "compute"
                steps = self.lower_units(members, g.chunks, it)
                label = it
            steps = [_on_stream(st, _p2p_or(st, stream)) for st in steps]
            for st in steps:
                for m in _step_stages(st):
                    self.stage_streams.setdefault(m, set()).add(st.stream)
            all_stages.extend(members)
            items.append(pl.ChunkItem(label, steps[0].stream, tuple(steps)))
        cname = self.names.fresh(f"{self.ns}_overlap_{all_stages[0]}", "ol_")
        pst = self.type_of(all_stages[0]).pstage
        flat = [st for it in items for st in it.steps]
        return [
            pl.ChunkLoop(
                cname,
                tuple(all_stages),
                g.chunks,
                tuple(items),
                pst if not self._spans_stages(all_stages) else None,
                skewed=leading_chunks(self.p, tuple(all_stages)),
                edges=chunk_edges(flat, self.p.grid.pp),
                streams=tuple(dict.fromkeys(st.stream for st in flat)),
            )
        ]

    def _spans_stages(self, stages: Iterable[str]) -> bool:
        return len({self.type_of(s).pstage for s in stages}) > 1 or any(
            self.p.stage(s).expr.op is Op.SEND for s in stages
        )


def _on_stream(step: pl.Step, stream: pl.StreamName) -> pl.Step:
    return dataclasses.replace(step, stream=stream)  # type: ignore[return-value]


def _p2p_or(step: pl.Step, stream: pl.StreamName) -> pl.StreamName:
    """A send/recv runs on the world communicator's stream; anything else on `stream`."""
    if isinstance(step, pl.Collective) and step.comm == "world":
        return "p2p"
    return stream


def _step_stages(step: pl.Step) -> tuple[str, ...]:
    if isinstance(step, (pl.Kernel, pl.RowKernel, pl.DeviceCollective)):
        return step.stages
    if isinstance(step, (pl.Matmul, pl.Collective, pl.ReduceFinish)):
        return (step.stage,)
    if isinstance(step, pl.FinishBatch):
        return tuple(f.stage for f in step.finishes)
    return ()


def _runs_on(step: pl.Step, pp: int) -> frozenset[int]:
    """The pipeline stages whose ranks issue `step` (a send/recv: both ends)."""
    pst = step.pstage
    if pst is None or (isinstance(step, pl.Collective) and step.comm == "world"):
        return frozenset(range(pp))
    return frozenset({pst})


def chunk_edges(steps: list[pl.Step], pp: int) -> tuple[pl.ChunkEdge, ...]:
    """The events of one chunk: on each pipeline stage, a step waits for the step before it
    that the stage's ranks issue, by an event when the two run on different streams (on the
    same stream, stream order suffices). Chunk k's steps form a chain on every rank, so every
    data dependency inside the chunk is covered; chunks touch disjoint parts of every
    buffer, so nothing orders one chunk after another. Every edge is one event per chunk,
    recorded and waited on exactly the stages it lists."""
    edges: dict[tuple[int, int], set[int]] = {}
    for q in range(pp):
        prev: int | None = None
        for j, st in enumerate(steps):
            if q not in _runs_on(st, pp):
                continue
            if prev is not None and steps[prev].stream != st.stream:
                edges.setdefault((prev, j), set()).add(q)
            prev = j
    return tuple(
        pl.ChunkEdge(after=i, before=j, stages=None if len(qs) == pp else tuple(sorted(qs)))
        for (i, j), qs in sorted(edges.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    )
