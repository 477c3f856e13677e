"""The prepared GPU check of the CUDA target (issue 5), driven by `bench/gpu_check.sh`.

For every sample × canonical schedule × --collectives mode (nccl-device only where it
emits different code), at sizes that fit one GPU, on ONE rank (`--ranks 1`):

1. emit with `--target cuda --arch $ARCH` into WORK/trees/<case>; identical source trees
   are built and run once;
2. build every tree with `make` (trees in parallel); a few cases are also built with
   `-DCOCOVIZ_SCALAR_ONLY` (element-wise path only) for the packed-vs-scalar comparison;
3. run each binary (`./run.sh --check --iters 20 --dump DIR`): the JSON line gives the
   time per iteration (the iteration as one CUDA graph) and the in-binary check
   (scheduled vs unscheduled program); then again with `--no-graph` (every call launched
   from the host), for what the graph saves;
4. compare every dumped output with the numpy reference (`cocoviz.exec.reference`),
   computed once per program, within the §2.5 tolerances;
5. compare the scalar-only builds' outputs and times with the vectorized builds';
6. time each kernel with Nsight Compute (`ncu`, when present): duration and DRAM bytes
   read + written, i.e. achieved bandwidth against the H200's ~4.8 TB/s of HBM3e; ncu
   serializes launches, so each kernel is timed alone: those of the fused schedules in
   both modes (the nccl-device kernel `d_…` with its 16-byte packs and message-sized grid,
   the packed reduction kernels) and the scalar builds (`profiled`).

On one rank every collective is trivial (NCCL copies or does nothing; the nccl-device
kernel reduces over one peer), so the times are those of kernels and GEMMs, not of
communication. `pipeline_stage` needs two pipeline stages, i.e. two GPUs (NCCL refuses
two ranks on one GPU), and is skipped.

Everything goes to OUT (at most 8 files): summary.md, results.jsonl, kernels.csv,
failures.log, gpu_check.log. Work stops being started once --budget seconds have passed;
what was done is still summarized. `--dry-run` emits and builds everything, runs nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cocoviz import numerics as nm  # noqa: E402
from cocoviz import samples  # noqa: E402
from cocoviz.emit.emitter import emit  # noqa: E402
from cocoviz.emit.toolchain import find_toolchain  # noqa: E402
from cocoviz.exec.reference import run_reference  # noqa: E402
from cocoviz.ir.lower import RanksOverride, load_program  # noqa: E402
from cocoviz.ir.nodes import Program, unscheduled  # noqa: E402
from cocoviz.schedule import apply_block, find_block  # noqa: E402

HBM_TBPS = 4.8
"""H200 HBM3e peak bandwidth (TB/s) the kernels are measured against."""

SIZES: dict[str, dict[str, int]] = {
    "adam": {"N": 16 * 1024 * 1024},
    "lamb": {"N": 16 * 1024 * 1024},
    "sgd": {"N": 16 * 1024 * 1024},
    "megatron_mlp": {},  # B=8, S=1024, H=3072: 25M-element activations
    "megatron_attention_out": {},  # B=8, S=1024, H=4096
    "transformer_block": {"S": 2048},  # B=4, S=2048, H=2048
}
"""-D overrides: every elementwise kernel moves tens to hundreds of MB (tens of µs at
HBM speed), and every program with its unscheduled twin fits one H200 with room."""

SKIPPED = {
    "pipeline_stage": "needs 2 pipeline stages = 2 GPUs (NCCL refuses two ranks on one GPU)",
}
EXTRA_PROGRAMS = {
    "avg_int": ROOT / "tests" / "programs" / "avg_int.coco",
    "tail_sizes": ROOT / "tests" / "programs" / "tail_sizes.coco",
}
"""Small programs run for correctness (avg's widen/divide kernels; the packed path with an
element-wise tail), not for timing."""
EXTRA_SIZES: dict[str, dict[str, int]] = {"tail_sizes": {"N": 16 * 1024 * 1024 + 12}}
"""-D overrides of EXTRA_PROGRAMS: tail_sizes at a size that is not a multiple of the pack
width (8 elements), so its kernels run 16-byte packs (st.global.v4) and then a tail of 4."""

SCALAR_CASES = (
    "megatron_mlp.fused.nccl",
    "adam.fused.nccl",
    "transformer_block.fused.nccl",
    "tail_sizes.ar_c.nccl",
    "tail_sizes.fused.nccl-device",
)
"""Also built with -DCOCOVIZ_SCALAR_ONLY: element-wise path vs packed path."""

NCU_SCHEDULES = ("fused",)
"""Schedules whose kernels Nsight Compute times (mode nccl), with the scalar builds."""


def profiled(c: Case) -> bool:
    """Whether Nsight Compute times the kernels of case `c`: the fused schedules in both
    modes (under nccl-device the device-API kernel `d_…` — 16-byte packs, CTAs sized to
    the message — is timed alone like every other kernel; one rank, so its LSA variant)
    and the scalar builds."""
    return (
        c.run is not None
        and c.name in SIZES
        and ((c.mode == "nccl" and (c.schedule in NCU_SCHEDULES or c.scalar))
             or (c.mode == "nccl-device" and c.schedule in NCU_SCHEDULES and c.same_as is None))
    )  # fmt: skip


RUN_TIMEOUT_S = 90
NCU_METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"


@dataclass
class Case:
    name: str
    schedule: str
    mode: str
    directory: Path
    program: Program
    reference: Program
    key: str = ""
    same_as: str | None = None
    scalar: bool = False
    built: bool | None = None
    build_s: float = 0.0
    warnings: int = 0
    run: dict[str, Any] | None = None
    no_graph_ms: float | None = None  # the same run with --no-graph (launches from the host)
    run_error: str | None = None
    vs_reference: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.name}.{self.schedule}.{self.mode}" + (".scalar" if self.scalar else "")

    @property
    def binary(self) -> Path:
        return self.directory / self.program.name


class Check:
    def __init__(self, out: Path, work: Path, budget: float, jobs: int, arch: str) -> None:
        self.out = out
        self.work = work
        self.budget = budget
        self.jobs = jobs
        self.arch = arch
        self.t0 = time.monotonic()
        self.cases: list[Case] = []
        self.kernels: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.header: list[str] = []
        self.env = dict(os.environ)
        """For run.sh: MPIRUN is the mpiexec of the MPI the binaries link (run.sh's
        default is whatever `mpirun` is on PATH)."""
        out.mkdir(parents=True, exist_ok=True)
        self.logf = open(out / "gpu_check.log", "a", encoding="utf-8")  # noqa: SIM115
        self.failf = open(out / "failures.log", "w", encoding="utf-8")  # noqa: SIM115

    # ---- bookkeeping
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()

    def log(self, msg: str) -> None:
        line = f"[gpu_check {self.elapsed():6.1f}s] {msg}"
        print(line, file=sys.stderr, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def failure(self, label: str, text: str) -> None:
        self.failf.write(f"===== {label}\n{text[-6000:]}\n")
        self.failf.flush()

    # ---- 1. emit
    def emit_all(self) -> None:
        trees = self.work / "trees"
        if trees.exists():
            shutil.rmtree(trees)
        trees.mkdir(parents=True)
        seen: dict[str, str] = {}
        for name in samples.names():
            if name in SKIPPED:
                self.skipped.append(f"{name}: {SKIPPED[name]}")
                continue
            self._emit_program(name, samples.path(name), SIZES.get(name, {}), trees, seen)
        for name, path in EXTRA_PROGRAMS.items():
            self._emit_program(name, path, EXTRA_SIZES.get(name, {}), trees, seen)
        for label in SCALAR_CASES:
            base = next((c for c in self.cases if c.label == label), None)
            if base is None or base.same_as is not None:
                continue
            d = base.directory.with_name(base.directory.name + ".scalar")
            shutil.copytree(base.directory, d)
            self.cases.append(
                Case(base.name, base.schedule, base.mode, d, base.program, base.reference,
                     key=base.key + "-scalar", scalar=True)
            )  # fmt: skip
        distinct = sum(1 for c in self.cases if c.same_as is None)
        self.log(f"emitted {len(self.cases)} case(s), {distinct} distinct tree(s)")

    def _emit_program(
        self, name: str, path: Path, dims: Mapping[str, int], trees: Path, seen: dict[str, str]
    ) -> None:
        text = path.read_text(encoding="utf-8")
        if name in EXTRA_PROGRAMS:
            text = text.replace("root=1", "root=0")  # one rank: the only root is 0
        # one rank: `dp=1,tp=1` on a grid with a dp axis (its collectives over dp run on a
        # dp communicator of one rank)
        has_dp = load_program(text, str(path), dims).grid.has_dp
        p0 = load_program(
            text, str(path), dims, RanksOverride.parse("dp=1,tp=1" if has_dp else "1")
        )
        ref = unscheduled(p0)
        blocks = [b.name for b in p0.schedules] or [""]
        for block in blocks:
            p = apply_block(p0, find_block(p0, block)) if block else p0
            steps = [str(s) for s in find_block(p0, block).steps] if block else []
            for mode in ("nccl", "nccl-device"):
                d = trees / f"{name}.{block or 'none'}.{mode}"
                files = emit(
                    p, ref, target="cuda", collectives=mode, arch=self.arch,  # type: ignore[arg-type]
                    schedule_name=block or None, schedule_steps=steps,
                ).files  # fmt: skip
                c = Case(name, block or "none", mode, d, p, ref, key=_source_key(files))
                if c.key in seen:
                    # e.g. nccl-device where the device API does not apply
                    c.same_as = seen[c.key]
                    self.cases.append(c)
                    continue
                seen[c.key] = c.label
                d.mkdir(parents=True)
                for n, text in files.items():
                    (d / n).write_text(text)
                (d / "run.sh").chmod(0o755)
                self.cases.append(c)

    # ---- 2. build
    def build_all(self) -> None:
        todo = [c for c in self.cases if c.same_as is None]
        t = time.monotonic()
        workers = max(1, self.jobs // 2)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            list(pool.map(self._build, todo))
        ok = sum(1 for c in todo if c.built)
        self.log(f"built {ok}/{len(todo)} tree(s) in {time.monotonic() - t:.0f}s")

    def _build(self, c: Case) -> None:
        if self.left() < 30:
            c.notes.append("not built: out of time")
            return
        env = dict(os.environ)
        if c.scalar:
            env["NVCC_APPEND_FLAGS"] = (
                env.get("NVCC_APPEND_FLAGS", "") + " -DCOCOVIZ_SCALAR_ONLY"
            ).strip()
        t = time.monotonic()
        try:
            res = subprocess.run(
                ["make", "-C", str(c.directory), "-j2", f"ARCH={self.arch}"],
                capture_output=True, text=True, env=env, timeout=max(30.0, self.left()), check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            c.built = False
            c.notes.append("build timed out")
            return
        c.build_s = time.monotonic() - t
        text = res.stdout + res.stderr
        c.warnings = sum(1 for ln in text.splitlines() if "warning" in ln.lower())
        c.built = res.returncode == 0 and c.binary.exists()
        if not c.built:
            self.failure(f"build {c.label}", text)
        self.log(f"build {c.label}: {'ok' if c.built else 'FAILED'} ({c.build_s:.0f}s)")

    # ---- 3. run
    def run_all(self) -> None:
        for c in self.cases:
            if c.same_as is not None or not c.built:
                continue
            if self.left() < 20:
                c.notes.append("not run: out of time")
                continue
            dump = c.directory / "dump"
            res, c.run = self._run(c, "--check", "--dump", str(dump))
            if res is None:
                c.run_error = "timed out"
                continue
            if res.returncode != 0 or c.run is None:
                c.run_error = f"exit {res.returncode}"
            self.log(
                f"run {c.label}: exit {res.returncode}, "
                + (f"{c.run['time_ms']:.3f} ms, check {c.run['check']}" if c.run else "no result")
            )
            if c.run is not None and c.run.get("graph") and self.left() > 20:
                # the iteration launched from the host, for what the CUDA graph saves
                res, host = self._run(c, "--no-graph")
                if host is not None:
                    c.no_graph_ms = float(host["time_ms"])
                    self.log(f"run {c.label} --no-graph: {c.no_graph_ms:.3f} ms")

    def _run(
        self, c: Case, *args: str
    ) -> tuple[subprocess.CompletedProcess[str] | None, dict[str, Any] | None]:
        """`./run.sh --iters 20 --warmup 3 ARGS` in the case's tree: the process (None when
        it timed out) and its JSON line (None when it failed); failures are logged."""
        what = " ".join(("run", c.label, *(a for a in args if a.startswith("--no"))))
        try:
            res = subprocess.run(
                ["./run.sh", "--iters", "20", "--warmup", "3", *args], cwd=c.directory,
                capture_output=True, text=True, env=self.env,
                timeout=min(RUN_TIMEOUT_S, self.left()), check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            self.failure(what, "timed out")
            self.log(f"{what}: TIMED OUT")
            return None, None
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
        if res.returncode != 0 or not lines:
            self.failure(what, res.stdout + res.stderr)
        return res, (json.loads(lines[-1]) if lines else None)

    # ---- 4. reference
    def compare_reference(self) -> None:
        by_program: dict[str, list[Case]] = {}
        for c in self.cases:
            if c.run is not None and not c.scalar:
                by_program.setdefault(c.name, []).append(c)
        for name, cases in by_program.items():
            if self.left() < 30:
                for c in cases:
                    c.vs_reference = "not compared: out of time"
                continue
            t = time.monotonic()
            ref = run_reference(cases[0].reference, 0)
            self.log(f"reference {name}: {time.monotonic() - t:.1f}s")
            for c in cases:
                c.vs_reference = _compare_dumps(c, ref.global_value)

    # ---- 5. scalar vs packed
    def compare_scalar(self) -> list[str]:
        rows = []
        for s in self.cases:
            if not s.scalar or s.run is None:
                continue
            v = next(c for c in self.cases if c.label == s.label.removesuffix(".scalar"))
            if v.run is None:
                continue
            outs = []
            for out in v.program.outputs:
                dt = v.program.type_of(out).dtype.value
                a = nm.load_npy(v.directory / "dump" / f"{out}.npy", dt)
                b = nm.load_npy(s.directory / "dump" / f"{out}.npy", dt)
                same = a.tobytes() == b.tobytes()
                outs.append(f"{out}: " + ("identical" if same else nm.compare(a, b, dt).describe()))
            speed = s.run["time_ms"] / v.run["time_ms"] if v.run["time_ms"] else float("nan")
            rows.append(
                f"| {v.label} | {v.run['time_ms']:.3f} | {s.run['time_ms']:.3f} | {speed:.2f}× | "
                + "; ".join(outs) + " |"
            )  # fmt: skip
        return rows

    # ---- 6. kernels under Nsight Compute
    def profile_kernels(self) -> str:
        ncu = _find_ncu()
        if ncu is None:
            return "Nsight Compute (ncu) not found: no per-kernel times."
        todo = [c for c in self.cases if profiled(c)]
        done = 0
        for c in todo:
            if self.left() < 45:
                c.notes.append("kernels not profiled: out of time")
                continue
            cmd = [
                ncu, "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
                "--metrics", NCU_METRICS, "-k", "regex:^(k|r|d|f)_",
                "./run.sh", "--iters", "1", "--warmup", "0",
            ]  # fmt: skip
            try:
                res = subprocess.run(
                    cmd, cwd=c.directory, capture_output=True, text=True, env=self.env,
                    timeout=min(120.0, self.left()), check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                c.notes.append("ncu timed out")
                continue
            rows = _parse_ncu(res.stdout)
            if not rows:
                self.failure(f"ncu {c.label}", res.stdout + res.stderr)
                c.notes.append("ncu gave no kernel rows")
                continue
            for r in rows:
                r["case"] = c.label
                self.kernels.append(r)
            done += 1
            self.log(f"ncu {c.label}: {len(rows)} kernel launch(es)")
        return f"ncu: {ncu}; {done}/{len(todo)} case(s) profiled."

    # ---- summary
    def write(self, dry_run: bool, ncu_note: str, scalar_rows: list[str]) -> int:
        with open(self.out / "results.jsonl", "w", encoding="utf-8") as f:
            for c in self.cases:
                f.write(json.dumps({
                    "case": c.label, "same_as": c.same_as, "built": c.built,
                    "build_s": round(c.build_s, 1), "warnings": c.warnings, "result": c.run,
                    "no_graph_ms": c.no_graph_ms, "run_error": c.run_error, "vs_reference": c.vs_reference, "notes": c.notes,
                }) + "\n")  # fmt: skip
        with open(self.out / "kernels.csv", "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["case", "kernel", "time_us", "dram_bytes", "GB_per_s", "pct_of_hbm"])
            for r in self.kernels:
                w.writerow([r["case"], r["kernel"], f"{r['time_us']:.2f}", r["bytes"],
                            f"{r['gbps']:.0f}", f"{r['pct']:.1f}"])  # fmt: skip
        md = [
            f"# cocoviz GPU check ({'dry run: emit + build only' if dry_run else 'emit, build, run'})",
            "",
        ]
        md += self.header
        md += [
            f"- elapsed: {self.elapsed():.0f} s (budget {self.budget:.0f} s)",
            "- one rank per program (`--ranks 1`): collectives are trivial (NCCL on one rank "
            "copies or does nothing), so times are kernels and GEMMs, not communication",
            "- HBM reference: " + f"{HBM_TBPS} TB/s (H200 HBM3e peak); % = DRAM bytes read + "
            "written (ncu) / kernel time / peak",
        ]
        md += [f"- skipped: {s}" for s in self.skipped]
        md += ["", "## Cases", "",
               "| case | built (s, warnings) | run | check | vs reference | ms/iter (graph) "
               "| ms/iter (--no-graph) | notes |",
               "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        failed = 0
        for c in self.cases:
            if c.same_as is not None:
                md.append(f"| {c.label} | same code as {c.same_as} | | | | | | |")
                continue
            built = (
                "—"
                if c.built is None
                else (f"{c.build_s:.0f}, {c.warnings}" if c.built else "FAILED")
            )
            ran = c.run_error or ("ok" if c.run else "—")
            check = c.run["check"] if c.run else "—"
            ms = f"{c.run['time_ms']:.3f}" if c.run else "—"
            if c.run and not c.run.get("graph"):
                ms += " (no graph)"
            host = f"{c.no_graph_ms:.3f}" if c.no_graph_ms is not None else "—"
            bad = (
                c.built is False or c.run_error is not None
                or (c.run is not None and c.run["check"] != "pass")
                or (c.vs_reference is not None and not c.vs_reference.startswith(("ok", "not")))
            )  # fmt: skip
            failed += bad
            md.append(f"| {c.label} | {built} | {ran} | {check} | {c.vs_reference or '—'} | {ms} | "
                      f"{host} | " + "; ".join(c.notes) + " |")  # fmt: skip
        if scalar_rows:
            md += ["", "## Packed (vectorized) vs element-wise (-DCOCOVIZ_SCALAR_ONLY)", "",
                   "| case | packed ms | scalar ms | scalar/packed | outputs |", "|---|---|---|---|---|",
                   *scalar_rows]  # fmt: skip
        md += ["", "## Kernels (Nsight Compute)", "", ncu_note, ""]
        if self.kernels:
            md += [
                "| case | kernel | µs | DRAM MB | GB/s | % of HBM peak |",
                "|---|---|---|---|---|---|",
            ]
            for r in self.kernels:
                md.append(f"| {r['case']} | {r['kernel']} | {r['time_us']:.1f} | "
                          f"{r['bytes'] / 1e6:.1f} | {r['gbps']:.0f} | {r['pct']:.1f} |")  # fmt: skip
        md += ["", f"{failed} case(s) failed." if failed else "No failures."]
        (self.out / "summary.md").write_text("\n".join(md) + "\n", encoding="utf-8")
        self.log(f"summary: {self.out / 'summary.md'} ({failed} failure(s))")
        return 1 if failed else 0


def _source_key(files: Mapping[str, str]) -> str:
    """Hash of the program's code without comments; main.cu is left out, since it differs
    between the --collectives modes only in the JSON line's "collectives" field."""
    h = hashlib.sha256()
    for n in sorted(files):
        if n.endswith((".cu", ".h", ".cuh")) and n != "main.cu":
            code = [ln for ln in files[n].splitlines() if not ln.lstrip().startswith("//")]
            h.update(n.encode() + b"\0" + "\n".join(code).encode() + b"\0")
    return h.hexdigest()[:16]


def _compare_dumps(c: Case, want_of: Callable[[str], Any]) -> str:
    bad = []
    for out in c.program.outputs:
        dt = c.program.type_of(out).dtype.value
        path = c.directory / "dump" / f"{out}.npy"
        if not path.exists():
            bad.append(f"{out}: no dump")
            continue
        got = nm.load_npy(path, dt)
        want = want_of(out)
        if got.shape != want.shape:
            bad.append(f"{out}: shape {got.shape} != {want.shape}")
            continue
        cmp = nm.compare(got, want, dt)
        if not cmp.ok:
            bad.append(f"{out}: {cmp.describe()}")
    return "ok" if not bad else "MISMATCH " + "; ".join(bad)


def _find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        for p in sorted(Path("/").glob(pattern.lstrip("/"))):
            if os.access(p, os.X_OK):
                return str(p)
    return None


def _number(text: str | None) -> float:
    if text is None:
        raise ValueError("missing")
    return float(text.replace(",", ""))


def _parse_ncu(text: str) -> list[dict[str, Any]]:
    """Rows of ``ncu --csv --page raw --print-units base``: kernel, ns, DRAM bytes."""
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    out = []
    for r in rows:
        try:
            ns = _number(r["gpu__time_duration.sum"])
            nbytes = _number(r["dram__bytes_read.sum"]) + _number(r["dram__bytes_write.sum"])
        except (KeyError, ValueError):
            continue  # the units row, or a malformed one
        name = r.get("Kernel Name") or "?"
        name = name.split("(")[0].split("::")[-1].split(" ")[-1]
        gbps = nbytes / ns if ns else 0.0  # bytes per ns = GB/s
        out.append({"kernel": name, "time_us": ns / 1e3, "bytes": int(nbytes), "gbps": gbps,
                    "pct": 100.0 * gbps / (HBM_TBPS * 1e3)})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="emit and build, run nothing")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; no new work after")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--arch", default="sm_90")
    a = ap.parse_args(argv)
    chk = Check(a.out, a.work, a.budget, a.jobs, a.arch)
    tc = find_toolchain()
    chk.header = [f"- toolchain: {ln}" for ln in tc.describe().splitlines() if ln.strip()]
    smi = shutil.which("nvidia-smi")
    if smi:
        res = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
        chk.header.append(f"- GPU: {res.stdout.strip() or res.stderr.strip()}")
    else:
        chk.header.append("- GPU: nvidia-smi not found")
    if tc.mpi is not None and tc.mpi.mpiexec is not None:
        chk.env.setdefault("MPIRUN", str(tc.mpi.mpiexec))
    missing = tc.missing("cuda")
    if missing:
        chk.log("toolchain incomplete: " + "; ".join(missing))
        chk.header.append("- MISSING: " + "; ".join(missing))
        chk.write(a.dry_run, "not reached", [])
        return 3
    chk.emit_all()
    chk.build_all()
    if a.dry_run:
        return chk.write(True, "dry run: nothing profiled", [])
    chk.run_all()
    chk.compare_reference()
    scalar_rows = chk.compare_scalar()
    note = chk.profile_kernels()
    return chk.write(False, note, scalar_rows)


if __name__ == "__main__":
    sys.exit(main())
