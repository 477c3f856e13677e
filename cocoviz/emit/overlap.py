"""Groups of the emitter's lowering (docs/codegen.md, what each construct becomes): a
fused group lowered as shared kernels (or one nccl-device kernel), an overlapped group
as a `ChunkLoop` whose items run chunk by chunk on the compute and communication
streams."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cocoviz.emit import plan as pl
from cocoviz.emit.kernels import KernelLowering
from cocoviz.ir.nodes import COLLECTIVES, Group, GroupKind, Op
from cocoviz.ir.transforms.overlap import leading_chunks


class GroupLowering(KernelLowering):
    """Fused and overlapped groups."""

    def lower_group(self, g: Group) -> list[pl.Step]:
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
            steps = [_on_stream(st, stream) for st in steps]
            for m in members:
                self.stage_streams.setdefault(m, set()).add(stream)
            all_stages.extend(members)
            items.append(pl.ChunkItem(label, stream, tuple(steps)))
        cname = self.names.fresh(f"{self.ns}_overlap_{all_stages[0]}", "ol_")
        pst = self.type_of(all_stages[0]).pstage
        return [
            pl.ChunkLoop(
                cname,
                tuple(all_stages),
                g.chunks,
                tuple(items),
                pst if not self._spans_stages(all_stages) else None,
                skewed=leading_chunks(self.p, tuple(all_stages)),
            )
        ]

    def _spans_stages(self, stages: Iterable[str]) -> bool:
        return len({self.type_of(s).pstage for s in stages}) > 1 or any(
            self.p.stage(s).expr.op is Op.SEND for s in stages
        )


def _on_stream(step: pl.Step, stream: pl.StreamName) -> pl.Step:
    return dataclasses.replace(step, stream=stream)  # type: ignore[return-value]
