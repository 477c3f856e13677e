"""A compiler cache for the tests' builds of emitted trees, in the manner of ccache's direct
mode and kept in the session's temporary directory: make runs the compiler through it
(`make NVCC="<python> compile_cache.py CACHE -- $(CUDA_HOME)/bin/nvcc"`: `cached_compiler`
writes that value). A compile (`-c SOURCE -o OBJECT`) whose compiler, arguments (all but
the object's name) and sources equal those of a compile done before in this session gets a
copy of that object, and its output (warnings included) is replayed, so that a test that
asserts a warning-free build sees what the compiler said; a link, a compile that failed,
anything else runs the compiler as given.

The sources of a compile: the source file, every header in its directory (an emitted
tree's own: <program>.h, cocoviz_runtime.h, cocoviz_runtime.cuh) and every file under its
-I directories (the emulation's headers), with each line that is only a `//` comment
blanked (an emitted file's header comment names the --collectives mode, the only difference
between most of the two modes' program sources; the lines keep their numbers, so __LINE__
does too). The -isystem directories (NCCL, cuBLAS and MPI from the wheels) and the
compiler's own headers are not read: they do not change during a session, and the cache is
the session's (tests/emit_support.py, `session_cache`).

The wrapper runs as its own script (no import of the tests or of cocoviz)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HEADERS = (".h", ".cuh", ".hpp")
SOURCES = (".cu", ".cpp", ".cc", ".c")


def cached_compiler(compiler: str, cache: Path) -> str:
    """The value of a make variable (NVCC, EMU_CXX) that runs `compiler` (a make expression:
    `$(CUDA_HOME)/bin/nvcc`, `$(MPICXX)`) through the cache in `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    return f"{sys.executable} {Path(__file__).resolve()} {cache} -- {compiler}"


def normalized(data: bytes) -> bytes:
    """The text with each line that is only a `//` comment blanked (but a line continued
    from the one before, or continued onto the next, and files with raw strings, as they
    are)."""
    if b'R"' in data:
        return data
    lines = data.split(b"\n")
    out = []
    continued = False
    for ln in lines:
        body = ln.rstrip()
        comment = ln.lstrip().startswith(b"//") and not body.endswith(b"\\") and not continued
        out.append(b"" if comment else ln)
        continued = body.endswith(b"\\")
    return b"\n".join(out)


def compile_key(compiler: list[str], args: list[str]) -> tuple[str, str] | None:
    """(key, object path) of a compile of one source file, or None (a link, anything else)."""
    if "-c" not in args or args.count("-o") != 1 or args.index("-o") == len(args) - 1:
        return None
    at = args.index("-o")
    obj, rest = args[at + 1], args[:at] + args[at + 2 :]
    sources = [a for a in rest if a.endswith(SOURCES) and os.path.isfile(a)]
    if len(sources) != 1:
        return None
    h = hashlib.sha256()
    exe = shutil.which(compiler[0]) or compiler[0]
    for part in [os.path.realpath(exe), *compiler[1:], "\0", *rest]:
        h.update(part.encode() + b"\0")
    files = [Path(sources[0])]
    here = Path(sources[0]).parent
    files += sorted(p for p in here.iterdir() if p.suffix in HEADERS and p.is_file())
    dirs = [a[2:] or rest[i + 1] for i, a in enumerate(rest) if a.startswith("-I")]
    for d in dirs:
        files += sorted(p for p in Path(d).rglob("*") if p.is_file())
    for f in files:
        h.update(str(f).encode() + b"\0" + normalized(f.read_bytes()) + b"\0")
    return h.hexdigest()[:24], obj


def run(cache: Path, compiler: list[str], args: list[str]) -> int:
    found = compile_key(compiler, args)
    if found is None:
        return subprocess.run([*compiler, *args], check=False).returncode
    key, obj = found
    entry = cache / key
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (entry / "object").exists():
            res = subprocess.run([*compiler, *args], capture_output=True, check=False)
            sys.stdout.buffer.write(res.stdout)
            sys.stderr.buffer.write(res.stderr)
            if res.returncode != 0 or not os.path.isfile(obj):
                return res.returncode
            tmp = cache / f"{key}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            shutil.copyfile(obj, tmp / "object")
            (tmp / "stdout").write_bytes(res.stdout)
            (tmp / "stderr").write_bytes(res.stderr)
            tmp.rename(entry)
            return 0
    sys.stdout.buffer.write((entry / "stdout").read_bytes())
    sys.stderr.buffer.write((entry / "stderr").read_bytes())
    shutil.copyfile(entry / "object", obj + ".cached")
    os.replace(obj + ".cached", obj)
    return 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    split = argv.index("--")
    compiler = argv[split + 1 :]
    # the compiler is the first word after `--` (a make variable may carry flags with it)
    sys.exit(run(Path(argv[0]), compiler[:1], compiler[1:]))
