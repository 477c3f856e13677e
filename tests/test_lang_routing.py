"""Routing by index in every layer (docs/language.md, routing): `gather`, `scatter_add`,
`topk`/`topk_indices` and `capacity_slots` — layout rules, diagnostics of misuse, the
printer's round trip, the numpy reference against a direct numpy model of GShard's top-k
routing with capacity (choice-major, token order, ties by position), `verify` on 2/4/8
ranks, schedules (reorder across an allgather, fuse; overlap refused), the cost model
(bytes moved, no GEMM), the TUI graph's label, `run --mpi`, both code targets (CPU, and
CUDA in the emulation in both collectives modes) on tests/programs/routing.coco, and the
routed MoE sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lang_support import (
    PROGRAMS,
    check_text,
    emitted_check,
    mpi_matches_reference,
    reference_dump,
    run_cli,
    shape_text,
)
from mpi_support import mpi  # noqa: F401 - the fixture

from cocoviz import samples
from cocoviz.errors import ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.printer import format_program
from cocoviz.schedule.steps import apply_steps

ROUTE = PROGRAMS / "routing.coco"

HEAD = "ranks 4\ndim B = 8, T = 16, E = 8, K = 2, C = 3, H = 16\n"


def prog(body: str):
    return load_program(HEAD + body, "t.coco")


# --- types and layouts ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("inputs", "call", "dtype", "shape", "want"),
    [
        ("input s : f32[B, T, E] sliced(0)", "topk(s, K)", "f32", "[B, T, K]", "sliced"),
        ("input s : f32[B, T, E] sliced(1)", "topk_indices(s, 2)", "i32", "[B, T, 2]", "sliced(1)"),
        ("input s : f16[B, T, E] replicated", "topk(s, K, dim=1)", "f16", "[B, K, E]", "replicated"),
        ("input e : i32[B, T, K] sliced(0)", "capacity_slots(e, E, C)", "i32", "[B, T, K]", "sliced"),
        (
            "input x : f32[B, T, H] sliced(0)\ninput i : i32[B, E] sliced(0)",
            "gather(x, i, dim=1)", "f32", "[B, E, H]", "sliced",
        ),
        (
            "input x : f32[T, H] sliced(1)\ninput i : i32[B, K] replicated",
            "gather(x, i, dim=0)", "f32", "[B, K, H]", "sliced(2)",
        ),
        (
            "input x : f32[T, H] replicated\ninput i : i32[B, E] sliced(1)",
            "gather(x, i, dim=0)", "f32", "[B, E, H]", "sliced(1)",
        ),
        (
            "input i : i32[B, T, K] sliced(0)\ninput x : bf16[B, T, 1, H] sliced(0)",
            "scatter_add(f32[B, E*C, H], i, x, dim=1)", "f32", "[B, E*C, H]", "sliced",
        ),
        (
            "input i : i32[B, T] replicated\ninput x : f16[B, T, H] sliced(2)",
            "scatter_add(f16[B, E, H], i, x, dim=1)", "f16", "[B, E, H]", "sliced(2)",
        ),
    ],
)  # fmt: skip
def test_layout_rules(inputs, call, dtype, shape, want) -> None:
    p = prog(f"{inputs}\ny = {call}\noutput y\n")
    ty = p.stage("y").ty
    assert (ty.dtype.value, shape_text(ty), str(ty.layout)) == (dtype, shape, want)


def test_replicated_indices_or_data_are_read_as_the_ranks_rows() -> None:
    p = prog(
        "input x : f32[B, T, H] sliced(0)\ninput i : i32[B, K] replicated\n"
        "input r : f32[B, T, H] replicated\ninput j : i32[B, K] sliced(0)\n"
        "input t : i32[B, T] replicated\n"
        "y = gather(x, i, dim=1)\nz = gather(r, j, dim=1)\n"
        "w = scatter_add(f32[B, E, H], t, x, dim=1)\noutput y, z, w\n"
    )
    text = format_program(p)
    assert "y = gather(x, slice(i), dim=1)" in text
    assert "z = gather(slice(r), j, dim=1)" in text
    assert "w = scatter_add(f32[B, E, H], slice(t), x, dim=1)" in text
    for name in "yzw":
        assert str(p.stage(name).ty.layout) == "sliced"
    assert load_program(text, "again.coco") == p


# --- diagnostics ------------------------------------------------------------------------
BAD = [
    (
        "input x : f32[T, H] sliced(0)\ninput i : i32[B] replicated\ny = gather(x, i, dim=0)\n",
        "prog.coco:5:5: error: gather indexes dimension 0 (T = 16), which 'x' is sliced "
        "along: an index may point into another rank's block, and the language does not "
        "insert the communication that would fetch it",
        "y = gather(x, i, dim=0)",
        "    ^^^^^^^^^^^^^^^^^^^",
        "hint: re-slice it first, `t = alltoall(x, from=0, to=1)`, or gather it (allgather)",
    ),
    (
        "input s : f32[B, E] sliced(1)\ny = topk(s, K)\n",
        "prog.coco:4:5: error: topk along dimension 1 (E = 8), which 's' is sliced along: an "
        "index may point into another rank's block, and the language does not insert the "
        "communication that would fetch it",
        "y = topk(s, K)",
        "    ^^^^^^^^^^",
        "hint: re-slice it first, `t = alltoall(s, from=1, to=0)`, or gather it (allgather)",
    ),
    (
        "input s : f32[B, E] replicated\ny = topk(s, 9)\n",
        "prog.coco:4:5: error: topk: k=9 is more than the 8 entries of 's' along dimension 1 (E)",
        "y = topk(s, 9)",
        "    ^^^^^^^^^^",
        "hint: k is at most E = 8",
    ),
    (
        "input s : f32[B, E] replicated\ny = topk(s, 0)\n",
        "prog.coco:4:13: error: topk: k must be a positive integer, got 0",
        "y = topk(s, 0)",
        "            ^",
        None,
    ),
    (
        "input x : f32[B, H] replicated\ninput i : f32[B, K] replicated\n"
        "y = gather(x, i, dim=1)\n",
        "prog.coco:5:5: error: gather: the indices must be integers (i32 or i64), 'i' is f32",
        "y = gather(x, i, dim=1)",
        "    ^^^^^^^^^^^^^^^^^^^",
        "hint: indices come from topk_indices or capacity_slots, or cast(i32, i)",
    ),
    (
        "input x : f32[B, H] replicated\ninput i : i32[T, K] replicated\n"
        "y = gather(x, i, dim=1)\n",
        "prog.coco:5:5: error: gather: the indices 'i'[T, K] must have the first 1 dimension "
        "of 'x'[B, H] and at least one more (the indices into dimension 1)",
        "y = gather(x, i, dim=1)",
        "    ^^^^^^^^^^^^^^^^^^^",
        "hint: for example idx of shape [B, N]",
    ),
    (
        "input x : f32[B, H] replicated\ninput i : i32[B, K] replicated\ny = gather(x, i)\n",
        "prog.coco:5:5: error: gather needs the dimension it indexes: dim=",
        "y = gather(x, i)",
        "    ^^^^^^^^^^^^",
        "hint: for example gather(x, idx, dim=d)",
    ),
    (
        "input x : f32[B, T, H] sliced(0)\ninput i : i32[B, E] sliced(1)\n"
        "y = gather(x, i, dim=1)\n",
        "prog.coco:5:5: error: gather: 'x' is sliced along dimension 0 and the indices 'i' "
        "along dimension 1; both must be sliced along dimension 0 (each rank routes its own "
        "rows)",
        "y = gather(x, i, dim=1)",
        "    ^^^^^^^^^^^^^^^^^^^",
        "hint: slice the indices as the data, or gather them first (allgather)",
    ),
    (
        "input i : i32[B, T] replicated\ninput x : f32[B, T, H] replicated\n"
        "y = scatter_add(B, i, x, dim=1)\n",
        "prog.coco:5:17: error: scatter_add: the first argument must be the result's type, "
        "such as f32[B, N, H]",
        "y = scatter_add(B, i, x, dim=1)",
        "                ^",
        "hint: for example scatter_add(f32[B, N, H], idx, src, dim=1)",
    ),
    (
        "input i : i32[B, T] replicated\ninput x : f32[B, K, H] replicated\n"
        "y = scatter_add(f32[B, E, H], i, x, dim=1)\n",
        "prog.coco:5:5: error: scatter_add: 'x'[B, K, H] must have the shape [B, T, H]: the "
        "result's dimensions with dimension 1 replaced by those of the indices [T] (each of "
        "those may be 1, the same row for every index)",
        "y = scatter_add(f32[B, E, H], i, x, dim=1)",
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        None,
    ),
    (
        "input i : i32[B, T] sliced(1)\ninput x : f32[B, T, H] replicated\n"
        "y = scatter_add(f32[B, E, H], i, x, dim=1)\n",
        "prog.coco:5:5: error: scatter_add: the indices 'i' are sliced along dimension 1, one "
        "of their index dimensions: each rank would add only its part of the contributions",
        "y = scatter_add(f32[B, E, H], i, x, dim=1)",
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "hint: gather the indices first (allgather)",
    ),
    (
        "input e : i32[B, T, K] sliced(1)\ny = capacity_slots(e, E, C)\n",
        "prog.coco:4:5: error: capacity_slots counts along the tokens' dimension 1 (T = 16), "
        "which 'e' is sliced along: an index may point into another rank's block, and the "
        "language does not insert the communication that would fetch it",
        "y = capacity_slots(e, E, C)",
        "    ^^^^^^^^^^^^^^^^^^^^^^^",
        None,
    ),
    (
        "input e : i32[T] replicated\ny = capacity_slots(e, E, C)\n",
        "prog.coco:4:5: error: capacity_slots needs expert indices of rank ≥ 2 ([…, tokens, "
        "k]); 'e' is [T]",
        "y = capacity_slots(e, E, C)",
        "    ^^^^^^^^^^^^^^^^^^^^^^^",
        "hint: the last dimension holds each token's k choices, e.g. [T, 1] for top-1",
    ),
    (
        "input s : f32[B, E] replicated\ny = topk(s, K) * 2\n",
        "prog.coco:4:5: error: topk(...) must be the whole right-hand side of a named stage",
        "y = topk(s, K) * 2",
        "    ^^^^^^^^^^",
        None,
    ),
    (
        "input s : f32[B, E] replicated\ny = topk(s, K, dim=1, largest=1)\n",
        "prog.coco:4:23: error: topk has no keyword argument 'largest'",
        "y = topk(s, K, dim=1, largest=1)",
        "                      ^^^^^^^",
        "hint: it accepts: dim",
    ),
    (
        "input e : f32[B, T, K] replicated\ny = capacity_slots(e, E, C)\n",
        "prog.coco:4:5: error: capacity_slots: the expert indices must be integers (i32 or "
        "i64), 'e' is f32",
        "y = capacity_slots(e, E, C)",
        "    ^^^^^^^^^^^^^^^^^^^^^^^",
        None,
    ),
]


@pytest.mark.parametrize(("body", "head", "line", "caret", "hint"), BAD)
def test_misuse_is_one_diagnostic_with_place_caret_and_hint(
    tmp_path: Path, body: str, head: str, line: str, caret: str, hint: str | None
) -> None:
    rc, err = check_text(tmp_path, HEAD + body)
    assert rc == 1
    lines = err.splitlines()
    assert lines[0].endswith(head), err
    assert lines[1].endswith(f"| {line}") and lines[2].endswith(f"| {caret}"), err
    if hint is not None:
        assert hint in lines, err
    assert "Traceback" not in err and err.count("error:") == 1


# --- printer ----------------------------------------------------------------------------
def test_printer_round_trip() -> None:
    p = load_program(ROUTE.read_text(), str(ROUTE))
    text = format_program(p)
    for call in (
        "topk(sf, K, dim=2)",
        "topk_indices(ids, 3, dim=1)",
        "capacity_slots(e, E, C)",
        "scatter_add(f32[B, E*C, H], slice(slot), xk, dim=1)",
        "gather(tb, ids, dim=0)",
    ):
        assert call in text, call
    assert load_program(text, "again.coco") == p


# --- numpy reference --------------------------------------------------------------------
def _model_capacity(e: np.ndarray, E: int, C: int) -> np.ndarray:
    """GShard's rule written out one choice at a time: choice-major, then token order."""
    out = np.full(e.shape, -1, dtype=np.int64)
    for g in np.ndindex(e.shape[:-2]):
        used = [0] * E
        T, K = e.shape[-2:]
        for j in range(K):
            for t in range(T):
                ex = int(e[g + (t, j)])
                if 0 <= ex < E:
                    if used[ex] < C:
                        out[g + (t, j)] = ex * C + used[ex]
                    used[ex] += 1
    return out


def test_reference_equals_numpy_on_the_global_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    B, T, E, K, C, H, V = 8, 16, 8, 2, 3, 16, 12
    s = rng.integers(0, 4, (B, T, E)).astype(np.float32)  # many ties
    ids = rng.integers(-2, V + 2, (B, T)).astype(np.int32)  # some out of range
    tb = rng.standard_normal((V, H)).astype(np.float32)
    x = rng.standard_normal((B, T, H)).astype(np.float32)
    src = tmp_path / "r.coco"
    src.write_text(ROUTE.read_text().replace("bf16[B, T, H]", "f32[B, T, H]"))
    got = reference_dump(tmp_path, src, {"s": s, "ids": ids, "tb": tb, "x": x})
    order = np.argsort(-s, axis=2, kind="stable")[:, :, :K]
    assert np.array_equal(got["e"], order)
    assert np.array_equal(got["g"], np.take_along_axis(s, order, axis=2))
    assert np.array_equal(got["ge"], got["g"])
    slot = _model_capacity(order, E, C)
    assert np.array_equal(got["slot"], slot)
    buf = np.zeros((B, E * C, H), np.float32)
    for b, t, j in np.ndindex(B, T, K):
        if slot[b, t, j] >= 0:
            buf[b, slot[b, t, j]] += x[b, t]
    assert np.array_equal(got["buf"], buf)
    back = np.where(slot[..., None] >= 0, buf[np.arange(B)[:, None, None], slot.clip(0)], 0)
    assert np.array_equal(got["y"], back * 2)
    cnt = np.stack([np.bincount(order[b].ravel(), minlength=E) for b in range(B)])
    assert np.array_equal(got["cnt"], cnt)
    ok = (ids >= 0) & (ids < V)
    assert np.array_equal(got["emb"], np.where(ok[..., None], tb[ids.clip(0, V - 1)], 0))
    assert np.array_equal(got["top3"], np.argsort(-ids, axis=1, kind="stable")[:, :3])


@pytest.mark.parametrize("ranks", ["2", "4", "8"])
def test_verify_on_2_4_8_ranks(ranks: str) -> None:
    rc, out, err = run_cli("verify", str(ROUTE), "--ranks", ranks)
    assert rc == 0, out + err
    assert "9 value(s) agree" in out


def test_routed_moe_sample_verifies_on_2_4_8_ranks() -> None:
    for ranks, dims in (
        ("2", ["-D", "R=2", "-D", "E=2", "-D", "C=8"]),
        ("4", ["-D", "R=4", "-D", "E=4", "-D", "C=4"]),
        ("8", ["-D", "R=8", "-D", "E=8", "-D", "C=2"]),
    ):
        small = ["-D", "T=8", "-D", "H=16", "-D", "F=32", *dims]
        rc, out, err = run_cli("verify", "moe_routed", "--ranks", ranks, *small)
        assert rc == 0 and "agree" in out, out + err


# --- schedules --------------------------------------------------------------------------
def test_reorder_routes_the_slices_before_the_allgather() -> None:
    p = load_program(ROUTE.read_text(), str(ROUTE))
    q = apply_steps(p, ["reorder(sf, g, e, slot, ge)"])
    assert q.stage("e_s").expr.op.value == "topk_indices"
    assert str(q.stage("slot_s").ty.layout) == "sliced"
    assert q.stage("slot").expr.op.value == "allgather"


def test_reorder_refuses_a_topk_along_the_gathered_dimension() -> None:
    p = prog("input s : f32[B, E] sliced(1)\nsf = allgather(s)\ny = topk(sf, K)\noutput y\n")
    with pytest.raises(ScheduleError):
        apply_steps(p, ["reorder(sf, y)"])


def test_overlap_refuses_a_routing_stage() -> None:
    p = load_program(samples.text("moe_routed"), "moe_routed.coco")
    with pytest.raises(ScheduleError) as info:
        apply_steps(p, ["overlap(disp, slots, y, h, a, o, back, chunks=4)"])
    assert "not supported yet" in info.value.message


# --- cost model, TUI --------------------------------------------------------------------
def test_cost_model_prices_bytes_moved_not_a_gemm() -> None:
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.workload import lower_stage, make_context

    p = load_program(ROUTE.read_text(), str(ROUTE))
    ctx = make_context(p, load_profile("h100-dgx"))
    (op,) = lower_stage(ctx, "back")
    # the rank's slot indices (replicated [B, T, K] i32, read as the rank's rows: 2 of 8),
    # the rows selected — at most the operand, the rank's [2, E*C, H] f32 of buf, here
    # smaller than the result — and the result [B/4, T, K, H] f32 written
    idx, operand, result = 2 * 16 * 2 * 4, 2 * 24 * 16 * 4, 2 * 16 * 2 * 16 * 4
    assert op.kind.value == "compute" and op.nbytes == idx + min(operand, result) + result
    assert op.flops == 0


def test_tui_graph_names_the_op() -> None:
    from cocoviz.tui.graph_layout import _node_lines

    p = load_program(ROUTE.read_text(), str(ROUTE))
    assert _node_lines(p.stage("g"), 4, frozenset())[0][0] == "topk k=K dim=2"
    assert _node_lines(p.stage("slot"), 4, frozenset())[0][0] == "capacity_slots E=E C=C"
    assert _node_lines(p.stage("emb"), 4, frozenset())[0][0] == "gather dim=0"


# --- executors and code targets ---------------------------------------------------------
@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize("schedule", [None, "route_slices"])
def test_mpi_run_matches_reference(schedule, tmp_path: Path) -> None:
    mpi_matches_reference(ROUTE, schedule, 4, tmp_path)


@pytest.mark.build
@pytest.mark.parametrize(
    ("target", "collectives"), [("cpu", "nccl"), ("cuda", "nccl"), ("cuda", "nccl-device")]
)
def test_emitted_check_and_dumps_equal_reference(
    target: str, collectives: str, tmp_path: Path, emu_cache: Path
) -> None:
    emitted_check(ROUTE, "route_slices", target, collectives, tmp_path, emu_cache)
