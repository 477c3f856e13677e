"""Rank grids with named axes (docs/language.md, rank grids): `ranks dp=D, tp=T, pp=P`,
layouts over dp, collectives `over=dp`; parsing, diagnostics, inference, the printer,
`--ranks`, the numpy reference (against numpy written here) and `verify`."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from cocoviz.cli import main
from cocoviz.errors import InputError, UsageError
from cocoviz.exec.reference import run_reference
from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.ir.printer import format_program

ROOT = Path(__file__).resolve().parent.parent
GRID_PROGRAM = ROOT / "tests" / "programs" / "grid_dp_tp.coco"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def check_text(tmp_path: Path, text: str) -> tuple[int, str]:
    f = tmp_path / "t.coco"
    f.write_text(text)
    rc, _, err = run("check", str(f))
    return rc, err


# --- the grid --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "dp", "tp", "pp", "printed"),
    [
        ("ranks dp=2, tp=4", 2, 4, 1, "dp=2, tp=4"),
        ("ranks tp=4, dp=2", 2, 4, 1, "tp=4, dp=2"),
        ("ranks dp=2, tp=2, pp=2", 2, 2, 2, "dp=2, tp=2, pp=2"),
        ("ranks pp=2, dp=4", 4, 1, 2, "pp=2, dp=4"),
        ("ranks tp=8, pp=2", 1, 8, 2, "tp=8, pp=2"),  # the two-axis grid of before
        ("ranks pp=2, tp=8", 1, 8, 2, "tp=8, pp=2"),
    ],
)
def test_any_subset_of_axes_in_any_order(line: str, dp: int, tp: int, pp: int, printed: str) -> None:
    p = load_program(f"{line}\ndim N = 64\ninput x : f32[N] replicated\ny = x * 2\n", "t.coco")
    g = p.grid
    assert (g.dp, g.tp, g.pp, g.world, str(g)) == (dp, tp, pp, dp * tp * pp, printed)
    # world ranks are tp-fastest: rank = (pp·D + dp)·T + tp
    for r in range(g.world):
        pi, di, ti = g.coords(r)
        assert g.rank_of(pi, di, ti) == r and ti == r % tp


def test_ranks_override_keeps_the_other_axes_and_sets_tp() -> None:
    text = GRID_PROGRAM.read_text()
    p = load_program(text, "g.coco", ranks=RanksOverride(n=8))
    assert (p.grid.dp, p.grid.tp) == (2, 4)
    p = load_program(text, "g.coco", ranks=RanksOverride.parse("dp=4,tp=2"))
    assert (p.grid.dp, p.grid.tp, str(p.grid)) == (4, 2, "dp=4, tp=2")
    with pytest.raises(UsageError, match=r"other axes \(dp=2\) hold 2 ranks per tp index"):
        load_program(text, "g.coco", ranks=RanksOverride(n=5))
    with pytest.raises(UsageError, match="--ranks expects N or tp=T,pp=P"):
        RanksOverride.parse("dp=2")  # one axis alone: `--ranks N` says that
    with pytest.raises(UsageError):
        RanksOverride.parse("dp=2,ep=2")


# --- diagnostics -----------------------------------------------------------------------------
HEAD = "ranks dp=2, tp=2\ndim N = 8\n"


@pytest.mark.parametrize(
    ("text", "where", "message", "hint"),
    [
        (
            "ranks dp=2, xp=4\n",
            "t.coco:1:13",
            "unknown axis 'xp' in the ranks grid",
            "axes: dp (data), tp (tensor), pp (pipeline)",
        ),
        ("ranks dp=2, tp=2, dp=2\n", "t.coco:1:19", "axis 'dp' is given twice", "at most once"),
        (
            "ranks 4\ndim N = 8\ninput g : f32[N] local\ny = allreduce(+, g, over=dp)\n",
            "t.coco:4:26",
            "over=dp: allreduce over a named axis needs a rank grid, but this program runs on "
            "`ranks 4`",
            "ranks dp=2, tp=2",
        ),
        (
            HEAD + "input g : f32[N] local\ny = allreduce(+, g, over=ep)\n",
            "t.coco:4:26",
            "unknown axis 'ep': this program's grid has the axes dp, tp",
            "axes: dp, tp",
        ),
        (
            "ranks tp=2, pp=2\ndim N = 8\ninput g : f32[N] local\ny = allreduce(+, g, over=dp)\n",
            "t.coco:4:26",
            "unknown axis 'dp': this program's grid has the axes tp, pp",
            "ranks dp=N",
        ),
        (
            "ranks dp=2, tp=2, pp=2\ndim N = 8\ninput g : f32[N] local\n"
            "y = allreduce(+, g, over=pp)\n",
            "t.coco:4:26",
            "the pp axis is crossed only by send",
            "send(x)",
        ),
        (
            "ranks dp=3, tp=2\ndim N = 8\ninput g : f32[N] local\n"
            "y = reducescatter(+, g, over=dp)\n",
            "t.coco:4:5",
            "its 8 elements of a tp rank's part [N] do not divide by dp=3",
            "--ranks dp=D,tp=T",
        ),
        (
            HEAD.replace("N = 8", "N = 6") + "input g : f32[N] sliced(over=dp) sliced\n",
            "t.coco:3:18",
            "its 3 elements of a tp rank's part [N/2] do not divide by dp=2",
            "-D",
        ),
        (
            HEAD + "input g : f32[N] sliced(over=dp)\ny = allreduce(+, g, over=dp)\n",
            "t.coco:4:5",
            "allreduce(…, over=dp) needs a local or replicated operand over dp; 'g' is "
            "sliced(over=dp)",
            "allgather(…, over=dp)",
        ),
        (
            HEAD + "input g : f32[N] local(over=dp) sliced(over=dp)\n",
            "t.coco:3:33",
            "input 'g' has two layouts over the dp axis",
            "an axis without one is replicated",
        ),
        (
            HEAD + "input g : f32[N, N] local(over=dp)\ninput b : f32[N] replicated\n"
            "y = reducescatter(+, g, over=dp)\nz = y + b\n",
            "t.coco:6:9",
            "cannot combine 'y', sliced(over=dp), with 'b', which is replicated over dp and "
            "replicated [N] on a tp rank: broadcasting",
            "allgather(x, over=dp)",
        ),
        (
            HEAD + "input g : f32[N] local\ny = alltoall(g, to=0, over=dp)\n",
            "t.coco:4:23",
            "alltoall(…, over=dp) is not supported yet",
            "leave over= out",
        ),
        (
            HEAD + "input g : f32[N] sliced(0, foo=dp)\n",
            "t.coco:3:28",
            "a layout takes one keyword, over=AXIS; got 'foo='",
            "sliced(0, over=dp)",
        ),
        (
            HEAD + "input w : f32[N] replicated\ninput g : f32[N] sliced(over=dp)\n"
            "w1 = update(w, slice(w, over=dp) - g)\n",
            "t.coco:5:1",
            "must be followed by an allgather over dp of 'w1'",
            "allgather(w1, over=dp)",
        ),
        (
            HEAD + "input g : f32[N, N] sliced(over=dp)\ny = reshape(g, N*N)\n",
            "t.coco:4:5",
            "reshape of 'g', which is sliced(over=dp), is not supported yet",
            "allgather(x, over=dp)",
        ),
    ],
)
def test_misuse_is_a_diagnostic_with_place_caret_and_hint(
    tmp_path: Path, text: str, where: str, message: str, hint: str
) -> None:
    rc, err = check_text(tmp_path, text)
    assert rc == 1, err
    first, source, caret, *rest = err.splitlines()
    assert first.startswith(f"{tmp_path / 't.coco'}:{where.split(':', 1)[1]}: error: "), err
    assert message in first, err
    assert "^" in caret and "|" in source
    assert any(line.startswith("hint: ") and hint in line for line in rest), err


def test_bad_ranks_override_is_a_usage_error() -> None:
    rc, out, err = run("check", str(GRID_PROGRAM), "--ranks", "5")
    assert (rc, out) == (2, "")
    assert "hold 2 ranks per tp index, which does not divide 5" in err


# --- inference and the printer ---------------------------------------------------------------
def test_layouts_over_dp_are_inferred_and_printed_back() -> None:
    p = load_file(GRID_PROGRAM)
    assert str(p.type_of("gw")) == "f32[H, F] sliced(1) local(over=dp)"
    assert str(p.type_of("gs")) == "f32[H, F] sliced(1) sliced(over=dp)"
    assert str(p.type_of("w1")) == "f32[H, F] sliced(1) sliced(over=dp)"
    assert str(p.type_of("wf")) == "f32[H, F] sliced(1)"
    text = format_program(p)
    assert "input m : f32[H, F] sliced(1) sliced(over=dp)" in text
    assert "gs = reducescatter(+, gw, over=dp)" in text
    assert "w1 = update(w, slice(w, over=dp) - lr * m1)" in text
    again = load_program(text, "grid_dp_tp.coco")
    assert again == p and format_program(again) == text


def test_a_dp_replicated_operand_of_the_same_part_reads_its_dp_part() -> None:
    # as over tp, where a replicated operand of a sliced value's shape becomes slice(x)
    base = HEAD + "input g : f32[N] local(over=dp)\ninput w : f32[N] replicated\n"
    base += "y = reducescatter(+, g, over=dp)\n"
    implicit = load_program(base + "z = y + w\n", "t.coco")
    explicit = load_program(base + "z = y + slice(w, over=dp)\n", "t.coco")
    assert implicit.stages == explicit.stages
    assert "z = y + slice(w, over=dp)" in format_program(implicit)


def test_default_axis_is_tp_and_writing_it_changes_nothing() -> None:
    base = HEAD + "input g : f32[N] local\n"
    a = load_program(base + "y = allreduce(+, g)\n", "t.coco")
    b = load_program(base + "y = allreduce(+, g, over=tp)\n", "t.coco")
    assert a.stages == b.stages


# --- the reference ---------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", ["dp=2,tp=1", "dp=2,tp=2", "dp=4,tp=2", "dp=2,tp=4"])
def test_reference_matches_numpy(ranks: str) -> None:
    p = load_file(GRID_PROGRAM, ranks=RanksOverride.parse(ranks))
    D = p.grid.dp
    r = run_reference(p, seed=5)
    xt, dh = r.initial_value("xt"), r.initial_value("dh")
    w, m = r.initial_value("w"), r.initial_value("m")
    assert xt.shape == (D, 16, 8) and dh.shape == (D, 8, 32)  # local over dp: a replica each
    gw = np.stack([xt[d] @ dh[d] for d in range(D)])
    np.testing.assert_allclose(r.global_value("gw"), gw, rtol=1e-5)
    gs = gw.sum(0)
    np.testing.assert_allclose(r.global_value("gs"), gs, rtol=1e-5)
    m1 = np.float32(0.9) * m + gs
    np.testing.assert_allclose(r.global_value("m"), m1, rtol=1e-5)
    np.testing.assert_allclose(r.global_value("wf"), w - np.float32(0.01) * m1, rtol=1e-5)
    np.testing.assert_allclose(r.global_value("gsum"), gs / D, rtol=1e-5)
    # what a rank stores: sliced(1) over tp, then a flat 1/D of that block over dp
    T = p.grid.tp
    for rank in range(p.grid.world):
        _, d, t = p.grid.coords(rank)
        block = gs[:, t * (32 // T) : (t + 1) * (32 // T)].reshape(-1)
        n = block.size // D
        got = r.storage("gs", rank).reshape(-1)
        np.testing.assert_allclose(got, block[d * n : (d + 1) * n], rtol=1e-5)


def test_given_inputs_use_the_global_forms() -> None:
    p = load_file(GRID_PROGRAM)
    rng = np.random.default_rng(0)
    xt = rng.standard_normal((2, 16, 8)).astype(np.float32)
    dh = rng.standard_normal((2, 8, 32)).astype(np.float32)
    r = run_reference(p, inputs={"xt": xt, "dh": dh})
    np.testing.assert_allclose(r.global_value("gsum"), (xt[0] @ dh[0] + xt[1] @ dh[1]) / 2, rtol=1e-5)
    with pytest.raises(InputError, match=r"expected an array of shape \[2, 16, 8\]"):
        run_reference(p, inputs={"xt": xt[0]})


@pytest.mark.parametrize("ranks", ["dp=2,tp=1", "dp=2,tp=2", "dp=4,tp=2"])
def test_verify_on_2_4_8_ranks(ranks: str) -> None:
    rc, out, err = run("verify", str(GRID_PROGRAM), "--ranks", ranks)
    assert rc == 0, err
    assert "ok: 4 value(s) agree" in out


def test_split_over_dp_keeps_the_axis() -> None:
    rc, out, err = run("show", str(GRID_PROGRAM), "--schedule", "split_dp")
    assert rc == 0, err
    assert "gsum_rs = reducescatter(avg, gw, over=dp)" in out
    assert "gsum = allgather(gsum_rs, over=dp)" in out


ZERO_PROGRAM = ROOT / "tests" / "programs" / "grid_dp_zero.coco"


def test_split_and_reorder_over_dp_move_the_update_onto_dp_shards() -> None:
    rc, out, err = run("show", str(ZERO_PROGRAM), "--schedule", "zero")
    assert rc == 0, err
    assert "ga_rs = reducescatter(avg, g, over=dp)" in out
    assert "m1_s = update(m, slice(0.9 * m, over=dp) + ga_rs)" in out
    assert "m1 = allgather(m1_s, over=dp)" in out
    assert "w1_s = update(w, slice(w, over=dp) - lr * m1_s)" in out
    assert "w1 = allgather(w1_s, over=dp)" in out
    for ranks in ("dp=2,tp=1", "dp=2,tp=2", "dp=4,tp=2"):
        rc, out, err = run("verify", str(ZERO_PROGRAM), "--ranks", ranks)
        assert rc == 0, err
        assert "ok: 3 value(s) agree" in out


def test_reorder_across_a_dp_allgather_needs_a_reader() -> None:
    rc, _, err = run("apply", str(GRID_PROGRAM), "split(gsum)", "reorder(gsum)")
    assert rc == 3  # nothing reads gsum: the region is empty
    assert "nothing reads 'gsum'" in err


def test_the_fast_parser_reads_grid_layouts_as_the_grammar_does() -> None:
    from cocoviz.errors import Source
    from cocoviz.ir import fastparse, syntax

    text = (
        "ranks pp=2, dp=2, tp=2\ndim N = 8\n"
        "input a : f32[N, N] sliced(1) sliced(0, over=dp) @stage 1\n"
        "input b : f32[N] local(over=dp)\ninput c : f32[N] replicated(over=dp) sliced\n"
    )
    source = Source("<t>", text)
    fast = fastparse.parse(text, source, "start")
    slow = syntax._run_lark(text, source, "start")
    assert fast == slow


# --- the cost model --------------------------------------------------------------------------
AR_BOTH = """program ar_both
ranks dp=8, tp=8
dim N = 16777216
input g : f32[N] local local(over=dp)
a = allreduce(+, g)
b = allreduce(+, a, over=dp)
output b
"""


def _sim_rows(text: str, ranks: str | None = None) -> dict[str, tuple[float, str]]:
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.predict import simulate

    over = RanksOverride.parse(ranks) if ranks else None
    p = load_program(text, "t.coco", ranks=over)
    tl = simulate(p, load_profile("h100-dgx"), warnings=False)
    return {e.stage: (e.end - e.start, e.detail or "") for e in tl.lanes[0].events}


def test_a_collective_over_dp_spans_nodes_when_tp_fills_one() -> None:
    # h100-dgx: 8 GPUs a node; ranks are tp-fastest, so tp=8 is a node and dp=8 spans 8
    rows = _sim_rows(AR_BOTH)
    (t_tp, d_tp), (t_dp, d_dp) = rows["a"], rows["b"]
    assert d_tp.endswith("1 node") and d_dp.endswith("8 nodes")
    assert t_dp > 2 * t_tp  # the same 64 MiB over the network instead of NVLink
    # dp=8 with tp=1: the dp group is one node, and costs as the tp allreduce did
    rows = _sim_rows(AR_BOTH, "dp=8,tp=1")
    assert rows["b"][1].endswith("1 node")
    assert rows["b"][0] == pytest.approx(t_tp, rel=1e-9)


def test_the_summary_counts_a_tp_rank_part_over_dp() -> None:
    from cocoviz.ir.summary import comm_ops

    p = load_file(GRID_PROGRAM)  # dp=2, tp=2; gw is f32[16, 32] sliced(1): 16·16 a tp rank
    ops = {c.name: c for c in comm_ops(p)}
    assert (ops["gs"].nbytes, ops["gs"].sent_per_rank) == (1024, 512)
    assert (ops["wf"].nbytes, ops["wf"].sent_per_rank) == (1024, 512)
    assert (ops["gsum"].nbytes, ops["gsum"].sent_per_rank) == (1024, 1024)


# --- the sample ------------------------------------------------------------------------------
SMALL_SAMPLE = {"B": 8, "H": 16, "F": 32}


@pytest.mark.parametrize("ranks", ["dp=2,tp=1", "dp=2,tp=2", "dp=4,tp=2", "dp=2,tp=4"])
def test_zero1_sample_is_the_backward_and_adam_step_numpy_computes(ranks: str) -> None:
    from cocoviz import samples

    p = load_file(samples.path("zero1_tp_mlp"), SMALL_SAMPLE, RanksOverride.parse(ranks))
    D = p.grid.dp
    r = run_reference(p, seed=2)
    iv = r.initial_value
    x, h, dy = iv("x"), iv("h"), iv("dy")  # [D, …]: a micro-batch each
    w1, w2 = iv("w1"), iv("w2")
    f = np.float32
    a = np.maximum(h, 0)
    g2 = np.stack([a[d].T @ dy[d] for d in range(D)]).mean(0)
    dh = np.where(h > 0, dy @ w2.T, 0)
    g1 = np.stack([x[d].T @ dh[d] for d in range(D)]).mean(0)
    dx = dh @ w1.T
    np.testing.assert_allclose(r.global_value("dx"), dx, rtol=1e-4, atol=1e-4)
    for w, g, m, v in ((w1, g1, "m1", "v1"), (w2, g2, "m2", "v2")):
        m_new = f(0.9) * iv(m) + (1 - f(0.9)) * g
        v_new = f(0.999) * iv(v) + (1 - f(0.999)) * g * g
        np.testing.assert_allclose(r.global_value(m), m_new, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(r.global_value(v), v_new, rtol=1e-4, atol=1e-6)
        step = f(0.001) * (m_new * 10) / (np.sqrt(v_new * 1000) + f(1e-8))
        w_name = "w1" if w is w1 else "w2"
        np.testing.assert_allclose(r.global_value(w_name), w - step, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ranks", ["dp=2,tp=1", "dp=2,tp=2", "dp=4,tp=2"])
def test_zero1_sample_schedules_verify_on_2_4_8_ranks(ranks: str) -> None:
    args = ["-D", "B=8", "-D", "H=16", "-D", "F=32", "--ranks", ranks]
    rc, out, err = run("verify", "zero1_tp_mlp", *args)
    assert rc == 0, err
    assert out.count("ok: 7 value(s) agree") == 3  # as_written, fused_adam, fused_w1


def test_zero1_sample_tune_ranks_its_schedules_by_the_model() -> None:
    import json

    rc, out, err = run("tune", "zero1_tp_mlp", "--json")
    assert rc == 0, err
    rows = json.loads(out)["schedules"]
    times = {row["block"]: row["time_s"] for row in rows if row.get("block")}
    assert set(times) >= {"as_written", "fused_adam", "fused_w1"}
    assert rows[0]["block"] == "fused_adam"
    assert times["fused_adam"] < times["fused_w1"] < times["as_written"]


def test_show_graph_json_and_dot_name_the_dp_layouts_and_axis() -> None:
    import json

    rc, out, err = run("show", str(GRID_PROGRAM), "--format", "json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["ranks"] == {"tp": 2, "pp": 1, "grid": True, "dp": 2, "world": 4}
    gs = next(s for s in d["stages"] if s["name"] == "gs")
    assert (gs["over"], gs["layout"], gs["dp_layout"]) == ("dp", "sliced(1)", "sliced(over=dp)")
    rc, out, _ = run("show", str(GRID_PROGRAM), "--format", "dot")
    assert "gs = reducescatter over dp\\nf32[H, F]\\nsliced(1) sliced(over=dp)" in out
    rc, out, _ = run("show", str(GRID_PROGRAM), "--graph")
    assert "reducescatter over dp" in out and "sliced(1) sliced(over=dp) (1/4 per rank)" in out


def test_an_input_replicated_over_dp_throughout_is_sliced_over_tp_by_asslice() -> None:
    rc, out, err = run("verify", "adam", "-D", "N=256", "--ranks", "dp=2,tp=2")
    assert rc == 0, err  # adam's schedules asslice m and v on every dp replica alike
    assert out.count("ok: 4 value(s) agree") == 3


def test_the_tui_graph_box_names_the_axis_and_the_dp_layout() -> None:
    from cocoviz.tui.graph_layout import layout_graph

    nodes = layout_graph(load_file(GRID_PROGRAM)).nodes
    box = next(n for n in (nodes.values() if isinstance(nodes, dict) else nodes) if n.name == "gs")
    assert box.lines == ("reducescatter(+) over dp", "f32[H, F]", "sliced(1) sliced(over=dp) 1/4")
