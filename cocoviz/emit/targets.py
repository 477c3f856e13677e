"""The target table: every backend `cocoviz emit` can write (docs/architecture.md, a new
backend).

A row names the renderer class that spells the backend (`cocoviz.emit.render`: its
target name, templates, runtime files and C spellings), the line the TUI's emit dialog
shows, and the toolchain variables its Makefile reads. ``--target``'s choices, the TUI's
code pane and emit dialog, and the emitter read this table; adding a backend is a row
here, a `Renderer` subclass (listed in `render.RENDERERS`) and its templates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetSpec:
    """One backend of the emitter."""

    name: str
    """``--target``'s spelling."""
    title: str
    """How the TUI's emit dialog names it."""
    renderer: str
    """The `cocoviz.emit.render` class that writes it (`render.renderer_class`; named, so
    that reading the table — ``--target``'s choices — costs no template engine)."""
    gpu: bool = False
    """Builds for a CUDA architecture (``--arch``) and runs its collectives on NCCL
    (``--collectives``)."""
    make_vars: tuple[str, ...] | None = None
    """The toolchain's make variables its Makefile reads (None: all of them)."""


TARGETS: tuple[TargetSpec, ...] = (
    TargetSpec("cuda", "CUDA + NCCL + MPI launcher", "CudaRenderer", gpu=True),
    TargetSpec(
        "cpu",
        "C++ + MPI (CPU)",
        "CpuRenderer",
        make_vars=("MPI_HOME", "MPICXX", "MPIEXEC", "CXXFLAGS"),
    ),
)
"""Every target; the first is the default."""

TARGET_NAMES: tuple[str, ...] = tuple(t.name for t in TARGETS)
DEFAULT_TARGET = TARGETS[0].name


def target_spec(name: str) -> TargetSpec:
    """The row of target `name`; an `EmitError` naming the known ones otherwise."""
    for t in TARGETS:
        if t.name == name:
            return t
    from cocoviz.emit.plan import EmitError  # not at import: `--target`'s choices read the table

    raise EmitError(f"unknown target {name!r}", hint=f"the targets are: {', '.join(TARGET_NAMES)}")
