"""Hostile input to `cocoviz calibrate` (nccl-tests logs, -o, --base, --name) and to
`--hw PROFILE.toml` ends in one clear diagnostic and a nonzero exit that is not 70, and a
failed calibrate writes nothing.

Each case ran through the real CLI (`main`, as tests/test_hardening_input.py does) before
its fix and is listed with what it did then: a traceback (exit 70), a silent fit of
numbers no nccl-tests run prints, a profile written that does not load, a fit of half a
minute.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_hardening_input import assert_diagnostic, run

DATA = Path(__file__).resolve().parent / "data" / "nccl-tests"
ALL_REDUCE = DATA / "h100-nccl2.29.2" / "all_reduce_perf.log"
SHIPPED_LOG = ALL_REDUCE.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------
# Helpers


def edit_row(size: int, column: int, value: str, text: str = SHIPPED_LOG) -> str:
    """The log with field `column` (0: size, 5: time, 6: algbw, 7: busbw) of the row of
    `size` bytes replaced by `value`."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        fields = line.split()
        if fields and not line.startswith("#") and fields[0] == str(size):
            fields[column] = value
            lines[i] = "   ".join(fields) + "\n"
            return "".join(lines)
    raise AssertionError(f"no row of {size} B")


def with_header(line: str, text: str = SHIPPED_LOG) -> str:
    """The log with `line` added to its header (where nccl-tests notes NCCL_ALGO)."""
    return text.replace("# Collective test starting", f"{line}\n# Collective test starting", 1)


def calibrate(tmp_path: Path, text: str | bytes, *extra: str, name: str = "all_reduce_perf.log"):  # type: ignore[no-untyped-def]
    """Run `cocoviz calibrate LOG -o OUT.toml`; (rc, stdout, stderr, OUT)."""
    log = tmp_path / name
    if isinstance(text, bytes):
        log.write_bytes(text)
    else:
        log.write_text(text, encoding="utf-8")
    out = tmp_path / "out.toml"
    rc, stdout, err = run("calibrate", str(log), "-o", str(out), *extra)
    return rc, stdout, err, out


def refused(tmp_path: Path, text: str | bytes, *parts: str, code: int = 1) -> str:
    """Calibrate on `text` fails with `code`, names `parts`, and leaves no profile."""
    rc, _, err, out = calibrate(tmp_path, text)
    assert_diagnostic(rc, err, code, *parts)
    assert not out.exists(), err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".cocoviz-tmp-")]
    return err


def profile(tmp_path: Path, text: str | bytes, name: str = "mine.toml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------
# nccl-tests logs: every number of a row is checked where it is read


def test_a_size_too_long_for_a_float_is_refused_at_its_row(tmp_path: Path) -> None:
    # was: internal error (OverflowError: int too large to convert to float), exit 70
    err = refused(
        tmp_path, edit_row(4096, 0, "1" + "0" * 400), ":30:", "size '1000", "out of range"
    )
    assert "hint:" in err


@pytest.mark.parametrize(
    ("column", "value", "what"),
    [
        (0, "-4096", "the size must be a non-negative integer, got '-4096'"),
        (0, "4e3", "the size must be a non-negative integer"),
        (5, "nan", "time 'nan' is not a number nccl-tests prints"),
        (5, "inf", "time 'inf' is not a number nccl-tests prints"),
        (5, "-5.0", "time '-5.0' is not a number nccl-tests prints"),
        (5, "-0.0", "time '-0.0' is not a number"),
        (5, "0", "time '0' µs for 4096 B is out of range"),
        (5, "0x10", "time '0x10' is not a number"),
        (6, "nan", "algbw 'nan' is not a number"),
        (6, "-3", "algbw '-3' is not a number"),
        (7, "inf", "busbw 'inf' is not a number"),
    ],
)
def test_a_number_no_nccl_tests_run_prints_is_refused_at_its_field(
    tmp_path: Path, column: int, value: str, what: str
) -> None:
    # was: the row silently left out of the fit (size <= 0, a time that is not > 0) or
    # fitted as it was (nan, inf or negative bandwidths), exit 0 and a profile written
    err = refused(tmp_path, edit_row(4096, column, value), ":30:", what, "hint:")
    assert "^" * len(value) in err  # the caret under the field, not the whole row


def test_a_time_out_of_all_proportion_is_refused(tmp_path: Path) -> None:
    # was: fitted (algbw 0.03 was below the µs check's 1 GB/s), exit 0
    refused(tmp_path, edit_row(512, 5, "1e300"), ":27:", "is out of range (greater than 0, at most")
    refused(tmp_path, edit_row(512, 5, "1e-300"), ":27:", "does not give algbw 0.03")


def test_sizes_that_go_down_are_refused(tmp_path: Path) -> None:
    # was: fitted, exit 0 (rows of two runs pasted under one header)
    lines = SHIPPED_LOG.splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")]
    lines[rows[3]], lines[rows[4]] = lines[rows[4]], lines[rows[3]]
    refused(
        tmp_path,
        "".join(lines),
        ":31:",
        "the sizes go down: 4096 B after 8192 B at line 30",
        "hint: a log holds one nccl-tests run",
    )


def test_a_count_too_long_for_an_integer_is_refused(tmp_path: Path) -> None:
    # was: "size and count must be integers" for a count of 5000 digits (Python's limit)
    refused(tmp_path, edit_row(4096, 1, "9" * 5000), ":30:", "count '999", "out of range")


def test_a_log_of_one_rank_is_refused(tmp_path: Path) -> None:
    # was: internal error (the model gives one rank no time: log(0) in the fit), exit 70
    text = "".join(
        line
        for line in SHIPPED_LOG.splitlines(keepends=True)
        if "Rank " not in line or "Rank  0 " in line
    )
    refused(tmp_path, text, "the log lists one rank", "hint: calibrate fits links")


def test_the_same_size_repeated_for_megabytes_is_priced_once_a_step(tmp_path: Path) -> None:
    # was: every repeated row priced anew at every step of the fit: 28 s for a 10 MB log.
    # What the fit prices is counted (a timed assertion would measure the machine's load).
    from cocoviz.sim import calibrate as cal_mod
    from cocoviz.sim.calibrate import fit_samples, log_samples
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.nccl_tests_log import parse_log

    lines = SHIPPED_LOG.splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")]
    text = "".join(lines[: rows[0]] + lines[rows[0] : rows[-1]] + [lines[rows[-1]]] * 60_000)
    text += "".join(lines[rows[-1] + 1 :])
    assert len(text) > 6_000_000
    samples = log_samples(parse_log(text, "big.log"))
    assert len(samples) > 60_000
    distinct = len({s.nbytes for s in samples})
    priced: list[int] = []

    def counted(hw, s):  # type: ignore[no-untyped-def]
        priced.append(s.nbytes)
        return cal_mod._model_time(hw, s)

    fit_samples(samples, load_profile("h100-dgx"), time_of=counted, iterations=2)
    evaluations = len(priced) / distinct
    assert evaluations == int(evaluations) and evaluations < 200, (len(priced), distinct)
    rc, _, err, out = calibrate(tmp_path, text)  # and the CLI fits and writes it
    assert rc == 0, err
    assert out.exists()


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("# NCCL_ALGO=^", "NCCL_ALGO=^ names no algorithm for allreduce"),
        ("# NCCL_ALGO=allreduce:", "NCCL_ALGO=allreduce: names no algorithm for allreduce"),
        ("# NCCL_ALGO=:::", "the part ':::' names no collective"),
        (
            "# NCCL_ALGO=^ring,tree,nvls,nvlstree,pat",
            "excludes every algorithm the model runs",
        ),
        ("# NCCL_PROTO=^LL,LL128,Simple", "NCCL_PROTO=^LL,LL128,Simple excludes every protocol"),
        ("# NCCL_ALGO=bogus", "unknown algorithm 'bogus'"),
        ("# NCCL_PROTO=bogus", "unknown protocol 'bogus'"),
    ],
)
def test_nccl_algo_and_proto_that_allow_nothing_are_refused_at_their_line(
    tmp_path: Path, line: str, what: str
) -> None:
    # was (all but bogus): no restriction at all (an empty list, or the negation of every
    # name, read as "NCCL's choice"), exit 0; or an error without file:line:col
    refused(tmp_path, with_header(line), ":12:3: error:", what, "hint: NCCL_")


def test_a_restriction_the_model_cannot_serve_is_refused_at_the_row(tmp_path: Path) -> None:
    # was: "error: all_reduce_perf.log:28: the model has no pat ..." with no column,
    # source line or hint
    refused(
        tmp_path,
        with_header("# NCCL_ALGO=PAT"),
        "all_reduce_perf.log:28:10: error: the model has no pat for allreduce",
        "hint: the log's NCCL_ALGO=PAT allows only that",
    )


def test_an_nccl_release_the_model_does_not_tabulate_is_said(tmp_path: Path) -> None:
    # was: silently fitted with the base's NCCL 2.29.2 constants, nothing said
    text = SHIPPED_LOG.replace("nccl-library=22902", "nccl-library=21003")
    rc, _, err, out = calibrate(tmp_path, text)
    assert rc == 0, err
    assert "warning: the logs ran NCCL 2.10.3, whose tuning constants" in err
    assert "# note: the logs ran NCCL 2.10.3" in out.read_text()


def test_a_version_code_no_nccl_has_is_not_written(tmp_path: Path) -> None:
    # was: version = "9999999999999999.99.99" written into the profile
    text = SHIPPED_LOG.replace("nccl-library=22902", "nccl-library=99999999999999999999")
    rc, _, err, out = calibrate(tmp_path, text)
    assert rc == 0, err
    assert "9999" not in out.read_text()


# ---------------------------------------------------------------------------------------
# The command line


def test_the_same_log_twice_is_refused(tmp_path: Path) -> None:
    # was: fitted with every size counted twice, exit 0
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(SHIPPED_LOG, encoding="utf-8")
    out = tmp_path / "out.toml"
    rc, _, err = run("calibrate", str(log), str(tmp_path / "." / log.name), "-o", str(out))
    assert_diagnostic(rc, err, 2, "the same log is given twice", "hint: give each")
    assert not out.exists()


def test_a_misspelt_base_is_named_with_the_close_one(tmp_path: Path) -> None:
    # was: "not a shipped profile" without the close name
    rc, _, err = run(
        "calibrate", str(ALL_REDUCE), "--base", "h100dgx", "-o", str(tmp_path / "x.toml")
    )
    assert_diagnostic(
        rc, err, 2, "--base h100dgx: not a shipped profile (did you mean 'h100-dgx'?)"
    )


@pytest.mark.parametrize("name", ["a\nb = 1", "red\x1b[31m", " "])
def test_a_name_that_is_not_one_line_of_text_is_refused(tmp_path: Path, name: str) -> None:
    # was ("a\nb = 1"): a profile written that does not load ("not valid TOML"), exit 0
    out = tmp_path / "x.toml"
    rc, _, err = run("calibrate", str(ALL_REDUCE), "--name", name, "-o", str(out))
    assert_diagnostic(rc, err, 2, "--name", "hint:")
    assert not out.exists()


def test_a_name_with_quotes_is_escaped(tmp_path: Path) -> None:
    out = tmp_path / "x.toml"
    rc, _, err = run("calibrate", str(ALL_REDUCE), "--name", 'lab "7" \\ x', "-o", str(out))
    assert rc == 0, err
    rc, stdout, err = run("model-table", "--hw", str(out))
    assert rc == 0, err
    assert 'lab "7" \\ x' in stdout


def test_local_writes_a_name_with_quotes_that_loads(tmp_path: Path) -> None:
    # was: --local's writer put the name between quotes as it was (a profile that does not
    # load); the fit is not needed to show it: the writer of the fitted profile is
    from cocoviz.sim.calibrate import Calibration
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.local_profile import local_profile_toml, starting_profile

    hw = starting_profile(2, name='lab "7" \\ x')
    out = tmp_path / "x.toml"
    out.write_text(local_profile_toml(Calibration(hw, hw, (), (), (), ()), 2, []))
    assert load_profile(out).name == 'lab "7" \\ x'


def test_a_log_whose_file_name_holds_a_newline_gives_a_profile_that_loads(tmp_path: Path) -> None:
    # was: the name went into the file's header comment and description as it was: a
    # profile written that does not load ("not valid TOML"), exit 0
    rc, stdout, err, out = calibrate(tmp_path, SHIPPED_LOG, name="a\nb = 1\x1b[31m.log")
    assert rc == 0, err
    assert "\x1b" not in stdout
    rc, _, err = run("model-table", "--hw", str(out))
    assert rc == 0, err


def test_a_failed_calibration_leaves_an_existing_profile_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out.toml"
    assert run("calibrate", str(ALL_REDUCE), "-o", str(out))[0] == 0
    before = out.read_bytes()
    bad = tmp_path / "bad.log"
    for text in (edit_row(4096, 5, "nan"), edit_row(4096, 0, "1" * 400), b"\xff\xfe garbage"):
        if isinstance(text, bytes):
            bad.write_bytes(text)
        else:
            bad.write_text(text, encoding="utf-8")
        rc, _, err = run("calibrate", str(bad), "-o", str(out))
        assert_diagnostic(rc, err, 1)
        assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.log", "out.toml"]


# ---------------------------------------------------------------------------------------
# --hw PROFILE.toml: one range for every number, where the file is read


@pytest.mark.parametrize(
    ("table", "field", "value", "command"),
    [
        ("nccl", "net_latency_us", "1e308", ("simulate", "sgd")),
        ("nccl.measured", "hop_latency_scale", "1e308", ("simulate", "sgd")),
        ("gpu", "hbm_gbps", "5e-324", ("model-table",)),
        ("nccl.measured", "channel_gbps", "5e-324", ("model-table",)),
        ("gpu.efficiency", "hbm_floor", "5e-324", ("model-table",)),
        ("overlap", "hbm_bytes_per_copy_byte", "1e-320", ("model-table",)),
        ("gpu.matmul_tflops", "bf16", "5e-324", ("simulate", "moe_layer")),
    ],
)
def test_a_number_out_of_range_is_refused_at_its_line(
    tmp_path: Path, table: str, field: str, value: str, command: tuple[str, ...]
) -> None:
    # was: internal error (OverflowError: cannot convert float infinity to integer, or
    # ZeroDivisionError), exit 70
    path = profile(tmp_path, f'base = "h100-dgx"\n[{table}]\n{field} = {value}\n')
    rc, _, err = run(*command, "--hw", path)
    assert_diagnostic(
        rc,
        err,
        1,
        f"field '{table}.{field}': out of range: a profile's numbers are 0 or between 1e-09 and 1e+15",
        f"mine.toml:3:1: note: '{table}.{field}' is set here",
        f"3 | {field} = {value}",
        "hint:",
    )


@pytest.mark.parametrize(
    ("table", "field"),
    [("node", "gpus_per_node"), ("nccl", "channels"), ("gpu", "sms"), ("node", "nics_per_node")],
)
def test_an_integer_out_of_range_is_refused(tmp_path: Path, table: str, field: str) -> None:
    # was: accepted (gpus_per_node = 10^18 ran), exit 0
    path = profile(tmp_path, f'base = "h100-dgx"\n[{table}]\n{field} = 1000000000000000000\n')
    rc, _, err = run("model-table", "--hw", path)
    assert_diagnostic(rc, err, 1, f"field '{table}.{field}': must be at most 1,048,576", "note:")


def test_an_integer_too_long_for_python_is_refused(tmp_path: Path) -> None:
    # was: internal error (ValueError: Exceeds the limit (4300 digits)), exit 70
    path = profile(tmp_path, 'base = "h100-dgx"\n[gpu]\nsms = ' + "9" * 5000 + "\n")
    rc, _, err = run("model-table", "--hw", path)
    assert_diagnostic(rc, err, 1, "mine.toml: not valid TOML", "4300 digits")


@pytest.mark.parametrize("name", ['"a\\nb"', '"red\\u001b[31m"'])
def test_a_string_with_control_characters_is_refused(tmp_path: Path, name: str) -> None:
    # was: accepted, and printed as it is in model-table's and simulate's headers
    path = profile(tmp_path, f'base = "h100-dgx"\nname = {name}\n')
    rc, _, err = run("model-table", "--hw", path)
    assert_diagnostic(rc, err, 1, "field 'name': must not hold control characters", ":2:1: note:")


@pytest.mark.parametrize(
    "version", ["2.²9.2", "٢.٢٩.٢", "2." + "9" * 5000 + ".0", "-2.29.2", "2.29.2.1", ""]
)
def test_an_nccl_version_that_does_not_parse_is_refused(tmp_path: Path, version: str) -> None:
    # was: "invalid literal for int() with base 10: '²9'", "Exceeds the limit (4300
    # digits) ...", or Arabic-Indic digits read as 2.29.2
    path = profile(tmp_path, f'base = "h100-dgx"\n[nccl]\nversion = "{version}"\n')
    rc, _, err = run("model-table", "--hw", path)
    assert_diagnostic(
        rc, err, 1, "field 'nccl.version': expected an NCCL version like \"2.29.2\"", ":3:1: note:"
    )
    assert "int()" not in err and "4300" not in err


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    # was: "not valid TOML: Invalid statement (at line 1, column 1)"
    path = profile(tmp_path, b'\xef\xbb\xbfbase = "h100-dgx"\nname = "bom"\n')
    rc, stdout, err = run("model-table", "--hw", path)
    assert rc == 0, err
    assert "on bom" in stdout


def test_a_toml_syntax_error_points_at_its_line(tmp_path: Path) -> None:
    path = profile(tmp_path, 'base = "h100-dgx"\n[gpu\nsms = 1\n')
    rc, _, err = run("simulate", "sgd", "--hw", path)
    assert_diagnostic(
        rc, err, 1, "mine.toml: not valid TOML", "mine.toml:2:5: note: here", "2 | [gpu", "hint:"
    )


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ('base = "h100-dgx"\n[gpu]\nsms = "many"\n', "mine.toml:3:1: note: 'gpu.sms' is set here"),
        (
            'base = "h100-dgx"\n[gpu.efficiency]\nhbm = [[1e8, 0.9], [1e6, 0.6]]\n',
            "mine.toml:3:1: note: 'gpu.efficiency.hbm' is set here",
        ),
        (
            'base = "h100-dgx"\n[nccl.measured.upto."2.20"]\nchannel_gbps = -1.0\n',
            "note: 'nccl.measured.upto.\"2.20\".channel_gbps' is set here",
        ),
        ('base = "h100-dgx"\n[gpu]\nsmss = 3\n', "mine.toml:3:1: note: 'gpu.smss' is set here"),
        ('base = "h100-dgx"\n[gpux]\n', "mine.toml:2:1: note: 'gpux' is set here"),
        (
            "name = 'x'\ndescription = 'y'\n[gpu]\narch = 'hopper'\n",
            "note: the table 'gpu' is here",
        ),
    ],
)
def test_a_field_error_points_at_the_line_that_sets_the_field(
    tmp_path: Path, text: str, note: str
) -> None:
    path = profile(tmp_path, text)
    rc, _, err = run("model-table", "--hw", path)
    assert_diagnostic(rc, err, 1, note, "hint:")
    assert err.startswith(f"error: {path}: field '")  # the message itself is as it was


def test_a_device_as_profile_or_log_is_refused(tmp_path: Path) -> None:
    rc, _, err = run("model-table", "--hw", "/dev/null")
    assert rc == 1 and "Traceback" not in err and "internal error" not in err, err
    rc, _, err = run("calibrate", "/dev/null", "-o", str(tmp_path / "x.toml"))
    assert_diagnostic(rc, err, 1, "/dev/null: not a regular file (a device)")


@pytest.mark.parametrize("text", ["", "\n# nothing here\n"])
def test_an_empty_profile_says_so(tmp_path: Path, text: str) -> None:
    # was: "field 'name': missing", as if one field were left out
    rc, _, err = run("simulate", "sgd", "--hw", profile(tmp_path, text))
    assert_diagnostic(rc, err, 1, "mine.toml: the file holds no field", "hint: a profile may start")


def test_a_release_other_than_the_base_s_writes_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # was: the base at the logs' release was loaded from a TOML file written to a
    # temporary directory (a file other than -o)
    import tempfile

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("calibrate wrote a temporary file")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    logs = [str(p) for p in sorted((DATA / "a100-nccl2.27.3").glob("*.log"))]
    out = tmp_path / "out.toml"
    rc, _, err = run("calibrate", *logs, "--base", "h100-dgx", "-o", str(out))
    assert rc == 0, err
    assert 'version = "2.27.3"' in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.toml"]


def test_a_fitted_term_too_small_to_load_is_written_as_zero() -> None:
    # a linear term (a fill, a latency, calibrate --local's kernel gap) the fit drove to
    # 1e-12 would be written as 1e-12, which the loader refuses (numbers start at 1e-9)
    from cocoviz.sim.calibrate import Knob
    from cocoviz.sim.hardware import MIN_NUMBER

    fill = Knob("nccl.measured.ring_fill_mib", 0.0, 8192.0, log=False, scale=50.0)
    assert fill.from_x(1e-14) == 0.0
    assert fill.from_x(MIN_NUMBER / 50.0 * 2) == pytest.approx(2 * MIN_NUMBER)
    rate = Knob("nccl.measured.channel_gbps", 0.5, 2000.0)
    assert rate.from_x(-50.0) == 0.5
