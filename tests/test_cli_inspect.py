"""`cocoviz check`, `cocoviz show` and `cocoviz samples` through `cocoviz.cli.main`."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.ir.lower import load_program

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


# --- check ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", samples.names())
def test_check_every_sample(name: str) -> None:
    rc, out, err = run("check", str(ROOT / "samples" / f"{name}.coco"))
    assert (rc, err) == (0, "")
    (line,) = out.splitlines()
    p = load_program(samples.text(name), f"{name}.coco")
    assert line.startswith(f"{name}: ranks {p.grid}, {len(p.stages)} stages (")
    assert re.search(r"; each rank sends \d+(\.\d+)? (B|KiB|MiB|GiB)", line), line


@pytest.mark.parametrize("argv", [["check", "megatron_mlp"], ["check", "no-such-file.coco"]])
def test_a_command_leaves_the_garbage_collector_as_it_found_it(argv: list[str]) -> None:
    """A command freezes the program it loads and raises the collector's thresholds
    while it runs (`cocoviz.cli.main`); a caller in the same process gets both back."""
    import gc

    before = gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()
    run(*argv)
    assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before


def test_check_summary_of_megatron_mlp() -> None:
    rc, out, _ = run("check", str(ROOT / "samples" / "megatron_mlp.coco"))
    assert rc == 0
    assert out.startswith(
        "megatron_mlp: ranks 8, 3 stages (1 matmul, 1 collective, 1 compute); allreduce sum; "
        "each rank sends 168.00 MiB"  # 2 (n-1)/n of B*S*H f16 = 2 * 7/8 * 96 MiB
    )


def test_check_json() -> None:
    rc, out, _ = run("check", "megatron_mlp", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["program"] == "megatron_mlp" and data["stages"] == 3
    assert [c["name"] for c in data["communication"]] == ["sum"]
    # allreduce of B*S*H f16 over 8 ranks; each rank sends 2 (n-1)/n of the bytes
    assert data["communication"][0]["bytes"] == 2 * 2048 * 12288 * 2
    assert data["communication"][0]["sent_per_rank"] == 2 * 2048 * 12288 * 2 * 2 * 7 // 8


def test_check_accepts_an_embedded_sample_name() -> None:
    rc, out, _ = run("check", "sgd")
    assert rc == 0 and out.startswith("sgd: ranks 32, 3 stages")


def test_check_with_defines_and_ranks() -> None:
    rc, out, _ = run(
        "check", "megatron_mlp", "-D", "B=8", "-D", "S=1024", "-D", "H=1024", "--ranks", "16"
    )
    assert rc == 0 and out.startswith("megatron_mlp: ranks 16, 3 stages")
    assert "each rank sends 30.00 MiB" in out  # 2 * 15/16 * 16 MiB
    rc, out, _ = run("check", "megatron_mlp", "-D", "B=8", "-D", "S=1024", "-D", "H=1024")
    assert rc == 0 and out.startswith("megatron_mlp: ranks 8, 3 stages")
    assert "each rank sends 28.00 MiB" in out
    rc, out, _ = run("check", "pipeline_stage", "--ranks", "tp=4,pp=2")
    assert rc == 0 and "ranks tp=4, pp=2" in out


def test_check_reports_an_input_error_with_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.coco"
    bad.write_text("ranks 4\ndim N = 8\ninput x : f32[N] replicated\ny = relu(xx)\n")
    rc, out, err = run("check", str(bad))
    assert (rc, out) == (1, "")
    assert err == (
        f"{bad}:4:10: error: unknown name 'xx'\n"
        "   4 | y = relu(xx)\n"
        "     |          ^^\n"
        "hint: did you mean 'x'?\n"
    )


# --- show -----------------------------------------------------------------------------------
def test_show_megatron_mlp_has_layouts_and_shapes() -> None:
    rc, out, err = run("show", str(ROOT / "samples" / "megatron_mlp.coco"))
    assert (rc, err) == (0, "")
    assert re.search(r"^layer = matmul\(x, w\) +# f16\[B, S, H\] local$", out, re.M)
    assert re.search(r"^sum = allreduce\(\+, layer\) +# f16\[B, S, H\] replicated$", out, re.M)
    assert re.search(
        r"^out = dropout\(sum \+ b, 0\.1\) \+ r +# f16\[B, S, H\] replicated$", out, re.M
    )
    # the shown text is a program: it parses back to the same program
    assert load_program(out, "megatron_mlp.coco") == load_program(
        samples.text("megatron_mlp"), "megatron_mlp.coco"
    )


def test_show_json() -> None:
    coconet = ("-D", "B=8", "-D", "S=1024", "-D", "H=3072", "--ranks", "16")
    rc, out, _ = run("show", "megatron_mlp", "--format", "json", *coconet)
    assert rc == 0
    data = json.loads(out)
    layouts = {s["name"]: (s["layout"], s["shape"], s["sizes"]) for s in data["stages"]}
    assert layouts == {
        "layer": ("local", ["B", "S", "H"], [8, 1024, 3072]),
        "sum": ("replicated", ["B", "S", "H"], [8, 1024, 3072]),
        "out": ("replicated", ["B", "S", "H"], [8, 1024, 3072]),
    }
    assert data["outputs"] == ["out"]
    rc, out2, _ = run("show", "megatron_mlp", "--json", *coconet)
    assert rc == 0 and json.loads(out2) == data


def test_show_dot() -> None:
    rc, out, _ = run("show", "megatron_mlp", "--format", "dot")
    assert rc == 0
    assert out.startswith('digraph "megatron_mlp" {') and out.rstrip().endswith("}")
    assert '"layer" -> "sum";' in out and '"sum" -> "out";' in out
    assert 'label="layer = matmul\\nf16[B, S, H]\\nlocal"' in out


def test_show_graph_draws_every_stage_with_its_layout() -> None:
    rc, out, err = run("show", "megatron_mlp", "--graph")
    assert (rc, err) == (0, "")
    for name, layout in [("layer", "local"), ("sum", "replicated"), ("out", "replicated")]:
        assert name in out
        assert layout in out
    assert "f16[B, S, H]" in out


def test_show_pipeline_stage_annotates_pipeline_stages() -> None:
    rc, out, _ = run("show", "pipeline_stage")
    assert rc == 0
    assert re.search(r"^recv = send\(sum\) +# f16\[B, S, H\] replicated @stage 1$", out, re.M)


# --- apply --explain: the TUI palette's steps ---------------------------------------------
SP_MLP = ROOT / "tests" / "programs" / "sp_mlp.coco"


def test_explain_offers_decompose_where_it_applies_and_says_why_not() -> None:
    rc, out, err = run("apply", str(SP_MLP), "--explain", "xg")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "steps for 'xg':"
    assert lines[1].split() == ["ok", "decompose(xg,", "h)"]
    refused = next(line for line in lines if line.lstrip().startswith("no overlap(xg, h)"))
    assert "decompose(xg, h) overlaps them shard by shard" in refused

    rc, out, _ = run("apply", str(SP_MLP), "--explain", "ys", "--json")
    assert rc == 0
    assert {"step": "decompose(y, ys)", "ok": True, "reason": None} in json.loads(out)

    # after it, refused with the reason
    rc, out, _ = run("apply", str(SP_MLP), "decompose(y, ys)", "--explain", "y")
    line = next(x for x in out.splitlines() if "decompose(y, ys)" in x)
    assert line.lstrip().startswith("no decompose(y, ys)")
    assert "'y' is already in an overlapped group" in line

    # a matmul's allreduce: refused, not a reducescatter (split it first)
    rc, out, _ = run("apply", "megatron_mlp", "--explain", "layer")
    line = next(x for x in out.splitlines() if "decompose(" in x)
    assert line.split()[:3] == ["no", "decompose(layer,", "sum)"]
    assert "is not a reducescatter" in line


def test_explain_lists_every_overlap_group_with_the_models_chunk_count() -> None:
    rc, out, err = run("apply", "moe_layer", "--explain", "h")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    best = re.fullmatch(r"  ok (overlap\(y, h, a, o, back, chunks=(\d+)\))", lines[1])
    assert best is not None, lines
    ok = [line.split(None, 1)[1] for line in lines[1:] if line.startswith("  ok overlap(")]
    assert all(re.search(r", chunks=\d+\)$", step) for step in ok), ok
    assert [re.sub(r", chunks=\d+\)$", ")", step) for step in ok] == [
        "overlap(y, h, a, o, back)",  # both all-to-alls first, then the smallest groups
        "overlap(y, h)",
        "overlap(y, h, a)",
        "overlap(y, h, a, o)",
        "overlap(h, a, o, back)",
    ]
    # the chunk count listed is the one applying the step without `chunks=` gives
    rc, out, _ = run("apply", "moe_layer", "overlap(y, h, a, o, back)", "--json")
    assert json.loads(out)["steps"] == [best.group(1)]


def test_the_explain_example_in_the_docs_is_what_apply_prints() -> None:
    """docs/schedules.md shows `apply --explain`'s output, reasons cut short with `…`."""
    doc = (ROOT / "docs" / "schedules.md").read_text(encoding="utf-8")
    m = re.search(r"```text\n\$ (cocoviz apply .*--explain \w+)\n(.*?)```", doc, re.S)
    assert m is not None
    rc, out, err = run(*shlex.split(m.group(1))[1:])
    assert (rc, err) == (0, "")
    shown, printed = m.group(2).splitlines(), out.splitlines()
    assert len(shown) == len(printed)
    for want, got in zip(shown, printed, strict=True):
        head, cut, tail = want.partition("…")
        if cut:
            assert got.startswith(head.removesuffix("(")) and got.endswith(tail.removeprefix(")"))
        else:
            assert got == want


# --- samples --------------------------------------------------------------------------------
def test_samples_lists_every_sample_with_its_first_sentence() -> None:
    rc, out, _ = run("samples")
    assert rc == 0
    names = [line.split()[0] for line in out.splitlines() if not line.startswith(" ")]
    assert names == samples.names()
    assert {
        "sgd",
        "adam",
        "lamb",
        "megatron_mlp",
        "megatron_attention_out",
        "transformer_block",
        "pipeline_stage",
    } <= set(names)
    assert "Megatron-LM row-parallel linear layer" in out
    rc, out, _ = run("samples", "--json")
    assert json.loads(out) == samples.names()


def test_samples_copy(tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    rc, out, _ = run("samples", "--copy", str(dest))
    assert rc == 0 and out == f"copied {len(samples.names())} samples to {dest}\n"
    for name in samples.names():
        assert (dest / f"{name}.coco").read_text() == samples.text(name)
        assert run("check", str(dest / f"{name}.coco"))[0] == 0
    rc, _, err = run("samples", "--copy", str(dest))  # would overwrite: refused
    assert rc == 2 and "would overwrite" in err


def test_samples_gpt(tmp_path: Path) -> None:
    rc, out, _ = run("samples", "--gpt", "2")
    assert rc == 0 and out.startswith("# A 2-layer GPT-style stack")
    path = tmp_path / "gpt2.coco"
    path.write_text(out)
    p = load_program(out, str(path))
    assert len(p.stages) == 42 and p.outputs == ("x2",)
    rc, check_out, _ = run("check", str(path))
    assert rc == 0 and check_out.startswith("gpt2: ranks 8, 42 stages")
    assert run("samples", "--gpt", "0")[0] == 2


# --- usage and input errors -----------------------------------------------------------------
def test_missing_file() -> None:
    rc, out, err = run("check", "no_such_file.coco")
    assert (rc, out) == (1, "")
    assert err == (
        "error: no_such_file.coco: no such file\n"
        "hint: run 'cocoviz samples' for the bundled programs\n"
    )
    rc, _, err = run("show", "megatron_mpl")
    assert rc == 1 and "hint: did you mean 'megatron_mlp'?" in err


def test_a_directory_is_not_a_program(tmp_path: Path) -> None:
    rc, _, err = run("check", str(tmp_path))
    assert rc == 1 and "is a directory" in err


def test_non_utf8_file(tmp_path: Path) -> None:
    p = tmp_path / "latin1.coco"
    p.write_bytes(b"ranks 4\n# caf\xe9\n")
    rc, _, err = run("check", str(p))
    assert rc == 1 and "not UTF-8 text" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-D", "H"], "error: -D expects NAME=INTEGER, got 'H'"),
        (["-D", "H=abc"], "error: -D expects NAME=INTEGER, got 'H=abc'"),
        (["-D", "H=0"], "error: -D H: sizes must be positive, got 0"),
        (["-D", "Q=4"], "error: -D Q: the program has no dimension named 'Q'"),
        (["-D", "h=4"], "hint: did you mean 'H'?"),
        (["--ranks", "tp=a"], "error: --ranks expects N or tp=T,pp=P, got 'tp=a'"),
        (["--ranks", "0"], "error: --ranks must be positive"),
        (["--ranks", "tp=2"], "error: --ranks expects N or tp=T,pp=P, got 'tp=2'"),
    ],
)
def test_bad_defines_and_ranks_are_usage_errors(args: list[str], message: str) -> None:
    rc, out, err = run("check", "megatron_mlp", *args)
    assert (rc, out) == (2, "")
    assert message in err.splitlines()


def test_ranks_that_do_not_divide_the_pipeline() -> None:
    rc, _, err = run("check", "pipeline_stage", "--ranks", "9")
    assert rc == 2
    assert err.startswith(
        "error: --ranks 9: the program has pp=2 pipeline stages, which do not divide 9"
    )


def test_ranks_that_make_a_slicing_indivisible_is_an_input_error() -> None:
    rc, _, err = run("check", "megatron_mlp", "--ranks", "7")
    assert rc == 1
    assert "input 'w' is sliced over 7 ranks" in err


def test_unknown_command_and_option_are_usage_errors() -> None:
    assert run("frobnicate")[0] == 2
    rc, _, err = run("check", "sgd", "--nope")
    assert rc == 2 and "unrecognized arguments: --nope" in err


COCONET_SAMPLES = (
    "adam",
    "lamb",
    "sgd",
    "megatron_mlp",
    "megatron_attention_out",
    "pipeline_stage",
    "transformer_block",
)


@pytest.mark.parametrize("name", COCONET_SAMPLES)
def test_coconets_configuration_in_the_comments_is_reachable(name: str) -> None:
    defines, ranks, hw = samples.coconet_config(name)
    assert defines and hw == "v100-dgx2"
    argv = [f"-D{k}={v}" for k, v in defines.items()] + ["--hw", hw]
    argv += ["--ranks", ranks] if ranks else []
    rc, out, err = run("check", name, *argv)
    assert (rc, err) == (0, ""), err
    p = load_program(samples.text(name), f"{name}.coco", defines)
    assert all(p.shape_env[k] == v for k, v in defines.items())
    assert out.startswith(f"{name}: ranks {ranks or p.grid}, ")
