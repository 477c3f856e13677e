"""The emulation runtime's build cache (cocoviz/emulation/build-runtime.sh; docs/codegen.md,
"Emulation"): `make emulate` gets libcocoviz_emu.a from a cache entry named by a hash of
the sources, the compiler and the flags, built once and copied after.

Most cases run the script of the package on a tiny copy of the emulation folder (one
source, one header) so that a build takes a fraction of a second: a second build is a copy;
a changed source, header or flag is a new entry; a corrupt entry is rebuilt; concurrent
builds of one entry build it once and agree; COCOVIZ_EMU_CACHE=off builds without a cache;
XDG_CACHE_HOME places it. The last case builds two emitted trees' runtime through their
Makefiles: the second is a cache hit."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from emit_support import emit_files, need_mpicxx, write

from cocoviz.emit.toolchain import EMULATION_HOME

pytestmark = pytest.mark.build

SCRIPT = EMULATION_HOME / "build-runtime.sh"
CXX = shutil.which("c++") or shutil.which("g++") or "c++"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A minimal emulation folder with the package's script."""
    h = tmp_path / "emulation"
    (h / "src").mkdir(parents=True)
    (h / "include" / "cocoviz_emu").mkdir(parents=True)
    shutil.copy(SCRIPT, h / "build-runtime.sh")
    (h / "include" / "cocoviz_emu" / "core.h").write_text(
        "inline int twice(int x) { return 2 * x; }\n"
    )
    (h / "src" / "core.cpp").write_text(
        '#include "cocoviz_emu/core.h"\nint four() { return twice(2); }\n'
    )
    return h


def build(
    home: Path, out: Path, cache: Path | None, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("COCOVIZ_EMU_CACHE", None)
    if cache is not None:
        e["COCOVIZ_EMU_CACHE"] = str(cache)
    e.update(env or {})
    return subprocess.run(
        ["bash", str(home / "build-runtime.sh"), str(out), CXX, "-O0", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=e,
    )


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir())


def members(lib: Path) -> list[str]:
    return subprocess.run(
        ["ar", "t", str(lib)], capture_output=True, text=True, check=True
    ).stdout.split()


def test_the_second_build_is_a_copy_of_the_first(home: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a, b = tmp_path / "a" / "emu" / "libcocoviz_emu.a", tmp_path / "b" / "emu" / "libcocoviz_emu.a"
    first = build(home, a, cache)
    assert first.returncode == 0, first.stderr
    assert "building" in first.stderr and "cached" not in first.stderr
    second = build(home, b, cache)
    assert second.returncode == 0, second.stderr
    assert "cached" in second.stderr and "building" not in second.stderr, second.stderr
    assert a.read_bytes() == b.read_bytes()
    assert members(b) == ["core.cpp.o"]
    [entry] = entries(cache)
    assert (entry / "key.txt").read_text().count("file ") == 2  # the source and the header
    assert not list(cache.glob(".build-*"))


@pytest.mark.parametrize("change", ["source", "header", "flags"])
def test_what_makes_the_library_makes_the_key(home: Path, tmp_path: Path, change: str) -> None:
    cache = tmp_path / "cache"
    out = tmp_path / "t" / "libcocoviz_emu.a"
    assert build(home, out, cache).returncode == 0
    flags: tuple[str, ...] = ()
    if change == "source":
        (home / "src" / "core.cpp").write_text(
            '#include "cocoviz_emu/core.h"\nint four() { return 4; }\n'
        )
    elif change == "header":
        (home / "include" / "cocoviz_emu" / "core.h").write_text(
            "inline int twice(int x) { return x + x; }\n"
        )
    else:
        flags = ("-DSOMETHING=1",)
    res = build(home, out, cache, *flags)
    assert res.returncode == 0, res.stderr
    assert "building" in res.stderr, res.stderr
    assert len(entries(cache)) == 2


def test_a_corrupt_entry_is_built_again(home: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    out = tmp_path / "t" / "libcocoviz_emu.a"
    assert build(home, out, cache).returncode == 0
    good = out.read_bytes()
    [entry] = entries(cache)
    lib = entry / "libcocoviz_emu.a"
    lib.write_bytes(lib.read_bytes()[: len(good) // 2])  # a truncated copy
    out.unlink()
    res = build(home, out, cache)
    assert res.returncode == 0, res.stderr
    assert "corrupt or incomplete" in res.stderr and "building" in res.stderr, res.stderr
    assert out.read_bytes() == good and lib.read_bytes() == good
    # an entry missing its checksum (a build that died before the rename cannot leave one,
    # but a hand-made or damaged folder can) is not trusted either
    (entry / "libcocoviz_emu.a.sha256").unlink()
    res = build(home, out, cache)
    assert "corrupt or incomplete" in res.stderr, res.stderr
    assert out.read_bytes() == good


def test_concurrent_builds_build_once_and_agree(home: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    outs = [tmp_path / f"t{i}" / "libcocoviz_emu.a" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda o: build(home, o, cache), outs))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    built = [r for r in results if "building" in r.stderr]
    assert len(built) == 1 or not shutil.which("flock"), [r.stderr for r in results]
    assert len({o.read_bytes() for o in outs}) == 1
    assert len(entries(cache)) == 1 and not list(cache.glob(".build-*"))


def test_off_builds_without_a_cache(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "t" / "libcocoviz_emu.a"
    xdg = tmp_path / "xdg"
    res = build(home, out, None, env={"COCOVIZ_EMU_CACHE": "off", "XDG_CACHE_HOME": str(xdg)})
    assert res.returncode == 0, res.stderr
    assert "without a cache" in res.stderr
    assert members(out) == ["core.cpp.o"]
    assert not xdg.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["libcocoviz_emu.a"]


def test_the_cache_lives_under_xdg_cache_home(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "t" / "libcocoviz_emu.a"
    xdg = tmp_path / "xdg"
    res = build(home, out, None, env={"XDG_CACHE_HOME": str(xdg)})
    assert res.returncode == 0, res.stderr
    assert len(entries(xdg / "cocoviz" / "emulation")) == 1


def test_emitted_trees_share_the_runtime_through_their_makefiles(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    need_mpicxx()
    # one cache per test session (the first tree of a session builds the real runtime)
    cache = tmp_path_factory.getbasetemp() / "runtime-cache"
    env = dict(os.environ, COCOVIZ_EMU_CACHE=str(cache))
    trees = []
    for i, (name, schedule) in enumerate([("sgd", "fused"), ("adam", "ar_c")]):
        d = tmp_path / f"tree{i}"
        write(d, emit_files(name, schedule, "cuda", ranks="2"))
        trees.append(d)
    results = []
    for d in trees:
        res = subprocess.run(
            ["make", "-C", str(d), "emu/libcocoviz_emu.a"],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
            env=env,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        results.append(res)
    assert "emulation runtime: cached" in results[1].stderr, results[1].stderr
    libs = [(d / "emu" / "libcocoviz_emu.a").read_bytes() for d in trees]
    assert libs[0] == libs[1]
