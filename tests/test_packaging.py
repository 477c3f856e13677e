"""The built wheel carries every data file the package reads at run time."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_package_data(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("cocoviz-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "cocoviz").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert data, "no data files found"
    missing = sorted(set(data) - names)
    assert not missing, f"not in the wheel: {missing}"
