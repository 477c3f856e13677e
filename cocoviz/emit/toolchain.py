"""Locating the toolchain that builds emitted code: nvcc, NCCL, cuBLAS and MPI.

`find_toolchain()` looks, in order, at

- CUDA: ``$CUDA_HOME``, ``/usr/local/cuda``, then ``nvcc`` on ``PATH`` (its home is read
  from ``nvcc -dryrun``'s ``TOP=``, since ``nvcc`` may be a wrapper script);
- NCCL: ``$NCCL_HOME``, the pip wheel ``nvidia-nccl-cu13`` (``nvidia/nccl/{include,lib}``,
  found through ``importlib.util.find_spec("nvidia")`` without importing anything), the
  CUDA home, then ``/usr``;
- cuBLAS: ``$CUBLAS_HOME``, the pip wheel ``nvidia-cublas`` (``nvidia/cu13`` for CUDA 13,
  ``nvidia/cublas`` for older wheels), then the CUDA home;
- MPI: ``$MPI_HOME`` (its ``bin/mpicxx``), ``mpicxx`` next to ``sys.executable`` (the
  ``mpich`` wheel puts it in the venv's ``bin``), then ``PATH``; include and library
  directories come from ``mpicxx -show`` (MPICH) or ``mpicxx --showme`` (Open MPI).

A ``*_HOME`` variable that is set wins: if it lacks the component, the component is
reported missing (with a note in `Toolchain.notes`) rather than silently found elsewhere.

Flags proven by ``tests/test_toolchain.py`` (CUDA 13.0, NCCL 2.32 wheel, cuBLAS 13 wheel,
MPICH 5 wheel; ``-Wall`` warning-free for sm_80 and sm_90)::

    nvcc -std=c++17 -arch=sm_90 -Xcompiler -Wall \\
         -isystem $NCCL/include -isystem $CUBLAS/include -isystem $MPI/include \\
         prog.cu -o prog \\
         -L$NCCL/lib -L$CUBLAS/lib -L$MPI/lib \\
         -l:libnccl.so.2 -l:libcublas.so.13 -l:libcublasLt.so.13 -lmpi \\
         -Xlinker -rpath,$NCCL/lib:$CUBLAS/lib:$MPI/lib

- The wheels ship only versioned sonames (``libnccl.so.2``, ``libcublas.so.13``), no
  unversioned ``.so`` link, so ``-lnccl`` fails; ``-l:FILE`` names the file itself. When a
  plain ``libX.so`` exists (a system install) ``-lX`` is used instead.
- The wheel directories are not on the loader path, so the binary carries them as an
  rpath (``-Xlinker -rpath,DIR:DIR``; nvcc has no ``-Wl,``).
- ``-isystem`` keeps third-party headers out of ``-Wall``. ``nccl_device.h`` is header-only
  for ``ncclLsaBarrierSession`` / ``ncclGetLsaPointer``: no device library or ``-rdc``.
- cudart is linked statically by nvcc's default; nothing else is needed.

The CPU target::

    mpicxx -std=c++17 -O2 -fno-math-errno -ffp-contract=off -Wall -fopenmp prog.cpp -o prog
    mpiexec -n 4 ./prog                                       # the wheel's mpiexec

``mpicxx`` already adds ``-I``, ``-L``, ``-lmpi`` and an rpath to the venv's ``lib``.

`Toolchain.make_variables` gives these as Makefile variables meant for ``NAME ?= value``
lines, so a user can override ``CUDA_HOME``, ``NCCL_HOME``, ``CUBLAS_HOME``, ``MPI_HOME``
or ``ARCH`` when running ``make`` on another machine.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cocoviz.errors import BuildError

__all__ = [
    "CudaToolkit",
    "Library",
    "MpiInstall",
    "Toolchain",
    "arch_number",
    "find_toolchain",
    "link_arg",
]

Target = Literal["cuda", "cpu"]

EMULATION_HOME = Path(__file__).resolve().parent.parent / "emulation"
"""The CPU emulation of the CUDA runtime, cuBLAS and NCCL (``make emulate``): headers in
``include/``, sources of the library in ``src/`` (docs/codegen.md, "Emulation")."""

_ARCH_RE = re.compile(r"^sm_(\d+)[a-z]?$")
# The oldest architecture each CUDA major version can build, for when no nvcc is at hand.
_MIN_ARCH_BY_CUDA_MAJOR = {11: 35, 12: 50, 13: 75}
_SYSTEM_LIB_DIRS = frozenset(
    [
        "/lib",
        "/lib64",
        "/usr/lib",
        "/usr/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
    ]
)


def arch_number(arch: str) -> int:
    """``sm_90`` → 90; raises ValueError for anything else."""
    m = _ARCH_RE.match(arch)
    if m is None:
        raise ValueError(f"not a CUDA architecture: {arch!r} (expected e.g. sm_80, sm_90)")
    return int(m.group(1))


def link_arg(lib_dir: Path, base: str) -> str | None:
    """The linker argument for library `base` in `lib_dir`, or None if it is absent.

    ``-lBASE`` when ``libBASE.so`` exists; otherwise ``-l:libBASE.so.N`` with the highest
    major version N (pip wheels ship only the soname).
    """
    if (lib_dir / f"lib{base}.so").exists():
        return f"-l{base}"
    soname = re.compile(rf"^lib{re.escape(base)}\.so\.(\d+)$")
    majors = sorted(
        (int(m.group(1)), p.name)
        for p in lib_dir.glob(f"lib{base}.so.*")
        if (m := soname.match(p.name)) is not None
    )
    if majors:
        return f"-l:{majors[-1][1]}"
    longer = sorted(p.name for p in lib_dir.glob(f"lib{base}.so.*"))
    return f"-l:{longer[0]}" if longer else None


def _run(cmd: Sequence[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _rpath(dirs: Sequence[Path]) -> list[str]:
    out: list[str] = []
    for d in dirs:
        s = str(d)
        if s not in _SYSTEM_LIB_DIRS and s not in out:
            out.append(s)
    return out


# --------------------------------------------------------------------------- parts


@dataclass(frozen=True)
class CudaToolkit:
    """The CUDA toolkit: its home, nvcc, version and the GPU codes nvcc can emit."""

    home: Path
    nvcc: Path
    version: tuple[int, int]
    gpu_codes: tuple[str, ...]
    """``sm_XX`` values from ``nvcc --list-gpu-code`` (empty if nvcc would not say)."""

    def supports(self, arch: str) -> bool:
        """Whether this nvcc can build `arch` (``sm_90``)."""
        n = arch_number(arch)
        if self.gpu_codes:
            return any(arch_number(c) == n for c in self.gpu_codes if _ARCH_RE.match(c))
        return n >= _MIN_ARCH_BY_CUDA_MAJOR.get(self.version[0], 0)

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


@dataclass(frozen=True)
class Library:
    """A third-party library (NCCL, cuBLAS): where its headers and shared objects are."""

    name: str
    home: Path
    include_dir: Path
    lib_dir: Path
    link_args: tuple[str, ...]
    """``-l`` arguments, e.g. ``("-l:libnccl.so.2",)``."""
    source: str
    """How it was found, for messages: ``NCCL_HOME``, ``pip wheel``, ``system``."""
    version: tuple[int, ...] = ()


@dataclass(frozen=True)
class MpiInstall:
    """An MPI installation: compiler wrapper, launcher and what nvcc needs to use it."""

    home: Path | None
    mpicxx: Path
    mpiexec: Path | None
    include_dirs: tuple[Path, ...]
    lib_dirs: tuple[Path, ...]
    link_args: tuple[str, ...]
    """``-l`` arguments (``-lmpi``; Open MPI adds more)."""
    other_args: tuple[str, ...]
    """Other flags the wrapper adds (``-pthread``), passed to nvcc via ``-Xcompiler``."""
    source: str


# ---------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Toolchain:
    """What `find_toolchain` found; None where a component is missing."""

    cuda: CudaToolkit | None
    nccl: Library | None
    cublas: Library | None
    mpi: MpiInstall | None
    cxx: Path | None
    """Host C++ compiler (``$CXX``, else g++ or c++ on PATH)."""
    notes: tuple[str, ...] = field(default=())
    """Why a component was not found (or was rejected), for diagnostics."""

    @property
    def nccl_device_api(self) -> bool:
        """Whether NCCL has the device API (``nccl_device.h``, NCCL ≥ 2.28)."""
        return (
            self.nccl is not None
            and self.nccl.version >= (2, 28)
            and (self.nccl.include_dir / "nccl_device.h").exists()
        )

    def missing(self, target: Target) -> tuple[str, ...]:
        """Components `target` needs that were not found, each with how to supply it."""
        out: list[str] = []
        if self.mpi is None:
            out.append("MPI (mpicxx): set MPI_HOME, put mpicxx on PATH, or `pip install mpich`")
        if target == "cpu":
            return tuple(out)
        if self.cuda is None:
            out.append("the CUDA toolkit (nvcc): set CUDA_HOME or put nvcc on PATH")
        if self.nccl is None:
            out.append("NCCL: set NCCL_HOME or `pip install nvidia-nccl-cu13`")
        if self.cublas is None:
            out.append("cuBLAS: set CUBLAS_HOME or `pip install nvidia-cublas`")
        return tuple(out)

    def require(self, target: Target, arch: str | None = None) -> None:
        """Raise `BuildError` unless everything `target` (and `arch`) needs is here."""
        missing = self.missing(target)
        if missing:
            raise BuildError(
                f"cannot build the {target} target: missing " + "; ".join(missing),
                hint="the emitted Makefile reads the same variables (CUDA_HOME, NCCL_HOME, "
                "CUBLAS_HOME, MPI_HOME)",
            )
        if target == "cuda" and arch is not None:
            self.check_arch(arch)

    def check_arch(self, arch: str) -> None:
        """Raise `BuildError` if the CUDA toolkit cannot build `arch`."""
        try:
            arch_number(arch)
        except ValueError as e:
            raise BuildError(str(e)) from None
        if self.cuda is not None and not self.cuda.supports(arch):
            codes = " ".join(self.cuda.gpu_codes) or "newer architectures"
            raise BuildError(
                f"CUDA {self.cuda.version_text} cannot build {arch} (nvcc supports {codes})",
                hint="choose a supported --arch; hardware profiles of older GPUs remain "
                "model-only targets",
            )

    # ---------------------------------------------------------------- CUDA flags

    def _cuda_parts(self) -> tuple[CudaToolkit, Library, Library, MpiInstall]:
        self.require("cuda")
        assert self.cuda and self.nccl and self.cublas and self.mpi
        return self.cuda, self.nccl, self.cublas, self.mpi

    def nvcc_compile_args(self, arch: str, *, opt: str = "-O3") -> list[str]:
        """nvcc flags for compiling emitted ``.cu`` files: C++17, `arch`, -Wall, -isystem."""
        self.check_arch(arch)
        _, nccl, cublas, mpi = self._cuda_parts()
        args = ["-std=c++17", opt, f"-arch={arch}", "-Xcompiler", "-Wall"]
        for inc in (nccl.include_dir, cublas.include_dir, *mpi.include_dirs):
            args += ["-isystem", str(inc)]
        for other in mpi.other_args:
            args += ["-Xcompiler", other]
        return args

    def nvcc_link_args(self) -> list[str]:
        """nvcc flags for linking against NCCL, cuBLAS and MPI, with an rpath to each."""
        _, nccl, cublas, mpi = self._cuda_parts()
        dirs = [nccl.lib_dir, cublas.lib_dir, *mpi.lib_dirs]
        args = [f"-L{d}" for d in dict.fromkeys(dirs)]
        args += [*nccl.link_args, *cublas.link_args, *mpi.link_args]
        rpath = _rpath(dirs)
        if rpath:
            args += ["-Xlinker", "-rpath," + ":".join(rpath)]
        return args

    def nvcc_command(
        self, sources: Sequence[str | Path], output: str | Path, arch: str
    ) -> list[str]:
        """A full nvcc compile-and-link command line."""
        cuda = self._cuda_parts()[0]
        return [
            str(cuda.nvcc),
            *self.nvcc_compile_args(arch),
            *(str(s) for s in sources),
            "-o",
            str(output),
            *self.nvcc_link_args(),
        ]

    # ----------------------------------------------------------------- CPU flags

    def cpu_compile_args(self, *, opt: str = "-O2") -> list[str]:
        """mpicxx flags for the CPU target: C++17, -Wall, OpenMP. ``-fno-math-errno``: the
        emitted code never reads errno, and without it ``std::sqrt`` is a call that may set
        it, which keeps every loop that takes a square root from vectorizing.
        ``-ffp-contract=off``: no fused multiply-adds, so every machine (and every clone of
        COCOVIZ_VECTOR_CLONES, cocoviz_runtime.h) rounds each operation as the reference
        does."""
        return ["-std=c++17", opt, "-fno-math-errno", "-ffp-contract=off", "-Wall", "-fopenmp"]

    def mpicxx_command(self, sources: Sequence[str | Path], output: str | Path) -> list[str]:
        """A full mpicxx compile-and-link command line for the CPU target."""
        self.require("cpu")
        assert self.mpi is not None
        return [
            str(self.mpi.mpicxx),
            *self.cpu_compile_args(),
            *(str(s) for s in sources),
            "-o",
            str(output),
        ]

    def mpiexec_command(self, nranks: int, program: Sequence[str | Path]) -> list[str]:
        """``mpiexec -n N PROGRAM...`` with the found launcher."""
        self.require("cpu")
        assert self.mpi is not None
        launcher = self.mpi.mpiexec or Path("mpiexec")
        return [str(launcher), "-n", str(nranks), *(str(p) for p in program)]

    # ------------------------------------------------------------------ Makefile

    def make_variables(self, arch: str = "sm_90") -> dict[str, str]:
        """Makefile variables, in order, for ``NAME ?= value`` lines.

        Composite variables refer to the ``*_HOME`` ones through ``$(...)``, so overriding
        a home on the ``make`` command line moves its include and library directories too.
        A missing component leaves its home empty.
        """
        v: dict[str, str] = {}
        v["CUDA_HOME"] = str(self.cuda.home) if self.cuda else "/usr/local/cuda"
        v["NVCC"] = "$(CUDA_HOME)/bin/nvcc"
        v["ARCH"] = arch
        for prefix, lib in (("NCCL", self.nccl), ("CUBLAS", self.cublas)):
            home = f"{prefix}_HOME"
            v[home] = str(lib.home) if lib else ""
            v[f"{prefix}_INC"] = _under(lib.include_dir, lib.home, home) if lib else ""
            v[f"{prefix}_LIBDIR"] = _under(lib.lib_dir, lib.home, home) if lib else ""
            default = "-lnccl" if prefix == "NCCL" else "-lcublas -lcublasLt"
            v[f"{prefix}_LDLIBS"] = " ".join(lib.link_args) if lib else default
        mpi = self.mpi
        mhome = mpi.home if mpi else None
        v["MPI_HOME"] = str(mhome) if mhome else ""
        incs = mpi.include_dirs if mpi else ()
        libs = mpi.lib_dirs if mpi else ()
        v["MPI_CPPFLAGS"] = " ".join(f"-isystem {_under(d, mhome, 'MPI_HOME')}" for d in incs)
        v["MPI_LIBDIRS"] = " ".join(_under(d, mhome, "MPI_HOME") for d in libs)
        v["MPI_LDLIBS"] = " ".join(mpi.link_args) if mpi else "-lmpi"
        v["MPICXX"] = _under(mpi.mpicxx, mhome, "MPI_HOME") if mpi else "mpicxx"
        mpiexec = mpi.mpiexec if mpi else None
        v["MPIEXEC"] = _under(mpiexec, mhome, "MPI_HOME") if mpiexec else "mpiexec"
        v["CUDA_CPPFLAGS"] = "-isystem $(NCCL_INC) -isystem $(CUBLAS_INC) $(MPI_CPPFLAGS)"
        extra = "".join(f" -Xcompiler {o}" for o in (mpi.other_args if mpi else ()))
        v["NVCCFLAGS"] = f"-std=c++17 -O3 -arch=$(ARCH) -Xcompiler -Wall{extra}"
        v["CUDA_LIBDIRS"] = "$(NCCL_LIBDIR) $(CUBLAS_LIBDIR) $(MPI_LIBDIRS)"
        v["CUDA_LDFLAGS"] = (
            "$(addprefix -L,$(CUDA_LIBDIRS)) $(foreach d,$(CUDA_LIBDIRS),-Xlinker -rpath,$(d))"
        )
        v["CUDA_LDLIBS"] = "$(NCCL_LDLIBS) $(CUBLAS_LDLIBS) $(MPI_LDLIBS)"
        v["CXXFLAGS"] = " ".join(self.cpu_compile_args())
        v["EMU_HOME"] = str(EMULATION_HOME)
        return v

    def describe(self) -> str:
        """A few lines saying what was found where (for ``--build`` diagnostics)."""
        lines = []
        if self.cuda:
            lines.append(f"CUDA {self.cuda.version_text}: {self.cuda.nvcc}")
        for lib in (self.nccl, self.cublas):
            if lib:
                ver = ".".join(map(str, lib.version)) or "?"
                lines.append(f"{lib.name} {ver} ({lib.source}): {lib.home}")
        if self.mpi:
            lines.append(f"MPI ({self.mpi.source}): {self.mpi.mpicxx}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _under(path: Path, home: Path | None, var: str) -> str:
    """`path` spelled relative to ``$(var)`` when it lies under `home`."""
    if home is not None:
        try:
            rel = path.relative_to(home)
        except ValueError:
            return str(path)
        return f"$({var})" if str(rel) == "." else f"$({var})/{rel}"
    return str(path)


# ------------------------------------------------------------------------- search


def find_toolchain(environ: Mapping[str, str] | None = None) -> Toolchain:
    """Locate nvcc, NCCL, cuBLAS, MPI and a host C++ compiler (see module docstring)."""
    env = os.environ if environ is None else environ
    notes: list[str] = []
    cuda = _find_cuda(env, notes)
    nccl = _find_nccl(env, cuda, notes)
    cublas = _find_cublas(env, cuda, notes)
    mpi = _find_mpi(env, notes)
    cxx_name = env.get("CXX")
    path = env.get("PATH")
    cxx = None
    for name in ([cxx_name] if cxx_name else []) + ["g++", "c++"]:
        found = shutil.which(name, path=path)
        if found:
            cxx = Path(found)
            break
    return Toolchain(cuda, nccl, cublas, mpi, cxx, tuple(notes))


def _find_cuda(env: Mapping[str, str], notes: list[str]) -> CudaToolkit | None:
    candidates: list[tuple[Path, str]] = []
    if env.get("CUDA_HOME"):
        # An explicit home wins: a wrong one is reported, not silently replaced.
        candidates.append((Path(env["CUDA_HOME"]), "CUDA_HOME"))
    else:
        candidates.append((Path("/usr/local/cuda"), "/usr/local/cuda"))
        on_path = shutil.which("nvcc", path=env.get("PATH"))
        if on_path:
            top = _nvcc_top(Path(on_path))
            if top is not None:
                candidates.append((top, "PATH"))
    for home, source in candidates:
        nvcc = home / "bin" / "nvcc"
        if not nvcc.exists():
            if source == "CUDA_HOME":
                notes.append(f"CUDA_HOME={home} has no bin/nvcc")
            continue
        version = _nvcc_version(nvcc)
        if version is None:
            notes.append(f"{nvcc} --version failed")
            continue
        return CudaToolkit(home, nvcc, version, _nvcc_gpu_codes(nvcc))
    return None


def _nvcc_top(nvcc: Path) -> Path | None:
    """The toolkit root of an nvcc that may be a wrapper script, from ``-dryrun``."""
    direct = nvcc.resolve().parent.parent
    if (direct / "bin" / "nvcc").exists() and (direct / "include" / "cuda_runtime.h").exists():
        return direct
    res = _run([str(nvcc), "-dryrun", "-E", "-x", "cu", os.devnull])
    if res is None:
        return None
    m = re.search(r"^#\$ TOP=(.+)$", res.stdout + res.stderr, re.MULTILINE)
    return Path(m.group(1).strip()).resolve() if m else None


def _nvcc_version(nvcc: Path) -> tuple[int, int] | None:
    res = _run([str(nvcc), "--version"])
    if res is None or res.returncode != 0:
        return None
    m = re.search(r"release (\d+)\.(\d+)", res.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _nvcc_gpu_codes(nvcc: Path) -> tuple[str, ...]:
    res = _run([str(nvcc), "--list-gpu-code"])
    if res is None or res.returncode != 0:
        return ()
    return tuple(line.strip() for line in res.stdout.splitlines() if _ARCH_RE.match(line.strip()))


def _nvidia_wheel_dirs() -> list[Path]:
    """Directories of the ``nvidia`` namespace package (pip's CUDA wheels), unimported."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _lib_dir(home: Path) -> Path | None:
    for name in ("lib", "lib64", "lib/x86_64-linux-gnu", "targets/x86_64-linux/lib"):
        if (home / name).is_dir():
            return home / name
    return None


def _library(
    name: str,
    home: Path,
    header: str,
    bases: Sequence[str],
    source: str,
    notes: list[str],
    include_dir: Path | None = None,
    lib_dir: Path | None = None,
) -> Library | None:
    inc = include_dir or home / "include"
    if not (inc / header).exists():
        if source.endswith("_HOME"):
            notes.append(f"{source}={home} has no include/{header}")
        return None
    libdir = lib_dir or _lib_dir(home)
    if libdir is None:
        if source.endswith("_HOME"):
            notes.append(f"{source}={home} has no lib directory")
        return None
    args = [link_arg(libdir, b) for b in bases]
    if args[0] is None:
        if source.endswith("_HOME"):
            notes.append(f"{source}={home}: no lib{bases[0]}.so* in {libdir}")
        return None
    version = _header_version(inc / header, name)
    return Library(
        name, home, inc, libdir, tuple(a for a in args if a is not None), source, version
    )


def _header_version(header: Path, name: str) -> tuple[int, ...]:
    if name == "NCCL":
        path, keys = header, ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH")
    else:
        path, keys = (
            header.parent / "cublas_api.h",
            (
                "CUBLAS_VER_MAJOR",
                "CUBLAS_VER_MINOR",
                "CUBLAS_VER_PATCH",
            ),
        )
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ()
    parts = []
    for key in keys:
        m = re.search(rf"#define\s+{key}\s+(\d+)", text)
        if m is None:
            break
        parts.append(int(m.group(1)))
    return tuple(parts)


def _find_nccl(
    env: Mapping[str, str], cuda: CudaToolkit | None, notes: list[str]
) -> Library | None:
    if env.get("NCCL_HOME"):
        return _library("NCCL", Path(env["NCCL_HOME"]), "nccl.h", ["nccl"], "NCCL_HOME", notes)
    for d in _nvidia_wheel_dirs():
        lib = _library("NCCL", d / "nccl", "nccl.h", ["nccl"], "pip wheel", notes)
        if lib:
            return lib
    if cuda is not None:
        lib = _library("NCCL", cuda.home, "nccl.h", ["nccl"], "CUDA toolkit", notes)
        if lib:
            return lib
    return _library(
        "NCCL", Path("/usr"), "nccl.h", ["nccl"], "system", notes,
        lib_dir=Path("/usr/lib/x86_64-linux-gnu"),
    )  # fmt: skip


def _find_cublas(
    env: Mapping[str, str], cuda: CudaToolkit | None, notes: list[str]
) -> Library | None:
    bases = ["cublas", "cublasLt"]
    if env.get("CUBLAS_HOME"):
        home = Path(env["CUBLAS_HOME"])
        return _library("cuBLAS", home, "cublas_v2.h", bases, "CUBLAS_HOME", notes)
    major = cuda.version[0] if cuda else 13
    for d in _nvidia_wheel_dirs():
        for sub in (f"cu{major}", "cublas"):
            lib = _library("cuBLAS", d / sub, "cublas_v2.h", bases, "pip wheel", notes)
            if lib:
                return lib
    if cuda is not None:
        return _library("cuBLAS", cuda.home, "cublas_v2.h", bases, "CUDA toolkit", notes)
    return None


def _find_mpi(env: Mapping[str, str], notes: list[str]) -> MpiInstall | None:
    candidates: list[tuple[Path, str]] = []
    if env.get("MPI_HOME"):
        candidates.append((Path(env["MPI_HOME"]) / "bin" / "mpicxx", "MPI_HOME"))
    else:
        candidates.append((Path(sys.executable).parent / "mpicxx", "next to python"))
        on_path = shutil.which("mpicxx", path=env.get("PATH"))
        if on_path:
            candidates.append((Path(on_path), "PATH"))
    for mpicxx, source in candidates:
        if not mpicxx.exists():
            if source == "MPI_HOME":
                notes.append(f"MPI_HOME={mpicxx.parent.parent} has no bin/mpicxx")
            continue
        found = _mpi_from_wrapper(mpicxx, source)
        if found is not None:
            return found
        notes.append(f"{mpicxx} -show / --showme failed")
    return None


def _mpi_from_wrapper(mpicxx: Path, source: str) -> MpiInstall | None:
    tokens: list[str] | None = None
    for flag in ("-show", "--showme"):
        res = _run([str(mpicxx), flag])
        if res is not None and res.returncode == 0 and res.stdout.strip():
            tokens = shlex.split(res.stdout.strip())
            break
    if tokens is None:
        return None
    incs: list[Path] = []
    libdirs: list[Path] = []
    libs: list[str] = []
    other: list[str] = []
    it = iter(tokens[1:])  # tokens[0] is the underlying compiler
    for tok in it:
        if tok in ("-I", "-L", "-l"):
            tok += next(it, "")
        if tok.startswith("-I"):
            incs.append(Path(tok[2:]))
        elif tok.startswith("-L"):
            libdirs.append(Path(tok[2:]))
        elif tok.startswith("-l"):
            libs.append(tok)
        elif tok.startswith("-Wl,"):
            continue  # rpath and dtags: Toolchain adds its own rpath
        elif tok.startswith("-"):
            other.append(tok)
    home = mpicxx.parent.parent
    mpiexec = next(
        (mpicxx.parent / n for n in ("mpiexec", "mpirun") if (mpicxx.parent / n).exists()), None
    )
    return MpiInstall(
        home=home,
        mpicxx=mpicxx,
        mpiexec=mpiexec,
        include_dirs=tuple(dict.fromkeys(incs)),
        lib_dirs=tuple(dict.fromkeys(libdirs)),
        link_args=tuple(libs) or ("-lmpi",),
        other_args=tuple(other),
        source=source,
    )
