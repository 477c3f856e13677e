"""`cocoviz simulate`, `cocoviz tune` and `cocoviz model-table` through `main`."""

from __future__ import annotations

import json
from importlib import resources

import sim_programs as sp

from cocoviz.cli import main
from cocoviz.schedule import load_sched
from cocoviz.sim.trace import validate_trace


def _file(tmp_path, text, name="p.coco"):  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_simulate_draws_the_timeline_summary_and_table(capsys):
    assert main(["simulate", "megatron_mlp", "--hw", "h100-dgx", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "predicted time" in out and "exposed" in out and "overlap" in out
    assert "r0-7 compute" in out and "r0-7 comm" in out
    assert "µs" in out.splitlines()[5] or "ms" in out.splitlines()[5]  # axis unit
    assert "matmul" in out and "collective" in out  # legend and table
    assert "8 ranks in 1 group of identical ranks" in out  # TP=8 on one node
    for stage in ("layer", "sum", "out"):
        assert stage in out


def test_simulate_json(capsys):
    assert main(["simulate", "pipeline_stage", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ranks"] == {"tp": 8, "pp": 2, "world": 16}
    assert data["summary"]["makespan_s"] > 0 and data["summary"]["speedup"] == 1.0
    assert [lane["ranks"] for lane in data["lanes"]] == [list(range(8)), list(range(8, 16))]
    assert {s["kind"] for s in data["stages"]} >= {"matmul", "collective", "p2p", "compute"}


def test_simulate_trace(tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert main(["simulate", "pipeline_stage", "--trace", str(out), "--json"]) == 0
    err = capsys.readouterr().err
    assert "wrote" in err and "perfetto" in err.lower()
    assert validate_trace(json.loads(out.read_text()), range(16)) == []


def test_simulate_warns_on_stderr_when_overlap_loses(tmp_path, capsys):
    f = _file(tmp_path, sp.MLP_OVERLAP.replace("chunks=4", "chunks=16"))
    assert main(["simulate", f, "--hw", "h100-dgx"]) == 0
    captured = capsys.readouterr()
    assert "warning: overlap(layer, sum_rs, chunks=16) is predicted slower" in captured.err
    assert "warning" not in captured.out
    assert main(["simulate", f, "--hw", "h100-dgx", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["warnings"][0]["code"] == "overlap-slower"


def test_simulate_with_ranks_and_defines(capsys):
    assert main(["simulate", "adam", "-D", "N=134217728", "--ranks", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ranks"]["world"] == 8
    g1 = [s for s in data["stages"] if s["name"] == "g1"][0]
    assert g1["bytes"] == 2 * 2**27  # f16 gradients


def test_simulate_schedule_block(capsys):
    assert main(["simulate", "adam", "--schedule", "fused", "--hw", "v100-dgx2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["speedup"] > 1.0
    assert any(s["kind"] == "fused" for s in data["stages"])


def test_bad_hardware_file_names_the_field(tmp_path, capsys):
    text = (resources.files("cocoviz.sim") / "profiles" / "h100-dgx.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("sms = 132", 'sms = "many"', 1))
    assert main(["simulate", "adam", "--hw", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "gpu.sms" in err and "error" in err
    assert main(["tune", "adam", "--hw", str(tmp_path / "missing.toml")]) == 1
    assert "no such hardware profile" in capsys.readouterr().err
    assert main(["model-table", "--hw", "h100"]) == 1
    assert "did you mean" in capsys.readouterr().err


def test_nccl_device_across_nodes_is_a_usage_error(tmp_path, capsys):
    f = _file(tmp_path, sp.MLP_FUSED)  # 16 ranks: two 8-GPU nodes
    code = main(["simulate", f, "--hw", "h100-dgx", "--collectives", "nccl-device"])
    assert code == 2
    assert "one NVLink domain" in capsys.readouterr().err


def test_tune_lists_schedules(capsys):
    # CoCoNet's configuration, as the sample's comment gives it: 1 M parameters, 16 V100s
    assert main(["tune", "adam", "--hw", "v100-dgx2", "--ranks", "16", "-D", "N=1048576"]) == 0
    out = capsys.readouterr()
    for name in ("AR-C", "RS-C×6-AG", "fuse(RS-C-AG)", "[fused]", "[ar_c]", "[rs_c_ag]"):
        assert name in out.out
    assert "µs" in out.out
    assert out.err == ""  # no progress bar without a terminal


def test_tune_json_and_output(tmp_path, capsys):
    best = tmp_path / "best.sched"
    argv = ["tune", "megatron_mlp", "--hw", "v100-dgx2", "--collectives", "nccl-device"]
    assert main([*argv, "--top", "3", "-o", str(best), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["schedules"]) == 3
    first = data["schedules"][0]
    assert first["rank"] == 1 and first["name"].startswith("ol(MM")
    assert first["speedup"] > 1
    assert [str(s) for s in load_sched(best)] == first["steps"]
    assert main(["tune", "adam", "--top", "0"]) == 2


def test_model_table(capsys):
    assert (
        main(["model-table", "--hw", "h200-hgx", "--coll", "allgather", "-b", "1M", "-e", "1G"])
        == 0
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 11  # 1 MiB .. 1 GiB
    assert rows[0].split()[0] == str(1 << 20)
    busbw = float(rows[-1].split()[7])
    assert 361 * 0.9 <= busbw <= 361 * 1.1
    assert main(["model-table", "--hw", "a100-dgx", "--ranks", "8", "--json", "-e", "64"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"][0]["size"] == 8 and data["ranks"] == 8


def test_model_table_refuses_what_the_model_cannot_do(capsys):
    assert main(["model-table", "--hw", "v100-dgx2", "--algo", "nvls"]) == 2
    assert "NVLink SHARP" in capsys.readouterr().err
    assert main(["model-table", "-b", "lots"]) == 2


def test_stage_table_draws_what_rich_table_draws():
    """The per-stage table lays itself out when it fits the console and hands over to
    rich's Table when it does not: every sample x schedule (and a 3-stage pipeline),
    narrow to wide, plain and in colour, gives the same bytes both ways."""
    import io
    import itertools

    from rich.console import Console

    from cocoviz import samples
    from cocoviz.ir.lower import load_file
    from cocoviz.schedule import apply_schedule_arg
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.predict import simulate
    from cocoviz.sim.textview import render_stage_table

    hw = load_profile("h100-dgx")
    timelines = [simulate(sp.program(sp.PIPE_RS), hw)]
    for name in samples.names():
        p = load_file(samples.path(name))
        timelines += [simulate(apply_schedule_arg(p, b.name, hw), hw) for b in p.schedules]
    direct = 0
    for tl, width, colour in itertools.product(timelines, (40, 100, 160), (False, True)):
        drawn = []
        table = render_stage_table(tl)
        reference = table.rich_table()  # type: ignore[attr-defined]
        handed_over: list[object] = []

        def hand_over(seen: list[object] = handed_over, t: object = reference) -> object:
            seen.append(t)
            return t

        table.rich_table = hand_over  # type: ignore[attr-defined]
        for r in (table, reference):
            out = Console(
                file=io.StringIO(), width=width, force_terminal=colour,
                color_system="truecolor" if colour else None, highlight=False,
            )  # fmt: skip
            out.print(r)
            drawn.append(out.file.getvalue())  # type: ignore[attr-defined]
        assert drawn[0] == drawn[1], (tl.program, width, colour)
        direct += not handed_over
    assert direct > 20  # most were laid out directly (the rest by rich's Table)
