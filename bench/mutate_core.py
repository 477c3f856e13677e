"""Mutation testing of the core rules against the fast test subset (run on demand, not in CI).

Each mutant is one small, plausible mistake in a core rule — a refusal dropped or loosened
in `split`, `reorder`, `fuse`, `overlap` or `decompose`; an operator, offset or order
changed in their semantics or in the numpy reference's collectives (cocoviz/exec); a chunk
offset of the emitter's plan (cocoviz/emit); a term of a cost formula (cocoviz/sim). The
script applies one mutant at a time to a temporary copy of the repository (a git worktree
of HEAD, or of --rev, under /tmp: the checkout itself is never touched), runs the tests
that concern the mutated module (`-m "not build" -x`, the selections in SELECTIONS below: fast-subset test
files only, so a run is affordable on a laptop) and reports each mutant killed (a test
failed) or survived, and the kill rate.

    python bench/mutate_core.py                 # all mutants, per-module selections
    python bench/mutate_core.py --only fuse     # mutants whose id starts with "fuse"
    python bench/mutate_core.py --full          # each mutant against the whole fast subset
    python bench/mutate_core.py --list          # the mutants, without running anything
    python bench/mutate_core.py --json out.json # also write the results

Before the mutants, each selection runs once unmutated and must pass (a failing baseline
would "kill" every mutant). docs/semantics-notes.md ("Mutation testing") records the last
full run: the kill rate and each survivor with why it survives.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    """An exact source fragment, which must occur exactly once in the file."""
    new: str
    why: str
    """The mistake it plants."""
    selection: str
    """A key of SELECTIONS: the tests that concern the mutated module."""


STEPS = "steps"
EXEC = "exec"
EMIT = "emit"
SIM = "sim"

SELECTIONS: dict[str, list[str]] = {
    STEPS: [
        "tests/test_step_refusals.py",
        "tests/test_reduce_ops.py",
        "tests/test_transforms_errors.py",
        "tests/test_transforms_verify.py",
        "tests/test_transforms_golden.py",
        "tests/test_alltoall.py",
        "tests/test_shards.py",
        "tests/test_reorder_operands.py",
    ],
    EXEC: [
        "tests/test_reduce_ops.py",
        "tests/test_exec_ops.py",
        "tests/test_exec_reference.py",
        "tests/test_exec_verify.py",
        "tests/test_exec_layout.py",
        "tests/test_shards.py",
        "tests/test_mpi_overlap_groups.py",  # its chunk-layout test (the MPI runs are build)
    ],
    EMIT: [
        "tests/test_emit_offsets.py",
        "tests/test_emit_golden.py",
        "tests/test_emit_decompose.py",
        "tests/test_emit_overlap.py",
    ],
    SIM: [
        "tests/test_sim_collectives.py",
        "tests/test_sim_compute.py",
        "tests/test_sim_algorithms.py",
        "tests/test_sim_decompose.py",
        "tests/test_sim_chunk_rows.py",
        "tests/test_sim_bus_factor.py",
    ],
}

T = "cocoviz/ir/transforms/"

MUTANTS: list[Mutant] = [
    # ------------------------------------------------------------------ split
    Mutant("split-op-plus", T + "split.py", "Expr(Op.REDUCESCATTER, e.args, rop=e.rop,",
           "Expr(Op.REDUCESCATTER, e.args, rop=type(e.rop).SUM,",
           "the reducescatter always reduces with +", STEPS),
    Mutant("split-no-divisibility", T + "split.py", "        if n % G:\n", "        if False:\n",
           "an allreduce whose size does not divide by G is split", STEPS),
    Mutant("split-in-overlap", T + "split.py", "        if idx.group_of(s.name) is not None:\n",
           "        if False:\n", "an allreduce inside an overlapped group is split", STEPS),
    Mutant("split-any-op", T + "split.py", "        if e.op is not Op.ALLREDUCE:\n",
           "        if e.op not in (Op.ALLREDUCE, Op.REDUCE):\n",
           "a reduce (rooted) is split like an allreduce", STEPS),
    # ------------------------------------------------------------------ reorder
    Mutant("reorder-not-closed", T + "reorder.py",
           "            bad = sorted((idx.preds(m) & between), key=idx.position)\n            if bad:\n",
           "            bad = sorted((idx.preds(m) & between), key=idx.position)\n            if False:\n",
           "a region with a stage outside it between two members", STEPS),
    Mutant("reorder-local-operand", T + "reorder.py", "                if (t.dp if ag.expr.tag == \"dp\" else t.layout).is_local:\n",
           "                if False:\n", "a member reading a local value is moved onto slices", STEPS),
    Mutant("reorder-not-allgather", T + "reorder.py",
           "        if ag.expr.op not in (Op.ALLGATHER, Op.ALLTOALL):\n",
           "        if ag.expr.op not in (Op.ALLGATHER, Op.ALLTOALL, Op.ALLREDUCE):\n",
           "reorder across an unsplit allreduce", STEPS),
    Mutant("reorder-grouped", T + "reorder.py", "        if idx.group_of(ag.name) is not None:\n",
           "        if False:\n", "reorder of a gather inside a fused/overlapped group", STEPS),
    Mutant("reorder-disconnected", T + "reorder.py",
           "        if not any(ag.name in idx.reads(m.name) for m in members):\n",
           "        if False:\n", "a listed region that does not read the gather", STEPS),
    Mutant("reorder-non-replicated-other", T + "reorder.py",
           "                if not (t.layout.is_replicated or t.is_scalar):\n",
           "                if False:\n",
           "a region member not depending on the gather reads a sliced value", STEPS),
    Mutant("reorder-slices-broadcast", T + "reorder.py",
           "            if t.layout.is_replicated and not t.is_scalar and shape_values(t.shape) == shape:",
           "            if t.layout.is_replicated and not t.is_scalar:",
           "a broadcast operand (a bias) is sliced like a full one (CoCoNet's mistake)", STEPS),
    # ------------------------------------------------------------------ asslice
    Mutant("asslice-whole-read", T + "asslice.py", "                if lay is None:\n",
           "                if False:\n", "an input read whole is stored sliced", STEPS),
    Mutant("asslice-two-ways", T + "asslice.py", "                elif lay != layout:\n",
           "                elif False:\n", "an input sliced two ways is stored with the first", STEPS),
    # ------------------------------------------------------------------ groups
    Mutant("grouping-hull", T + "grouping.py", "    return members | (down & up)",
           "    return members | down", "the hull takes every stage below the members", STEPS),
    Mutant("grouping-overlap-cycle", T + "grouping.py",
           "    cyc = cycle_through_groups(idx, members)\n    if cyc is not None:\n",
           "    cyc = cycle_through_groups(idx, members)\n    if False:\n",
           "an overlapped group closing a cycle through a fused group", STEPS),
    # ------------------------------------------------------------------ fuse
    Mutant("fuse-rs-reads-inside", T + "fuse.py", "        if inside:\n", "        if False:\n",
           "a reducescatter reading a value computed inside the group is fused", STEPS),
    Mutant("fuse-matmul", T + "fuse.py", "            if op is Op.MATMUL:\n",
           "            if False:\n", "a matmul is fused", STEPS),
    Mutant("fuse-allreduce", T + "fuse.py", "            if op is Op.ALLREDUCE:\n",
           "            if False:\n", "an unsplit allreduce is fused", STEPS),
    Mutant("fuse-two-collectives", T + "fuse.py", "        if len(firsts) > 1 or (sends and ags):\n",
           "        if len(firsts) > 2 or (sends and ags):\n",
           "two reducescatters/sends in one group", STEPS),
    Mutant("fuse-ag-without-rs", T + "fuse.py", "        if ags and not rss:\n",
           "        if False:\n", "an allgather ends a group without a reducescatter", STEPS),
    Mutant("fuse-reads-own-allgather", T + "fuse.py",
           "            readers = [u for u in idx.users(g.name) if u in members]\n            if readers:\n",
           "            readers = [u for u in idx.users(g.name) if u in members]\n            if False:\n",
           "a member reads the group's own allgather", STEPS),
    Mutant("fuse-cycle", T + "fuse.py", "        cyc = cycle_through_groups(idx, members)\n        if cyc is not None:\n",
           "        cyc = cycle_through_groups(idx, members)\n        if False:\n",
           "a group closing a cycle through another group", STEPS),
    Mutant("fuse-send-both-sides", T + "fuse.py", "        if operand_inside and readers:\n",
           "        if False:\n", "computation both before and after a send", STEPS),
    Mutant("fuse-send-pipeline-stage", T + "fuse.py",
           "            if s is send or s.ty.pstage is None or s.ty.pstage == side:\n",
           "            if True:\n", "a group computing on both pipeline stages of a send", STEPS),
    Mutant("fuse-one-stage", T + "fuse.py", "        if len(self.stages) < 2:\n",
           "        if len(self.stages) < 1:\n", "fuse of a single stage", STEPS),
    # ------------------------------------------------------------------ overlap
    Mutant("overlap-chunks-1", T + "overlap.py", "        if self.k < 2:\n",
           "        if self.k < 1:\n", "overlap with one chunk", STEPS),
    Mutant("overlap-rows-divide", T + "overlap.py", "        if rows == 0 or rows % K:\n",
           "        if rows == 0:\n", "K that does not divide the rows", STEPS),
    Mutant("overlap-slice-escapes", T + "overlap.py", "            if why is not None:\n                raise self.error(\n                    f\"'{n}' is {s.ty.layout} and {why}",
           "            if False:\n                raise self.error(\n                    f\"'{n}' is {s.ty.layout} and {why}",
           "a chunk-laid-out slice leaves the group", STEPS),
    Mutant("overlap-rs-chunk-divides", T + "overlap.py",
           "            if s.expr.op is Op.REDUCESCATTER and (s.ty.numel // K) % G:\n",
           "            if False:\n", "a reducescatter chunk that does not divide by G", STEPS),
    Mutant("overlap-unconnected-items", T + "overlap.py",
           "            if not any(idx.reads(m) & sets[i - 1] for m in sets[i]):\n",
           "            if False:\n", "items that do not read their predecessor", STEPS),
    Mutant("overlap-whole-reduction", T + "overlap.py",
           "                    refuse(s, \"it reduces a whole tensor to a scalar, which needs every chunk\")\n",
           "                    pass\n", "a whole-tensor reduction in an alltoall group", STEPS),
    # ------------------------------------------------------------------ decompose
    Mutant("decompose-batched", T + "decompose.py", "        if len(right.shape) > 2:\n",
           "        if len(right.shape) > 3:\n", "a batched matmul is decomposed", STEPS),
    Mutant("decompose-rows-divide", T + "decompose.py",
           "        if len(mm.ty.shape) < 2 or rows % G:\n", "        if len(mm.ty.shape) < 2:\n",
           "rows that do not divide by G", STEPS),
    Mutant("decompose-result-read", T + "decompose.py",
           "        if others or mm.name in idx.outputs:\n", "        if False:\n",
           "the partial matmul result is read elsewhere", STEPS),
    Mutant("decompose-both-operands", T + "decompose.py", "        if all(reads):\n",
           "        if False:\n", "a matmul reading the gather as both operands", STEPS),
    Mutant("shards-send-to", "cocoviz/ir/shards.py",
           "        return (rank - 1) % G if self.kind == \"gather\" else (rank + 1) % G",
           "        return (rank + 1) % G if self.kind == \"gather\" else (rank + 1) % G",
           "the gather ring sends to the rank it receives from", STEPS),
    Mutant("shards-gather-order", "cocoviz/ir/shards.py", "            return (rank + step) % G\n",
           "            return (rank - step) % G\n", "the gather ring walks the wrong way", STEPS),
    Mutant("shards-scatter-order", "cocoviz/ir/shards.py", "        return (rank - step - 1) % G\n",
           "        return (rank - step) % G\n", "the scatter ring is off by one step", STEPS),
    # ------------------------------------------------------------------ reference collectives
    Mutant("exec-max-min", "cocoviz/exec/ops.py", "                np.maximum(acc, x, out=acc)\n",
           "                np.minimum(acc, x, out=acc)\n", "max combines as min", EXEC),
    Mutant("exec-prod-sum", "cocoviz/exec/ops.py", "                np.multiply(acc, x, out=acc)\n",
           "                np.add(acc, x, out=acc)\n", "* combines as +", EXEC),
    Mutant("exec-avg-no-divide", "cocoviz/exec/ops.py", "    if rop is ReduceOp.AVG:\n        n = compute.type(len(arrays))",
           "    if False:\n        n = compute.type(len(arrays))", "avg is the sum", EXEC),
    Mutant("exec-rs-block", "cocoviz/exec/ops.py", "        lo, hi = chunk_range(out_ty, g, r)\n        out.append(reduce_values(",
           "        lo, hi = chunk_range(out_ty, g, (r + 1) % g)\n        out.append(reduce_values(",
           "rank r gets block r+1 of the reduce-scatter", EXEC),
    Mutant("exec-reduce-root", "cocoviz/exec/ops.py", "    return [combined if r == root else zeros.copy() for r in range(len(arrays))]",
           "    return [combined if r == 0 else zeros.copy() for r in range(len(arrays))]",
           "reduce leaves the result on rank 0 whatever the root", EXEC),
    Mutant("exec-broadcast-root", "cocoviz/exec/ops.py", "    out = _readonly(np.array(arrays[root]))",
           "    out = _readonly(np.array(arrays[0]))", "broadcast from rank 0 whatever the root", EXEC),
    Mutant("exec-first-rank-dropped", "cocoviz/exec/ops.py", "    acc = np.array(arrays[0], dtype=compute, copy=True)",
           "    acc = np.array(arrays[-1], dtype=compute, copy=True)",
           "the combination starts from the last rank (counted twice, rank 0 never)", EXEC),
    Mutant("exec-chunk-layout", "cocoviz/exec/layout.py", "        lo = k * (n // chunks) + rank * c\n",
           "        lo = rank * (n // group) + k * c\n",
           "inside an overlapped group, chunk k of a rank's slice is block k of its ordinary slice",
           EXEC),
    # ------------------------------------------------------------------ emitter offsets
    Mutant("emit-rs-send-offset", "cocoviz/emit/collectives.py",
           "                send_offset=pl.Offset(per_chunk=sv.count // K) if chunks else pl.ZERO,\n                recv_offset=pl.Offset(per_chunk=n) if chunks else pl.ZERO,",
           "                send_offset=pl.Offset(per_chunk=n) if chunks else pl.ZERO,\n                recv_offset=pl.Offset(per_chunk=n) if chunks else pl.ZERO,",
           "a chunk's reduce-scatter reads the slice-sized offset of the full buffer", EMIT),
    Mutant("emit-ag-recv-offset", "cocoviz/emit/collectives.py",
           "                    recv_offset=pl.Offset(per_chunk=dv.count // K) if chunks else pl.ZERO,",
           "                    recv_offset=pl.Offset(per_chunk=n) if chunks else pl.ZERO,",
           "a chunk's all-gather lands at the slice-sized offset", EMIT),
    Mutant("emit-ag-send-offset", "cocoviz/emit/collectives.py",
           "                    send_offset=pl.Offset(per_chunk=n) if chunks else pl.ZERO,\n                    recv_offset=pl.Offset(per_chunk=dv.count // K)",
           "                    send_offset=pl.ZERO,\n                    recv_offset=pl.Offset(per_chunk=dv.count // K)",
           "every chunk's all-gather sends chunk 0", EMIT),
    Mutant("emit-ar-count", "cocoviz/emit/collectives.py",
           "        if op is Op.ALLREDUCE:\n            n = dv.count // K\n",
           "        if op is Op.ALLREDUCE:\n            n = dv.count // K // K if chunks else dv.count\n",
           "a chunk's all-reduce covers only part of the chunk", EMIT),
    Mutant("emit-render-offset", "cocoviz/emit/render.py", "            parts.append(f\"{o.per_chunk} * k\")",
           "            parts.append(f\"{o.per_chunk} * tp\")", "the chunk term is multiplied by the rank", EMIT),
    # ------------------------------------------------------------------ cost formulas
    Mutant("sim-bus-factor-ar", "cocoviz/sim/collectives.py", "        return 2.0 * (nranks - 1) / nranks",
           "        return 1.0 * (nranks - 1) / nranks", "allreduce moves the bytes of one half", SIM),
    Mutant("sim-bus-factor-ag", "cocoviz/sim/collectives.py", "        return (nranks - 1) / nranks\n",
           "        return nranks / (nranks + 1)\n", "allgather's bus factor", SIM),
    Mutant("sim-bus-factor-a2a", "cocoviz/sim/collectives.py",
           "    if c in (Coll.REDUCESCATTER, Coll.ALLGATHER, Coll.ALLTOALL):",
           "    if c in (Coll.REDUCESCATTER, Coll.ALLGATHER):", "alltoall's bus factor is 1", SIM),
    Mutant("sim-nsteps", "cocoviz/sim/collectives.py", "        return 2 * (nranks - 1)\n",
           "        return nranks - 1\n", "allreduce's ring has G−1 steps", SIM),
    Mutant("sim-latency-dropped", "cocoviz/sim/collectives.py", "        time_s=latency_us * 1e-6 + transfer_s,",
           "        time_s=transfer_s,", "a collective's latency is not counted", SIM),
    Mutant("sim-matmul-flops", "cocoviz/sim/compute.py", "    flops = 2.0 * m * n * k\n",
           "    flops = 1.0 * m * n * k\n", "a GEMM is m·n·k flops", SIM),
    Mutant("sim-kernel-roofline", "cocoviz/sim/compute.py",
           "    return _with_launch(hw, max(compute_s, _memory_s(hw, nbytes, contention)), launch, graph)",
           "    return _with_launch(hw, compute_s, launch, graph)", "kernels cost no memory time", SIM),
    Mutant("sim-launch", "cocoviz/sim/compute.py",
           "    return max(hw.gpu.launch_overhead_us * 1e-6, hw.gpu.kernel_gap_us * 1e-6 + body_s)",
           "    return hw.gpu.kernel_gap_us * 1e-6 + body_s", "no launch overhead floor", SIM),
    Mutant("sim-chunk-rows", "cocoviz/sim/compute.py",
           "    return [size + (1 if i < extra else 0) for i in range(chunks)]",
           "    return [size for i in range(chunks)]", "a remainder of rows is dropped", SIM),
]  # fmt: skip


def _check(m: Mutant, root: Path | None, rev: str = "HEAD") -> str | None:
    """Why the mutant cannot be applied to the file in `root` (None: the file at `rev`,
    which is what the worktree holds; the checkout may hold other uncommitted edits)."""
    if root is None:
        show = ["git", "-C", str(ROOT), "show", f"{rev}:{m.file}"]
        text = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    else:
        text = (root / m.file).read_text(encoding="utf-8")
    n = text.count(m.old)
    return None if n == 1 else f"{m.id}: the fragment occurs {n} times in {m.file}"


def _pytest(tree: Path, tests: list[str], timeout: float) -> tuple[int, float, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-x", "-p", "no:cacheprovider",
           "-p", "no:randomly", "-m", "not build", *tests]  # fmt: skip
    start = time.monotonic()
    try:
        res = subprocess.run(
            cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return -1, time.monotonic() - start, "timeout"
    tail = (res.stdout + res.stderr).strip().splitlines()[-3:]
    return res.returncode, time.monotonic() - start, " | ".join(tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the mutants whose id starts with this")
    ap.add_argument("--ids", nargs="+", help="run these mutants")
    ap.add_argument("--tests", nargs="+", help="run these tests for every mutant instead")
    ap.add_argument("--full", action="store_true", help="run the whole fast subset per mutant")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per test run")
    ap.add_argument("--rev", default="HEAD", help="the commit to mutate (default HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the worktree (debugging)")
    args = ap.parse_args(argv)

    mutants = [m for m in MUTANTS if not args.only or m.id.startswith(args.only)]
    if args.ids:
        unknown = set(args.ids) - {m.id for m in MUTANTS}
        if unknown:
            ap.error(f"no mutants {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.ids]
    bad = [e for m in mutants if (e := _check(m, None, args.rev)) is not None]
    if args.list or bad:
        for m in mutants:
            print(f"{m.id:32} {m.file:40} {m.why}")
        for e in bad:
            print("invalid mutant:", e, file=sys.stderr)
        return 1 if bad else 0

    tmp = Path(tempfile.mkdtemp(prefix="cocoviz-mutate-"))
    tree = tmp / "tree"
    add = ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.rev]
    subprocess.run(add, check=True)
    results: list[dict[str, object]] = []
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import cocoviz; print(cocoviz.__file__)"],
            cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True,
        )  # fmt: skip
        if not probe.stdout.strip().startswith(str(tree)):
            print(f"the copy does not import its own cocoviz: {probe.stdout}{probe.stderr}")
            return 2
        if args.tests:
            selections = {"given": args.tests}
        elif args.full:
            selections = {"given": ["tests"]}
        else:
            selections = SELECTIONS
        needed = set(selections) if args.tests or args.full else {m.selection for m in mutants}
        for key in sorted(needed):
            rc, secs, tail = _pytest(tree, selections[key], args.timeout)
            print(f"baseline {key}: rc={rc} ({secs:.0f}s) {tail}", flush=True)
            if rc != 0:
                print("the unmutated selection fails; fix that first")
                return 2
        for m in mutants:
            path = tree / m.file
            original = path.read_text(encoding="utf-8")
            err = _check(m, tree)
            if err is not None:
                print("invalid mutant:", err)
                results.append({"id": m.id, "status": "invalid"})
                continue
            path.write_text(original.replace(m.old, m.new), encoding="utf-8")
            try:
                tests = selections["given" if args.tests or args.full else m.selection]
                rc, secs, tail = _pytest(tree, tests, args.timeout)
            finally:
                path.write_text(original, encoding="utf-8")
            status = "survived" if rc == 0 else "killed"
            results.append({"id": m.id, "file": m.file, "why": m.why, "status": status,
                            "rc": rc, "seconds": round(secs, 1), "tail": tail})  # fmt: skip
            print(f"{status:8} {m.id:32} rc={rc} {secs:5.0f}s  {m.why}", flush=True)
    finally:
        if not args.keep:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)  # fmt: skip
            shutil.rmtree(tmp, ignore_errors=True)
    ran = [r for r in results if r["status"] in ("killed", "survived")]
    killed = [r for r in ran if r["status"] == "killed"]
    rate = len(killed) / len(ran) if ran else 0.0
    print(f"\nkilled {len(killed)} of {len(ran)} mutants: {rate:.0%}")
    for r in ran:
        if r["status"] == "survived":
            print(f"  survived: {r['id']} — {r['why']}")
    if args.json:
        args.json.write_text(json.dumps({"kill_rate": rate, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
