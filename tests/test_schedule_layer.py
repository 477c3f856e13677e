"""The schedule layer: one path for every caller, the hardware profile as a value.

`overlap` written without `chunks=` gets the chunk count the cost model picks on the
hardware the caller hands down — the same K from `apply`, `tune`, `emit` and the TUI's
palette (docs/schedules.md, `overlap`) — and a bad `--hw` is one clean input error in
every command (docs/language.md, diagnostics).
"""

from __future__ import annotations

import json
import re

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.errors import CocovizError, ExitCode
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program
from cocoviz.schedule import apply_block, apply_step, find_block, palette
from cocoviz.schedule.tune import tune
from cocoviz.sim.hardware import load_profile
from cocoviz.sim.timeline import makespan

AUTO_BLOCK = "\nschedule auto {\n  overlap(layer, sum)\n}\n"
"""megatron_mlp's matmul overlapped with its allreduce, K left to the model."""


def _auto_program(ranks: int) -> tuple[str, Program]:
    """megatron_mlp at CoCoNet's sizes (where the model's K varies with the machine) on
    `ranks` ranks, with the `auto` block."""
    text = re.sub(
        r"^ranks \d+", f"ranks {ranks}", samples.text("megatron_mlp"), count=1, flags=re.M
    )
    text = re.sub(r"^dim .*$", "dim B = 8, S = 1024, H = 3072", text, count=1, flags=re.M)
    return text + AUTO_BLOCK, load_program(text + AUTO_BLOCK, "megatron_auto.coco")


def _k(step: str) -> int:
    m = re.search(r"chunks=(\d+)", step)
    assert m is not None, step
    return int(m.group(1))


@pytest.mark.parametrize(("hw_name", "ranks"), [("h100-dgx", 16), ("a100-dgx", 8), ("h200-hgx", 4)])
def test_overlap_gets_one_k_from_apply_tune_emit_and_the_palette(
    tmp_path, capsys, hw_name: str, ranks: int
) -> None:  # type: ignore[no-untyped-def]
    hw = load_profile(hw_name)
    text, program = _auto_program(ranks)
    path = tmp_path / "megatron_auto.coco"
    path.write_text(text)

    # the library path
    _, resolved = apply_step(program, "overlap(layer, sum)", hw)
    k = _k(str(resolved))

    # `cocoviz apply` with the same --hw
    assert main(["apply", str(path), "overlap(layer, sum)", "--hw", hw_name, "--json"]) == 0
    assert [_k(s) for s in json.loads(capsys.readouterr().out)["steps"]] == [k]

    # the palette offers it with that K
    entries = [e for e in palette(program, "layer", hw) if e.step == "overlap(layer, sum)"]
    assert len(entries) == 1 and entries[0].ok, entries
    assert f"K={k}" in entries[0].shown

    # the tuner evaluates the block as `apply` builds it
    scheduled = apply_block(program, find_block(program, "auto"), hw)
    by_block = [c for c in tune(program, hw).candidates if c.block == "auto"]
    assert len(by_block) == 1
    assert by_block[0].time_s == pytest.approx(makespan(scheduled, hw), rel=1e-12)

    # `cocoviz emit` records the resolved step in the manifest
    out = tmp_path / "out"
    rc = main(
        ["emit", str(path), "--schedule", "auto", "--target", "cpu", "-o", str(out)]
        + ["--hw", hw_name]
    )
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert [_k(s) for s in manifest["schedule"]["steps"]] == [k]


def test_the_model_k_differs_from_the_default_somewhere() -> None:
    """The test above would pass vacuously if the model always chose the default K."""
    from cocoviz.ir.transforms.overlap import DEFAULT_CHUNKS

    ks = set()
    for hw_name, ranks in [("h100-dgx", 16), ("a100-dgx", 8), ("h200-hgx", 4)]:
        _, program = _auto_program(ranks)
        _, resolved = apply_step(program, "overlap(layer, sum)", load_profile(hw_name))
        ks.add(_k(str(resolved)))
    assert ks - {DEFAULT_CHUNKS}


BAD_HW = [
    ["check", "sgd"],
    ["show", "sgd", "--schedule", "fused"],
    ["apply", "sgd", "split(sum)"],
    ["verify", "sgd", "--ranks", "2"],
    ["simulate", "sgd"],
    ["tune", "sgd"],
    ["run", "sgd", "--ranks", "2"],
    ["model-table"],
    ["tui", "megatron_mlp"],
]


@pytest.mark.parametrize("argv", BAD_HW, ids=lambda a: a[0])
def test_a_bad_hardware_profile_is_one_clean_input_error(capsys, argv: list[str]) -> None:  # type: ignore[no-untyped-def]
    rc = main([*argv, "--hw", "nonsense"])
    err = capsys.readouterr().err
    assert rc == ExitCode.INPUT, err
    assert "internal error" not in err and "Traceback" not in err
    assert err.startswith("error: unknown hardware profile 'nonsense'"), err
    assert err.count("error:") == 1
    assert "h100-dgx" in err  # the known profiles are listed


def test_emit_with_a_bad_hardware_profile_writes_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    rc = main(["emit", "sgd", "--target", "cpu", "-o", str(out), "--hw", "nonsense"])
    assert rc == ExitCode.INPUT
    assert "unknown hardware profile" in capsys.readouterr().err
    assert not out.exists()


def test_a_bad_hardware_file_names_the_field(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "h100-dgx"\ngpus_per_node = "eight"\n')
    rc = main(["simulate", "sgd", "--hw", str(bad)])
    err = capsys.readouterr().err
    assert rc == ExitCode.INPUT, err
    assert "gpus_per_node" in err and "internal error" not in err


def test_the_tui_refuses_a_bad_profile_before_it_starts() -> None:
    from cocoviz.tui.app import create_app

    with pytest.raises(CocovizError, match="unknown hardware profile 'nonsense'"):
        create_app("megatron_mlp", hw="nonsense")
