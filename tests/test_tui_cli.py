"""`cocoviz tui` and bare `cocoviz` from the command line (without a terminal)."""

from __future__ import annotations

import subprocess
import sys

from cocoviz.cli import main


def test_tui_without_a_terminal_is_a_usage_error(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert main(["tui", "megatron_mlp"]) == 2
    err = capsys.readouterr().err
    assert "needs a terminal" in err and "cocoviz show" in err


def test_tui_is_listed_in_help(capsys) -> None:  # type: ignore[no-untyped-def]
    try:
        main(["tui", "--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert "--teach" in out and "--schedule" in out


def test_cli_tui_module_does_not_import_textual() -> None:
    code = (
        "import sys, cocoviz.cli, cocoviz.cli.tui\n"
        "cocoviz.cli.build_parser()\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'textual')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_create_app_reports_a_missing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from cocoviz.errors import CocovizError
    from cocoviz.tui.app import create_app

    with pytest.raises(CocovizError, match="no such file"):
        create_app(tmp_path / "nope.coco", state_root=tmp_path)
