"""CLI fuzzer: hostile option values for every command and every option, each run as a
real `cocoviz` process.

    python bench/fuzz_cli.py [--cases N] [--seed S] [--jobs J] [--cpu-limit S] [--out FILE]

Each case picks a command (from the argument parser itself, so a new command or option
is fuzzed without editing this file), then each of its options with some probability,
with a value from the pool of its kind: absurd numbers (400 digits, NaN, inf, negative,
hexadecimal, non-ASCII digits), hostile files (a FIFO with no writer, /dev/zero, a
directory, a link loop, a dangling link, a 20,000-deep TOML, non-UTF-8 text, a device
node), hostile output paths (an input of the same command, a file the tool did not write,
a device node, a link to /dev/stdout, a FIFO without a reader, a 300-byte name) and
malformed steps, dimensions, rank grids and sweeps. Everything runs in a scratch
directory; no output path points outside it.

A finding is an exit 70 (internal error), a traceback, a death by signal, a run over
the wall-clock limit (a hang) or over `--cpu-limit` seconds of CPU (its own and its
children's), or a change to a file it may only read (the inputs, the device node). It
prints the counts of exit codes, the slowest runs and the findings, each with the
command line that reproduces it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import random
import resource
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NUMBERS = [
    "0",
    "1",
    "2",
    "4",
    "-1",
    "9" * 400,
    "-" + "9" * 400,
    "1e400",
    "-1e400",
    "nan",
    "inf",
    "-inf",
    "0x10",
    "",
    " ",
    "١٢",
    "1.5",
    "99999999999",
    "2^64",
    "100000000",
    "1G",
    "1.5T",
    "1P",
    "4096",
    "8K",
    "-0",
    "+3",
    "1_000",
    "9" * 20,
]
RANKS = [
    "4",
    "2",
    "tp=2,pp=2",
    "tp=0,pp=1",
    "tp=" + "9" * 40 + ",pp=1",
    "",
    "x",
    "1e9",
    "-4",
    "tp=2",
    "pp=2,tp=2,tp=2",
    "65536",
    "1",
    "dp=2,tp=2",
    "dp=2,tp=2,pp=2",
    "dp=0,tp=2",
    "ep=2,tp=2",
    "dp=2",
    "dp=" + "9" * 30 + ",tp=2",
]
DEFINES = [
    "N=64",
    "N=0",
    "N=-1",
    "N=" + "9" * 400,
    "=",
    "N",
    "H=1024",
    "N=1e9",
    "N=2^63",
    "B=2",
    "S=16",
    "Q=4",
    "N=64=64",
    "N=٦٤",
]
STEPS = [
    "split(g1)",
    "split(",
    "fuse(a, b)",
    "overlap(x, y, chunks=0)",
    "reorder()",
    "dce",
    "split(" * 3000,
    "asslice(w)",
    "x" * 10000,
    "fuse(" + ",".join(["s"] * 5000) + ")",
    "overlap(a, b, chunks=" + "9" * 400 + ")",
]
SWEEPS = [
    "N=2^16..2^20",
    "N=2^0..2^99999",
    "N=1..0",
    "garbage",
    "N=2^-1..2^4",
    "Q=2^4..2^8",
    "N=" + "9" * 400 + "..1",
]
ARCHS = ["sm_90", "sm_70", "sm_80", "garbage", "", "sm_" + "9" * 400]
SAMPLES = [
    "sgd", "adam", "megatron_mlp", "transformer_block", "pipeline_stage", "lamb",
    "moe_routed", "zero1_tp_mlp", "zero3_layer",
]  # fmt: skip
MPI_ARGS = ["", "-n 999999", "--bogus-flag", "'unterminated", "-genv X Y", "; rm -rf /", "a" * 5000]
HW = ["h100-dgx", "h200-hgx", "nope"]
STRINGS = ["x", "", "-", "--", "a" * 5000, "\u202e", "../x", "fused", "as_written"]


@dataclass
class Case:
    number: int
    argv: list[str]


@dataclass
class Result:
    case: Case
    rc: int
    cpu: float
    wall: float
    stderr: str
    hung: bool


def make_sandbox(root: Path) -> dict[str, list[str]]:
    """Hostile files in `root`; returns the pools of input and output paths."""
    from cocoviz import samples

    (root / "good.coco").write_text(samples.text("sgd"))
    (root / "bad.coco").write_text(
        "ranks 4\ndim N = 64\ninput x : f32[N] replicated\ny = x * * 2\n"
    )
    (root / "deep.coco").write_text(
        "ranks 4\ndim N = 64\ninput x : f32[N] replicated\ny = "
        + "(" * 50_000
        + "x"
        + ")" * 50_000
        + "\noutput y\n"
    )
    (root / "latin1.coco").write_bytes(b"# caf\xe9\nranks 4\n")
    (root / "empty.coco").write_text("")
    (root / "newforms.coco").write_text(
        "ranks dp=2, tp=2\ndim B = 8, H = 16, E = 4\n"
        "input x : f32[B, H] sliced(0, over=dp)\ninput w : f32[H, E] replicated\n"
        "s = matmul(x, w)\nt = transpose(s, 0, 1)\nm = amax(s, dim=-1, keepdim=true)\n"
        "i = topk_indices(s, 2)\ng = gather(s, i, dim=1)\nz = zeros(f32[B, H]) + x\n"
        "r = allreduce(+, sum(z, dim=0), over=dp)\noutput t, m, g, r\n"
    )
    (root / "deep.toml").write_text("x = " + "[" * 20_000 + "]" * 20_000 + "\n")
    (root / "tables.toml").write_text("x = " + "{a = " * 5_000 + "1" + "}" * 5_000 + "\n")
    (root / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    (root / "big.toml").write_text("# pad\n" * 400_000)
    (root / "base.toml").write_text('base = "h100-dgx"\nname = "mine"\n')
    (root / "garbage.sched").write_text("# cocoviz schedule v1\n# steps: 3\nsplit(\n")
    (root / "notes.json").write_text('{"mine": true}\n')
    (root / "log.txt").write_text("# nThread 1 nGpus 8\n" + "garbage line\n" * 100)
    os.mkfifo(root / "fifo")
    os.mkfifo(root / "fifo.sched")
    os.mkfifo(root / "fifo.toml")
    (root / "dir").mkdir()
    (root / "dir.sched").mkdir()
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    (root / "dangling").symlink_to(root / "missing")
    (root / "zero.sched").symlink_to("/dev/zero")
    (root / "zero.toml").symlink_to("/dev/zero")
    (root / "stdout.json").symlink_to("/dev/stdout")
    (root / "stdout.sched").symlink_to("/dev/stdout")
    try:
        os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(root / "null.sched", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pass
    inputs = root / "inputs"
    inputs.mkdir()
    (inputs / "w.npy").write_bytes(b"\x93NUMPY\x01\x00" + b"\xff" * 100)
    (inputs / "g.npy").symlink_to("/dev/zero")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cocoviz",
            "apply",
            "sgd",
            "split(g1)",
            "-o",
            str(root / "good.sched"),
        ],
        capture_output=True,
        cwd=root,
        check=False,
    )
    # emitted trees for check-tree: a real one, and crafted or damaged ones
    subprocess.run(
        [sys.executable, "-m", "cocoviz", "emit", "sgd", "-D", "N=1024", "--ranks", "2"]
        + ["--target", "cpu", "-o", "tree"],
        capture_output=True,
        cwd=root,
        check=False,
    )
    for name, manifest in [
        ("tree_notjson", b"{not json"),
        ("tree_big", b"[" * 200_000),
        ("tree_other", b'{"cocoviz": "someone else", "files": {"../../x": "0"}}'),
        ("tree_binary", b"\xff\xfe\x00" * 100),
    ]:
        (root / name).mkdir()
        (root / name / "manifest.json").write_bytes(manifest)
    (root / "tree_fifo").mkdir()
    os.mkfifo(root / "tree_fifo" / "manifest.json")
    if (root / "tree" / "manifest.json").exists():
        for name in ("tree_noprog", "tree_badprog", "tree_zero"):
            subprocess.run(["cp", "-r", str(root / "tree"), str(root / name)], check=False)
        (root / "tree_noprog" / "program.coco").unlink(missing_ok=True)
        (root / "tree_badprog" / "program.coco").write_text("ranks 4\ny = = 2\n")
        (root / "tree_zero" / "program.coco").unlink(missing_ok=True)
        (root / "tree_zero" / "program.coco").symlink_to("/dev/zero")
    (root / "hosts").write_text("localhost slots=2\n")
    long = "n" * 300
    ins = [
        "good.coco",
        "bad.coco",
        "newforms.coco",
        "newforms.coco",
        "deep.coco",
        "latin1.coco",
        "empty.coco",
        "fifo",
        "dir",
        "loop1",
        "dangling",
        "/dev/zero",
        "/proc/self/mem",
        long,
        "missing.coco",
    ]
    return {
        "file": ins + SAMPLES + SAMPLES,
        "hw": [
            "deep.toml",
            "tables.toml",
            "latin1.toml",
            "big.toml",
            "base.toml",
            "fifo.toml",
            "zero.toml",
            "dir",
            "loop1",
            "/dev/zero",
            "missing.toml",
            *HW,
            *HW,
        ],
        "schedule": [
            "good.sched",
            "garbage.sched",
            "fifo.sched",
            "zero.sched",
            "dir.sched",
            "missing.sched",
            "fused",
            "nope",
            "as_written",
            "good.coco",
        ],
        "out_file": [
            "out.sched",
            "out.json",
            "good.coco",
            "good.sched",
            "notes.json",
            "null",
            "null.sched",
            "stdout.json",
            "stdout.sched",
            "fifo",
            "fifo.sched",
            "dir",
            "dangling",
            "loop1",
            long + ".json",
            "missing/dir/out.json",
            "base.toml",
        ],
        "out_dir": [
            "outdir",
            "outdir",
            "dir",
            "good.coco",
            "null",
            "fifo",
            "inputs",
            long,
            "missing/deeper",
            ".",
        ],
        "inputs": ["inputs", "dir", "good.coco", "missing", "fifo", "/dev/zero"],
        "log": ["log.txt", "fifo", "/dev/zero", "good.coco", "dir", "missing.log", "latin1.coco"],
        "tree": [
            "tree", "tree", "tree_notjson", "tree_big", "tree_other", "tree_binary",
            "tree_fifo", "tree_noprog", "tree_badprog", "tree_zero", "dir", "good.coco",
            "fifo", "missing", "/dev", long,
        ],
        "hostfile": ["hosts", "fifo", "/dev/zero", "dir", "missing", "latin1.coco", "deep.toml"],
    }  # fmt: skip


def option_kind(command: str, action: argparse.Action) -> str:
    opts = action.option_strings
    name = next((o for o in opts if o.startswith("--")), opts[-1] if opts else action.dest)
    if action.choices is not None:
        return "choice"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "flag"
    table = {
        "file": "file",
        "--hw": "hw",
        "--base": "hw",
        "--schedule": "schedule",
        "-D": "define",
        "--ranks": "ranks" if command != "model-table" else "number",
        "--seed": "number",
        "--trace": "out_file",
        "--inputs": "inputs",
        "--dump": "out_dir",
        "--copy": "out_dir",
        "--build-dir": "out_dir",
        "--sweep": "sweep",
        "--arch": "arch",
        "steps": "steps",
        "--explain": "steps",
        "--name": "string",
        "logs": "log",
        "directory": "tree",
        "--keep": "out_dir",
        "--hostfile": "hostfile",
        "--mpi-args": "mpi_args",
    }
    if name in ("--output", "-o"):
        return "out_dir" if command in ("emit",) else "out_file"
    if name in table:
        return table[name]
    if action.nargs == "*" and command == "calibrate":
        return "log"
    if action.nargs == "*":
        return "steps"
    return "number"


def commands() -> dict[str, list[argparse.Action]]:
    from cocoviz.cli import build_parser

    parser = build_parser()
    out: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = [a for a in sub._actions if a.dest != "help"]
    return out


SANE = {
    "number": ["1", "2", "4", "40", "4096", "0.5"],
    "ranks": ["4", "2", "tp=2,pp=2"],
    "define": ["N=64", "N=1024", "H=64"],
    "schedule": ["fused", "good.sched"],
    "hw": HW[:2],
    "file": SAMPLES,
    "steps": ["split(g1)", "dce"],
}
"""Ordinary values, picked half the time, so that hostile ones meet a command that gets
past its first check."""

SLOW_FLAGS = {"--build", "--mpi", "--local", "--emulate", "--oversubscribe"}
"""Flags that start compilers or MPI jobs: picked rarely, so the run stays bounded."""


def make_case(
    rng: random.Random,
    number: int,
    cmds: dict[str, list[argparse.Action]],
    pools: dict[str, list[str]],
) -> Case:
    command = rng.choice(sorted(cmds))
    argv = [command]
    for action in cmds[command]:
        kind = option_kind(command, action)
        required = not action.option_strings and action.nargs is None
        if action.option_strings and action.option_strings[-1] in SLOW_FLAGS:
            chance = 0.03
        else:
            chance = 0.35
        if not required and rng.random() > chance:
            continue
        flag = [rng.choice(action.option_strings)] if action.option_strings else []
        if kind == "flag":
            argv += flag
            continue
        if kind == "choice":
            choices = [str(c) for c in action.choices or ()]
            value = rng.choice(choices) if rng.random() < 0.8 else rng.choice(STRINGS)
        else:
            pool = {
                "number": NUMBERS,
                "ranks": RANKS,
                "define": DEFINES,
                "steps": STEPS,
                "sweep": SWEEPS,
                "arch": ARCHS,
                "string": STRINGS,
                "mpi_args": MPI_ARGS,
            }.get(kind) or pools[kind]
            sane = SANE.get(kind)
            value = rng.choice(sane if sane and rng.random() < 0.5 else pool)
        if action.nargs == "*":
            argv += [value] * rng.randint(0, 2)
        else:
            argv += [*flag, value]
            if kind == "define" and rng.random() < 0.3:
                argv += ["-D", rng.choice(DEFINES)]
    if rng.random() < 0.1:
        argv.append(rng.choice(["--json", "--force", "--bogus", "-"]))
    return Case(number, argv)


def run_case(case: Case, sandbox: Path, cpu_limit: float, wall_limit: float) -> Result:
    def limits() -> None:
        os.nice(10)
        hard = int(cpu_limit * 6) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))

    start = time.monotonic()
    env = {**os.environ, "COCOVIZ_CACHE_DIR": str(sandbox / ".cache"), "COLUMNS": "100"}
    timing = sandbox.parent / f"{sandbox.name}-time-{case.number}"
    proc = subprocess.Popen(
        [
            "/usr/bin/time",
            "-f",
            "%U %S",
            "-o",
            str(timing),
            sys.executable,
            "-m",
            "cocoviz",
            *case.argv,
        ],
        cwd=sandbox,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=limits,
        start_new_session=True,
    )
    hung = False
    try:
        _, err = proc.communicate(timeout=wall_limit)
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, 9)
        _, err = proc.communicate()
    wall = time.monotonic() - start
    cpu = 0.0
    try:
        words = timing.read_text().split()
        cpu = float(words[-2]) + float(words[-1])
        timing.unlink()
    except (OSError, ValueError, IndexError):
        pass
    rc = proc.returncode
    text = err.decode("utf-8", "replace")
    if rc > 128 and "Command terminated by signal" in text:  # time reports a signal so
        rc = -(rc - 128)
    return Result(case, rc, cpu, wall, text, hung)


def digest_files(root: Path, names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        p = root / n
        st = os.lstat(p)
        out[n] = f"{stat.S_IFMT(st.st_mode)}:" + (
            hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cpu-limit", type=float, default=10.0, help="CPU seconds a run may take")
    ap.add_argument(
        "--wall-limit", type=float, default=180.0, help="seconds before a run is a hang"
    )
    ap.add_argument("--show", type=int, default=10, help="findings to print")
    args = ap.parse_args()
    rng = random.Random(f"cocoviz-cli-fuzz-{args.seed}")
    cmds = commands()
    with tempfile.TemporaryDirectory(prefix="cocoviz-cli-fuzz-") as tmp:
        sandbox = Path(tmp)
        pools = make_sandbox(sandbox)
        readonly = ["good.coco", "bad.coco", "deep.toml", "base.toml", "garbage.sched"]
        readonly += [
            n for n in ("null", "null.sched", "fifo", "stdout.json") if os.path.lexists(sandbox / n)
        ]
        before = digest_files(sandbox, readonly)
        cases = [make_case(rng, i, cmds, pools) for i in range(args.cases)]
        results: list[Result] = []
        start = time.monotonic()
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = [
                pool.submit(run_case, c, sandbox, args.cpu_limit, args.wall_limit) for c in cases
            ]
            for f in concurrent.futures.as_completed(futures):
                results.append(f.result())
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        after = digest_files(sandbox, readonly)
        elapsed = time.monotonic() - start
    results.sort(key=lambda r: r.case.number)
    codes = Counter(r.rc for r in results)
    by_command = Counter((r.case.argv[0], r.rc) for r in results)
    findings = []
    for r in results:
        why = []
        if r.rc == 70:
            why.append("exit 70")
        if r.rc < 0 and not r.hung:
            why.append(f"killed by signal {-r.rc}")
        if "Traceback" in r.stderr:
            why.append("traceback")
        if r.hung:
            why.append(f"over {args.wall_limit:.0f} s wall")
        if r.cpu > args.cpu_limit:
            why.append(f"{r.cpu:.1f} s CPU")
        if why:
            findings.append((r, why))
    changed = [n for n in before if before[n] != after[n]]
    cpu_total = (usage.ru_utime - usage0.ru_utime) + (usage.ru_stime - usage0.ru_stime)
    print(
        f"{len(results)} invocations in {elapsed:.0f} s ({cpu_total:.0f} CPU s in all, "
        f"{len(cmds)} commands, seed {args.seed})"
    )
    print("exit codes:", dict(sorted(codes.items())))
    print("by command:", {f"{c} {rc}": n for (c, rc), n in sorted(by_command.items())})
    slow = sorted(results, key=lambda r: -r.cpu)[:5]
    print("most CPU (s):", [(round(r.cpu, 1), shlex.join(r.case.argv)[:120]) for r in slow])
    print(
        f"CPU per run: max {max(r.cpu for r in results):.1f} s, "
        f"mean {sum(r.cpu for r in results) / len(results):.2f} s"
    )
    print(f"runs over {args.wall_limit:.0f} s wall (hangs): {sum(r.hung for r in results)}")
    print(
        f"CPU limit per run: {args.cpu_limit:.0f} s (RLIMIT_CPU {int(args.cpu_limit * 6) + 1} s "
        f"kills a runaway); killed by SIGXCPU: {sum(r.rc == -24 for r in results)}"
    )
    print(f"read-only files changed: {changed or 'none'}")
    print(f"findings: {len(findings)}")
    for r, why in findings[: args.show]:
        tail = "\n    ".join(r.stderr.strip().splitlines()[-6:])
        print(
            f"- case {r.case.number}: {', '.join(why)}: cocoviz {shlex.join(r.case.argv)[:300]}\n    {tail}"
        )
    return 1 if findings or changed else 0


if __name__ == "__main__":
    sys.exit(main())
